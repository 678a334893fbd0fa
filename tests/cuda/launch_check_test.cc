// ADJSH_LAUNCH's check (kernels/cuda/launch.cuh): a launch that fails aborts naming its kernel
// (on any machine: without a GPU every launch fails); ADJSH_CUDA_SYNC is read once; and, where
// there is a GPU, ADJSH_CUDA_SYNC=1 passes a good launch and names a kernel that faults on the
// device, which without it would only surface at a later sync, naming nothing. The
// environment is set inside death-test children (threadsafe style: each re-runs its test from
// the start), since the process reads it once.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda/launch.cuh"

namespace adjsh::cuda::testing {
bool FillOnDevice(int n, int v);
void WriteThroughNull();
void LaunchTooManyThreads();
}  // namespace adjsh::cuda::testing

namespace adjsh::cuda {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class LaunchCheckTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(LaunchCheckTest, SyncIsReadOnceFromTheEnvironment) {
  EXPECT_EXIT(
      {
        setenv("ADJSH_CUDA_SYNC", "1", 1);
        const bool first = SyncEveryLaunch();
        setenv("ADJSH_CUDA_SYNC", "0", 1);
        std::exit(first && SyncEveryLaunch() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "ADJSH_CUDA_SYNC=1: the device is synchronised");
  for (const char* off : {"", "0"}) {
    EXPECT_EXIT(
        {
          setenv("ADJSH_CUDA_SYNC", off, 1);
          std::exit(SyncEveryLaunch() ? 1 : 0);
        },
        ::testing::ExitedWithCode(0), "")
        << "ADJSH_CUDA_SYNC='" << off << "'";
  }
}

TEST_F(LaunchCheckTest, AFailedLaunchNamesItsKernel) {
  for (const char* sync : {"0", "1"}) {
    EXPECT_DEATH(
        {
          setenv("ADJSH_CUDA_SYNC", sync, 1);
          testing::LaunchTooManyThreads();
        },
        "launch_check_kernels.cu:[0-9]+: CUDA error launching kernel FillKernel: ")
        << "ADJSH_CUDA_SYNC=" << sync;
  }
}

TEST_F(LaunchCheckTest, SyncPassesAGoodLaunch) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(testing::FillOnDevice(1000, 7));
  EXPECT_EXIT(
      {
        setenv("ADJSH_CUDA_SYNC", "1", 1);
        std::exit(testing::FillOnDevice(1000, 7) && SyncEveryLaunch() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "ADJSH_CUDA_SYNC=1");
}

TEST_F(LaunchCheckTest, SyncNamesTheKernelThatFaulted) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  EXPECT_DEATH(
      {
        setenv("ADJSH_CUDA_SYNC", "1", 1);
        testing::WriteThroughNull();
      },
      "launch_check_kernels.cu:[0-9]+: CUDA error in kernel WriteThroughNullKernel "
      "\\(ADJSH_CUDA_SYNC");
  // Without it, the launch itself succeeds: the fault shows only at the next sync, unnamed.
  EXPECT_EXIT(
      {
        setenv("ADJSH_CUDA_SYNC", "0", 1);
        testing::WriteThroughNull();
        std::exit(cudaDeviceSynchronize() != cudaSuccess ? 3 : 0);
      },
      ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace adjsh::cuda
