// The host-emulated device's own strictness (tests/cuda/emulated_device.h, emulated_memory.h)
// and the context's pinned staging (kernels/cuda/staging.cu), on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <vector>

#include "tests/cuda/emulated_device.h"

namespace adjsh {
namespace {

// The emulated device refuses what a GPU would: launches with a zero dimension, more than 1024
// threads per block, or (the emulation's own limit) a multi-dimensional block, each naming the
// kernel; and its fresh memory is NaN bytes, not zeros, so a read of what nothing wrote shows.
TEST(StrictEmulationTest, BadLaunchesAreRefusedAndFreshMemoryIsPoisoned) {
  auto nothing = [] {};
  EXPECT_DEATH(emulation::Launch("k0", dim3(0), dim3(32), nothing),
               "launch of k0 refused.*zero grid or block dimension");
  EXPECT_DEATH(emulation::Launch("k1", dim3(4), dim3(0), nothing), "zero grid or block dimension");
  EXPECT_DEATH(emulation::Launch("k2", dim3(1), dim3(2048), nothing), "more than 1024 threads");
  EXPECT_DEATH(emulation::Launch("k3", dim3(1), dim3(8, 2), nothing), "one-dimensional blocks");
  int ran = 0;
  emulation::Launch("count", dim3(3), dim3(1), [&] { ++ran; });
  EXPECT_EQ(ran, 3);
  cuda::Context& ctx = cuda::Context::Get(0);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  float* fresh = static_cast<float*>(ctx.Alloc(4 * sizeof(float)));
  std::vector<float> seen(4, 0.0f);
  ctx.Download(seen.data(), fresh, 4 * sizeof(float));
  ctx.Sync();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(seen[i])) << i;
  ctx.Free(fresh, 4 * sizeof(float));
}

// Device memory is not the host's: host code that reads or writes a device pointer outside a
// kernel, GEMM or copy dies naming what it did (a planted read and a planted write), while the
// same bytes move through a copy, and a kernel reads them. A copy whose host side is pageable
// (a GPU's asynchronous copy would wait), whose device side is no allocation, or which touches
// mapped host memory (only kernels reach it in the stream's order) is refused.
TEST(StrictEmulationTest, HostAccessToDeviceMemoryFaultsAndCopiesAreChecked) {
  cuda::Context& ctx = cuda::Context::Get(0);
  std::unique_lock<std::mutex> lock(ctx.mutex());
  float* dev = static_cast<float*>(ctx.Alloc(64 * sizeof(float)));
  const std::vector<float> up(64, 2.5f);
  ctx.Upload(dev, up.data(), up.size() * sizeof(float));
  ctx.Sync();
  float sum = 0;
  emulation::Launch("sum", dim3(1), dim3(1), [&] {
    for (int i = 0; i < 64; ++i) sum += dev[i];
  });
  EXPECT_EQ(sum, 160.0f);
  volatile float* planted = dev;
  EXPECT_DEATH((void)planted[3], "host code read or wrote device memory outside a kernel");
  EXPECT_DEATH(planted[5] = 1.0f, "host code read or wrote device memory outside a kernel");
  std::vector<float> pageable(64);
  EXPECT_DEATH(emulation::Memcpy(pageable.data(), dev, 256, cudaMemcpyDeviceToHost),
               "host destination is pageable");
  EXPECT_DEATH(emulation::Memcpy(dev, pageable.data(), 256, cudaMemcpyHostToDevice),
               "host source is pageable");
  EXPECT_DEATH(emulation::Memcpy(dev, pageable.data(), 256, cudaMemcpyDeviceToDevice),
               "device source is not inside one device allocation");
  EXPECT_DEATH(emulation::Memcpy(dev + 32, dev, 200, cudaMemcpyDeviceToDevice),
               "device destination is not inside one device allocation");
  // Rows past the device budget (mapped host memory) are reached by kernels only.
  void* mapped = nullptr;
  ASSERT_EQ(emulation::HostAlloc(&mapped, 256, cudaHostAllocMapped), cudaSuccess);
  EXPECT_DEATH(emulation::Memcpy(mapped, dev, 256, cudaMemcpyDeviceToDevice),
               "mapped host memory, which only kernels reach");
  EXPECT_DEATH(emulation::Memset(mapped, 0, 256), "outside one device allocation");
  EXPECT_TRUE(std::isnan(static_cast<float*>(mapped)[0]));  // fresh, as device memory is
  ASSERT_EQ(emulation::FreeHost(mapped), cudaSuccess);
  ctx.Free(dev, 64 * sizeof(float));
}

// Context's pinned staging: an upload has read its pageable source when it returns; a download
// lands at the next Sync, not before; the staging grows to what the copies between two syncs
// move and is kept for the next; more than kStagingCap between two syncs costs one wait per
// cap's worth, a copy larger than the cap arrives whole, and the buffers it outgrew are freed.
TEST(ContextStagingTest, StagedCopiesLandAtSyncAndTheStagingIsKept) {
  cuda::Context& ctx = cuda::Context::Get(0);
  std::lock_guard<std::mutex> lock(ctx.mutex());
  const size_t n = 1000;
  float* dev = static_cast<float*>(ctx.Alloc(n * sizeof(float)));
  std::vector<float> src(n), back(n, 0.0f);
  std::iota(src.begin(), src.end(), 0.0f);
  auto round_trip = [&] {
    ctx.Upload(dev, src.data(), n * sizeof(float));
    const std::vector<float> sent = src;
    std::fill(src.begin(), src.end(), -1.0f);  // the source is free once Upload returns
    std::fill(back.begin(), back.end(), 0.0f);
    ctx.Download(back.data(), dev, n * sizeof(float));
    EXPECT_EQ(back[7], 0.0f);  // not landed yet
    ctx.Sync();
    EXPECT_EQ(back, sent);
    src = sent;
  };
  round_trip();
  const int64_t allocs = emulation::pinned_allocs;
  const size_t staging = ctx.staging_bytes();
  EXPECT_GE(staging, 2 * n * sizeof(float));
  const DeviceTraffic before = cuda::ThreadTraffic();
  round_trip();
  const DeviceTraffic d = cuda::ThreadTraffic() - before;
  EXPECT_EQ(emulation::pinned_allocs, allocs);  // kept
  EXPECT_EQ(d.syncs, 1u);
  EXPECT_EQ(d.h2d_copies, 1u);
  EXPECT_EQ(d.d2h_copies, 1u);
  ctx.Free(dev, n * sizeof(float));

  // Past the cap: (cap + 4 KiB) up and down. Up: the cap's piece, then a wait for the rest;
  // down: a wait, the cap's piece, a wait, the rest; then Sync: 4 waits, 2 copies each way.
  const size_t cap = cuda::Context::kStagingCap, big = cap / sizeof(float) + 1024;
  float* large = static_cast<float*>(ctx.Alloc(big * sizeof(float)));
  std::vector<float> up(big), down(big, 0.0f);
  for (size_t k = 0; k < big; ++k) up[k] = static_cast<float>(k % 9973) - 17.0f;
  const int64_t live = emulation::pinned_live_bytes;
  const DeviceTraffic start = cuda::ThreadTraffic();
  ctx.Upload(large, up.data(), big * sizeof(float));
  ctx.Download(down.data(), large, big * sizeof(float));
  ctx.Sync();
  const DeviceTraffic moved = cuda::ThreadTraffic() - start;
  EXPECT_EQ(down, up);
  EXPECT_EQ(moved.syncs, 4u);
  EXPECT_EQ(moved.h2d_copies, 2u);
  EXPECT_EQ(moved.d2h_copies, 2u);
  EXPECT_EQ(moved.h2d_bytes, big * sizeof(float));
  EXPECT_EQ(ctx.staging_bytes(), cap);  // grown to the cap, one buffer
  EXPECT_EQ(emulation::pinned_live_bytes, live - static_cast<int64_t>(staging) +
                                              static_cast<int64_t>(cap));
  ctx.Free(large, big * sizeof(float));
}

// A partial's finiteness is checked where it is (kernels/row_space.h MarkNonFinite, what a
// resident worker does before its partials go into the tree): a NaN or an Inf anywhere sets the
// flag, finite values leave it as it was, and one float comes down at the sync.
TEST(DeviceRowsTest, MarkNonFiniteFlagsNaNAndInfWhereTheyAre) {
  const size_t n = 5000;  // several blocks of threads
  float* x = cuda::RowsAlloc(0, n);
  float* flag = cuda::RowsAlloc(0, 1);
  std::vector<float> v(n, 1.5f);
  auto check = [&](float start) {
    cuda::RowsUpload(0, x, v.data(), n);
    cuda::RowsUpload(0, flag, &start, 1);
    cuda::RowsMarkNonFinite(0, flag, x, n);
    float got = -1.0f;
    cuda::RowsDownload(0, &got, flag, 1);
    cuda::RowsFinish(0);
    return got;
  };
  EXPECT_EQ(check(0.0f), 0.0f);
  EXPECT_EQ(check(1.0f), 1.0f);  // left as it was
  v[n - 1] = std::nanf("");
  EXPECT_EQ(check(0.0f), 1.0f);
  v[n - 1] = 1.5f;
  v[0] = -INFINITY;
  EXPECT_EQ(check(0.0f), 1.0f);
  v[0] = 3.4e38f;  // finite, however large
  EXPECT_EQ(check(0.0f), 0.0f);
  cuda::RowsFinish(0);
  cuda::RowsFree(0, x, n);
  cuda::RowsFree(0, flag, 1);
}

// Token ids cross at 2 B each and are widened where they are (RowSpace::WidenIds): an odd count
// (the last float half used), the largest id, and the widened ids exactly the uint32 ones.
TEST(DeviceRowsTest, WidenIdsGivesTheUint32Ids) {
  const size_t n = 4097;
  std::vector<uint16_t> narrow(n + 1, 0);
  std::vector<uint32_t> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = narrow[i] = static_cast<uint16_t>((i * 40503u) ^ i);
  narrow[n - 1] = 65535, want[n - 1] = 65535;
  float* packed = cuda::RowsAlloc(0, (n + 1) / 2);
  float* ids = cuda::RowsAlloc(0, n);
  cuda::RowsUpload(0, packed, reinterpret_cast<const float*>(narrow.data()), (n + 1) / 2);
  cuda::RowsWidenIds(0, ids, packed, n);
  std::vector<uint32_t> got(n, 7);
  cuda::RowsDownload(0, reinterpret_cast<float*>(got.data()), ids, n);
  cuda::RowsFinish(0);
  EXPECT_EQ(got, want);
  cuda::RowsFree(0, packed, (n + 1) / 2);
  cuda::RowsFree(0, ids, n);
}

}  // namespace
}  // namespace adjsh
