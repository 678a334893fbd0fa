#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/proc_stats.h"
#include "common/strings.h"
#include "common/tensor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/cpu/mamba_block.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"

namespace adjsh::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A coordinator that answers these will not take this worker however often it asks.
bool IsFatal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kUnimplemented ||
         code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kUnauthenticated;
}

// Worth trying again after a pause: the coordinator is (re)starting, overloaded or slow.
bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kAborted;
}

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

double MiB(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

void SetDeadline(grpc::ClientContext& ctx, milliseconds d) {
  ctx.set_deadline(std::chrono::system_clock::now() + d);
}

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

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

}  // namespace

// Registers a call's context for cancellation (stop, task cancelled, shutdown) while it runs.
class Worker::CallScope {
 public:
  CallScope(Worker& w, grpc::ClientContext& ctx, CallKind kind, std::string task_id = "")
      : w_(w), ctx_(ctx) {
    std::lock_guard<std::mutex> lock(w_.mu_);
    ActiveCall call{kind, std::move(task_id)};
    // A cancellation that happened before the call was registered still applies.
    const bool task_gone = !call.task_id.empty() && w_.current_ != nullptr &&
                           w_.current_->task_id == call.task_id && w_.current_->cancelled;
    if (w_.shutdown_ || task_gone || (kind == CallKind::kStoppable && w_.stop_seen_)) {
      ctx_.TryCancel();  // also valid before the call starts
      call.cancelled = true;
    }
    w_.calls_.emplace(&ctx_, std::move(call));
  }
  ~CallScope() {
    std::lock_guard<std::mutex> lock(w_.mu_);
    w_.calls_.erase(&ctx_);
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Worker& w_;
  grpc::ClientContext& ctx_;
};

Worker::Worker(WorkerOptions options) : opt_(std::move(options)) {
  grpc::ChannelArguments args;
  // Reconnect fast after a coordinator restart (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  channel_ = grpc::CreateCustomChannel(opt_.coordinator, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::TaskService::NewStub(channel_);
}

Worker::~Worker() = default;

WorkerStats Worker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string Worker::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

void Worker::Log(int level, const std::string& message) const {
  if (level > opt_.log_level) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int64_t ms =
      std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const std::string line = absl::StrFormat("[worker %s.%03d] %s%s\n", stamp, ms,
                                           level == 0 ? "warning: " : "", message);
  std::fputs(line.c_str(), stderr);
}

bool Worker::SleepFor(milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [&] { return stop_seen_ || shutdown_ || Stopping(); });
}

milliseconds Worker::NextBackoff(milliseconds& current) const {
  static thread_local std::mt19937 rng(std::random_device{}());
  const milliseconds wait = current;
  current = std::min(opt_.backoff_max, current * 2);
  // +-20 % jitter, so that workers cut off together do not come back in lockstep.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  return milliseconds(static_cast<int64_t>(static_cast<double>(wait.count()) * jitter(rng)));
}

// ---------------------------------------------------------------------------------------------
// Registration

