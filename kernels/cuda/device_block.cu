// DeviceBlock: one layer's chunk forward, summaries and exact backward on the GPU. Projections are cuBLAS
// GEMMs (f32 accumulation); the scan with everything token-local around it is fused
// (scan.h); the conv and the norm are ops.h. A call's buffers are carved from the device
// workspace, sized by the chunk (halo + len rows), never by the sequence. Host data crosses
// through the block's pinned staging buffer (page-locked, so the copies are true DMA
// transfers, kept and grown across calls, freed with the block); the layer's gradient is
// accumulated on the device (the caller's accumulator goes up, the call's gradient is added to
// it there, the sum comes back once), in the order the host add had: grad = grad + this call's.
// A resident block (device_block.h) reads and writes the span's rows, states and adjoints where
// they are, queues its kernels and returns: no copies, no sync.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_block.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/scan.h"

namespace adjsh::cuda {
namespace {

// The layer's tensors in LayerTensors order with their element counts.
template <typename P>
std::vector<P*> Members(const LayerTensors<P>& t) {
  return {t.norm, t.in_proj, t.conv_w, t.conv_b, t.x_proj,
          t.dt_w, t.dt_b,    t.A_log,  t.Dskip,  t.out_proj};
}
std::vector<int64_t> Sizes(const BlockShape& s) {
  const int64_t Q = s.R + 2 * s.N;
  return {s.D, 2 * s.Di * s.D, s.Di * s.W, s.Di, Q * s.Di, s.Di * s.R, s.Di, s.Di * s.N,
          s.Di, s.D * s.Di};
}

// Values in one layer's gradient (its tensors in LayerTensors order).
int64_t GradValues(const BlockShape& s) {
  int64_t n = 0;
  for (int64_t v : Sizes(s)) n += v;
  return n;
}


}  // namespace

// A layer's weights on the device.
struct Weights {
  // f32 on the device: norm, conv_w, conv_b, dt_b, A = -exp(A_log), Dskip.
  float *norm, *conv_w, *conv_b, *dt_b, *A, *Dskip;
  // In storage type S: the GEMM operands.
  void *in_proj, *x_proj, *dt_w, *out_proj;
};

struct DeviceBlock::Impl {
  Context& ctx;
  bool bf16;
  BlockShape s;
  bool resident;
  Weights w{};
  void* mem = nullptr;
  size_t mem_bytes = 0;
  // Pinned host staging, under ctx's mutex; grown (never shrunk) by Staging.
  char* pinned = nullptr;
  size_t pinned_bytes = 0;
  // The gradient accumulators on the device, one per host gradient a task's Backward calls add
  // into (keyed by its first tensor), until FinishBackward brings it down: a task's chunks add
  // there instead of moving the whole layer gradient both ways per chunk (under ctx's mutex).
  std::map<const float*, float*> acc;

  // At least `bytes` of pinned host memory. Every call that stages ends with the stream
  // synchronised (a resident call stages nothing), so no copy is in flight when it is replaced.
  char* Staging(size_t bytes) {
    if (bytes <= pinned_bytes) return pinned;
    if (pinned) ADJSH_CUDA_CHECK(cudaFreeHost(pinned));
    pinned = nullptr;
    pinned_bytes = 0;
    ADJSH_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes,
                                   cudaHostAllocDefault));
    pinned_bytes = bytes;
    return pinned;
  }
  // Lays host buffers out in the staging buffer, as CarveWorkspace does on the device.
  template <typename Layout>
  void CarveStaging(Layout&& layout) {
    Carver sizing(nullptr);
    layout(sizing);
    Carver real(Staging(sizing.used()));
    layout(real);
  }

  Impl(int device, bool bf16_storage, const BlockShape& shape, bool resident_rows)
      : ctx(Context::Get(device)), bf16(bf16_storage), s(shape), resident(resident_rows) {}

  template <typename S>
  void Forward(const float* u, int64_t halo, int64_t len, const float* h0, float* u_next,
               float* h_end);
  // g nullptr: the forward summary (state = h_local); else the adjoint one (state = m); dt_total
  // = S. Resident: folded into state and dt_total (null: the adjoint's) instead.
  template <typename S>
  void Summary(const float* u, int64_t halo, int64_t len, const float* g, float* state,
               float* dt_total);
  template <typename S>
  void Backward(const float* u, int64_t halo, int64_t len, const float* g, const float* h0,
                const float* mu, const LayerTensors<float>& grad, float* du, float* du_halo,
                float* mu_out, bool defer_grad, float* sum);
};

