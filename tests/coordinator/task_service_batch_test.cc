// TaskServiceImpl::ComputeGradients: a step of several sequences at once (a batch, or held-out
// sequences), over real gRPC with the fixture's well-behaved workers (task_service_fixture.h).
// Each sequence's result is bitwise its own in-process gradient for any number of workers, the
// sequences' spans are dealt over the workers together, and tasks of every sequence are out
// at once.
#include <set>

#include "tests/coordinator/task_service_fixture.h"

namespace adjsh::coordinator {
namespace {

using BatchTest = TaskServiceWireTest;

class Batch {
 public:
  // Sequence 0 is the fixture's (T=40, 3 spans); sequence 1 another 33 tokens in 2 spans with
  // a loss mask; sequence 2 the fixture's tokens again.
  explicit Batch(const GradOptions& base) {
    tokens_.push_back({});
    for (int64_t t = 0; t < kT; ++t) tokens_[0].push_back(static_cast<uint32_t>((t * 7 + 3) % 11));
    tokens_.push_back({});
    for (int64_t t = 0; t < 33; ++t) tokens_[1].push_back(static_cast<uint32_t>((t * 5 + 1) % 11));
    tokens_.push_back(tokens_[0]);
    mask_.assign(33, 1);
    for (int64_t t = 0; t < 33; t += 3) mask_[t] = 0;
    for (size_t b = 0; b < tokens_.size(); ++b) {
      GradOptions o = base;
      if (b == 1) o.spans = 2, o.loss_mask = mask_;
      pieces_.push_back(GradPiece{tokens_[b], o});
    }
  }
  std::span<const GradPiece> pieces() const { return pieces_; }

