// A model run forward over a sequence that arrives a piece at a time (evaluation, decoding):
// every layer carries only its state after the last row and its input's last W - 1 rows (the
// causal conv's halo) from one piece to the next, so a sequence of any length costs the memory
// of one piece, and feeding it in pieces of any sizes gives the rows of one chunked forward of
// the whole. One class for every model type, through its layer op table (kernels/chunk_ops.h),
// which engine/evaluate.cc and engine/generate.cc are written over:
//   static StatusOr<ModelStreams> Make(params, device, head)  the layers on the device (and
//                                    with head, the LM head's loss there too; Mamba-2's device
//                                    always has both)
//   Backend<T>& backend();  const Params& params();  int64_t halo() (H = W - 1);  Reset()
//   Advance(k, x, len, out)  layer k on a piece: x (H + len, D) holds the piece's rows at
//                            [H, H + len) (its first H rows are overwritten with the halo);
//                            out (len, D) gets the layer's output rows, the next one's input.
#ifndef ADJSH_ENGINE_MODEL_STREAM_H_
#define ADJSH_ENGINE_MODEL_STREAM_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/chunk_ops.h"

namespace adjsh {

// One layer's forward over the pieces (ChunkOps::Forward with the halo rows and h0).
template <typename T, typename Layer>
class LayerStream {
 public:
  // D: the model width; H = W - 1: the conv's halo rows; S: the state's size.
  LayerStream(int64_t D, int64_t H, int64_t S)
      : D_(D), H_(H), halo_(H * D), h_{std::vector<T>(S), std::vector<T>(S)} {}

  void Reset() { t_ = 0, rows_ = 0, started_ = false; }  // a new sequence: no state, no halo

  void Advance(ChunkOps<T, Layer>& ops, T* x, int64_t len, T* out) {
    T* in = x + (H_ - rows_) * D_;  // the halo rows, then the piece's
    std::copy(halo_.begin(), halo_.begin() + rows_ * D_, in);
    T* h_end = h_[cur_ ^ 1].data();
    ops.Forward(nullptr, in, ChunkSpan{t_, len, rows_}, started_ ? h_[cur_].data() : nullptr,
                out, h_end, -1);
    cur_ ^= 1, t_ += len, started_ = true;
    const int64_t keep = std::min(H_, rows_ + len);  // the last H rows of (halo, piece)
    const T* end = x + (H_ + len) * D_;
    std::copy(end - keep * D_, end, halo_.begin());
    rows_ = keep;
  }

 private:
  int64_t D_, H_;
  std::vector<T> halo_;  // (H, D): the last rows_ = min(H, t_) rows of the layer's input so far
  int64_t t_ = 0, rows_ = 0;
  std::vector<T> h_[2];  // the state after the last row (h_[cur_]) and the next one
  int cur_ = 0;
  bool started_ = false;
};

// P: ModelParams<T> or Mamba2Params<T>.
template <typename P>
class ModelStreams {
 public:
  using Params = P;
  using Value = typename LayerModel<Params>::Value;
  using Layer = typename LayerModel<Params>::Layer;
  // The device's backend with the layers' forward (and with head, the head's loss): its errors.
  static absl::StatusOr<ModelStreams> Make(const Params& params, const Device& device, bool head);
  Backend<Value>& backend() { return *device_.backend; }
  const Params& params() const { return *device_.model.params; }
  int64_t halo() const { return params().config.conv_kernel - 1; }
  void Reset() {
    for (LayerStream<Value, Layer>& l : layers_) l.Reset();
  }
  void Advance(int64_t k, Value* x, int64_t len, Value* out) {
    layers_[k].Advance(*device_.model.layers[k], x, len, out);
  }

 private:
  DeviceModel<Params> device_;
  std::vector<LayerStream<Value, Layer>> layers_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MODEL_STREAM_H_