absl::Status Worker::Register() {
  milliseconds backoff = opt_.backoff_min;
  int failures = 0;
  for (;;) {
    if (Stopping()) return absl::CancelledError("stopping");
    v1::RegisterWorkerRequest request;
    request.set_worker_name(opt_.name.empty() ? HostName() : opt_.name);
    request.set_device("cpu");
    request.set_memory_bytes(opt_.memory_bytes > 0 ? opt_.memory_bytes : PhysicalMemoryBytes());
    v1::RegisterWorkerResponse response;
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.rpc_deadline);
      CallScope scope(*this, ctx, CallKind::kStoppable);
      s = FromGrpcStatus(stub_->RegisterWorker(&ctx, request, &response));
    }
    if (s.ok() && response.worker_id().empty()) {
      s = absl::InternalError("RegisterWorker answered an empty worker_id");
    }
    if (s.ok()) {
      int64_t interval = response.heartbeat_interval_ms();
      if (interval <= 0) interval = 5000;
      {
        std::lock_guard<std::mutex> lock(mu_);
        worker_id_ = response.worker_id();
        heartbeat_interval_ms_ = interval;
        ++stats_.registrations;
        // A task leased under an earlier id cannot be reported any more.
        if (current_ != nullptr && current_->worker_id != worker_id_ && !current_->cancelled) {
          current_->cancelled = true;
          current_->why = "the worker registered again";
        }
      }
      Log(1, absl::StrFormat("registered with %s as %s (%s, heartbeat every %d ms)",
                             opt_.coordinator, response.worker_id(), request.worker_name(),
                             interval));
      return absl::OkStatus();
    }
    if (Stopping()) return absl::CancelledError("stopping");
    if (IsFatal(s.code())) {
      Log(0, absl::StrCat("RegisterWorker refused: ", s.ToString()));
      return s;
    }
    // The first failure in a row is worth a line; the rest only at debug level.
    Log(failures++ == 0 ? 1 : 2,
        absl::StrCat("RegisterWorker failed (", s.ToString(), "); retrying"));
    if (!SleepFor(NextBackoff(backoff))) return absl::CancelledError("stopping");
  }
}

absl::Status Worker::Reregister(const std::string& stale_id) {
  std::lock_guard<std::mutex> reg(register_mu_);
  if (worker_id() != stale_id) return absl::OkStatus();  // the other thread did it already
  Log(1, absl::StrCat("the coordinator does not know worker ", stale_id, ": registering again"));
  absl::Status s = Register();
  if (s.ok()) {
    std::string task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ != nullptr && current_->cancelled) task = current_->task_id;
    }
    if (!task.empty()) CancelCalls(task);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Background threads

void Worker::CancelCalls(const std::string& task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [ctx, call] : calls_) {
    if (call.task_id == task_id && !call.cancelled) {
      ctx->TryCancel();
      call.cancelled = true;
    }
  }
}

// Turns the stop flag (set by a signal handler, which cannot notify) into a wake-up of every
// waiter and the cancellation of the RPCs that should not outlive it.
void Worker::WatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    cv_.wait_for(lock, milliseconds(10), [&] { return shutdown_; });
    if (shutdown_) break;
    if (!stop_seen_ && Stopping()) {
      stop_seen_ = true;
      stop_time_ = Clock::now();
      cv_.notify_all();
    }
    if (!stop_seen_) continue;
    const bool grace_over = Clock::now() - stop_time_ >= opt_.stop_grace;
    for (auto& [ctx, call] : calls_) {
      if (call.cancelled) continue;
      if (call.kind == CallKind::kStoppable || (call.kind == CallKind::kPush && grace_over)) {
        ctx->TryCancel();
        call.cancelled = true;
      }
    }
  }
}

void Worker::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, milliseconds(std::max<int64_t>(heartbeat_interval_ms_, 10)),
                 [&] { return shutdown_; });
    if (shutdown_) return;
    const std::string id = worker_id_;
    const int64_t interval = heartbeat_interval_ms_;
    std::shared_ptr<TaskState> held = current_;
    if (held != nullptr && held->cancelled) held = nullptr;
    lock.unlock();

    v1::HeartbeatRequest request;
    request.set_worker_id(id);
    if (held != nullptr) request.add_task_ids(held->task_id);
    request.set_resident_bytes(NonNegative(ResidentBytes()));
    request.set_peak_resident_bytes(NonNegative(PeakResidentBytes()));
    v1::HeartbeatResponse response;
    const Clock::time_point sent = Clock::now();
    absl::Status s;
    {
      grpc::ClientContext ctx;
      // Never much longer than the interval: a stuck heartbeat must not hold up the next one.
      SetDeadline(ctx, std::clamp(milliseconds(2 * interval), milliseconds(1000),
                                  std::max(opt_.rpc_deadline, milliseconds(1000))));
      CallScope scope(*this, ctx, CallKind::kHeartbeat);
      s = FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response));
    }
    if (s.ok()) {
      bool cancel = false;
      if (held != nullptr) {
        for (const std::string& t : response.cancelled_task_ids()) cancel |= t == held->task_id;
      }
      {
        std::lock_guard<std::mutex> guard(mu_);
        // (A task finished meanwhile is no longer held: nothing to drop or renew.)
        if (held != nullptr && held != current_) cancel = false;
        if (held != nullptr && held == current_ && !held->cancelled) {
          if (cancel) {
            held->cancelled = true;
            held->why = "cancelled by the coordinator";
          } else if (held->lease_ms > 0) {
            held->lease_deadline = sent + milliseconds(held->lease_ms);
          }
        }
      }
      if (cancel) {
        Log(1, absl::StrCat("task ", held->task_id, " cancelled by the coordinator: dropping it"));
        CancelCalls(held->task_id);
      }
    } else if (s.code() == absl::StatusCode::kNotFound) {
      absl::Status r = Reregister(id);
      if (!r.ok() && !absl::IsCancelled(r)) Log(0, absl::StrCat("re-registration: ", r.ToString()));
    } else if (!absl::IsCancelled(s)) {
      Log(IsTransient(s.code()) ? 2 : 0, absl::StrCat("Heartbeat failed: ", s.ToString()));
    }
    lock.lock();
  }
}

