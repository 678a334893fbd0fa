#include "coordinator/job_service.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/file_io.h"
#include "common/model.h"
#include "common/tokens.h"
#include "proto/status_util.h"
#include "train/trainer.h"

namespace adjsh::coordinator {
namespace fs = std::filesystem;
namespace {

constexpr int64_t kDefaultChunk = 256;  // as adjsh train's --chunk
constexpr size_t kMaxEvents = 4096;     // kept per job for watchers that lag behind
constexpr size_t kThroughputSteps = 8;  // tokens_per_s: mean over this many recent steps
constexpr int32_t kDefaultPageSize = 100, kMaxPageSize = 1000;

absl::Status Invalid(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

bool Terminal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED || s == v1::Job::CANCELLED;
}

std::string StateName(v1::Job::State s) { return v1::Job::State_Name(s); }

void SetNow(google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(absl::Now());
  ts->set_seconds(ns / 1000000000);
  ts->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

// The config of an InitConfig, defaults filled in as `adjsh train` / `adjsh init` do.
absl::StatusOr<MambaConfig> ConfigFromInit(const v1::InitConfig& init) {
  struct Field {
    const char* name;
    int64_t value, min;
  };
  for (const Field& f :
       {Field{"init.hidden_size", init.hidden_size(), 1}, Field{"init.layers", init.layers(), 1},
        Field{"init.vocab_size", init.vocab_size(), 1},
        Field{"init.state_size", init.state_size(), 0},
        Field{"init.conv_kernel", init.conv_kernel(), 0}, Field{"init.expand", init.expand(), 0},
        Field{"init.dt_rank", init.dt_rank(), 0}}) {
    if (f.value < f.min || f.value > (int64_t{1} << 31)) {
      return Invalid(f.name, absl::StrFormat("must be in [%d, 2^31], got %d", f.min, f.value));
    }
  }
  MambaConfig c;
  c.hidden_size = init.hidden_size();
  c.num_hidden_layers = init.layers();
  c.vocab_size = init.vocab_size();
  if (init.state_size() > 0) c.state_size = init.state_size();
  if (init.conv_kernel() > 0) c.conv_kernel = init.conv_kernel();
  if (init.expand() > 0) c.expand = init.expand();
  c.time_step_rank = init.dt_rank() > 0 ? init.dt_rank() : (c.hidden_size + 15) / 16;
  if (absl::Status s = ValidateConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("init: ", s.message()));
  }
  return c;
}

// A file that must exist on the coordinator: NOT_FOUND naming the field otherwise.
absl::Status CheckFile(const std::string& field, const std::string& path) {
  if (path.empty()) return Invalid(field, "is empty");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    return absl::NotFoundError(absl::StrCat(field, ": ", path, " does not exist"));
  }
  if (fs::is_directory(st)) return Invalid(field, absl::StrCat(path, " is a directory"));
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const v1::AdamW& o) {
  auto real = [](const char* name, bool has, double v, bool ok, const char* want) {
    if (!has || (std::isfinite(v) && ok)) return absl::OkStatus();
    return Invalid(absl::StrCat("optimizer.", name), absl::StrCat("must be ", want, ", got ", v));
  };
  for (absl::Status s :
       {real("lr", o.has_lr(), o.lr(), o.lr() > 0, "> 0"),
        real("beta1", o.has_beta1(), o.beta1(), o.beta1() >= 0 && o.beta1() < 1, "in [0, 1)"),
        real("beta2", o.has_beta2(), o.beta2(), o.beta2() >= 0 && o.beta2() < 1, "in [0, 1)"),
        real("eps", o.has_eps(), o.eps(), o.eps() > 0, "> 0"),
        real("weight_decay", o.has_weight_decay(), o.weight_decay(), o.weight_decay() >= 0, ">= 0"),
        real("min_lr_ratio", o.has_min_lr_ratio(), o.min_lr_ratio(),
             o.min_lr_ratio() >= 0 && o.min_lr_ratio() <= 1, "in [0, 1]"),
        real("grad_clip", o.has_grad_clip(), o.grad_clip(), o.grad_clip() >= 0, ">= 0")}) {
    if (!s.ok()) return s;
  }
  if (o.has_warmup_steps() && o.warmup_steps() < 0) {
    return Invalid("optimizer.warmup_steps", absl::StrCat("must be >= 0, got ", o.warmup_steps()));
  }
  return absl::OkStatus();
}

train::AdamWOptions AdamWFromSpec(const v1::AdamW& o) {
  train::AdamWOptions a;  // unset fields: train/optimizer.h's defaults
  if (o.has_lr()) a.lr = o.lr();
  if (o.has_beta1()) a.beta1 = o.beta1();
  if (o.has_beta2()) a.beta2 = o.beta2();
  if (o.has_eps()) a.eps = o.eps();
  if (o.has_weight_decay()) a.weight_decay = o.weight_decay();
  if (o.has_warmup_steps()) a.warmup_steps = o.warmup_steps();
  if (o.has_min_lr_ratio()) a.min_lr_ratio = o.min_lr_ratio();
  if (o.has_grad_clip()) a.grad_clip = o.grad_clip();
  return a;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The newest checkpoint folder under root (root/latest), or "" when there is none.
std::string LatestCheckpoint(const std::string& root) {
  if (root.empty()) return "";
  absl::StatusOr<std::string> latest = ReadFileToString((fs::path(root) / "latest").string());
  if (!latest.ok()) return "";
  std::string name = *latest;
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name.empty() ? "" : (fs::path(root) / name).string();
}

// 16 random hex digits, different for every coordinator process.
std::string InstanceId() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  const uint64_t t = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return absl::StrFormat("%016x", ((hi << 32) | lo) ^ t);
}

}  // namespace