DeviceBlock::DeviceBlock(int device, bool bf16_storage, const BlockShape& shape,
                         const LayerTensors<const float>& src, bool resident)
    : impl_(std::make_unique<Impl>(device, bf16_storage, shape, resident)) {
  Impl& m = *impl_;
  const int64_t D = shape.D, Di = shape.Di, N = shape.N, Q = shape.R + 2 * shape.N;
  std::vector<float> A(Di * N);
  for (int64_t k = 0; k < Di * N; ++k) A[k] = -std::exp(src.A_log[k]);
  // norm, conv_w, conv_b, dt_b, A, Dskip in f32; in_proj, x_proj, dt_w, out_proj in S.
  struct Piece {
    const float* data;
    int64_t count;
    bool gemm;
  };
  const Piece pieces[10] = {{src.norm, D, false},          {src.conv_w, Di * shape.W, false},
                            {src.conv_b, Di, false},       {src.dt_b, Di, false},
                            {A.data(), Di * N, false},     {src.Dskip, Di, false},
                            {src.in_proj, 2 * Di * D, true}, {src.x_proj, Q * Di, true},
                            {src.dt_w, Di * shape.R, true}, {src.out_proj, D * Di, true}};
  const size_t gemm_size = bf16_storage ? sizeof(bf16) : sizeof(float);
  size_t offsets[10], total = 0;
  for (int q = 0; q < 10; ++q) {
    offsets[q] = total;
    const size_t bytes = static_cast<size_t>(pieces[q].count) *
                         (pieces[q].gemm ? gemm_size : sizeof(float));
    total += (bytes + 255) / 256 * 256;
  }
  // One host staging buffer laid out like the device allocation.
  std::vector<char> host(total);
  for (int q = 0; q < 10; ++q) {
    char* dst = host.data() + offsets[q];
    if (pieces[q].gemm && bf16_storage) {
      for (int64_t k = 0; k < pieces[q].count; ++k) {
        const bf16 v = __float2bfloat16_rn(pieces[q].data[k]);
        std::memcpy(dst + k * sizeof(bf16), &v, sizeof(bf16));
      }
    } else {
      std::memcpy(dst, pieces[q].data, pieces[q].count * sizeof(float));
    }
  }
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  m.mem_bytes = total;
  m.mem = m.ctx.Alloc(total);
  m.ctx.Upload(m.mem, host.data(), total);
  m.ctx.Sync();
  char* base = static_cast<char*>(m.mem);
  auto f = [&](int q) { return reinterpret_cast<float*>(base + offsets[q]); };
  m.w = {f(0), f(1), f(2), f(3), f(4), f(5),
         base + offsets[6], base + offsets[7], base + offsets[8], base + offsets[9]};
}

DeviceBlock::~DeviceBlock() {
  std::lock_guard<std::mutex> lock(impl_->ctx.mutex());
  impl_->ctx.Sync();
  const size_t acc_bytes = GradValues(impl_->s) * sizeof(float);
  for (const auto& [key, buffer] : impl_->acc) impl_->ctx.Free(buffer, acc_bytes);
  impl_->ctx.Free(impl_->mem, impl_->mem_bytes);
  if (impl_->pinned) ADJSH_CUDA_CHECK(cudaFreeHost(impl_->pinned));
}

void DeviceBlock::Forward(const float* u, int64_t halo, int64_t len, const float* h0,
                          float* u_next, float* h_end) {
  if (impl_->bf16) return impl_->Forward<bf16>(u, halo, len, h0, u_next, h_end);
  impl_->Forward<float>(u, halo, len, h0, u_next, h_end);
}

void DeviceBlock::LocalSummary(const float* u, int64_t halo, int64_t len, float* h_local,
                               float* S) {
  ADJSH_CHECK(!impl_->resident, "LocalSummary of a resident block (FoldLocalSummary)");
  if (impl_->bf16) return impl_->Summary<bf16>(u, halo, len, nullptr, h_local, S);
  impl_->Summary<float>(u, halo, len, nullptr, h_local, S);
}

