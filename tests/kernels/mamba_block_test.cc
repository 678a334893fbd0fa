// The CPU Mamba block's chunk summaries against its full forward, bit for bit: LocalSummary
// (kernels/cpu/mamba_block.h) computes only the x half of in_proj, which must give the same x,
// so its h_local is the end state of Forward from a zero state, and its S the sum of Delta.
// And the sets a summary keeps for the pass after it, and those Forward carries on to the
// layer's AdjointSummary or Backward: each pass gives the bits it gives without them, and the
// pool hands none out past its store's budget (kernels/cpu/kept_pool.h), each store its own.
#include "kernels/cpu/mamba_block.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "common/model.h"
#include "kernels/cpu/kept_pool.h"
#include "kernels/cpu/kept_spares.h"
#include "tests/kernels/test_util.h"

namespace adjsh::cpu {
namespace {

template <typename T>
void CheckSummaryIsForwardFromZero(int64_t D, int64_t N, int64_t len) {
  const MambaConfig c = testing::SmallConfig(1, D, N);
  const ModelParams<T> params = InitParams<T>(c, 5);
  const MambaBlockCpu<T> block(c, params.layers[0]);
  const int64_t Di = c.inner(), halo = c.conv_kernel - 1;
  std::mt19937_64 rng(9);
  std::normal_distribution<double> g(0, 1);
  std::vector<T> u((halo + len) * D);
  for (auto& e : u) e = T(g(rng));
  std::vector<T> h_local(Di * N), S(Di), zeros(Di * N, T(0)), u_next(len * D), h_end(Di * N);
  block.LocalSummary(u.data(), {halo, len, 0}, h_local.data(), S.data());
  block.Forward(u.data(), {halo, len, 0}, zeros.data(), u_next.data(), h_end.data());
  EXPECT_EQ(std::memcmp(h_local.data(), h_end.data(), h_end.size() * sizeof(T)), 0);
}

TEST(MambaBlockCpuTest, LocalSummaryIsTheForwardFromAZeroState) {
  CheckSummaryIsForwardFromZero<float>(64, 16, 256);  // the engine's usual shapes
  CheckSummaryIsForwardFromZero<float>(10, 5, 37);    // channels past the last block of 8
  CheckSummaryIsForwardFromZero<double>(24, 16, 100);
}

template <typename T>
bool Same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Forward and Backward given the set their summary kept, against both recomputing.
template <typename T>
void CheckKeptSetsGiveTheSameBits(int64_t D, int64_t N, int64_t halo, int64_t len) {
  const MambaConfig c = testing::SmallConfig(1, D, N);
  const ModelParams<T> params = InitParams<T>(c, 7);
  KeptStore store;  // fresh sets: no arrays recycled from other shapes
  const MambaBlockCpu<T> block(c, params.layers[0], &store);
  const int64_t Di = c.inner();
  const ChunkRows rows{halo, len, 0};
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd(0, 1);
  auto random = [&](int64_t n) {
    std::vector<T> v(n);
    for (auto& e : v) e = T(nd(rng));
    return v;
  };
  const std::vector<T> u = random((halo + len) * D), h0 = random(Di * N), mu = random(Di * N),
                       g = random(len * D);
  // The forward: LocalSummary keeps, Forward from the kept set and from scratch.
  std::vector<T> hl1(Di * N), S1(Di), hl2(Di * N), S2(Di);
  typename MambaBlockCpu<T>::KeptPtr kept = block.MakeKept(rows);
  ASSERT_NE(kept, nullptr);
  block.LocalSummary(u.data(), rows, hl1.data(), S1.data(), kept.get());
  block.LocalSummary(u.data(), rows, hl2.data(), S2.data());
  EXPECT_TRUE(Same(hl1, hl2) && Same(S1, S2));
  std::vector<T> y1(len * D), e1(Di * N), y2(len * D), e2(Di * N);
  KeptSpares<T, 4>& spares = store.CacheOf<KeptSpares<T, 4>>();
  const int64_t puts = spares.counts().put;
  block.Forward(u.data(), rows, h0.data(), y1.data(), e1.data(), kept.get());
  // Carried, it gave up n, x' and Delta (refilled when taken) to the spares.
  EXPECT_EQ(spares.counts().put - puts, 3);
  block.Forward(u.data(), rows, h0.data(), y2.data(), e2.data());
  EXPECT_TRUE(Same(y1, y2)) << "u_next";
  EXPECT_TRUE(Same(e1, e2)) << "h_end";
  // The set goes on, carried (the budget has room), and a second set of the rows is carried
  // straight to a Backward, as in a span with no AdjointSummary (span 0).
  EXPECT_TRUE(block.Carries(kept.get(), rows));
  typename MambaBlockCpu<T>::KeptPtr straight = block.MakeKept(rows);
  ASSERT_NE(straight, nullptr);
  block.LocalSummary(u.data(), rows, hl1.data(), S1.data(), straight.get());
  block.Forward(u.data(), rows, h0.data(), y1.data(), e1.data(), straight.get());
  EXPECT_TRUE(block.Carries(straight.get(), rows));
  const int64_t carried = store.carried_bytes();
  EXPECT_GT(carried, 0);
  // Each holds only what cannot be refilled (55-58% of a whole set at these shapes, over 80%
  // with n, x' and Delta), the rest among the spares: the two, under 6/5 of one whole set.
  EXPECT_LT(carried * 5, block.SetBytes(rows) * 6) << "carried sets kept what they could refill";
  // A Forward with no LocalSummary before it (a span schedule's last span) recomputes into a
  // fresh set and carries it too, with the same bits; none is made where no backward follows
  // or the carry would leave no room for the summaries' sets.
  EXPECT_EQ(block.MakeKeptToCarry(rows, -1), nullptr);
  EXPECT_EQ(block.MakeKeptToCarry(rows, store.budget() / block.SetBytes(rows) + 1), nullptr);
  typename MambaBlockCpu<T>::KeptPtr fresh = block.MakeKeptToCarry(rows, 1);
  ASSERT_NE(fresh, nullptr);
  block.Forward(u.data(), rows, h0.data(), y1.data(), e1.data(), fresh.get(), 1);
  EXPECT_TRUE(Same(y1, y2) && Same(e1, e2)) << "Forward into a fresh set";
  EXPECT_TRUE(block.Carries(fresh.get(), rows));
  {  // with room_for < 0 (a forward-only plan) a Forward carries nothing, with the same bits
    typename MambaBlockCpu<T>::KeptPtr set = block.MakeKept(rows);
    ASSERT_NE(set, nullptr);
    std::vector<T> y3(len * D), e3(Di * N);
    block.Forward(u.data(), rows, h0.data(), y3.data(), e3.data(), set.get(), -1);
    EXPECT_FALSE(block.Carries(set.get(), rows));
    EXPECT_TRUE(Same(y3, y2) && Same(e3, e2)) << "Forward with room_for < 0";
  }
  std::vector<T> m3(Di * N), S3(Di);
  block.AdjointSummary(u.data(), rows, g.data(), m3.data(), S3.data(), fresh.get());
  // The backward: AdjointSummary takes the carried set (no recompute) and keeps it for
  // Backward, which runs from it.
  std::vector<T> m1(Di * N), m2(Di * N);
  block.AdjointSummary(u.data(), rows, g.data(), m1.data(), S1.data(), kept.get());
  block.AdjointSummary(u.data(), rows, g.data(), m2.data(), S2.data());
  EXPECT_TRUE(Same(m1, m2) && Same(S1, S2)) << "adjoint summary";
  EXPECT_TRUE(Same(m3, m2) && Same(S3, S2)) << "adjoint summary from a fresh set";
  EXPECT_FALSE(block.Carries(kept.get(), rows));
  EXPECT_LT(store.carried_bytes(), carried);
  LayerParams<T> g1 = ZeroLayer<T>(c), g2 = ZeroLayer<T>(c), g3 = ZeroLayer<T>(c),
                 g4 = ZeroLayer<T>(c);
  std::vector<T> du1(len * D), dh1(halo * D), mo1(Di * N), du2(len * D), dh2(halo * D),
      mo2(Di * N);
  block.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g1, du1.data(), dh1.data(),
                 mo1.data(), kept.get());
  block.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g2, du2.data(), dh2.data(),
                 mo2.data());
  EXPECT_TRUE(Same(du1, du2)) << "du";
  EXPECT_TRUE(Same(dh1, dh2)) << "du_halo";
  EXPECT_TRUE(Same(mo1, mo2)) << "mu_out";
  std::vector<T> du4(len * D), dh4(halo * D), mo4(Di * N);
  block.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g4, du4.data(), dh4.data(),
                 mo4.data(), fresh.get());
  fresh.reset();
  EXPECT_TRUE(Same(du4, du2) && Same(dh4, dh2) && Same(mo4, mo2)) << "Backward from a fresh set";
  std::vector<T> du3(len * D), dh3(halo * D), mo3(Di * N);
  block.Backward(u.data(), rows, g.data(), h0.data(), mu.data(), 0, g3, du3.data(), dh3.data(),
                 mo3.data(), straight.get());
  EXPECT_FALSE(block.Carries(straight.get(), rows));
  straight.reset();
  kept.reset();
  EXPECT_EQ(store.carried_bytes(), 0);
  EXPECT_TRUE(Same(du3, du2) && Same(dh3, dh2) && Same(mo3, mo2)) << "Backward from a carried set";
  for (auto [x, y] : {std::pair{&g3.in_proj, &g2.in_proj}, std::pair{&g3.conv_w, &g2.conv_w},
                      std::pair{&g3.x_proj, &g2.x_proj}, std::pair{&g3.dt_w, &g2.dt_w},
                      std::pair{&g3.dt_b, &g2.dt_b}, std::pair{&g3.A_log, &g2.A_log},
                      std::pair{&g3.out_proj, &g2.out_proj}, std::pair{&g3.norm, &g2.norm}})
    EXPECT_TRUE(Same(*x, *y)) << "grad from a carried set";
  const std::vector<std::vector<T>*> a = {&g1.in_proj, &g1.conv_w, &g1.conv_b, &g1.x_proj,
                                          &g1.dt_w, &g1.dt_b, &g1.A_log, &g1.Dskip,
                                          &g1.out_proj, &g1.norm};
  const std::vector<std::vector<T>*> b = {&g2.in_proj, &g2.conv_w, &g2.conv_b, &g2.x_proj,
                                          &g2.dt_w, &g2.dt_b, &g2.A_log, &g2.Dskip,
                                          &g2.out_proj, &g2.norm};
  const std::vector<std::vector<T>*> f = {&g4.in_proj, &g4.conv_w, &g4.conv_b, &g4.x_proj,
                                          &g4.dt_w, &g4.dt_b, &g4.A_log, &g4.Dskip,
                                          &g4.out_proj, &g4.norm};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(Same(*a[i], *b[i])) << "grad tensor " << i;
    EXPECT_TRUE(Same(*f[i], *b[i])) << "grad tensor " << i << " from a fresh set";
  }
}

