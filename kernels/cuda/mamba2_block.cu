// DeviceMamba2Block (mamba2_block.h): one Mamba-2 layer's chunk forward, adjoint and exact
// backward on the GPU, f32. The projections are cuBLAS GEMMs (context.h Gemm, f32 sums); the
// pre-norm is ops.h's RMSNorm; the conv, dt, scan and gated norm are mamba2_kernels.cuh. A
// call's buffers are carved from the device workspace, sized by the chunk, and host data moves
// with the context's Upload / Download (cudaMemcpyAsync on the stream; each call ends
// synchronised, so the host buffers may be reused at once). The layer's gradient is accumulated
// on the device as device_block.cu does: this call's gradient (written into a block of its own)
// is added to the caller's accumulator there, which goes up and comes back each call, or
// (deferred) stays on the device for the task's calls until FinishBackward. A resident block
// reads and writes the span's rows, states and halos where they are and adds its gradient into
// the caller's device sum: no copies but within the device, no sync.
#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "common/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mamba2_block.h"
#include "kernels/cuda/mamba2_kernels.cuh"
#include "kernels/cuda/ops.h"

namespace adjsh::cuda {
namespace mamba2_internal {

// The layer's tensors in Mamba2Tensors order, and their element counts.
template <typename T>
std::vector<T*> TensorList(const Mamba2Tensors<T>& t) {
  return {t.norm, t.in_proj, t.conv_w, t.conv_b, t.dt_bias, t.A_log, t.Dskip, t.gnorm,
          t.out_proj};
}
inline std::vector<int64_t> TensorSizes(const Mamba2Shape& s) {
  return {s.D, s.Dp() * s.D, s.Cc() * s.W, s.Cc(), s.H, s.H, s.H, s.Di, s.D * s.Di};
}
// Consecutive pieces of `base` in Mamba2Tensors order.
inline Mamba2Tensors<float> SplitTensors(float* base, const Mamba2Shape& s) {
  Mamba2Tensors<float> t;
  float** slots[] = {&t.norm,    &t.in_proj, &t.conv_w, &t.conv_b,  &t.dt_bias,
                     &t.A_log,   &t.Dskip,   &t.gnorm,  &t.out_proj};
  const std::vector<int64_t> sizes = TensorSizes(s);
  for (size_t q = 0; q < sizes.size(); ++q) *slots[q] = base, base += sizes[q];
  return t;
}

// The forward's activations of a chunk of L rows after hb halo rows (R = hb + L), device
// buffers as kernels/cpu/mamba2_layer.h's Mamba2ChunkActs, plus the scan's working state S and its
// scratch; y, gv, r2, n only when the gated norm runs, ckpt only for the backward.
struct Mamba2Acts {
  int64_t hb, L, R;
  float *u, *xn, *r1, *zx, *pre, *xbc, *dt, *S, *prod;
  float *y = nullptr, *gv = nullptr, *r2 = nullptr, *n = nullptr, *ckpt = nullptr;
  void Take(Carver& c, const Mamba2Shape& s, bool gated, bool keep_ckpt) {
    const int64_t PN = s.P * s.N, Cc = s.Cc();
    u = c.Take<float>(R * s.D);
    xn = c.Take<float>(R * s.D);
    r1 = c.Take<float>(R);
    zx = c.Take<float>(R * s.Dp());
    pre = c.Take<float>(L * Cc);
    xbc = c.Take<float>(L * Cc);
    dt = c.Take<float>(L * s.H);
    S = c.Take<float>(s.H * PN);
    prod = c.Take<float>(s.H * PN);
    if (gated) {
      y = c.Take<float>(L * s.Di);
      gv = c.Take<float>(L * s.Di);
      r2 = c.Take<float>(L * s.G);
      n = c.Take<float>(L * s.Di);
    }
    if (keep_ckpt) ckpt = c.Take<float>(s.H * ((L + kScanBlock - 1) / kScanBlock) * PN);
  }
};

inline Mamba2Acts ActsFor(const Mamba2Shape& s, int64_t t0, int64_t t1) {
  Mamba2Acts a;
  a.hb = std::min(s.W - 1, t0), a.L = t1 - t0, a.R = a.hb + a.L;
  return a;
}

}  // namespace mamba2_internal

using namespace mamba2_internal;

// The layer's weights on the device, f32; A = -exp(A_log) in place of A_log.
struct DeviceMamba2Block::Impl {
  Context& ctx;
  Mamba2Shape s;
  bool resident;
  Mamba2Tensors<float> w;  // w.A_log holds A
  void* mem = nullptr;
  size_t mem_bytes = 0;

