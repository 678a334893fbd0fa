// The CUDA backend's kernels behind a plain C++ interface (no CUDA, no absl types), so that the
// rest of adjsh compiles with the host compiler alone. A block's pointers are host memory (each
// call uploads its inputs, runs on the device's stream and returns when its outputs are on the
// host), or for a resident block device memory (the span's rows, states and adjoints where a
// resident span keeps them, kernels/cuda/device_rows.h: a call only queues its kernels).
// Shapes and contracts as cpu::MambaBlockCpu (kernels/cpu/mamba_block.h) and
// cpu::LmHeadForwardBackward (kernels/cpu/lm_head.h); compute is f32, storage f32 or bf16.
#ifndef ADJSH_KERNELS_CUDA_DEVICE_BLOCK_H_
#define ADJSH_KERNELS_CUDA_DEVICE_BLOCK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/device_memory.h"

namespace adjsh::cuda {

struct BlockShape {
  int64_t D = 0, Di = 0, N = 0, R = 0, W = 0;
  float eps = 1e-5f;
};

// One layer's parameters (or gradient accumulators), HF shapes: norm (D), in_proj (2 Di, D),
// conv_w (Di, W), conv_b (Di), x_proj (R + 2N, Di), dt_w (Di, R), dt_b (Di), A_log (Di, N),
// Dskip (Di), out_proj (D, Di).
template <typename P>
struct LayerTensors {
  P* norm = nullptr;
  P* in_proj = nullptr;
  P* conv_w = nullptr;
  P* conv_b = nullptr;
  P* x_proj = nullptr;
  P* dt_w = nullptr;
  P* dt_b = nullptr;
  P* A_log = nullptr;
  P* Dskip = nullptr;
  P* out_proj = nullptr;
};

// The tensors of a LayerParams (common/model.h) or any struct with those members as vectors:
// P = const float for weights, float for gradient accumulators. Templated so that this header
// needs no model types.
template <typename P, typename Layer>
LayerTensors<P> LayerTensorsOf(Layer& p) {
  LayerTensors<P> t;
  t.norm = p.norm.data(), t.in_proj = p.in_proj.data(), t.conv_w = p.conv_w.data();
  t.conv_b = p.conv_b.data(), t.x_proj = p.x_proj.data(), t.dt_w = p.dt_w.data();
  t.dt_b = p.dt_b.data(), t.A_log = p.A_log.data(), t.Dskip = p.Dskip.data();
  t.out_proj = p.out_proj.data();
  return t;
}

// The block shape of a MambaConfig (common/config.h).
template <typename Config>
BlockShape BlockShapeOf(const Config& c) {
  return {c.hidden_size,    c.inner(),     c.state_size,
          c.time_step_rank, c.conv_kernel, static_cast<float>(c.layer_norm_epsilon)};
}

// Largest state size the scan kernels take (the N lanes of a channel share one warp).
inline constexpr int64_t kMaxStateSize = 32;

class DeviceBlock {
 public:
  // Copies the layer's weights to GPU `device` (converted to bf16 for bf16 storage). resident:
  // every row, state and adjoint pointer of its calls is device memory, and the backward adds
  // into a device sum (Backward's `sum`).
  DeviceBlock(int device, bool bf16, const BlockShape& shape, const LayerTensors<const float>& w,
              bool resident = false);
  ~DeviceBlock();
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;

