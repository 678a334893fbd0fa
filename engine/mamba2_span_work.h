// What the owner of one span of a Mamba-2 step keeps and computes: the span tasks of
// engine/span_plan.h on its own rows, as engine/span_work.h does for Mamba-1, with the same
// inputs and outputs (SpanInputs, SpanOutputs with Mamba2Layer partials) combined by the same
// ledger (engine/span_ledger.h, engine/families/mamba2.h). Per span s with rows [t0, t0 + len) and
// conv halo H = min(W - 1, t0):
//   kept   u^k (H + len, D) for k = 0..K-1 in the storage format (halo rows first), each
//          layer's start state (H P N) in T from its kForward, g (len, D) in T: u^K, then
//          dL/du^K from the head, then dL/du^k as the backward goes down; while layer k's
//          backward runs, the states at its chunk starts (chunks, H P N), rebuilt from the
//          start state by a forward sweep (docs/MATH.md "Mamba-2").
//   sent   (H P N)-sized summaries, halo rows and parameter partials.
// The gradient of the next span's conv halo rows (the conv reads this span's last W - 1 rows)
// is taken through in_proj and the pre-norm by the span that reads them (Mamba2HaloBackward)
// and sent back as dL/du rows, as Mamba-1's spans do. Every layer chunk goes through the model's
// Mamba2ChunkOps and the head through its backend (kernels/mamba2_backend.h). A task is a pure
// function of the span's kept values and its inputs: whoever runs it, it returns the same bits.
#ifndef ADJSH_ENGINE_MAMBA2_SPAN_WORK_H_
#define ADJSH_ENGINE_MAMBA2_SPAN_WORK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/mamba2_backend.h"
#include "kernels/cpu/mamba2_layer.h"
#include "common/mamba2_model.h"
#include "engine/span_plan.h"
#include "engine/span_work.h"
#include "engine/stored_rows.h"

namespace adjsh {

template <typename T>
using Mamba2SpanOutputs = SpanOutputs<T, Mamba2Layer<T>>;

template <typename T>
class Mamba2SpanWork {
 public:
  // As SpanWork's: tokens [t0 - H, min(T, t0 + len + 1)), mask empty or over the same
  // positions, n_targets counted over the whole sequence. model and plan outlive the work.
  Mamba2SpanWork(const Mamba2BackendModel<T>& model, const SpanPlan& plan, int64_t span,
                 std::vector<uint32_t> tokens, std::vector<uint8_t> mask, int64_t n_targets,
                 Storage storage, std::string spill_dir);

  bool Ready(const SpanTask& task) const;  // as SpanWork::Ready
  // Runs the task (FAILED_PRECONDITION unless Ready). out's buffers are resized.
  absl::Status Run(const SpanTask& task, const SpanInputs<T>& in, Mamba2SpanOutputs<T>& out);
  int64_t kept_bytes() const;

 private:
  // The rows chunk c reads of u^k (its conv halo, then its own).
  const T* ChunkRows(int64_t k, int64_t c, std::vector<T>& scratch) const;
  void Forward(int64_t k, const SpanInputs<T>& in, Mamba2SpanOutputs<T>& out, bool summary);
  void Head(Mamba2SpanOutputs<T>& out);
  void ChunkStates(int64_t k);  // chunk_states_ for layer k, from its start state
  void Backward(int64_t k, const SpanInputs<T>& in, Mamba2SpanOutputs<T>& out, bool summary);
  void AddNextHalo(const SpanInputs<T>& in);

  const Mamba2BackendModel<T>& m_;
  const Mamba2Params<T>& p_;
  const Mamba2Config& cfg_;
  const Mamba2Dims d_;
  const SpanPlan& plan_;
  const int64_t s_;
  const SpanRange r_;
  const std::vector<uint32_t> tokens_;
  const std::vector<uint8_t> mask_;
  const int64_t n_targets_, HPN_;
  const Storage storage_;
  const std::string spill_dir_;
  std::vector<StoredRows<T>> u_;        // K x (H + len, D)
  std::vector<std::vector<T>> start_;   // K x (H P N), from each layer's kForward
  std::vector<T> chunk_states_;         // (chunks, H P N) of layer states_layer_
  int64_t states_layer_ = -1;
  std::vector<T> g_;                    // (len, D)
  int64_t forward_done_ = 0;
  int64_t g_layer_ = -1;
  bool next_halo_added_ = false;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_SPAN_WORK_H_
