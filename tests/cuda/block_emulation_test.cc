// The whole CUDA block and head (kernels/cuda/device_block.cu, lm_head.cu with the scan and op
// kernels) compiled for the host: kernels run block by block on host threads
// (host_emulation.h), device memory is host memory, and cuBLAS is replaced by a plain GEMM with
// f32 sums over the same row-major operands. Checked against the CPU block and head in f64,
// with f32 and bf16 storage: every output of the block interface and of the head. This covers
// the host code's orchestration (workspace layout, GEMM operands and transposes, the order of
// kernels) without a GPU; cuda_backend_test checks the same on a GPU. And the context's byte
// counts (MemoryCounts), under threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/cuda/host_emulation.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm_mapping.h"

namespace adjsh::emulation {
inline cudaError_t Memcpy(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t Memset(void* dst, int v, size_t n) {
  std::memset(dst, v, n);
  return cudaSuccess;
}
}  // namespace adjsh::emulation
#define cudaSetDevice(d) ((void)(d), cudaSuccess)
#define cudaMemcpyAsync(dst, src, n, kind, s) ::adjsh::emulation::Memcpy(dst, src, n)
#define cudaMemsetAsync(dst, v, n, s) ::adjsh::emulation::Memset(dst, v, n)

// The device code, compiled here for the host; the head in blocks of 8 rows x 16 entries.
#define ADJSH_CUDA_HEAD_ROWS 8
#define ADJSH_CUDA_HEAD_VOCAB 16
#include "kernels/cuda/device_block.cu"
#include "kernels/cuda/lm_head.cu"
#include "kernels/cuda/ops.cu"
#include "kernels/cuda/scan.cu"
#include "common/model.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/mamba_block.h"
#include "tests/kernels/test_util.h"

// The host stand-in for context.cu.
namespace adjsh::cuda {

void CheckCuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed\n", file, line, expr);
  std::abort();
}
void CheckCublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s:%d: %s failed\n", file, line, expr);
  std::abort();
}

Context& Context::Get(int device) {
  static Context ctx(device);
  return ctx;
}
Context::Context(int device) : device_(device), counts_(std::make_shared<MemoryCounts>()) {}
char* Context::Workspace(size_t bytes) {
  if (bytes > ws_bytes_) {
    std::free(ws_);
    ws_ = static_cast<char*>(std::malloc(bytes));
    Count(static_cast<int64_t>(bytes) - static_cast<int64_t>(ws_bytes_));
    ws_bytes_ = bytes;
  }
  return ws_;
}
void* Context::Alloc(size_t bytes) {
  Count(static_cast<int64_t>(bytes));
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void Context::Free(void* p, size_t bytes) {
  Count(-static_cast<int64_t>(bytes));
  std::free(p);
}
void Context::Upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void Context::Download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void Context::Sync() {}

float LoadAs(const void* p, cudaDataType_t t, int64_t k) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[k];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[k]);
}
void StoreAs(void* p, cudaDataType_t t, int64_t k, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[k] = v;
  } else {
    static_cast<__nv_bfloat16*>(p)[k] = __float2bfloat16_rn(v);
  }
}

// The column-major GEMM cublasGemmEx computes (f32 sums), reached through the same row-major
// mapping as on the GPU (gemm_mapping.h).
void Gemm(Context&, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, cudaDataType_t a_type, int64_t lda, const void* b, cudaDataType_t b_type,
          int64_t ldb, float beta, void* c, cudaDataType_t c_type, int64_t ldc) {
  auto col = [](cublasOperation_t op_a, cublasOperation_t op_b, int64_t cm, int64_t cn,
                int64_t ck, const float* al, const void* ca, cudaDataType_t cat, int64_t clda,
                const void* cb, cudaDataType_t cbt, int64_t cldb, const float* be, void* cc,
                cudaDataType_t cct, int64_t cldc) {
    // Column-major: X[i, j] at i + j ld; op_x(X)[i, q] = X[q, i] when transposed.
    for (int64_t i = 0; i < cm; ++i)
      for (int64_t j = 0; j < cn; ++j) {
        float acc = 0;
        for (int64_t q = 0; q < ck; ++q) {
          const float x = LoadAs(ca, cat, op_a == CUBLAS_OP_T ? q + i * clda : i + q * clda);
          const float y = LoadAs(cb, cbt, op_b == CUBLAS_OP_T ? j + q * cldb : q + j * cldb);
          acc += x * y;
        }
        const float old = *be == 0 ? 0.0f : LoadAs(cc, cct, i + j * cldc);
        StoreAs(cc, cct, i + j * cldc, *al * acc + *be * old);
      }
  };
  RowMajorGemm(col, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
               c_type, ldc);
}

}  // namespace adjsh::cuda