TEST(MambaBlockCpuTest, KeptSetsGiveTheSameBits) {
  CheckKeptSetsGiveTheSameBits<float>(64, 16, 3, 256);
  CheckKeptSetsGiveTheSameBits<float>(10, 5, 0, 37);  // the sequence's first chunk: no halo
  CheckKeptSetsGiveTheSameBits<double>(24, 16, 3, 100);
}

// A set is made for one summary and one chunk: the other pass, or other rows, are refused.
TEST(MambaBlockCpuDeathTest, AKeptSetOfOtherRowsIsRefused) {
  const MambaConfig c = testing::SmallConfig(1, 16, 4);
  const ModelParams<float> params = InitParams<float>(c, 7);
  KeptStore store;
  const MambaBlockCpu<float> block(c, params.layers[0], &store);
  const int64_t Di = c.inner(), N = 4;
  std::vector<float> u(20 * 16, 0.5f), h(Di * N), S(Di), out(20 * 16), h0(Di * N, 0.0f);
  MambaBlockCpu<float>::KeptPtr kept = block.MakeKept({3, 17, 0});
  ASSERT_NE(kept, nullptr);
  block.LocalSummary(u.data(), {3, 17, 0}, h.data(), S.data(), kept.get());
  EXPECT_DEATH(block.Forward(u.data(), {3, 16, 0}, h0.data(), out.data(), h.data(), kept.get()),
               "another chunk");
}