  // u (halo + len, D); h0 (Di, N) or nullptr (zeros); u_next (len, D); h_end (Di, N).
  void Forward(const float* u, int64_t halo, int64_t len, const float* h0, float* u_next,
               float* h_end);
  // The span schedule's summaries of the chunk (kernels/cpu/mamba_block.h): u (halo + len, D);
  // h_local (Di, N) = the chunk's end state from a zero state; S (Di) = sum of Delta over the
  // chunk; with g (len, D), m (Di, N) = a_0 lambda_0 of the reverse scan from a zero adjoint.
  void LocalSummary(const float* u, int64_t halo, int64_t len, float* h_local, float* S);
  void AdjointSummary(const float* u, int64_t halo, int64_t len, const float* g, float* m,
                      float* S);
  // Resident: the summaries folded into a running value where the rows are (kernels/decay.h
  // DecayAdd with the layer's A): state = exp(A S) state + h_local and sigma (Di) += S; carry =
  // exp(A S) carry + m.
  void FoldLocalSummary(const float* u, int64_t halo, int64_t len, float* state, float* sigma);
  void FoldAdjointSummary(const float* u, int64_t halo, int64_t len, const float* g,
                          float* carry);
  // The exact backward: g (len, D), h0 (Di, N), mu (Di, N) or nullptr; grad accumulated;
  // du (len, D), du_halo (halo, D) and mu_out (Di, N, if non-null) written. defer_grad: the sum
  // stays on the device (the caller's grad uploaded at the first such call for it, its tensors'
  // addresses naming it) until FinishBackward(grad) brings it into grad, so the calls of one
  // task move the layer's gradient once each way rather than per call; the same bits. A
  // resident block adds into `sum` instead (GradSize() floats of device memory, the layer's
  // tensors back to back in LayerTensors order; grad and defer_grad unused), where the span's
  // sums are taken (engine/span_step.cc).
  void Backward(const float* u, int64_t halo, int64_t len, const float* g, const float* h0,
                const float* mu, const LayerTensors<float>& grad, float* du, float* du_halo,
                float* mu_out, bool defer_grad = false, float* sum = nullptr);
  // The deferred sum of grad's Backward calls into grad (nothing when none is open).
  void FinishBackward(const LayerTensors<float>& grad);
  int64_t GradSize() const;  // the values of one layer's gradient

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The head over M rows in blocks of rows and of vocabulary: returns the loss sum; du (M, D)
// written; dE (V, D) and dw_f (D) accumulated.
double DeviceHead(int device, bool bf16, int64_t M, int64_t D, int64_t V, float eps,
                  const float* E, const float* w_f, const float* u, const int64_t* targets,
                  float scale, float* du, float* dE, float* dw_f);

// A model's embedding and head weights on GPU `device` for a resident model, uploaded once per
// parameter version (the (V, D) table crosses PCIe once, not per span): embed (V, D) f32 for the
// lookup, head (V, D) the head's (the same pointer when tied; bf16 on the device for bf16
// storage) and w_f (D). Rows, u, du, g and dE are device memory (a resident span's; dE added
// into); ids, targets and dw_f host memory. Calls only queue, except ForwardBackward and Loss,
// which wait for their loss.
class DeviceHeadWeights {
 public:
  DeviceHeadWeights(int device, bool bf16, int64_t V, int64_t D, const float* embed,
                    const float* head, const float* w_f);
  ~DeviceHeadWeights();
  DeviceHeadWeights(const DeviceHeadWeights&) = delete;
  DeviceHeadWeights& operator=(const DeviceHeadWeights&) = delete;

  // Every pointer is device memory; ids are the span's token ids where it keeps them.
  void Gather(const uint32_t* ids, int64_t n, float* rows);  // rows (n, D) = embed[ids]
  // As DeviceHead over M resident rows, row t's target next_ids[t] for t < valid, none after.
  // dE_nonfinite: null, or a host float set to 1 where dE holds a NaN or an Inf (else 0).
  double ForwardBackward(int64_t M, float eps, const float* u, const uint32_t* next_ids,
                         int64_t valid, float scale, float* du, float* dE, float* dw_f,
                         float* dE_nonfinite);
  // The loss alone, ForwardBackward's bits without its backward (an evaluation).
  double Loss(int64_t M, float eps, const float* u, const uint32_t* next_ids, int64_t valid);
  // dE (V, D) += the lookup's gradient: g[t] added into row ids[t] in token order.
  void LookupBackward(const uint32_t* ids, int64_t n, const float* g, float* dE);

 private:
  struct Impl;
  Impl* impl_;
};

// The number of CUDA devices; 0 with *error set when the runtime reports none or fails.
int DeviceCount(std::string* error);
// Whether cuBLAS can be loaded (it is loaded on first use, cublas_api.h); *error says why not.
bool CublasUsable(std::string* error);
std::string DeviceName(int device);

// Bytes adjsh holds on GPU `device` (weights, workspaces) now and at the peak since the last
// ResetPeak.
struct DeviceMemory {
  int64_t held = 0, peak = 0;
};
DeviceMemory MemoryOf(int device);
void ResetPeak(int device);

// The traffic the calling thread has caused on every GPU since it started (DeviceTraffic:
// copies, syncs, allocations, counted by each device's Context).
DeviceTraffic ThreadTraffic();

// The worker metrics' reader of GPU `device` (common/device_memory.h): used = MemoryOf's held
// now, peak = the most held since the process started (ResetPeak leaves it), and its traffic. Lock-free, callable
// from any thread while calls run; it shares the device's counts, so it stays valid whatever is
// destroyed first (backend, blocks, the device's context at exit). Creates no CUDA context: 0
// bytes until the device's first call.
DeviceMemoryProbe DeviceMemoryProbeOf(int device);

}  // namespace adjsh::cuda

#endif  // ADJSH_KERNELS_CUDA_DEVICE_BLOCK_H_