absl::Status JobServiceImpl::ValidateSpec(const v1::JobSpec& spec) {
  // The model.
  int64_t vocab = 0;
  switch (spec.model_case()) {
    case v1::JobSpec::kModelDir: {
      const std::string& dir = spec.model_dir();
      if (dir.empty()) return Invalid("model_dir", "is empty");
      std::error_code ec;
      if (!fs::exists(dir, ec)) {
        return absl::NotFoundError(absl::StrCat("model_dir: ", dir, " does not exist"));
      }
      if (!fs::is_directory(dir, ec))
        return Invalid("model_dir", absl::StrCat(dir, " is not a directory"));
      for (const char* file : {"config.json", "model.safetensors"}) {
        if (!fs::exists(fs::path(dir) / file, ec)) {
          return absl::NotFoundError(absl::StrCat("model_dir: ", dir, " has no ", file));
        }
      }
      absl::StatusOr<MambaConfig> c = LoadConfigFile((fs::path(dir) / "config.json").string());
      if (!c.ok())
        return absl::Status(c.status().code(), absl::StrCat("model_dir: ", c.status().message()));
      vocab = c->vocab_size;
      break;
    }
    case v1::JobSpec::kInit: {
      absl::StatusOr<MambaConfig> c = ConfigFromInit(spec.init());
      if (!c.ok()) return c.status();
      vocab = c->vocab_size;
      break;
    }
    default:
      return Invalid("model", "the spec has no model: give model_dir or init");
  }

  // Sizes and modes.
  if (spec.context_length() < 2) {
    return Invalid("context_length",
                   absl::StrCat("must be >= 2 tokens, got ", spec.context_length()));
  }
  if (spec.steps() < 1) return Invalid("steps", absl::StrCat("must be >= 1, got ", spec.steps()));
  if (spec.chunk() < 0) {
    return Invalid("chunk",
                   absl::StrCat("must be >= 1 (or 0 for the default 256), got ", spec.chunk()));
  }
  if (spec.window() < 0)
    return Invalid("window", absl::StrCat("must be >= 0, got ", spec.window()));
  if (spec.window() > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "window: the truncated adjoint (window ", spec.window(),
        ") is not supported on remote workers, which compute the exact gradient only; use "
        "window 0, or adjsh train --window for in-process truncated training"));
  }
  if (spec.dtype() == "f64") {
    return absl::UnimplementedError(
        "dtype: f64 is not supported on remote workers (f32 only); use \"f32\" or leave it empty");
  }
  if (!spec.dtype().empty() && spec.dtype() != "f32") {
    return Invalid("dtype", absl::StrCat("must be \"f32\" (or empty), got \"", spec.dtype(), "\""));
  }
  if (spec.checkpoint_every() < 0) {
    return Invalid("checkpoint_every", absl::StrCat("must be >= 0, got ", spec.checkpoint_every()));
  }
  if (absl::Status s = CheckOptimizer(spec.optimizer()); !s.ok()) return s;

  // The data.
  switch (spec.data_case()) {
    case v1::JobSpec::kTokenFile: {
      const std::string& path = spec.token_file();
      if (path.empty()) return Invalid("token_file", "is empty");
      if (!EndsWith(path, ".u32") && !EndsWith(path, ".u16")) {
        return Invalid("token_file", absl::StrCat(path, " is not a .u32 or .u16 token file"));
      }
      if (absl::Status s = CheckFile("token_file", path); !s.ok()) return s;
      break;
    }
    case v1::JobSpec::kTextFiles: {
      if (spec.text_files().paths().empty()) return Invalid("text_files.paths", "is empty");
      for (int i = 0; i < spec.text_files().paths_size(); ++i) {
        if (absl::Status s =
                CheckFile(absl::StrCat("text_files.paths[", i, "]"), spec.text_files().paths(i));
            !s.ok())
          return s;
      }
      break;
    }
    default:
      if (BuiltinCorpusFiles().empty()) {
        return absl::FailedPreconditionError(
            "data: the spec has no data and the built-in corpus (/usr/share/common-licenses) is "
            "empty on the coordinator; give token_file or text_files");
      }
  }
  if (spec.data_case() != v1::JobSpec::kTokenFile && vocab < 256) {
    return Invalid(spec.model_case() == v1::JobSpec::kInit ? "init.vocab_size" : "model_dir",
                   absl::StrCat("byte-level data (text files or the built-in corpus) needs a "
                                "vocabulary of at least 256, the model has ",
                                vocab));
  }

  if (!spec.checkpoint_dir().empty()) {
    std::error_code ec;
    if (fs::exists(spec.checkpoint_dir(), ec) && !fs::is_directory(spec.checkpoint_dir(), ec)) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint_dir: ", spec.checkpoint_dir(),
                                                        " exists and is not a directory"));
    }
  }
  return absl::OkStatus();
}