void DeviceBlock::AdjointSummary(const float* u, int64_t halo, int64_t len, const float* g,
                                 float* m, float* S) {
  ADJSH_CHECK(!impl_->resident,
                        "AdjointSummary of a resident block (FoldAdjointSummary)");
  if (impl_->bf16) return impl_->Summary<bf16>(u, halo, len, g, m, S);
  impl_->Summary<float>(u, halo, len, g, m, S);
}

void DeviceBlock::FoldLocalSummary(const float* u, int64_t halo, int64_t len, float* state,
                                   float* sigma) {
  ADJSH_CHECK(impl_->resident, "FoldLocalSummary of a block of host rows");
  if (impl_->bf16) return impl_->Summary<bf16>(u, halo, len, nullptr, state, sigma);
  impl_->Summary<float>(u, halo, len, nullptr, state, sigma);
}

void DeviceBlock::FoldAdjointSummary(const float* u, int64_t halo, int64_t len, const float* g,
                                     float* carry) {
  ADJSH_CHECK(impl_->resident, "FoldAdjointSummary of a block of host rows");
  if (impl_->bf16) return impl_->Summary<bf16>(u, halo, len, g, carry, nullptr);
  impl_->Summary<float>(u, halo, len, g, carry, nullptr);
}

void DeviceBlock::Backward(const float* u, int64_t halo, int64_t len, const float* g,
                           const float* h0, const float* mu, const LayerTensors<float>& grad,
                           float* du, float* du_halo, float* mu_out, bool defer_grad,
                           float* sum) {
  ADJSH_CHECK(impl_->resident == (sum != nullptr),
              "a resident block's backward adds into a device sum, only it");
  if (impl_->bf16) {
    return impl_->Backward<bf16>(u, halo, len, g, h0, mu, grad, du, du_halo, mu_out, defer_grad,
                                 sum);
  }
  impl_->Backward<float>(u, halo, len, g, h0, mu, grad, du, du_halo, mu_out, defer_grad, sum);
}

int64_t DeviceBlock::GradSize() const { return GradValues(impl_->s); }

// The activations both directions recompute from u: n, r, xz, (cpre), xc, dbc, dtpre.
template <typename S>
struct Acts {
  float* u;
  S *n, *xz, *cpre, *xc, *dbc, *dtpre;
  float* r;
  // resident_u: u is the span's rows themselves (set by the caller), not a copy here.
  void Take(Carver& c, const BlockShape& s, int64_t P, int64_t M, bool keep_cpre,
            bool resident_u) {
    u = resident_u ? nullptr : c.Take<float>(P * s.D);
    n = c.Take<S>(P * s.D);
    r = c.Take<float>(P);
    xz = c.Take<S>(P * 2 * s.Di);
    cpre = keep_cpre ? c.Take<S>(M * s.Di) : nullptr;
    xc = c.Take<S>(M * s.Di);
    dbc = c.Take<S>(M * (s.R + 2 * s.N));
    dtpre = c.Take<S>(M * s.Di);
  }
};

template <typename S>
static void Recompute(Context& ctx, const BlockShape& s, const Weights& w, int64_t halo,
                      int64_t M, Acts<S>& a) {
  const int64_t P = halo + M, D = s.D, Di = s.Di, Q = s.R + 2 * s.N;
  const cudaDataType_t st = DataType<S>();
  RmsNormForward<S>(ctx.stream(), a.u, P, D, w.norm, s.eps, a.n, a.r);
  Gemm(ctx, false, true, P, 2 * Di, D, 1, a.n, st, D, w.in_proj, st, D, 0, a.xz, st, 2 * Di);
  ConvSiluForward<S>(ctx.stream(), a.xz, halo, M, Di, s.W, w.conv_w, w.conv_b, a.cpre, a.xc);
  Gemm(ctx, false, true, M, Q, Di, 1, a.xc, st, Di, w.x_proj, st, Di, 0, a.dbc, st, Q);
  Gemm(ctx, false, true, M, Di, s.R, 1, a.dbc, st, Q, w.dt_w, st, s.R, 0, a.dtpre, st, Di);
}

template <typename S>
static ScanArgs<S> ScanView(const BlockShape& s, const Weights& w, const Acts<S>& a, int64_t halo,
                            int64_t len) {
  ScanArgs<S> sa;
  sa.len = len, sa.halo = halo, sa.Di = s.Di, sa.N = s.N, sa.R = s.R;
  sa.dtpre = a.dtpre, sa.dt_b = w.dt_b, sa.xc = a.xc, sa.dbc = a.dbc, sa.xz = a.xz;
  sa.A = w.A, sa.Dskip = w.Dskip;
  return sa;
}

