// One gradient step with the CUDA backend (kernels/cuda) on the host-emulated device
// (tests/cuda/emulated_device.h): the in-process span step of one model on `cuda:0`, which is
// what one GPU worker owning every span of the step runs.
//   --kernels skip (default)  what the step moves between the host and the GPU, counted by the
//                             device's Context (kernels/cuda/context.h: every copy, stream sync
//                             and allocation goes through it) with the kernels and GEMMs skipped
//                             (emulation::skip_kernels): which copies, syncs and allocations a
//                             call makes is decided by the host code above the device API, the
//                             same code a GPU runs, so the counts are a GPU's; the gradient's
//                             values are meaningless then.
//   --kernels run             the kernels emulated too (slow: small shapes), and the gradient
//                             compared with the CPU backend's on the same model and tokens.
// One JSON line: the shape, the step's tasks, the traffic in all (the device's own counts around
// the step: making the model on it included) and per token, syncs per task (all, and the most
// one task waited), the device memory the step held at its peak and the most rows it kept in
// mapped host memory past --row-budget-bytes (kernels/cuda/device_row_space.h DeviceRowSpace), the
// model's f32 bytes (one parameter upload, or one gradient download, of the step), and with
// --kernels run the loss of both, the gradient's relative L2 distance from
// the CPU's and a digest of its bytes (--threads: the step's threads, for bitwise checks).
// docs/BENCHMARKS.md "Host-device traffic of a GPU step" has the table and the command.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda/emulated_device.h"
#include "kernels/cuda/mamba2_block.cu"
// The backend's class, with its device checks under another name: this program's
// MakeCudaBackend below gives the emulated device, which has no CUDA device to count.
#define MakeCudaBackend MakeCudaBackendOnAGpu
#include "kernels/cuda/cuda_backend.cc"
#undef MakeCudaBackend

#include "absl/strings/str_format.h"
#include "cli/args.h"
#include "common/hash.h"
#include "common/mamba2_init.h"
#include "common/model.h"
#include "engine/families/families.h"

namespace adjsh::cuda {

absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device) {
  return std::unique_ptr<Backend<float>>(std::make_unique<CudaBackend>(device));
}

}  // namespace adjsh::cuda

