// Device parsing, the CPU backend (a thin wrapper of kernels/cpu, so results are bitwise those
// of the CPU kernels called directly), and the backend factory.
#include "kernels/backend.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/rmsnorm.h"
#ifdef ADJSH_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace adjsh {

std::string Device::ToString() const {
  std::string s = is_cpu() ? "cpu" : absl::StrCat("cuda:", index);
  if (bf16_storage) s += " (bf16 storage)";
  return s;
}

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  Device d;
  if (text == "cpu") return d;
  d.kind = Device::Kind::kCuda;
  if (text == "cuda") return d;
  if (text.substr(0, 5) == "cuda:" && text.size() > 5 && text.size() <= 9) {
    const std::string_view num = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && index >= 0 && index < 1024 &&
        (num.size() == 1 || num[0] != '0')) {
      d.index = index;
      return d;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device must be cpu, cuda or cuda:N (N a GPU ordinal), got '", std::string(text), "'"));
}


std::string_view OpName(Op op) {
  switch (op) {
    case Op::kForward: return "the chunk forward";
    case Op::kLocalSummary: return "the two-pass forward summary";
    case Op::kAdjointSummary: return "the two-pass adjoint summary";
    case Op::kBackwardExact: return "the exact chunk backward";
    case Op::kBackwardTruncated: return "the truncated-window backward";
    case Op::kHead: return "the LM head";
    case Op::kHeadAccuracy: return "the LM head's greedy accuracy (--loss-mask)";
    case Op::kMamba2Layer: return "a Mamba-2 layer";
  }
  return "an unknown operation";
}

template <typename T>
absl::Status Backend<T>::Require(Op op) const {
  if (Supports(op)) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(std::string(OpName(op)), " is not supported on ", device().ToString()));
}

template <typename T>
double Backend<T>::HeadLoss(const cpu::LmHeadArgs<T>& args) {
  std::vector<T> du(args.M * args.D), dE(args.V * args.D), dw_f(args.D);
  return HeadForwardBackward(args, du.data(), dE.data(), dw_f.data());
}

template <typename T>
void Backend<T>::HeadLogits(const T* u, int64_t M, int64_t D, int64_t V, double eps, const T* E,
                            const T* w_f, T* logits) {
  std::vector<T> nf(M * D), r(M);
  cpu::RmsNormForward(u, M, D, w_f, eps, nf.data(), r.data());
  cpu::Gemm<T>(cpu::Trans::kNo, cpu::Trans::kYes, M, V, D, 1, nf.data(), D, E, D, 0, logits, V);
}

namespace {

template <typename T>
class CpuBlock final : public BlockBackend<T> {
  using Block = cpu::MambaBlockCpu<T>;
  struct Kept final : KeptActs {
    explicit Kept(typename Block::KeptPtr p) : set(std::move(p)) {}
    typename Block::KeptPtr set;
  };
  // The set inside kept, or null (none kept, or not this backend's).
  static typename Block::Kept* SetOf(const std::unique_ptr<KeptActs>& kept) {
    auto* k = dynamic_cast<Kept*>(kept.get());
    return k ? k->set.get() : nullptr;
  }