  Impl(int device, const Mamba2Shape& shape, bool resident_rows)
      : ctx(Context::Get(device)), s(shape), resident(resident_rows) {}
  // n floats from src to dst: up from the host, or within the device for a resident block.
  void In(float* dst, const float* src, int64_t n) {
    if (!resident) return ctx.Upload(dst, src, n * sizeof(float));
    CopyFloats(ctx.stream(), src, n, dst);
  }
  // n floats from the device to dst: down to the host (the call syncs before returning), or
  // within the device.
  void Out(float* dst, const float* src, int64_t n) {
    if (!resident) return ctx.Download(dst, src, n * sizeof(float));
    In(dst, src, n);
  }

  Mamba2ScanArgs Scan(const Mamba2Acts& a) const {
    return {a.L, s.H, s.P, s.G, s.N, s.Di, s.Cc(), a.dt, a.xbc, w.A_log, w.Dskip};
  }
  // The forward from u (uploaded into a.u) and the states before t0 (in a.S): the norm,
  // in_proj, conv, dt and scan (a.S left as the states after t1 - 1), and with a.y the gated
  // norm (a.n); the states' checkpoints with a.ckpt.
  void RunForward(const Mamba2Acts& a) {
    const int64_t D = s.D, Dp = s.Dp(), Cc = s.Cc();
    RmsNormForward<float>(ctx.stream(), a.u, a.R, D, w.norm, s.eps, a.xn, a.r1);
    Gemm(ctx, false, true, a.R, Dp, D, 1, a.xn, CUDA_R_32F, D, w.in_proj, CUDA_R_32F, D, 0, a.zx,
         CUDA_R_32F, Dp);
    ADJSH_LAUNCH(ConvForwardKernel, dim3(GridFor(a.L * Cc, kThreads)), kThreads, ctx.stream(),
                 a.zx, a.hb, a.L, s.Di, Dp, Cc, s.W, w.conv_w, w.conv_b, a.pre, a.xbc);
    ADJSH_LAUNCH(DtForwardKernel, dim3(GridFor(a.L * s.H, kThreads)), kThreads, ctx.stream(),
                 a.zx, a.hb, a.L, s.H, Dp, s.Di + Cc, w.dt_bias, s.dt_clamped, s.dt_min,
                 s.dt_max, a.dt);
    ADJSH_LAUNCH(ScanForwardKernel, dim3(static_cast<unsigned>(s.H)), BlockThreadsFor(s.P * s.N),
                 ctx.stream(), Scan(a), a.S, a.y, a.prod, a.ckpt);
    if (a.y == nullptr) return;
    ADJSH_LAUNCH(GatedNormForwardKernel,
                 dim3(static_cast<unsigned>(a.L), static_cast<unsigned>(s.G)),
                 BlockThreadsFor(s.Di / s.G), ctx.stream(), a.y, a.zx, a.hb, Dp, s.Di, s.G,
                 w.gnorm, s.eps, a.gv, a.r2, a.n);
  }
  // dn (L, Di) = dout out_proj, then the gated norm back to dy (L, Di); with dzx also dz into
  // its z columns.
  void GatedBackward(const Mamba2Acts& a, const float* dout, float* dn, float* dy, float* dzx) {
    Gemm(ctx, false, false, a.L, s.Di, s.D, 1, dout, CUDA_R_32F, s.D, w.out_proj, CUDA_R_32F,
         s.Di, 0, dn, CUDA_R_32F, s.Di);
    ADJSH_LAUNCH(GatedNormBackwardKernel,
                 dim3(static_cast<unsigned>(a.L), static_cast<unsigned>(s.G)),
                 BlockThreadsFor(s.Di / s.G), ctx.stream(), dn, a.gv, a.y, a.r2, a.zx, a.hb,
                 s.Dp(), s.Di, s.G, w.gnorm, dy, dzx);
  }
  // Adds gd (this call's gradient) to the caller's accumulators for the first `count` tensors
  // of grad (in Mamba2Tensors order), one Add over their contiguous span. Not deferred: they go
  // up into acc (the workspace's), and the sums come back. Deferred: the sum stays in the
  // accumulator this block keeps on the device for grad (all its tensors uploaded at its first
  // call) until FinishBackward brings it down.
  void AccumulateGrad(float* acc, const float* gd, const Mamba2Tensors<float>& grad,
                      size_t count, bool defer, float* sum) {
    const std::vector<int64_t> sizes = TensorSizes(s);
    if (resident) {  // the caller's device sum
      int64_t span = 0;
      for (size_t q = 0; q < count; ++q) span += sizes[q];
      Add(ctx.stream(), sum, gd, span, sum);
      return;
    }
    const std::vector<float*> dst = TensorList(grad);
    size_t up = count;
    if (defer) {
      auto open = deferred.find(grad.norm);
      up = open == deferred.end() ? sizes.size() : 0;
      if (open == deferred.end()) {
        open = deferred.emplace(grad.norm,
                                static_cast<float*>(ctx.Alloc(GradTotal() * sizeof(float))))
                   .first;
      }
      acc = open->second;
    }
    int64_t off = 0, span = 0;
    for (size_t q = 0; q < sizes.size(); ++q) {
      if (q < up) ctx.Upload(acc + off, dst[q], sizes[q] * sizeof(float));
      off += sizes[q];
      if (q + 1 == count) span = off;
    }
    Add(ctx.stream(), acc, gd, span, acc);
    if (defer) return;
    off = 0;
    for (size_t q = 0; q < count; ++q) {
      ctx.Download(dst[q], acc + off, sizes[q] * sizeof(float));
      off += sizes[q];
    }
  }
  // The deferred accumulators, one per host gradient (keyed by its first tensor), under ctx's
  // mutex.
  std::map<const float*, float*> deferred;
  int64_t GradTotal() const {
    int64_t total = 0;
    for (int64_t n : TensorSizes(s)) total += n;
    return total;
  }
};

DeviceMamba2Block::DeviceMamba2Block(int device, const Mamba2Shape& shape,
                                     const Mamba2Tensors<const float>& src, bool resident)
    : impl_(std::make_unique<Impl>(device, shape, resident)) {
  Impl& m = *impl_;
  std::vector<float> A(shape.H);
  for (int64_t h = 0; h < shape.H; ++h) A[h] = -std::exp(src.A_log[h]);
  Mamba2Tensors<const float> host = src;
  host.A_log = A.data();
  const std::vector<const float*> pieces = TensorList(host);
  const std::vector<int64_t> sizes = TensorSizes(shape);
  std::vector<float> packed(m.GradTotal());
  int64_t off = 0;
  for (size_t q = 0; q < sizes.size(); ++q) {
    std::copy_n(pieces[q], sizes[q], packed.begin() + off);
    off += sizes[q];
  }
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  m.mem_bytes = packed.size() * sizeof(float);
  m.mem = m.ctx.Alloc(m.mem_bytes);
  m.ctx.Upload(m.mem, packed.data(), m.mem_bytes);
  m.ctx.Sync();
  m.w = SplitTensors(static_cast<float*>(m.mem), shape);
}

DeviceMamba2Block::~DeviceMamba2Block() {
  std::lock_guard<std::mutex> lock(impl_->ctx.mutex());
  impl_->ctx.Sync();
  for (const auto& [key, acc] : impl_->deferred)
    impl_->ctx.Free(acc, impl_->GradTotal() * sizeof(float));
  impl_->ctx.Free(impl_->mem, impl_->mem_bytes);
}

void DeviceMamba2Block::Forward(const float* u, int64_t t0, int64_t t1, float* S, float* out,
                                float* dt_sum) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const Mamba2Shape& s = m.s;
  const int64_t SN = s.H * s.P * s.N;
  Mamba2Acts a = ActsFor(s, t0, t1);
  float* out_d = nullptr;
  CarveWorkspace(m.ctx, [&](Carver& c) {
    a.Take(c, s, out != nullptr, false);
    if (out && !m.resident) out_d = c.Take<float>(a.L * s.D);
  });
  if (m.resident) {  // the rows and states where they are: S in place, out written there
    ADJSH_CHECK(dt_sum == nullptr, "a resident block folds dt sums with FoldForward");
    a.u = const_cast<float*>(u), a.S = S, out_d = out;
  } else {
    m.ctx.Upload(a.u, u, a.R * s.D * sizeof(float));
    m.ctx.Upload(a.S, S, SN * sizeof(float));
  }
  m.RunForward(a);
  if (out) {
    Gemm(m.ctx, false, true, a.L, s.D, s.Di, 1, a.n, CUDA_R_32F, s.Di, m.w.out_proj, CUDA_R_32F,
         s.Di, 0, out_d, CUDA_R_32F, s.D);
    if (!m.resident) m.ctx.Download(out, out_d, a.L * s.D * sizeof(float));
  }
  if (m.resident) return;
  m.ctx.Download(S, a.S, SN * sizeof(float));
  std::vector<float> dt;
  if (dt_sum) {
    dt.resize(a.L * s.H);
    m.ctx.Download(dt.data(), a.dt, dt.size() * sizeof(float));
  }
  m.ctx.Sync();
  for (int64_t i = 0; dt_sum && i < a.L; ++i)
    for (int64_t h = 0; h < s.H; ++h) dt_sum[h] += dt[i * s.H + h];
}

