// Micro-benchmarks of the CPU kernels, one thread, against this machine's limits measured in the
// same run:
//   kernel_bench [--hidden-size D] [--state-size N] [--rows C] [--seconds S]
// Prints one JSON line per measurement:
//   limits: the vector FMA peak (16 independent chains of 8-lane FMAs) and the sgemm rate at the
//     engine's shape (bench/sgemm_rate.cc's GEMM);
//   scan_forward, scan_adjoint_summary, scan_backward: the channel-blocked kernels
//     (kernels/cpu/scan_block.h) and the per-channel ones they replaced (kernels/cpu/scan.h) on
//     the same inputs, timed alternately, with speed-up = per-channel / blocked;
//   gemm_*: the block's products with a fixed weight through GemmPacked (kernels/cpu/
//     gemm_packed.h) and through OpenBLAS on the same operands, timed alternately, warm caches;
//   block_forward, block_backward: one layer over one chunk (kernels/cpu/mamba_block.h), its
//     GEMM flops (bench/flops.h's per-token counts) per second against the sgemm rate.
// Scan flops are counted per (token, channel, state) as the blocked kernel executes them, an
// FMA as 2: a decay (Exp2Fast, kernels/cpu/math.h) is 16 = Delta (A log2 e) 1 + clamps 2 +
// rounding 2 + remainder 1 + polynomial 10 (its exponent add is an integer operation); forward
// 21 = decay 16 + Delta B x' 1 + state FMA 2 + y FMA 2; adjoint summary 19 = decay 16 + FMA 2 +
// product 1; backward 35 = the forward's 21 + lambda FMA 2 + carry 1 + gradient of a 1 + dA 2 +
// s_a 2 + s_b 2 + the dB and dC terms 2 and their sums over channels 2. The per-channel kernels
// do the same arithmetic with a costlier exp; their figure is the time only.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/flops.h"
#include "cli/args.h"
#include "common/model.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/mamba_block.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/scan_block.h"
#include "kernels/cpu/simd.h"

namespace adjsh::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of fn: the best of 5 rounds, each as many calls as fit in seconds / 5.
double TimeCall(const std::function<void()>& fn, double seconds) {
  fn();  // warm: page faults, scratch growth
  double best = 1e300;
  for (int round = 0; round < 5; ++round) {
    int64_t calls = 0;
    const auto start = Clock::now();
    double s = 0;
    do {
      fn();
      ++calls;
      s = std::chrono::duration<double>(Clock::now() - start).count();
    } while (s < seconds / 5);
    best = std::min(best, s / calls);
  }
  return best;
}

// Two kernels timed round by round in alternation, so that a noisy neighbour slows both.
std::pair<double, double> TimePair(const std::function<void()>& a, const std::function<void()>& b,
                                   double seconds) {
  double ta = 1e300, tb = 1e300;
  for (int round = 0; round < 3; ++round) {
    ta = std::min(ta, TimeCall(a, seconds / 6));
    tb = std::min(tb, TimeCall(b, seconds / 6));
  }
  return {ta, tb};
}

