// What callers can make the JobService hold or send is bounded (coordinator/job_service.h):
// oversized specs and paths are refused without echoing them, the queue and the table of ended
// jobs have caps, every ListJobs reply fits its byte budget with paging that reaches every job,
// and page tokens cannot overflow; job ids continue across a restart, so an old id never names
// a new job. Each test failed on the service before these fixes.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "coordinator/job_service.h"
#include "coordinator/task_service.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {

class JobServiceBounds : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("adjsh_job_bounds_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    short_text_ = (dir_ / "short.txt").string();
    std::ofstream(short_text_) << "too short for any context";
  }
  void TearDown() override {
    if (jobs_) jobs_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  void Start(int64_t max_queued, int64_t max_finished, size_t max_reply_bytes = size_t{1} << 20,
             bool data_root = true) {
    JobServiceOptions o;
    o.max_queued_jobs = max_queued;
    o.max_finished_jobs = max_finished;
    o.max_reply_bytes = max_reply_bytes;
    o.state_dir = (dir_ / "state").string();
    if (data_root) o.data_roots = {dir_.string()};
    jobs_ = std::make_unique<JobServiceImpl>(tasks_, o);
  }

  // A job that fails at once when it runs (its corpus is shorter than its context).
  v1::JobSpec FailingSpec() const {
    v1::JobSpec s;
    s.mutable_init()->set_hidden_size(8);
    s.mutable_init()->set_layers(1);
    s.mutable_init()->set_vocab_size(256);
    s.mutable_init()->set_state_size(4);
    s.set_context_length(256);
    s.set_steps(1);
    s.mutable_text_files()->add_paths(short_text_);
    return s;
  }

  void WaitAllEnded() {
    for (int i = 0; i < 1000; ++i) {
      const auto counts = jobs_->CountJobs();
      if (counts.at(v1::Job::QUEUED) == 0 && counts.at(v1::Job::RUNNING) == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "jobs did not end";
  }

  std::filesystem::path dir_;
  std::string short_text_;
  TaskServiceImpl tasks_;
  std::unique_ptr<JobServiceImpl> jobs_;
};

TEST_F(JobServiceBounds, OversizedSpecsAndPathsAreRefusedWithoutEchoingThem) {
  Start(1000, 1000);
  v1::JobSpec big = FailingSpec();
  big.set_checkpoint_dir(std::string(20000, 'a'));
  absl::StatusOr<v1::Job> r = jobs_->Submit(big);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("checkpoint_dir: a path of 20000 bytes"), std::string::npos);
  EXPECT_LT(r.status().message().size(), 300u);
  v1::JobSpec huge = FailingSpec();
  for (int i = 0; i < 40; ++i) huge.mutable_text_files()->add_paths(std::string(4000, 'b'));
  r = jobs_->Submit(huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("over the limit of 65536"), std::string::npos);
  v1::JobSpec dtype = FailingSpec();
  dtype.set_dtype(std::string(30000, 'x'));
  r = jobs_->Submit(dtype);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 400u) << r.status().message().size();
  EXPECT_TRUE(jobs_->Get(std::string(100000, 'j')).status().message().size() < 300u);
}

TEST_F(JobServiceBounds, EndedJobsAreForgottenOldestFirstAndTheQueueIsCapped) {
  Start(1000, 5);
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) {
    absl::StatusOr<v1::Job> j = jobs_->Submit(FailingSpec());
    ASSERT_TRUE(j.ok()) << j.status();
    ids.push_back(j->job_id());
    WaitAllEnded();
  }
  const auto counts = jobs_->CountJobs();
  EXPECT_LE(counts.at(v1::Job::FAILED), 6);  // the cap, plus the one ended after the last submit
  EXPECT_EQ(jobs_->Get(ids.front()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_->Get(ids.back()).ok());
  jobs_->Shutdown();
  jobs_.reset();

  // Queue cap: with the runner unable to start a job (no workers for a valid one), submits past
  // the cap are RESOURCE_EXHAUSTED.
  Start(3, 5);
  v1::JobSpec waits = FailingSpec();
  waits.clear_text_files();  // the built-in corpus: the job runs and waits for workers
  int accepted = 0;
  absl::Status last;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<v1::Job> j = jobs_->Submit(waits);
    if (j.ok()) {
      ++accepted;
    } else {
      last = j.status();
    }
  }
  EXPECT_LE(accepted, 4);  // 3 queued, and the one running
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
}

