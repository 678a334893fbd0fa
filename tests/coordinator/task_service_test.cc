// The coordinator's TaskService over real gRPC (127.0.0.1, a selected port) with a gradient in
// flight: TaskServiceImpl::ComputeGradient runs on a background thread for a tiny model, and the
// test acts as a worker through a stub, first a misbehaving one (unknown ids, malformed and
// stale task and lease ids, broken or wrong result streams, oversized results, late, duplicate
// and foreign results), then a well-behaved one that completes every task. Every bad call must
// be answered with the code proto/adjsh.proto documents, and must leave nothing applied: the
// final gradient is bitwise the in-process ComputeGradient<float>.
//
// The last three tests guard defects found here once (see their comments).
#include "tests/coordinator/task_service_fixture.h"

namespace adjsh::coordinator {
namespace {

// ---------------------------------------------------------------------------------------------
// The well-behaved worker alone.

TEST_F(TaskServiceWireTest, WellBehavedWorkerGetsTheInProcessGradientBitwise) {
  Start();
  StartGradient();
  const std::string w = Register("good");
  const v1::Task t = PullTaskWait(w);
  // The first task is (k = K - 1, c = last chunk): layer 1, chunk 2 = tokens [32, 40).
  EXPECT_EQ(t.task_id(), "1:0");
  EXPECT_EQ(t.kind(), v1::Task::BACKWARD);
  EXPECT_EQ(t.layer(), 1);
  EXPECT_EQ(t.chunk(), 2);
  EXPECT_EQ(t.t0(), 32);
  EXPECT_EQ(t.len(), 8);
  EXPECT_EQ(t.halo(), 3);
  EXPECT_EQ(t.ahead(), 0);
  EXPECT_EQ(t.window(), 0);
  EXPECT_EQ(t.dtype(), v1::F32);
  EXPECT_EQ(t.job_id(), "job");
  EXPECT_EQ(t.step(), 0);
  EXPECT_EQ(t.params_version(), 1u);
  EXPECT_EQ(t.context_length(), kT);
  EXPECT_EQ(t.lease_expires_ms(), 60000);

  // Without parameters: the task's inputs only (the last chunk has no incoming mu).
  absl::StatusOr<TensorMap> bare = Fetch(w, t.task_id(), t.lease_id(), /*include_params=*/false);
  ASSERT_TRUE(bare.ok()) << bare.status();
  ASSERT_EQ(bare->size(), 3u);
  EXPECT_EQ(bare->at("u").shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(bare->at("g").shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(bare->at("h0").shape, (std::vector<int64_t>{16, 4}));
  // With parameters: layer 1's tensors under their HF names, bitwise the coordinator's.
  absl::StatusOr<TensorMap> full = Fetch(w, t.task_id(), t.lease_id());
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->size(), 3 + LayerParamSlots<float>().size());
  for (const LayerParamSlot<float>& slot : LayerParamSlots<float>()) {
    const std::string name = LayerParamName(1, slot.suffix);
    ASSERT_TRUE(full->contains(name)) << name;
    EXPECT_EQ(full->at(name).To<float>().value(), params_.layers[1].*slot.member) << name;
  }
  EXPECT_GT(service_->bytes_sent(), 0u);

  const PushOutcome p = Push(Messages(Header(w, t), Compute(t, *full)));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted());
  EXPECT_EQ(p.response.reason(), "");
  EXPECT_EQ(service_->results_accepted(), 1);

  FinishAndCheck(w);
  EXPECT_EQ(service_->results_accepted(), kTasks);
  EXPECT_EQ(service_->results_rejected(), 0);
  EXPECT_GT(service_->bytes_received(), 0u);
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
  HostTensor& du = Find(wrong, "du");
  std::vector<float> v = du.To<float>().value();
  v[5] += 1.0f;
  du = HostTensor::From<float>(v, du.shape, DType::kF32);
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
      // A task of another step (version) or outside the step: NOT_FOUND ("unknown task").
      {"2:0", L, absl::StatusCode::kNotFound, "not part of the current step"},
      {"0:0", L, absl::StatusCode::kNotFound, "not part of the current step"},
      {"1:6", L, absl::StatusCode::kNotFound, "not part of the current step"},
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
      // A task not leased at all (waiting on its dependencies), quoting a real lease id.
      {"1:5", L, absl::StatusCode::kFailedPrecondition, "no longer valid"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("task \"", c.task, "\" lease \"", c.lease, "\""));
    EXPECT_TRUE(StatusIs(Fetch(w, c.task, c.lease), c.code, c.part));
  }