void DeviceMamba2Block::FoldForward(const float* u, int64_t t0, int64_t t1, float* S,
                                    float* sigma) {
  Impl& m = *impl_;
  ADJSH_CHECK(m.resident, "FoldForward of a block of host rows");
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const Mamba2Shape& s = m.s;
  Mamba2Acts a = ActsFor(s, t0, t1);
  CarveWorkspace(m.ctx, [&](Carver& c) { a.Take(c, s, false, false); });
  a.u = const_cast<float*>(u), a.S = S;
  m.RunForward(a);
  ADJSH_LAUNCH(DtSigmaKernel, dim3(GridFor(s.H * s.P, kThreads)), kThreads, m.ctx.stream(), a.dt,
               a.L, s.H, s.P, sigma);
}

int64_t DeviceMamba2Block::GradSize() const { return impl_->GradTotal(); }

void DeviceMamba2Block::Adjoint(const float* u, int64_t t0, int64_t t1, const float* S0,
                                const float* dout, float* carry) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const Mamba2Shape& s = m.s;
  const int64_t SN = s.H * s.P * s.N;
  Mamba2Acts a = ActsFor(s, t0, t1);
  float *dout_d, *dn, *dy, *carry_d;
  CarveWorkspace(m.ctx, [&](Carver& c) {
    a.Take(c, s, true, false);
    dout_d = c.Take<float>(a.L * s.D);
    dn = c.Take<float>(a.L * s.Di);
    dy = c.Take<float>(a.L * s.Di);
    carry_d = c.Take<float>(SN);
  });
  if (m.resident) {  // S0 copied (the recompute runs the scan on it); the rest read in place
    a.u = const_cast<float*>(u), dout_d = const_cast<float*>(dout), carry_d = carry;
  } else {
    m.ctx.Upload(a.u, u, a.R * s.D * sizeof(float));
    m.ctx.Upload(dout_d, dout, a.L * s.D * sizeof(float));
    m.ctx.Upload(carry_d, carry, SN * sizeof(float));
  }
  m.In(a.S, S0, SN);
  m.RunForward(a);
  m.GatedBackward(a, dout_d, dn, dy, nullptr);
  ADJSH_LAUNCH(ScanAdjointKernel, dim3(static_cast<unsigned>(s.H)), BlockThreadsFor(s.P * s.N),
               m.ctx.stream(), m.Scan(a), dy, carry_d);
  if (m.resident) return;
  m.ctx.Download(carry, carry_d, SN * sizeof(float));
  m.ctx.Sync();
}

