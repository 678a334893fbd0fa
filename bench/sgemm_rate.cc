// This machine's sgemm rate through OpenBLAS, the yardstick for the engine's flop rate: one
// single-threaded GEMM per thread at the engine's shapes, (M, K) x (K, N) with M = 256 rows of a
// chunk, as many threads at once as the engine uses.
//   sgemm_rate [threads] [seconds]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/cpu/blas.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 3.0;
  adjsh::cpu::InitBlasSingleThreaded();
  const int64_t M = 256, N = 1024, K = 256;  // a chunk through in_proj at D = 256
  std::atomic<int64_t> calls{0};
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             seconds) {
        adjsh::cpu::Gemm<float>(adjsh::cpu::Trans::kNo, adjsh::cpu::Trans::kYes, M, N, K, 1,
                                a.data(), K, b.data(), K, 0, c.data(), N);
        ++calls;
      }
    });
  }
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"threads\": %d, \"sgemm_gflop_per_s\": %.2f}\n", threads,
              2.0 * M * N * K * calls.load() / s / 1e9);
  return 0;
}
