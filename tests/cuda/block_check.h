// One CUDA block (kernels/cuda/device_block.h) against the CPU block in f64 over the same
// random rows: the forward (u_next, h_end) and the backward (du, du_halo, mu_out and every
// parameter gradient), as relative L2 errors per tensor and over all of them; and the CUDA head
// (kernels/cuda/lm_head.h) against the CPU head in f64. Shared by the
// host-emulated tests (block_emulation_test.cc, shapes_emulation_test.cc); include after
// tests/cuda/emulated_device.h.
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
};

// Layer 0 of InitParams(config, seed); rows of u ~ N(0, 1), h0 ~ 0.2 N, mu ~ 0.05 N,
// g ~ 0.05 N drawn from rng_seed.
inline BlockCheck CheckBlockAgainstCpu(const MambaConfig& config, uint64_t seed,
                                       uint64_t rng_seed, int64_t halo, int64_t len, bool bf16) {
  const ModelParams<double> p64 = InitParams<double>(config, seed);
  const ModelParams<float> p32 = InitParams<float>(config, seed);
  const LayerParams<float>& w = p32.layers[0];
  const int64_t D = config.hidden_size, Di = config.inner(), N = config.state_size;
  const int64_t DiN = Di * N;
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

  const cpu::MambaBlockCpu<double> ref(config, p64.layers[0]);
  const cpu::ChunkRows rows{halo, len, 0};
  std::vector<double> y(len * D), h_end(DiN), du(len * D), du_halo(halo * D), mu_out(DiN);
  LayerParams<double> grad = ZeroLayer<double>(config);
  ref.Forward(u.data(), rows, h0.data(), y.data(), h_end.data());
  ref.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, grad, du.data(),
               du_halo.data(), mu_out.data());

  cuda::DeviceBlock block(0, bf16, cuda::BlockShapeOf(config),
                          cuda::LayerTensorsOf<const float>(w));
  const std::vector<float> u32 = f32(u), h032 = f32(h0), mu32 = f32(mu), g32 = f32(g);
  std::vector<float> y32(len * D), e32(DiN), du32(len * D), dh32(halo * D), mo32(DiN);
  LayerParams<float> g32p = ZeroLayer<float>(config);
  block.Forward(u32.data(), halo, len, h032.data(), y32.data(), e32.data());
  block.Backward(u32.data(), halo, len, g32.data(), h032.data(), mu32.data(),
                 cuda::LayerTensorsOf<float>(g32p), du32.data(), dh32.data(), mo32.data());

  std::vector<std::vector<float>> got = {y32, e32, du32, dh32, mo32};
  std::vector<std::vector<double>> want = {y, h_end, du, du_halo, mu_out};
  BlockCheck check;
  check.names = {"u_next", "h_end", "du", "du_halo", "mu_out"};
  const auto& s32 = LayerParamSlots<float>();
  const auto& s64 = LayerParamSlots<double>();
  for (size_t q = 0; q < s32.size(); ++q) {
    got.push_back(g32p.*s32[q].member);
    want.push_back(grad.*s64[q].member);
    check.names.push_back(s32[q].suffix);
  }
  double num = 0, den = 0;
  for (size_t q = 0; q < got.size(); ++q) {
    check.errors.push_back(RelErr(got[q], want[q]));
    for (size_t k = 0; k < got[q].size(); ++k) {
      num += (got[q][k] - want[q][k]) * (got[q][k] - want[q][k]);
      den += want[q][k] * want[q][k];
    }
  }
  check.whole = std::sqrt(num / den);
  return check;
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
