#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proc_stats.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.h"
#include "proto/status_util.h"
#include "proto/transport.h"
#include "worker/peer.h"
#include "worker/retry.h"
#include "worker/shared_state.h"
#include "worker/task_runner.h"

namespace adjsh::worker {
namespace {

using std::chrono::milliseconds;

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "worker";
  return buf;
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t NonNegative(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

}  // namespace

Worker::Worker(WorkerOptions options)
    : opt_(std::move(options)),
      state_(std::make_unique<SharedState>(opt_.log_level, opt_.stop_grace)) {
  grpc::ChannelArguments args = ClientChannelArgs();  // keepalive, message limits
  // Reconnect fast after a coordinator restart (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is the connect and TLS handshake timeout, not a backoff:
  // ClientChannelArgs sets it.)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (!opt_.coordinator_tls_name.empty()) args.SetSslTargetNameOverride(opt_.coordinator_tls_name);
  channel_ = grpc::CreateCustomChannel(
      opt_.coordinator,
      opt_.credentials ? opt_.credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = v1::TaskService::NewStub(channel_);
}

Worker::~Worker() = default;

WorkerStats Worker::stats() const { return state_->stats(); }

// ---------------------------------------------------------------------------------------------
// Registration

absl::Status Worker::Register() {
  Backoff backoff(opt_.backoff_min, opt_.backoff_max);
  FailureRun failures;
  for (;;) {
    if (state_->Stopping()) return absl::CancelledError("stopping");
    v1::RegisterWorkerRequest request;
    request.set_worker_name(opt_.name.empty() ? HostName() : opt_.name);
    request.set_device("cpu");
    request.set_memory_bytes(opt_.memory_bytes > 0 ? opt_.memory_bytes : PhysicalMemoryBytes());
    request.set_peer_address(peer_address_);
    v1::RegisterWorkerResponse response;
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.rpc_deadline);
      SharedState::CallScope scope(*state_, ctx, CallKind::kStoppable);
      s = FromGrpcStatus(stub_->RegisterWorker(&ctx, request, &response));
    }
    if (s.ok() && response.worker_id().empty()) {
      s = absl::InternalError("RegisterWorker answered an empty worker_id");
    }
    if (s.ok()) {
      int64_t interval = response.heartbeat_interval_ms();
      if (interval <= 0) interval = 5000;
      state_->Registered(response.worker_id(), interval);
      if (opt_.health != nullptr) opt_.health->SetServing(true);
      if (main_health_ != nullptr) main_health_->SetServing(true);
      state_->Log(1, absl::StrFormat("registered with %s as %s (%s, heartbeat every %d ms)",
                                     opt_.coordinator, response.worker_id(),
                                     request.worker_name(), interval));
      return absl::OkStatus();
    }
    if (state_->Stopping()) return absl::CancelledError("stopping");
    if (IsFatal(s.code())) {
      state_->Log(0, absl::StrCat("RegisterWorker refused: ", s.ToString()));
      return s;
    }
    const int level = failures.Count(FailureRun::Clock::now());
    state_->Log(level, failures.Line("RegisterWorker", s, opt_.tls));
    if (!state_->SleepFor(backoff.Next())) return absl::CancelledError("stopping");
  }
}

absl::Status Worker::Reregister(const std::string& stale_id) {
  std::lock_guard<std::mutex> reg(register_mu_);
  if (state_->worker_id() != stale_id) return absl::OkStatus();  // the other thread did it
  state_->Log(1, absl::StrCat("the coordinator does not know worker ", stale_id,
                              ": registering again"));
  absl::Status s = Register();
  if (s.ok()) state_->CancelCallsOfCancelledTask();  // a task held under the stale id
  return s;
}

// ---------------------------------------------------------------------------------------------
// The heartbeat thread

void Worker::HeartbeatLoop() {
  while (std::optional<SharedState::HeartbeatTurn> turn = state_->NextHeartbeat()) {
    const std::shared_ptr<TaskState>& held = turn->held;
    v1::HeartbeatRequest request;
    request.set_worker_id(turn->worker_id);
    if (held != nullptr) request.add_task_ids(held->task_id);
    request.set_resident_bytes(NonNegative(ResidentBytes()));
    request.set_peak_resident_bytes(NonNegative(PeakResidentBytes()));
    v1::HeartbeatResponse response;
    const Clock::time_point sent = Clock::now();
    absl::Status s;
    {
      grpc::ClientContext ctx;
      // Never much longer than the interval: a stuck heartbeat must not hold up the next one.
      SetDeadline(ctx, std::clamp(milliseconds(2 * turn->interval_ms), milliseconds(1000),
                                  std::max(opt_.rpc_deadline, milliseconds(1000))));
      SharedState::CallScope scope(*state_, ctx, CallKind::kHeartbeat);
      s = FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response));
    }
    if (s.ok()) {
      if (held == nullptr) continue;
      bool cancel = false;
      for (const std::string& t : response.cancelled_task_ids()) cancel |= t == held->task_id;
      // (A task finished meanwhile is no longer held: nothing to drop or renew.)
      if (state_->HeartbeatAnswered(held, cancel, sent)) {
        state_->Log(1, absl::StrCat("task ", held->task_id,
                                    " cancelled by the coordinator: dropping it"));
        // Not a result already being pushed: the answer to the heartbeat may have crossed
        // that result's acceptance (the task is then done, by this worker), and the push's
        // own answer says which. Cancelling it would count an accepted result as dropped.
        state_->CancelCalls(held->task_id, /*pushes=*/false);
      }
    } else if (s.code() == absl::StatusCode::kNotFound) {
      absl::Status r = Reregister(turn->worker_id);
      if (!r.ok() && !absl::IsCancelled(r)) {
        state_->Log(0, absl::StrCat("re-registration: ", r.ToString()));
      }
    } else if (!absl::IsCancelled(s)) {
      state_->Log(IsTransient(s.code()) ? 2 : 0, absl::StrCat("Heartbeat failed: ", s.ToString()));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The main loop

absl::Status Worker::Run(std::atomic<bool>& stop) {
  state_->SetStopFlag(stop);
  PeerHub peers(opt_, *stub_, *state_);
  absl::StatusOr<std::string> peer_address = peers.Start();
  if (!peer_address.ok()) return peer_address.status();
  peer_address_ = *peer_address;
  main_health_ = peers.health();  // set before the threads that register start
  TaskRunner runner(opt_, *stub_, *state_, peers, kMaxCachedJobs);
  std::thread watcher([this] { state_->WatchLoop(); });
  std::thread heartbeat;
  absl::Status status = Register();
  if (status.ok()) {
    heartbeat = std::thread([this] { HeartbeatLoop(); });
    Backoff backoff(opt_.backoff_min, opt_.backoff_max);
    FailureRun failures;
    std::string no_task_why;  // the last NoTask.reason logged
    while (!state_->Stopping()) {
      const std::string id = state_->worker_id();
      v1::PullTaskRequest request;
      request.set_worker_id(id);
      for (const v1::SkippedTask& sk : runner.skipped()) *request.add_skipped() = sk;
      v1::PullTaskResponse response;
      absl::Status s;
      {
        grpc::ClientContext ctx;
        SetDeadline(ctx, opt_.rpc_deadline);
        SharedState::CallScope scope(*state_, ctx, CallKind::kStoppable);
        s = FromGrpcStatus(stub_->PullTask(&ctx, request, &response));
      }
      if (s.ok()) {
        backoff.Reset();
        if (failures.failures() > 0) state_->Log(1, "the coordinator answers again");
        failures.Reset();
        runner.skipped().clear();  // the coordinator has them
        // Why it gets no tasks, once per reason (until it gets one again).
        const std::string why = response.has_no_task() ? response.no_task().reason() : "";
        if (!why.empty() && why != no_task_why) state_->Log(0, absl::StrCat("no tasks: ", why));
        no_task_why = why;
        if (response.has_task()) {
          state_->UpdateStats([](WorkerStats& st) { ++st.tasks_pulled; });
          runner.Handle(response.task());
        } else if (response.has_no_task()) {
          const int64_t ms = std::clamp<int64_t>(response.no_task().retry_after_ms(), 1, 60000);
          state_->SleepFor(milliseconds(ms));
        } else {
          state_->Log(0, "PullTask answered neither a task nor no_task");
          state_->SleepFor(backoff.Next());
        }
        continue;
      }
      if (state_->Stopping()) break;
      if (s.code() == absl::StatusCode::kNotFound) {
        absl::Status r = Reregister(id);
        if (!r.ok() && !absl::IsCancelled(r)) {
          status = r;
          break;
        }
        continue;
      }
      if (IsFatal(s.code())) {
        state_->Log(0, absl::StrCat("PullTask refused: ", s.ToString()));
        status = s;
        break;
      }
      const int level = failures.Count(FailureRun::Clock::now());
      state_->Log(level, failures.Line("PullTask", s, opt_.tls));
      state_->SleepFor(backoff.Next());
    }
  }
  if (opt_.health != nullptr) opt_.health->SetServing(false);
  if (main_health_ != nullptr) main_health_->SetServing(false);
  state_->Shutdown();
  peers.Shutdown();
  if (heartbeat.joinable()) heartbeat.join();
  watcher.join();
  if (absl::IsCancelled(status) && state_->Stopping()) status = absl::OkStatus();
  const WorkerStats st = stats();
  const PeerHub::Stats ps = peers.stats();
  const std::string tree =
      peer_address_.empty()
          ? ""
          : absl::StrFormat("; tree: %d sums sent, %d received, %d roots, parameters %d from "
                            "the tree, %d from the coordinator, %d relayed",
                            ps.sums_sent, ps.sums_received, ps.roots_sent, ps.params_from_peer,
                            ps.params_from_coordinator, ps.params_relayed);
  state_->Log(1, absl::StrFormat(
                     "stopped: %d tasks done (%d not accepted), %d dropped; peak RSS %.1f MiB%s",
                     st.tasks_done, st.results_rejected, st.tasks_dropped,
                     static_cast<double>(PeakResidentBytes()) / 1048576.0, tree));
  return status;
}

}  // namespace adjsh::worker
