// Rows past the device budget on the host-emulated device: the context's copies ahead on its
// second stream (kernels/cuda/context.h CopyAhead), and the resident space's reads of mapped rows
// through them, the next chunk's started while this one's are read
// (kernels/cuda/device_row_space.h DeviceRowSpace::ReadRows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/cuda/emulated_device.h"
#include "kernels/cuda/device_row_space.h"

namespace adjsh {
namespace {

// n floats of the device (fresh: NaN bytes) as the host sees them after a download.
std::vector<float> DownloadOf(cuda::Context& ctx, const float* dev, size_t n) {
  std::vector<float> seen(n);
  ctx.Download(seen.data(), dev, n * sizeof(float));
  ctx.Sync();
  return seen;
}

// A copy ahead lands when the stream waits for it, not before (a kernel that reads its
// destination without the wait reads what was there); a Sync lands it too; it is counted as an
// upload; its source must be mapped rows and its destination device memory; a source changed
// while the copy was in flight is named.
TEST(CopyAheadTest, LandsAtTheWaitAndIsCounted) {
  cuda::Context& ctx = cuda::Context::Get(0);
  std::unique_lock<std::mutex> lock(ctx.mutex());
  constexpr size_t n = 16;
  float* dev = static_cast<float*>(ctx.Alloc(n * sizeof(float)));
  void* mapped = nullptr;
  ASSERT_EQ(emulation::HostAlloc(&mapped, n * sizeof(float), cudaHostAllocMapped), cudaSuccess);
  float* rows = static_cast<float*>(mapped);
  for (size_t i = 0; i < n; ++i) rows[i] = static_cast<float>(i) + 0.5f;

  const DeviceTraffic before = ctx.traffic();
  const uint64_t ticket = ctx.CopyAhead(dev, rows, n * sizeof(float));
  const DeviceTraffic after = ctx.traffic();
  EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, n * sizeof(float));
  EXPECT_EQ(after.h2d_copies - before.h2d_copies, 1u);
  float first = 0;
  emulation::Launch("read", dim3(1), dim3(1), [&] { first = dev[3]; });
  EXPECT_TRUE(std::isnan(first)) << "read before the wait: " << first;
  ctx.AwaitCopy(ticket);
  emulation::Launch("read", dim3(1), dim3(1), [&] { first = dev[3]; });
  EXPECT_EQ(first, 3.5f);
  ctx.AwaitCopy(ticket);  // once is all: a second wait is a no-op

  rows[0] = -1.0f;
  ctx.CopyAhead(dev, rows, n * sizeof(float));
  // A download queued without the wait need not see it (it did not wait for the copy); work
  // after a Sync does.
  EXPECT_EQ(DownloadOf(ctx, dev, n)[0], 0.5f);
  EXPECT_EQ(DownloadOf(ctx, dev, n)[0], -1.0f);

  const uint64_t changed = ctx.CopyAhead(dev, rows, n * sizeof(float));
  rows[5] = 7.0f;
  EXPECT_DEATH(ctx.AwaitCopy(changed), "changed while the copy was in flight");
  ctx.DropCopy(changed);  // forgotten: nothing checks it again
  ctx.Sync();

  std::vector<float> pageable(n);
  EXPECT_DEATH(ctx.CopyAhead(dev, pageable.data(), n * sizeof(float)), "not mapped host memory");
  EXPECT_DEATH(ctx.CopyAhead(pageable.data(), rows, n * sizeof(float)),
               "destination is not inside one device allocation");
  ASSERT_EQ(emulation::FreeHost(mapped), cudaSuccess);
  ctx.Free(dev, n * sizeof(float));
}

// With a budget of 0 every buffer that may spill is mapped host memory, and the rest device
// memory. ReadRows gives a device copy of mapped rows, equal to them, and starts the next
// range's copy at once: a reader walking the chunks copies each once (one copy ahead per call
// after the first two), whichever way it walks; device rows are read where they are.
TEST(DeviceRowSpaceTest, ReadsMappedRowsThroughCopiesAheadOfTheReader) {
  constexpr size_t kChunk = 24, kChunks = 5, n = kChunk * kChunks;
  cuda::DeviceRowSpace space(0, /*budget=*/0);
  cuda::Context& ctx = cuda::Context::Get(0);
  RowBuffer<float> rows(space, n, /*may_spill=*/true), sums(space, kChunk);
  ASSERT_TRUE(emulation::IsMapped(rows.data(), n * sizeof(float)));
  ASSERT_TRUE(emulation::DeviceArena::Get().Contains(sums.data(), kChunk * sizeof(float)));
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 97) * 0.25f;
  space.Upload(rows.data(), host.data(), n);
  EXPECT_EQ(space.ReadRows(sums.data(), kChunk, &host, nullptr, 0), sums.data());

  std::vector<float> key;  // a reader's scratch: its staging
  for (bool forward : {true, false}) {
    SCOPED_TRACE(forward ? "ascending" : "descending");
    const uint64_t copies_before = ctx.traffic().h2d_copies;
    for (size_t step = 0; step < kChunks; ++step) {
      const size_t c = forward ? step : kChunks - 1 - step;
      const bool last = step + 1 == kChunks;
      const size_t next = forward ? c + 1 : c - 1;
      const float* at = space.ReadRows(rows.data() + c * kChunk, kChunk, &key,
                                       last ? nullptr : rows.data() + next * kChunk, kChunk);
      ASSERT_NE(at, rows.data() + c * kChunk);
      space.Copy(sums.data(), at, kChunk);  // a kernel reads the copy
      std::vector<float> seen(kChunk);
      space.Download(seen.data(), sums.data(), kChunk);
      space.Finish();
      for (size_t i = 0; i < kChunk; ++i) ASSERT_EQ(seen[i], host[c * kChunk + i]) << c << " " << i;
    }
    // Each chunk copied once: the first call copies its own rows and the next, later ones only
    // the next (the downloads of the check add none).
    EXPECT_EQ(ctx.traffic().h2d_copies - copies_before, kChunks);
  }
}

// A reader thread's staging goes when the thread ends (at the space's next Finish): a step's
// threads are made anew each step, and the device memory held comes back to where it was.
TEST(DeviceRowSpaceTest, AnEndedReadersStagingIsFreed) {
  constexpr size_t n = 64;
  cuda::DeviceRowSpace space(0, /*budget=*/0);
  cuda::Context& ctx = cuda::Context::Get(0);
  RowBuffer<float> rows(space, 2 * n, /*may_spill=*/true);
  const std::vector<float> host(2 * n, 1.5f);
  space.Upload(rows.data(), host.data(), 2 * n);
  const int64_t held = ctx.held_bytes();
  for (int step = 0; step < 3; ++step) {
    std::thread reader([&] {
      thread_local std::vector<float> scratch;
      space.ReadRows(rows.data(), n, &scratch, rows.data() + n, n);
      space.ReadRows(rows.data() + n, n, &scratch, nullptr, 0);
      space.Finish();
    });
    reader.join();
    EXPECT_GT(ctx.held_bytes(), held) << "the ended reader's two buffers, until the next Finish";
    space.Finish();
    EXPECT_EQ(ctx.held_bytes(), held) << step;
  }
}

}  // namespace
}  // namespace adjsh
