// A model run forward over a sequence that arrives a piece at a time (evaluation, decoding):
// every layer carries only its state after the last row and its input's last W - 1 rows (the
// causal conv's halo) from one piece to the next, so a sequence of any length costs the memory
// of one piece, and feeding it in pieces of any sizes gives the rows of one chunked forward of
// the whole. One class per model type, with one interface, which engine/evaluate.cc and
// engine/generate.cc are written over:
//   static StatusOr<Streams> Make(params, device, head)  the layers on the device (and with
//                                                        head, the LM head's loss there too;
//                                                        Mamba-2's device always has both)
//   Backend<T>& backend();  const Params& params();  int64_t halo() (H = W - 1);  Reset()
//   Advance(k, x, len, out)  layer k on a piece: x (H + len, D) holds the piece's rows at
//                            [H, H + len) (its first H rows are overwritten with the halo);
//                            out (len, D) gets the layer's output rows, the next one's input.
#ifndef ADJSH_ENGINE_MODEL_STREAM_H_
#define ADJSH_ENGINE_MODEL_STREAM_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mamba2_model.h"
#include "common/model.h"
#include "engine/mamba_span_math.h"
#include "kernels/backend.h"
#include "kernels/mamba2_backend.h"

namespace adjsh {

// One Mamba-1 layer's forward over the pieces (kernels/backend.h Forward with halo rows and h0).
template <typename T>
class LayerStream {
 public:
  // D: the model width; H = W - 1: the conv's halo rows; DiN = Di N: the state's size.
  LayerStream(int64_t D, int64_t H, int64_t DiN)
      : D_(D), H_(H), halo_(H * D), h_{std::vector<T>(DiN), std::vector<T>(DiN)} {}

  void Reset() { rows_ = 0, started_ = false; }  // a new sequence: no state, no halo

  void Advance(BlockBackend<T>& block, T* x, int64_t len, T* out) {
    std::copy(halo_.begin(), halo_.begin() + rows_ * D_, x + (H_ - rows_) * D_);
    T* h_end = h_[cur_ ^ 1].data();
    block.Forward(x + (H_ - rows_) * D_, cpu::ChunkRows{rows_, len, 0},
                  started_ ? h_[cur_].data() : nullptr, out, h_end);
    cur_ ^= 1, started_ = true;
    const int64_t keep = std::min(H_, rows_ + len);  // the last H rows of (halo, piece)
    const T* end = x + (H_ + len) * D_;
    std::copy(end - keep * D_, end, halo_.begin());
    rows_ = keep;
  }

 private:
  int64_t D_, H_;
  std::vector<T> halo_;  // (H, D): the last rows_ rows of the layer's input so far
  int64_t rows_ = 0;
  std::vector<T> h_[2];  // the state after the last row (h_[cur_]) and the next one
  int cur_ = 0;
  bool started_ = false;
};

// A Mamba-1 model's layers, each a LayerStream over its block on the device.
template <typename T>
class MambaStreams {
 public:
  using Value = T;
  using Params = ModelParams<T>;
  // The device's backend with the forward (and with head, the head's loss): its errors.
  static absl::StatusOr<MambaStreams> Make(const Params& params, const Device& device, bool head);
  Backend<T>& backend() { return *backend_; }
  const Params& params() const { return *model_.params; }
  int64_t halo() const { return params().config.conv_kernel - 1; }
  void Reset() {
    for (LayerStream<T>& l : layers_) l.Reset();
  }
  void Advance(int64_t k, T* x, int64_t len, T* out) {
    layers_[k].Advance(*model_.blocks[k], x, len, out);
  }

 private:
  std::unique_ptr<Backend<T>> backend_;
  BackendModel<T> model_;
  std::vector<LayerStream<T>> layers_;
};

// A Mamba-2 model's layers: each carries its heads' states (H, P, N) and its input's halo
// through the layer's chunk ops (kernels/mamba2_backend.h), its residual added here.
template <typename T>
class Mamba2Streams {
 public:
  using Value = T;
  using Params = Mamba2Params<T>;
  // The device's backend with a Mamba-2 layer and the head (Mamba2DeviceModel): its errors.
  static absl::StatusOr<Mamba2Streams> Make(const Params& params, const Device& device, bool head);
  Backend<T>& backend() { return *device_.backend; }
  const Params& params() const { return *device_.model.params; }
  int64_t halo() const { return params().config.conv_kernel - 1; }
  void Reset();
  void Advance(int64_t k, T* x, int64_t len, T* out);

 private:
  Mamba2DeviceModel<T> device_;
  int64_t D_ = 0, H_ = 0;
  std::vector<std::vector<T>> S_, halo_;  // per layer: the states; the input rows before t_
  std::vector<int64_t> t_;                // per layer: the rows fed so far
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MODEL_STREAM_H_