// Seconds per call of fn with cold caches, as inside a gradient, where a product's C (a fresh
// activation) and W (one of many layers' weights) were last touched long before: before each
// call a write sweep of 64 MiB evicts them, then warm() touches what a real caller has just
// written (A). The median call over `seconds` (the sweeps not counted), at least 15 calls.
double TimeColdCall(const std::function<void()>& fn, const std::function<void()>& warm,
                    double seconds) {
  static std::vector<char> sweep(64 << 20);
  std::vector<double> calls;
  const auto start = Clock::now();
  while (calls.size() < 15 ||
         std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    for (size_t i = 0; i < sweep.size(); i += 64) sweep[i] = static_cast<char>(sweep[i] + 1);
    warm();
    const auto t0 = Clock::now();
    fn();
    calls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::nth_element(calls.begin(), calls.begin() + calls.size() / 2, calls.end());
  return calls[calls.size() / 2];
}

double FmaPeak(double seconds) {
  using V = cpu::simd::Native<float>;
  V acc[16];  // 16 chains: enough to cover the FMA latency on every pipe
  for (int k = 0; k < 16; ++k) acc[k] = V::Set(1.0f + k);
  const int64_t iters = 1 << 20;
  const double s = TimeCall(
      [&] {
        V x[16];  // locals, so that the chains stay in registers
        for (int k = 0; k < 16; ++k) x[k] = acc[k];
        const V m = V::Set(0.999999f), c = V::Set(1e-7f);
        for (int64_t i = 0; i < iters; ++i)
          for (auto& e : x) e = V::Fma(e, m, c);
        for (int k = 0; k < 16; ++k) acc[k] = x[k];
      },
      seconds);
  return 16.0 * iters * V::kLanes * 2 / s / 1e9;
}

double SgemmRate(double seconds) {
  const int64_t M = 256, N = 1024, K = 256;
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  const double s = TimeCall(
      [&] {
        cpu::Gemm<float>(cpu::Trans::kNo, cpu::Trans::kYes, M, N, K, 1, a.data(), K, b.data(), K, 0,
                         c.data(), N);
      },
      seconds);
  return 2.0 * M * N * K / s / 1e9;
}

struct ScanData {
  int64_t M, Di, N, Q;
  std::vector<float> dt, xc, bc, A, ybar, h0, mu, dskip;
  ScanData(int64_t rows, int64_t Di_, int64_t N_) : M(rows), Di(Di_), N(N_), Q(16 + 2 * N_) {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> g(0, 1);
    auto fill = [&](std::vector<float>& v, int64_t n) {
      v.resize(n);
      for (auto& e : v) e = g(rng);
    };
    fill(dt, M * Di), fill(xc, M * Di), fill(bc, M * Q), fill(A, Di * N), fill(ybar, M * Di);
    fill(h0, Di * N), fill(mu, Di * N), fill(dskip, Di);
    for (auto& e : dt) e = std::log1p(std::exp(e - 2));
    for (auto& e : A) e = -std::exp(0.5f * e);
  }
  cpu::ScanInputs<float> In() const {
    cpu::ScanInputs<float> in;
    in.M = M, in.Di = Di, in.N = N, in.dt = dt.data(), in.xc = xc.data();
    in.B = bc.data() + 16, in.C = bc.data() + 16 + N, in.bc_stride = Q, in.A = A.data();
    return in;
  }
};

void PrintScan(const char* name, const ScanData& d, double per_channel_s, double blocked_s,
               double flops_per_element, double peak) {
  const double elements = double(d.M) * d.Di * d.N;
  const double gflops = flops_per_element * elements / blocked_s / 1e9;
  std::printf(
      "{\"kernel\": \"%s\", \"rows\": %lld, \"Di\": %lld, \"N\": %lld, "
      "\"per_channel_ns_per_token\": %.1f, \"blocked_ns_per_token\": %.1f, \"speedup\": %.2f, "
      "\"blocked_gflop_per_s\": %.2f, "
      "\"fraction_of_fma_peak\": %.3f}\n",
      name, static_cast<long long>(d.M), static_cast<long long>(d.Di), static_cast<long long>(d.N),
      per_channel_s / d.M * 1e9, blocked_s / d.M * 1e9, per_channel_s / blocked_s, gflops,
      gflops / peak);
}

void BenchScans(int64_t rows, int64_t Di, int64_t N, double seconds, double peak) {
  const ScanData d(rows, Di, N);
  const cpu::ScanInputs<float> in = d.In();
  std::vector<float> h_end(Di * N), y(rows * Di), m(Di * N);
  auto [old_f, new_f] = TimePair(
      [&] {
        for (int64_t i = 0; i < Di; ++i)
          cpu::ScanForwardChannel<float>(in, i, rows, d.h0.data() + i * N, d.dskip[i],
                                         h_end.data() + i * N, y.data());
      },
      [&] {
        cpu::ScanForward<float>(in, rows, d.h0.data(), d.dskip.data(), h_end.data(), y.data());
      },
      seconds);
  PrintScan("scan_forward", d, old_f, new_f, 21, peak);

  auto [old_s, new_s] = TimePair(
      [&] {
        for (int64_t i = 0; i < Di; ++i)
          cpu::ScanAdjointSummaryChannel<float>(in, i, rows, d.ybar.data(), m.data() + i * N);
      },
      [&] { cpu::ScanAdjointSummary<float>(in, rows, d.ybar.data(), m.data()); }, seconds);
  PrintScan("scan_adjoint_summary", d, old_s, new_s, 19, peak);

  std::vector<float> ddt(rows * Di), dxc(rows * Di), dB(rows * N), dC(rows * N), dA(Di * N), dD(Di),
      mu_out(Di * N);
  const cpu::ScanGrads<float> g{y.data(),  ddt.data(), dxc.data(), dB.data(),
                                dC.data(), dA.data(),  dD.data(),  mu_out.data()};
  const cpu::ScanBackwardOptions opt{rows, 0};
  cpu::ScanScratch<float> scratch;
  auto [old_b, new_b] = TimePair(
      [&] {
        for (int64_t i = 0; i < Di; ++i)
          cpu::ScanBackwardChannel<float>(in, i, opt, d.h0.data() + i * N, d.mu.data() + i * N,
                                          d.ybar.data(), d.dskip[i], scratch, g);
      },
      [&] {
        cpu::ScanBackward<float>(in, opt, d.h0.data(), d.mu.data(), d.ybar.data(), d.dskip.data(),
                                 g);
      },
      seconds);
  PrintScan("scan_backward", d, old_b, new_b, 35, peak);
}

// One layer of width D and state N, as the engine's models have it (dt rank ceil(D / 16)).
MambaConfig BlockConfig(int64_t D, int64_t N) {
  MambaConfig c;
  c.hidden_size = D, c.num_hidden_layers = 1, c.state_size = N, c.vocab_size = 256;
  c.time_step_rank = (D + 15) / 16;
  return c;
}

// The block's GemmPacked products at a chunk of `rows` (kernels/cpu/mamba_block.cc): in_proj's
// x half (its z half is the same shape), x_proj, out_proj (added into the residual), and the
// backward's dn = dxz W_in; then its weight gradients through GemmAtB, dW += dY^T X, for in_proj,
// out_proj and x_proj; each against OpenBLAS's sgemm of the same product.
void BenchGemms(const MambaConfig& c, int64_t rows, double seconds, double peak) {
  const int64_t D = c.hidden_size, N = c.state_size, Di = c.inner(), R = c.time_step_rank;
  const int64_t halo = c.conv_kernel - 1;
  struct Shape {
    const char* name;
    int64_t M, N, K;
    cpu::Trans op;  // of W: kYes, W (N, K); kNo, W (K, N)
    bool accumulate;
    bool atb = false;  // C (M, N) += A^T W through GemmAtB: A (K, M), W (K, N)
  };
  const Shape shapes[] = {{"gemm_in_proj_half", halo + rows, Di, D, cpu::Trans::kYes, false},
                          {"gemm_x_proj", rows, R + 2 * N, Di, cpu::Trans::kYes, false},
                          {"gemm_out_proj", rows, D, Di, cpu::Trans::kYes, true},
                          {"gemm_dn", halo + rows, D, 2 * Di, cpu::Trans::kNo, false},
                          {"gemm_dw_in", 2 * Di, D, halo + rows, cpu::Trans::kNo, true, true},
                          {"gemm_dw_out", D, Di, rows, cpu::Trans::kNo, true, true},
                          {"gemm_dw_x", R + 2 * N, Di, rows, cpu::Trans::kNo, true, true}};
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0, 1);
  for (const Shape& sh : shapes) {
    std::vector<float> A(sh.M * sh.K), W(sh.N * sh.K), C(sh.M * sh.N);
    for (auto* v : {&A, &W, &C})
      for (auto& e : *v) e = g(rng);
    const cpu::Projection<float> packed(W.data(), sh.op, sh.N, sh.K);
    const int64_t ldw = sh.op == cpu::Trans::kYes ? sh.K : sh.N;
    const int64_t lda = sh.atb ? sh.M : sh.K;
    const std::function<void()> ours = [&] {
      if (sh.atb) {
        cpu::GemmAtB(sh.M, sh.N, sh.K, A.data(), lda, W.data(), ldw, sh.accumulate, C.data(),
                     sh.N);
      } else {
        packed.Apply(sh.M, A.data(), lda, sh.accumulate, C.data(), sh.N);
      }
    };
    const auto [blas_s, ours_s] = TimePair(
        [&] {
          cpu::Gemm<float>(sh.atb ? cpu::Trans::kYes : cpu::Trans::kNo, sh.op, sh.M, sh.N, sh.K,
                           1, A.data(), lda, W.data(), ldw, sh.accumulate ? 1 : 0, C.data(),
                           sh.N);
        },
        ours, seconds);
    // The same product with C and W cold and A warm (TimeColdCall).
    volatile float sink = 0;
    const auto warm_a = [&] {
      float s = 0;
      for (size_t i = 0; i < A.size(); i += 16) s += A[i];
      sink = s;
    };
    const double cold_s = TimeColdCall(ours, warm_a, seconds / 4);
    const double flops = 2.0 * sh.M * sh.N * sh.K;
    std::printf(
        "{\"kernel\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"packed_kernel\": \"%s\", "
        "\"openblas_gflop_per_s\": %.2f, \"packed_gflop_per_s\": %.2f, \"speedup\": %.2f, "
        "\"fraction_of_fma_peak\": %.3f, \"packed_cold_gflop_per_s\": %.2f}\n",
        sh.name, static_cast<long long>(sh.M), static_cast<long long>(sh.N),
        static_cast<long long>(sh.K), cpu::GemmPackedKernel(), flops / blas_s / 1e9,
        flops / ours_s / 1e9, blas_s / ours_s, flops / ours_s / 1e9 / peak,
        flops / cold_s / 1e9);
  }
}

