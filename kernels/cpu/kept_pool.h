// A store of kept activations: what a chunk's summary recomputed and leaves for the pass after
// it on the same rows (kernels/cpu/mamba_block.h "Kept"), so that pass skips the recompute.
// They are a memo, never needed: whatever is not kept is recomputed, to the same bits. Two
// things make keeping them cheap and bounded:
//   - a byte budget for the whole store (every pool and the spares count against it), so that
//     keeping never raises peak memory by more than the budget, however long the sequence;
//   - recycling: a set handed back goes to a free list and is taken again with its buffers'
//     capacity (a fresh set per chunk would cost page faults on every buffer).
// The memory of sets on the free lists (and of the spares, kernels/cpu/kept_spares.h) stays
// counted and held until the budget is lowered, or until a take needs its room (ChargeInUse).
//
// A CPU backend holds its store (kernels/backend.cc) and gives it to its blocks, which reach
// the pools through it: no kernel reads a process-wide budget or count. The backends of one
// process with the same budget share one store (Shared), kept for the process's life: backends
// are made per gradient (engine/span_step.cc, engine/gradient_step.cc), and a store of their
// own would free its free lists and spares with each, so that every gradient's sets would come
// back as fresh pages; the sets recycle from one gradient to the next (see ChargeInUse below
// for what a 16K gradient leaves waiting). A process configures one budget (--kept-mib), so
// it has one store, bounded as one process-wide budget was.
//
//   KeptStore store(budget);                          // or KeptStore::Shared(budget)
//   Obj* o = store.Pool<Obj>().Take(estimate_bytes);  // null: over budget
//   ... fill *o, later read it; store.Pool<Obj>().Give(o) hands it back (a unique_ptr's
//   deleter, as kernels/cpu/mamba_block.h's KeptPtr, does that).
// Obj: default-constructible, with `int64_t bytes() const` (what its buffers hold).
#ifndef ADJSH_KERNELS_CPU_KEPT_POOL_H_
#define ADJSH_KERNELS_CPU_KEPT_POOL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

namespace adjsh::cpu {

// The budget of a store when none is given (--kept-mib's default: cli/device_flags.cc).
constexpr int64_t kDefaultKeptBudget = int64_t{256} << 20;

// Takes since a store was made: sets handed out, and takes refused for the budget (the share
// kept is what the benchmarks' executed flops count: bench/flops.h).
struct KeptTakes {
  int64_t given = 0, refused = 0;
  // Carried sets a pass took instead (mamba_block.h Carries): by AdjointSummary (which keeps it
  // for Backward, as a set it was given) and by Backward (a span with no AdjointSummary).
  int64_t carried_to_summary = 0, carried_to_backward = 0;
  int64_t carried_rows = 0;  // their own rows (a chunk's len), both ways
};

template <typename Obj>
class KeptPool;
template <typename T, int kRoles>
class KeptSpares;

namespace kept_internal {
// What a store caches for reuse (a pool's free list, the spares of kept_spares.h): the count
// includes it, and the store trims it when the budget is lowered or a take needs its room.
class Cache {
 public:
  virtual ~Cache() = default;
  // Frees what it holds until `headroom` more bytes fit in its store's budget or it holds
  // nothing; called with the store's mutex held.
  virtual void Trim(int64_t headroom) = 0;
  // Whether none of what it handed out is still in use (the store's mutex held).
  virtual bool Idle() const { return true; }
};
}  // namespace kept_internal

class KeptStore {
 public:
  // budget: the bytes all its sets may count; 0 keeps nothing.
  explicit KeptStore(int64_t budget = kDefaultKeptBudget);
  // Frees what its caches hold. Every set taken from it must have been handed back, and every
  // carry ended (checked: a set's deleter would reach a store no longer there).
  ~KeptStore();
  KeptStore(const KeptStore&) = delete;
  KeptStore& operator=(const KeptStore&) = delete;

  // The process's store of `budget` (below 0: 0): the same one for every call with that
  // budget, never destroyed (a set may be handed back at exit), so that a backend made per
  // gradient finds the previous gradient's free lists (see the top of this file). Its budget
  // is its key: SetBudget refuses it.
  static std::shared_ptr<KeptStore> Shared(int64_t budget);

  // A new budget; lowering it frees what the caches hold above it. Not on a Shared store.
  void SetBudget(int64_t bytes);
  int64_t budget() const;
  // Bytes counted now (sets in use, on free lists and among the spares), and the most ever.
  int64_t bytes() const;
  int64_t peak_bytes() const;
  KeptTakes takes() const;

  // Sets carried across phases (a layer's forward activations held for its backward,
  // kernels/cpu/mamba_block.h) stay in use much longer than a summary's set, and a carried set
  // spares no more than a kept one: so carrying must leave the summaries' sets their room.
  // TryCarry counts `bytes` in if the carried sets, these and `reserve` more bytes (what the
  // caller's summaries may want at once) fit in the budget; else it counts nothing and returns
  // false. EndCarry counts them out again.
  bool TryCarry(int64_t bytes, int64_t reserve);
  // Whether TryCarry(bytes, reserve) would count them in now (it may not by the time it runs).
  bool CarryFits(int64_t bytes, int64_t reserve) const;
  void EndCarry(int64_t bytes);
  int64_t carried_bytes() const;
  void CountCarryUse(bool by_summary, int64_t rows);  // KeptTakes' carried counts

  // The store's cache of type C (a KeptPool<Obj> or KeptSpares<T, k>), made on first use and
  // kept as long as the store. Not to be called from inside one of its caches.
  template <typename C>
  C& CacheOf();
  template <typename Obj>
  KeptPool<Obj>& Pool() {
    return CacheOf<KeptPool<Obj>>();
  }

