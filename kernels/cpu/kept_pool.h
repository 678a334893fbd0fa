// The process's store of kept activations: what a chunk's summary recomputed and leaves for
// the pass after it on the same rows (kernels/cpu/mamba_block.h "Kept"), so that pass skips
// the recompute. They are a memo, never needed: whatever is not kept is recomputed, to the same
// bits. Two things make keeping them cheap and bounded:
//   - a byte budget for the whole process (SetKeptBudget; every pool counts against it), so
//     that keeping never raises peak memory by more than the budget, however long the sequence;
//   - recycling: a set handed back goes to a free list and is taken again with its buffers'
//     capacity (a fresh set per chunk would cost page faults on every buffer).
// The memory of sets on the free lists (and of the spares, kernels/cpu/kept_spares.h) stays
// counted and held until the budget is lowered, or until a take needs its room (ChargeInUse).
//
//   Obj* o = KeptPool<Obj>::Get().Take(estimate_bytes);  // null: over budget
//   ... fill *o, later read it; KeptPool<Obj>::Get().Give(o) hands it back (a unique_ptr's
//   deleter, as kernels/cpu/mamba_block.h's KeptPtr, does that).
// Obj: default-constructible, with `int64_t bytes() const` (what its buffers hold).
#ifndef ADJSH_KERNELS_CPU_KEPT_POOL_H_
#define ADJSH_KERNELS_CPU_KEPT_POOL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace adjsh::cpu {

// The budget in bytes for all kept sets of the process; 0 keeps nothing. Default:
// kDefaultKeptBudget. Lowering it frees what the free lists hold above the new budget.
constexpr int64_t kDefaultKeptBudget = int64_t{256} << 20;
void SetKeptBudget(int64_t bytes);
int64_t KeptBudget();
// Bytes counted now (sets in use and on free lists), and the most ever counted.
int64_t KeptBytes();
int64_t KeptPeakBytes();
// Takes since the process started: sets handed out, and takes refused for the budget (the
// share kept is what the benchmarks' executed flops count: bench/flops.h).
struct KeptTakes {
  int64_t given = 0, refused = 0;
  // Carried sets a pass took instead (mamba_block.h Carries): by AdjointSummary (which keeps it
  // for Backward, as a set it was given) and by Backward (a span with no AdjointSummary).
  int64_t carried_to_summary = 0, carried_to_backward = 0;
  int64_t carried_rows = 0;  // their own rows (a chunk's len), both ways
};
KeptTakes KeptTakeCounts();

// Sets carried across phases (a layer's forward activations held for its backward,
// kernels/cpu/mamba_block.h) stay in use much longer than a summary's set, and a carried set
// spares no more than a kept one: so carrying must leave the summaries' sets their room.
// TryCarry counts `bytes` in if the carried sets, these and `reserve` more bytes (what the
// caller's summaries may want at once) fit in the budget; else it counts nothing and returns
// false. EndCarry counts them out again.
bool TryCarry(int64_t bytes, int64_t reserve);
// Whether TryCarry(bytes, reserve) would count them in now (it may not by the time it runs).
bool CarryFits(int64_t bytes, int64_t reserve);
void EndCarry(int64_t bytes);
int64_t CarriedBytes();
void CountCarryUse(bool by_summary, int64_t rows);  // KeptTakes' carried counts

