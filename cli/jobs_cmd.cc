// adjsh submit / status / watch / cancel: clients of a coordinator's JobService
// (proto/adjsh.proto, coordinator/job_service.h) over gRPC: TLS with a bearer token, or
// plaintext to a loopback coordinator (cli/security_flags.h).
//
// Exit codes: 0 success; 1 a failure (coordinator unreachable or answering with an error, a
// watched job that FAILED or was CANCELLED, an unreadable spec file); 2 bad usage.
// Every request has a deadline (--timeout); a refused connection fails at once.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "common/file_io.h"
#include "engine/adjoint_engine.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/status_util.h"
#include "proto/transport.h"

namespace adjsh::cli {
namespace {

constexpr const char* kDefaultCoordinator = "127.0.0.1:50051";

void AddClientFlags(ArgParser& a) {
  a.Add("coordinator", "HOST:PORT", "the coordinator's address", kDefaultCoordinator);
  a.Add("timeout", "S", "seconds to wait for the coordinator's answer to a request", "5");
  AddClientSecurityFlags(a, /*worker=*/false);
}

// A JobService stub with the per-request deadline of --timeout.
class Client {
 public:
  // error->usage tells a bad flag (exit 2) from a bad certificate or token file (exit 1).
  static absl::StatusOr<Client> Make(const ArgParser& a, SecurityError* error) {
    Client c;
    error->usage = true;
    c.address_ = a.Get("coordinator");
    if (c.address_.empty()) return absl::InvalidArgumentError("--coordinator is empty");
    absl::StatusOr<int64_t> t = a.GetInt("timeout", 1, 3600);
    if (!t.ok()) return t.status();
    c.timeout_s_ = *t;
    absl::StatusOr<ClientSecurity> security =
        ClientSecurityFromFlags(a, c.address_, /*worker=*/false, error);
    if (!security.ok()) return security.status();
    c.stub_ = v1::JobService::NewStub(grpc::CreateCustomChannel(
        c.address_, ChannelCredentialsFor(*security), ClientChannelArgs()));
    return c;
  }

  void Prepare(grpc::ClientContext& ctx, bool deadline = true) const {
    if (deadline)
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s_));
  }
  // The RPC's status as absl, with unreachable / timed-out coordinators explained.
  absl::Status Check(const grpc::Status& s) const {
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator at ", address_, " (", s.error_message(), ")"));
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::DeadlineExceededError(absl::StrCat("no answer from the coordinator at ",
                                                      address_, " within ", timeout_s_, " s"));
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      const absl::Status a = FromGrpcStatus(s);
      return absl::Status(a.code(), absl::StrCat("the coordinator at ", address_, " refused the "
                                                 "call (", absl::StatusCodeToString(a.code()),
                                                 "): ", a.message()));
    }
    return FromGrpcStatus(s);
  }
  v1::JobService::Stub& stub() const { return *stub_; }

 private:
  std::string address_;
  int64_t timeout_s_ = 5;
  std::shared_ptr<v1::JobService::Stub> stub_;
};

absl::StatusOr<v1::Job> GetJob(const Client& c, const std::string& id) {
  grpc::ClientContext ctx;
  c.Prepare(ctx);
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  if (absl::Status s = c.Check(c.stub().GetJob(&ctx, req, &job)); !s.ok()) return s;
  return job;
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

std::string Rate(double tokens_per_s) {
  return tokens_per_s >= 1e6   ? absl::StrFormat("%.2fM", tokens_per_s / 1e6)
         : tokens_per_s >= 1e3 ? absl::StrFormat("%.1fK", tokens_per_s / 1e3)
                               : absl::StrFormat("%.0f", tokens_per_s);
}

std::string State(v1::Job::State s) { return v1::Job::State_Name(s); }

bool Terminal(v1::Job::State s) {
  return s == v1::Job::SUCCEEDED || s == v1::Job::FAILED || s == v1::Job::CANCELLED;
}

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.string();
}

// ---------------------------------------------------------------------------------------------
// submit