JobServiceImpl::JobServiceImpl(TaskServiceImpl& tasks, JobServiceOptions options)
    : tasks_(tasks), opt_(std::move(options)), instance_(InstanceId()) {
  if (!opt_.state_dir.empty()) {
    // Continue the numbering after the job folders a previous coordinator left.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(opt_.state_dir, ec)) {
      const std::string n = e.path().filename().string();
      int64_t k = 0;
      if (n.rfind("job-", 0) == 0 && absl::SimpleAtoi(n.substr(4), &k) && k >= next_id_) {
        next_id_ = k + 1;
      }
    }
  }
  runner_ = std::thread([this] { RunLoop(); });
  pump_ = std::thread([this] { CancelPump(); });
}

JobServiceImpl::~JobServiceImpl() { Shutdown(); }

void JobServiceImpl::Shutdown() {
  {
    std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        stopping_ = true;
        for (auto& rec : queue_) {
          if (rec->job.state() == v1::Job::QUEUED) {
            SetState(*rec, v1::Job::CANCELLED, "cancelled: the coordinator is shutting down");
          }
        }
        queue_.clear();
        if (running_ && running_->job.state() == v1::Job::RUNNING) {
          running_->cancel.store(true);
          SetState(*running_, v1::Job::CANCELLED, "cancelled: the coordinator is shutting down");
        }
      }
      cv_.notify_all();
    }
    tasks_.CancelCurrent();
  }
  if (runner_.joinable()) runner_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pump_stop_ = true;
    cv_.notify_all();
  }
  if (pump_.joinable()) pump_.join();
}

std::shared_ptr<JobServiceImpl::JobRecord> JobServiceImpl::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobServiceImpl::PushEvent(JobRecord& rec, v1::JobEvent event) {
  event.set_job_id(rec.job.job_id());
  if (!event.has_time()) SetNow(event.mutable_time());
  rec.events.push_back(std::move(event));
  while (rec.events.size() > kMaxEvents) {
    rec.events.pop_front();
    ++rec.first_event;
  }
  cv_.notify_all();
}