template <typename S>
void DeviceBlock::Impl::Forward(const float* u, int64_t halo, int64_t len, const float* h0,
                                float* u_next, float* h_end) {
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(ctx.device()));
  const int64_t P = halo + len, D = s.D, Di = s.Di, DiN = s.Di * s.N;
  Acts<S> a;
  S* o = nullptr;
  float *out = nullptr, *h0_d = nullptr, *hend_d = nullptr, *scratch = nullptr;
  CarveWorkspace(ctx, [&](Carver& c) {
    a.Take(c, s, P, len, false, resident);
    o = c.Take<S>(len * Di);
    out = resident ? nullptr : c.Take<float>(len * D);
    h0_d = c.Take<float>(DiN);
    hend_d = resident ? nullptr : c.Take<float>(DiN);
    scratch = c.Take<float>(ScanForwardScratch(len, Di, s.N));
  });
  float *u_h = nullptr, *h0_h = nullptr, *out_h = nullptr, *hend_h = nullptr;
  if (resident) {  // h0 is copied only where the state it ends in overwrites it
    a.u = const_cast<float*>(u), out = u_next, hend_d = h_end;
    if (h0 != nullptr && h0 == h_end) {
      CopyFloats(ctx.stream(), h0, DiN, h0_d);
    } else {
      h0_d = const_cast<float*>(h0);
    }
  } else {  // pinned staging: u and h0 in; u_next and h_end out
    CarveStaging([&](Carver& c) {
      u_h = c.Take<float>(P * D);
      h0_h = c.Take<float>(DiN);
      out_h = c.Take<float>(len * D);
      hend_h = c.Take<float>(DiN);
    });
    std::memcpy(u_h, u, P * D * sizeof(float));
    ctx.UploadPinned(a.u, u_h, P * D * sizeof(float));
    if (h0) {
      std::memcpy(h0_h, h0, DiN * sizeof(float));
      ctx.UploadPinned(h0_d, h0_h, DiN * sizeof(float));
    }
  }
  Recompute<S>(ctx, s, w, halo, len, a);
  ScanForward<S>(ctx.stream(), ScanView<S>(s, w, a, halo, len), h0 ? h0_d : nullptr, hend_d, o,
                 scratch);
  // u_next = u + o W_out^T (f32 output, f32 residual).
  CopyFloats(ctx.stream(), a.u + halo * D, len * D, out);
  Gemm(ctx, false, true, len, D, Di, 1, o, DataType<S>(), Di, w.out_proj, DataType<S>(), Di, 1,
       out, CUDA_R_32F, D);
  if (resident) return;
  ctx.DownloadPinned(out_h, out, len * D * sizeof(float));
  ctx.DownloadPinned(hend_h, hend_d, DiN * sizeof(float));
  ctx.Sync();
  std::memcpy(u_next, out_h, len * D * sizeof(float));
  std::memcpy(h_end, hend_h, DiN * sizeof(float));
}