// Job flags of `adjsh submit`, mapped onto a JobSpec; their defaults (applied when unset) are
// those of `adjsh train`.
struct JobFlag {
  const char* name;
  const char* value;
  const char* help;
};
constexpr JobFlag kJobFlags[] = {
    {"model", "DIR", "model to start from (default: a new model from the shape flags)"},
    {"hidden-size", "D", "width of a new model (default 128)"},
    {"layers", "K", "layers of a new model (default 4)"},
    {"vocab-size", "V", "vocabulary of a new model (default 256)"},
    {"state-size", "N", "SSM state size of a new model (default 16)"},
    {"conv-kernel", "W", "causal conv width of a new model (default 4)"},
    {"expand", "E", "inner width factor of a new model (default 2)"},
    {"dt-rank", "R", "dt rank of a new model, or auto = ceil(D/16) (default auto)"},
    {"seed", "S", "initialisation seed of a new model (default 0)"},
    {"tokens", "FILE", "corpus as a token file (.u32/.u16)"},
    {"text", "FILE[,FILE...]",
     "corpus as text files, bytes as tokens (default: the built-in corpus)"},
    {"context", "T", "tokens per step (default 16384)"},
    {"steps", "S", "optimizer steps (default 60)"},
    {"chunk", "C", "tokens per chunk, one kernel call (default 256)"},
    {"spans", "S",
     "spans per step, each owned by one worker (default: about T/16384, at least 8, at most "
     "one per chunk)"},
    {"storage", "full|bf16",
     "layer inputs and chunk states kept for the backward in f32 or bf16 (default full)"},
    {"lr", "LR", "peak learning rate (default 3e-3)"},
    {"warmup", "S", "linear warmup steps (default 10)"},
    {"min-lr-ratio", "R", "final learning rate as a fraction of the peak (default 0.1)"},
    {"weight-decay", "WD", "AdamW decoupled weight decay (default 0.1)"},
    {"beta1", "B1", "AdamW beta1 (default 0.9)"},
    {"beta2", "B2", "AdamW beta2 (default 0.95)"},
    {"eps", "EPS", "AdamW epsilon (default 1e-8)"},
    {"grad-clip", "G", "global gradient-norm clip, 0: off (default 1.0)"},
    {"checkpoint-dir", "DIR",
     "checkpoints (and resume) directory on the coordinator (default: its --state-dir/JOB_ID)"},
    {"checkpoint-every", "S", "steps between checkpoints, 0: only at the end (default 20)"},
};

absl::StatusOr<v1::JobSpec> SpecFromFlags(const ArgParser& a) {
  v1::JobSpec spec;
  auto integer = [&](const char* name, int64_t def, int64_t min) -> absl::StatusOr<int64_t> {
    if (!a.Has(name)) return def;
    return a.GetInt(name, min, int64_t{1} << 40);
  };
  static constexpr const char* kShape[] = {"hidden-size", "layers", "vocab-size", "state-size",
                                           "conv-kernel", "expand", "dt-rank",    "seed"};
  if (a.Has("model")) {
    for (const char* f : kShape) {
      if (a.Has(f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--model and --", f, " exclude each other (the model has its shape)"));
      }
    }
    spec.set_model_dir(Absolute(a.Get("model")));
  } else {
    v1::InitConfig* init = spec.mutable_init();
    struct Shape {
      const char* name;
      int64_t def;
      void (v1::InitConfig::*set)(int64_t);
    };
    for (const Shape& s : {Shape{"hidden-size", 128, &v1::InitConfig::set_hidden_size},
                           Shape{"layers", 4, &v1::InitConfig::set_layers},
                           Shape{"vocab-size", 256, &v1::InitConfig::set_vocab_size},
                           Shape{"state-size", 16, &v1::InitConfig::set_state_size},
                           Shape{"conv-kernel", 4, &v1::InitConfig::set_conv_kernel},
                           Shape{"expand", 2, &v1::InitConfig::set_expand}}) {
      absl::StatusOr<int64_t> v = integer(s.name, s.def, 1);
      if (!v.ok()) return v.status();
      (init->*s.set)(*v);
    }
    if (a.Has("dt-rank") && a.Get("dt-rank") != "auto") {
      absl::StatusOr<int64_t> v = integer("dt-rank", 0, 1);
      if (!v.ok()) return v.status();
      init->set_dt_rank(*v);
    }
    absl::StatusOr<int64_t> seed = integer("seed", 0, 0);
    if (!seed.ok()) return seed.status();
    init->set_seed(static_cast<uint64_t>(*seed));
  }
  if (a.Has("tokens") && a.Has("text")) {
    return absl::InvalidArgumentError("give --tokens or --text, not both");
  }
  if (a.Has("tokens")) spec.set_token_file(Absolute(a.Get("tokens")));
  if (a.Has("text")) {
    for (const std::string& f :
         std::vector<std::string>(absl::StrSplit(a.Get("text"), ',', absl::SkipEmpty()))) {
      spec.mutable_text_files()->add_paths(Absolute(f));
    }
    if (spec.text_files().paths().empty()) return absl::InvalidArgumentError("--text is empty");
  }
  struct Int {
    const char* name;
    int64_t def, min;
    void (v1::JobSpec::*set)(int64_t);
  };
  for (const Int& f :
       {Int{"context", 16384, 2, &v1::JobSpec::set_context_length},
        Int{"steps", 60, 1, &v1::JobSpec::set_steps}, Int{"chunk", 256, 1, &v1::JobSpec::set_chunk},
        Int{"spans", 0, 0, &v1::JobSpec::set_spans},
        Int{"checkpoint-every", 20, 0, &v1::JobSpec::set_checkpoint_every}}) {
    absl::StatusOr<int64_t> v = integer(f.name, f.def, f.min);
    if (!v.ok()) return v.status();
    (spec.*f.set)(*v);
  }
  if (a.Has("storage")) {
    absl::StatusOr<Storage> storage = ParseStorage(a.Get("storage"));
    if (!storage.ok()) return storage.status();
    spec.set_storage(std::string(StorageName(*storage)));
  }
  v1::AdamW* o = spec.mutable_optimizer();
  if (a.Has("warmup")) {
    absl::StatusOr<int64_t> v = integer("warmup", 0, 0);
    if (!v.ok()) return v.status();
    o->set_warmup_steps(*v);
  }
  struct Real {
    const char* name;
    void (v1::AdamW::*set)(double);
  };
  for (const Real& f : {Real{"lr", &v1::AdamW::set_lr}, Real{"beta1", &v1::AdamW::set_beta1},
                        Real{"beta2", &v1::AdamW::set_beta2}, Real{"eps", &v1::AdamW::set_eps},
                        Real{"weight-decay", &v1::AdamW::set_weight_decay},
                        Real{"min-lr-ratio", &v1::AdamW::set_min_lr_ratio},
                        Real{"grad-clip", &v1::AdamW::set_grad_clip}}) {
    if (!a.Has(f.name)) continue;
    absl::StatusOr<double> v = a.GetDouble(f.name);
    if (!v.ok()) return v.status();
    (o->*f.set)(*v);
  }
  if (a.Has("checkpoint-dir")) {
    if (a.Get("checkpoint-dir").empty())
      return absl::InvalidArgumentError("--checkpoint-dir is empty");
    spec.set_checkpoint_dir(Absolute(a.Get("checkpoint-dir")));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> SpecFromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  v1::JobSpec spec;
  const auto s = google::protobuf::util::JsonStringToMessage(*text, &spec);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec ", path, " is not a JobSpec in JSON: ", s.ToString()));
  }
  return spec;
}

}  // namespace