void JobServiceImpl::SetState(JobRecord& rec, v1::Job::State state, const std::string& message) {
  rec.job.set_state(state);
  if (state == v1::Job::FAILED) rec.job.set_error(message);
  if (Terminal(state)) rec.eta_seconds = 0;
  rec.state_message = message;
  SetNow(rec.job.mutable_updated());
  if (opt_.log) {
    std::fprintf(stderr, "%s: %s%s%s\n", rec.job.job_id().c_str(), StateName(state).c_str(),
                 message.empty() ? "" : ": ", message.c_str());
  }
  PushEvent(rec, Summary(rec));
}

v1::JobEvent JobServiceImpl::Summary(const JobRecord& rec) const {
  v1::JobEvent e;
  e.set_job_id(rec.job.job_id());
  e.set_step(rec.job.step());
  e.set_loss(rec.job.loss());
  e.set_tokens_per_s(rec.job.tokens_per_s());
  e.set_eta_seconds(Terminal(rec.job.state()) ? 0 : rec.eta_seconds);
  e.set_state(rec.job.state());
  e.set_message(rec.state_message);
  SetNow(e.mutable_time());
  return e;
}

absl::StatusOr<v1::Job> JobServiceImpl::Submit(const v1::JobSpec& spec) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  auto rec = std::make_shared<JobRecord>();
  const std::string id = absl::StrCat("job-", next_id_++);
  rec->job.set_job_id(id);
  *rec->job.mutable_spec() = spec;
  rec->job.set_state(v1::Job::QUEUED);
  SetNow(rec->job.mutable_created());
  *rec->job.mutable_updated() = rec->job.created();
  rec->checkpoint_dir = !spec.checkpoint_dir().empty() ? spec.checkpoint_dir()
                        : opt_.state_dir.empty()       ? ""
                                                       : (fs::path(opt_.state_dir) / id).string();
  int64_t ahead = running_ ? 1 : 0;
  for (const auto& q : queue_) ahead += q->job.state() == v1::Job::QUEUED ? 1 : 0;
  SetState(*rec, v1::Job::QUEUED,
           absl::StrCat("queued, ", ahead, ahead == 1 ? " job" : " jobs", " ahead; checkpoints: ",
                        rec->checkpoint_dir.empty() ? "none" : rec->checkpoint_dir));
  jobs_[id] = rec;
  order_.push_back(rec);
  queue_.push_back(rec);
  cv_.notify_all();
  return rec->job;
}

absl::StatusOr<v1::Job> JobServiceImpl::Get(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<JobRecord> rec = Find(job_id);
  if (!rec) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  return rec->job;
}

absl::StatusOr<v1::ListJobsResponse> JobServiceImpl::List(const v1::ListJobsRequest& req) const {
  if (req.page_size() < 0) return Invalid("page_size", "must be >= 0");
  const int32_t size =
      req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  int64_t offset = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &offset) || offset < 0)) {
    return Invalid("page_token", absl::StrCat("malformed page token '", req.page_token(), "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const v1::Job*> matching;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const v1::Job& job = (*it)->job;
    bool ok = req.states().empty();
    for (int s : req.states()) ok = ok || s == job.state();
    if (ok) matching.push_back(&job);
  }
  v1::ListJobsResponse resp;
  for (int64_t k = offset; k < static_cast<int64_t>(matching.size()) && k < offset + size; ++k) {
    *resp.add_jobs() = *matching[k];
  }
  if (offset + size < static_cast<int64_t>(matching.size())) {
    resp.set_next_page_token(absl::StrCat(offset + size));
  }
  return resp;
}

absl::StatusOr<v1::Job> JobServiceImpl::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
  v1::Job out;
  bool was_running = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<JobRecord> rec = Find(job_id);
    if (!rec) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
    switch (rec->job.state()) {
      case v1::Job::CANCELLED:
        return rec->job;
      case v1::Job::SUCCEEDED:
      case v1::Job::FAILED:
        return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has already finished (",
                                                          StateName(rec->job.state()), ")"));
      case v1::Job::QUEUED:
        SetState(*rec, v1::Job::CANCELLED, "cancelled before it started");
        break;
      default:  // RUNNING
        rec->cancel.store(true);
        was_running = true;
        SetState(*rec, v1::Job::CANCELLED,
                 absl::StrCat("cancelled while running, after step ", rec->job.step(), " of ",
                              rec->job.spec().steps()));
        break;
    }
    out = rec->job;
  }
  if (was_running) tasks_.CancelCurrent();
  return out;
}

