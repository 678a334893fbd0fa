// The head on the GPU: final RMSNorm, tied LM head and cross-entropy with their backward, over
// blocks of kRows rows and, inside each, blocks of kVocab vocabulary entries. Pass one keeps a
// running log-sum-exp per row; pass two recomputes each block's logits for the softmax gradient
// and accumulates dnf and dE by GEMMs. Only (kRows, kVocab) logits exist at a time, whatever
// the number of rows; dE stays on the device until the end, and the host waits once. With the
// weights resident (DeviceHeadWeights), u, du and dE are the device's too (a resident span's),
// read and written where they are.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cuda/context.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/ops.h"

namespace adjsh::cuda {
namespace {

// Rows and vocabulary entries per block (tests/cuda/block_emulation_test.cc compiles this file
// for the host with small blocks, so that a small head spans several of each).
#ifndef ADJSH_CUDA_HEAD_ROWS
#define ADJSH_CUDA_HEAD_ROWS 1024
#define ADJSH_CUDA_HEAD_VOCAB 8192
#endif
constexpr int64_t kRows = ADJSH_CUDA_HEAD_ROWS;
constexpr int64_t kVocab = ADJSH_CUDA_HEAD_VOCAB;

// The head's weights on the device: E in the storage type (the GEMMs' operand) and w_f; null
// for a call that uploads its own. With them, dE is device memory too (added into where it is).
template <typename S>
struct HeadWeights {
  const S* E = nullptr;
  const float* w_f = nullptr;
};

template <typename S>
double Head(Context& ctx, int64_t M, int64_t D, int64_t V, float eps, const float* E,
            const float* w_f, HeadWeights<S> on_device, const float* u, const int64_t* targets,
            const uint32_t* next_ids, int64_t valid, float scale, float* du, float* dE,
            float* dw_f, float* dE_nonfinite = nullptr) {
  const int64_t R = std::min(kRows, M), Vb = std::min(kVocab, V);
  const cudaDataType_t st = DataType<S>(), f32 = CUDA_R_32F;
  // The weights uploaded per call with host rows and partials; resident, all on the device,
  // and with no dE the loss alone (an evaluation: the first pass over the vocabulary).
  const bool upload = on_device.E == nullptr, resident = !upload;
  const bool backward = upload || dE != nullptr;
  float *E_d = nullptr, *w_d = nullptr, *u_d, *r, *logits, *mx, *sum, *tl, *dnf, *dE_d, *dw_acc,
        *dw_blk, *reduce;
  S *E_s = nullptr, *nf, *dl;
  int64_t* tg;
  double* loss_d = nullptr;
  float* flag = nullptr;  // dE's non-finite flag (resident, when asked)
  CarveWorkspace(ctx, [&](Carver& c) {
    loss_d = c.Take<double>(resident ? 1 : 0);
    flag = c.Take<float>(dE_nonfinite != nullptr ? 1 : 0);
    if (upload) {
      E_d = c.Take<float>(V * D);
      E_s = std::is_same_v<S, float> ? reinterpret_cast<S*>(E_d) : c.Take<S>(V * D);
      w_d = c.Take<float>(D);
    }
    u_d = c.Take<float>(R * D);
    nf = c.Take<S>(R * D);
    r = c.Take<float>(R);
    tg = c.Take<int64_t>(R);
    logits = c.Take<float>(R * Vb);
    dl = c.Take<S>(R * Vb);
    mx = c.Take<float>(R);
    sum = c.Take<float>(R);
    tl = c.Take<float>(R);
    dnf = c.Take<float>(R * D);
    dE_d = upload ? c.Take<float>(V * D) : dE;
    dw_acc = c.Take<float>(D);
    dw_blk = c.Take<float>(D);
    reduce = c.Take<float>(RmsNormBackwardScratch(R, D));
  });
  cudaStream_t s = ctx.stream();
  if (upload) {
    ctx.Upload(E_d, E, V * D * sizeof(float));
    ctx.Upload(w_d, w_f, D * sizeof(float));
    if (!std::is_same_v<S, float>) Convert<S>(s, E_d, V * D, E_s);
  } else {
    E_s = const_cast<S*>(on_device.E), w_d = const_cast<float*>(on_device.w_f);
  }
  if (upload) ADJSH_CUDA_CHECK(cudaMemsetAsync(dE_d, 0, V * D * sizeof(float), s));
  ADJSH_CUDA_CHECK(cudaMemsetAsync(dw_acc, 0, D * sizeof(float), s));
  if (resident) ADJSH_CUDA_CHECK(cudaMemsetAsync(loss_d, 0, sizeof(double), s));
  // Each row's statistics, for the loss on the host (resident: summed on the device instead).
  std::vector<float> h_mx(resident ? 0 : M), h_sum(resident ? 0 : M), h_tl(resident ? 0 : M);
  for (int64_t r0 = 0; r0 < M; r0 += R) {
    const int64_t rows = std::min(R, M - r0);
    if (resident) {
      u_d = const_cast<float*>(u) + r0 * D;
    } else {
      ctx.Upload(u_d, u + r0 * D, rows * D * sizeof(float));
    }
    if (resident) {  // the targets from the span's ids, where they are
      NextTargets(s, next_ids + r0, std::clamp<int64_t>(valid - r0, 0, rows), rows, tg);
    } else {
      ctx.Upload(tg, targets + r0, rows * sizeof(int64_t));
    }
    RmsNormForward<S>(s, u_d, rows, D, w_d, eps, nf, r);
    for (int64_t v0 = 0; v0 < V; v0 += Vb) {
      const int64_t vb = std::min(Vb, V - v0);
      Gemm(ctx, false, true, rows, vb, D, 1, nf, st, D, E_s + v0 * D, st, D, 0, logits, f32, vb);
      CeStats(s, logits, rows, vb, v0, tg, v0 == 0, mx, sum, tl);
    }
    if (resident) {
      CeLossAdd(s, mx, sum, tl, tg, rows, loss_d);
    } else {
      ctx.Download(h_mx.data() + r0, mx, rows * sizeof(float));
      ctx.Download(h_sum.data() + r0, sum, rows * sizeof(float));
      ctx.Download(h_tl.data() + r0, tl, rows * sizeof(float));
    }
    if (!backward) continue;
    for (int64_t v0 = 0; v0 < V; v0 += Vb) {
      const int64_t vb = std::min(Vb, V - v0);
      Gemm(ctx, false, true, rows, vb, D, 1, nf, st, D, E_s + v0 * D, st, D, 0, logits, f32, vb);
      CeGrad<S>(s, logits, rows, vb, v0, tg, mx, sum, scale, dl);
      Gemm(ctx, false, false, rows, D, vb, 1, dl, st, vb, E_s + v0 * D, st, D, v0 == 0 ? 0 : 1,
           dnf, f32, D);
      Gemm(ctx, true, false, vb, D, rows, 1, dl, st, vb, nf, st, D, 1, dE_d + v0 * D, f32, D);
    }
    RmsNormBackward(s, u_d, rows, D, w_d, r, dnf, dw_blk, resident ? du + r0 * D : dnf, reduce);
    Add(s, dw_acc, dw_blk, D, dw_acc);
    if (!resident) ctx.Download(du + r0 * D, dnf, rows * D * sizeof(float));
  }
  std::vector<float> h_dE(upload ? V * D : 0), h_dw(backward ? D : 0);
  if (upload) ctx.Download(h_dE.data(), dE_d, V * D * sizeof(float));
  if (backward) ctx.Download(h_dw.data(), dw_acc, D * sizeof(float));
  double loss = 0;
  if (resident) ctx.Download(&loss, loss_d, sizeof(double));
  if (dE_nonfinite != nullptr) {  // checked where dE is, its answer down with the loss
    ZeroFloats(s, 1, flag);
    MarkNonFinite(s, dE_d, V * D, flag);
    ctx.Download(dE_nonfinite, flag, sizeof(float));
  }
  ctx.Sync();
  // loss_t = logsumexp - logit[target] = log(sum) - (logit[target] - max), as the CPU head.
  for (int64_t t = 0; t < M && !resident; ++t) {
    if (targets[t] < 0) continue;
    loss += static_cast<double>(std::log(h_sum[t])) - static_cast<double>(h_tl[t] - h_mx[t]);
  }
  if (upload) {
    for (int64_t k = 0; k < V * D; ++k) dE[k] += h_dE[k];
  }
  for (int64_t d = 0; d < D && backward; ++d) dw_f[d] += h_dw[d];
  return loss;
}

}  // namespace

double DeviceHead(int device, bool bf16_storage, int64_t M, int64_t D, int64_t V, float eps,
                  const float* E, const float* w_f, const float* u, const int64_t* targets,
                  float scale, float* du, float* dE, float* dw_f) {
  Context& ctx = Context::Get(device);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(device));
  if (bf16_storage) {
    return Head<bf16>(ctx, M, D, V, eps, E, w_f, {}, u, targets, nullptr, 0, scale, du, dE,
                      dw_f);
  }
  return Head<float>(ctx, M, D, V, eps, E, w_f, {}, u, targets, nullptr, 0, scale, du, dE, dw_f);
}

