#include "engine/span_work.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/lm_head.h"

namespace adjsh {

template <typename Math>
BasicSpanWork<Math>::BasicSpanWork(const Model& model, const SpanPlan& plan, int64_t span,
                                   std::vector<uint32_t> tokens, std::vector<uint8_t> mask,
                                   int64_t n_targets, Storage storage, std::string spill_dir)
    : model_(model),
      K_(model.params->config.num_hidden_layers),
      W_(model.params->config.conv_kernel),
      n_targets_(n_targets),
      rows_(plan, span, K_, model.params->config.hidden_size, std::move(tokens), std::move(mask),
            storage, spill_dir, *model.rows),
      math_(model, rows_) {
  const int64_t D = rows_.D, n = rows_.r.halo + rows_.r.len;
  const std::vector<T>& E = model_.params->embed;
  if (rows_.space.host()) {
    for (int64_t t = 0; t < n; ++t)
      rows_.u[0].Commit(t * D, D, E.data() + int64_t{rows_.tokens[t]} * D);
    return;
  }
  // The span's ids go up once (a float's bytes each: the head reads them as uint32; 2 B each
  // on the way, widened there, where the vocabulary fits 16 bits); the lookups and the head's
  // targets read them there.
  if constexpr (sizeof(T) == sizeof(uint32_t)) {
    const size_t m = rows_.tokens.size();
    ids_ = RowBuffer<T>(rows_.space, m);
    if (model_.params->config.vocab_size <= 65536) {
      std::vector<uint16_t> narrow(m + 1);  // whole floats' worth
      for (size_t i = 0; i < m; ++i) narrow[i] = static_cast<uint16_t>(rows_.tokens[i]);
      RowBuffer<T> packed(rows_.space, (m + 1) / 2);
      rows_.space.Upload(packed.data(), reinterpret_cast<const T*>(narrow.data()), packed.size());
      rows_.space.WidenIds(ids_.data(), packed.data(), m);
    } else {
      rows_.space.Upload(ids_.data(), reinterpret_cast<const T*>(rows_.tokens.data()), m);
    }
  }
  std::vector<T> scratch;  // unused: resident rows are written where they are
  model_.head->Gather(DeviceIds(), n, rows_.u[0].WriteBuffer(0, n * D, scratch));
}

template <typename Math>
bool BasicSpanWork<Math>::Ready(const SpanTask& task) const {
  return SpanTaskReady(task, K_, forward_done_, g_layer_);
}

template <typename Math>
absl::Status BasicSpanWork<Math>::Run(const SpanTask& task, const SpanInputs<T>& in,
                                      Outputs& out, Partials partials) {
  if (task.span != rows_.span || !Ready(task))
    return SpanNotReady(rows_.span, task, forward_done_, g_layer_);
  const int64_t k = task.layer;
  partials_ = partials;
  switch (task.phase) {
    case SpanPhase::kForwardSummary:
      SetHalo(k, in);
      math_.ForwardSummary(rows_, k, out);
      break;
    case SpanPhase::kForward:
      SetHalo(k, in);
      Forward(k, in, out);
      break;
    case SpanPhase::kBackwardSummary:
      AddNextHalo(in);
      math_.BackwardSummary(rows_, k, out);
      break;
    case SpanPhase::kBackward:
      AddNextHalo(in);
      Backward(k, in, out);
      break;
  }
  // The resident head waited for its loss, after which nothing is queued unless the partials
  // come down or are checked.
  bool waited = model_.head && task.phase == SpanPhase::kForward && k + 1 == K_;
  const bool on_device = out.embed_sum.size() > 0 || out.grad_sum.size() > 0;
  if (on_device && partials == Partials::kHost) {
    waited = false;
    QueuePartialsDown(k, out);
  } else if (on_device && partials == Partials::kDeviceChecked && !waited) {
    // One flag comes down with the task's outputs, not the partials (the head's: in its wait).
    RowBuffer<T> flag(rows_.space, 1);
    rows_.space.Zero(flag.data(), 1);
    rows_.space.MarkNonFinite(flag.data(), out.embed_sum.data(), out.embed_sum.size());
    rows_.space.MarkNonFinite(flag.data(), out.grad_sum.data(), out.grad_sum.size());
    rows_.space.Download(&out.partials_nonfinite, flag.data(), 1);
  }
  if (!waited) rows_.space.Finish();  // the task's outputs on the host: its one sync on a GPU
  return absl::OkStatus();
}

template <typename Math>
void BasicSpanWork<Math>::QueuePartialsDown(int64_t k, Outputs& out) {
  if (out.embed_sum.size() > 0) {
    out.embed.resize(out.embed_sum.size());
    rows_.space.Download(out.embed.data(), out.embed_sum.data(), out.embed_sum.size());
    out.embed_sum.reset();
  }
  if (out.grad_sum.size() > 0) {
    model_.layers[k]->DownloadGrad(out.grad_sum.data(), out.grad);
    out.grad_sum.reset();
  }
}

template <typename Math>
void BasicSpanWork<Math>::PartialsToHost(int64_t layer, Outputs& out) {
  if (out.embed_sum.size() == 0 && out.grad_sum.size() == 0) return;
  QueuePartialsDown(layer, out);
  rows_.space.Finish();
}

// Rows [0, H) of u^k: the previous span's last rows (layer 0 has them from the tokens), once
// a layer (the summary's task and the forward's both bring them: the same rows).
template <typename Math>
void BasicSpanWork<Math>::SetHalo(int64_t k, const SpanInputs<T>& in) {
  const int64_t H = rows_.r.halo, D = rows_.D;
  if (k == 0 || H == 0 || halo_layer_ == k) return;
  ADJSH_CHECK(static_cast<int64_t>(in.halo_u.size()) == H * D, "halo_u has the wrong size");
  rows_.u[k].Upload(0, H * D, in.halo_u.data());
  halo_layer_ = k;
}

// Span s + 1's part of dL/du^{k+1} of the last rows, once per layer.
template <typename Math>
void BasicSpanWork<Math>::AddNextHalo(const SpanInputs<T>& in) {
  if (next_halo_added_) return;
  next_halo_added_ = true;
  const int64_t D = rows_.D, n = static_cast<int64_t>(in.du_halo.size()) / D;
  ADJSH_CHECK(n <= rows_.r.len, "du_halo longer than the span");
  T* last = rows_.g.data() + (rows_.r.len - n) * D;
  if (rows_.space.host()) {
    for (int64_t q = 0; q < n * D; ++q) last[q] += in.du_halo[q];
    return;
  }
  RowBuffer<T> halo(rows_.space, n * D);
  rows_.space.Upload(halo.data(), in.du_halo.data(), n * D);
  rows_.space.Add(last, halo.data(), n * D);
}

// From the true start state; the top layer's output goes to g and on to the head, any other's
// last W - 1 rows to span s + 1 (its conv halo).
template <typename Math>
void BasicSpanWork<Math>::Forward(int64_t k, const SpanInputs<T>& in, Outputs& out) {
  const int64_t D = rows_.D, len = rows_.r.len;
  const bool top = k + 1 == K_;
  if (top) {
    rows_.g = TakeSpare(len * D);
    rows_.space.Zero(rows_.g.data(), len * D);
  }
  math_.Forward(rows_, k, in.h0, top);
  forward_done_ = std::max(forward_done_, k + 1);
  if (top) {
    Head(out);
    return;
  }
  const int64_t n = std::min(W_ - 1, len);
  out.halo_next.resize(n * D);
  rows_.u[k + 1].Download((rows_.r.halo + len - n) * D, n * D, out.halo_next.data());
}

// The LM head over the span's rows through the backend (which blocks rows and vocabulary): the
// loss sum over the span's targets, their greedy count with a mask, dL/du^K into g and the
// head's (V, D) and norm_f's partials (a forward-only plan: the loss sum alone).
template <typename Math>
void BasicSpanWork<Math>::Head(Outputs& out) {
  const auto& p = *model_.params;
  const int64_t D = rows_.D, V = p.config.vocab_size, len = rows_.r.len;
  // The host's targets (a resident head reads the span's ids on the device instead).
  const std::vector<int64_t> targets =
      model_.head ? std::vector<int64_t>()
                  : SpanTargets(rows_.plan, rows_.r, rows_.tokens, rows_.mask);
  int64_t correct = 0;
  cpu::LmHeadArgs<T> args{len,           D,           V, p.config.layer_norm_epsilon,
                          p.head().data(), p.norm_f.data(), rows_.g.data(), targets.data(),
                          T(1) / T(n_targets_)};
  if (!rows_.mask.empty()) args.correct = &correct;
  ADJSH_CHECK(!model_.head || rows_.mask.empty(), "a resident head takes no loss mask");
  // Row t's target is token t + 1: ids [halo + 1, tokens.size()) (one fewer at the end).
  const int64_t valid =
      std::min<int64_t>(len, static_cast<int64_t>(rows_.tokens.size()) - rows_.r.halo - 1);
  // An evaluation needs no dL/du and no partials: either head runs its forward alone.
  if (rows_.plan.forward_only() && !model_.head) {
    out.loss_sum = model_.backend->HeadLoss(args);
  } else if (rows_.plan.forward_only()) {
    out.loss_sum = model_.head->Loss(args, DeviceIds() + rows_.r.halo + 1, valid);
  } else {
    out.norm_f.assign(D, T(0));
    RowBuffer<T> du = TakeSpare(len * D);
    if (model_.head) {  // resident: the (V, D) partial stays on the device
      out.embed_sum = RowBuffer<T>(rows_.space, V * D, /*may_spill=*/true);
      rows_.space.Zero(out.embed_sum.data(), V * D);
      out.loss_sum = model_.head->ForwardBackward(args, DeviceIds() + rows_.r.halo + 1, valid,
                                                  du.data(), out.embed_sum.data(),
                                                  out.norm_f.data(),
                                                  partials_ == Partials::kDeviceChecked
                                                      ? &out.partials_nonfinite
                                                      : nullptr);
    } else {
      out.embed.assign(V * D, T(0));
      out.loss_sum = model_.backend->HeadForwardBackward(args, du.data(), out.embed.data(),
                                                         out.norm_f.data());
    }
    std::swap(rows_.g, du);
    GiveSpare(std::move(du));
  }
  out.correct = correct;
  g_layer_ = K_;
  next_halo_added_ = true;  // nothing after the head feeds g
}

// dL/du^k replaces dL/du^{k+1} in g, and layer k's rows go.
template <typename Math>
void BasicSpanWork<Math>::Backward(int64_t k, const SpanInputs<T>& in, Outputs& out) {
  const int64_t D = rows_.D, len = rows_.r.len;
  RowBuffer<T> du = TakeSpare(len * D);  // Backward writes every row
  math_.Backward(rows_, k, in.mu, out, du.data());
  std::swap(rows_.g, du);
  GiveSpare(std::move(du));
  g_layer_ = k;
  next_halo_added_ = false;
  rows_.u[k] = StoredRows<T>();
  math_.DropLayer(k);
  if (k > 0) return;
  // The embedding lookup: dE[token_t] += dL/du^0_t in token order (span s + 1's halo part of
  // the last rows is added by the ledger: it has those rows).
  const int64_t VD = model_.params->config.vocab_size * D;
  if (model_.head) {  // resident: summed on the device in the same order
    out.embed_sum = RowBuffer<T>(rows_.space, VD, /*may_spill=*/true);
    rows_.space.Zero(out.embed_sum.data(), VD);
    model_.head->LookupBackward(DeviceIds() + rows_.r.halo, len, rows_.g.data(),
                                out.embed_sum.data());
    return;
  }
  out.embed.assign(VD, T(0));
  for (int64_t t = 0; t < len; ++t) {
    T* row = out.embed.data() + int64_t{rows_.tokens[rows_.r.halo + t]} * D;
    for (int64_t d = 0; d < D; ++d) row[d] += rows_.g.data()[t * D + d];
  }
}

// The thread's spare (len, D) buffer where the rows are the host's (a fresh one per task costs
// page faults; one per thread, not per span), else a buffer of the device's space, which pools.
template <typename Math>
RowBuffer<typename Math::Value>& BasicSpanWork<Math>::HostSpare() {
  thread_local RowBuffer<T> spare;
  return spare;
}

template <typename Math>
RowBuffer<typename Math::Value> BasicSpanWork<Math>::TakeSpare(size_t n) {
  if (!rows_.space.host()) return RowBuffer<T>(rows_.space, n, /*may_spill=*/true);
  RowBuffer<T>& spare = HostSpare();
  if (spare.size() != n) spare = RowBuffer<T>(rows_.space, n);
  return std::move(spare);
}

template <typename Math>
void BasicSpanWork<Math>::GiveSpare(RowBuffer<T>&& b) {
  if (rows_.space.host()) HostSpare() = std::move(b);
}

template <typename Math>
int64_t BasicSpanWork<Math>::kept_bytes() const {
  int64_t b = static_cast<int64_t>(rows_.g.size() * sizeof(T));
  for (const auto& u : rows_.u) b += static_cast<int64_t>(u.bytes());
  return b + math_.kept_bytes();
}

template class BasicSpanWork<SpanMath<ModelParams<float>>>;
template class BasicSpanWork<SpanMath<ModelParams<double>>>;
template class BasicSpanWork<SpanMath<Mamba2Params<float>>>;
template class BasicSpanWork<SpanMath<Mamba2Params<double>>>;

}  // namespace adjsh