int SubmitCommand(const std::vector<std::string>& args) {
  ArgParser a(
      "submit",
      "Submits a training job to a coordinator and prints its id (e.g. job-1) on stdout. The\n"
      "job is either a JobSpec in JSON (--spec FILE.json; proto/adjsh.proto's field names,\n"
      "e.g. {\"init\": {\"hidden_size\": 64, \"layers\": 2, \"vocab_size\": 256},\n"
      "\"context_length\": 4096, \"steps\": 10}; context_length and steps are required, the\n"
      "model shape, chunk and optimizer take adjsh train's defaults when unset, paths are sent\n"
      "as written and resolve on the coordinator) or given by the flags below (their\n"
      "defaults are adjsh train's; paths are made absolute here and must exist on the\n"
      "coordinator's machine). A job whose checkpoint dir holds a checkpoint resumes from it.\n"
      "Follow it with `adjsh watch --job ID`.");
  AddClientFlags(a);
  a.Add("spec", "FILE.json", "the job as a JobSpec in JSON (excludes the job flags below)");
  for (const JobFlag& f : kJobFlags) a.Add(f.name, f.value, f.help);
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<v1::JobSpec> spec;
  if (a.Has("spec")) {
    for (const JobFlag& f : kJobFlags) {
      if (a.Has(f.name)) {
        return BadUsage("submit", absl::InvalidArgumentError(absl::StrCat("--spec and --", f.name,
                                                                          " exclude each other")));
      }
    }
    spec = SpecFromFile(a.Get("spec"));
    if (!spec.ok()) return Fail("submit", spec.status());
  } else {
    spec = SpecFromFlags(a);
    if (!spec.ok()) return BadUsage("submit", spec.status());
  }
  SecurityError client_error;
  absl::StatusOr<Client> c = Client::Make(a, &client_error);
  if (!c.ok()) return SecurityFail("submit", {c.status(), client_error.usage});
  grpc::ClientContext ctx;
  c->Prepare(ctx);
  v1::Job job;
  if (absl::Status s = c->Check(c->stub().SubmitJob(&ctx, *spec, &job)); !s.ok()) {
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsUnauthenticated(s) ||
        absl::IsPermissionDenied(s)) {
      return Fail("submit", s);
    }
    return Fail("submit", absl::Status(s.code(), absl::StrCat("the coordinator refused the job (",
                                                              absl::StatusCodeToString(s.code()),
                                                              "): ", s.message())));
  }
  std::printf("%s\n", job.job_id().c_str());
  return 0;
}