// ---------------------------------------------------------------------------------------------
// The main loop

absl::Status Worker::Run(std::atomic<bool>& stop) {
  stop_ = &stop;
  progress_start_ = Clock::now();
  std::thread watcher([this] { WatchLoop(); });
  std::thread heartbeat;
  absl::Status status = Register();
  if (status.ok()) {
    heartbeat = std::thread([this] { HeartbeatLoop(); });
    milliseconds backoff = opt_.backoff_min;
    int failures = 0;
    while (!Stopping()) {
      const std::string id = worker_id();
      v1::PullTaskRequest request;
      request.set_worker_id(id);
      v1::PullTaskResponse response;
      absl::Status s;
      {
        grpc::ClientContext ctx;
        SetDeadline(ctx, opt_.rpc_deadline);
        CallScope scope(*this, ctx, CallKind::kStoppable);
        s = FromGrpcStatus(stub_->PullTask(&ctx, request, &response));
      }
      if (s.ok()) {
        backoff = opt_.backoff_min;
        if (failures > 0) Log(1, "the coordinator answers again");
        failures = 0;
        if (response.has_task()) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++stats_.tasks_pulled;
          }
          HandleTask(response.task());
        } else if (response.has_no_task()) {
          const int64_t ms = std::clamp<int64_t>(response.no_task().retry_after_ms(), 1, 60000);
          SleepFor(milliseconds(ms));
        } else {
          Log(0, "PullTask answered neither a task nor no_task");
          SleepFor(NextBackoff(backoff));
        }
        continue;
      }
      if (Stopping()) break;
      if (s.code() == absl::StatusCode::kNotFound) {
        absl::Status r = Reregister(id);
        if (!r.ok() && !absl::IsCancelled(r)) {
          status = r;
          break;
        }
        continue;
      }
      if (IsFatal(s.code())) {
        Log(0, absl::StrCat("PullTask refused: ", s.ToString()));
        status = s;
        break;
      }
      Log(failures++ == 0 ? 1 : 2, absl::StrCat("PullTask failed (", s.ToString(), "); retrying"));
      SleepFor(NextBackoff(backoff));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    for (auto& [ctx, call] : calls_) {
      if (!call.cancelled) ctx->TryCancel();
      call.cancelled = true;
    }
  }
  cv_.notify_all();
  if (heartbeat.joinable()) heartbeat.join();
  watcher.join();
  if (absl::IsCancelled(status) && Stopping()) status = absl::OkStatus();
  const WorkerStats st = stats();
  Log(1, absl::StrFormat("stopped: %d tasks done (%d not accepted), %d dropped",
                         st.tasks_done, st.results_rejected, st.tasks_dropped));
  return status;
}

bool Worker::TaskAlive(const TaskState& state, std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state.cancelled) {
    *why = state.why;
    return false;
  }
  if (state.lease_ms > 0 && Clock::now() >= state.lease_deadline) {
    *why = "its lease has expired";
    return false;
  }
  return true;
}

