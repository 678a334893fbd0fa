// A Mamba-2 model run forward over a sequence fed in pieces: every layer keeps its heads'
// states (H, P, N) and its input's last W - 1 rows (the conv halo), so a piece's rows are those
// of one forward of the whole sequence, with memory bounded by the piece (kernels/cpu/mamba2_layer.h).
// For evaluation (engine/mamba2_eval.h) and decoding (engine/mamba2_generate.h), on the model's
// device (kernels/mamba2_backend.h).
#ifndef ADJSH_ENGINE_MAMBA2_STREAM_H_
#define ADJSH_ENGINE_MAMBA2_STREAM_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/mamba2_backend.h"
#include "common/mamba2_model.h"

namespace adjsh {

template <typename T>
class Mamba2Stream {
 public:
  explicit Mamba2Stream(const Mamba2BackendModel<T>& model);  // model outlives the stream

  // The sequence's next ids (each < V, checked by the caller) through every layer: out gets
  // the last layer's output rows (ids.size(), D), before the final norm.
  void Advance(std::span<const uint32_t> ids, std::vector<T>& out);

  int64_t position() const { return t_; }  // tokens fed so far

 private:
  const Mamba2BackendModel<T>& m_;
  const Mamba2Params<T>& p_;
  const Mamba2Dims d_;
  int64_t t_ = 0;
  std::vector<std::vector<T>> S_, halo_;  // per layer: the states; the input rows before t_
  std::vector<T> rows_, add_;
};

}  // namespace adjsh

#endif  // ADJSH_ENGINE_MAMBA2_STREAM_H_
