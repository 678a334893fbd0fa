// Parameter table, named-tensor conversion, model directories and initialisation.
#include "common/model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;
using ::adjsh::testing::ScratchDir;
using ::adjsh::testing::StatusIs;

// D 8, K 2, N 4, W 3, Di 16, R 2, V 11.
MambaConfig TinyConfig() {
  MambaConfig c;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.state_size = 4;
  c.conv_kernel = 3;
  c.expand = 2;
  c.time_step_rank = 2;
  c.vocab_size = 11;
  return c;
}

template <typename T>
void ExpectSameParams(const ModelParams<T>& a, const ModelParams<T>& b) {
  EXPECT_EQ(a.embed, b.embed);
  EXPECT_EQ(a.norm_f, b.norm_f);
  EXPECT_EQ(a.lm_head, b.lm_head);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t k = 0; k < a.layers.size(); ++k) {
    for (const LayerParamSlot<T>& slot : LayerParamSlots<T>()) {
      EXPECT_EQ(a.layers[k].*slot.member, b.layers[k].*slot.member) << k << " " << slot.suffix;
    }
  }
}

TEST(ModelTest, SlotTableMatchesHfLayout) {
  const MambaConfig c = TinyConfig();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const LayerParamSlot<float>& slot : LayerParamSlots<float>()) {
    shapes[LayerParamName(1, slot.suffix)] = slot.shape(c);
  }
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"backbone.layers.1.norm.weight", {8}},
      {"backbone.layers.1.mixer.in_proj.weight", {32, 8}},
      {"backbone.layers.1.mixer.conv1d.weight", {16, 1, 3}},
      {"backbone.layers.1.mixer.conv1d.bias", {16}},
      {"backbone.layers.1.mixer.x_proj.weight", {10, 16}},
      {"backbone.layers.1.mixer.dt_proj.weight", {16, 2}},
      {"backbone.layers.1.mixer.dt_proj.bias", {16}},
      {"backbone.layers.1.mixer.A_log", {16, 4}},
      {"backbone.layers.1.mixer.D", {16}},
      {"backbone.layers.1.mixer.out_proj.weight", {8, 16}},
  };
  EXPECT_EQ(shapes, expected);
  EXPECT_EQ(LayerParamSlots<double>().size(), expected.size());
}

TEST(ModelTest, ZeroParamsAndAddInto) {
  const MambaConfig c = TinyConfig();
  ModelParams<double> p = ZeroParams<double>(c);
  EXPECT_EQ(p.embed.size(), 88u);
  EXPECT_EQ(p.norm_f.size(), 8u);
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].conv_w.size(), 48u);  // Di * W
  EXPECT_EQ(p.layers[0].x_proj.size(), 160u);
  LayerParams<double> a = ZeroLayer<double>(c);
  LayerParams<double> b = InitParams<double>(c, 1).layers[0];
  AddInto(a, b);
  AddInto(a, b);
  for (const LayerParamSlot<double>& slot : LayerParamSlots<double>()) {
    const std::vector<double>& x = a.*slot.member;
    const std::vector<double>& y = b.*slot.member;
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], 2 * y[i]) << slot.suffix;
  }
}

TEST(ModelTest, TensorsRoundTrip) {
  const MambaConfig c = TinyConfig();
  const ModelParams<double> p = InitParams<double>(c, 7);
  const TensorMap t = ParamsToTensors(p, DType::kF64);
  EXPECT_EQ(t.size(), 2u + 10u * 2u);
  EXPECT_EQ(t.at(kEmbedName).shape, (std::vector<int64_t>{11, 8}));
  absl::StatusOr<ModelParams<double>> back = ParamsFromTensors<double>(c, t);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameParams(p, *back);

  // Any float dtype converts: f32 tensors into double parameters and f64 into float.
  absl::StatusOr<ModelParams<double>> from_f32 =
      ParamsFromTensors<double>(c, ParamsToTensors(p, DType::kF32));
  ASSERT_TRUE(from_f32.ok()) << from_f32.status();
  EXPECT_EQ(from_f32->layers[1].dt_b[3], static_cast<double>(static_cast<float>(p.layers[1].dt_b[3])));
  absl::StatusOr<ModelParams<float>> from_bf16 = ParamsFromTensors<float>(c, ParamsToTensors(p, DType::kBF16));
  ASSERT_TRUE(from_bf16.ok()) << from_bf16.status();
  EXPECT_NEAR(from_bf16->embed[5], p.embed[5], std::fabs(p.embed[5]) / 128);
}