 public:
  // kept: the backend's store, held as long as the block (a Shared store is never destroyed,
  // so a set its owner drops after the block and the backend still finds its pool).
  CpuBlock(const MambaConfig& config, const LayerParams<T>& params,
           std::shared_ptr<cpu::KeptStore> kept)
      : kept_(std::move(kept)), block_(config, params, kept_.get()) {}
  void Forward(const T* u, cpu::ChunkRows rows, const T* h0, T* u_next, T* h_end) override {
    block_.Forward(u, rows, h0, u_next, h_end);
  }
  void LocalSummary(const T* u, cpu::ChunkRows rows, T* h_local, T* S) override {
    block_.LocalSummary(u, rows, h_local, S);
  }
  void AdjointSummary(const T* u, cpu::ChunkRows rows, const T* g, T* m, T* S) override {
    block_.AdjointSummary(u, rows, g, m, S);
  }
  void Backward(const T* u, cpu::ChunkRows rows, const T* g, const T* h0, const T* mu,
                int64_t window, LayerParams<T>& grad, T* du, T* du_halo, T* mu_out) override {
    block_.Backward(u, rows, g, h0, mu, window, grad, du, du_halo, mu_out);
  }
  std::unique_ptr<KeptActs> LocalSummaryKeep(const T* u, cpu::ChunkRows rows, T* h_local,
                                             T* S) override {
    typename Block::KeptPtr set = block_.MakeKept(rows);
    block_.LocalSummary(u, rows, h_local, S, set.get());
    return set ? std::make_unique<Kept>(std::move(set)) : nullptr;
  }
  std::unique_ptr<KeptActs> ForwardKept(std::unique_ptr<KeptActs> kept, const T* u,
                                        cpu::ChunkRows rows, const T* h0, T* u_next,
                                        T* h_end, int64_t room_for) override {
    if (!SetOf(kept)) {  // no summary before it: a set to recompute into, if it can be carried
      typename Block::KeptPtr set = block_.MakeKeptToCarry(rows, room_for);
      if (set) kept = std::make_unique<Kept>(std::move(set));
    }
    block_.Forward(u, rows, h0, u_next, h_end, SetOf(kept), room_for);
    if (!block_.Carries(SetOf(kept), rows)) return nullptr;  // dropping it hands it back
    return kept;
  }
  std::unique_ptr<KeptActs> AdjointSummaryKeep(std::unique_ptr<KeptActs> carried, const T* u,
                                               cpu::ChunkRows rows, const T* g, T* m,
                                               T* S) override {
    if (block_.Carries(SetOf(carried), rows)) {
      block_.AdjointSummary(u, rows, g, m, S, SetOf(carried));
      if (!block_.ReadyForBackward(SetOf(carried), rows)) return nullptr;  // handed back
      return carried;
    }
    carried.reset();  // back to the pool before a fresh set is taken
    typename Block::KeptPtr set = block_.MakeKept(rows);
    block_.AdjointSummary(u, rows, g, m, S, set.get());
    return set ? std::make_unique<Kept>(std::move(set)) : nullptr;
  }
  void BackwardKept(std::unique_ptr<KeptActs> kept, const T* u, cpu::ChunkRows rows, const T* g,
                    const T* h0, const T* mu, LayerParams<T>& grad, T* du, T* du_halo,
                    T* mu_out) override {
    block_.Backward(u, rows, g, h0, mu, 0, grad, du, du_halo, mu_out, SetOf(kept));
  }

 private:
  const std::shared_ptr<cpu::KeptStore> kept_;
  const cpu::MambaBlockCpu<T> block_;
};

template <typename T>
class CpuBackend final : public Backend<T> {
  static constexpr int64_t kRows = 64;  // the head's row block

  // The loss sum of fn(block, first row) over args' rows in blocks of kRows, in row order.
  template <typename Fn>
  static double ForEachRowBlock(const cpu::LmHeadArgs<T>& args, Fn&& fn) {
    double loss = 0;
    for (int64_t r0 = 0; r0 < args.M; r0 += kRows) {
      cpu::LmHeadArgs<T> block = args;
      block.M = std::min(kRows, args.M - r0);
      block.u = args.u + r0 * args.D;
      block.targets = args.targets + r0;
      loss += fn(block, r0);
    }
    return loss;
  }