void Worker::HandleTask(const v1::Task& task) {
  auto state = std::make_shared<TaskState>();
  state->task_id = task.task_id();
  state->lease_id = task.lease_id();
  state->worker_id = worker_id();
  state->lease_ms = task.lease_expires_ms();
  state->lease_deadline =
      Clock::now() + milliseconds(std::max<int64_t>(task.lease_expires_ms(), 0));
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = state;
  }
  Outcome outcome = Outcome::kDropped;
  const std::string what = absl::StrFormat("task %s (job %s step %d, layer %d chunk %d)",
                                           task.task_id(), task.job_id(), task.step(),
                                           task.layer(), task.chunk());
  if (task.kind() != v1::Task::BACKWARD) {
    Log(0, absl::StrCat("unsupported task kind ", v1::Task::Kind_Name(task.kind()), " (", what,
                        "): skipped"));
  } else if (task.ahead() != 0 || task.window() != 0) {
    Log(0, absl::StrFormat("unsupported truncated BACKWARD (ahead %d, window %d) in %s: skipped",
                           task.ahead(), task.window(), what));
  } else if (task.dtype() == v1::F32) {
    outcome = RunTask<float>(task, state);
  } else if (task.dtype() == v1::F64) {
    outcome = RunTask<double>(task, state);
  } else {
    Log(0, absl::StrCat("unsupported compute dtype ", v1::DType_Name(task.dtype()), " in ", what,
                        ": skipped"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_.reset();
    if (outcome == Outcome::kDropped) ++stats_.tasks_dropped;
  }
  if (outcome == Outcome::kDone) LogProgress();
}

void Worker::LogProgress() {
  ++progress_done_;
  int64_t done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = stats_.tasks_done;
  }
  if (opt_.log_every <= 0 || done % opt_.log_every != 0) return;
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - progress_start_).count();
  Log(1, absl::StrFormat("%d tasks done, %.2f tasks/s, RSS %.1f MiB (peak %.1f MiB)", done,
                         seconds > 0 ? static_cast<double>(progress_done_) / seconds : 0.0,
                         MiB(ResidentBytes()), MiB(PeakResidentBytes())));
  progress_start_ = now;
  progress_done_ = 0;
}

Worker::JobCache* Worker::JobFor(const v1::Task& task) {
  auto it = jobs_.find(task.job_id());
  if (it == jobs_.end() || it->second.config_json != task.config_json()) {
    absl::StatusOr<MambaConfig> config = ParseConfigJson(ToStd(task.config_json()));
    if (!config.ok()) {
      Log(0, absl::StrCat("task ", task.task_id(), " of job ", task.job_id(),
                          ": bad config_json: ", config.status().ToString(), ": skipped"));
      return nullptr;
    }
    JobCache fresh;
    fresh.config_json = task.config_json();
    fresh.config = std::make_shared<const MambaConfig>(*config);
    it = jobs_.insert_or_assign(task.job_id(), std::move(fresh)).first;
  }
  it->second.last_used = ++job_clock_;
  while (jobs_.size() > static_cast<size_t>(kMaxCachedJobs)) {
    auto oldest = jobs_.begin();
    for (auto j = jobs_.begin(); j != jobs_.end(); ++j) {
      if (j->second.last_used < oldest->second.last_used) oldest = j;
    }
    jobs_.erase(oldest);  // never `it`: it was just used
  }
  return &it->second;
}