TEST(ModelTest, FromTensorsRejectsBadSets) {
  const MambaConfig c = TinyConfig();
  const TensorMap good = ParamsToTensors(InitParams<float>(c, 3), DType::kF32);
  const std::string conv = "backbone.layers.1.mixer.conv1d.weight";

  TensorMap missing = good;
  missing.erase(conv);
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, missing), "missing", conv, "(16, 1, 3)"));

  TensorMap extra = good;
  extra["backbone.layers.2.norm.weight"] = good.at("backbone.layers.1.norm.weight");
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, extra), "unexpected",
                        "backbone.layers.2.norm.weight"));

  TensorMap wrong_shape = good;
  wrong_shape[conv].shape = {16, 3};  // same bytes, HF's 3-d shape dropped
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, wrong_shape), conv, "(16, 3)", "(16, 1, 3)"));

  TensorMap nan = good;
  std::vector<float> v = *nan.at(conv).To<float>();
  v[5] = std::numeric_limits<float>::quiet_NaN();
  nan[conv] = HostTensor::From<float>(v, {16, 1, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, nan), conv, "non-finite", "index 5"));
  v[5] = std::numeric_limits<float>::infinity();
  nan[conv] = HostTensor::From<float>(v, {16, 1, 3}, DType::kF32);
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, nan), conv, "non-finite"));

  // f64 values beyond float range become infinite in float: also rejected.
  TensorMap huge = good;
  huge[kNormFName] = HostTensor::From<double>(std::vector<double>(8, 1e300), {8}, DType::kF64);
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, huge), kNormFName, "non-finite"));
  EXPECT_TRUE(ParamsFromTensors<double>(c, huge).ok());

  TensorMap ints = good;
  ints[kNormFName].dtype = DType::kI32;
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, ints), kNormFName, "I32"));

  MambaConfig bad_config = c;
  bad_config.conv_kernel = 0;
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(bad_config, good), "conv_kernel"));
}

TEST(ModelTest, TiedLmHeadIsIgnoredOnlyWithTheEmbeddingShape) {
  const MambaConfig c = TinyConfig();
  TensorMap t = ParamsToTensors(InitParams<float>(c, 3), DType::kF32);
  t["lm_head.weight"] = t.at(kEmbedName);
  EXPECT_TRUE(ParamsFromTensors<float>(c, t).ok());
  t["lm_head.weight"] = HostTensor::From<float>(std::vector<float>(8), {1, 8}, DType::kF32);
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, t), "lm_head.weight", "(1, 8)", "(11, 8)"));
}