// A carried set whose backward finds no room in the budget to be whole again serves that pass
// (the same bits) but is not kept for the next: Backward then recomputes.
// A D = 64, N = 16 block and a chunk of 256 rows after 3 halo rows, for the sets' tests.
// Its sets in a store of their own: 64 MiB, nothing counted but the test's sets and spares.
struct BlockOf64 {
  static constexpr int64_t D = 64, N = 16, len = 256;
  const MambaConfig c = testing::SmallConfig(1, D, N);
  const ModelParams<float> params = InitParams<float>(c, 7);
  KeptStore store{int64_t{64} << 20};
  const MambaBlockCpu<float> block{c, params.layers[0], &store};
  const int64_t Di = c.inner();
  const ChunkRows rows{3, len, 0};
};

TEST(MambaBlockCpuTest, ACarriedSetWithNoRoomToGrowServesOnePass) {
  BlockOf64 b;
  const auto& [D, N, len, block, Di, rows] = std::tie(b.D, b.N, b.len, b.block, b.Di, b.rows);
  KeptStore& store = b.store;
  std::vector<float> u((3 + len) * D), g(len * D), h0(Di * N, 0.0f);
  for (size_t i = 0; i < u.size(); ++i) u[i] = 0.01f * float(i % 97) - 0.4f;
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.02f * float(i % 89) - 0.8f;
  MambaBlockCpu<float>::KeptPtr kept = block.MakeKept(rows);
  ASSERT_NE(kept, nullptr);
  std::vector<float> h(Di * N), S(Di), out(len * D), m1(Di * N), S1(Di), m2(Di * N), S2(Di);
  block.LocalSummary(u.data(), rows, h.data(), S.data(), kept.get());
  block.Forward(u.data(), rows, h0.data(), out.data(), h.data(), kept.get(), 1);
  ASSERT_TRUE(block.Carries(kept.get(), rows));
  // Taken by the budget's other users: a set counted as a whole one cannot be.
  store.SetBudget(store.bytes());
  block.AdjointSummary(u.data(), rows, g.data(), m1.data(), S1.data(), kept.get());
  EXPECT_FALSE(block.ReadyForBackward(kept.get(), rows));
  EXPECT_LE(store.bytes(), store.budget());
  kept.reset();
  block.AdjointSummary(u.data(), rows, g.data(), m2.data(), S2.data());
  EXPECT_TRUE(Same(m1, m2) && Same(S1, S2));
  EXPECT_EQ(store.carried_bytes(), 0);
}

