// A Mamba-2 layer's shape and tensors as plain pointers (no model types), for the backends
// that run the layer on a device (kernels/backend.h Mamba2BlockBackend,
// kernels/cuda/mamba2_block.h). Letters as kernels/cpu/mamba2_layer.h: D hidden, Di = H P inner, H
// heads of P channels, G groups, N state, W conv kernel, Cc = Di + 2 G N conv channels,
// Dp = 2 Di + 2 G N + H in_proj rows.
#ifndef ADJSH_KERNELS_MAMBA2_TENSORS_H_
#define ADJSH_KERNELS_MAMBA2_TENSORS_H_

#include <cstdint>

namespace adjsh {

// What the layer's math reads from a Mamba2Config (common/mamba2_config.h). dt after the
// softplus is clamped to [dt_min, dt_max] when dt_clamped (Mamba2Config::dt_clamped).
struct Mamba2Shape {
  int64_t D = 0, Di = 0, H = 0, P = 0, G = 0, N = 0, W = 0;
  float eps = 1e-5f;
  bool dt_clamped = false;
  float dt_min = 0.0f, dt_max = 0.0f;
  int64_t Cc() const { return Di + 2 * G * N; }
  int64_t Dp() const { return 2 * Di + 2 * G * N + H; }
};

// The shape of a Mamba2Config; templated so that this header needs no config types.
template <typename Config>
Mamba2Shape Mamba2ShapeOf(const Config& c) {
  Mamba2Shape s;
  s.D = c.hidden_size, s.Di = c.inner(), s.H = c.num_heads, s.P = c.head_dim;
  s.G = c.n_groups, s.N = c.state_size, s.W = c.conv_kernel;
  s.eps = static_cast<float>(c.layer_norm_epsilon);
  s.dt_clamped = c.dt_clamped();
  s.dt_min = static_cast<float>(c.time_step_min_limit);
  s.dt_max = static_cast<float>(c.time_step_max_limit);
  return s;
}

// One layer's parameters (or gradient accumulators) in the HF layout (common/mamba2_model.h):
// norm (D), in_proj (Dp, D), conv_w (Cc, W), conv_b (Cc), dt_bias, A_log, Dskip (H),
// gnorm (Di), out_proj (D, Di).
template <typename T>
struct Mamba2Tensors {
  T* norm = nullptr;
  T* in_proj = nullptr;
  T* conv_w = nullptr;
  T* conv_b = nullptr;
  T* dt_bias = nullptr;
  T* A_log = nullptr;
  T* Dskip = nullptr;
  T* gnorm = nullptr;
  T* out_proj = nullptr;
};

// The tensors of a Mamba2Layer (common/mamba2_model.h) or any struct with those members as
// vectors: T = const float for weights, float for gradient accumulators.
template <typename T, typename Layer>
Mamba2Tensors<T> Mamba2TensorsOf(Layer& l) {
  Mamba2Tensors<T> t;
  t.norm = l.norm.data(), t.in_proj = l.in_proj.data(), t.conv_w = l.conv_w.data();
  t.conv_b = l.conv_b.data(), t.dt_bias = l.dt_bias.data(), t.A_log = l.A_log.data();
  t.Dskip = l.D.data(), t.gnorm = l.gnorm.data(), t.out_proj = l.out_proj.data();
  return t;
}

}  // namespace adjsh

#endif  // ADJSH_KERNELS_MAMBA2_TENSORS_H_