void DeviceMamba2Block::Backward(const float* u, int64_t t0, int64_t t1, const float* S0,
                                 const float* dout, float* carry, float* halo,
                                 const Mamba2Tensors<float>& grad, float* du, bool defer_grad,
                                 float* sum) {
  Impl& m = *impl_;
  ADJSH_CHECK(m.resident == (sum != nullptr),
              "a resident block's backward adds into a device sum, only it");
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const Mamba2Shape& s = m.s;
  const int64_t SN = s.H * s.P * s.N, D = s.D, Di = s.Di, Dp = s.Dp(), Cc = s.Cc(), H = s.H;
  const int64_t H1 = s.W - 1, total = m.GradTotal();
  Mamba2Acts a = ActsFor(s, t0, t1);
  const int64_t L = a.L;
  float *dout_d, *dn, *dy, *dzx, *dxbc, *dBh, *dCh, *ddt, *carry_d, *states, *halo_in, *halo_out;
  float *dxn, *gbuf, *acc, *reduce;
  CarveWorkspace(m.ctx, [&](Carver& c) {
    a.Take(c, s, true, true);
    dout_d = c.Take<float>(L * D);
    dn = c.Take<float>(L * Di);
    dy = c.Take<float>(L * Di);
    dzx = c.Take<float>(L * Dp);
    dxbc = c.Take<float>(L * Cc);
    dBh = c.Take<float>(L * H * s.N);
    dCh = c.Take<float>(L * H * s.N);
    ddt = c.Take<float>(L * H);
    carry_d = c.Take<float>(SN);
    states = c.Take<float>(H * (kScanBlock + 1) * s.P * s.N);
    halo_in = c.Take<float>(H1 * Cc);
    halo_out = c.Take<float>(H1 * Cc);
    dxn = c.Take<float>(L * D);
    gbuf = c.Take<float>(total);
    // deferred: the block's own accumulator; resident: the caller's sum
    acc = c.Take<float>(defer_grad || m.resident ? 0 : total);
    reduce = c.Take<float>(RmsNormBackwardScratch(L, D));
  });
  const Mamba2Tensors<float> gd = SplitTensors(gbuf, s);
  cudaStream_t stream = m.ctx.stream();
  if (m.resident) {  // S0 and the halo copied (rewritten here); the rest read in place
    a.u = const_cast<float*>(u), dout_d = const_cast<float*>(dout), carry_d = carry;
  } else {
    m.ctx.Upload(a.u, u, a.R * D * sizeof(float));
    m.ctx.Upload(dout_d, dout, L * D * sizeof(float));
    m.ctx.Upload(carry_d, carry, SN * sizeof(float));
  }
  m.In(a.S, S0, SN);
  if (m.resident) {
    halo_in = halo;  // read by the conv's input gradient, which writes halo_out
  } else {
    m.ctx.Upload(halo_in, halo, H1 * Cc * sizeof(float));
  }
  m.RunForward(a);

  // dzx (L, Dp) is written column block by column block, never added to: z by the gated
  // norm's backward, xBC by ConvInputGradKernel, dt by DtBackwardKernel.
  // out_proj: dn = dout out_proj, dW_out = dout^T n; the gated norm back to dy and dz.
  m.GatedBackward(a, dout_d, dn, dy, dzx);
  Gemm(m.ctx, true, false, D, Di, L, 1, dout_d, CUDA_R_32F, D, a.n, CUDA_R_32F, Di, 0,
       gd.out_proj, CUDA_R_32F, Di);
  ADJSH_LAUNCH(GnormGradKernel, dim3(GridFor(Di, kThreads)), kThreads, stream, dn, a.gv, a.r2, L,
               Di, s.G, gd.gnorm);
  // The scan, its states recomputed from the forward's checkpoints; B and C summed per group.
  ADJSH_LAUNCH(ScanBackwardKernel, dim3(static_cast<unsigned>(H)), BlockThreadsFor(s.P * s.N),
               stream, m.Scan(a), dy, carry_d, a.ckpt, states, dxbc, dBh, dCh, ddt, gd.A_log,
               gd.Dskip);
  ADJSH_LAUNCH(GroupSumKernel, dim3(GridFor(L * 2 * s.G * s.N, kThreads)), kThreads, stream, dBh,
               dCh, L, H, s.G, s.N, Di, Cc, dxbc);
  // dt: softplus and the clamp back to dt_raw (dzx's dt columns); dt_bias sums them.
  ADJSH_LAUNCH(DtBackwardKernel, dim3(GridFor(L * H, kThreads)), kThreads, stream, ddt, a.zx,
               a.hb, L, H, Dp, Di + Cc, m.w.dt_bias, s.dt_clamped, s.dt_min, s.dt_max, dzx);
  ADJSH_LAUNCH(ColumnSumKernel, dim3(GridFor(H, kThreads)), kThreads, stream, dzx + Di + Cc, L,
               H, Dp, gd.dt_bias);
  // silu and the conv: its weights, and its input's gradient into dzx's xBC columns and the
  // outgoing halo (the incoming halo's rows added on the way).
  ADJSH_LAUNCH(SiluBackwardKernel, dim3(GridFor(L * Cc, kThreads)), kThreads, stream, a.pre,
               L * Cc, dxbc);
  ADJSH_LAUNCH(ColumnSumKernel, dim3(GridFor(Cc, kThreads)), kThreads, stream, dxbc, L, Cc, Cc,
               gd.conv_b);
  ADJSH_LAUNCH(ConvWeightGradKernel, dim3(GridFor(Cc * s.W, kThreads)), kThreads, stream, dxbc,
               a.zx, a.hb, L, Di, Dp, Cc, s.W, gd.conv_w);
  ADJSH_LAUNCH(ConvInputGradKernel, dim3(GridFor((H1 + L) * Cc, kThreads)), kThreads, stream,
               dxbc, halo_in, t0, t1, Di, Dp, Cc, s.W, m.w.conv_w, dzx, halo_out);
  // in_proj over the chunk's own rows, then the pre-norm; du = dout + the mixer's part.
  const float* xn = a.xn + a.hb * D;
  Gemm(m.ctx, true, false, Dp, D, L, 1, dzx, CUDA_R_32F, Dp, xn, CUDA_R_32F, D, 0, gd.in_proj,
       CUDA_R_32F, D);
  Gemm(m.ctx, false, false, L, D, Dp, 1, dzx, CUDA_R_32F, Dp, m.w.in_proj, CUDA_R_32F, D, 0, dxn,
       CUDA_R_32F, D);
  RmsNormBackward(stream, a.u + a.hb * D, L, D, m.w.norm, a.r1 + a.hb, dxn, gd.norm, dxn, reduce);
  Add(stream, dout_d, dxn, L * D, dxn);

  m.AccumulateGrad(acc, gbuf, grad, 9, defer_grad, sum);
  m.Out(du, dxn, L * D);
  m.Out(halo, halo_out, H1 * Cc);
  if (m.resident) return;
  m.ctx.Download(carry, carry_d, SN * sizeof(float));
  m.ctx.Sync();
}

