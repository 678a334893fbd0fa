#include "worker/task_io.h"

#include <algorithm>
#include <memory>
#include <span>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/model.h"
#include "common/strings.h"
#include "grpcpp/grpcpp.h"
#include "proto/status_util.h"
#include "worker/retry.h"

namespace adjsh::worker {
namespace {

template <typename T>
constexpr DType ComputeDType() {
  return std::is_same_v<T, double> ? DType::kF64 : DType::kF32;
}

// The dtypes a tensor of a T task may arrive in: T itself or a narrower float (converted
// exactly), never a wider one (that would round).
template <typename T>
bool AcceptableDType(DType d) {
  if (d == DType::kF32 || d == DType::kBF16 || d == DType::kF16) return true;
  return d == DType::kF64 && std::is_same_v<T, double>;
}

NoResult Skipped(std::string why) { return NoResult{.skipped = true, .why = std::move(why)}; }
NoResult Dropped(std::string why) { return NoResult{.skipped = false, .why = std::move(why)}; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The tensors

std::vector<Expected> InputTensors(const MambaConfig& cfg, int64_t halo, int64_t len) {
  const int64_t D = cfg.hidden_size, Di = cfg.inner(), N = cfg.state_size;
  return {{"u", {halo + len, D}}, {"g", {len, D}}, {"h0", {Di, N}}, {"mu", {Di, N}}};
}

AssemblerLimits LimitsFor(std::initializer_list<const std::vector<Expected>*> lists) {
  AssemblerLimits limits{.max_tensor_bytes = 0, .max_total_bytes = 0};
  for (const std::vector<Expected>* list : lists) {
    for (const Expected& e : *list) {
      const uint64_t bytes = static_cast<uint64_t>(ShapeNumel(e.shape)) * 8;  // f64 at most
      limits.max_tensor_bytes = std::max(limits.max_tensor_bytes, bytes);
      limits.max_total_bytes += bytes;
    }
  }
  return limits;
}

template <typename T>
absl::Status TakeTensor(TensorMap& got, const Expected& e, std::vector<T>& out) {
  auto it = got.find(e.name);
  if (it == got.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing \"", e.name, "\""));
  }
  const HostTensor& t = it->second;
  if (t.shape != e.shape) {
    return absl::InvalidArgumentError(absl::StrCat("\"", e.name, "\" has shape ",
                                                   ShapeString(t.shape), ", expected ",
                                                   ShapeString(e.shape)));
  }
  if (!AcceptableDType<T>(t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", e.name, "\" has dtype ", ToAbsl(DTypeName(t.dtype)), " for a ",
        ToAbsl(DTypeName(ComputeDType<T>())), " task"));
  }
  absl::StatusOr<std::vector<T>> v = t.To<T>();
  if (!v.ok()) return v.status();
  out = std::move(*v);
  got.erase(it);
  return absl::OkStatus();
}

template <typename T>
absl::Status TakeInputs(TensorMap& got, const std::vector<Expected>& inputs,
                        BackwardTaskInputs<T>& in) {
  for (auto [e, out] : {std::pair{&inputs[0], &in.u}, {&inputs[1], &in.g}, {&inputs[2], &in.h0}}) {
    if (absl::Status st = TakeTensor(got, *e, *out); !st.ok()) return st;
  }
  if (got.count("mu") > 0) return TakeTensor(got, inputs[3], in.mu);
  return absl::OkStatus();
}

template <typename T>
ResultTensors ToResultTensors(const MambaConfig& cfg, int64_t k, int64_t halo, int64_t len,
                              const BackwardTaskOutputs<T>& out) {
  const int64_t D = cfg.hidden_size, Di = cfg.inner(), N = cfg.state_size;
  const DType dtype = ComputeDType<T>();
  ResultTensors results;
  for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
    const std::vector<T>& g = out.grad.*slot.member;
    results.emplace_back(LayerParamName(k, slot.suffix),
                         HostTensor::From<T>(std::span<const T>(g), slot.shape(cfg), dtype));
  }
  results.emplace_back("du", HostTensor::From<T>(std::span<const T>(out.du), {len, D}, dtype));
  results.emplace_back("du_halo",
                       HostTensor::From<T>(std::span<const T>(out.du_halo), {halo, D}, dtype));
  results.emplace_back("mu_out",
                       HostTensor::From<T>(std::span<const T>(out.mu_out), {Di, N}, dtype));
  return results;
}

#define ADJSH_INSTANTIATE(T)                                                                   \
  template absl::Status TakeTensor<T>(TensorMap&, const Expected&, std::vector<T>&);           \
  template absl::Status TakeInputs<T>(TensorMap&, const std::vector<Expected>&,                \
                                      BackwardTaskInputs<T>&);                                 \
  template ResultTensors ToResultTensors<T>(const MambaConfig&, int64_t, int64_t, int64_t,     \
                                            const BackwardTaskOutputs<T>&);