namespace adjsh {
namespace {

double WholeErr(const std::vector<std::vector<float>>& a,
                const std::vector<std::vector<double>>& b) {
  double num = 0, den = 0;
  for (size_t q = 0; q < a.size(); ++q)
    for (size_t k = 0; k < a[q].size(); ++k) {
      num += (double(a[q][k]) - b[q][k]) * (double(a[q][k]) - b[q][k]);
      den += b[q][k] * b[q][k];
    }
  return std::sqrt(num / den);
}

class BlockEmulationTest : public ::testing::TestWithParam<bool> {};

// f32 storage: each tensor within 1e-5 of f64 (as on the GPU); bf16 storage: the whole set of
// outputs within 2e-2 (roundings of 2e-3 through a few operations).
TEST_P(BlockEmulationTest, BlockMatchesCpuF64) {
  const bool bf16 = GetParam();
  const double tol = bf16 ? 2e-2 : 1e-5;
  const MambaConfig config = testing::SmallConfig(1, 16, 8, 4, 3, 29);
  const ModelParams<double> p64 = InitParams<double>(config, 12);
  const ModelParams<float> p32 = InitParams<float>(config, 12);
  const LayerParams<float>& w = p32.layers[0];
  const int64_t D = config.hidden_size, Di = config.inner(), N = config.state_size;
  const int64_t DiN = Di * N, halo = 3, len = 70;  // two scan segments
  std::mt19937_64 rng(3);
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

  cuda::LayerTensors<const float> wt;
  wt.norm = w.norm.data(), wt.in_proj = w.in_proj.data(), wt.conv_w = w.conv_w.data();
  wt.conv_b = w.conv_b.data(), wt.x_proj = w.x_proj.data(), wt.dt_w = w.dt_w.data();
  wt.dt_b = w.dt_b.data(), wt.A_log = w.A_log.data(), wt.Dskip = w.Dskip.data();
  wt.out_proj = w.out_proj.data();
  cuda::DeviceBlock block(0, bf16,
                          {D, Di, N, config.time_step_rank, config.conv_kernel,
                           static_cast<float>(config.layer_norm_epsilon)},
                          wt);
  const std::vector<float> u32 = f32(u), h032 = f32(h0), mu32 = f32(mu), g32 = f32(g);
  std::vector<float> y32(len * D), e32(DiN), du32(len * D), dh32(halo * D), mo32(DiN);
  LayerParams<float> g32p = ZeroLayer<float>(config);
  block.Forward(u32.data(), halo, len, h032.data(), y32.data(), e32.data());
  cuda::LayerTensors<float> gt;
  gt.norm = g32p.norm.data(), gt.in_proj = g32p.in_proj.data(), gt.conv_w = g32p.conv_w.data();
  gt.conv_b = g32p.conv_b.data(), gt.x_proj = g32p.x_proj.data(), gt.dt_w = g32p.dt_w.data();
  gt.dt_b = g32p.dt_b.data(), gt.A_log = g32p.A_log.data(), gt.Dskip = g32p.Dskip.data();
  gt.out_proj = g32p.out_proj.data();
  block.Backward(u32.data(), halo, len, g32.data(), h032.data(), mu32.data(), gt, du32.data(),
                 dh32.data(), mo32.data());

  std::vector<std::vector<float>> got = {y32, e32, du32, dh32, mo32};
  std::vector<std::vector<double>> want = {y, h_end, du, du_halo, mu_out};
  const char* names[] = {"u_next", "h_end", "du", "du_halo", "mu_out"};
  const auto& s32 = LayerParamSlots<float>();
  const auto& s64 = LayerParamSlots<double>();
  for (size_t q = 0; q < s32.size(); ++q) {
    got.push_back(g32p.*s32[q].member);
    want.push_back(grad.*s64[q].member);
  }
  for (size_t q = 0; q < got.size(); ++q) {
    const double e = testing::RelErr(got[q], want[q]);
    if (!bf16) {
      EXPECT_LT(e, tol) << (q < 5 ? names[q] : s32[q - 5].suffix);
    }
  }
  EXPECT_LT(WholeErr(got, want), tol);
}

TEST_P(BlockEmulationTest, HeadMatchesCpuF64) {
  const bool bf16 = GetParam();
  const double tol = bf16 ? 2e-2 : 1e-5;
  const int64_t M = 21, D = 8, V = 40;  // three row and three vocabulary blocks, both ragged
  std::mt19937_64 rng(4);
  std::normal_distribution<double> dist(0, 1);
  std::vector<double> E(V * D), w(D), u(M * D);
  for (double& x : E) x = 0.5 * dist(rng);
  for (double& x : w) x = 1 + 0.1 * dist(rng);
  for (double& x : u) x = dist(rng);
  std::vector<int64_t> targets(M);
  for (int64_t t = 0; t < M; ++t) targets[t] = t + 1 < M ? (t * 7919) % V : -1;
  const double scale = 1.0 / (M - 1);
  // f64 reference: the CPU head, one block of all rows.
  std::vector<double> du(M * D), dlogits(M * V), nf(M * D), dw(D, 0.0), dE(V * D, 0.0);
  const cpu::LmHeadArgs<double> args{M, D, V, 1e-5, E.data(), w.data(), u.data(),
                                     targets.data(), scale};
  const double loss = cpu::LmHeadForwardBackward<double>(args, du.data(), dlogits.data(),
                                                         nf.data(), dw.data());
  for (int64_t r = 0; r < M; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t d = 0; d < D; ++d) dE[v * D + d] += dlogits[r * V + v] * nf[r * D + d];

  const std::vector<float> E32(E.begin(), E.end()), w32(w.begin(), w.end()),
      u32(u.begin(), u.end());
  std::vector<float> du32(M * D), dE32(V * D, 0.0f), dw32(D, 0.0f);
  const double loss32 =
      cuda::DeviceHead(0, bf16, M, D, V, 1e-5f, E32.data(), w32.data(), u32.data(),
                       targets.data(), static_cast<float>(scale), du32.data(), dE32.data(),
                       dw32.data());
  EXPECT_NEAR(loss32, loss, (bf16 ? 1e-2 : 1e-5) * loss);
  EXPECT_LT(testing::RelErr(du32, du), tol) << "du";
  EXPECT_LT(testing::RelErr(dE32, dE), tol) << "dE";
  EXPECT_LT(testing::RelErr(dw32, dw), tol) << "dw_f";
}

// The context's byte counts (context.h), which the worker's GPU gauges read from another thread:
// the peak since the last ResetPeak and the one since the start.
TEST(MemoryCountsTest, PeaksFollowHeldAndResetPeakLeavesTheStartPeak) {
  cuda::MemoryCounts c;
  c.Add(100);
  c.Add(50);
  EXPECT_EQ(c.held(), 150);
  EXPECT_EQ(c.peak(), 150);
  EXPECT_EQ(c.peak_since_start(), 150);
  c.Add(-120);
  EXPECT_EQ(c.held(), 30);
  EXPECT_EQ(c.peak(), 150);
  c.ResetPeak();
  EXPECT_EQ(c.peak(), 30);
  EXPECT_EQ(c.peak_since_start(), 150);
  c.Add(40);
  EXPECT_EQ(c.held(), 70);
  EXPECT_EQ(c.peak(), 70);
  EXPECT_EQ(c.peak_since_start(), 150);
}

// Threads allocating and freeing at once: no change is lost (held ends at 0) and the peak is
// at least what each thread alone held, at most what all held together.
TEST(MemoryCountsTest, ConcurrentChangesLoseNothing) {
  cuda::MemoryCounts c;
  constexpr int kThreads = 4, kRounds = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&c, bytes = int64_t{1} << (4 * t)] {
      for (int r = 0; r < kRounds; ++r) {
        c.Add(bytes);
        c.Add(-bytes);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.held(), 0);
  EXPECT_GE(c.peak_since_start(), int64_t{1} << (4 * (kThreads - 1)));
  EXPECT_LE(c.peak_since_start(), 0x1111);
  EXPECT_EQ(c.peak(), c.peak_since_start());
}

INSTANTIATE_TEST_SUITE_P(Storage, BlockEmulationTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "bf16" : "f32";
                         });

}  // namespace
}  // namespace adjsh