int StatusCommand(const std::vector<std::string>& args) {
  ArgParser a("status",
              "Shows one job of a coordinator (--job ID) or all of them, newest first: id, state,\n"
              "step/steps, loss of the last step, throughput and the latest checkpoint (and the\n"
              "error of a FAILED job). --json prints the Job (or ListJobsResponse) messages in\n"
              "protobuf's JSON mapping instead. Exit 0 when shown, 1 for an unknown job or an\n"
              "unreachable coordinator.");
  AddClientFlags(a);
  a.Add("job", "ID", "the job to show (default: all jobs)");
  a.AddBool("json", "print JSON (proto field names) instead of a table");
  if (auto code = ParseOrExit(a, args)) return *code;
  SecurityError client_error;
  absl::StatusOr<Client> c = Client::Make(a, &client_error);
  if (!c.ok()) return SecurityFail("status", {c.status(), client_error.usage});

  v1::ListJobsResponse list;
  if (a.Has("job")) {
    absl::StatusOr<v1::Job> job = GetJob(*c, a.Get("job"));
    if (!job.ok()) return Fail("status", job.status());
    if (a.GetBool("json")) {
      std::printf("%s\n", ToJson(*job).c_str());
      return 0;
    }
    *list.add_jobs() = std::move(*job);
  } else {
    std::string token;
    do {
      grpc::ClientContext ctx;
      c->Prepare(ctx);
      v1::ListJobsRequest req;
      req.set_page_token(token);
      v1::ListJobsResponse page;
      if (absl::Status s = c->Check(c->stub().ListJobs(&ctx, req, &page)); !s.ok())
        return Fail("status", s);
      for (v1::Job& j : *page.mutable_jobs()) *list.add_jobs() = std::move(j);
      token = page.next_page_token();
    } while (!token.empty());
    if (a.GetBool("json")) {
      std::printf("%s\n", ToJson(list).c_str());
      return 0;
    }
    if (list.jobs().empty()) {
      std::printf("no jobs\n");
      return 0;
    }
  }
  std::printf("%-10s %-10s %13s %9s %9s  %s\n", "JOB", "STATE", "STEP", "LOSS", "TOK/S",
              "CHECKPOINT");
  for (const v1::Job& j : list.jobs()) {
    const std::string step = absl::StrCat(j.step(), "/", j.spec().steps());
    std::printf("%-10s %-10s %13s %9s %9s  %s\n", j.job_id().c_str(), State(j.state()).c_str(),
                step.c_str(), j.step() > 0 ? absl::StrFormat("%.4f", j.loss()).c_str() : "-",
                j.tokens_per_s() > 0 ? Rate(j.tokens_per_s()).c_str() : "-",
                j.last_checkpoint().empty() ? "-" : j.last_checkpoint().c_str());
    if (j.state() == v1::Job::FAILED) std::printf("  error: %s\n", j.error().c_str());
  }
  return 0;
}

