// One CUDA block (kernels/cuda/device_block.h) against the CPU block in f64 over the same
// random rows: the forward (u_next, h_end) and the backward (du, du_halo, mu_out and every
// parameter gradient), as relative L2 errors per tensor and over all of them; the span
// schedule's chunk summaries (h_local, m, S); and the CUDA head
// (kernels/cuda/lm_head.h) against the CPU head in f64. Shared by the
// host-emulated tests (block_emulation_test.cc, shapes_emulation_test.cc); include after
// tests/cuda/emulated_device.h; and, with a device run of its own through the backend
// interface, by cuda_backend_test.cc on a real GPU.
#ifndef ADJSH_TESTS_CUDA_BLOCK_CHECK_H_
#define ADJSH_TESTS_CUDA_BLOCK_CHECK_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/model.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/cuda/device_block.h"
#include "tests/kernels/test_util.h"

namespace adjsh::testing {

struct BlockCheck {
  std::vector<std::string> names;  // "u_next", ..., then the parameters' HF suffixes
  std::vector<double> errors;      // relative L2 error of each
  double whole = 0;                // relative L2 error of all of them together
  double grad_whole = 0;           // relative L2 error of the parameter gradients together
};

// What one block computes for one chunk: its forward, then its exact backward.
template <typename T>
struct BlockRun {
  std::vector<T> y, h_end, du, du_halo, mu_out;
  LayerParams<T> grad;
  BlockRun(const MambaConfig& c, int64_t halo, int64_t len)
      : y(len * c.hidden_size),
        h_end(c.inner() * c.state_size),
        du(len * c.hidden_size),
        du_halo(halo * c.hidden_size),
        mu_out(c.inner() * c.state_size),
        grad(ZeroLayer<T>(c)) {}
};

// The block with weights w64 (f64, on the CPU) against a device run of the same weights in f32,
// over rows of u ~ N(0, 1), h0 ~ 0.2 N, mu ~ 0.05 N, g ~ 0.05 N drawn from rng_seed.
// run_device(u, h0, mu, g, out) runs the device block on the f32 inputs into out (sized).
template <typename RunDevice>
BlockCheck CheckBlockAgainstCpu(const MambaConfig& config, const LayerParams<double>& w64,
                                int64_t halo, int64_t len, uint64_t rng_seed,
                                RunDevice run_device) {
  const int64_t D = config.hidden_size, DiN = config.inner() * config.state_size;
  std::mt19937_64 rng(rng_seed);
  std::normal_distribution<double> dist(0, 1);
  auto random = [&](int64_t n, double scale) {
    std::vector<double> v(n);
    for (double& x : v) x = scale * dist(rng);
    return v;
  };
  const std::vector<double> u = random((halo + len) * D, 1), h0 = random(DiN, 0.2),
                            mu = random(DiN, 0.05), g = random(len * D, 0.05);
  auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };

  const cpu::MambaBlockCpu<double> ref(config, w64);
  const cpu::ChunkRows rows{halo, len, 0};
  BlockRun<double> want(config, halo, len);
  ref.Forward(u.data(), rows, h0.data(), want.y.data(), want.h_end.data());
  ref.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, want.grad, want.du.data(),
               want.du_halo.data(), want.mu_out.data());

  const std::vector<float> u32 = f32(u), h032 = f32(h0), mu32 = f32(mu), g32 = f32(g);
  BlockRun<float> got(config, halo, len);
  run_device(u32.data(), h032.data(), mu32.data(), g32.data(), got);

  std::vector<std::vector<float>> a = {got.y, got.h_end, got.du, got.du_halo, got.mu_out};
  std::vector<std::vector<double>> b = {want.y, want.h_end, want.du, want.du_halo, want.mu_out};
  BlockCheck check;
  check.names = {"u_next", "h_end", "du", "du_halo", "mu_out"};
  const size_t outputs = a.size();
  const auto& s32 = LayerParamSlots<float>();
  const auto& s64 = LayerParamSlots<double>();
  for (size_t q = 0; q < s32.size(); ++q) {
    a.push_back(got.grad.*s32[q].member);
    b.push_back(want.grad.*s64[q].member);
    check.names.push_back(s32[q].suffix);
  }
  double num = 0, den = 0, grad_num = 0, grad_den = 0;
  for (size_t q = 0; q < a.size(); ++q) {
    check.errors.push_back(RelErr(a[q], b[q]));
    for (size_t k = 0; k < a[q].size(); ++k) {
      const double d2 = (a[q][k] - b[q][k]) * (a[q][k] - b[q][k]), w2 = b[q][k] * b[q][k];
      num += d2;
      den += w2;
      if (q >= outputs) grad_num += d2, grad_den += w2;
    }
  }
  check.whole = std::sqrt(num / den);
  check.grad_whole = grad_den == 0 ? std::sqrt(grad_num) : std::sqrt(grad_num / grad_den);
  return check;
}

// Layer 0 of InitParams(config, seed) on a DeviceBlock (bf16 storage or not) against the CPU.
inline BlockCheck CheckBlockAgainstCpu(const MambaConfig& config, uint64_t seed,
                                       uint64_t rng_seed, int64_t halo, int64_t len, bool bf16) {
  const ModelParams<double> p64 = InitParams<double>(config, seed);
  const ModelParams<float> p32 = InitParams<float>(config, seed);
  cuda::DeviceBlock block(0, bf16, cuda::BlockShapeOf(config),
                          cuda::LayerTensorsOf<const float>(p32.layers[0]));
  return CheckBlockAgainstCpu(
      config, p64.layers[0], halo, len, rng_seed,
      [&](const float* u, const float* h0, const float* mu, const float* g, BlockRun<float>& out) {
        block.Forward(u, halo, len, h0, out.y.data(), out.h_end.data());
        block.Backward(u, halo, len, g, h0, mu, cuda::LayerTensorsOf<float>(out.grad),
                       out.du.data(), out.du_halo.data(), out.mu_out.data());
      });
}

