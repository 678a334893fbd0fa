#include "engine/span_state.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace adjsh {

template <typename T>
StoredRows<T> MakeSpanRows(size_t n, Storage storage, const std::string& spill_dir,
                           RowSpace<T>& space) {
  absl::StatusOr<StoredRows<T>> rows = StoredRows<T>::Create(n, storage, spill_dir, true, &space);
  if (!rows.ok()) {
    std::fprintf(stderr, "adjsh: %s; keeping the rows in memory\n",
                 std::string(rows.status().message()).c_str());
    rows = StoredRows<T>::Create(n, storage, "");
  }
  return std::move(*rows);
}

template <typename T>
SpanRows<T>::SpanRows(const SpanPlan& plan, int64_t span, int64_t K, int64_t D,
                      std::vector<uint32_t> tokens, std::vector<uint8_t> mask, Storage storage,
                      const std::string& spill_dir, RowSpace<T>& space)
    : plan(plan),
      span(span),
      r(plan.range(span)),
      D(D),
      tokens(std::move(tokens)),
      mask(std::move(mask)),
      storage(storage),
      space(space) {
  const int64_t rows = r.halo + r.len;
  ADJSH_CHECK(static_cast<int64_t>(this->tokens.size()) >= rows, "span tokens too short");
  for (int64_t k = 0; k < K; ++k)
    u.push_back(MakeSpanRows<T>(rows * D, storage, spill_dir, space));
}

template <typename T>
const T* SpanRows<T>::ChunkRows(int64_t k, int64_t c, std::vector<T>& scratch,
                                int64_t next) const {
  const SpanRange ch = plan.Chunk(c);
  size_t next_at = 0, next_n = 0;
  if (next >= r.c0 && next < r.c1) {
    const SpanRange after = plan.Chunk(next);
    next_at = (after.t0 - after.halo - base()) * D, next_n = (after.halo + after.len) * D;
  }
  return u[k].Read((ch.t0 - ch.halo - base()) * D, (ch.halo + ch.len) * D, scratch, next_at,
                   next_n);
}

bool SpanTaskReady(const SpanTask& task, int64_t K, int64_t forward_done, int64_t g_layer) {
  const int64_t k = task.layer;
  switch (task.phase) {
    case SpanPhase::kForwardSummary:  // reads u^k, which stays until layer k's backward
      return forward_done >= k && (g_layer < 0 || g_layer > k);
    case SpanPhase::kForward:  // rewrites u^{k+1} (or g): only before the backward began
      return forward_done >= k && (g_layer < 0 || g_layer == K);
    case SpanPhase::kBackwardSummary:
    case SpanPhase::kBackward:
      return forward_done == K && g_layer == k + 1;
  }
  return false;
}

absl::Status SpanNotReady(int64_t span, const SpanTask& task, int64_t forward_done,
                          int64_t g_layer) {
  return absl::FailedPreconditionError(absl::StrCat(
      "span ", span, " cannot run ", std::string(SpanPhaseName(task.phase)), " of layer ",
      task.layer, " of span ", task.span, " from what it keeps (forward done to layer ",
      forward_done, ", cotangent of layer ", g_layer, ")"));
}

std::vector<int64_t> SpanTargets(const SpanPlan& plan, const SpanRange& r,
                                 const std::vector<uint32_t>& tokens,
                                 const std::vector<uint8_t>& mask) {
  const int64_t T = plan.T(), base = r.t0 - r.halo;
  std::vector<int64_t> targets(r.len, -1);
  for (int64_t t = r.t0; t < r.t0 + r.len; ++t) {
    const int64_t next = t + 1 - base;  // position of token t + 1 in tokens
    if (t + 1 < T && (mask.empty() || mask[next] != 0)) targets[t - r.t0] = tokens[next];
  }
  return targets;
}

template StoredRows<float> MakeSpanRows<float>(size_t, Storage, const std::string&,
                                               RowSpace<float>&);
template StoredRows<double> MakeSpanRows<double>(size_t, Storage, const std::string&,
                                                 RowSpace<double>&);
template struct SpanRows<float>;
template struct SpanRows<double>;

}  // namespace adjsh
