// coordinator/job_spec.h: the JobSpec fields of real training runs (batch, data order, held-out
// data, evaluation, resume, checkpoints kept, save dtype, document boundaries, prepared data)
// are checked by ValidateJobSpec naming the field, and JobTrainOptions maps them with adjsh
// train's defaults for the unset ones; the truncated window is refused for jobs, allowed in
// process; NoJobLimits admits what a coordinator's default limits refuse; a Mamba-2 model trains
// in adjsh train only (in-process or on its local workers), never as a coordinator's job.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "common/mamba2_config.h"
#include "coordinator/job_spec.h"
#include "common/mamba2_model.h"
#include "gtest/gtest.h"

namespace adjsh::coordinator {
namespace {

v1::JobSpec Spec() {
  v1::JobSpec s;
  s.mutable_init()->set_hidden_size(16);
  s.mutable_init()->set_layers(2);
  s.mutable_init()->set_vocab_size(256);
  s.set_context_length(512);
  s.set_steps(1);
  return s;
}

void ExpectField(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s;
}

// More spans than chunks, or a span shorter than the conv halo, was found only when the job
// ran (FAILED after queueing); now at submit, with the span plan's reason.
TEST(JobSpecFields, SpansTheChunksCannotHoldAreRefusedAtSubmit) {
  v1::JobSpec s = Spec();
  s.set_chunk(64), s.set_spans(8);  // 512 tokens in 8 chunks: one span each
  EXPECT_TRUE(ValidateJobSpec(s).ok());
  s.set_spans(9);
  ExpectField(ValidateJobSpec(s), "spans 9: a span is a run of whole chunks");
  s = Spec(), s.set_spans(3);  // the default chunk, 256: 2 chunks
  ExpectField(ValidateJobSpec(s), "T=512 in chunks of 256 gives 2");
  s = Spec(), s.set_chunk(2), s.set_spans(256);
  // 256 spans of one 2-token chunk: the first after span 0 is shorter than the conv halo.
  ExpectField(ValidateJobSpec(s), "spans 256: span 1 would hold fewer than W - 1 = 3 tokens");
  s.set_spans(128);  // 4 tokens a span
  EXPECT_TRUE(ValidateJobSpec(s).ok());
}

TEST(JobSpecFields, BadValuesAreRefusedNamingTheField) {
  ASSERT_TRUE(ValidateJobSpec(Spec()).ok());
  v1::JobSpec s = Spec();
  s.set_batch_size(-1);
  ExpectField(ValidateJobSpec(s), "batch_size");
  s = Spec(), s.set_data_order("random");
  ExpectField(ValidateJobSpec(s), "data_order");
  s = Spec(), s.set_resume("sometimes");
  ExpectField(ValidateJobSpec(s), "resume");
  s = Spec(), s.set_save_dtype("f16");
  ExpectField(ValidateJobSpec(s), "save_dtype");
  s = Spec(), s.set_doc_boundaries("split");
  ExpectField(ValidateJobSpec(s), "doc_boundaries");
  s = Spec(), s.set_doc_boundaries("reset");  // needs a document index
  ExpectField(ValidateJobSpec(s), "doc_boundaries");
  s = Spec(), s.set_eval_every(5);  // needs held-out data
  ExpectField(ValidateJobSpec(s), "eval_every");
  s = Spec(), s.set_val_token_file("/nowhere/val.txt");
  ExpectField(ValidateJobSpec(s), "val_token_file");
  s = Spec(), s.set_val_token_file("/nowhere/val.u16");
  EXPECT_EQ(ValidateJobSpec(s).code(), absl::StatusCode::kNotFound);
  s = Spec(), s.set_prepared_data("/nowhere/docs.json");
  EXPECT_EQ(ValidateJobSpec(s).code(), absl::StatusCode::kNotFound);
  s = Spec(), s.set_keep_checkpoints(-2);
  ExpectField(ValidateJobSpec(s), "keep_checkpoints");
}

TEST(JobSpecFields, WindowIsForInProcessRunsOnly) {
  v1::JobSpec s = Spec();
  s.set_window(64);
  EXPECT_EQ(ValidateJobSpec(s).code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(ValidateJobSpec(s, {}, JobRunner::kInProcess).ok());
  EXPECT_EQ(JobTrainOptions(s, 1, "").grad.window, 64);
}

TEST(JobSpecFields, TrainOptionsTakeTheFieldsAndTrainsDefaults) {
  train::TrainOptions d = JobTrainOptions(Spec(), 1, "ck");
  EXPECT_EQ(d.batch_size, 1);
  EXPECT_EQ(d.order, train::DataOrder::kShuffled);
  EXPECT_EQ(d.data_seed, 0u);
  EXPECT_EQ(d.resume, train::ResumeMode::kAuto);
  EXPECT_EQ(d.keep_checkpoints, 2);
  EXPECT_EQ(d.save_dtype, DType::kF32);
  EXPECT_FALSE(d.reset_at_documents);
  EXPECT_EQ(d.eval_every, 0);
  v1::JobSpec s = Spec();
  s.set_batch_size(3), s.set_data_order("sequential"), s.set_seed(9), s.set_resume("must");
  s.set_keep_checkpoints(5), s.set_save_dtype("bf16"), s.set_doc_boundaries("reset");
  s.set_eval_every(7), s.set_eval_tokens(100);
  const train::TrainOptions o = JobTrainOptions(s, 1, "ck");
  EXPECT_EQ(o.batch_size, 3);
  EXPECT_EQ(o.order, train::DataOrder::kSequential);
  EXPECT_EQ(o.data_seed, 9u);
  EXPECT_EQ(o.resume, train::ResumeMode::kMust);
  EXPECT_EQ(o.keep_checkpoints, 5);
  EXPECT_EQ(o.save_dtype, DType::kBF16);
  EXPECT_TRUE(o.reset_at_documents);
  EXPECT_EQ(o.eval_every, 7);
  EXPECT_EQ(o.eval_tokens, 100);
}

TEST(JobSpecFields, NoJobLimitsAdmitsWhatTheDefaultsRefuse) {
  v1::JobSpec s = Spec();
  s.set_context_length(int64_t{1} << 25);  // over the default --max-context of 2^24
  EXPECT_EQ(ValidateJobSpec(s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateJobSpec(s, NoJobLimits(), JobRunner::kInProcess).ok());
}

// A prepared corpus without a held-out split (prepared with --val-fraction 0) and eval_every
// over 0, with no val_token_file: refused at submit naming eval_every, not FAILED when the job
// runs (adjsh submit defaults eval_every to 0 for such data only when it can read the manifest).
TEST(JobSpecFields, EvaluationWithoutAHeldOutSplitIsRefusedAtSubmit) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("noval_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream tokens(dir / "d.train.u16", std::ios::binary);
    for (uint16_t t = 0; t < 600; ++t) tokens.put(static_cast<char>(t % 200)).put(0);
    std::ofstream docs(dir / "d.train.docs", std::ios::binary);
    docs.write(std::string(8, '\0').data(), 8);  // one document, at 0
    std::ofstream(dir / "d.json")
        << R"({"format": "adjsh-tokens-1", "vocab_size": 256, "eos_id": 255, "val": null,
              "train": {"file": "d.train.u16", "docs": "d.train.docs", "tokens": 600,
                        "documents": 1}})";
  }
  v1::JobSpec s = Spec();
  s.set_prepared_data((dir / "d.json").string());
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  s.set_eval_every(10);
  ExpectField(ValidateJobSpec(s), "eval_every: needs held-out data: ");
  ExpectField(ValidateJobSpec(s), "has no held-out split");
  s.set_val_token_file((dir / "d.train.u16").string());  // held-out data of its own: fine
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  std::filesystem::remove_all(dir);
}

// A Mamba-2 model_dir is a job for every runner, under the same limits as a Mamba-1 model's,
// counted on its own tensors: in_proj (Dp, D) with Dp = 2 Di + 2 G N + H.
TEST(JobSpecFields, AMamba2ModelIsAJobUnderItsOwnLimits) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("mamba2_spec_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Mamba2Config c;
  c.hidden_size = 16, c.num_hidden_layers = 2, c.state_size = 8, c.head_dim = 8;
  c.num_heads = 4, c.n_groups = 1, c.vocab_size = 256;
  std::ofstream(dir / "config.json") << Mamba2ConfigToJson(c);
  std::ofstream(dir / "model.safetensors") << "not read by the checks";
  v1::JobSpec s = Spec();
  s.set_model_dir(dir.string());
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << ValidateJobSpec(s);
  EXPECT_TRUE(ValidateJobSpec(s, NoJobLimits(), JobRunner::kLocalWorkers).ok());
  EXPECT_TRUE(ValidateJobSpec(s, NoJobLimits(), JobRunner::kInProcess).ok());
  EXPECT_TRUE(JobIsMamba2(s));
  // The largest tensor is the embedding (256 x 16 f32 = 16384 B); in_proj is (84, 16).
  EXPECT_EQ(LargestParamBytes(c), uint64_t{256 * 16 * 4});
  JobLimits limits;
  limits.max_tensor_bytes = 256 * 16 * 4 - 1;
  const absl::Status big = ValidateJobSpec(s, limits);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_NE(std::string(big.message()).find("--max-tensor-bytes"), std::string::npos) << big;
  limits = JobLimits();
  limits.max_layers = 1;
  EXPECT_NE(std::string(ValidateJobSpec(s, limits).message()).find("layers (K)"),
            std::string::npos);
  limits = JobLimits();
  limits.max_model_bytes = Mamba2ParamBytesF32(c) - 1;
  EXPECT_NE(std::string(ValidateJobSpec(s, limits).message()).find("--max-model-bytes"),
            std::string::npos);
  c.vocab_size = 4, c.num_heads = 8, c.head_dim = 4, c.state_size = 64;  // in_proj (200, 16)
  EXPECT_EQ(LargestParamBytes(c), uint64_t{200 * 16 * 4});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace adjsh::coordinator