namespace {

using adjsh::DeviceTraffic;

// ||a - b|| / ||b|| over every tensor of two gradients' tensor maps (same names and shapes).
double RelL2(const adjsh::TensorMap& a, const adjsh::TensorMap& b) {
  double diff = 0, norm = 0;
  for (const auto& [name, tb] : b) {
    const std::vector<float> y = tb.To<float>().value();
    const std::vector<float> x = a.at(name).To<float>().value();
    for (size_t i = 0; i < y.size(); ++i) {
      diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      norm += double(y[i]) * y[i];
    }
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// FNV-1a over a gradient's tensor map, name by name (the map is ordered): equal digests, equal
// bits.
uint64_t Digest(const adjsh::TensorMap& m) {
  uint64_t h = adjsh::kFnv1aBasis;
  for (const auto& [name, t] : m) {
    for (char c : name) h = adjsh::Fnv1a(h, static_cast<uint8_t>(c));
    const std::vector<float> values = t.To<float>().value();
    for (float v : values) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int b = 0; b < 4; ++b) h = adjsh::Fnv1a(h, static_cast<uint8_t>(bits >> (8 * b)));
    }
  }
  return h;
}

std::vector<uint32_t> Tokens(int64_t T, int64_t V) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> t(T);
  for (uint32_t& x : t) x = static_cast<uint32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

// The step on the emulated GPU and, with the kernels run, on the CPU; one JSON line.
template <typename F>
int Step(const char* type, const typename F::template Params<float>& p,
         const std::vector<uint32_t>& tokens, const adjsh::GradOptions& opt, bool run_kernels) {
  using Grad = typename F::Grad;
  // The device's own counts around the whole step: its tasks' traffic and what making the model
  // on the device moved (its parameters, the resident head's tables).
  const DeviceTraffic before = adjsh::cuda::DeviceMemoryProbeOf(0)()->traffic;
  adjsh::cuda::ResetPeak(0);
  adjsh::emulation::mapped_peak_bytes = adjsh::emulation::mapped_live_bytes;
  const absl::StatusOr<Grad> r = F::Gradient(p, adjsh::GradPiece{tokens, opt});
  const DeviceTraffic d = adjsh::cuda::DeviceMemoryProbeOf(0)()->traffic - before;
  const int64_t device_peak = adjsh::cuda::MemoryOf(0).peak;  // the step's, the model's included
  if (!r.ok()) {
    std::fprintf(stderr, "emulated_step: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  std::string compared;
  if (run_kernels) {
    adjsh::GradOptions cpu = opt;
    cpu.device = adjsh::Device{};
    const absl::StatusOr<Grad> c = F::Gradient(p, adjsh::GradPiece{tokens, cpu});
    if (!c.ok()) {
      std::fprintf(stderr, "emulated_step: cpu: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    const adjsh::TensorMap grad = F::ToTensors(r->grad, adjsh::DType::kF32);
    compared = absl::StrFormat(
        ", \"loss\": %.9g, \"loss_cpu\": %.9g, \"rel_l2_vs_cpu\": %.3g, \"digest\": \"%016x\"",
        r->loss, c->loss, RelL2(grad, F::ToTensors(c->grad, adjsh::DType::kF32)), Digest(grad));
  }
  uint64_t task_syncs = 0;  // the most one task waited for the device
  for (const adjsh::TaskRecord& rec : r->records)
    task_syncs = std::max<uint64_t>(task_syncs, rec.device.syncs);
  const int64_t T = static_cast<int64_t>(tokens.size());
  const double t = static_cast<double>(T);
  const uint64_t param_bytes = F::ParamBytes(p.config);
  const double beyond =
      static_cast<double>(d.h2d_bytes + d.d2h_bytes) - 2.0 * static_cast<double>(param_bytes);
  absl::PrintF(
      "{\"model\": \"%s\", \"D\": %d, \"K\": %d, \"V\": %d, \"T\": %d, \"chunk\": %d, "
      "\"spans\": %d, \"tasks\": %d, \"param_bytes\": %d, \"h2d_bytes\": %d, \"d2h_bytes\": %d, "
      "\"h2d_copies\": %d, \"d2h_copies\": %d, \"syncs\": %d, \"allocations\": %d, "
      "\"h2d_per_token\": %.1f, \"d2h_per_token\": %.1f, "
      "\"beyond_params_and_grad_per_token\": %.1f, \"syncs_per_task\": %.2f, "
      "\"most_syncs_in_a_task\": %d, \"device_peak_bytes\": %d, "
      "\"mapped_peak_bytes\": %d%s}\n",
      type, p.config.hidden_size, p.config.num_hidden_layers, p.config.vocab_size, T, opt.chunk,
      r->profile.spans, r->profile.tasks, param_bytes, d.h2d_bytes, d.d2h_bytes, d.h2d_copies,
      d.d2h_copies, d.syncs, d.allocations, d.h2d_bytes / t, d.d2h_bytes / t, beyond / t,
      static_cast<double>(d.syncs) / static_cast<double>(r->profile.tasks), task_syncs, device_peak,
      adjsh::emulation::mapped_peak_bytes, compared);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  adjsh::cli::ArgParser a("emulated_step",
                          "One gradient step with the CUDA backend on the host-emulated device: "
                          "its host-device traffic (kernels skipped), or with --kernels run its "
                          "gradient against the CPU's.");
  a.Add("model-type", "mamba|mamba2", "the model type", "mamba");
  a.Add("hidden-size", "D", "model width", "256");
  a.Add("layers", "K", "layers", "4");
  a.Add("state-size", "N", "state size", "16");
  a.Add("head-dim", "P", "Mamba-2: channels per head", "64");
  a.Add("vocab-size", "V", "vocabulary", "50280");
  a.Add("tokens", "T", "sequence length", "65536");
  a.Add("chunk", "C", "tokens per chunk", "256");
  a.Add("spans", "S", "spans (0: the default)", "0");
  a.Add("threads", "N", "the step's threads (the counts do not depend on them)", "1");
  a.Add("row-budget-bytes", "B",
        "the device memory the span rows may take, past which they are mapped host memory "
        "(-1: the default, 80% of the emulated device's free memory)", "-1");
  a.Add("kernels", "skip|run", "skip: count the traffic only; run: emulate the kernels too and "
        "compare the gradient with the CPU's (small shapes)", "skip");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  int64_t v[7];
  const char* names[] = {"hidden-size", "layers", "state-size", "head-dim", "vocab-size",
                         "tokens", "chunk"};
  for (int i = 0; i < 7; ++i) {
    absl::StatusOr<int64_t> got = a.GetInt(names[i], 1, int64_t{1} << 32);
    if (!got.ok()) {
      std::fprintf(stderr, "emulated_step: %s\n", std::string(got.status().message()).c_str());
      return 2;
    }
    v[i] = *got;
  }
  absl::StatusOr<int64_t> spans = a.GetInt("spans", 0, int64_t{1} << 30);
  absl::StatusOr<int64_t> threads = a.GetInt("threads", 1, 64);
  absl::StatusOr<int64_t> budget = a.GetInt("row-budget-bytes", -1, int64_t{1} << 50);
  for (const absl::StatusOr<int64_t>* got : {&spans, &threads, &budget}) {
    if (!got->ok()) {
      std::fprintf(stderr, "emulated_step: %s\n", std::string(got->status().message()).c_str());
      return 2;
    }
  }
  const std::string kernels = a.Get("kernels"), type = a.Get("model-type");
  if (kernels != "skip" && kernels != "run") {
    std::fprintf(stderr, "emulated_step: --kernels must be skip or run, got '%s'\n",
                 kernels.c_str());
    return 2;
  }
  if (type != "mamba" && type != "mamba2") {
    std::fprintf(stderr, "emulated_step: --model-type must be mamba or mamba2, got '%s'\n",
                 type.c_str());
    return 2;
  }
  const int64_t D = v[0], K = v[1], N = v[2], P = v[3], V = v[4], T = v[5];
  const bool run = kernels == "run";
  adjsh::emulation::skip_kernels = !run;
  // Counting only: nothing to guard, and a protection change per copy over a long context's rows
  // would cost more than the run (tests/cuda/emulated_memory.h).
  adjsh::emulation::guard_device_memory = run;
  adjsh::GradOptions opt;
  opt.device = *adjsh::ParseDevice("cuda:0");
  opt.device.row_budget = *budget;
  opt.chunk = v[6];
  opt.spans = *spans;
  opt.threads = static_cast<int>(*threads);
  const std::vector<uint32_t> tokens = Tokens(T, V);
  if (type == "mamba") {
    adjsh::MambaConfig c;
    c.hidden_size = D, c.num_hidden_layers = K, c.state_size = N, c.vocab_size = V;
    c.time_step_rank = (D + 15) / 16;
    const adjsh::ModelParams<float> p = adjsh::InitParams<float>(c, 1);
    return Step<adjsh::Family<adjsh::MambaConfig>>("mamba", p, tokens, opt, run);
  }
  adjsh::Mamba2Config c;
  c.hidden_size = D, c.num_hidden_layers = K, c.state_size = N, c.vocab_size = V;
  c.head_dim = P, c.num_heads = 2 * D / P, c.n_groups = 1;
  absl::StatusOr<adjsh::Mamba2Params<float>> p = adjsh::InitMamba2Params<float>(c, 1);
  if (!p.ok()) {
    std::fprintf(stderr, "emulated_step: %s\n", std::string(p.status().message()).c_str());
    return 2;
  }
  return Step<adjsh::Family<adjsh::Mamba2Config>>("mamba2", *p, tokens, opt, run);
}