void BenchBlock(const MambaConfig& c, int64_t rows, double seconds, double sgemm) {
  const int64_t D = c.hidden_size, N = c.state_size;
  const ModelParams<float> params = InitParams<float>(c, 1);
  LayerParams<float> grad = params.layers[0];
  const cpu::MambaBlockCpu<float> block(c, params.layers[0]);
  const int64_t Di = c.inner(), halo = c.conv_kernel - 1;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> u((halo + rows) * D), gu(rows * D), h0(Di * N), mu(Di * N);
  for (auto* v : {&u, &gu, &h0, &mu})
    for (auto& e : *v) e = g(rng);
  std::vector<float> u_next(rows * D), h_end(Di * N), du(rows * D), du_halo(halo * D),
      mu_out(Di * N);
  const cpu::ChunkRows cr{halo, rows, 0};
  const double fwd_s = TimeCall(
      [&] { block.Forward(u.data(), cr, h0.data(), u_next.data(), h_end.data()); }, seconds / 2);
  const double bwd_s = TimeCall(
      [&] {
        block.Backward(u.data(), cr, gu.data(), h0.data(), mu.data(), 0, grad, du.data(),
                       du_halo.data(), mu_out.data());
      },
      seconds / 2);
  // bench/flops.h's per-layer GEMM counts: forward = recompute + out; the VJP task = recompute
  // + the backward GEMMs (dW and dinput of every projection; out_proj's dinput is g W_out).
  const double Dd = D, Did = Di, R = c.time_step_rank, Q = R + 2.0 * N;
  const double recompute = 2 * Dd * 2 * Did + 2 * Did * Q + 2 * R * Did, out = 2 * Did * Dd;
  const double fwd_flops = (recompute + out) * rows;
  const double bwd_flops = (recompute + 2 * (recompute + out)) * rows;
  for (auto [name, s, flops] : {std::tuple{"block_forward", fwd_s, fwd_flops},
                                std::tuple{"block_backward", bwd_s, bwd_flops}}) {
    std::printf(
        "{\"kernel\": \"%s\", \"D\": %lld, \"rows\": %lld, \"ns_per_token\": %.1f, "
        "\"gemm_gflop_per_s\": %.2f, \"fraction_of_sgemm\": %.3f}\n",
        name, static_cast<long long>(D), static_cast<long long>(rows), s / rows * 1e9,
        flops / s / 1e9, flops / s / 1e9 / sgemm);
  }
}

}  // namespace
}  // namespace adjsh::bench

