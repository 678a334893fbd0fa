// The coordinator's TaskService over real gRPC (127.0.0.1, a selected port) with a gradient in
// flight: TaskServiceImpl::ComputeGradient runs on a background thread for a tiny model, and the
// test acts as a worker through a stub, first a misbehaving one (unknown ids, malformed and
// stale task and lease ids, broken or wrong result streams, oversized results, late, duplicate
// and foreign results), then a well-behaved one that runs every (layer, span) task on the spans
// it keeps (task_service_fixture.h). Every bad call must be answered with the code
// proto/adjsh.proto documents, and must leave nothing applied: the final gradient is bitwise
// the in-process ComputeGradient<float> with the same chunk and spans (engine/span_step.cc).
//
// The last tests guard defects found here once (see their comments), and the taking over of a
// silent worker's spans.
#include <set>

#include "tests/coordinator/task_service_fixture.h"

namespace adjsh::coordinator {
namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// The inputs task `t` reads (engine/span_tensors.h), by name (after `prefix`) and shape, for the
// tiny model (D = 8, Di = 16, N = 4): forward "halo_u" (H, D) for k > 0 and s > 0, "h0"
// (Di, N) for kForward and s > 0; backward "du_halo" (H(s+1), D) for k < K-1 and s < S-1,
// "mu" (Di, N) for kBackward and s < S-1.
Shapes InputShapes(const SpanPlan& plan, const SpanTask& t, const std::string& prefix = "") {
  const int64_t D = 8, Di = 16, N = 4, K = plan.layers(), S = plan.spans();
  Shapes in;
  if (t.phase == SpanPhase::kForwardSummary || t.phase == SpanPhase::kForward) {
    if (t.layer > 0 && t.span > 0) in[prefix + "halo_u"] = {plan.range(t.span).halo, D};
    if (t.phase == SpanPhase::kForward && t.span > 0) in[prefix + "h0"] = {Di, N};
  } else {
    if (t.layer + 1 < K && t.span + 1 < S)
      in[prefix + "du_halo"] = {plan.range(t.span + 1).halo, D};
    if (t.phase == SpanPhase::kBackward && t.span + 1 < S) in[prefix + "mu"] = {Di, N};
  }
  return in;
}

Shapes ShapesOf(const TensorMap& got) {
  Shapes s;
  for (const auto& [name, t] : got) s[name] = t.shape;
  return s;
}

// The ids of span s with its halo and the next span's first token: [t0 - H, min(T, t0 + len + 1)).
std::vector<int64_t> SpanTokenIds(const SpanPlan& plan, const std::vector<uint32_t>& tokens,
                                  int64_t s) {
  const SpanRange& r = plan.range(s);
  std::vector<int64_t> ids;
  for (int64_t t = r.t0 - r.halo; t < std::min(plan.T(), r.t0 + r.len + 1); ++t)
    ids.push_back(tokens[t]);
  return ids;
}

std::vector<int64_t> Int64s(const HostTensor& t) {
  std::vector<int64_t> v(t.data.size() / sizeof(int64_t));
  std::memcpy(v.data(), t.data.data(), v.size() * sizeof(int64_t));
  return v;
}

// ---------------------------------------------------------------------------------------------
// The well-behaved worker alone.

TEST_F(TaskServiceWireTest, WellBehavedWorkerGetsTheInProcessGradientBitwise) {
  Start();
  StartGradient();
  const std::string w = Register("good");
  const v1::Task t = PullTaskWait(w);
  // The first task is the forward summary of layer 0 over span 0 (tokens [0, 8)).
  EXPECT_EQ(t.task_id(), "1:0");
  EXPECT_EQ(t.kind(), v1::Task::SPAN_FORWARD_SUMMARY);
  EXPECT_EQ(t.layer(), 0);
  EXPECT_EQ(t.span(), 0);
  EXPECT_EQ(t.spans(), kSpans);
  EXPECT_EQ(t.chunk(), kChunk);
  EXPECT_EQ(t.targets(), kT - 1);
  EXPECT_FALSE(t.masked());
  EXPECT_EQ(t.storage(), "full");
  EXPECT_EQ(t.dtype(), v1::F32);
  EXPECT_EQ(t.job_id(), "job");
  EXPECT_EQ(t.step(), 0);
  EXPECT_EQ(t.params_version(), 1u);
  EXPECT_EQ(t.context_length(), kT);
  EXPECT_EQ(t.config_json(), ConfigToJson(params_.config));
  EXPECT_EQ(t.lease_expires_ms(), 60000);

  // Bare: nothing, a layer-0 summary of span 0 reads only the span's own rows.
  absl::StatusOr<TensorMap> bare = Fetch(w, t.task_id(), t.lease_id());
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->empty());
  // With parameters: every tensor of the model under its HF name, bitwise the coordinator's.
  absl::StatusOr<TensorMap> full = Fetch(w, t.task_id(), t.lease_id(), /*include_params=*/true);
  ASSERT_TRUE(full.ok()) << full.status();
  const TensorMap want = ParamsToTensors<float>(params_, DType::kF32);
  EXPECT_EQ(full->size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(full->contains(name)) << name;
    EXPECT_EQ(full->at(name).dtype, DType::kF32) << name;
    EXPECT_EQ(full->at(name).shape, tensor.shape) << name;
    EXPECT_TRUE(full->at(name).data == tensor.data) << name;
  }
  // With the span: its tokens [0, 9) (the rows and the next span's first token, the last row's
  // target) as I64, and no replay (nothing runs on a span before its layer-0 tasks).
  absl::StatusOr<TensorMap> span =
      Fetch(w, t.task_id(), t.lease_id(), /*include_params=*/false, /*include_span=*/true);
  ASSERT_TRUE(span.ok()) << span.status();
  ASSERT_EQ(span->size(), 1u);
  ASSERT_TRUE(span->contains("tokens"));
  EXPECT_EQ(span->at("tokens").dtype, DType::kI64);
  EXPECT_EQ(span->at("tokens").shape, (std::vector<int64_t>{9}));
  EXPECT_EQ(Int64s(span->at("tokens")), SpanTokenIds(*plan_, tokens_, 0));
  EXPECT_GT(service_->bytes_sent(), 0u);