void JobServiceImpl::CancelPump() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pump_stop_ || (running_ && running_->cancel.load()); });
    if (pump_stop_) return;
    lock.unlock();
    {
      std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
      std::lock_guard<std::mutex> inner(mu_);
      // Still the same cancelled job (the runner retires jobs under cancel_mu_).
      if (running_ && running_->cancel.load()) tasks_.CancelCurrent();
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return pump_stop_; });
  }
}

void JobServiceImpl::RunLoop() {
  for (;;) {
    std::shared_ptr<JobRecord> rec;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      rec = queue_.front();
      queue_.pop_front();
      if (rec->job.state() != v1::Job::QUEUED) continue;  // cancelled while queued
      running_ = rec;
      SetState(*rec, v1::Job::RUNNING,
               absl::StrCat("running; checkpoints: ",
                            rec->checkpoint_dir.empty() ? "none" : rec->checkpoint_dir));
    }
    const absl::Status status = RunJob(*rec);
    std::lock_guard<std::mutex> cancel_lock(cancel_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
    if (rec->job.state() == v1::Job::RUNNING) {
      if (status.ok()) {
        SetState(*rec, v1::Job::SUCCEEDED,
                 absl::StrFormat("done: step %d, loss %.4f%s", rec->job.step(), rec->job.loss(),
                                 rec->job.last_checkpoint().empty()
                                     ? ""
                                     : absl::StrCat("; checkpoint ", rec->job.last_checkpoint())));
      } else if (rec->cancel.load()) {
        SetState(*rec, v1::Job::CANCELLED, "cancelled");
      } else {
        SetState(*rec, v1::Job::FAILED, status.ToString());
      }
    }
    cv_.notify_all();
  }
}

