// This machine's sgemm rate through OpenBLAS, the yardstick for the engine's flop rate: one
// single-threaded GEMM per thread at the engine's shapes, (M, K) x (K, N) with M = 256 rows of a
// chunk, as many threads at once as the engine uses. Prints one JSON line.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "kernels/cpu/blas.h"

int main(int argc, char** argv) {
  adjsh::cli::ArgParser a("sgemm_rate",
                          "OpenBLAS sgemm GFLOP/s at a chunk's in_proj shape (256 x 1024 x 256), "
                          "one single-threaded GEMM per thread; one JSON line.");
  a.Add("threads", "N", "threads, each running its own GEMMs", "2");
  a.Add("seconds", "S", "how long to measure", "3");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  const auto threads = a.GetInt("threads", 1, 1024);
  const auto seconds = a.GetInt("seconds", 1, 3600);
  for (const auto* got : {&threads, &seconds})
    if (!got->ok()) return adjsh::cli::BadUsage("sgemm_rate", got->status());
  adjsh::cpu::InitBlasSingleThreaded();
  const int64_t M = 256, N = 1024, K = 256;  // a chunk through in_proj at D = 256
  std::atomic<int64_t> calls{0};
  std::vector<std::thread> pool;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < *threads; ++t) {
    pool.emplace_back([&] {
      std::vector<float> x(M * K, 0.5f), w(N * K, 0.25f), c(M * N);
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             double(*seconds)) {
        adjsh::cpu::Gemm<float>(adjsh::cpu::Trans::kNo, adjsh::cpu::Trans::kYes, M, N, K, 1,
                                x.data(), K, w.data(), K, 0, c.data(), N);
        ++calls;
      }
    });
  }
  for (auto& t : pool) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"threads\": %lld, \"sgemm_gflop_per_s\": %.2f}\n",
              static_cast<long long>(*threads), 2.0 * M * N * K * calls.load() / s / 1e9);
  return 0;
}
