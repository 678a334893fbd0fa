#include "kernels/cpu/kept_pool.h"

#include <algorithm>
#include <atomic>
#include <map>

#include "common/check.h"

namespace adjsh::cpu {
namespace {

// Every store alive, for KeptBytes; never destroyed, as the Shared stores that stay listed.
struct Live {
  std::mutex mu;
  std::vector<const KeptStore*> stores;
};
Live& LiveStores() {
  static Live* live = new Live;
  return *live;
}

}  // namespace

KeptStore::KeptStore(int64_t budget) : budget_(std::max<int64_t>(budget, 0)) {
  Live& live = LiveStores();
  std::lock_guard<std::mutex> lock(live.mu);
  live.stores.push_back(this);
}

KeptStore::~KeptStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ADJSH_CHECK(carried_ == 0, "a kept store destroyed with sets carried");
    for (const auto& [type, cache] : caches_)
      ADJSH_CHECK(cache->Idle(), "a kept store destroyed with sets in use");
  }
  Live& live = LiveStores();
  std::lock_guard<std::mutex> lock(live.mu);
  live.stores.erase(std::find(live.stores.begin(), live.stores.end(), this));
}

std::shared_ptr<KeptStore> KeptStore::Shared(int64_t budget) {
  static std::mutex* mu = new std::mutex;
  static auto* stores = new std::map<int64_t, std::shared_ptr<KeptStore>>;  // never destroyed
  budget = std::max<int64_t>(budget, 0);
  std::lock_guard<std::mutex> lock(*mu);
  std::shared_ptr<KeptStore>& store = (*stores)[budget];
  if (!store) {
    store = std::make_shared<KeptStore>(budget);
    store->shared_ = true;
  }
  return store;
}

bool KeptStore::Charge(int64_t delta) {
  if (delta > 0 && count_ + delta > budget_) return false;
  count_ += delta;
  peak_ = std::max(peak_, count_);
  return true;
}

void KeptStore::CountTake(bool given) { ++(given ? takes_.given : takes_.refused); }

void KeptStore::LeaveCache(int64_t bytes) {
  Charge(-bytes);
  Cached(-bytes);
}

bool KeptStore::ChargeInUse(int64_t delta) {
  if (Charge(delta)) return true;
  if (count_ - cached_ + delta > budget_) return false;  // no trim would make room
  for (auto& [type, cache] : caches_) cache->Trim(delta);
  return Charge(delta);
}

void KeptStore::SetBudget(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ADJSH_CHECK(!shared_, "a shared kept store's budget is its key (KeptStore::Shared)");
  budget_ = std::max<int64_t>(bytes, 0);
  for (auto& [type, cache] : caches_) cache->Trim(0);
}

int64_t KeptStore::budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_;
}
int64_t KeptStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}
int64_t KeptStore::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
KeptTakes KeptStore::takes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return takes_;
}

bool KeptStore::TryCarry(int64_t bytes, int64_t reserve) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!CarryRoom(bytes, reserve)) return false;
  carried_ += bytes;
  return true;
}
bool KeptStore::CarryFits(int64_t bytes, int64_t reserve) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CarryRoom(bytes, reserve);
}
void KeptStore::EndCarry(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  carried_ -= bytes;
}
int64_t KeptStore::carried_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return carried_;
}
void KeptStore::CountCarryUse(bool by_summary, int64_t rows) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(by_summary ? takes_.carried_to_summary : takes_.carried_to_backward);
  takes_.carried_rows += rows;
}

int64_t KeptBytes() {
  Live& live = LiveStores();
  std::lock_guard<std::mutex> lock(live.mu);
  int64_t sum = 0;
  for (const KeptStore* s : live.stores) sum += s->bytes();
  return sum;
}


}  // namespace adjsh::cpu
