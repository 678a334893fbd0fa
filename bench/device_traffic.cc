// What one gradient step moves between the host and the GPU, with the CUDA backend as it is
// (kernels/cuda), counted by the device's Context (kernels/cuda/context.h: every copy, stream
// sync and allocation goes through it): the in-process span step of one model on `cuda:0`,
// which is what one GPU worker owning every span of the step runs. The device is the
// host-emulated one (tests/cuda/emulated_device.h) with its kernels and GEMMs skipped
// (emulation::skip_kernels): which copies, syncs and allocations a call makes is decided by the
// host code above the device API, the same code a GPU runs, so the counts are a GPU's; the
// gradient itself is not computed (its values are meaningless here).
//
// One JSON line: the shape, the step's tasks, the traffic in all and per token, syncs per task,
// and the model's f32 bytes (one parameter upload, or one gradient download, of the step).
// docs/BENCHMARKS.md "Host-device traffic" has the table and the command.
#include <cuda_runtime.h>

#include <cstdio>
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
#include "common/mamba2_init.h"
#include "common/model.h"
#include "engine/adjoint_engine.h"
#include "engine/mamba2_grad.h"

namespace adjsh::cuda {

absl::StatusOr<std::unique_ptr<Backend<float>>> MakeCudaBackend(const Device& device) {
  return std::unique_ptr<Backend<float>>(std::make_unique<CudaBackend>(device));
}

}  // namespace adjsh::cuda

namespace {

using adjsh::DeviceTraffic;

std::vector<uint32_t> Tokens(int64_t T, int64_t V) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> t(T);
  for (uint32_t& x : t) x = static_cast<uint32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

template <typename Result>
int Report(const char* type, const adjsh::GradOptions& opt, int64_t D, int64_t K, int64_t T,
           int64_t V, uint64_t param_bytes, const absl::StatusOr<Result>& r) {
  if (!r.ok()) {
    std::fprintf(stderr, "device_traffic: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  const DeviceTraffic& d = r->profile.device;
  const double t = static_cast<double>(T);
  const double beyond =
      static_cast<double>(d.h2d_bytes + d.d2h_bytes) - 2.0 * static_cast<double>(param_bytes);
  absl::PrintF(
      "{\"model\": \"%s\", \"D\": %d, \"K\": %d, \"V\": %d, \"T\": %d, \"chunk\": %d, "
      "\"spans\": %d, \"tasks\": %d, \"param_bytes\": %d, \"h2d_bytes\": %d, \"d2h_bytes\": %d, "
      "\"h2d_copies\": %d, \"d2h_copies\": %d, \"syncs\": %d, \"allocations\": %d, "
      "\"h2d_per_token\": %.1f, \"d2h_per_token\": %.1f, "
      "\"beyond_params_and_grad_per_token\": %.1f, \"syncs_per_task\": %.2f}\n",
      type, D, K, V, T, opt.chunk, r->profile.spans, r->profile.tasks, param_bytes, d.h2d_bytes,
      d.d2h_bytes, d.h2d_copies, d.d2h_copies, d.syncs, d.allocations, d.h2d_bytes / t,
      d.d2h_bytes / t, beyond / t,
      static_cast<double>(d.syncs) / static_cast<double>(r->profile.tasks));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  adjsh::cli::ArgParser a("device_traffic",
                          "One gradient step's host-device traffic with the CUDA backend, on the "
                          "host-emulated device with its kernels skipped (counts only).");
  a.Add("model-type", "mamba|mamba2", "the model type", "mamba");
  a.Add("hidden-size", "D", "model width", "256");
  a.Add("layers", "K", "layers", "4");
  a.Add("state-size", "N", "state size", "16");
  a.Add("head-dim", "P", "Mamba-2: channels per head", "64");
  a.Add("vocab-size", "V", "vocabulary", "50280");
  a.Add("tokens", "T", "sequence length", "65536");
  a.Add("chunk", "C", "tokens per chunk", "256");
  a.Add("spans", "S", "spans (0: the default)", "0");
  if (auto code = adjsh::cli::ParseOrExit(a, std::vector<std::string>(argv + 1, argv + argc)))
    return *code;
  int64_t v[7];
  const char* names[] = {"hidden-size", "layers", "state-size", "head-dim", "vocab-size",
                         "tokens", "chunk"};
  for (int i = 0; i < 7; ++i) {
    absl::StatusOr<int64_t> got = a.GetInt(names[i], 1, int64_t{1} << 32);
    if (!got.ok()) {
      std::fprintf(stderr, "device_traffic: %s\n", std::string(got.status().message()).c_str());
      return 2;
    }
    v[i] = *got;
  }
  absl::StatusOr<int64_t> spans = a.GetInt("spans", 0, int64_t{1} << 30);
  if (!spans.ok()) {
    std::fprintf(stderr, "device_traffic: %s\n", std::string(spans.status().message()).c_str());
    return 2;
  }
  const int64_t D = v[0], K = v[1], N = v[2], P = v[3], V = v[4], T = v[5];
  adjsh::emulation::skip_kernels = true;
  adjsh::GradOptions opt;
  opt.device = *adjsh::ParseDevice("cuda:0");
  opt.chunk = v[6];
  opt.spans = *spans;
  opt.threads = 1;  // the emulated device is one host; the counts do not depend on threads
  const std::vector<uint32_t> tokens = Tokens(T, V);
  const std::string type = a.Get("model-type");
  if (type == "mamba") {
    adjsh::MambaConfig c;
    c.hidden_size = D, c.num_hidden_layers = K, c.state_size = N, c.vocab_size = V;
    c.time_step_rank = (D + 15) / 16;
    const adjsh::ModelParams<float> p = adjsh::InitParams<float>(c, 1);
    return Report("mamba", opt, D, K, T, V, adjsh::ParamBytesF32(c),
                  adjsh::ComputeGradient<float>(p, tokens, opt));
  }
  if (type == "mamba2") {
    adjsh::Mamba2Config c;
    c.hidden_size = D, c.num_hidden_layers = K, c.state_size = N, c.vocab_size = V;
    c.head_dim = P, c.num_heads = 2 * D / P, c.n_groups = 1;
    absl::StatusOr<adjsh::Mamba2Params<float>> p = adjsh::InitMamba2Params<float>(c, 1);
    if (!p.ok()) {
      std::fprintf(stderr, "device_traffic: %s\n", std::string(p.status().message()).c_str());
      return 2;
    }
    return Report("mamba2", opt, D, K, T, V, adjsh::Mamba2ParamBytesF32(c),
                  adjsh::Mamba2Gradient<float>(*p, tokens, adjsh::Mamba2GradOptionsFrom(opt)));
  }
  std::fprintf(stderr, "device_traffic: --model-type must be mamba or mamba2, got '%s'\n",
               type.c_str());
  return 2;
}
