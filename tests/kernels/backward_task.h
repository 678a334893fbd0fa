// One exact backward task (layer k, chunk c) as data: its inputs and outputs, run on a
// backend's block (kernels/backend.h). The task-purity test runs tasks this way
// (tests/kernels/task_purity_test.cc); the engine's schedules call the blocks directly.
#ifndef ADJSH_TESTS_KERNELS_BACKWARD_TASK_H_
#define ADJSH_TESTS_KERNELS_BACKWARD_TASK_H_

#include <cstdint>
#include <vector>

#include "common/model.h"
#include "kernels/backend.h"

namespace adjsh {

template <typename T>
struct BackwardTaskInputs {
  int64_t layer = 0, chunk = 0;
  cpu::ChunkRows rows;  // halo and len of the chunk (no lookahead: exact backward)
  std::vector<T> u;     // (halo + len, D) the layer input u^k, halo rows first
  std::vector<T> g;     // (len, D) dL/du^{k+1}
  std::vector<T> h0;    // (Di, N) the state before the chunk
  std::vector<T> mu;    // (Di, N) the adjoint flowing in from the next chunk; empty for the last
};

template <typename T>
struct BackwardTaskOutputs {
  LayerParams<T> grad;     // the chunk's partial gradient of layer k's parameters, from zero
  std::vector<T> du;       // (len, D) dL/du^k = g + the path through the block
  std::vector<T> du_halo;  // (halo, D) this chunk's contribution to the previous rows' dL/du^k
  std::vector<T> mu_out;   // (Di, N) the adjoint flowing into the previous chunk
};

// Runs the task with the layer's block (the op kBackwardExact). out's buffers are resized and
// zeroed here, so a caller may reuse one out across tasks.
template <typename T>
void RunBackwardTask(BlockBackend<T>& block, const MambaConfig& config,
                     const BackwardTaskInputs<T>& in, BackwardTaskOutputs<T>& out);

}  // namespace adjsh

#endif  // ADJSH_TESTS_KERNELS_BACKWARD_TASK_H_
