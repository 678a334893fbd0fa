// One layer's forward over a sequence that arrives a chunk at a time (evaluation, decoding):
// the layer carries only its state (Di, N) after the last row and its input's last W - 1 rows
// (the causal conv's halo) from one call to the next, so a sequence of any length costs the
// memory of one chunk. Feeding a sequence in pieces of any sizes gives the rows of one
// chunked forward of the whole (kernels/backend.h Forward with halo rows and h0).
#ifndef ADJSH_ENGINE_LAYER_STREAM_H_
#define ADJSH_ENGINE_LAYER_STREAM_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace adjsh {

template <typename T>
class LayerStream {
 public:
  // D: the model width; H = W - 1: the conv's halo rows; DiN = Di N: the state's size.
  LayerStream(int64_t D, int64_t H, int64_t DiN)
      : D_(D), H_(H), halo_(H * D), h_{std::vector<T>(DiN), std::vector<T>(DiN)} {}

  // The start of a new sequence: no state, no halo.
  void Reset() { rows_ = 0, started_ = false; }

  // x: (H + len, D), the piece's own rows at [H, H + len); its first H rows are overwritten with
  // the halo. Runs the layer on the piece, writes out (len, D), keeps the new state and halo.
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

}  // namespace adjsh

#endif  // ADJSH_ENGINE_LAYER_STREAM_H_
