#include "kernels/cpu/kept_pool.h"

#include <algorithm>

namespace adjsh::cpu {
namespace {

struct State {
  int64_t budget = kDefaultKeptBudget;
  int64_t count = 0, peak = 0;
  int64_t carried = 0;  // TryCarry's
  int64_t cached = 0;   // of count: what the free lists and the spares hold (Cached)
  KeptTakes takes;
  std::vector<void (*)(int64_t)> trims;
};

State& S() {
  static State* s = new State;  // never destroyed, as the pools
  return *s;
}

}  // namespace

namespace kept_internal {

std::mutex& Mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

bool Charge(int64_t delta) {
  State& s = S();
  if (delta > 0 && s.count + delta > s.budget) return false;
  s.count += delta;
  s.peak = std::max(s.peak, s.count);
  return true;
}

void CountTake(bool given) { ++(given ? S().takes.given : S().takes.refused); }

bool OverBudget(int64_t headroom) { return S().count + headroom > S().budget; }

void Cached(int64_t delta) { S().cached += delta; }

void LeaveCache(int64_t bytes) {
  Charge(-bytes);
  Cached(-bytes);
}

bool ChargeInUse(int64_t delta) {
  if (Charge(delta)) return true;
  const State& s = S();
  if (s.count - s.cached + delta > s.budget) return false;  // no trim would make room
  for (void (*trim)(int64_t) : s.trims) trim(delta);
  return Charge(delta);
}

void RegisterCache(void (*trim)(int64_t headroom)) {
  // Called from a pool's first Get, which may hold no lock yet.
  std::lock_guard<std::mutex> lock(Mutex());
  S().trims.push_back(trim);
}

}  // namespace kept_internal

void SetKeptBudget(int64_t bytes) {
  std::lock_guard<std::mutex> lock(kept_internal::Mutex());
  S().budget = std::max<int64_t>(bytes, 0);
  for (void (*trim)(int64_t) : S().trims) trim(0);
}

namespace {
// One field of the count, read under the mutex.
template <typename Fn>
auto UnderLock(Fn read) {
  std::lock_guard<std::mutex> lock(kept_internal::Mutex());
  return read(S());
}
// Whether `bytes` more carried and `reserve` besides fit in the budget (the mutex held).
bool CarryRoom(const State& s, int64_t bytes, int64_t reserve) {
  return s.carried + bytes + reserve <= s.budget;
}
}  // namespace

int64_t KeptBudget() {
  return UnderLock([](const State& s) { return s.budget; });
}
int64_t KeptBytes() {
  return UnderLock([](const State& s) { return s.count; });
}
int64_t KeptPeakBytes() {
  return UnderLock([](const State& s) { return s.peak; });
}
bool TryCarry(int64_t bytes, int64_t reserve) {
  std::lock_guard<std::mutex> lock(kept_internal::Mutex());
  if (!CarryRoom(S(), bytes, reserve)) return false;
  S().carried += bytes;
  return true;
}
bool CarryFits(int64_t bytes, int64_t reserve) {
  return UnderLock([&](const State& s) { return CarryRoom(s, bytes, reserve); });
}
void EndCarry(int64_t bytes) {
  std::lock_guard<std::mutex> lock(kept_internal::Mutex());
  S().carried -= bytes;
}
void CountCarryUse(bool by_summary, int64_t rows) {
  std::lock_guard<std::mutex> lock(kept_internal::Mutex());
  ++(by_summary ? S().takes.carried_to_summary : S().takes.carried_to_backward);
  S().takes.carried_rows += rows;
}
int64_t CarriedBytes() {
  return UnderLock([](const State& s) { return s.carried; });
}
KeptTakes KeptTakeCounts() {
  return UnderLock([](const State& s) { return s.takes; });
}

}  // namespace adjsh::cpu
