#include "tests/kernels/backward_task.h"

#include <algorithm>

namespace adjsh {

namespace {
template <typename T>
void PrepareOutputs(const MambaConfig& config, const BackwardTaskInputs<T>& in,
                    BackwardTaskOutputs<T>& out) {
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  SetZero(out.grad, config);  // keeps capacity
  out.du.resize(in.rows.len * D);
  out.du_halo.assign(in.rows.halo * D, T(0));
  out.mu_out.resize(DiN);
}
}  // namespace

template <typename T>
void RunBackwardTask(BlockBackend<T>& block, const MambaConfig& config,
                     const BackwardTaskInputs<T>& in, BackwardTaskOutputs<T>& out) {
  PrepareOutputs(config, in, out);
  block.Backward(in.u.data(), {in.rows.halo, in.rows.len, 0}, in.g.data(), in.h0.data(),
                 in.mu.empty() ? nullptr : in.mu.data(), 0, out.grad, out.du.data(),
                 out.du_halo.data(), out.mu_out.data());
}

template void RunBackwardTask<float>(BlockBackend<float>&, const MambaConfig&,
                                     const BackwardTaskInputs<float>&,
                                     BackwardTaskOutputs<float>&);
template void RunBackwardTask<double>(BlockBackend<double>&, const MambaConfig&,
                                      const BackwardTaskInputs<double>&,
                                      BackwardTaskOutputs<double>&);

}  // namespace adjsh
