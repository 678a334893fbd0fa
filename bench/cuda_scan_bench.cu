// Effective memory bandwidth of the fused scan kernels (kernels/cuda/scan.h) against the
// device's own cudaMemcpy device-to-device rate:
//   cuda_scan_bench [--len L] [--inner Di] [--state N] [--storage f32|bf16] [--repeat R]
// Bytes are the kernels' compulsory traffic: every input read once and every output written
// once (forward: dtpre, x', z, B, C in, o out; backward: those and dL/do in, o, dz, ddtpre, dx',
// dB, dC out). The copy rate counts a read and a write per byte copied. Prints one JSON object.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cli/args.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/scan.h"

namespace adjsh::cuda {
namespace {

struct Flags {
  int64_t len = 2048, Di = 1536, N = 16, repeat = 20;
  bool bf16 = false;
};

// The median time in ms of `repeat` runs of fn on the context's stream.
template <typename Fn>
double MedianMs(Context& ctx, int64_t repeat, Fn fn) {
  cudaEvent_t start, stop;
  ADJSH_CUDA_CHECK(cudaEventCreate(&start));
  ADJSH_CUDA_CHECK(cudaEventCreate(&stop));
  fn();  // warm-up
  std::vector<float> ms(repeat);
  for (int64_t r = 0; r < repeat; ++r) {
    ADJSH_CUDA_CHECK(cudaEventRecord(start, ctx.stream()));
    fn();
    ADJSH_CUDA_CHECK(cudaEventRecord(stop, ctx.stream()));
    ADJSH_CUDA_CHECK(cudaEventSynchronize(stop));
    ADJSH_CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  ADJSH_CUDA_CHECK(cudaEventDestroy(start));
  ADJSH_CUDA_CHECK(cudaEventDestroy(stop));
  return ms[repeat / 2];
}

template <typename S>
std::vector<S> Random(int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<S> v(n);
  for (S& x : v) x = static_cast<S>(dist(rng));
  return v;
}

template <typename S>
S* Put(Context& ctx, const std::vector<S>& host) {
  S* p = static_cast<S*>(ctx.Alloc(host.size() * sizeof(S)));
  ctx.Upload(p, host.data(), host.size() * sizeof(S));
  return p;
}

template <typename S>
int Run(const Flags& f) {
  Context& ctx = Context::Get(0);
  const int64_t L = f.len, Di = f.Di, N = f.N, R = 48, Q = R + 2 * N;
  const double s = sizeof(S);
  ScanArgs<S> a;
  a.len = L, a.halo = 0, a.Di = Di, a.N = N, a.R = R;
  a.dtpre = Put(ctx, Random<S>(L * Di, -4.0f, -1.0f, 1));
  a.dt_b = Put(ctx, Random<float>(Di, -1.0f, 0.0f, 2));
  a.xc = Put(ctx, Random<S>(L * Di, -1.0f, 1.0f, 3));
  a.dbc = Put(ctx, Random<S>(L * Q, -1.0f, 1.0f, 4));
  a.xz = Put(ctx, Random<S>(L * 2 * Di, -1.0f, 1.0f, 5));
  a.A = Put(ctx, Random<float>(Di * N, -16.0f, -1.0f, 6));
  a.Dskip = Put(ctx, Random<float>(Di, 0.5f, 1.5f, 7));
  float* h0 = Put(ctx, Random<float>(Di * N, -0.1f, 0.1f, 8));
  float* h_end = Put(ctx, std::vector<float>(Di * N));
  S* o = Put(ctx, std::vector<S>(L * Di));

  ScanBackwardArgs<S> b;
  b.d_o = Put(ctx, Random<float>(L * Di, -0.01f, 0.01f, 9));
  b.h0 = h0;
  b.mu = Put(ctx, Random<float>(Di * N, -0.01f, 0.01f, 10));
  b.o = o;
  b.dxz = Put(ctx, std::vector<S>(L * 2 * Di));
  b.ddt = Put(ctx, std::vector<S>(L * Di));
  b.dxc = Put(ctx, std::vector<float>(L * Di));
  b.ddbc = Put(ctx, std::vector<S>(L * Q));
  b.dA_log = Put(ctx, std::vector<float>(Di * N));
  b.dD = Put(ctx, std::vector<float>(Di));
  b.ddt_b = Put(ctx, std::vector<float>(Di));
  b.mu_out = Put(ctx, std::vector<float>(Di * N));
  b.scratch = Put(ctx, std::vector<float>(ScanBackwardScratch(L, Di, N)));
  float* fwd_scratch = Put(ctx, std::vector<float>(ScanForwardScratch(L, Di, N)));
  ctx.Sync();

  const double fwd_ms = MedianMs(
      ctx, f.repeat, [&] { ScanForward<S>(ctx.stream(), a, h0, h_end, o, fwd_scratch); });
  const double bwd_ms = MedianMs(ctx, f.repeat, [&] { ScanBackward<S>(ctx.stream(), a, b); });
  const double fwd_bytes = L * Di * 4 * s + 2.0 * L * N * s;
  const double bwd_bytes = L * Di * (6 * s + 8) + 4.0 * L * N * s;

  // cudaMemcpy device to device of 1 GiB.
  const size_t copy_bytes = size_t{1} << 30;
  void* src = ctx.Alloc(copy_bytes);
  void* dst = ctx.Alloc(copy_bytes);
  ADJSH_CUDA_CHECK(cudaMemsetAsync(src, 1, copy_bytes, ctx.stream()));
  const double copy_ms = MedianMs(ctx, 10, [&] {
    ADJSH_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
  });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  const double fwd_gbs = fwd_bytes / (fwd_ms * 1e-3) / 1e9;
  const double bwd_gbs = bwd_bytes / (bwd_ms * 1e-3) / 1e9;
  cudaDeviceProp prop;
  ADJSH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "{\"device\": \"%s\", \"storage\": \"%s\", \"len\": %lld, \"inner\": %lld, \"state\": %lld, "
      "\"copy_gb_s\": %.1f, \"forward_ms\": %.4f, \"forward_gb_s\": %.1f, "
      "\"forward_of_copy\": %.3f, "
      "\"backward_ms\": %.4f, \"backward_gb_s\": %.1f, \"backward_of_copy\": %.3f}\n",
      prop.name, f.bf16 ? "bf16" : "f32", static_cast<long long>(L), static_cast<long long>(Di),
      static_cast<long long>(N), copy_gbs, fwd_ms, fwd_gbs, fwd_gbs / copy_gbs, bwd_ms, bwd_gbs,
      bwd_gbs / copy_gbs);
  return 0;
}

}  // namespace
}  // namespace adjsh::cuda