template <typename T>
Worker::Outcome Worker::RunTask(const v1::Task& task, const std::shared_ptr<TaskState>& state) {
  const std::string& tid = task.task_id();
  auto skip = [&](const std::string& why) {
    Log(0, absl::StrCat("task ", tid, ": ", why, ": skipped"));
    return Outcome::kDropped;
  };
  auto drop = [&](const std::string& why) {
    Log(1, absl::StrCat("task ", tid, " dropped: ", why));
    return Outcome::kDropped;
  };

  JobCache* job = JobFor(task);
  if (job == nullptr) return Outcome::kDropped;
  const std::shared_ptr<const MambaConfig> config = job->config;
  const MambaConfig& cfg = *config;
  const int64_t K = cfg.num_hidden_layers, D = cfg.hidden_size, Di = cfg.inner(),
                N = cfg.state_size, W = cfg.conv_kernel;
  const int64_t k = task.layer(), halo = task.halo(), len = task.len(), t0 = task.t0();
  if (k < 0 || k >= K) return skip(absl::StrFormat("layer %d outside 0..%d", k, K - 1));
  if (len < 1 || len > (int64_t{1} << 32)) return skip(absl::StrFormat("bad len %d", len));
  if (t0 < 0 || halo != std::min(W - 1, t0)) {
    return skip(absl::StrFormat("halo %d is not min(W - 1 = %d, t0 = %d)", halo, W - 1, t0));
  }
  if (task.context_length() > 0 && t0 + len > task.context_length()) {
    return skip(absl::StrFormat("chunk [%d, %d) past the context length %d", t0, t0 + len,
                                task.context_length()));
  }

  // Parameters: the job keeps the newest version only; an older task's are not cached.
  if (!job->has_version || task.params_version() > job->params_version) {
    job->f32.clear();
    job->f64.clear();
    job->has_version = true;
    job->params_version = task.params_version();
  }
  const bool cacheable = task.params_version() == job->params_version;
  auto& layer_cache = [&]() -> auto& {
    if constexpr (std::is_same_v<T, double>) {
      return job->f64;
    } else {
      return job->f32;
    }
  }();
  std::shared_ptr<const LayerParams<T>> params;
  if (cacheable) {
    auto it = layer_cache.find(k);
    if (it != layer_cache.end()) params = it->second;
  }
  const bool include_params = params == nullptr;

  // What must (and may) arrive.
  const std::vector<Expected> inputs = {
      {"u", {halo + len, D}}, {"g", {len, D}}, {"h0", {Di, N}}, {"mu", {Di, N}}};
  const std::vector<Expected> param_names = [&] {
    std::vector<Expected> names;
    for (const LayerParamSlot<T>& slot : LayerParamSlots<T>())
      names.push_back({LayerParamName(k, slot.suffix), slot.shape(cfg)});
    return names;
  }();
  // The assembler refuses anything larger than the largest expected stream (f64 throughout).
  AssemblerLimits limits{.max_tensor_bytes = 0, .max_total_bytes = 0};
  for (const std::vector<Expected>* list : {&inputs, &param_names}) {
    for (const Expected& e : *list) {
      const uint64_t bytes = static_cast<uint64_t>(ShapeNumel(e.shape)) * 8;  // f64 at most
      limits.max_tensor_bytes = std::max(limits.max_tensor_bytes, bytes);
      limits.max_total_bytes += bytes;
    }
  }

  // Fetch, retrying transient failures while the lease may still be alive.
  TensorMap got;
  std::string why;
  milliseconds backoff = opt_.backoff_min;
  for (;;) {
    if (!TaskAlive(*state, &why)) return drop(why);
    if (Stopping()) return drop("stopping");
    v1::FetchInputsRequest request;
    request.set_worker_id(state->worker_id);
    request.set_task_id(tid);
    request.set_lease_id(state->lease_id);
    request.set_include_params(include_params);
    if (include_params) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.params_fetched;
    }
    got.clear();
    absl::Status stream_error, s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      CallScope scope(*this, ctx, CallKind::kStoppable, tid);
      std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader =
          stub_->FetchInputs(&ctx, request);
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
      return skip(absl::StrCat("malformed inputs: ", stream_error.ToString()));
    }
    if (s.ok()) break;
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      return drop(absl::StrCat("lease lost (", s.message(), ")"));
    }
    if (absl::IsCancelled(s)) {
      if (!TaskAlive(*state, &why)) return drop(why);
      return drop("stopping");
    }
    if (!IsTransient(s.code())) return drop(absl::StrCat("FetchInputs: ", s.ToString()));
    Log(2, absl::StrCat("task ", tid, ": FetchInputs failed (", s.ToString(), "); retrying"));
    if (!SleepFor(NextBackoff(backoff))) return drop("stopping");
  }

  // Check every tensor, then convert.
  auto take = [&](const Expected& e, std::vector<T>& out) -> absl::Status {
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
  };
  BackwardTaskInputs<T> in;
  in.layer = k, in.chunk = task.chunk();
  in.rows = {halo, len, 0};
  for (auto [e, out] : {std::pair{&inputs[0], &in.u}, {&inputs[1], &in.g}, {&inputs[2], &in.h0}}) {
    if (absl::Status st = take(*e, *out); !st.ok()) return skip(std::string(st.message()));
  }
  if (got.count("mu") > 0) {
    if (absl::Status st = take(inputs[3], in.mu); !st.ok()) return skip(std::string(st.message()));
  }
  // Parameters: required when asked for; sent anyway, all of them are taken.
  if (include_params || got.count(param_names[0].name) > 0) {
    auto fetched = std::make_shared<LayerParams<T>>();
    const auto& slots = LayerParamSlots<T>();
    for (size_t i = 0; i < slots.size(); ++i) {
      absl::Status st = take(param_names[i], (*fetched).*slots[i].member);
      if (!st.ok()) return skip(std::string(st.message()));
    }
    params = fetched;
    if (cacheable) layer_cache[k] = params;
  }
  if (!got.empty()) return skip(absl::StrCat("unexpected tensor \"", got.begin()->first, "\""));

  if (!TaskAlive(*state, &why)) return drop(why);
  if (Stopping()) return drop("stopping");

  // Compute (the block holds references to cfg and *params, both alive until the end here).
  const Clock::time_point started = Clock::now();
  BackwardTaskOutputs<T>& out = [&]() -> BackwardTaskOutputs<T>& {
    if constexpr (std::is_same_v<T, double>) {
      return out_f64_;
    } else {
      return out_f32_;
    }
  }();
  {
    const cpu::MambaBlockCpu<T> block(cfg, *params);
    RunBackwardTask(block, cfg, in, out);
  }
  const double compute_s = std::chrono::duration<double>(Clock::now() - started).count();

  // Push, retrying transient failures while the lease may still be alive.
  const DType dtype = ComputeDType<T>();
  std::vector<std::pair<std::string, HostTensor>> results;
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
  backoff = opt_.backoff_min;
  for (;;) {
    if (!TaskAlive(*state, &why)) return drop(why);
    v1::PushResultResponse response;
    absl::Status s;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx, opt_.stream_deadline);
      CallScope scope(*this, ctx, CallKind::kPush, tid);
      std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
          stub_->PushResult(&ctx, &response);
      v1::ResultChunk msg;
      v1::ResultHeader* header = msg.mutable_header();
      header->set_worker_id(state->worker_id);
      header->set_task_id(tid);
      header->set_lease_id(state->lease_id);
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
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.tasks_done;
        if (!response.accepted()) ++stats_.results_rejected;
      }
      if (response.accepted()) {
        Log(2, absl::StrFormat("task %s done: layer %d chunk %d, %.3f s compute", tid, k,
                               task.chunk(), compute_s));
      } else {
        // Normal: a late or duplicate result, or a stale lease.
        Log(2, absl::StrCat("task ", tid, ": result not accepted (", response.reason(), ")"));
      }
      break;
    }
    if (absl::IsCancelled(s)) {
      if (!TaskAlive(*state, &why)) return drop(why);
      return drop("stopped before the result was delivered");
    }
    if (!IsTransient(s.code()) || Stopping()) {
      return drop(absl::StrCat("PushResult: ", s.ToString()));
    }
    Log(2, absl::StrCat("task ", tid, ": PushResult failed (", s.ToString(), "); retrying"));
    if (!SleepFor(NextBackoff(backoff))) return drop("stopping");
  }
  return Outcome::kDone;
}

}  // namespace adjsh::worker