struct DeviceHeadWeights::Impl {
  Context& ctx;
  bool bf16;
  int64_t V, D;
  float* embed = nullptr;  // (V, D) f32: the lookup's rows
  void* head = nullptr;    // (V, D) in the storage type: the head's GEMM operand
  float* w_f = nullptr;    // (D)
  size_t head_bytes = 0;
  bool head_is_embed = false;  // tied, f32: one table
};

DeviceHeadWeights::DeviceHeadWeights(int device, bool bf16_storage, int64_t V, int64_t D,
                                     const float* embed, const float* head, const float* w_f)
    : impl_(new Impl{Context::Get(device), bf16_storage, V, D}) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = m.ctx.stream();
  m.embed = static_cast<float*>(m.ctx.Alloc(V * D * sizeof(float)));
  m.ctx.Upload(m.embed, embed, V * D * sizeof(float));
  m.w_f = static_cast<float*>(m.ctx.Alloc(D * sizeof(float)));
  m.ctx.Upload(m.w_f, w_f, D * sizeof(float));
  m.head_is_embed = head == embed && !bf16_storage;
  if (m.head_is_embed) {
    m.head = m.embed;
  } else {
    // An untied head, or the bf16 operand of a tied one: f32 up (through the workspace when
    // converted), then the storage type.
    m.head_bytes = V * D * (bf16_storage ? sizeof(bf16) : sizeof(float));
    m.head = m.ctx.Alloc(m.head_bytes);
    if (!bf16_storage) {
      m.ctx.Upload(m.head, head, m.head_bytes);
    } else if (head == embed) {
      Convert<bf16>(s, m.embed, V * D, static_cast<bf16*>(m.head));
    } else {
      float* staged = reinterpret_cast<float*>(m.ctx.Workspace(V * D * sizeof(float)));
      m.ctx.Upload(staged, head, V * D * sizeof(float));
      Convert<bf16>(s, staged, V * D, static_cast<bf16*>(m.head));
    }
  }
  m.ctx.Sync();  // the host's tables may go once this returns
}