int main(int argc, char** argv) {
  adjsh::cli::ArgParser a("cuda_scan_bench",
                          "The fused CUDA scan kernels' bandwidth against the device's copy "
                          "rate; one JSON object.");
  a.Add("len", "L", "rows (tokens)", "2048");
  a.Add("inner", "Di", "channels", "1536");
  a.Add("state", "N", "state size (at most 32)", "16");
  a.Add("storage", "f32|bf16", "the kernels' input and output precision", "f32");
  a.Add("repeat", "R", "timed runs of each kernel; the median is reported", "20");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  adjsh::cuda::Flags f;
  const std::pair<const char*, int64_t*> counts[] = {
      {"len", &f.len}, {"inner", &f.Di}, {"state", &f.N}, {"repeat", &f.repeat}};
  const int64_t hi[] = {int64_t{1} << 30, int64_t{1} << 20, 32, 100000};
  for (int k = 0; k < 4; ++k) {
    const absl::StatusOr<int64_t> v = a.GetInt(counts[k].first, 1, hi[k]);
    if (!v.ok()) return adjsh::cli::BadUsage("cuda_scan_bench", v.status());
    *counts[k].second = *v;
  }
  const std::string storage = a.Get("storage");
  if (storage != "f32" && storage != "bf16") {
    return adjsh::cli::BadUsage(
        "cuda_scan_bench",
        absl::InvalidArgumentError("--storage must be f32 or bf16, got '" + storage + "'"));
  }
  f.bf16 = storage == "bf16";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "cuda_scan_bench: no CUDA device\n");
    return 1;
  }
  return f.bf16 ? adjsh::cuda::Run<adjsh::cuda::bf16>(f) : adjsh::cuda::Run<float>(f);
}
