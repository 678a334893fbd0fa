#include "engine/span_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace adjsh {
namespace {

constexpr int64_t kTokensPerSpan = 16384;  // DefaultSpans: one span per this many tokens
constexpr int64_t kMinDefaultSpans = 8;
constexpr int kPhases = 4;

// Span s of S over nC chunks: chunks [s nC / S, (s + 1) nC / S) (as even as whole chunks go).
int64_t FirstChunk(int64_t s, int64_t S, int64_t nC) { return s * nC / S; }

// The first span that is too short for the conv halo of the next one, or -1.
int64_t ShortSpan(int64_t T, int64_t C, int64_t S, int64_t W) {
  const int64_t nC = (T + C - 1) / C;
  for (int64_t s = 1; s + 1 < S; ++s) {  // span 0's successor reads at most t0 rows: always fits
    const int64_t t0 = FirstChunk(s, S, nC) * C;
    const int64_t t1 = std::min(T, FirstChunk(s + 1, S, nC) * C);
    if (t1 - t0 < W - 1) return s;
  }
  return -1;
}

}  // namespace

std::string_view SpanPhaseName(SpanPhase phase) {
  switch (phase) {
    case SpanPhase::kForwardSummary: return "fwd_summary";
    case SpanPhase::kForward: return "fwd";
    case SpanPhase::kBackwardSummary: return "bwd_summary";
    case SpanPhase::kBackward: return "bwd";
  }
  return "?";
}

int64_t SpanPlan::DefaultSpans(int64_t T, int64_t chunk, int64_t W) {
  const int64_t C = std::clamp<int64_t>(chunk, 1, std::max<int64_t>(T, 1));
  const int64_t nC = (T + C - 1) / C;
  int64_t S = std::min(nC, std::max(kMinDefaultSpans, T / kTokensPerSpan));
  while (S > 1 && ShortSpan(T, C, S, W) >= 0) --S;
  return std::max<int64_t>(S, 1);
}

absl::Status SpanPlan::CheckSpans(int64_t T, int64_t chunk, int64_t spans, int64_t W) {
  if (spans == 0) return absl::OkStatus();
  const int64_t C = std::min(chunk, T), nC = (T + C - 1) / C;
  if (spans > nC) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--spans %d: a span is a run of whole chunks, and T=%d in chunks of %d gives %d", spans,
        T, C, nC));
  }
  if (const int64_t s = ShortSpan(T, C, spans, W); s >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--spans %d: span %d would hold fewer than W - 1 = %d tokens, the conv halo the next "
        "span reads from it; use fewer spans or longer chunks",
        spans, s, W - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpanPlan> SpanPlan::Make(int64_t T, int64_t chunk, int64_t spans, int64_t K,
                                        int64_t W, bool forward_only) {
  if (T < 1 || chunk < 1 || K < 1 || W < 1 || spans < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "span plan: T=%d chunk=%d spans=%d K=%d W=%d out of range", T, chunk, spans, K, W));
  }
  SpanPlan p;
  p.T_ = T, p.C_ = std::min(chunk, T), p.K_ = K, p.W_ = W;
  p.forward_only_ = forward_only;
  p.nC_ = (T + p.C_ - 1) / p.C_;
  const int64_t S = spans == 0 ? DefaultSpans(T, chunk, W) : spans;
  if (absl::Status s = CheckSpans(T, chunk, S, W); !s.ok()) return s;
  for (int64_t s = 0; s < S; ++s) {
    SpanRange r;
    r.c0 = FirstChunk(s, S, p.nC_), r.c1 = FirstChunk(s + 1, S, p.nC_);
    r.t0 = r.c0 * p.C_;
    r.len = std::min(T, r.c1 * p.C_) - r.t0;
    r.halo = std::min(W - 1, r.t0);
    p.ranges_.push_back(r);
  }
  p.Build();
  return p;
}

SpanRange SpanPlan::Chunk(int64_t c) const {
  SpanRange r;
  r.c0 = c, r.c1 = c + 1;
  r.t0 = c * C_;
  r.len = std::min(C_, T_ - r.t0);
  r.halo = std::min(W_ - 1, r.t0);
  return r;
}

int64_t SpanPlan::Id(SpanPhase phase, int64_t layer, int64_t span) const {
  const int64_t S = spans();
  if (layer < 0 || layer >= K_ || span < 0 || span >= S) return -1;
  return index_[(static_cast<int64_t>(phase) * K_ + layer) * S + span];
}

std::vector<int64_t> SpanPlan::ReplayIds(int64_t id) const {
  const auto [phase, k, s] = tasks_[id];
  const bool forward = phase == SpanPhase::kForwardSummary || phase == SpanPhase::kForward;
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < (forward ? k : K_); ++j) ids.push_back(Id(SpanPhase::kForward, j, s));
  if (!forward)
    for (int64_t j = K_ - 1; j > k; --j) ids.push_back(Id(SpanPhase::kBackward, j, s));
  return ids;
}

void SpanPlan::Build() {
  const int64_t S = spans(), K = K_;
  index_.assign(kPhases * K * S, -1);
  auto add = [&](SpanPhase phase, int64_t k, int64_t s) {
    index_[(static_cast<int64_t>(phase) * K + k) * S + s] = num_tasks();
    tasks_.push_back({phase, k, s});
  };
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t s = 0; s + 1 < S; ++s) add(SpanPhase::kForwardSummary, k, s);
    for (int64_t s = 0; s < S; ++s) add(SpanPhase::kForward, k, s);
  }
  for (int64_t k = K - 1; k >= 0 && !forward_only_; --k) {
    for (int64_t s = S - 1; s > 0; --s) add(SpanPhase::kBackwardSummary, k, s);
    for (int64_t s = S - 1; s >= 0; --s) add(SpanPhase::kBackward, k, s);
  }
  deps_.assign(num_tasks(), {});
  succ_.assign(num_tasks(), {});
  for (int64_t id = 0; id < num_tasks(); ++id) {
    const auto [phase, k, s] = tasks_[id];
    std::vector<int64_t>& d = deps_[id];
    auto dep = [&](SpanPhase ph, int64_t kk, int64_t ss) {
      const int64_t j = Id(ph, kk, ss);
      if (j >= 0 && std::find(d.begin(), d.end(), j) == d.end()) d.push_back(j);
    };
    const bool forward = phase == SpanPhase::kForwardSummary || phase == SpanPhase::kForward;
    if (forward) {
      // u^k of the span and the conv halo rows from the span before.
      dep(SpanPhase::kForward, k - 1, s);
      dep(SpanPhase::kForward, k - 1, s - 1);
      if (phase == SpanPhase::kForward) {
        // h0(k, s); and the span's own summary first: one span's tasks form a chain, as its
        // owner runs them one after another.
        for (int64_t s2 = 0; s2 <= s; ++s2) dep(SpanPhase::kForwardSummary, k, s2);
      }
    } else {
      // dL/du^{k+1} of the span (the head's at the top) and its halo part from the span after.
      if (k + 1 == K) {
        dep(SpanPhase::kForward, k, s);
      } else {
        dep(SpanPhase::kBackward, k + 1, s);
        dep(SpanPhase::kBackward, k + 1, s + 1);
      }
      if (phase == SpanPhase::kBackward) {
        for (int64_t s2 = S - 1; s2 >= s; --s2) dep(SpanPhase::kBackwardSummary, k, s2);  // mu
      }
    }
    std::sort(d.begin(), d.end());
    for (int64_t j : d) succ_[j].push_back(id);
  }
}

}  // namespace adjsh