DeviceHeadWeights::~DeviceHeadWeights() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  m.ctx.Sync();
  m.ctx.Free(m.embed, m.V * m.D * sizeof(float));
  m.ctx.Free(m.w_f, m.D * sizeof(float));
  if (!m.head_is_embed) m.ctx.Free(m.head, m.head_bytes);
  delete impl_;
}

void DeviceHeadWeights::Gather(const uint32_t* ids, int64_t n, float* rows) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  GatherRows(m.ctx.stream(), m.embed, ids, n, m.D, rows);
}

double DeviceHeadWeights::ForwardBackward(int64_t M, float eps, const float* u,
                                          const uint32_t* next_ids, int64_t valid, float scale,
                                          float* du, float* dE, float* dw_f,
                                          float* dE_nonfinite) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  if (m.bf16) {
    return Head<bf16>(m.ctx, M, m.D, m.V, eps, nullptr, nullptr,
                      {static_cast<const bf16*>(m.head), m.w_f}, u, nullptr, next_ids, valid,
                      scale, du, dE, dw_f, dE_nonfinite);
  }
  return Head<float>(m.ctx, M, m.D, m.V, eps, nullptr, nullptr,
                     {static_cast<const float*>(m.head), m.w_f}, u, nullptr, next_ids, valid,
                     scale, du, dE, dw_f, dE_nonfinite);
}

double DeviceHeadWeights::Loss(int64_t M, float eps, const float* u, const uint32_t* next_ids,
                               int64_t valid) {
  return ForwardBackward(M, eps, u, next_ids, valid, 0.0f, nullptr, nullptr, nullptr, nullptr);
}

void DeviceHeadWeights::LookupBackward(const uint32_t* ids, int64_t n, const float* g,
                                       float* dE) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  ScatterAddRows(m.ctx.stream(), g, ids, n, m.D, dE);
}

int DeviceCount(std::string* error) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (error) *error = cudaGetErrorString(err);
    if (err == cudaErrorInsufficientDriver && error) {
      // The most common failure on a fleet: a driver older than the CUDA the binary was built
      // with. Say which versions, and what to do.
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      const std::string rt = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
      *error = driver == 0
                   ? "no NVIDIA driver is installed (this adjsh uses the CUDA " + rt +
                         " runtime)"
                   : "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                         std::to_string(driver % 1000 / 10) + ", older than this adjsh's CUDA " +
                         rt + " runtime: update the driver (CUDA 12 needs 525.60.13 or later, "
                         "CUDA 13 580 or later), or build the worker for the CUDA the driver "
                         "supports (docker/Dockerfile.worker --build-arg CUDA_MAJOR=M "
                         "--build-arg CUDA_MINOR=N)";
    }
    cudaGetLastError();  // clear the sticky error state for later calls
    return 0;
  }
  if (count == 0 && error) *error = "no CUDA device";
  return count;
}

std::string DeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "unknown";
  return prop.name;
}

DeviceMemory MemoryOf(int device) {
  Context& ctx = Context::Get(device);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  return {ctx.held_bytes(), ctx.peak_bytes()};
}

void ResetPeak(int device) {
  Context& ctx = Context::Get(device);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ctx.ResetPeak();
}

}  // namespace adjsh::cuda