void DeviceMamba2Block::HaloBackward(const float* u, int64_t t0, const float* halo,
                                     const Mamba2Tensors<float>& grad, float* du,
                                     bool defer_grad, float* sum) {
  Impl& m = *impl_;
  ADJSH_CHECK(m.resident == (sum != nullptr),
              "a resident block's backward adds into a device sum, only it");
  const Mamba2Shape& s = m.s;
  const int64_t n = std::min(s.W - 1, t0), skip = (s.W - 1) - n;  // halo rows before row 0
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const int64_t D = s.D, Dp = s.Dp(), Cc = s.Cc(), total = m.GradTotal();
  float *u_d, *xn, *r1, *halo_d, *dzx, *dxn, *du_d, *gbuf, *acc, *reduce;
  CarveWorkspace(m.ctx, [&](Carver& c) {
    u_d = c.Take<float>(n * D);
    xn = c.Take<float>(n * D);
    r1 = c.Take<float>(n);
    halo_d = c.Take<float>((s.W - 1) * Cc);
    dzx = c.Take<float>(n * Dp);
    dxn = c.Take<float>(n * D);
    du_d = c.Take<float>(n * D);
    gbuf = c.Take<float>(total);
    acc = c.Take<float>(defer_grad || m.resident ? 0 : total);
    reduce = c.Take<float>(RmsNormBackwardScratch(n, D));
  });
  const Mamba2Tensors<float> gd = SplitTensors(gbuf, s);
  cudaStream_t stream = m.ctx.stream();
  if (m.resident) {  // read and added to where they are
    u_d = const_cast<float*>(u), halo_d = const_cast<float*>(halo), du_d = du;
  } else {
    m.ctx.Upload(u_d, u, n * D * sizeof(float));
    m.ctx.Upload(halo_d, halo, (s.W - 1) * Cc * sizeof(float));
    m.ctx.Upload(du_d, du, n * D * sizeof(float));
  }
  RmsNormForward<float>(stream, u_d, n, D, m.w.norm, s.eps, xn, r1);
  ADJSH_CUDA_CHECK(cudaMemsetAsync(dzx, 0, n * Dp * sizeof(float), stream));
  ADJSH_LAUNCH(HaloScatterKernel, dim3(GridFor(n * Cc, kThreads)), kThreads, stream, halo_d, n,
               skip, s.Di, Dp, Cc, dzx);
  Gemm(m.ctx, true, false, Dp, D, n, 1, dzx, CUDA_R_32F, Dp, xn, CUDA_R_32F, D, 0, gd.in_proj,
       CUDA_R_32F, D);
  Gemm(m.ctx, false, false, n, D, Dp, 1, dzx, CUDA_R_32F, Dp, m.w.in_proj, CUDA_R_32F, D, 0, dxn,
       CUDA_R_32F, D);
  RmsNormBackward(stream, u_d, n, D, m.w.norm, r1, dxn, gd.norm, dxn, reduce);
  Add(stream, du_d, dxn, n * D, du_d);
  m.AccumulateGrad(acc, gbuf, grad, 2, defer_grad, sum);  // the norm's and in_proj's alone
  if (m.resident) return;
  m.ctx.Download(du, du_d, n * D * sizeof(float));
  m.ctx.Sync();
}

void DeviceMamba2Block::FinishBackward(const Mamba2Tensors<float>& grad) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ctx.mutex());
  auto open = m.deferred.find(grad.norm);
  if (open == m.deferred.end()) return;  // no deferred call added into it
  ADJSH_CUDA_CHECK(cudaSetDevice(m.ctx.device()));
  const std::vector<float*> dst = TensorList(grad);
  const std::vector<int64_t> sizes = TensorSizes(m.s);
  int64_t off = 0;
  for (size_t q = 0; q < sizes.size(); ++q) {
    m.ctx.Download(dst[q], open->second + off, sizes[q] * sizeof(float));
    off += sizes[q];
  }
  m.ctx.Sync();
  m.ctx.Free(open->second, m.GradTotal() * sizeof(float));
  m.deferred.erase(open);
}

}  // namespace adjsh::cuda