// Sets handed back, and carried ones, leave their other arrays among the spares
// (kernels/cpu/kept_spares.h), and the next sets take them: after the first pass over a run of
// chunks, the same run frees no array and allocates none for them.
TEST(KeptPoolTest, HandedBackArraysAreTakenByTheNextSets) {
  BlockOf64 b;
  const auto& [D, N, len, block, Di, rows] = std::tie(b.D, b.N, b.len, b.block, b.Di, b.rows);
  KeptStore& store = b.store;
  std::vector<float> u((3 + len) * D, 0.25f), g(len * D, 0.5f), h(Di * N), S(Di), out(len * D),
      h0(Di * N, 0.0f), m(Di * N);
  using Spares = KeptSpares<float, 4>;
  Spares& spares = store.CacheOf<Spares>();
  auto run = [&] {  // four chunks' sets: kept, carried, then their backward summaries
    std::vector<MambaBlockCpu<float>::KeptPtr> sets;
    for (int i = 0; i < 4; ++i) {
      sets.push_back(block.MakeKept(rows));
      ASSERT_NE(sets.back(), nullptr);
      block.LocalSummary(u.data(), rows, h.data(), S.data(), sets.back().get());
      block.Forward(u.data(), rows, h0.data(), out.data(), h.data(), sets.back().get(), 1);
      ASSERT_TRUE(block.Carries(sets.back().get(), rows));
    }
    for (auto& k : sets) {
      block.AdjointSummary(u.data(), rows, g.data(), m.data(), S.data(), k.get());
      EXPECT_TRUE(block.ReadyForBackward(k.get(), rows));
      k.reset();
    }
  };
  run();
  const Spares::Counts first = spares.counts();
  run();
  const Spares::Counts second = spares.counts();
  EXPECT_EQ(second.freed, first.freed) << "arrays freed for the budget";
  EXPECT_GT(second.taken, first.taken) << "no set took a spare";
  EXPECT_EQ(second.put - first.put, second.taken - first.taken) << "arrays left behind";
  EXPECT_LE(store.bytes(), store.budget());
  store.SetBudget(0);
  EXPECT_EQ(store.bytes(), 0);  // the spares freed with the free lists
}