template <typename S>
void DeviceBlock::Impl::Summary(const float* u, int64_t halo, int64_t len, const float* g,
                                float* state, float* dt_total) {
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(ctx.device()));
  const int64_t P = halo + len, D = s.D, Di = s.Di, DiN = s.Di * s.N;
  Acts<S> a;
  float *g_d = nullptr, *d_o = nullptr, *state_d = nullptr, *S_d = nullptr, *scratch = nullptr;
  S* g_s = nullptr;
  CarveWorkspace(ctx, [&](Carver& c) {
    a.Take(c, s, P, len, false, resident);
    if (g) {
      g_d = resident ? nullptr : c.Take<float>(len * D);
      g_s = std::is_same_v<S, float> ? nullptr : c.Take<S>(len * D);
      d_o = c.Take<float>(len * Di);
    }
    state_d = c.Take<float>(DiN);
    S_d = c.Take<float>(Di);
    scratch = c.Take<float>(ScanSummaryScratch(len, Di, s.N));
  });
  if (resident) {
    a.u = const_cast<float*>(u);
    if (g) g_d = const_cast<float*>(g);
  }
  if (g && std::is_same_v<S, float>) g_s = reinterpret_cast<S*>(g_d);
  // Pinned staging: u (and g) in; the state summary (h_local or m) and S out.
  float *u_h = nullptr, *g_h = nullptr, *state_h = nullptr, *S_h = nullptr;
  if (!resident) {
    CarveStaging([&](Carver& c) {
      u_h = c.Take<float>(P * D);
      if (g) g_h = c.Take<float>(len * D);
      state_h = c.Take<float>(DiN);
      S_h = c.Take<float>(Di);
    });
    std::memcpy(u_h, u, P * D * sizeof(float));
    ctx.UploadPinned(a.u, u_h, P * D * sizeof(float));
    if (g) {
      std::memcpy(g_h, g, len * D * sizeof(float));
      ctx.UploadPinned(g_d, g_h, len * D * sizeof(float));
    }
  }
  if (g && !std::is_same_v<S, float>) Convert<S>(ctx.stream(), g_d, len * D, g_s);
  Recompute<S>(ctx, s, w, halo, len, a);
  // dL/do = g W_out, as the backward's first step; the scan applies the gate (ybar).
  if (g) {
    Gemm(ctx, false, false, len, Di, D, 1, g_s, DataType<S>(), D, w.out_proj, DataType<S>(), Di,
         0, d_o, CUDA_R_32F, Di);
  }
  ScanSummary<S>(ctx.stream(), ScanView<S>(s, w, a, halo, len), d_o, g ? nullptr : state_d,
                 g ? state_d : nullptr, S_d, scratch);
  if (resident) {  // state = exp(A S) state + this chunk's; dt_total += S
    DecayFold(ctx.stream(), w.A, S_d, state_d, Di, s.N, state, dt_total);
    return;
  }
  ctx.DownloadPinned(state_h, state_d, DiN * sizeof(float));
  ctx.DownloadPinned(S_h, S_d, Di * sizeof(float));
  ctx.Sync();
  std::memcpy(state, state_h, DiN * sizeof(float));
  std::memcpy(dt_total, S_h, Di * sizeof(float));
}

