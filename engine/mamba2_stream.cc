#include "engine/mamba2_stream.h"

#include <algorithm>

namespace adjsh {

template <typename T>
Mamba2Stream<T>::Mamba2Stream(const Mamba2BackendModel<T>& model)
    : m_(model),
      p_(*model.params),
      d_(p_.config),
      S_(p_.config.num_hidden_layers, std::vector<T>(d_.H * d_.P * d_.N, T(0))),
      halo_(p_.config.num_hidden_layers) {}

template <typename T>
void Mamba2Stream<T>::Advance(std::span<const uint32_t> ids, std::vector<T>& x) {
  const int64_t L = static_cast<int64_t>(ids.size()), D = d_.D, t0 = t_, t1 = t_ + L;
  x.resize(L * D);
  for (int64_t i = 0; i < L; ++i)
    std::copy_n(p_.embed.begin() + int64_t{ids[i]} * D, D, x.begin() + i * D);
  add_.resize(L * D);
  for (size_t k = 0; k < p_.layers.size(); ++k) {
    rows_.assign(halo_[k].begin(), halo_[k].end());  // min(W - 1, t0) rows, then the piece's
    rows_.insert(rows_.end(), x.begin(), x.end());
    m_.layers[k]->Forward(rows_.data(), t0, t1, S_[k].data(), add_.data(), nullptr);
    const int64_t keep = std::min(d_.W - 1, t1);  // the next piece's halo: the last rows read
    halo_[k].assign(rows_.end() - keep * D, rows_.end());
    for (int64_t i = 0; i < L * D; ++i) x[i] += add_[i];
  }
  t_ = t1;
}

template class Mamba2Stream<float>;
template class Mamba2Stream<double>;

}  // namespace adjsh
