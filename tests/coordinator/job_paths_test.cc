// coordinator/job_paths.h: a job's paths confined to the data roots and the state dir.
// Every case here was allowed before the confinement (the coordinator read and wrote wherever
// a spec said).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "coordinator/job_paths.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {
namespace fs = std::filesystem;

class JobPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("adjsh_job_paths_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_ / "data" / "model");
    fs::create_directories(dir_ / "data2");
    fs::create_directories(dir_ / "state");
    fs::create_directories(dir_ / "outside");
    std::ofstream(dir_ / "data" / "a.txt") << "text";
    std::ofstream(dir_ / "data2" / "b.txt") << "text";
    std::ofstream(dir_ / "outside" / "secret") << "secret";
    std::ofstream(dir_ / "data" / "model" / "config.json") << "{}";
    fs::create_symlink(dir_ / "outside" / "secret", dir_ / "data" / "link.txt");
    fs::create_symlink(dir_ / "outside", dir_ / "data" / "linkdir");
    fs::create_symlink(dir_ / "outside" / "secret", dir_ / "data" / "model" / "model.safetensors");
    roots_ = {{(dir_ / "data").string()}, (dir_ / "state").string()};
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::Status Text(const std::string& path, v1::JobSpec* out = nullptr) {
    v1::JobSpec s;
    s.mutable_text_files()->add_paths(path);
    absl::Status st = ConfineJobPaths(s, roots_);
    if (out) *out = s;
    return st;
  }
  absl::Status Checkpoint(const std::string& path, v1::JobSpec* out = nullptr) {
    v1::JobSpec s;
    s.set_checkpoint_dir(path);
    absl::Status st = ConfineJobPaths(s, roots_);
    if (out) *out = s;
    return st;
  }

  fs::path dir_;
  PathRoots roots_;
};

TEST_F(JobPaths, InsideTheRootsIsAllowedAndResolved) {
  v1::JobSpec s;
  EXPECT_TRUE(Text((dir_ / "data" / "a.txt").string(), &s).ok());
  EXPECT_EQ(s.text_files().paths(0), fs::weakly_canonical(dir_ / "data" / "a.txt").string());
  EXPECT_TRUE(Text((dir_ / "data" / "." / "a.txt").string()).ok());
  EXPECT_TRUE(Checkpoint((dir_ / "state" / "job-x").string()).ok());
  EXPECT_TRUE(Checkpoint((dir_ / "data" / "new" / "ckpt").string()).ok());
  // Relative paths are taken in the state dir, not the coordinator's working directory.
  ASSERT_TRUE(Checkpoint("mine", &s).ok());
  EXPECT_EQ(s.checkpoint_dir(), fs::weakly_canonical(dir_ / "state" / "mine").string());
}

TEST_F(JobPaths, OutsideTheRootsIsDeniedTheSameWhetherOrNotTheFileExists) {
  const absl::Status exists = Text((dir_ / "outside" / "secret").string());
  const absl::Status missing = Text((dir_ / "outside" / "nothing-here").string());
  EXPECT_EQ(exists.code(), absl::StatusCode::kPermissionDenied) << exists;
  EXPECT_EQ(missing.code(), absl::StatusCode::kPermissionDenied) << missing;
  EXPECT_NE(exists.message().find("outside the coordinator's data roots"), std::string::npos);
  EXPECT_TRUE(Text("/etc/shadow").code() == absl::StatusCode::kPermissionDenied);
  // A sibling whose name starts like a root is not inside it.
  EXPECT_EQ(Text((dir_ / "data2" / "b.txt").string()).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Checkpoint("/tmp/adjsh-anywhere").code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(JobPaths, DotDotAndLinksOutOfARootAreDenied) {
  absl::Status s = Checkpoint("../x");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("\"..\" is not allowed"), std::string::npos) << s;
  EXPECT_EQ(Checkpoint((dir_ / "state" / ".." / "outside").string()).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Text((dir_ / "data" / "link.txt").string()).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Checkpoint((dir_ / "data" / "linkdir" / "ckpt").string()).code(),
            absl::StatusCode::kPermissionDenied);
  // A model dir inside a root whose weights are a link out of it.
  v1::JobSpec m;
  m.set_model_dir((dir_ / "data" / "model").string());
  s = ConfineJobPaths(m, roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_F(JobPaths, WithoutDataRootsOnlyTheStateDirIsAllowed) {
  roots_.data_roots.clear();
  EXPECT_EQ(Text((dir_ / "data" / "a.txt").string()).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Checkpoint("job-1").ok());
  v1::JobSpec builtin;  // no data: the built-in corpus needs no root
  EXPECT_TRUE(ConfineJobPaths(builtin, roots_).ok());
}

}  // namespace
}  // namespace adjsh::coordinator