  // A heartbeat with those ids: every one but the held task is answered cancelled, the held
  // one is renewed.
  absl::StatusOr<v1::HeartbeatResponse> hb =
      Heartbeat(w, {"garbage", "", "2:0", "1:6", "1:5", t.task_id()});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->cancelled_task_ids_size(), 5);
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

  // The task is handed out anew, under a new lease; the stale lease stays refused.
  v1::Task again;
  bool accepted = false;
  for (int attempt = 0; attempt < 5 && !accepted; ++attempt) {
    again = PullTaskWait(w2);
    ASSERT_EQ(again.task_id(), t.task_id());
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
  EXPECT_EQ(service_->results_accepted(), 1);
  // A duplicate of the accepted result.
  const PushOutcome dup = Push(Messages(Header(w2, again), good));
  ASSERT_TRUE(dup.status.ok()) << dup.status;
  EXPECT_FALSE(dup.response.accepted());
  EXPECT_FALSE(dup.response.reason().empty());
  EXPECT_EQ(service_->results_accepted(), 1);

  FinishAndCheck(w2);
  EXPECT_EQ(service_->results_accepted(), kTasks);
}

// ---------------------------------------------------------------------------------------------
// Malformed result streams and wrong tensors: INVALID_ARGUMENT, nothing applied, the lease kept.

TEST_F(TaskServiceWireTest, MalformedResultStreamsAreInvalidArgumentAndApplyNothing) {
  Start();
  StartGradient();
  const std::string w = Register("misbehaving");
  const v1::Task t = PullTaskWait(w);
  const Named good = Work(w, t);
  ASSERT_EQ(good.size(), LayerParamSlots<float>().size() + 3);
  const v1::ResultChunk hdr = Header(w, t);
  const std::string in_proj = LayerParamName(1, "mixer.in_proj.weight");

  struct Case {
    std::string what;
    std::vector<v1::ResultChunk> msgs;
    std::vector<std::string> parts;  // message substrings
  };
  std::vector<Case> cases;
  cases.push_back({"empty stream", {}, {"header"}});
  cases.push_back({"no header", Messages(std::nullopt, good), {"header"}});
  {
    std::vector<v1::ResultChunk> m = {hdr};
    m.emplace_back().set_loss_sum(1.5);
    cases.push_back({"header then loss_sum", m, {"tensors only"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.emplace_back().set_loss_sum(1.5);
    cases.push_back({"tensors then loss_sum", m, {"tensors only"}});
  }
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.insert(m.begin() + 1, hdr);
    cases.push_back({"two headers", m, {"tensors only"}});
  }
  // Broken pieces of "du" (8 x 8 f32 = 256 bytes, cut into 64-byte pieces).
  auto with_du_pieces = [&](auto edit) {
    std::vector<v1::ResultChunk> m = {hdr};
    for (const auto& [name, tensor] : good) {
      if (name != "du") {
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
                   with_du_pieces([](auto& p) { p.erase(p.begin() + 1); }),
                   {"\"du\"", "contiguous"}});
  cases.push_back({"pieces out of order",
                   with_du_pieces([](auto& p) { std::swap(p[1], p[2]); }),
                   {"\"du\"", "contiguous"}});
  cases.push_back({"data past total",
                   with_du_pieces([](auto& p) { p.back().mutable_data()->append("abcd"); }),
                   {"\"du\"", "past total_bytes"}});
  cases.push_back({"missing last (then the next tensor's header)",
                   with_du_pieces([](auto& p) { p.back().set_last(false); }),
                   {"\"du\"", "incomplete"}});
  cases.push_back({"last too early",
                   with_du_pieces([](auto& p) { p[1].set_last(true); }),
                   {"\"du\"", "last chunk ends at byte 128"}});
  cases.push_back({"a piece repeated",
                   with_du_pieces([](auto& p) { p.insert(p.begin() + 1, p[1]); }),
                   {"\"du\"", "contiguous"}});
  {
    std::vector<v1::ResultChunk> m = Messages(hdr, good);
    m.back().mutable_tensor()->set_last(false);  // mu_out, the stream's last tensor
    cases.push_back({"stream ends without the last piece", m, {"\"mu_out\"", "no last chunk"}});
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
    n.emplace_back("du", Find(n, "du"));
    cases.push_back({"a tensor twice", Messages(hdr, n), {"\"du\"", "twice"}});
  }
  // Well-formed streams with the wrong tensors.
  {
    Named n = good;
    HostTensor& du = Find(n, "du");
    du.shape = {64};  // same bytes, flat
    cases.push_back({"wrong shape (du flat)", Messages(hdr, n), {"\"du\"", "expected F32(8, 8)"}});
  }
  {
    Named n = good;
    HostTensor& du = Find(n, "du");
    const std::vector<float> v = du.To<float>().value();
    std::vector<float> more(v);
    more.resize(v.size() + 8, 0.0f);
    du = HostTensor::From<float>(more, {9, 8}, DType::kF32);
    cases.push_back({"wrong shape (du one row too many)", Messages(hdr, n), {"\"du\"", "(9, 8)"}});
  }
  {
    Named n = good;
    HostTensor& w_in = Find(n, in_proj);
    std::swap(w_in.shape[0], w_in.shape[1]);  // transposed shape, same bytes
    cases.push_back({"wrong shape (in_proj transposed)", Messages(hdr, n), {in_proj, "expected"}});
  }
  {
    Named n = good;
    HostTensor& mu = Find(n, "mu_out");
    mu = HostTensor::From<float>(mu.To<float>().value(), mu.shape, DType::kF64);
    cases.push_back({"wrong dtype (mu_out F64)", Messages(hdr, n), {"\"mu_out\"", "F64"}});
  }
  {
    Named n = good;
    HostTensor& du = Find(n, "du");
    du = HostTensor::From<float>(du.To<float>().value(), du.shape, DType::kBF16);
    cases.push_back({"wrong dtype (du BF16)", Messages(hdr, n), {"\"du\"", "BF16"}});
  }
  {
    Named n = good;
    Erase(n, "du_halo");
    cases.push_back({"missing du_halo", Messages(hdr, n), {"lacks \"du_halo\""}});
  }
  {
    Named n = good;
    Erase(n, LayerParamName(1, "mixer.A_log"));
    cases.push_back({"missing a layer partial", Messages(hdr, n),
                     {"lacks", LayerParamName(1, "mixer.A_log")}});
  }
  cases.push_back({"no tensors at all", {hdr}, {"lacks"}});
  {
    Named n = good;
    n.emplace_back("extra", HostTensor::From<float>(std::vector<float>{1.0f}, {1}, DType::kF32));
    cases.push_back({"extra tensor", Messages(hdr, n), {"unexpected tensor \"extra\""}});
  }
  {
    Named n = good;
    for (auto& [name, tensor] : n) {
      const std::string prefix = "backbone.layers.1.";
      if (name.starts_with(prefix)) name = "backbone.layers.0." + name.substr(prefix.size());
    }
    cases.push_back({"partials under layer 0's names", Messages(hdr, n),
                     {"lacks", "backbone.layers.1."}});
  }
  // Malformed ids in the header.
  cases.push_back({"malformed task id in the header",
                   Messages(HeaderMsg(w, "bogus", t.lease_id()), good), {"malformed task id"}});
  cases.push_back({"malformed lease id in the header",
                   Messages(HeaderMsg(w, t.task_id(), "bogus"), good), {"malformed lease id"}});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const PushOutcome p = Push(c.msgs);
    EXPECT_EQ(p.status.code(), absl::StatusCode::kInvalidArgument) << p.status;
    for (const std::string& part : c.parts) {
      EXPECT_NE(p.status.message().find(part), std::string::npos)
          << "\"" << p.status.message() << "\" lacks \"" << part << "\"";
    }
    EXPECT_FALSE(p.response.accepted());
    EXPECT_EQ(service_->results_accepted(), 0);
    EXPECT_EQ(service_->results_rejected(), 0);
  }

  // Nothing was applied and the lease is intact: the correct result is accepted now, and the
  // final gradient is bitwise the in-process one.
  const PushOutcome p = Push(Messages(hdr, good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
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
  const Named good = Work(w, t);
  const v1::ResultChunk hdr = Header(w, t);

  {
    // One tensor declaring 32 MiB; only its header is sent.
    std::vector<v1::ResultChunk> m = {hdr};
    v1::TensorChunk* c = m.emplace_back().mutable_tensor();
    c->mutable_header()->set_name("du");
    c->mutable_header()->set_dtype(v1::F32);
    c->mutable_header()->add_shape(int64_t{1} << 20);
    c->mutable_header()->add_shape(8);
    c->mutable_header()->set_total_bytes(uint64_t{32} << 20);
    const PushOutcome p = Push(m);
    EXPECT_TRUE(StatusIs(p.status, absl::StatusCode::kResourceExhausted, "\"du\"",
                         "over the limit of 16384 bytes"));
    EXPECT_FALSE(p.response.accepted());
  }
  {
    // Just over the limit: 16 KiB + 4 bytes in one tensor.
    std::vector<v1::ResultChunk> m = {hdr};
    AppendTensor(m, "du",
                 HostTensor::From<float>(std::vector<float>(4097, 0.0f), {4097}, DType::kF32));
    EXPECT_TRUE(StatusIs(Push(m).status, absl::StatusCode::kResourceExhausted,
                         "over the limit"));
  }
  {
    // The correct result plus one padding tensor of 13.6 KB, itself under the per-tensor
    // limit: the stream total goes over. (Many small padding tensors are refused earlier, by
    // their count: task_service_hostile_test.cc.)
    Named n = good;
    n.emplace_back("pad0",
                   HostTensor::From<float>(std::vector<float>(3400, 0.0f), {3400}, DType::kF32));
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

  // The next task ("1:1", layer 1 chunk 1) is leased to w; w still quotes "1:0"'s lease below.
  const v1::Task t2 = PullTaskWait(w);
  ASSERT_EQ(t2.task_id(), "1:1");
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
      {"a waiting task", "1:5", t2.lease_id(), "no longer valid"},
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
// Defects found in TaskServiceImpl once, and fixed; these keep them fixed.

// Was a bug: proto/adjsh.proto documents FetchInputs as "FAILED_PRECONDITION when the lease is no
// longer valid (expired, re-leased or cancelled): drop the task. NOT_FOUND for an unknown task
// or worker." For a task of a cancelled (or finished) step the service answers NOT_FOUND
// ("task 1:0 is not part of the current step"), because ParseTaskName maps every version but
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

// Was a bug: a cancel that arrives while ComputeGradient is running its forward pass (before the
// step is published) is lost: ComputeGradient sets cancelled_ = false after the forward, so it
// then waits for every task instead of returning CANCELLED.
TEST_F(TaskServiceWireTest, CancelDuringTheForwardIsNotLost) {
  Start();
  GradOptions opt = grad_opt_;
  TaskServiceImpl* service = nullptr;
  std::atomic<bool> cancelled{false};
  opt.progress = [&](std::string_view phase, int64_t, int64_t) {
    // The forward's first layer is done: the gradient is being computed. (Only in the
    // forward: "backward" progress comes from PushResult with the service's lock held.)
    if (phase == "forward" && !cancelled.exchange(true)) service->CancelCurrent();
  };
  service = service_.get();
  StartGradient(opt);
  const bool returned = WaitGradient(std::chrono::seconds(3));
  EXPECT_TRUE(cancelled.load());
  EXPECT_TRUE(returned) << "ComputeGradient ignored a CancelCurrent made during its forward";
  if (!returned) {
    service_->CancelCurrent();
    ASSERT_TRUE(WaitGradient(std::chrono::seconds(10)));
  }
  EXPECT_TRUE(absl::IsCancelled(GradientResult().status())) << GradientResult().status();
}

// Was a bug: CheckLease checked that the worker is registered but not that it holds the lease, so any
// registered worker quoting another worker's (task, lease) pair is served its inputs and has
// its result accepted (the TaskQueue records the holder; its Renew refuses other workers with
// FAILED_PRECONDITION). The holder's own result is then refused as a duplicate.
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
  PushOutcome p = Push(Messages(HeaderMsg(other, t.task_id(), t.lease_id()), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_FALSE(p.response.accepted());
  EXPECT_EQ(service_->results_accepted(), 0);
  // The holder's result is the one accepted.
  p = Push(Messages(Header(holder, t), good));
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.response.accepted()) << p.response.reason();
  FinishAndCheck(holder);
}

}  // namespace
}  // namespace adjsh::coordinator
