// WorkerWaitNote (coordinator/worker_wait.h) with a fake clock: when a running job's watchers are
// told that no worker takes its tasks, and that workers are back.
#include "coordinator/worker_wait.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);
absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

TEST(WorkerWaitNoteTest, NoWorkerFromTheStartIsNotedOnceAfterTheDelay) {
  WorkerWaitNote note(absl::Seconds(10));
  note.Reset(At(0));
  EXPECT_EQ(note.Update(At(1), 0, 0), "");
  EXPECT_EQ(note.Update(At(9.9), 0, 0), "");
  const std::string m = note.Update(At(10), 0, 0);
  EXPECT_EQ(m,
            "waiting for workers: none connected for 10 s; the job's steps run on `adjsh "
            "worker` processes connected to this coordinator");
  EXPECT_TRUE(note.noted());
  EXPECT_EQ(note.Update(At(20), 0, 0), "");  // once, not every tick
  EXPECT_EQ(note.Update(At(60), 0, 0), "");
  const std::string back = note.Update(At(61), 2, 2);
  EXPECT_EQ(back, "workers are back: 2 are taking tasks; the job goes on");
  EXPECT_FALSE(note.noted());
  EXPECT_EQ(note.Update(At(62), 2, 2), "");
}

TEST(WorkerWaitNoteTest, TheNoteSaysHowToStartAWorkerWhenTheAddressIsKnown) {
  WorkerWaitNote note(absl::Seconds(2));
  note.set_worker_command("adjsh worker --coordinator 10.0.0.5:50051");
  note.Reset(At(0));
  EXPECT_EQ(note.Update(At(2), 0, 0),
            "waiting for workers: none connected for 2 s; start one with `adjsh worker "
            "--coordinator 10.0.0.5:50051`");
}

TEST(WorkerWaitNoteTest, AShortGapIsNotNoted) {
  WorkerWaitNote note(absl::Seconds(10));
  note.Reset(At(0));
  EXPECT_EQ(note.Update(At(1), 1, 1), "");
  // The worker is gone from 5 s to 14 s: 9 s without one, under the delay.
  EXPECT_EQ(note.Update(At(5), 0, 0), "");
  EXPECT_EQ(note.Update(At(14), 0, 0), "");
  EXPECT_EQ(note.Update(At(14.5), 1, 1), "");  // back before the note: nothing to say
  // A later gap is measured from its own start, not from the first one's.
  EXPECT_EQ(note.Update(At(20), 0, 0), "");
  EXPECT_EQ(note.Update(At(29), 0, 0), "");
  EXPECT_NE(note.Update(At(30), 0, 0), "");
}

TEST(WorkerWaitNoteTest, ConnectedButShunnedWorkersAreNamedAsSuch) {
  WorkerWaitNote note(absl::Seconds(2));
  note.Reset(At(0));
  const std::string m = note.Update(At(3), 1, 0);
  EXPECT_TRUE(absl::StartsWith(m, "waiting for workers: the 1 connected one gets no tasks")) << m;
  EXPECT_TRUE(absl::StrContains(m, "non-finite")) << m;
  EXPECT_EQ(note.Update(At(4), 1, 1), "workers are back: 1 is taking tasks; the job goes on");
}

TEST(WorkerWaitNoteTest, ResetForgetsTheNoteOfTheLastJob) {
  WorkerWaitNote note(absl::Seconds(2));
  note.Reset(At(0));
  EXPECT_NE(note.Update(At(2), 0, 0), "");
  note.Reset(At(5));  // the next job: its own wait, from its start
  EXPECT_FALSE(note.noted());
  EXPECT_EQ(note.Update(At(6), 0, 0), "");
  EXPECT_EQ(note.Update(At(6.5), 1, 1), "");  // no "back" for a note the job never had
  EXPECT_EQ(note.Update(At(7), 0, 0), "");
  EXPECT_NE(note.Update(At(9), 0, 0), "");
}

}  // namespace
}  // namespace adjsh::coordinator