absl::Status JobServiceImpl::RunJob(JobRecord& rec) {
  v1::JobSpec spec;
  std::string job_id, ckpt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = rec.job.spec();
    job_id = rec.job.job_id();
    ckpt = rec.checkpoint_dir;
  }
  const absl::Status cancelled = absl::CancelledError("the job was cancelled");

  ModelParams<float> params;
  if (spec.model_case() == v1::JobSpec::kModelDir) {
    absl::StatusOr<ModelParams<float>> p = LoadModelDir<float>(spec.model_dir());
    if (!p.ok()) return p.status();
    params = std::move(*p);
  } else {
    absl::StatusOr<MambaConfig> c = ConfigFromInit(spec.init());
    if (!c.ok()) return c.status();
    params = InitParams<float>(*c, spec.init().seed());
  }
  if (rec.cancel.load()) return cancelled;

  absl::StatusOr<std::vector<uint32_t>> corpus;
  if (spec.data_case() == v1::JobSpec::kTokenFile) {
    corpus = ReadTokenFile(spec.token_file());
  } else {
    std::vector<std::string> files;
    if (spec.data_case() == v1::JobSpec::kTextFiles) {
      files.assign(spec.text_files().paths().begin(), spec.text_files().paths().end());
    } else {
      files = BuiltinCorpusFiles();
    }
    corpus = ReadTextAsBytes(files);
  }
  if (!corpus.ok()) return corpus.status();
  if (rec.cancel.load()) return cancelled;

  train::TrainOptions opt;
  opt.steps = spec.steps();
  opt.context = spec.context_length();
  opt.grad.chunk = spec.chunk() > 0 ? spec.chunk() : kDefaultChunk;
  opt.grad.window = 0;
  opt.grad.threads = opt_.threads;
  opt.adamw = AdamWFromSpec(spec.optimizer());
  opt.checkpoint_dir = ckpt;
  opt.checkpoint_every = spec.checkpoint_every();

  train::Trainer trainer(std::move(params), std::move(*corpus), opt);
  if (absl::Status s = trainer.Init(); !s.ok()) return s;
  if (trainer.resumed()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rec.job.state() == v1::Job::RUNNING) {
      rec.job.set_step(trainer.state().step);
      rec.job.set_loss(trainer.state().last_loss);
      rec.job.set_last_checkpoint(LatestCheckpoint(ckpt));
      SetNow(rec.job.mutable_updated());
      rec.state_message = absl::StrCat("running; resumed from the checkpoint at step ",
                                       trainer.state().step, " in ", ckpt);
      if (opt_.log) std::fprintf(stderr, "%s: %s\n", job_id.c_str(), rec.state_message.c_str());
      PushEvent(rec, Summary(rec));
    }
  }

  const std::string task_job_id = absl::StrCat(job_id, "@", instance_);
  int64_t step = trainer.state().step;
  trainer.set_gradient_source(
      [&](const ModelParams<float>& p,
          std::span<const uint32_t> tokens) -> absl::StatusOr<GradResult<float>> {
        if (rec.cancel.load()) return cancelled;
        absl::StatusOr<GradResult<float>> g =
            tasks_.ComputeGradient(p, tokens, opt.grad, task_job_id, step++);
        if (rec.cancel.load()) return cancelled;
        return g;
      });

  return trainer.Run([&](const train::StepReport& r) {
    const bool wrote =
        !ckpt.empty() &&
        (r.step == r.steps || (opt.checkpoint_every > 0 && r.step % opt.checkpoint_every == 0));
    const std::string written = wrote ? LatestCheckpoint(ckpt) : "";
    std::lock_guard<std::mutex> lock(mu_);
    if (rec.job.state() != v1::Job::RUNNING) return;  // cancelled: no more progress
    rec.recent_seconds.push_back(r.seconds);
    while (rec.recent_seconds.size() > kThroughputSteps) rec.recent_seconds.pop_front();
    const double secs = std::accumulate(rec.recent_seconds.begin(), rec.recent_seconds.end(), 0.0);
    const double tps = secs > 0 ? static_cast<double>(opt.context) *
                                      static_cast<double>(rec.recent_seconds.size()) / secs
                                : r.tokens_per_s;
    rec.job.set_step(r.step);
    rec.job.set_loss(r.loss);
    rec.job.set_tokens_per_s(tps);
    if (!written.empty()) rec.job.set_last_checkpoint(written);
    SetNow(rec.job.mutable_updated());
    rec.eta_seconds = r.eta_seconds;
    v1::JobEvent e;
    e.set_step(r.step);
    e.set_loss(r.loss);
    e.set_tokens_per_s(tps);
    e.set_eta_seconds(r.eta_seconds);
    e.set_state(v1::Job::RUNNING);
    if (!written.empty()) e.set_message(absl::StrCat("checkpoint ", written));
    PushEvent(rec, std::move(e));
  });
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const v1::JobSpec* spec,
                                       v1::Job* job) {
  absl::StatusOr<v1::Job> j = Submit(*spec);
  if (!j.ok()) return ToGrpcStatus(j.status());
  *job = std::move(*j);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                    v1::Job* job) {
  absl::StatusOr<v1::Job> j = Get(req->job_id());
  if (!j.ok()) return ToGrpcStatus(j.status());
  *job = std::move(*j);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                      v1::ListJobsResponse* resp) {
  absl::StatusOr<v1::ListJobsResponse> r = List(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                                       v1::Job* job) {
  absl::StatusOr<v1::Job> j = Cancel(req->job_id());
  if (!j.ok()) return ToGrpcStatus(j.status());
  *job = std::move(*j);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  std::shared_ptr<JobRecord> rec;
  v1::JobEvent first;
  int64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rec = Find(req->job_id());
    if (!rec) {
      return ToGrpcStatus(absl::NotFoundError(absl::StrCat("unknown job '", req->job_id(), "'")));
    }
    first = Summary(*rec);
    seq = rec->next_event();
  }
  const grpc::Status gone(grpc::StatusCode::CANCELLED, "the watcher went away");
  if (!writer->Write(first)) return gone;
  if (Terminal(first.state())) return grpc::Status::OK;
  for (;;) {
    std::vector<v1::JobEvent> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return rec->next_event() > seq; });
      if (ctx->IsCancelled()) return gone;
      if (seq < rec->first_event) {  // fell behind the kept events: summarise
        batch.push_back(Summary(*rec));
      } else {
        for (int64_t k = seq; k < rec->next_event(); ++k)
          batch.push_back(rec->events[k - rec->first_event]);
      }
      seq = rec->next_event();
    }
    for (const v1::JobEvent& e : batch) {
      if (!writer->Write(e)) return gone;
      if (Terminal(e.state())) return grpc::Status::OK;
    }
  }
}

}  // namespace adjsh::coordinator