template <typename S>
void DeviceBlock::Impl::Backward(const float* u, int64_t halo, int64_t len, const float* g,
                                 const float* h0, const float* mu,
                                 const LayerTensors<float>& grad, float* du, float* du_halo,
                                 float* mu_out, bool defer_grad, float* sum) {
  std::lock_guard<std::mutex> lock(ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(ctx.device()));
  const int64_t P = halo + len, D = s.D, Di = s.Di, N = s.N, R = s.R, Q = R + 2 * N;
  const int64_t DiN = Di * N;
  const cudaDataType_t st = DataType<S>(), f32 = CUDA_R_32F;
  const std::vector<int64_t> sizes = Sizes(s);
  int64_t grad_total = 0;
  for (int64_t n : sizes) grad_total += n;

  Acts<S> a;
  float *g_d, *d_o, *dxc, *dn, *h0_d, *mu_d, *mu_out_d, *grads, *acc_ws, *scratch, *reduce;
  S *g_s, *o, *dxz, *ddt, *ddbc;
  CarveWorkspace(ctx, [&](Carver& c) {
    a.Take(c, s, P, len, true, resident);
    g_d = resident ? nullptr : c.Take<float>(len * D);
    g_s = std::is_same_v<S, float> ? nullptr : c.Take<S>(len * D);
    d_o = c.Take<float>(len * Di);
    o = c.Take<S>(len * Di);
    dxz = c.Take<S>(P * 2 * Di);
    ddt = c.Take<S>(len * Di);
    dxc = c.Take<float>(len * Di);
    ddbc = c.Take<S>(len * Q);
    dn = c.Take<float>(P * D);
    h0_d = resident ? nullptr : c.Take<float>(DiN);
    mu_d = resident ? nullptr : c.Take<float>(DiN);
    mu_out_d = c.Take<float>(DiN);
    grads = c.Take<float>(grad_total);
    acc_ws = c.Take<float>(defer_grad || resident ? 0 : grad_total);
    scratch = c.Take<float>(ScanBackwardScratch(len, Di, N));
    // The conv's and the norm's weight-gradient partials, one after the other on the stream.
    reduce = c.Take<float>(std::max(ConvSiluBackwardScratch(len, Di, s.W),
                                    RmsNormBackwardScratch(P, D)));
  });
  // The sum: resident, the caller's on the device; deferred, the task's accumulator on the
  // device, the caller's gradient uploaded at its first call only (FinishBackward brings the sum
  // down); else in the workspace, the caller's gradient up and the sum down in this call.
  const std::vector<float*> dst = Members(grad);
  float* acc_d = resident ? sum : acc_ws;
  bool first = true;
  if (defer_grad && !resident) {
    auto open = acc.find(grad.norm);
    first = open == acc.end();
    if (first) {
      open = acc.emplace(grad.norm, static_cast<float*>(ctx.Alloc(grad_total * sizeof(float))))
                 .first;
    }
    acc_d = open->second;
  }
  if (resident) {
    a.u = const_cast<float*>(u), g_d = const_cast<float*>(g);
    h0_d = const_cast<float*>(h0), mu_d = const_cast<float*>(mu);
  }
  if (std::is_same_v<S, float>) g_s = reinterpret_cast<S*>(g_d);
  // Pinned staging: u, g, h0, mu in; du_halo and du (as dn: halo + len rows), mu_out out; the
  // caller's gradient in and, not deferred, the sum out (one buffer: the stream orders the
  // upload before the download).
  float *u_h = nullptr, *g_h = nullptr, *h0_h = nullptr, *mu_h = nullptr, *du_h = nullptr,
        *mu_out_h = nullptr, *grad_h = nullptr;
  if (!resident) CarveStaging([&](Carver& c) {
    u_h = c.Take<float>(P * D);
    g_h = c.Take<float>(len * D);
    h0_h = c.Take<float>(DiN);
    mu_h = c.Take<float>(DiN);
    du_h = c.Take<float>(P * D);
    mu_out_h = c.Take<float>(DiN);
    grad_h = c.Take<float>(first ? grad_total : 0);
  });
  // The gradient block in LayerTensors order.
  LayerTensors<float> gd;
  {
    float* p = grads;
    float** slots[] = {&gd.norm, &gd.in_proj, &gd.conv_w, &gd.conv_b, &gd.x_proj,
                       &gd.dt_w, &gd.dt_b,    &gd.A_log,  &gd.Dskip,  &gd.out_proj};
    for (size_t q = 0; q < sizes.size(); ++q) *slots[q] = p, p += sizes[q];
  }
  cudaStream_t stream = ctx.stream();
  if (!resident) {
    std::memcpy(u_h, u, P * D * sizeof(float));
    std::memcpy(g_h, g, len * D * sizeof(float));
    std::memcpy(h0_h, h0, DiN * sizeof(float));
    if (mu) std::memcpy(mu_h, mu, DiN * sizeof(float));
    if (first) {
      float* p = grad_h;
      for (size_t q = 0; q < sizes.size(); ++q) {
        std::memcpy(p, dst[q], sizes[q] * sizeof(float));
        p += sizes[q];
      }
    }
    ctx.UploadPinned(a.u, u_h, P * D * sizeof(float));
    ctx.UploadPinned(g_d, g_h, len * D * sizeof(float));
    ctx.UploadPinned(h0_d, h0_h, DiN * sizeof(float));
    if (mu) ctx.UploadPinned(mu_d, mu_h, DiN * sizeof(float));
    if (first) ctx.UploadPinned(acc_d, grad_h, grad_total * sizeof(float));
  }
  if (!std::is_same_v<S, float>) Convert<S>(stream, g_d, len * D, g_s);
  Recompute<S>(ctx, s, w, halo, len, a);

  // dL/do = g W_out; then the fused scan backward (gate, D, softplus, Delta, B, C, A, x').
  Gemm(ctx, false, false, len, Di, D, 1, g_s, st, D, w.out_proj, st, Di, 0, d_o, f32, Di);
  ADJSH_CUDA_CHECK(cudaMemsetAsync(dxz, 0, P * 2 * Di * sizeof(S), stream));
  ScanBackwardArgs<S> sb;
  sb.d_o = d_o, sb.h0 = h0_d, sb.mu = mu ? mu_d : nullptr;
  sb.o = o, sb.dxz = dxz, sb.ddt = ddt, sb.dxc = dxc, sb.ddbc = ddbc;
  sb.dA_log = gd.A_log, sb.dD = gd.Dskip, sb.ddt_b = gd.dt_b;
  sb.mu_out = mu_out ? mu_out_d : nullptr, sb.scratch = scratch;
  ScanBackward<S>(stream, ScanView<S>(s, w, a, halo, len), sb);

  // out_proj: dW_out = g^T o.
  Gemm(ctx, true, false, D, Di, len, 1, g_s, st, D, o, st, Di, 0, gd.out_proj, f32, Di);
  // dt_proj: d columns of ddbc = ddt W_dt; dW_dt = ddt^T d.
  Gemm(ctx, false, false, len, R, Di, 1, ddt, st, Di, w.dt_w, st, R, 0, ddbc, st, Q);
  Gemm(ctx, true, false, Di, R, len, 1, ddt, st, Di, a.dbc, st, Q, 0, gd.dt_w, f32, R);
  // x_proj: dW_x = ddbc^T x'; dx' += ddbc W_x.
  Gemm(ctx, true, false, Q, Di, len, 1, ddbc, st, Q, a.xc, st, Di, 0, gd.x_proj, f32, Di);
  Gemm(ctx, false, false, len, Di, Q, 1, ddbc, st, Q, w.x_proj, st, Di, 1, dxc, f32, Di);
  // silu and the causal conv: dL/dx into the x columns of dxz, halo rows included.
  ConvSiluBackward<S>(stream, a.xz, a.cpre, halo, len, Di, s.W, w.conv_w, dxc, dxz, gd.conv_w,
                      gd.conv_b, reduce);
  // in_proj: dW_in = dxz^T n; dn = dxz W_in; RMSNorm back to u.
  Gemm(ctx, true, false, 2 * Di, D, P, 1, dxz, st, 2 * Di, a.n, st, D, 0, gd.in_proj, f32, D);
  Gemm(ctx, false, false, P, D, 2 * Di, 1, dxz, st, 2 * Di, w.in_proj, st, D, 0, dn, f32, D);
  RmsNormBackward(stream, a.u, P, D, w.norm, a.r, dn, gd.norm, dn, reduce);
  Add(stream, g_d, dn + halo * D, len * D, dn + halo * D);  // du = g + the path through the block
  // The accumulation: acc = (the task's sum so far) + (this call's), one f32 add per entry, as
  // the host's grad += did when every call moved the sum both ways.
  Add(stream, acc_d, grads, grad_total, acc_d);

  if (resident) {  // du, du_halo and mu_out where the span keeps them
    auto d2d = [&](float* to, const float* from, int64_t n) {
      CopyFloats(stream, from, n, to);
    };
    d2d(du_halo, dn, halo * D);
    d2d(du, dn + halo * D, len * D);
    if (mu_out) d2d(mu_out, mu_out_d, DiN);
    return;
  }
  ctx.DownloadPinned(du_h, dn, P * D * sizeof(float));
  if (mu_out) ctx.DownloadPinned(mu_out_h, mu_out_d, DiN * sizeof(float));
  if (!defer_grad) ctx.DownloadPinned(grad_h, acc_d, grad_total * sizeof(float));
  ctx.Sync();
  if (halo > 0) std::memcpy(du_halo, du_h, halo * D * sizeof(float));
  std::memcpy(du, du_h + halo * D, len * D * sizeof(float));
  if (mu_out) std::memcpy(mu_out, mu_out_h, DiN * sizeof(float));
  if (defer_grad) return;
  const float* src = grad_h;
  for (size_t q = 0; q < sizes.size(); ++q) {
    std::memcpy(dst[q], src, sizes[q] * sizeof(float));
    src += sizes[q];
  }
}

void DeviceBlock::FinishBackward(const LayerTensors<float>& grad) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  auto open = m.acc.find(grad.norm);
  if (open == m.acc.end()) return;  // no Backward call added into it
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const std::vector<int64_t> sizes = Sizes(m.s);
  const int64_t total = GradValues(m.s);
  const std::vector<float*> dst = Members(grad);
  float* grad_h = nullptr;
  m.CarveStaging([&](Carver& c) { grad_h = c.Take<float>(total); });
  m.ctx.DownloadPinned(grad_h, open->second, total * sizeof(float));
  m.ctx.Sync();
  m.ctx.Free(open->second, total * sizeof(float));
  m.acc.erase(open);
  const float* src = grad_h;
  for (size_t q = 0; q < sizes.size(); ++q) {
    std::memcpy(dst[q], src, sizes[q] * sizeof(float));
    src += sizes[q];
  }
}

}  // namespace adjsh::cuda
