// Spare buffers of kept activation sets (kept_pool.h), by role: the arrays a set gives up while
// it does not need them, for the next set that does. A set carried from a layer's forward to its
// backward (kernels/cpu/mamba_block.h) keeps only what it cannot refill exactly, and a set handed
// back keeps only that much too; the rest waits here. Freed instead, those buffers came back as
// fresh pages, each a minor fault (docs/BENCHMARKS.md, "What was tried"). Here
// they stay counted in their store's budget, as the pool's free lists are, and a budget lowered
// below the count, or a take that needs their room (kept_pool.h ChargeInUse), frees them. One
// set of spares per store and type (KeptStore::CacheOf).
//
//   KeptSpares<float, 2>& spares = store.CacheOf<KeptSpares<float, 2>>();
//   KeptSpares<float, 2>::Roles roles = {&a.x, &a.y};
//   spares.Put(roles);   // each buffer with a capacity moves here
//   spares.Take(roles);  // each empty one takes its role's spare
#ifndef ADJSH_KERNELS_CPU_KEPT_SPARES_H_
#define ADJSH_KERNELS_CPU_KEPT_SPARES_H_

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cpu/aligned.h"
#include "kernels/cpu/kept_pool.h"

namespace adjsh::cpu {

template <typename T, int kRoles>
class KeptSpares final : public kept_internal::Cache {
 public:
  using Roles = std::array<AlignedVector<T>*, kRoles>;  // a set's array of each role
  struct Counts {
    int64_t put = 0, taken = 0, freed = 0;  // buffers, since the store was made
  };

  explicit KeptSpares(KeptStore& store) : store_(store) {}

  // Moves every buffer of `roles` that has a capacity onto its role's stack, counted in the
  // budget; one the budget has no room for is freed. The caller has uncounted them from its set.
  void Put(const Roles& roles) {
    std::vector<AlignedVector<T>> drop;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(store_.mu_);
      for (int r = 0; r < kRoles; ++r) {
        AlignedVector<T>& v = *roles[r];
        if (v.capacity() == 0) continue;
        if (store_.Charge(Bytes(v))) {
          store_.Cached(Bytes(v));
          stacks_[r].push_back(std::move(v)), ++counts_.put;
        } else {
          drop.push_back(std::move(v)), ++counts_.freed;
        }
        v = AlignedVector<T>();
      }
    }
  }

  // Gives every buffer of `roles` without a capacity its role's last spare, if any, uncounted
  // from the budget (the caller counts it in its set). Sizes are the spare's: resize as needed.
  void Take(const Roles& roles) {
    std::lock_guard<std::mutex> lock(store_.mu_);
    for (int r = 0; r < kRoles; ++r) {
      AlignedVector<T>& v = *roles[r];
      if (v.capacity() != 0 || stacks_[r].empty()) continue;
      v = std::move(stacks_[r].back());
      stacks_[r].pop_back();
      store_.LeaveCache(Bytes(v));
      ++counts_.taken;
    }
  }

  Counts counts() const {
    std::lock_guard<std::mutex> lock(store_.mu_);
    return counts_;
  }

  void Trim(int64_t headroom) override {  // kept_pool.h Cache; the store's mutex held
    for (int r = 0; r < kRoles; ++r)
      while (!stacks_[r].empty() && store_.OverBudget(headroom)) {
        store_.LeaveCache(Bytes(stacks_[r].back()));
        stacks_[r].pop_back();
        ++counts_.freed;
      }
  }

 private:
  static int64_t Bytes(const AlignedVector<T>& v) {
    return static_cast<int64_t>(v.capacity() * sizeof(T));
  }

  KeptStore& store_;
  std::vector<AlignedVector<T>> stacks_[kRoles];
  Counts counts_;
};

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_KEPT_SPARES_H_