  const PushOutcome p = Push(Messages(Header(w, t), Work(w, t)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted());
  EXPECT_EQ(p.response.reason(), "");
  EXPECT_EQ(service_->results_accepted(), 1);

  // Every other task (its own spans' lowest ready task first: coordinator/span_scheduler.h),
  // each once. Each one's inputs are checked against the contract, bare and with the span's
  // start ("tokens" and the inputs of the tasks that rebuild it, under "replay.<phase>.<k>.").
  std::set<v1::Task::Kind> kinds = {t.kind()};
  std::set<int64_t> seen = {0};
  for (int64_t n = 1; n < kTasks; ++n) {
    const v1::Task task = PullTaskWait(w);
    SCOPED_TRACE(task.task_id());
    ASSERT_TRUE(PhaseOf(task.kind()).has_value());
    const int64_t id = plan_->Id(*PhaseOf(task.kind()), task.layer(), task.span());
    ASSERT_GE(id, 0);
    ASSERT_EQ(task.task_id(), absl::StrCat("1:", id));
    ASSERT_TRUE(seen.insert(id).second) << "handed out twice";
    const SpanTask& st = plan_->task(id);
    kinds.insert(task.kind());
    absl::StatusOr<TensorMap> in = Fetch(w, task.task_id(), task.lease_id());
    ASSERT_TRUE(in.ok()) << in.status();
    EXPECT_EQ(ShapesOf(*in), InputShapes(*plan_, st));
    for (const auto& [name, tensor] : *in) EXPECT_EQ(tensor.dtype, DType::kF32) << name;
    absl::StatusOr<TensorMap> start =
        Fetch(w, task.task_id(), task.lease_id(), /*include_params=*/false, /*include_span=*/true);
    ASSERT_TRUE(start.ok()) << start.status();
    Shapes want_start = InputShapes(*plan_, st);
    want_start["tokens"] = {static_cast<int64_t>(SpanTokenIds(*plan_, tokens_, st.span).size())};
    for (int64_t r : plan_->ReplayIds(id)) {
      want_start.merge(InputShapes(*plan_, plan_->task(r), ReplayPrefix(plan_->task(r))));
    }
    EXPECT_EQ(ShapesOf(*start), want_start);
    EXPECT_EQ(Int64s(start->at("tokens")), SpanTokenIds(*plan_, tokens_, st.span));
    const PushOutcome q = Push(Messages(Header(w, task), Work(w, task)));
    ASSERT_TRUE(q.status.ok()) << q.status;
    EXPECT_TRUE(q.response.accepted()) << q.response.reason();
  }
  EXPECT_EQ(kinds.size(), 4u);  // every kind of task occurred
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  absl::StatusOr<GradResult<float>> got = GradientResult();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBits(*got, reference_));
  EXPECT_EQ(got->targets, kT - 1);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  EXPECT_EQ(service_->results_rejected(), 0);
  EXPECT_GT(service_->bytes_received(), 0u);
  // The worker kept every span from its first task on: the model fetched once, each span's
  // start once, and no span rebuilt.
  EXPECT_EQ(service_->span_rebuilds(), 0);
  int params = 0, starts = 0;
  for (const FetchRecord& f : Fake(w).fetches) {
    params += f.include_params ? 1 : 0;
    starts += f.include_span ? 1 : 0;
  }
  EXPECT_EQ(params, 1);
  EXPECT_EQ(starts, kSpans);
}

// The control for every "nothing applied" check here: a well-formed result with one wrong
// value is accepted (the service cannot tell) and the final gradient is then not bitwise the
// in-process one.
TEST_F(TaskServiceWireTest, AWrongValueInAnAcceptedResultShowsInTheGradient) {
  Start();
  StartGradient();
  const std::string w = Register("good");
  const v1::Task t = PullTaskWait(w);
  Named wrong = Work(w, t);
  HostTensor& h_end = Find(wrong, "h_end");  // span 0's end state: h0 of span 1 at layer 0
  std::vector<float> v = h_end.To<float>().value();
  v[5] += 1.0f;
  h_end = HostTensor::From<float>(v, h_end.shape, DType::kF32);
  const PushOutcome p = Push(Messages(Header(w, t), wrong));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted());
  CompleteAll(w);
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  absl::StatusOr<GradResult<float>> got = GradientResult();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(SameBits(*got, reference_));
}

// ---------------------------------------------------------------------------------------------
// Unknown worker ids.