// The span schedule's chunk summaries of a device block against the CPU block in f64, over
// rows u ~ N(0, 1) and g ~ 0.05 N from rng_seed: relative L2 errors of h_local, S (from
// LocalSummary), m and S (from AdjointSummary). run_device(u, g, h_local, S_fwd, m, S_adj)
// runs the device block's two summaries on the f32 inputs into the (sized) outputs.
struct SummaryCheck {
  double h_local = 0, S_fwd = 0, m = 0, S_adj = 0;
};
template <typename RunDevice>
SummaryCheck CheckSummariesAgainstCpu(const MambaConfig& config, const LayerParams<double>& w64,
                                      int64_t halo, int64_t len, uint64_t rng_seed,
                                      RunDevice run_device) {
  const int64_t D = config.hidden_size, Di = config.inner(), DiN = Di * config.state_size;
  std::mt19937_64 rng(rng_seed);
  std::normal_distribution<double> dist(0, 1);
  std::vector<double> u((halo + len) * D), g(len * D);
  for (double& x : u) x = dist(rng);
  for (double& x : g) x = 0.05 * dist(rng);
  const cpu::MambaBlockCpu<double> ref(config, w64);
  const cpu::ChunkRows rows{halo, len, 0};
  std::vector<double> h_local(DiN), S_fwd(Di), m(DiN), S_adj(Di);
  ref.LocalSummary(u.data(), rows, h_local.data(), S_fwd.data());
  ref.AdjointSummary(u.data(), rows, g.data(), m.data(), S_adj.data());
  const std::vector<float> u32(u.begin(), u.end()), g32(g.begin(), g.end());
  std::vector<float> dh(DiN), dS_fwd(Di), dm(DiN), dS_adj(Di);
  run_device(u32.data(), g32.data(), dh.data(), dS_fwd.data(), dm.data(), dS_adj.data());
  return {RelErr(dh, h_local), RelErr(dS_fwd, S_fwd), RelErr(dm, m), RelErr(dS_adj, S_adj)};
}

// Layer 0 of InitParams(config, seed) on a DeviceBlock against the CPU.
inline SummaryCheck CheckSummariesAgainstCpu(const MambaConfig& config, uint64_t seed,
                                             uint64_t rng_seed, int64_t halo, int64_t len,
                                             bool bf16) {
  const ModelParams<double> p64 = InitParams<double>(config, seed);
  const ModelParams<float> p32 = InitParams<float>(config, seed);
  cuda::DeviceBlock block(0, bf16, cuda::BlockShapeOf(config),
                          cuda::LayerTensorsOf<const float>(p32.layers[0]));
  return CheckSummariesAgainstCpu(
      config, p64.layers[0], halo, len, rng_seed,
      [&](const float* u, const float* g, float* h_local, float* S_fwd, float* m, float* S_adj) {
        block.LocalSummary(u, halo, len, h_local, S_fwd);
        block.AdjointSummary(u, halo, len, g, m, S_adj);
      });
}

struct HeadCheck {
  double loss = 0, loss32 = 0;     // the f64 CPU loss sum and the device's
  double du = 0, dE = 0, dw_f = 0;  // relative L2 errors of the gradients
};

// The head over M rows (E ~ 0.5 N, w_f ~ 1 + 0.1 N, u ~ N drawn from rng_seed in that order;
// targets: one per row, -1 for none; scale 1 / (M - 1)) on the device, against the CPU head of
// all rows in one block in f64.
inline HeadCheck CheckHeadAgainstCpu(int64_t M, int64_t D, int64_t V, uint64_t rng_seed,
                                     const std::vector<int64_t>& targets, bool bf16) {
  std::mt19937_64 rng(rng_seed);
  std::normal_distribution<double> dist(0, 1);
  std::vector<double> E(V * D), w(D), u(M * D);
  for (double& x : E) x = 0.5 * dist(rng);
  for (double& x : w) x = 1 + 0.1 * dist(rng);
  for (double& x : u) x = dist(rng);
  const double scale = 1.0 / (M - 1);
  std::vector<double> du(M * D), dlogits(M * V), nf(M * D), dw(D, 0.0), dE(V * D, 0.0);
  const cpu::LmHeadArgs<double> args{M, D, V, 1e-5, E.data(), w.data(), u.data(),
                                     targets.data(), scale};
  HeadCheck check;
  check.loss = cpu::LmHeadForwardBackward<double>(args, du.data(), dlogits.data(), nf.data(),
                                                  dw.data());
  for (int64_t r = 0; r < M; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t d = 0; d < D; ++d) dE[v * D + d] += dlogits[r * V + v] * nf[r * D + d];

  const std::vector<float> E32(E.begin(), E.end()), w32(w.begin(), w.end()),
      u32(u.begin(), u.end());
  std::vector<float> du32(M * D), dE32(V * D, 0.0f), dw32(D, 0.0f);
  check.loss32 = cuda::DeviceHead(0, bf16, M, D, V, 1e-5f, E32.data(), w32.data(), u32.data(),
                                  targets.data(), static_cast<float>(scale), du32.data(),
                                  dE32.data(), dw32.data());
  check.du = RelErr(du32, du);
  check.dE = RelErr(dE32, dE);
  check.dw_f = RelErr(dw32, dw);
  return check;
}

}  // namespace adjsh::testing

#endif  // ADJSH_TESTS_CUDA_BLOCK_CHECK_H_