 public:
  // The kept sets in the process's store of the device's budget, shared with the other CPU
  // backends of that budget (kernels/cpu/kept_pool.h Shared: a backend lives for one gradient
  // in-process, engine/span_step.cc, and its sets' free lists must outlive it).
  explicit CpuBackend(const Device& device)
      : device_(device), kept_(cpu::KeptStore::Shared(device.kept_budget)) {}
  const Device& device() const override { return device_; }
  bool Supports(Op) const override { return true; }
  std::unique_ptr<BlockBackend<T>> MakeBlock(const MambaConfig& config,
                                             const LayerParams<T>& params) override {
    return std::make_unique<CpuBlock<T>>(config, params, kept_);
  }
  int64_t KeptRefusals() const override { return kept_->takes().refused; }
  // Blocks of kRows rows, applied in row order: the engine's head does the same sums in the
  // same order.
  double HeadForwardBackward(const cpu::LmHeadArgs<T>& args, T* du, T* dE, T* dw_f) override {
    const int64_t D = args.D, V = args.V;
    // Reused: the wavefront calls this once per chunk, and kRows x V is 13 MB at V = 50K.
    thread_local std::vector<T> dlogits, nf, dw;
    dlogits.resize(kRows * V), nf.resize(kRows * D), dw.resize(D);
    return ForEachRowBlock(args, [&](const cpu::LmHeadArgs<T>& block, int64_t r0) {
      std::fill(dw.begin(), dw.end(), T(0));
      const double loss = cpu::LmHeadForwardBackward<T>(block, du + r0 * D, dlogits.data(),
                                                        nf.data(), dw.data());
      cpu::Gemm<T>(cpu::Trans::kYes, cpu::Trans::kNo, V, D, block.M, 1, dlogits.data(), V,
                   nf.data(), D, 1, dE, D);
      for (int64_t d = 0; d < D; ++d) dw_f[d] += dw[d];
      return loss;
    });
  }
  // The same row blocks and loss sums as HeadForwardBackward, without its backward.
  double HeadLoss(const cpu::LmHeadArgs<T>& args) override {
    std::vector<T> logits(kRows * args.V), nf(kRows * args.D);
    return ForEachRowBlock(args, [&](const cpu::LmHeadArgs<T>& block, int64_t) {
      return cpu::LmHeadLoss<T>(block, logits.data(), nf.data());
    });
  }

 private:
  const Device device_;
  const std::shared_ptr<cpu::KeptStore> kept_;
};

}  // namespace

bool KindSupports(Device::Kind kind, Op op) {
  if (kind == Device::Kind::kCpu) return true;
#ifdef ADJSH_HAVE_CUDA
  return cuda::CudaSupports(op);
#else
  (void)op;
  return false;
#endif
}

bool CudaBuilt() {
#ifdef ADJSH_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

template <typename T>
absl::StatusOr<std::unique_ptr<Backend<T>>> MakeBackend(const Device& device) {
  if (device.is_cpu()) {
    if (device.bf16_storage) {
      return absl::UnimplementedError("bf16 storage is not supported on cpu (CUDA devices only)");
    }
    return std::unique_ptr<Backend<T>>(std::make_unique<CpuBackend<T>>(device));
  }
  if (!CudaBuilt()) {
    return absl::UnimplementedError(absl::StrCat(
        device.ToString(), " requested, but this adjsh was built without CUDA (nvcc was not "
        "found, or -DADJSH_CUDA=OFF)"));
  }
  if constexpr (std::is_same_v<T, double>) {
    return absl::UnimplementedError(
        absl::StrCat("f64 is not supported on ", device.ToString(), " (use --device cpu)"));
  } else {
#ifdef ADJSH_HAVE_CUDA
    return cuda::MakeCudaBackend(device);
#else
    return absl::InternalError("unreachable");
#endif
  }
}

template <typename T>
absl::StatusOr<std::unique_ptr<Backend<T>>> MakeBackendFor(const Device& device,
                                                           const MambaConfig& config,
                                                           std::initializer_list<Op> ops) {
  absl::StatusOr<std::unique_ptr<Backend<T>>> backend = MakeBackend<T>(device);
  if (!backend.ok()) return backend.status();
  if (absl::Status s = (*backend)->CheckConfig(config); !s.ok()) return s;
  for (Op op : ops)
    if (absl::Status s = (*backend)->Require(op); !s.ok()) return s;
  return backend;
}

template class Backend<float>;
template class Backend<double>;
template absl::StatusOr<std::unique_ptr<Backend<float>>> MakeBackend<float>(const Device&);
template absl::StatusOr<std::unique_ptr<Backend<double>>> MakeBackend<double>(const Device&);
template absl::StatusOr<std::unique_ptr<Backend<float>>> MakeBackendFor<float>(
    const Device&, const MambaConfig&, std::initializer_list<Op>);
template absl::StatusOr<std::unique_ptr<Backend<double>>> MakeBackendFor<double>(
    const Device&, const MambaConfig&, std::initializer_list<Op>);

}  // namespace adjsh