ADJSH_INSTANTIATE(float)
ADJSH_INSTANTIATE(double)
#undef ADJSH_INSTANTIATE

// ---------------------------------------------------------------------------------------------
// The streams

TaskIo::TaskIo(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state)
    : opt_(opt), stub_(stub), state_(state) {}

std::optional<NoResult> TaskIo::Fetch(const TaskState& task, bool include_params,
                                      const AssemblerLimits& limits, TensorMap& got) {
  const std::string& tid = task.task_id;
  std::string why;
  Backoff backoff(opt_.backoff_min, opt_.backoff_max);
  for (;;) {
    if (!state_.TaskAlive(task, &why)) return Dropped(why);
    if (state_.Stopping()) return Dropped("stopping");
    v1::FetchInputsRequest request;
    request.set_worker_id(task.worker_id);
    request.set_task_id(tid);
    request.set_lease_id(task.lease_id);
    request.set_include_params(include_params);
    if (include_params) state_.UpdateStats([](WorkerStats& s) { ++s.params_fetched; });
    got.clear();
    absl::Status stream_error, s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      SharedState::CallScope scope(state_, ctx, CallKind::kStoppable, tid);
      std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
          stub_.FetchInputs(&ctx, request);
      TensorAssembler assembler(limits);
      v1::TensorChunk chunk;
      while (reader->Read(&chunk)) {
        absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(chunk);
        if (!done.ok()) {
          stream_error = done.status();
          ctx.TryCancel();
          break;
        }
        if (done->has_value()) got[(*done)->name] = std::move((*done)->tensor);
      }
      if (stream_error.ok()) {
        s = FromGrpcStatus(reader->Finish());
        if (s.ok()) stream_error = assembler.Finish();
      } else {
        reader->Finish();
      }
    }
    if (!stream_error.ok()) {
      return Skipped(absl::StrCat("malformed inputs: ", stream_error.ToString()));
    }
    if (s.ok()) return std::nullopt;
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      return Dropped(absl::StrCat("lease lost (", s.message(), ")"));
    }
    if (absl::IsCancelled(s)) {
      if (!state_.TaskAlive(task, &why)) return Dropped(why);
      return Dropped("stopping");
    }
    if (!IsTransient(s.code())) return Dropped(absl::StrCat("FetchInputs: ", s.ToString()));
    state_.Log(2, absl::StrCat("task ", tid, ": FetchInputs failed (", s.ToString(),
                               "); retrying"));
    if (!state_.SleepFor(backoff.Next())) return Dropped("stopping");
  }
}

std::optional<NoResult> TaskIo::Push(const TaskState& task, const ResultTensors& results,
                                     v1::PushResultResponse& response) {
  const std::string& tid = task.task_id;
  std::string why;
  Backoff backoff(opt_.backoff_min, opt_.backoff_max);
  for (;;) {
    if (!state_.TaskAlive(task, &why)) return Dropped(why);
    v1::PushResultResponse answer;
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      SharedState::CallScope scope(state_, ctx, CallKind::kPush, tid);
      std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
          stub_.PushResult(&ctx, &answer);
      v1::ResultChunk msg;
      v1::ResultHeader* header = msg.mutable_header();
      header->set_worker_id(task.worker_id);
      header->set_task_id(tid);
      header->set_lease_id(task.lease_id);
      bool ok = writer->Write(msg);
      for (const auto& [name, tensor] : results) {
        if (!ok) break;
        ok = StreamTensor(name, tensor, kDefaultPieceBytes, [&](const v1::TensorChunk& c) {
               *msg.mutable_tensor() = c;
               return writer->Write(msg) ? absl::OkStatus()
                                         : absl::UnavailableError("the stream broke");
             }).ok();
      }
      if (ok) writer->WritesDone();
      s = FromGrpcStatus(writer->Finish());
    }
    if (s.ok()) {
      state_.UpdateStats([&](WorkerStats& st) {
        ++st.tasks_done;
        if (!answer.accepted()) ++st.results_rejected;
      });
      response = std::move(answer);
      return std::nullopt;
    }
    if (absl::IsCancelled(s)) {
      if (!state_.TaskAlive(task, &why)) return Dropped(why);
      return Dropped("stopped before the result was delivered");
    }
    if (!IsTransient(s.code()) || state_.Stopping()) {
      return Dropped(absl::StrCat("PushResult: ", s.ToString()));
    }
    state_.Log(2, absl::StrCat("task ", tid, ": PushResult failed (", s.ToString(),
                               "); retrying"));
    if (!state_.SleepFor(backoff.Next())) return Dropped("stopping");
  }
}

}  // namespace adjsh::worker
