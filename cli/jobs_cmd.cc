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
#include "cli/job_flags.h"
#include "cli/security_flags.h"
#include "common/file_io.h"
#include "engine/grad_options.h"
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
    if (absl::Status s = CheckAddressFlag("coordinator", c.address_, false); !s.ok()) return s;
    absl::StatusOr<int64_t> t = a.GetInt("timeout", 1, 3600);
    if (!t.ok()) return t.status();
    c.timeout_s_ = *t;
    absl::StatusOr<ClientSecurity> security =
        ClientSecurityFromFlags(a, c.address_, /*worker=*/false, error);
    if (!security.ok()) return security.status();
    grpc::ChannelArguments args = ClientChannelArgs();
    if (!security->server_name.empty()) args.SetSslTargetNameOverride(security->server_name);
    c.stub_ = v1::JobService::NewStub(
        grpc::CreateCustomChannel(c.address_, ChannelCredentialsFor(*security), args));
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
  AddJobFlags(a);
  if (auto code = ParseOrExit(a, args)) return *code;

  absl::StatusOr<v1::JobSpec> spec;
  if (a.Has("spec")) {
    if (AnyJobFlag(a)) {
      return BadUsage("submit", absl::InvalidArgumentError(
                                    "--spec excludes the job flags (the spec defines the job)"));
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
              "error of a FAILED job); without --job, then how many workers are connected.\n"
              "--json prints the Job (or ListJobsResponse) messages in protobuf's JSON mapping\n"
              "instead. Exit 0 when shown, 1 for an unknown job or an unreachable coordinator.");
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
      list.set_workers_connected(page.workers_connected());  // the last page's: the newest
      list.set_workers_taking_tasks(page.workers_taking_tasks());
    } while (!token.empty());
    if (a.GetBool("json")) {
      std::printf("%s\n", ToJson(list).c_str());
      return 0;
    }
    if (list.jobs().empty()) std::printf("no jobs\n");
  }
  if (!list.jobs().empty()) {
    std::printf("%-10s %-10s %13s %9s %9s  %s\n", "JOB", "STATE", "STEP", "LOSS", "TOK/S",
                "CHECKPOINT");
  }
  for (const v1::Job& j : list.jobs()) {
    const std::string step = absl::StrCat(j.step(), "/", j.spec().steps());
    std::printf("%-10s %-10s %13s %9s %9s  %s\n", j.job_id().c_str(), State(j.state()).c_str(),
                step.c_str(), j.step() > 0 ? absl::StrFormat("%.4f", j.loss()).c_str() : "-",
                j.tokens_per_s() > 0 ? Rate(j.tokens_per_s()).c_str() : "-",
                j.last_checkpoint().empty() ? "-" : j.last_checkpoint().c_str());
    if (j.state() == v1::Job::FAILED) std::printf("  error: %s\n", j.error().c_str());
  }
  if (!a.Has("job")) {
    const int64_t connected = list.workers_connected(), taking = list.workers_taking_tasks();
    std::string line = absl::StrCat("workers: ", connected, " connected");
    if (taking != connected) {
      absl::StrAppend(&line, ", ", taking,
                      " taking tasks (the others sent non-finite results, or skipped tasks, "
                      "too often)");
    }
    std::printf("%s\n", line.c_str());
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
  // job-1 step 12/60 [#####...................] loss 3.4121 | 8.1K tok/s | ETA 1m32s | 2.046 s
  //   | par 3.9 (7.80 s / 2.00 s) | wire 1.2 MB | tree of 4   (the step's time, then its tasks)
  auto progress = [&](const v1::JobEvent& ev) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * std::clamp<int64_t>(ev.step(), 0, steps) / steps);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    // The step's span tasks: parallelism (task time over critical path) and wire bytes.
    const std::string par =
        ev.profile().tasks() == 0
            ? ""
            : absl::StrFormat(" | %.3f s | par %.1f (%.2f s / %.2f s) | wire %.1f MB%s%s%s",
                              ev.profile().step_seconds(), ev.profile().parallelism(), ev.profile().task_seconds(),
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
              "kept). Exit 1 for an unknown job or one that has already SUCCEEDED or FAILED;\n"
              "cancelling a CANCELLED job again prints it and exits 0.");
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