TEST_F(JobServiceBounds, ListRepliesFitTheirBudgetAndPagingReachesEveryJob) {
  Start(1000, 1000, 4096);
  std::set<std::string> submitted;
  for (int i = 0; i < 30; ++i) {
    v1::JobSpec s = FailingSpec();
    std::filesystem::path long_dir = dir_;
    for (int part = 0; part < 6; ++part) long_dir /= std::string(100, 'c');
    s.set_checkpoint_dir((long_dir / std::to_string(i)).string());
    absl::StatusOr<v1::Job> j = jobs_->Submit(s);
    ASSERT_TRUE(j.ok()) << j.status();
    submitted.insert(j->job_id());
  }
  WaitAllEnded();
  std::set<std::string> listed;
  v1::ListJobsRequest req;
  req.set_page_size(2);
  for (int pages = 0; pages < 100; ++pages) {
    absl::StatusOr<v1::ListJobsResponse> r = jobs_->List(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(r->ByteSizeLong(), 4096u + 2048u);  // one job may exceed a budget on its own
    EXPECT_GE(r->jobs_size(), 1);
    for (const v1::Job& j : r->jobs()) listed.insert(j.job_id());
    if (r->next_page_token().empty()) break;
    req.set_page_token(r->next_page_token());
  }
  EXPECT_EQ(listed, submitted);
  // A page token near INT64_MAX: an empty page, never a negative next token.
  req.set_page_token("9223372036854775800");
  req.set_page_size(1000);
  absl::StatusOr<v1::ListJobsResponse> r = jobs_->List(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->jobs_size(), 0);
  EXPECT_TRUE(r->next_page_token().empty()) << r->next_page_token();
}

std::string fs_canonical(const std::string& p) { return std::filesystem::weakly_canonical(p).string(); }

TEST_F(JobServiceBounds, JobIdsContinueAfterARestart) {
  Start(1000, 1000);
  v1::JobSpec own = FailingSpec();
  own.set_checkpoint_dir((dir_ / "own").string());  // leaves no job-N folder in the state dir
  ASSERT_EQ(jobs_->Submit(own)->job_id(), "job-1");
  ASSERT_EQ(jobs_->Submit(own)->job_id(), "job-2");
  WaitAllEnded();
  jobs_->Shutdown();
  jobs_.reset();
  Start(1000, 1000);  // the same state dir: the old jobs are still known, by their ids
  EXPECT_EQ(jobs_->Submit(own)->job_id(), "job-3");
  absl::StatusOr<v1::Job> old = jobs_->Get("job-1");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->state(), v1::Job::FAILED);
  EXPECT_EQ(old->spec().checkpoint_dir(), fs_canonical((dir_ / "own").string()));
}

// A job queued again by a restart is checked again, against the roots and limits the restarted
// coordinator has: one started without the --data-root a queued job reads from ran it anyway.
TEST_F(JobServiceBounds, JobsQueuedAgainAfterARestartAreCheckedAgain) {
  Start(1000, 1000);
  v1::JobSpec builtin = FailingSpec();
  builtin.clear_text_files();  // the built-in corpus: no path; with no worker it waits, RUNNING
  ASSERT_EQ(jobs_->Submit(builtin)->job_id(), "job-1");
  ASSERT_EQ(jobs_->Submit(FailingSpec())->job_id(), "job-2");  // reads dir_, the data root
  for (int i = 0; i < 1000 && jobs_->Get("job-1")->state() != v1::Job::RUNNING; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(jobs_->Get("job-1")->state(), v1::Job::RUNNING);
  ASSERT_EQ(jobs_->Get("job-2")->state(), v1::Job::QUEUED);
  jobs_->Shutdown();  // both stay on disk, to run again
  jobs_.reset();
  Start(1000, 1000, size_t{1} << 20, /*data_root=*/false);
  absl::StatusOr<v1::Job> refused = jobs_->Get("job-2");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->state(), v1::Job::FAILED);
  EXPECT_NE(refused->error().find("refused when the coordinator started again"),
            std::string::npos) << refused->error();
  EXPECT_NE(refused->error().find("text_files"), std::string::npos) << refused->error();
  absl::StatusOr<v1::Job> again = jobs_->Get("job-1");  // needs no root: it runs again
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->state() == v1::Job::QUEUED || again->state() == v1::Job::RUNNING)
      << again->state();
}

}  // namespace
}  // namespace adjsh::coordinator