// The pool: sets within the budget only, handed back sets taken again, a lowered budget frees
// what the free list holds above it.
TEST(KeptPoolTest, SetsStayWithinTheBudgetAndAreReused) {
  const MambaConfig c = testing::SmallConfig(1, 64, 16);
  const ModelParams<float> params = InitParams<float>(c, 7);
  KeptStore store(0);
  const MambaBlockCpu<float> block(c, params.layers[0], &store);
  const ChunkRows rows{3, 256, 0};
  EXPECT_EQ(block.MakeKept(rows), nullptr);
  EXPECT_EQ(store.bytes(), 0);
  store.SetBudget(int64_t{8} << 20);  // a set of these rows is about 1.0 MB: eight fit
  std::vector<MambaBlockCpu<float>::KeptPtr> sets;
  const int64_t D = 64, Di = c.inner(), N = 16;
  std::vector<float> u((3 + 256) * D, 0.25f), g(256 * D, 0.5f), m(Di * N), S(Di);
  for (int i = 0; i < 20; ++i) {
    if (auto k = block.MakeKept(rows)) {
      block.AdjointSummary(u.data(), rows, g.data(), m.data(), S.data(), k.get());  // fills it
      sets.push_back(std::move(k));
    }
  }
  EXPECT_GE(sets.size(), 5u);
  EXPECT_LT(sets.size(), 20u);
  EXPECT_LE(store.bytes(), store.budget());
  const MambaBlockCpu<float>::Kept* first = sets.front().get();
  sets.erase(sets.begin());  // handed back
  MambaBlockCpu<float>::KeptPtr again = block.MakeKept(rows);
  EXPECT_EQ(again.get(), first);  // from the free list, not a new one
  again.reset();
  sets.clear();
  EXPECT_GT(store.bytes(), 0);  // on the free list, still counted
  store.SetBudget(0);
  EXPECT_EQ(store.bytes(), 0);  // all freed
}

// A recycled set is counted as what it may grow to while in use, not as what it held: the count
// never passes the budget.
struct Blob {
  std::vector<char> v;
  int64_t bytes() const { return static_cast<int64_t>(v.capacity()); }
};

TEST(KeptPoolTest, ARecycledSetIsCountedAsWhatItMayGrowTo) {
  KeptStore store(1000);
  KeptPool<Blob>& pool = store.Pool<Blob>();
  Blob* a = pool.Take(400);
  ASSERT_NE(a, nullptr);
  a->v.reserve(400);
  pool.Give(a);
  EXPECT_EQ(store.bytes(), 400);
  Blob* b = pool.Take(900);  // the same set, to grow to 900
  ASSERT_EQ(b, a);
  EXPECT_EQ(store.bytes(), 900);
  EXPECT_EQ(pool.Take(200), nullptr);  // 1100 would pass the budget
  b->v.reserve(900);
  const int64_t held = b->bytes();
  pool.Give(b);
  EXPECT_EQ(store.bytes(), held);
  EXPECT_LE(store.bytes(), 1000);
}

