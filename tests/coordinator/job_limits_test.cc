// coordinator/job_spec.h: the per-job limits of a coordinator. A spec over a limit is refused
// with INVALID_ARGUMENT naming the coordinator flag; one exactly at every limit is accepted;
// the largest-tensor size saturates instead of overflowing for absurd shapes.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/config.h"
#include "coordinator/job_spec.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {

v1::JobSpec Spec(int64_t d, int64_t k, int64_t v, int64_t context) {
  v1::JobSpec s;
  s.mutable_init()->set_hidden_size(d);
  s.mutable_init()->set_layers(k);
  s.mutable_init()->set_vocab_size(v);
  s.mutable_init()->set_state_size(4);
  s.set_context_length(context);
  s.set_steps(1);
  return s;
}

void ExpectLimit(const absl::Status& s, const std::string& flag) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(flag), std::string::npos) << s;
}

TEST(JobLimits, LargestParamBytes) {
  MambaConfig c;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.state_size = 4;
  c.vocab_size = 256;
  c.time_step_rank = 1;
  EXPECT_EQ(LargestParamBytes(c), uint64_t{256} * 16 * 4);  // embeddings (V, D)
  c.vocab_size = 8;  // now in_proj (2 Di, D) = (64, 16) is the largest
  EXPECT_EQ(LargestParamBytes(c), uint64_t{64} * 16 * 4);
  c.hidden_size = c.vocab_size = c.expand = int64_t{1} << 31;
  EXPECT_EQ(LargestParamBytes(c), UINT64_MAX);
}

TEST(JobLimits, RefusedOverEachLimitAcceptedAtIt) {
  // D = 16, K = 2, V = 256: largest tensor (256, 16) f32 = 16384 bytes.
  const JobLimits at{.max_context = 512, .max_layers = 2, .max_hidden = 16,
                     .max_tensor_bytes = 16384};
  EXPECT_TRUE(ValidateJobSpec(Spec(16, 2, 256, 512), at).ok());
  ExpectLimit(ValidateJobSpec(Spec(16, 2, 256, 513), at), "--max-context");
  ExpectLimit(ValidateJobSpec(Spec(16, 3, 256, 512), at), "--max-layers");
  ExpectLimit(ValidateJobSpec(Spec(17, 2, 256, 512), at), "--max-hidden");
  ExpectLimit(ValidateJobSpec(Spec(16, 2, 257, 512), at), "--max-tensor-bytes");
  // The defaults admit what the rest of the suite trains.
  EXPECT_TRUE(ValidateJobSpec(Spec(256, 8, 50280, 1 << 20)).ok());
}

// --max-context bounds a step's tokens, context_length x batch_size: the trainer copies them
// all, so a huge batch_size ran the coordinator out of memory (and again at each restart).
TEST(JobLimits, BatchSizeCountsInTheTokensPerStep) {
  const JobLimits at{.max_context = 512};
  v1::JobSpec s = Spec(16, 2, 256, 128);
  s.set_batch_size(4);  // 512 tokens a step
  EXPECT_TRUE(ValidateJobSpec(s, at).ok());
  s.set_batch_size(5);
  ExpectLimit(ValidateJobSpec(s, at), "--max-context");
  s.set_batch_size(INT64_MAX);  // no overflow in the product
  ExpectLimit(ValidateJobSpec(s, at), "--max-context");
  s = Spec(16, 2, 256, 128);
  s.set_keep_checkpoints(int64_t{1} << 32);  // was cast to an int: 0
  EXPECT_EQ(ValidateJobSpec(s).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobLimits, ModelDirConfigIsChecked) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("adjsh-job-limits-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  MambaConfig c;
  c.hidden_size = 8;
  c.num_hidden_layers = 5;
  c.vocab_size = 256;
  c.time_step_rank = 1;
  std::ofstream(dir / "config.json") << ConfigToJson(c);
  std::ofstream(dir / "model.safetensors") << "";  // only its existence is checked at submit
  v1::JobSpec s;
  s.set_model_dir(dir.string());
  s.set_context_length(64);
  s.set_steps(1);
  const absl::Status over = ValidateJobSpec(s, JobLimits{.max_layers = 4});
  ExpectLimit(over, "--max-layers");
  EXPECT_NE(std::string(over.message()).find("model_dir"), std::string::npos) << over;
  EXPECT_TRUE(ValidateJobSpec(s, JobLimits{.max_layers = 5}).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace adjsh::coordinator