// An untied head (tie_word_embeddings false) is a parameter of its own: lm_head.weight, last in
// HF order, required with the embedding's shape, initialised from its own stream, kept through
// a save and a load, counted in the model's bytes.
TEST(ModelTest, UntiedLmHeadIsAParameterOfItsOwn) {
  MambaConfig c = TinyConfig();
  c.tie_word_embeddings = false;
  ModelParams<float> p = InitParams<float>(c, 3);
  ASSERT_EQ(p.lm_head.size(), p.embed.size());
  EXPECT_NE(p.lm_head, p.embed);
  EXPECT_EQ(&p.head(), &p.lm_head);
  const std::vector<ParamRef<float>> refs = ListParams(p);
  EXPECT_EQ(refs.back().name, "lm_head.weight");
  EXPECT_EQ(refs.back().shape, (std::vector<int64_t>{11, 8}));
  MambaConfig tied = c;
  tied.tie_word_embeddings = true;
  EXPECT_EQ(ParamBytesF32(c) - ParamBytesF32(tied), 11u * 8u * 4u);
  EXPECT_TRUE(ZeroParams<float>(tied).lm_head.empty());
  const ModelParams<float> tp = InitParams<float>(tied, 3);
  EXPECT_EQ(&tp.head(), &tp.embed);
  EXPECT_EQ(tp.embed, p.embed);  // the embedding's stream does not depend on the head

  TensorMap t = ParamsToTensors(p, DType::kF32);
  ASSERT_TRUE(t.contains("lm_head.weight"));
  absl::StatusOr<ModelParams<float>> back = ParamsFromTensors<float>(c, t);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameParams(p, *back);
  t.erase("lm_head.weight");
  EXPECT_TRUE(IsInvalid(ParamsFromTensors<float>(c, t), "missing tensor \"lm_head.weight\""));

  const std::string dir = ScratchDir("untied_rt") + "/ckpt";
  ASSERT_TRUE(SaveModelDir(dir, p, DType::kF32).ok());
  absl::StatusOr<ModelParams<float>> loaded = LoadModelDir<float>(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->config.tie_word_embeddings);
  ExpectSameParams(p, *loaded);
}