// Sets waiting on the free list never keep a take out: a take that would pass the budget frees
// them first (kept_pool.h ChargeInUse), the last handed back first, and one that could not fit
// even with all of them freed is refused with the free list as it was.
TEST(KeptPoolTest, WaitingSetsAreFreedForATakeThatWouldNotFit) {
  KeptStore store(1000);
  KeptPool<Blob>& pool = store.Pool<Blob>();
  std::vector<Blob*> sets;
  for (int i = 0; i < 3; ++i) {
    sets.push_back(pool.Take(300));
    ASSERT_NE(sets.back(), nullptr);
    sets.back()->v.reserve(300);
  }
  for (Blob* s : sets) pool.Give(s);
  ASSERT_EQ(store.bytes(), 900);  // all three wait on the free list
  Blob* grown = pool.Take(500);  // the last handed back, to grow by 200: 1100 without a trim
  ASSERT_EQ(grown, sets[2]);
  EXPECT_EQ(store.bytes(), 800);  // sets[1] freed, sets[0] still waits
  grown->v.reserve(500);
  pool.Give(grown);  // both wait: sets[0], then grown (500)
  ASSERT_EQ(store.bytes(), 800);
  EXPECT_EQ(pool.Take(2000), nullptr);  // 2000 past the budget even with both freed
  EXPECT_EQ(store.bytes(), 800);
  Blob* again = pool.Take(300);  // grown, still there
  EXPECT_EQ(again, grown);
  Blob* next = pool.Take(300);  // and sets[0]: the refused take freed neither
  EXPECT_EQ(next, sets[0]);
  pool.Give(next);
  pool.Give(again);
  store.SetBudget(0);
  EXPECT_EQ(store.bytes(), 0);
}

// Each store counts its own: two stores of different budgets share no bytes, takes, refusals
// or carried bytes, and a set goes back to the store it came from. Shared hands out one store
// per budget (the backends of one budget share it: kernels/backend.h Device::kept_budget).
TEST(KeptPoolTest, TwoStoresWithDifferentBudgetsShareNoCounts) {
  KeptStore small(500), large(5000);
  Blob* a = small.Pool<Blob>().Take(400);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(small.Pool<Blob>().Take(400), nullptr);  // 800 past the small budget
  Blob* b = large.Pool<Blob>().Take(400);            // the large one has its own room
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(small.bytes(), 400);
  EXPECT_EQ(large.bytes(), 400);
  EXPECT_EQ(small.takes().given, 1);
  EXPECT_EQ(small.takes().refused, 1);
  EXPECT_EQ(large.takes().given, 1);
  EXPECT_EQ(large.takes().refused, 0);
  EXPECT_GE(KeptBytes(), 800);  // the process's gauge sums every store
  ASSERT_TRUE(large.TryCarry(1000, 0));
  EXPECT_EQ(small.carried_bytes(), 0);
  EXPECT_FALSE(small.CarryFits(1000, 0));
  large.EndCarry(1000);
  large.CountCarryUse(true, 7);
  EXPECT_EQ(large.takes().carried_rows, 7);
  EXPECT_EQ(small.takes().carried_rows, 0);
  a->v.reserve(400);
  small.Pool<Blob>().Give(a);
  large.Pool<Blob>().Give(b);
  EXPECT_EQ(small.bytes(), 400);  // a waits on the small store's free list
  EXPECT_EQ(large.bytes(), 0);    // b held nothing
  EXPECT_EQ(small.peak_bytes(), 400);
  // Shared: one store per budget, another for another budget.
  const std::shared_ptr<KeptStore> s1 = KeptStore::Shared(12345), s2 = KeptStore::Shared(23456);
  EXPECT_EQ(KeptStore::Shared(12345), s1);
  EXPECT_NE(s1, s2);
  EXPECT_EQ(s1->budget(), 12345);
  EXPECT_EQ(s2->budget(), 23456);
  Blob* c = s1->Pool<Blob>().Take(100);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(s2->bytes(), 0);
  EXPECT_EQ(s2->takes().given, 0);
  s1->Pool<Blob>().Give(c);
}

}  // namespace
}  // namespace adjsh::cpu
