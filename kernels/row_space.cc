#include "kernels/row_space.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace adjsh {
namespace {

template <typename T>
class HostSpace final : public RowSpace<T> {
 public:
  HostSpace() : RowSpace<T>(0) {}
  bool host() const override { return true; }
  void Upload(T* dst, const T* src, size_t n) override { Copy(dst, src, n); }
  void Download(T* dst, const T* src, size_t n) override { Copy(dst, src, n); }
  void Copy(T* dst, const T* src, size_t n) override {
    if (n && dst != src) std::memmove(dst, src, n * sizeof(T));
  }
  void Add(T* dst, const T* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void Zero(T* dst, size_t n) override { std::fill_n(dst, n, T(0)); }
  void MarkNonFinite(T* flag, const T* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(src[i])) {
        flag[0] = T(1);
        return;
      }
    }
  }
  void WidenIds(T* ids, const T* packed, size_t n) override {
    static_assert(sizeof(T) >= sizeof(uint32_t));
    for (size_t i = n; i-- > 0;) {  // backwards: ids may be packed's own memory
      uint16_t id;
      std::memcpy(&id, reinterpret_cast<const char*>(packed) + 2 * i, 2);
      const uint32_t wide = id;
      std::memcpy(reinterpret_cast<char*>(ids) + sizeof(T) * i, &wide, sizeof(wide));
    }
  }
  void Finish() override {}

 private:
  T* Allocate(size_t n) override { return new T[n]; }
  void Release(T* p, size_t) override { delete[] p; }
};

}  // namespace

template <typename T>
T* RowSpace<T>::Alloc(size_t n, bool may_spill) {
  if (pool_cap_ > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto [it, end] = pool_.equal_range(n); it != end; ++it) {
      if (it->second.spilled && !may_spill) continue;
      T* p = it->second.p;
      pool_.erase(it);
      pooled_ -= n * sizeof(T);
      return p;
    }
  }
  return may_spill ? AllocateSpillable(n) : Allocate(n);
}

template <typename T>
void RowSpace<T>::Free(T* p, size_t n) {
  if (pool_cap_ == 0) return Release(p, n);
  const bool spilled = Spilled(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pooled_ + n * sizeof(T) <= pool_cap_) {
      pool_.emplace(n, Pooled{p, spilled});
      pooled_ += n * sizeof(T);
    } else {
      pending_.emplace_back(p, n);
    }
  }
}

template <typename T>
void RowSpace<T>::AfterWait() {
  std::vector<std::pair<T*, size_t>> go;
  {
    std::lock_guard<std::mutex> lock(mu_);
    go.swap(pending_);
  }
  for (const auto& [p, n] : go) Release(p, n);
}

template <typename T>
void RowSpace<T>::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [n, b] : pool_) Release(b.p, n);
  for (const auto& [p, n] : pending_) Release(p, n);
  pool_.clear();
  pending_.clear();
  pooled_ = 0;
}

template <typename T>
RowSpace<T>& HostRows() {
  static RowSpace<T>* space = new HostSpace<T>();
  return *space;
}

template class RowSpace<float>;
template class RowSpace<double>;
template RowSpace<float>& HostRows<float>();
template RowSpace<double>& HostRows<double>();

}  // namespace adjsh