 private:
  template <typename Obj>
  friend class KeptPool;
  template <typename T, int kRoles>
  friend class KeptSpares;

  // For the caches, with mu_ held (one mutex guards the count and every cache of the store).
  // Adds delta to the count if the result stays within the budget (always for delta <= 0).
  bool Charge(int64_t delta);
  void CountTake(bool given);
  // Whether `headroom` more bytes would not fit in the budget now.
  bool OverBudget(int64_t headroom = 0) const { return count_ + headroom > budget_; }
  // The part of the count that caches hold (the free lists, the spares): each adds what it
  // stores and subtracts what leaves it, taken or freed.
  void Cached(int64_t delta) { cached_ += delta; }
  // Bytes a cache held leave it and the count: freed, or taken by a set that counts them itself.
  void LeaveCache(int64_t bytes);
  // Charge for a set in use: when delta does not fit but would with the caches emptied, the
  // caches are trimmed (in the order they were made) to make room for it first (freeing their
  // buffers under the mutex, which only a full budget comes to). A take must not be refused for
  // memory that only waits to be reused: after a 16K gradient the free list held the budget's
  // worth of carried sets' arrays, and the next gradient's forward, whose takes each grow a
  // recycled set, carried 0 to 10 of its 256 chunks instead of 122. A take that would not fit
  // even then frees nothing.
  bool ChargeInUse(int64_t delta);
  bool CarryRoom(int64_t bytes, int64_t reserve) const {
    return carried_ + bytes + reserve <= budget_;
  }

  mutable std::mutex mu_;
  int64_t budget_;
  int64_t count_ = 0, peak_ = 0;
  int64_t carried_ = 0;  // TryCarry's
  int64_t cached_ = 0;   // of count_: what the caches hold (Cached)
  KeptTakes takes_;
  bool shared_ = false;  // made by Shared
  std::vector<std::pair<std::type_index, std::unique_ptr<kept_internal::Cache>>> caches_;
};

// The bytes every store of the process counts now: for the process's gauges alone (the
// worker's, worker/metrics.cc, beside its RSS); nothing is decided by it.
int64_t KeptBytes();


template <typename Obj>
class KeptPool final : public kept_internal::Cache {
 public:
  explicit KeptPool(KeptStore& store) : store_(store) {}

  // The pool of the process's store of the default budget (KeptStore::Shared), for code that
  // holds no store of its own (tests/metrics/metrics_test.cc); the kernels reach their
  // block's store instead.
  static KeptPool& Get() { return KeptStore::Shared(kDefaultKeptBudget)->Pool<Obj>(); }

  KeptStore& store() const { return store_; }

  // A set from the free list, or a new one, counted as at least `estimate` bytes (what the
  // caller may grow it to) while in use; null when that does not fit in the budget (the caller
  // recomputes instead of keeping). summary: a summary's take, counted in KeptTakes.
  Obj* Take(int64_t estimate, bool summary = true) {
    std::lock_guard<std::mutex> lock(store_.mu_);
    // A recycled set is charged only for what it may grow beyond what it already counts. It
    // leaves the free list first, so that the trims (ChargeInUse) free the others.
    Entry e;
    if (!free_.empty()) {
      e = std::move(free_.back()), free_.pop_back();
      store_.Cached(-e.counted);
    }
    const int64_t grow = std::max<int64_t>(estimate - e.counted, 0);
    const bool fits = store_.ChargeInUse(grow);
    if (summary) store_.CountTake(fits);
    if (!fits) {
      if (e.obj) store_.Cached(e.counted), free_.push_back(std::move(e));
      return nullptr;
    }
    if (!e.obj) e.obj = std::make_unique<Obj>();
    counted_[e.obj.get()] = e.counted + grow;
    return e.obj.release();
  }

  // Sets the bytes counted for a set in use: always when that lowers its count (buffers it
  // freed), when the budget allows when that raises it. False: the count is unchanged.
  bool Recount(const Obj* o, int64_t bytes) {
    std::lock_guard<std::mutex> lock(store_.mu_);
    auto it = counted_.find(o);
    if (!store_.Charge(bytes - it->second)) return false;
    it->second = bytes;
    return true;
  }

  // Back to the free list, its count corrected to what its buffers hold now; freed instead
  // when that growth does not fit the budget.
  void Give(Obj* o) {
    if (o == nullptr) return;
    std::unique_ptr<Obj> owned(o);
    std::lock_guard<std::mutex> lock(store_.mu_);
    auto it = counted_.find(o);
    const int64_t before = it->second, now = owned->bytes();
    counted_.erase(it);
    if (!store_.Charge(now - before)) {
      store_.Charge(-before);
      return;  // owned frees it
    }
    free_.push_back({std::move(owned), now});
    store_.Cached(now);
  }

  void Trim(int64_t headroom) override {  // the store's mutex held
    while (!free_.empty() && store_.OverBudget(headroom)) {
      store_.LeaveCache(free_.back().counted);
      free_.pop_back();
    }
  }
  bool Idle() const override { return counted_.empty(); }

 private:
  struct Entry {
    std::unique_ptr<Obj> obj;
    int64_t counted = 0;  // bytes charged for it
  };

  KeptStore& store_;
  std::vector<Entry> free_;
  std::unordered_map<const Obj*, int64_t> counted_;  // sets in use: bytes charged
};

template <typename C>
C& KeptStore::CacheOf() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [type, cache] : caches_)
    if (type == std::type_index(typeid(C))) return static_cast<C&>(*cache);
  caches_.emplace_back(std::type_index(typeid(C)), std::make_unique<C>(*this));
  return static_cast<C&>(*caches_.back().second);
}

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_KEPT_POOL_H_