namespace kept_internal {
// The process's count, shared by the pools of every Obj type (one mutex guards all of it).
std::mutex& Mutex();
// Adds delta to the count if the result stays within the budget (always for delta <= 0).
bool Charge(int64_t delta);
void CountTake(bool given);
// Whether `headroom` more bytes would not fit in the budget now.
bool OverBudget(int64_t headroom = 0);
// The part of the count that caches hold (the free lists, the spares): each adds what it
// stores and subtracts what leaves it, taken or freed.
void Cached(int64_t delta);
// Bytes a cache held leave it and the count: freed, or taken by a set that counts them itself.
void LeaveCache(int64_t bytes);
// Registers a cache's trim: it frees what the cache holds until `headroom` more bytes fit in
// the budget or the cache is empty. Called with the mutex held: with 0 when the budget is
// lowered, and by ChargeInUse.
void RegisterCache(void (*trim)(int64_t headroom));
// Charge (the mutex held) for a set in use: when delta does not fit but would with the caches
// emptied, the caches are trimmed to make room for it first (freeing their buffers under the
// mutex, which only a full budget comes to). A take must not be refused for memory that only
// waits to be reused: after a 16K gradient the free list held the budget's worth of carried
// sets' arrays, and the next gradient's forward, whose takes each grow a recycled set, carried
// 0 to 10 of its 256 chunks instead of 122. A take that would not fit even then frees nothing.
bool ChargeInUse(int64_t delta);
}  // namespace kept_internal

template <typename Obj>
class KeptPool {
 public:
  static KeptPool& Get() {
    static KeptPool* pool = [] {
      auto* p = new KeptPool;  // never destroyed: sets may be handed back at exit
      kept_internal::RegisterCache(&KeptPool::Trim);
      return p;
    }();
    return *pool;
  }

  // A set from the free list, or a new one, counted as at least `estimate` bytes (what the
  // caller may grow it to) while in use; null when that does not fit in the budget (the caller
  // recomputes instead of keeping). summary: a summary's take, counted in KeptTakes.
  Obj* Take(int64_t estimate, bool summary = true) {
    std::lock_guard<std::mutex> lock(kept_internal::Mutex());
    // A recycled set is charged only for what it may grow beyond what it already counts. It
    // leaves the free list first, so that the trims (ChargeInUse) free the others.
    Entry e;
    if (!free_.empty()) {
      e = std::move(free_.back()), free_.pop_back();
      kept_internal::Cached(-e.counted);
    }
    const int64_t grow = std::max<int64_t>(estimate - e.counted, 0);
    const bool fits = kept_internal::ChargeInUse(grow);
    if (summary) kept_internal::CountTake(fits);
    if (!fits) {
      if (e.obj) kept_internal::Cached(e.counted), free_.push_back(std::move(e));
      return nullptr;
    }
    if (!e.obj) e.obj = std::make_unique<Obj>();
    counted_[e.obj.get()] = e.counted + grow;
    return e.obj.release();
  }

  // Sets the bytes counted for a set in use: always when that lowers its count (buffers it
  // freed), when the budget allows when that raises it. False: the count is unchanged.
  bool Recount(const Obj* o, int64_t bytes) {
    std::lock_guard<std::mutex> lock(kept_internal::Mutex());
    auto it = counted_.find(o);
    if (!kept_internal::Charge(bytes - it->second)) return false;
    it->second = bytes;
    return true;
  }

  // Back to the free list, its count corrected to what its buffers hold now; freed instead
  // when that growth does not fit the budget.
  void Give(Obj* o) {
    if (o == nullptr) return;
    std::unique_ptr<Obj> owned(o);
    std::lock_guard<std::mutex> lock(kept_internal::Mutex());
    auto it = counted_.find(o);
    const int64_t before = it->second, now = owned->bytes();
    counted_.erase(it);
    if (!kept_internal::Charge(now - before)) {
      kept_internal::Charge(-before);
      return;  // owned frees it
    }
    free_.push_back({std::move(owned), now});
    kept_internal::Cached(now);
  }

 private:
  struct Entry {
    std::unique_ptr<Obj> obj;
    int64_t counted = 0;  // bytes charged for it
  };

  static void Trim(int64_t headroom) {  // called with the mutex held
    KeptPool& p = Get();
    while (!p.free_.empty() && kept_internal::OverBudget(headroom)) {
      kept_internal::LeaveCache(p.free_.back().counted);
      p.free_.pop_back();
    }
  }

  std::vector<Entry> free_;
  std::unordered_map<const Obj*, int64_t> counted_;  // sets in use: bytes charged
};

}  // namespace adjsh::cpu

#endif  // ADJSH_KERNELS_CPU_KEPT_POOL_H_