TEST_F(TaskServiceWireTest, UnknownWorkerIsNotFound) {
  Start();
  StartGradient();
  const std::string w = Register("good");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);

  for (const std::string bad : {"nope", "", "w99"}) {
    SCOPED_TRACE(absl::StrCat("worker id \"", bad, "\""));
    EXPECT_TRUE(StatusIs(Pull(bad), absl::StatusCode::kNotFound, "unknown worker"));
    EXPECT_TRUE(StatusIs(Heartbeat(bad, {t.task_id()}), absl::StatusCode::kNotFound,
                         "unknown worker"));
    EXPECT_TRUE(StatusIs(Fetch(bad, t.task_id(), t.lease_id()), absl::StatusCode::kNotFound,
                         "unknown worker"));
    // PushResult: a correct result quoting a live lease, from a worker the coordinator does not
    // know. Observed: OK, accepted = false, the reason names the unknown worker (the stream
    // itself is well-formed; the worker learns NOT_FOUND from its next PullTask/Heartbeat).
    const PushOutcome p = Push(Messages(HeaderMsg(bad, t.task_id(), t.lease_id()), good));
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_FALSE(p.response.accepted());
    EXPECT_NE(p.response.reason().find("unknown worker"), std::string::npos)
        << p.response.reason();
  }
  EXPECT_EQ(service_->results_accepted(), 0);

  // The lease of the real holder survived all that.
  const PushOutcome p = Push(Messages(Header(w, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted());
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// FetchInputs with bad task and lease ids.

TEST_F(TaskServiceWireTest, FetchInputsRefusesBadTaskAndLeaseIds) {
  Start();
  StartGradient();
  const std::string w = Register("misbehaving");
  const v1::Task t = PullTaskWait(w);
  ASSERT_EQ(t.task_id(), "1:0");
  // "<queue lease number>.<secret>": the number is the queue's, the secret unguessable.
  const size_t dot = t.lease_id().find('.');
  int64_t lease = 0;
  ASSERT_NE(dot, std::string::npos) << t.lease_id();
  ASSERT_TRUE(absl::SimpleAtoi(t.lease_id().substr(0, dot), &lease)) << t.lease_id();
  const std::string L = t.lease_id(), secret = L.substr(dot + 1);
  ASSERT_EQ(secret.size(), 16u) << L;

  struct Case {
    std::string task, lease;
    absl::StatusCode code;
    std::string part;
  };
  const std::vector<Case> cases = {
      // Malformed: INVALID_ARGUMENT ("malformed request", never retry).
      {"garbage", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {"", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {"1:", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {":0", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {"1:0:0", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {"x:0", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {"1:zero", L, absl::StatusCode::kInvalidArgument, "malformed task id"},
      {t.task_id(), "", absl::StatusCode::kInvalidArgument, "malformed lease id"},
      {t.task_id(), "lease", absl::StatusCode::kInvalidArgument, "malformed lease id"},
      // A task of another step (version) or outside the step (20 tasks): NOT_FOUND.
      {"2:0", L, absl::StatusCode::kNotFound, "not part of the current step"},
      {"0:0", L, absl::StatusCode::kNotFound, "not part of the current step"},
      {"1:20", L, absl::StatusCode::kNotFound, "not part of the current step"},
      {"1:-1", L, absl::StatusCode::kNotFound, "not part of the current step"},
      // The current step's task with a lease that is not its live one: FAILED_PRECONDITION.
      {t.task_id(), absl::StrCat(lease + 1000, ".", secret), absl::StatusCode::kFailedPrecondition,
       "no longer valid"},
      {t.task_id(), "0.0", absl::StatusCode::kFailedPrecondition, "no longer valid"},
      {t.task_id(), "-1." + secret, absl::StatusCode::kFailedPrecondition, "no longer valid"},
      {t.task_id(), absl::StrCat(lease), absl::StatusCode::kInvalidArgument, "malformed lease id"},
      // The live lease's number with another secret (a guess): refused like a stale lease.
      {t.task_id(), absl::StrCat(lease, ".", std::string(16, '0')),
       absl::StatusCode::kFailedPrecondition, "no longer valid"},
      // Tasks not leased at all, quoting a real lease id: ready (1:1, the summary of span 1)
      // and waiting on its dependencies (1:19, the last backward).
      {"1:1", L, absl::StatusCode::kFailedPrecondition, "no longer valid"},
      {"1:19", L, absl::StatusCode::kFailedPrecondition, "no longer valid"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("task \"", c.task, "\" lease \"", c.lease, "\""));
    EXPECT_TRUE(StatusIs(Fetch(w, c.task, c.lease), c.code, c.part));
    EXPECT_TRUE(StatusIs(Fetch(w, c.task, c.lease, true, true), c.code, c.part));
  }

  // A heartbeat with those ids: every one but the held task is answered cancelled, the held
  // one is renewed.
  absl::StatusOr<v1::HeartbeatResponse> hb =
      Heartbeat(w, {"garbage", "", "2:0", "1:20", "1:1", "1:19", t.task_id()});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->cancelled_task_ids_size(), 6);
  EXPECT_FALSE(Lists(*hb, t.task_id()));

  EXPECT_EQ(service_->results_accepted(), 0);
  // The held task, then everything else.
  const PushOutcome p = Push(Messages(Header(w, t), Work(w, t)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted());
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// Expired leases: FetchInputs FAILED_PRECONDITION, the heartbeat cancels, a correct result is
// answered accepted = false.

TEST_F(TaskServiceWireTest, ExpiredLeaseIsRefusedEverywhere) {
  TaskServiceOptions o = DefaultOptions();
  o.lease = absl::Milliseconds(200);
  Start(o);
  StartGradient();
  const std::string w1 = Register("slow"), w2 = Register("good");
  const v1::Task t = PullTaskWait(w1);
  EXPECT_EQ(t.lease_expires_ms(), 200);
  const Named good = Work(w1, t);  // fetched and computed while the lease was live
  std::this_thread::sleep_for(milliseconds(400));

  EXPECT_TRUE(StatusIs(Fetch(w1, t.task_id(), t.lease_id()),
                       absl::StatusCode::kFailedPrecondition, "no longer valid"));
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(w1, {t.task_id()});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(Lists(*hb, t.task_id()));
  PushOutcome late = Push(Messages(Header(w1, t), good));
  ASSERT_TRUE(late.status.ok()) << late.status;
  EXPECT_FALSE(late.response.accepted());
  EXPECT_NE(late.response.reason().find("no longer valid"), std::string::npos)
      << late.response.reason();
  EXPECT_EQ(service_->results_accepted(), 0);
  EXPECT_EQ(service_->results_rejected(), 1);

  // w1 is heard of no more (the heartbeat above was its last call that counts): a lease later
  // it has lost span 0, and the task is handed to w2 under a new lease; the stale lease stays
  // refused.
  std::this_thread::sleep_for(milliseconds(300));
  v1::Task again;
  bool accepted = false;
  int64_t others = 0;  // other tasks w2 got first, run and accepted
  for (int attempt = 0; attempt < 10 && !accepted; ++attempt) {
    again = PullTaskWait(w2);
    if (again.task_id() != t.task_id()) {
      // On a loaded machine w1 can miss a lease before its first pull and claim both spans
      // (it was then the only live worker); w2 then owns span 1 too and may get its task
      // first. Run it honestly and pull again.
      const PushOutcome other = Push(Messages(Header(w2, again), Work(w2, again)));
      ASSERT_TRUE(other.status.ok()) << other.status;
      others += other.response.accepted() ? 1 : 0;
      continue;
    }
    ASSERT_NE(again.lease_id(), t.lease_id());
    late = Push(Messages(Header(w1, t), good));
    ASSERT_TRUE(late.status.ok()) << late.status;
    EXPECT_FALSE(late.response.accepted());
    // The same inputs, so the result computed under the old lease is the right one.
    const PushOutcome p = Push(Messages(Header(w2, again), good));
    ASSERT_TRUE(p.status.ok()) << p.status;
    accepted = p.response.accepted();  // false only if 200 ms passed since the pull
  }
  ASSERT_TRUE(accepted);
  EXPECT_EQ(service_->results_accepted(), 1 + others);
  // A duplicate of the accepted result.
  const PushOutcome dup = Push(Messages(Header(w2, again), good));
  ASSERT_TRUE(dup.status.ok()) << dup.status;
  EXPECT_FALSE(dup.response.accepted());
  EXPECT_FALSE(dup.response.reason().empty());
  EXPECT_EQ(service_->results_accepted(), 1 + others);

  FinishAndCheck(w2);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// Malformed result streams and wrong tensors: INVALID_ARGUMENT, nothing applied, the lease kept.

struct StreamCase {
  std::string what;
  std::vector<v1::ResultChunk> msgs;
  std::vector<std::string> parts;  // message substrings
};

TEST_F(TaskServiceWireTest, MalformedResultStreamsAreInvalidArgumentAndApplyNothing) {
  Start();
  StartGradient();
  const std::string w = Register("misbehaving");
  // Each case is pushed under the live lease of `hdr`'s task: refused, nothing applied, no
  // result counted.
  auto refuse_all = [&](const std::vector<StreamCase>& cases) {
    const int64_t accepted = service_->results_accepted();
    for (const StreamCase& c : cases) {
      SCOPED_TRACE(c.what);
      const PushOutcome p = Push(c.msgs);
      EXPECT_EQ(p.status.code(), absl::StatusCode::kInvalidArgument) << p.status;
      for (const std::string& part : c.parts) {
        EXPECT_NE(p.status.message().find(part), std::string::npos)
            << "\"" << p.status.message() << "\" lacks \"" << part << "\"";
      }
      EXPECT_FALSE(p.response.accepted());
      EXPECT_EQ(service_->results_accepted(), accepted);
      EXPECT_EQ(service_->results_rejected(), 0);
    }
  };

  // The stream itself, on the first task (the summary of layer 0, span 0): "compute_seconds",
  // "device_traffic" (6), "h_end" (16, 4), "rebuild_seconds", "sigma" (16), in stream order.
  const v1::Task t = PullTaskWait(w);
  ASSERT_EQ(t.kind(), v1::Task::SPAN_FORWARD_SUMMARY);
  const Named good = Work(w, t);
  ASSERT_EQ(good.size(), 5u);
  const v1::ResultChunk hdr = Header(w, t);
  std::vector<StreamCase> cases;
  cases.push_back({"empty stream", {}, {"header"}});
  cases.push_back({"no header", Messages(std::nullopt, good), {"header"}});
  {
    std::vector<v1::ResultChunk> m = {hdr};
    m.emplace_back();  // neither a header nor a tensor
    cases.push_back({"header then an empty message", m, {"tensors only"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.emplace_back();
    cases.push_back({"tensors then an empty message", m, {"tensors only"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.insert(m.begin() + 1, hdr);
    cases.push_back({"two headers", m, {"tensors only"}});
  }
  // Broken pieces of "h_end" (16 x 4 f32 = 256 bytes, cut into 64-byte pieces).
  auto with_h_end_pieces = [&](auto edit) {
    std::vector<v1::ResultChunk> m = {hdr};
    for (const auto& [name, tensor] : good) {
      if (name != "h_end") {
        AppendTensor(m, name, tensor);
        continue;
      }
      std::vector<v1::TensorChunk> pieces = SplitTensor(name, tensor, 64);
      EXPECT_EQ(pieces.size(), 4u);
      edit(pieces);
      for (const v1::TensorChunk& c : pieces) *m.emplace_back().mutable_tensor() = c;
    }
    return m;
  };
  cases.push_back({"offset gap",
                   with_h_end_pieces([](auto& p) { p.erase(p.begin() + 1); }),
                   {"\"h_end\"", "contiguous"}});
  cases.push_back({"pieces out of order",
                   with_h_end_pieces([](auto& p) { std::swap(p[1], p[2]); }),
                   {"\"h_end\"", "contiguous"}});
  cases.push_back({"data past total",
                   with_h_end_pieces([](auto& p) { p.back().mutable_data()->append("abcd"); }),
                   {"\"h_end\"", "past total_bytes"}});
  cases.push_back({"missing last (then the next tensor's header)",
                   with_h_end_pieces([](auto& p) { p.back().set_last(false); }),
                   {"\"h_end\"", "incomplete"}});
  cases.push_back({"last too early",
                   with_h_end_pieces([](auto& p) { p[1].set_last(true); }),
                   {"\"h_end\"", "last chunk ends at byte 128"}});
  cases.push_back({"a piece repeated",
                   with_h_end_pieces([](auto& p) { p.insert(p.begin() + 1, p[1]); }),
                   {"\"h_end\"", "contiguous"}});
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.back().mutable_tensor()->set_last(false);  // the stream's last tensor
    cases.push_back({"stream ends without the last piece", m,
                     {"\"" + good.back().first + "\"", "no last chunk"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m[1].mutable_tensor()->mutable_header()->set_total_bytes(12345);
    cases.push_back({"total_bytes not matching the shape", m, {"does not match"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m[1].mutable_tensor()->mutable_header()->set_dtype(static_cast<v1::DType>(99));
    cases.push_back({"unknown dtype enum", m, {}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m[1].mutable_tensor()->mutable_header()->set_name("");
    cases.push_back({"empty tensor name", m, {"empty name"}});
  }
  {
    Named n = good;
    n.emplace_back("h_end", Find(n, "h_end"));
    cases.push_back({"a tensor twice", Messages(hdr, n), {"\"h_end\"", "twice"}});
  }
  // Well-formed streams with the wrong tensors (engine/span_tensors.h TakeSpanResult).
  {
    Named n = good;
    Find(n, "h_end").shape = {64};  // same bytes, flat
    cases.push_back({"wrong shape (h_end flat)", Messages(hdr, n),
                     {"\"h_end\"", "expected F32(16, 4)"}});
  }
  {
    Named n = good;
    HostTensor& h = Find(n, "h_end");
    std::vector<float> more = h.To<float>().value();
    more.resize(more.size() + 4, 0.0f);
    h = HostTensor::From<float>(more, {17, 4}, DType::kF32);
    cases.push_back({"wrong shape (h_end one row too many)", Messages(hdr, n),
                     {"\"h_end\"", "(17, 4)"}});
  }
  {
    Named n = good;
    HostTensor& sigma = Find(n, "sigma");
    sigma = HostTensor::From<float>(sigma.To<float>().value(), sigma.shape, DType::kF64);
    cases.push_back({"wrong dtype (sigma F64)", Messages(hdr, n), {"\"sigma\"", "F64"}});
  }
  {
    Named n = good;
    HostTensor& h = Find(n, "h_end");
    h = HostTensor::From<float>(h.To<float>().value(), h.shape, DType::kBF16);
    cases.push_back({"wrong dtype (h_end BF16)", Messages(hdr, n), {"\"h_end\"", "BF16"}});
  }
  {
    Named n = good;
    Erase(n, "sigma");
    cases.push_back({"missing sigma", Messages(hdr, n), {"missing tensor \"sigma\""}});
  }
  {
    Named n = good;
    Erase(n, "compute_seconds");
    cases.push_back({"missing compute_seconds", Messages(hdr, n),
                     {"missing tensor \"compute_seconds\""}});
  }
  {
    Named n = good;
    Find(n, "rebuild_seconds") = HostTensor::From<float>(std::vector<float>{0.0f}, {},
                                                         DType::kF32);
    cases.push_back({"rebuild_seconds not an F64 scalar", Messages(hdr, n),
                     {"\"rebuild_seconds\" must be a F64 scalar"}});
  }
  {
    Named n = good;
    Erase(n, "device_traffic");
    cases.push_back({"missing device_traffic", Messages(hdr, n), {"\"device_traffic\" I64(6)"}});
  }
  {
    Named n = good;
    HostTensor& t = Find(n, "device_traffic");
    const int64_t negative = -1;
    std::memcpy(t.data.data() + 4 * sizeof(int64_t), &negative, sizeof(negative));  // syncs
    cases.push_back({"a negative device count", Messages(hdr, n),
                     {"\"device_traffic\" has a negative count"}});
  }
  cases.push_back({"no tensors at all", {hdr}, {"missing tensor"}});
  {
    Named n = good;
    n.emplace_back("extra", HostTensor::From<float>(std::vector<float>{1.0f}, {1}, DType::kF32));
    cases.push_back({"extra tensor", Messages(hdr, n), {"unexpected tensor \"extra\""}});
  }
  {
    Named n = good;
    n.emplace_back("halo_next",
                   HostTensor::From<float>(std::vector<float>(24, 0.0f), {3, 8}, DType::kF32));
    cases.push_back({"another kind's tensor", Messages(hdr, n),
                     {"unexpected tensor \"halo_next\""}});
  }
  // Malformed ids in the header.
  cases.push_back({"malformed task id in the header",
                   Messages(HeaderMsg(w, "bogus", t.lease_id()), good), {"malformed task id"}});
  cases.push_back({"malformed lease id in the header",
                   Messages(HeaderMsg(w, t.task_id(), "bogus"), good), {"malformed lease id"}});
  refuse_all(cases);
  // Nothing was applied and the lease is intact: the correct result is accepted now.
  PushOutcome p = Push(Messages(hdr, good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();

  // The head's scalars, on the first forward of the top layer (span 0): "loss_sum" F64 () and
  // "correct" I64 () beside the embedding's and norm_f's partials.
  const v1::Task head = RunUntil(w, [](const v1::Task& x) {
    return x.kind() == v1::Task::SPAN_FORWARD && x.layer() == 1;
  });
  const Named head_good = Work(w, head);
  const v1::ResultChunk head_hdr = Header(w, head);
  cases.clear();
  {
    Named n = head_good;
    Erase(n, "loss_sum");
    cases.push_back({"missing loss_sum", Messages(head_hdr, n), {"missing tensor \"loss_sum\""}});
  }
  {
    Named n = head_good;
    Find(n, "loss_sum") = HostTensor::From<float>(std::vector<float>{1.0f}, {}, DType::kF32);
    cases.push_back({"loss_sum F32", Messages(head_hdr, n), {"\"loss_sum\" must be a F64 scalar"}});
  }
  {
    Named n = head_good;
    Find(n, "correct").shape = {1};  // the same 8 bytes, not a scalar
    cases.push_back({"correct not a scalar", Messages(head_hdr, n),
                     {"\"correct\" must be a I64 scalar"}});
  }
  {
    Named n = head_good;
    HostTensor& norm_f = Find(n, kNormFName);
    std::vector<float> more = norm_f.To<float>().value();
    more.push_back(0.0f);
    norm_f = HostTensor::From<float>(more, {9}, DType::kF32);
    cases.push_back({"norm_f partial one too long", Messages(head_hdr, n),
                     {kNormFName, "expected F32(8)"}});
  }
  refuse_all(cases);
  p = Push(Messages(head_hdr, head_good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();

  // The layer partials, on the first backward of layer 1 (span 2): the layer's partials under
  // their HF names and "du_halo_prev" (3, 8).
  const v1::Task back =
      RunUntil(w, [](const v1::Task& x) { return x.kind() == v1::Task::SPAN_BACKWARD; });
  ASSERT_EQ(back.layer(), 1);
  const Named back_good = Work(w, back);
  const v1::ResultChunk back_hdr = Header(w, back);
  const std::string in_proj = LayerParamName(1, "mixer.in_proj.weight");
  cases.clear();
  {
    Named n = back_good;
    HostTensor& w_in = Find(n, in_proj);
    std::swap(w_in.shape[0], w_in.shape[1]);  // transposed shape, same bytes
    cases.push_back({"wrong shape (in_proj transposed)", Messages(back_hdr, n),
                     {in_proj, "expected"}});
  }
  {
    Named n = back_good;
    Erase(n, LayerParamName(1, "mixer.A_log"));
    cases.push_back({"missing a layer partial", Messages(back_hdr, n),
                     {"missing tensor", LayerParamName(1, "mixer.A_log")}});
  }
  {
    Named n = back_good;
    for (auto& [name, tensor] : n) {
      const std::string prefix = "backbone.layers.1.";
      if (name.starts_with(prefix)) name = "backbone.layers.0." + name.substr(prefix.size());
    }
    cases.push_back({"partials under layer 0's names", Messages(back_hdr, n),
                     {"missing tensor", "backbone.layers.1."}});
  }
  {
    Named n = back_good;
    HostTensor& d = Find(n, "du_halo_prev");
    d = HostTensor::From<float>(d.To<float>().value(), d.shape, DType::kF64);
    cases.push_back({"wrong dtype (du_halo_prev F64)", Messages(back_hdr, n),
                     {"\"du_halo_prev\"", "F64"}});
  }
  {
    Named n = back_good;
    Erase(n, "du_halo_prev");
    cases.push_back({"missing du_halo_prev", Messages(back_hdr, n),
                     {"missing tensor \"du_halo_prev\""}});
  }
  refuse_all(cases);
  p = Push(Messages(back_hdr, back_good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();

  // The final gradient is bitwise the in-process one.
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  EXPECT_EQ(service_->results_rejected(), 0);
}

// ---------------------------------------------------------------------------------------------
// Size limits: RESOURCE_EXHAUSTED, checked at the declared size.

TEST_F(TaskServiceWireTest, OversizedResultIsResourceExhausted) {
  Start();  // max_result_bytes = 16 KiB
  StartGradient();
  const std::string w = Register("misbehaving");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);  // 336 bytes: sigma, h_end and the two timing scalars
  const v1::ResultChunk hdr = Header(w, t);

  {
    // One tensor declaring 32 MiB; only its header is sent.
    std::vector<v1::ResultChunk> m = {hdr};
    v1::TensorChunk* c = m.emplace_back().mutable_tensor();
    c->mutable_header()->set_name("h_end");
    c->mutable_header()->set_dtype(v1::F32);
    c->mutable_header()->add_shape(int64_t{1} << 21);
    c->mutable_header()->add_shape(4);
    c->mutable_header()->set_total_bytes(uint64_t{32} << 20);
    const PushOutcome p = Push(m);
    EXPECT_TRUE(StatusIs(p.status, absl::StatusCode::kResourceExhausted, "\"h_end\"",
                         "over the limit of 16384 bytes"));
    EXPECT_FALSE(p.response.accepted());
  }
  {
    // Just over the limit: 16 KiB + 4 bytes in one tensor.
    std::vector<v1::ResultChunk> m = {hdr};
    AppendTensor(m, "h_end",
                 HostTensor::From<float>(std::vector<float>(4097, 0.0f), {4097}, DType::kF32));
    EXPECT_TRUE(StatusIs(Push(m).status, absl::StatusCode::kResourceExhausted,
                         "over the limit"));
  }
  {
    // The correct result plus one padding tensor of 16200 bytes, itself under the per-tensor
    // limit: the stream total goes over. (Many small padding tensors are refused earlier, by
    // their count: task_service_hostile_test.cc.)
    Named n = good;
    n.emplace_back("pad0",
                   HostTensor::From<float>(std::vector<float>(4050, 0.0f), {4050}, DType::kF32));
    EXPECT_TRUE(StatusIs(Push(Messages(hdr, n)).status, absl::StatusCode::kResourceExhausted,
                         "brings the stream to", "over the limit of 16384 bytes"));
  }
  EXPECT_EQ(service_->results_accepted(), 0);
  EXPECT_EQ(service_->results_rejected(), 0);

  const PushOutcome p = Push(Messages(hdr, good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// Late, duplicate, stale and unknown results: OK with accepted = false and a reason.

TEST_F(TaskServiceWireTest, DuplicateStaleAndUnknownResultsAreNotAccepted) {
  Start();
  StartGradient();
  const std::string w = Register("misbehaving");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);
  PushOutcome p = Push(Messages(Header(w, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  ASSERT_TRUE(p.response.accepted());
  EXPECT_EQ(service_->results_accepted(), 1);

  // The next task is leased to w; w still quotes "1:0"'s lease below. Which task it is depends
  // on a race the test does not control: if the step began after w registered, it dealt w both
  // spans and this is span 1's first task ("1:1"); if before, w claimed span 0 alone and this is
  // span 0's forward ("1:2").
  const v1::Task t2 = PullTaskWait(w);
  ASSERT_TRUE(t2.task_id() == "1:1" || t2.task_id() == "1:2") << t2.task_id();
  int64_t lease2 = 0;
  const size_t dot2 = t2.lease_id().find('.');
  ASSERT_TRUE(absl::SimpleAtoi(t2.lease_id().substr(0, dot2), &lease2));
  const std::string secret2 = t2.lease_id().substr(dot2 + 1);

  struct Case {
    std::string what, task, lease, reason;
  };
  const std::vector<Case> cases = {
      {"duplicate", t.task_id(), t.lease_id(), "no longer valid"},
      {"unknown task of the current version", "1:99", t.lease_id(),
       "not part of the current step"},
      {"task of a later version", "2:0", t.lease_id(), "not part of the current step"},
      {"task of version 0", "0:0", t.lease_id(), "not part of the current step"},
      {"a leased task with another lease id", t2.task_id(),
       absl::StrCat(lease2 + 100, ".", secret2), "no longer valid"},
      {"a leased task with its lease number and a guessed secret", t2.task_id(),
       absl::StrCat(lease2, ".", std::string(16, 'f')), "no longer valid"},
      {"a leased task with the lease of a done task", t2.task_id(), t.lease_id(),
       "no longer valid"},
      {"a waiting task", "1:19", t2.lease_id(), "no longer valid"},
  };
  int64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // The content is a well-formed result (of task 1:0); the lease check comes first.
    p = Push(Messages(HeaderMsg(w, c.task, c.lease), good));
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_FALSE(p.response.accepted());
    EXPECT_NE(p.response.reason().find(c.reason), std::string::npos) << p.response.reason();
    EXPECT_EQ(service_->results_accepted(), 1);
    EXPECT_EQ(service_->results_rejected(), ++rejected);
  }

  p = Push(Messages(Header(w, t2), Work(w, t2)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  // After the step: a result for one of its tasks is refused the same way.
  p = Push(Messages(Header(w, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_FALSE(p.response.accepted());
  EXPECT_FALSE(p.response.reason().empty());
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// CancelCurrent while tasks are out.

TEST_F(TaskServiceWireTest, CancelCurrentEndsTheStepAndRefusesItsTasks) {
  Start();
  StartGradient();
  const std::string w = Register("worker");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);  // task 1:0 fetched and computed, not yet pushed
  service_->CancelCurrent();
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  EXPECT_TRUE(StatusIs(GradientResult(), absl::StatusCode::kCancelled, "cancelled"));

  auto refused = [&](const std::string& when) {
    SCOPED_TRACE(when);
    absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(w, {t.task_id()});
    ASSERT_TRUE(hb.ok()) << hb.status();
    EXPECT_TRUE(Lists(*hb, t.task_id()));
    // Refused; the contract's code for a cancelled task is FAILED_PRECONDITION, see
    // FetchInputsForACancelledStepIsFailedPrecondition.
    const absl::StatusOr<TensorMap> f = Fetch(w, t.task_id(), t.lease_id());
    EXPECT_TRUE(absl::IsNotFound(f.status()) || absl::IsFailedPrecondition(f.status()))
        << f.status();
    const PushOutcome p = Push(Messages(Header(w, t), good));
    ASSERT_TRUE(p.status.ok()) << p.status;
    EXPECT_FALSE(p.response.accepted());
    EXPECT_FALSE(p.response.reason().empty());
    EXPECT_EQ(service_->results_accepted(), 0);
  };
  refused("no step in flight");
  absl::StatusOr<v1::PullTaskResponse> none = Pull(w);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->has_no_task());

  // The next gradient (version 2) runs normally, and the cancelled step's tasks stay refused.
  StartGradient();
  const v1::Task t2 = PullTaskWait(w);
  EXPECT_EQ(t2.task_id(), "2:0");
  EXPECT_EQ(t2.params_version(), 2u);
  refused("the next step in flight");
  const PushOutcome p = Push(Messages(Header(w, t2), Work(w, t2)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  // The new version's model was fetched anew (the worker dropped version 1 with its spans).
  int params = 0;
  for (const FetchRecord& f : Fake(w).fetches) params += f.include_params ? 1 : 0;
  EXPECT_EQ(params, 2);
}

// Abort (a local cluster whose workers cannot start): the step in flight and every later one
// end with the first reason given.
TEST_F(TaskServiceWireTest, AbortEndsTheStepAndEveryLaterOneWithItsReason) {
  Start();
  StartGradient();
  const std::string w = Register("worker");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);
  service_->Abort(absl::UnavailableError("worker 0 cannot start"));
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  EXPECT_TRUE(StatusIs(GradientResult(), absl::StatusCode::kUnavailable, "cannot start"));
  const PushOutcome p = Push(Messages(Header(w, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_FALSE(p.response.accepted());

  service_->Abort(absl::InternalError("a second reason"));
  StartGradient();
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  EXPECT_TRUE(StatusIs(GradientResult(), absl::StatusCode::kUnavailable, "cannot start"));
  EXPECT_EQ(service_->results_accepted(), 0);
}

// ---------------------------------------------------------------------------------------------
// Span ownership across workers.

// Two workers pulling at once share the spans (a worker claims at most ceil(S / live workers)
// of them: coordinator/span_scheduler.h); when one goes silent holding a lease, that lease
// expires, the other claims its spans and rebuilds them from their tokens and the ledger's
// summaries (FetchInputs with include_span: "tokens" and the "replay.*" inputs), and the
// gradient is still bitwise the in-process one.
TEST_F(TaskServiceWireTest, TwoWorkersShareTheSpansAndOneTakesOverWhenTheOtherGoesSilent) {
  TaskServiceOptions o = DefaultOptions();
  o.lease = absl::Milliseconds(300);
  Start(o);
  const std::vector<std::string> ids = {Register("a"), Register("b")};
  std::mutex mu;
  std::vector<std::set<int64_t>> spans(2);  // spans of each one's accepted results; under mu
  std::atomic<int64_t> accepted[2] = {0, 0};
  std::atomic<int> silent{-1};  // the one that went silent
  // Worker i's loop until the gradient is done. The first of the two to be handed a task past
  // layer 0's forward on a span after the first, once the other has had a result accepted,
  // goes silent there: a span whose rebuild replays inputs ("replay.fwd.0.h0" at least).
  auto serve = [&](int i) {
    const std::string& w = ids[i];
    const auto until = SteadyClock::now() + std::chrono::seconds(60);
    while (!GradientDone() && SteadyClock::now() < until) {
      absl::StatusOr<v1::PullTaskResponse> r = Pull(w);
      if (!r.ok()) {
        ADD_FAILURE() << w << ": " << r.status();
        return;
      }
      if (!r->has_task()) {
        std::this_thread::sleep_for(milliseconds(2));
        continue;
      }
      const v1::Task& t = r->task();
      int none = -1;
      if (accepted[1 - i].load() > 0 && t.span() > 0 && (t.layer() > 0 || IsBackward(t)) &&
          silent.compare_exchange_strong(none, i)) {
        return;  // holds the lease and is never heard of again
      }
      absl::StatusOr<Named> result = TryWork(w, t);
      if (!result.ok()) {
        EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
        continue;
      }
      const PushOutcome p = Push(Messages(Header(w, t), *result));
      EXPECT_TRUE(p.status.ok()) << p.status;
      if (!p.response.accepted()) continue;
      std::lock_guard<std::mutex> lock(mu);
      spans[i].insert(t.span());
      ++accepted[i];
    }
  };
  // Both pull (NoTask) before the step begins: both are live when its spans are handed out.
  std::thread t0(serve, 0), t1(serve, 1);
  std::this_thread::sleep_for(milliseconds(50));
  StartGradient();
  t0.join();
  t1.join();
  ASSERT_NE(silent.load(), -1) << "neither went silent";
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  absl::StatusOr<GradResult<float>> got = GradientResult();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBits(*got, reference_));
  EXPECT_EQ(service_->results_accepted(), kTasks);
  EXPECT_GT(service_->span_rebuilds(), 0);

  // Each owned spans while both were live.
  EXPECT_FALSE(spans[0].empty());
  EXPECT_FALSE(spans[1].empty());
  // The survivor rebuilt a span the silent one had worked on, from a fetch carrying its tokens
  // and replay inputs.
  const int gone = silent.load(), survivor = 1 - gone;
  const FakeWorker& fs = Fake(ids[survivor]);
  bool took_over = false;
  for (int64_t s : fs.rebuilt_spans) took_over |= spans[gone].contains(s);
  EXPECT_TRUE(took_over) << "the survivor rebuilt none of the silent worker's spans";
  bool replay_fetched = false;
  for (const FetchRecord& f : fs.fetches) {
    if (!f.include_span) continue;
    const bool tokens = std::find(f.names.begin(), f.names.end(), "tokens") != f.names.end();
    const bool replay = std::any_of(f.names.begin(), f.names.end(), [](const std::string& n) {
      return n.starts_with("replay.");
    });
    replay_fetched |= tokens && replay;
  }
  EXPECT_TRUE(replay_fetched);
  // Both fetched the parameters, each with its first task; the service made one snapshot of
  // them for the step, which every fetch streams (it made a copy of the model per fetch).
  int64_t with_params = 0;
  for (const std::string& w : ids)
    for (const FetchRecord& f : Fake(w).fetches) with_params += f.include_params ? 1 : 0;
  EXPECT_GE(with_params, 2);
  EXPECT_EQ(service_->param_snapshots(), 1);
}

// ---------------------------------------------------------------------------------------------
// Defects found in TaskServiceImpl once, and fixed; these keep them fixed.

// Was a bug: proto/adjsh.proto documents FetchInputs as "FAILED_PRECONDITION when the lease is no
// longer valid (expired, re-leased or cancelled): drop the task. NOT_FOUND for an unknown task
// or worker." For a task of a cancelled (or finished) step the service answered NOT_FOUND
// ("task 1:0 is not part of the current step"), because ParseTaskName mapped every version but
// the current one to NOT_FOUND. A worker following the contract's RegisterWorker note
// ("register again after NOT_FOUND from another call") would re-register for nothing.
TEST_F(TaskServiceWireTest, FetchInputsForACancelledStepIsFailedPrecondition) {
  Start();
  StartGradient();
  const std::string w = Register("worker");
  const v1::Task t = PullTaskWait(w);
  service_->CancelCurrent();
  ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  ASSERT_TRUE(absl::IsCancelled(GradientResult().status()));
  EXPECT_TRUE(StatusIs(Fetch(w, t.task_id(), t.lease_id()),
                       absl::StatusCode::kFailedPrecondition, t.task_id()));
  // And with the next step in flight.
  StartGradient();
  const v1::Task t2 = PullTaskWait(w);
  EXPECT_TRUE(StatusIs(Fetch(w, t.task_id(), t.lease_id()),
                       absl::StatusCode::kFailedPrecondition, t.task_id()));
  const PushOutcome p = Push(Messages(Header(w, t2), Work(w, t2)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  FinishAndCheck(w);
}

// Was a bug: CheckLease checked that the worker is registered but not that it holds the lease, so
// any registered worker quoting another worker's (task, lease) pair was served its inputs and had
// its result accepted (the TaskQueue records the holder; its Renew refuses other workers with
// FAILED_PRECONDITION). The holder's own result was then refused as a duplicate.
TEST_F(TaskServiceWireTest, AnotherWorkerCannotUseALeaseItDoesNotHold) {
  Start();
  StartGradient();
  const std::string holder = Register("holder"), other = Register("other");
  const v1::Task t = PullTaskWait(holder);
  const Named good = Work(holder, t);
  // Heartbeats already refuse it: other holds no lease of t.
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(other, {t.task_id()});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(Lists(*hb, t.task_id()));
  EXPECT_TRUE(StatusIs(Fetch(other, t.task_id(), t.lease_id()),
                       absl::StatusCode::kFailedPrecondition, t.task_id()));
  EXPECT_TRUE(StatusIs(Fetch(other, t.task_id(), t.lease_id(), true, true),
                       absl::StatusCode::kFailedPrecondition, t.task_id()));
  PushOutcome p = Push(Messages(HeaderMsg(other, t.task_id(), t.lease_id()), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_FALSE(p.response.accepted());
  EXPECT_EQ(service_->results_accepted(), 0);
  // The holder's result is the one accepted.
  p = Push(Messages(Header(holder, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
  // Both are live, so each gets its share of the spans: they finish the step together.
  FinishAndCheckWith({holder, other});
}

}  // namespace
}  // namespace adjsh::coordinator
