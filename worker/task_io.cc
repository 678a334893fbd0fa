#include "worker/task_io.h"

#include <algorithm>
#include <memory>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/model.h"
#include "common/strings.h"
#include "engine/reduce_groups.h"
#include "grpcpp/grpcpp.h"
#include "proto/status_util.h"
#include "worker/retry.h"

namespace adjsh::worker {

TensorMap TakeParamTensors(TensorMap& got) {
  TensorMap named;
  for (auto it = got.begin(); it != got.end();) {
    if (it->first.rfind("backbone.", 0) == 0 || it->first == kLmHeadName) {
      named.insert(got.extract(it++));
    } else {
      ++it;
    }
  }
  return named;
}

AssemblerLimits SpanInputLimits(int64_t K, int64_t D, int64_t DiN, int64_t W,
                                uint64_t param_bytes, const SpanPlan& plan, int64_t s) {
  const uint64_t layers = static_cast<uint64_t>(K);
  const uint64_t per_task = 8 * static_cast<uint64_t>(2 * DiN + 2 * W * D);
  const uint64_t span = 9 * static_cast<uint64_t>(plan.range(s).len + W + 1);
  AssemblerLimits limits;
  limits.max_total_bytes = 2 * param_bytes + span + (2 * layers + 2) * per_task + (1 << 20);
  limits.max_tensor_bytes = limits.max_total_bytes;
  // Per layer its parameters (a group's tensors at most) and a replay's inputs of its four tasks
  // (engine/span_tensors.cc InputSlots: halo_u; halo_u, h0; du_halo; du_halo, mu), and the few
  // of the whole model and of the task itself (embedding, final norm, head, tokens, mask).
  constexpr uint64_t kReplayInputsPerLayer = 6;
  limits.max_tensors = (MaxGroupTensors() + kReplayInputsPerLayer) * layers + 64;
  return limits;
}
namespace {

NoResult Skipped(std::string why) { return NoResult{.skipped = true, .why = std::move(why)}; }
NoResult Dropped(std::string why) { return NoResult{.skipped = false, .why = std::move(why)}; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The streams

TaskIo::TaskIo(const WorkerOptions& opt, v1::TaskService::Stub& stub, SharedState& state)
    : opt_(opt), stub_(stub), state_(state) {}

std::optional<NoResult> TaskIo::Fetch(const TaskState& task, bool include_params,
                                      bool include_span, const AssemblerLimits& limits,
                                      TensorMap& got) {
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
    request.set_include_span(include_span);
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
    if (absl::IsNotFound(s)) return Dropped(absl::StrCat("FetchInputs: ", s.ToString()));
    // Refused for good (a request this worker cannot make right): said to the coordinator.
    if (!IsTransient(s.code())) return Skipped(absl::StrCat("FetchInputs: ", s.ToString()));
    state_.Log(2, absl::StrCat("task ", tid, ": FetchInputs failed (", s.ToString(),
                               "); retrying"));
    if (!state_.SleepFor(backoff.Next())) return Dropped("stopping");
  }
}

std::optional<NoResult> TaskIo::Push(const TaskState& task, const TensorMap& results,
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