int WatchCommand(const std::vector<std::string>& args) {
  ArgParser a(
      "watch",
      "Follows a job of a coordinator: its state changes and a progress line per step\n"
      "(step, loss, tokens/s, ETA, as adjsh train prints) on stdout, until it ends. Exit 0\n"
      "when the job SUCCEEDED, 1 when it FAILED or was CANCELLED (the reason on stderr),\n"
      "or when the coordinator cannot be reached or goes away.");
  AddClientFlags(a);
  a.Add("job", "ID", "the job to follow", "", true);
  if (auto code = ParseOrExit(a, args)) return *code;
  SecurityError client_error;
  absl::StatusOr<Client> c = Client::Make(a, &client_error);
  if (!c.ok()) return SecurityFail("watch", {c.status(), client_error.usage});
  const std::string id = a.Get("job");

  absl::StatusOr<v1::Job> job = GetJob(*c, id);  // fails fast when unreachable; gives the steps
  if (!job.ok()) return Fail("watch", job.status());
  const int64_t steps = std::max<int64_t>(1, job->spec().steps());

  grpc::ClientContext ctx;  // no deadline: the stream lasts as long as the job
  v1::WatchJobRequest req;
  req.set_job_id(id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = c->stub().WatchJob(&ctx, req);
  v1::JobEvent e;
  v1::Job::State last_state = v1::Job::STATE_UNSPECIFIED;
  int64_t last_step = -1;
  // job-1 step 12/60 [#####...................] loss 3.4121 | 8.1K tok/s | ETA 1m32s
  auto progress = [&](const v1::JobEvent& ev) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * std::clamp<int64_t>(ev.step(), 0, steps) / steps);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    // The step's span tasks: parallelism (task time over critical path) and wire bytes.
    const std::string par =
        ev.profile().tasks() == 0
            ? ""
            : absl::StrFormat(" | par %.1f (%.2f s / %.2f s) | wire %.1f MB%s%s%s",
                              ev.profile().parallelism(), ev.profile().task_seconds(),
                              ev.profile().critical_path_seconds(),
                              static_cast<double>(ev.profile().wire_bytes()) / 1e6,
                              ev.profile().tree_workers() > 0
                                  ? absl::StrFormat(" | tree of %d", ev.profile().tree_workers())
                                  : "",
                              ev.profile().rebuilt_spans() > 0
                                  ? absl::StrFormat(" | %d rebuilt", ev.profile().rebuilt_spans())
                                  : "",
                              ev.profile().restarts() > 0
                                  ? absl::StrFormat(" | %d restarts", ev.profile().restarts())
                                  : "");
    std::printf("%s step %lld/%lld [%s] loss %.4f | %s tok/s | ETA %s%s%s%s\n", id.c_str(),
                static_cast<long long>(ev.step()), static_cast<long long>(steps), bar.c_str(),
                ev.loss(), Rate(ev.tokens_per_s()).c_str(), Duration(ev.eta_seconds()).c_str(),
                par.c_str(),
                ev.message().empty() || ev.state() != last_state ? "" : " | ",
                ev.state() != last_state ? "" : ev.message().c_str());
  };
  while (reader->Read(&e)) {
    if (e.state() != last_state) {
      if (!Terminal(e.state())) {
        std::printf("%s %s%s%s\n", id.c_str(), State(e.state()).c_str(),
                    e.message().empty() ? "" : ": ", e.message().c_str());
        if (last_state == v1::Job::STATE_UNSPECIFIED && e.step() > 0) progress(e);
      }
      last_state = e.state();
    } else if (e.step() != last_step) {
      progress(e);
    } else if (!e.message().empty()) {
      std::printf("%s %s\n", id.c_str(), e.message().c_str());
    }
    last_step = e.step();
    std::fflush(stdout);
    if (Terminal(e.state())) break;
  }
  if (Terminal(e.state())) {
    ctx.TryCancel();
    (void)reader->Finish();
    if (e.state() == v1::Job::SUCCEEDED) {
      std::printf("%s SUCCEEDED: %s\n", id.c_str(), e.message().c_str());
      return 0;
    }
    std::fflush(stdout);
    std::fprintf(stderr, "adjsh watch: %s %s: %s\n", id.c_str(), State(e.state()).c_str(),
                 e.message().c_str());
    return 1;
  }
  const absl::Status s = c->Check(reader->Finish());
  return Fail("watch", absl::UnavailableError(absl::StrCat(
                           "the watch of ", id, " ended before the job did: ",
                           s.ok() ? "the coordinator closed the stream" : s.message())));
}

int CancelCommand(const std::vector<std::string>& args) {
  ArgParser a("cancel",
              "Cancels a queued or running job of a coordinator and prints its id and state. A\n"
              "running job stops at once (its current step is abandoned; its last checkpoint is\n"
              "kept). Exit 1 for an unknown job or one that has already finished.");
  AddClientFlags(a);
  a.Add("job", "ID", "the job to cancel", "", true);
  if (auto code = ParseOrExit(a, args)) return *code;
  SecurityError client_error;
  absl::StatusOr<Client> c = Client::Make(a, &client_error);
  if (!c.ok()) return SecurityFail("cancel", {c.status(), client_error.usage});
  grpc::ClientContext ctx;
  c->Prepare(ctx);
  v1::CancelJobRequest req;
  req.set_job_id(a.Get("job"));
  v1::Job job;
  if (absl::Status s = c->Check(c->stub().CancelJob(&ctx, req, &job)); !s.ok())
    return Fail("cancel", s);
  std::printf("%s %s\n", job.job_id().c_str(), State(job.state()).c_str());
  return 0;
}

}  // namespace adjsh::cli