 private:
  std::vector<std::vector<uint32_t>> tokens_;
  std::vector<uint8_t> mask_;
  std::vector<GradPiece> pieces_;
};

// Each run registers its own workers; the earlier runs' ones are no longer live (unheard of
// for a lease), so the step's spans are dealt over this run's alone.
TEST_F(BatchTest, EachSequenceIsBitwiseItsOwnGradientForAnyNumberOfWorkers) {
  TaskServiceOptions options = DefaultOptions();
  options.lease = absl::Milliseconds(1500);
  Start(options);
  const Batch batch(grad_opt_);
  std::vector<GradResult<float>> want;
  for (const GradPiece& p : batch.pieces())
    want.push_back(ComputeGradient<float>(params_, p.tokens, p.options).value());
  int run_index = 0;
  for (int n : {1, 2, 4, 4, 1}) {  // repeated: the same bits every time
    SCOPED_TRACE(absl::StrCat(n, " workers"));
    if (run_index++ > 0) std::this_thread::sleep_for(milliseconds(1600));
    std::vector<std::string> workers;
    for (int i = 0; i < n; ++i) workers.push_back(Register(absl::StrCat("r", run_index, "w", i)));
    std::optional<absl::StatusOr<std::vector<GradResult<float>>>> got;
    std::mutex mu;
    std::thread run([&] {
      auto r = service_->ComputeGradients(params_, batch.pieces(), "job", 0);
      std::lock_guard<std::mutex> lock(mu);
      got = std::move(r);
    });
    auto done = [&] {
      std::lock_guard<std::mutex> lock(mu);
      return got.has_value();
    };
    std::set<int64_t> sequences_first_round, workers_with_tasks;
    bool first_round = true;
    const auto until = SteadyClock::now() + std::chrono::seconds(60);
    while (!done()) {
      ASSERT_LT(SteadyClock::now(), until) << "the batch did not finish";
      bool any = false;
      for (size_t w = 0; w < workers.size(); ++w) {
        absl::StatusOr<v1::PullTaskResponse> r = Pull(workers[w]);
        ASSERT_TRUE(r.ok()) << r.status();
        if (!r->has_task()) continue;
        const v1::Task& task = r->task();
        EXPECT_EQ(task.sequences(), 3);
        EXPECT_EQ(task.context_length(), task.sequence() == 1 ? 33 : kT);
        EXPECT_EQ(task.spans(), task.sequence() == 1 ? 2 : kSpans);
        EXPECT_EQ(task.masked(), task.sequence() == 1);
        if (first_round) sequences_first_round.insert(task.sequence());
        workers_with_tasks.insert(static_cast<int64_t>(w));
        any = true;
        absl::StatusOr<Named> result = TryWork(workers[w], task);
        ASSERT_TRUE(result.ok()) << result.status();
        const PushOutcome p = Push(Messages(Header(workers[w], task), *result));
        ASSERT_TRUE(p.status.ok()) << p.status;
        EXPECT_TRUE(p.response.accepted()) << p.response.reason();
      }
      if (any) first_round = false;
      if (!any) std::this_thread::sleep_for(milliseconds(2));
    }
    run.join();
    ASSERT_TRUE(got->ok()) << got->status();
    ASSERT_EQ((*got)->size(), 3u);
    for (size_t b = 0; b < 3; ++b) EXPECT_TRUE(SameBits((**got)[b], want[b])) << "sequence " << b;
    // The 8 spans of the step are dealt over the live workers together: every one works, and
    // with 4 of them (2 spans each) tasks of several sequences are out from the first round.
    EXPECT_EQ(workers_with_tasks.size(), static_cast<size_t>(n));
    if (n == 4) {
      EXPECT_GE(sequences_first_round.size(), 2u);
    }
    // Every task of every sequence ran once: 20 + 12 + 20 (engine/span_plan.h).
    EXPECT_EQ((**got)[0].profile.tasks + (**got)[1].profile.tasks + (**got)[2].profile.tasks,
              2 * kTasks + 12);
  }
}

// Held-out sequences at once (forward-only): each loss is the in-process forward-only loss.
TEST_F(BatchTest, ForwardOnlySequencesAtOnceGiveTheirOwnLosses) {
  Start();
  GradOptions eval = grad_opt_;
  eval.forward_only = true;
  const Batch batch(eval);
  const std::string w = Register("w");
  std::optional<absl::StatusOr<std::vector<GradResult<float>>>> got;
  std::thread run([&] { got = service_->ComputeGradients(params_, batch.pieces(), "job", 0); });
  const auto until = SteadyClock::now() + std::chrono::seconds(60);
  int tasks = 0;
  for (;;) {
    ASSERT_LT(SteadyClock::now(), until);
    absl::StatusOr<v1::PullTaskResponse> r = Pull(w);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->has_task()) {
      if (tasks == 2 * 5 + 2 * 3 + 2 * 5) break;  // every forward task of the three plans
      continue;
    }
    EXPECT_TRUE(r->task().forward_only());
    const PushOutcome p = Push(Messages(Header(w, r->task()), Work(w, r->task())));
    ASSERT_TRUE(p.status.ok()) << p.status;
    ++tasks;
  }
  run.join();
  ASSERT_TRUE(got->ok()) << got->status();
  for (size_t b = 0; b < 3; ++b) {
    const GradPiece& p = batch.pieces()[b];
    const GradResult<float> ref = ComputeGradient<float>(params_, p.tokens, p.options).value();
    EXPECT_EQ((**got)[b].loss, ref.loss) << b;
    EXPECT_EQ((**got)[b].targets, ref.targets) << b;
  }
}

// Bad input, refused before anything is handed out: no sequence, a bad sequence (named), and
// training and evaluation mixed in one step.
TEST_F(BatchTest, BadBatchesAreRefusedNamingTheSequence) {
  Start();
  EXPECT_TRUE(StatusIs(service_->ComputeGradients(params_, {}, "job", 0),
                       absl::StatusCode::kInvalidArgument, "no sequence"));
  const std::vector<uint32_t> good(tokens_), oov{1, 2, 99, 3};
  std::vector<GradPiece> pieces{{good, grad_opt_}, {oov, grad_opt_}};
  EXPECT_TRUE(StatusIs(service_->ComputeGradients(params_, pieces, "job", 0),
                       absl::StatusCode::kInvalidArgument, "sequence 1 of the step"));
  pieces[1] = GradPiece{good, grad_opt_};
  pieces[1].options.forward_only = true;
  EXPECT_TRUE(StatusIs(service_->ComputeGradients(params_, pieces, "job", 0),
                       absl::StatusCode::kInvalidArgument, "forward_only"));
  EXPECT_EQ(service_->queue_stats().total, 0);
}

}  // namespace
}  // namespace adjsh::coordinator
