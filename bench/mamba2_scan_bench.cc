// The two forms of the Mamba-2 scan (kernels/cpu/mamba2_scan.h), timed on the same inputs, one
// thread: for each chunk row count, the forward (with outputs), the states-only sweep, the
// backward and the adjoint, in the plain and the block form in turn, repeated until each has
// run `seconds`. One JSON line per row count and part, with both times per call and their
// ratio; docs/BENCHMARKS.md "The block form of the scan" has the results and the command.
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "kernels/cpu/mamba2_scan.h"
#include "kernels/cpu/blas.h"

namespace {

using adjsh::Mamba2ScanForm;

// Seconds per call of f, run for about `seconds` after one warm-up call.
double PerCall(const std::function<void()>& f, double seconds) {
  f();
  const auto start = std::chrono::steady_clock::now();
  int64_t calls = 0;
  double s = 0;
  do {
    f();
    ++calls;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (s < seconds);
  return s / double(calls);
}

struct Inputs {
  adjsh::Mamba2Dims d;
  int64_t L;
  std::vector<float> dt, xbc, A, Dskip, S0, dy;
  Inputs(const adjsh::Mamba2Config& c, int64_t rows) : d(c), L(rows) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1), pos(0.001f, 0.1f);
    dt.resize(L * d.H), xbc.resize(L * d.Cc), A.resize(d.H), Dskip.resize(d.H);
    S0.resize(d.H * d.P * d.N), dy.resize(L * d.Di);
    for (float& x : dt) x = pos(rng);
    for (auto* v : {&xbc, &Dskip, &S0, &dy})
      for (float& x : *v) x = u(rng);
    for (int64_t h = 0; h < d.H; ++h) A[h] = -1.0f - float(h) / float(d.H);
  }
  adjsh::Mamba2ScanRows<float> Rows() const {
    return {&d, L, dt.data(), xbc.data(), A.data(), Dskip.data()};
  }
};

void Bench(const adjsh::Mamba2Config& c, int64_t L, double seconds) {
  const Inputs in(c, L);
  const adjsh::Mamba2Dims& d = in.d;
  std::vector<float> S, y(L * d.Di), carry, dxbc(L * d.Cc), ddt(L * d.H), dA(d.H), dD(d.H);
  const char* parts[] = {"forward", "states", "backward", "adjoint"};
  for (int part = 0; part < 4; ++part) {
    double t[2];
    for (int f = 0; f < 2; ++f) {
      const Mamba2ScanForm form = f == 0 ? Mamba2ScanForm::kPlain : Mamba2ScanForm::kBlocks;
      t[f] = PerCall(
          [&] {
            S = in.S0, carry = in.S0;
            if (part == 0) adjsh::Mamba2ScanForward(form, in.Rows(), S.data(), y.data());
            if (part == 1) adjsh::Mamba2ScanForward<float>(form, in.Rows(), S.data(), nullptr);
            if (part == 2)
              adjsh::Mamba2ScanBackward(form, in.Rows(), in.S0.data(), in.dy.data(),
                                        carry.data(), dxbc.data(), ddt.data(), dA.data(),
                                        dD.data());
            if (part == 3) adjsh::Mamba2ScanAdjoint(form, in.Rows(), in.dy.data(), carry.data());
          },
          seconds);
    }
    std::printf(
        "{\"rows\": %ld, \"part\": \"%s\", \"heads\": %ld, \"head_dim\": %ld, \"state\": %ld, "
        "\"groups\": %ld, \"plain_us\": %.1f, \"blocks_us\": %.1f, \"plain_over_blocks\": "
        "%.2f, \"used\": \"%s\"}\n",
        long(L), parts[part], long(d.H), long(d.P), long(d.N), long(d.G), t[0] * 1e6,
        t[1] * 1e6, t[0] / t[1],
        adjsh::Mamba2ScanFormFor(L) == Mamba2ScanForm::kBlocks ? "blocks" : "plain");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  adjsh::cli::ArgParser a("mamba2_scan_bench",
                          "The Mamba-2 scan's plain and block forms on the same inputs "
                          "(1 thread, f32); JSON lines.");
  a.Add("rows", "LIST", "chunk row counts, comma-separated", "8,16,32,64,128,256");
  a.Add("heads", "H", "heads", "16");
  a.Add("head-dim", "P", "head_dim", "32");
  a.Add("state-size", "N", "state size", "64");
  a.Add("groups", "G", "groups (dividing heads)", "1");
  a.Add("seconds", "S", "time per measurement", "1");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "mamba2_scan_bench: %s\n", m.c_str());
    return 2;
  };
  int64_t v[5];
  const char* names[5] = {"heads", "head-dim", "state-size", "groups", "seconds"};
  for (int k = 0; k < 5; ++k) {
    const auto got = a.GetInt(names[k], 1, 4096);
    if (!got.ok()) return fail(std::string(got.status().message()));
    v[k] = *got;
  }
  if (v[0] % v[3] != 0) return fail("--groups must divide --heads");
  std::vector<int64_t> rows;
  for (const absl::string_view s : absl::StrSplit(a.Get("rows"), ',')) {
    int64_t r = 0;
    if (!absl::SimpleAtoi(s, &r) || r < 1 || r > 65536)
      return fail("--rows: not a list of counts in [1, 65536]: " + a.Get("rows"));
    rows.push_back(r);
  }
  adjsh::Mamba2Config c;
  c.num_heads = v[0], c.head_dim = v[1], c.state_size = v[2], c.n_groups = v[3];
  c.expand = 2, c.hidden_size = v[0] * v[1] / 2;
  if (c.hidden_size * 2 != v[0] * v[1]) return fail("heads x head-dim must be even");
  adjsh::cpu::InitBlasSingleThreaded();
  for (int64_t L : rows) Bench(c, L, double(v[4]));
  return 0;
}