TEST(ModelTest, SaveLoadRoundTrip) {
  const MambaConfig c = TinyConfig();
  const std::string dir = ScratchDir("model_rt") + "/nested/ckpt";
  const ModelParams<double> p = InitParams<double>(c, 11);
  ASSERT_TRUE(SaveModelDir(dir, p, DType::kF64).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.json"));
  absl::StatusOr<ModelParams<double>> back = LoadModelDir<double>(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameParams(p, *back);
  EXPECT_EQ(back->config.time_step_rank, 2);
  EXPECT_EQ(back->config.conv_kernel, 3);

  // transformers needs {"format": "pt"} in the safetensors metadata.
  std::string bytes = *ReadFileToString(dir + "/model.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(nlohmann::json::parse(bytes.substr(8, n))["__metadata__"]["format"], "pt");

  // f32 on disk, loaded as float: exact.
  const ModelParams<float> pf = InitParams<float>(c, 11);
  ASSERT_TRUE(SaveModelDir(dir, pf, DType::kF32).ok());
  absl::StatusOr<ModelParams<float>> backf = LoadModelDir<float>(dir);
  ASSERT_TRUE(backf.ok()) << backf.status();
  ExpectSameParams(pf, *backf);

  EXPECT_TRUE(IsInvalid(SaveModelDir(dir, pf, DType::kI32), "I32"));
}

TEST(ModelTest, LoadErrors) {
  const std::string root = ScratchDir("model_err");
  EXPECT_TRUE(StatusIs(LoadModelDir<float>(root + "/nope"), absl::StatusCode::kNotFound, "nope"));
  EXPECT_TRUE(StatusIs(LoadModelDir<float>(root), absl::StatusCode::kNotFound, "config.json"));
  ASSERT_TRUE(WriteFileAtomic(root + "/config.json", ConfigToJson(TinyConfig())).ok());
  EXPECT_TRUE(
      StatusIs(LoadModelDir<float>(root), absl::StatusCode::kNotFound, "model.safetensors"));
  ASSERT_TRUE(WriteFileAtomic(root + "/model.safetensors", "garbage").ok());
  EXPECT_TRUE(IsInvalid(LoadModelDir<float>(root), "model.safetensors"));
  // Tensors for a different config: the error names the directory and the tensor.
  MambaConfig other = TinyConfig();
  other.state_size = 5;
  ASSERT_TRUE(WriteSafetensors(root + "/model.safetensors",
                               ParamsToTensors(InitParams<float>(other, 1), DType::kF32))
                  .ok());
  EXPECT_TRUE(IsInvalid(LoadModelDir<float>(root), root, "x_proj", "(12, 16)", "(10, 16)"));
}

TEST(ModelTest, LoadsShardedCheckpoint) {
  // Larger HF checkpoints split tensors over files listed in model.safetensors.index.json.
  const MambaConfig c = TinyConfig();
  const std::string dir = ScratchDir("model_sharded");
  const ModelParams<float> p = InitParams<float>(c, 5);
  TensorMap all = ParamsToTensors(p, DType::kF32);
  TensorMap first, second;
  nlohmann::json index;
  int i = 0;
  for (auto& [name, t] : all) {
    const bool one = (i++ % 2 == 0);
    (one ? first : second)[name] = t;
    index["weight_map"][name] = one ? "model-00001-of-00002.safetensors"
                                    : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", ConfigToJson(c)).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.safetensors.index.json", index.dump()).ok());
  absl::StatusOr<ModelParams<float>> back = LoadModelDir<float>(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameParams(p, *back);

  index["weight_map"][kEmbedName] = "../escape.safetensors";
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.safetensors.index.json", index.dump()).ok());
  EXPECT_TRUE(IsInvalid(LoadModelDir<float>(dir), "plain file name"));
}

TEST(ModelTest, InitIsDeterministicAndSeedDependent) {
  const MambaConfig c = TinyConfig();
  const ModelParams<double> a = InitParams<double>(c, 42);
  ExpectSameParams(a, InitParams<double>(c, 42));
  const ModelParams<double> b = InitParams<double>(c, 43);
  EXPECT_NE(a.embed, b.embed);
  EXPECT_NE(a.layers[0].in_proj, b.layers[0].in_proj);
  EXPECT_NE(a.layers[1].dt_b, b.layers[1].dt_b);
  EXPECT_NE(a.layers[0].in_proj, a.layers[1].in_proj) << "layers draw different streams";
  // Adding layers leaves existing ones unchanged (per-tensor streams).
  MambaConfig deeper = c;
  deeper.num_hidden_layers = 3;
  const ModelParams<double> d = InitParams<double>(deeper, 42);
  EXPECT_EQ(d.layers[1].x_proj, a.layers[1].x_proj);
  // float parameters are the double ones rounded.
  const ModelParams<float> f = InitParams<float>(c, 42);
  for (size_t i = 0; i < f.embed.size(); ++i) EXPECT_EQ(f.embed[i], static_cast<float>(a.embed[i]));
}

TEST(ModelTest, InitFollowsMamba) {
  MambaConfig c = TinyConfig();
  c.hidden_size = 64;
  c.vocab_size = 1000;
  c.num_hidden_layers = 4;
  const ModelParams<double> p = InitParams<double>(c, 1);
  auto stddev = [](const std::vector<double>& v) {
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double m = s / v.size();
    return std::sqrt(s2 / v.size() - m * m);
  };
  EXPECT_NEAR(stddev(p.embed), 0.02, 0.001);                      // 64000 samples
  EXPECT_NEAR(stddev(p.layers[0].in_proj), 0.02, 0.001);          // 16384 samples
  EXPECT_NEAR(stddev(p.layers[0].out_proj), 0.01, 0.0007);        // 0.02 / sqrt(4)
  const LayerParams<double>& l = p.layers[2];
  const double conv_bound = 1 / std::sqrt(3.0);
  for (double x : l.conv_w) EXPECT_LE(std::fabs(x), conv_bound);
  for (double x : l.conv_b) EXPECT_LE(std::fabs(x), conv_bound);
  for (double x : l.dt_w) EXPECT_LE(std::fabs(x), 1 / std::sqrt(2.0));
  for (double b : l.dt_b) {
    const double dt = std::log1p(std::exp(b));  // softplus
    EXPECT_GE(dt, 1e-3 * (1 - 1e-9));
    EXPECT_LE(dt, 1e-1 * (1 + 1e-9));
  }
  for (int64_t i = 0; i < c.inner(); ++i) {
    for (int64_t n = 0; n < c.state_size; ++n) {
      EXPECT_DOUBLE_EQ(l.A_log[i * c.state_size + n], std::log(n + 1.0));
    }
  }
  for (double x : l.Dskip) EXPECT_EQ(x, 1.0);
  for (double x : l.norm) EXPECT_EQ(x, 1.0);
  for (double x : p.norm_f) EXPECT_EQ(x, 1.0);
}

}  // namespace
}  // namespace adjsh