int main(int argc, char** argv) {
  using adjsh::cli::ArgParser;
  ArgParser a("kernel_bench",
              "Micro-benchmarks of the CPU scan and block kernels (1 thread); JSON lines.");
  a.Add("hidden-size", "D", "width (Di = 2 D)", "256");
  a.Add("state-size", "N", "state size", "16");
  a.Add("rows", "C", "rows per kernel call (the chunk)", "256");
  a.Add("seconds", "S", "time per measurement", "3");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  int64_t v[4];
  const char* names[4] = {"hidden-size", "state-size", "rows", "seconds"};
  const int64_t hi[4] = {65536, 1024, 1 << 20, 3600};
  for (int k = 0; k < 4; ++k) {
    const auto got = a.GetInt(names[k], 1, hi[k]);
    if (!got.ok()) return adjsh::cli::BadUsage("kernel_bench", got.status());
    v[k] = *got;
  }
  const int64_t D = v[0], N = v[1], rows = v[2];
  const double seconds = double(v[3]);
  adjsh::cpu::InitBlasSingleThreaded();
  const double peak = adjsh::bench::FmaPeak(seconds / 2);
  const double sgemm = adjsh::bench::SgemmRate(seconds / 2);
  std::printf(
      "{\"kernel\": \"limits\", \"fma_peak_gflop_per_s\": %.2f, \"sgemm_gflop_per_s\": %.2f}\n",
      peak, sgemm);
  std::fflush(stdout);
  adjsh::bench::BenchScans(rows, 2 * D, N, seconds, peak);
  std::fflush(stdout);
  const adjsh::MambaConfig block = adjsh::bench::BlockConfig(D, N);
  adjsh::bench::BenchGemms(block, rows, seconds, peak);
  std::fflush(stdout);
  adjsh::bench::BenchBlock(block, rows, seconds, sgemm);
  return 0;
}
