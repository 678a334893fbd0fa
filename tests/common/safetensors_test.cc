// Safetensors: round trips, and every malformed input rejected as INVALID_ARGUMENT.
#include "common/safetensors.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;
using ::adjsh::testing::ScratchDir;
using ::adjsh::testing::StatusIs;

TensorMap SampleTensors() {
  TensorMap m;
  m["a.f32"] = HostTensor::From<float>(std::vector<float>{1, -2, 3.5f, 4, 5, 6}, {2, 3},
                                       DType::kF32);
  m["b.f64"] = HostTensor::From<double>(std::vector<double>{0.1, -1e300, 7}, {3}, DType::kF64);
  m["c.bf16"] = HostTensor::From<float>(std::vector<float>{1, 0.5f, -384}, {3, 1}, DType::kBF16);
  m["d.scalar"] = HostTensor::From<float>(std::vector<float>{2.75f}, {}, DType::kF32);
  m["e.empty"] = HostTensor::From<double>(std::vector<double>{}, {0, 5}, DType::kF64);
  m["f.last"] = HostTensor::From<float>(std::vector<float>{9, 8}, {2}, DType::kF32);
  return m;
}

void ExpectSameTensors(const TensorMap& a, const TensorMap& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << name;
    EXPECT_EQ(it->second.dtype, t.dtype) << name;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    EXPECT_EQ(it->second.data, t.data) << name;
  }
}

// A file from a header text and a data region.
std::string Raw(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

TEST(SafetensorsTest, RoundTripInMemory) {
  const TensorMap m = SampleTensors();
  const std::string bytes = SerializeSafetensors(m, {{"format", "pt"}});
  absl::StatusOr<TensorMap> back = ParseSafetensors(bytes, "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(m, *back);
  EXPECT_EQ(*(*back)["d.scalar"].To<float>(), std::vector<float>{2.75f});
  EXPECT_EQ(*(*back)["c.bf16"].To<float>(), (std::vector<float>{1, 0.5f, -384}));
}

TEST(SafetensorsTest, HeaderLayout) {
  const std::string bytes = SerializeSafetensors(SampleTensors(), {{"format", "pt"}});
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "data region must start 8-byte aligned";
  const std::string header = bytes.substr(8, header_len);
  nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["d.scalar"]["shape"], nlohmann::json::array());
  EXPECT_EQ(j["a.f32"]["dtype"], "F32");
  EXPECT_EQ(j["c.bf16"]["dtype"], "BF16");
  // Data laid out in name order, back to back.
  int64_t offset = 0;
  for (const auto& [name, t] : SampleTensors()) {
    EXPECT_EQ(j[name]["data_offsets"][0], offset) << name;
    offset += static_cast<int64_t>(t.data.size());
    EXPECT_EQ(j[name]["data_offsets"][1], offset) << name;
  }
  EXPECT_EQ(bytes.size(), 8 + header_len + offset);
  // An empty map is still a valid file.
  absl::StatusOr<TensorMap> empty = ParseSafetensors(SerializeSafetensors({}), "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST(SafetensorsTest, FileRoundTripIsAtomic) {
  const std::string dir = ScratchDir("st_roundtrip");
  const std::string path = dir + "/x.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors()).ok());
  // Overwrite with different content: readers see only the new file, no temporaries remain.
  TensorMap small;
  small["only"] = HostTensor::From<double>(std::vector<double>{1, 2}, {2}, DType::kF64);
  ASSERT_TRUE(WriteSafetensors(path, small).ok());
  absl::StatusOr<TensorMap> back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameTensors(small, *back);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "x.safetensors");
  }
  EXPECT_EQ(files, 1);
}

TEST(SafetensorsTest, FileErrors) {
  const std::string dir = ScratchDir("st_errors");
  EXPECT_TRUE(StatusIs(ReadSafetensors(dir + "/missing.safetensors"), absl::StatusCode::kNotFound,
                       "missing.safetensors"));
  EXPECT_FALSE(ReadSafetensors(dir).ok());  // a directory
  EXPECT_FALSE(WriteSafetensors(dir + "/no/such/dir/x.safetensors", SampleTensors()).ok());

  TensorMap reserved;
  reserved["__metadata__"] = HostTensor::From<float>(std::vector<float>{1}, {}, DType::kF32);
  EXPECT_TRUE(IsInvalid(WriteSafetensors(dir + "/r.safetensors", reserved), "reserved"));
  TensorMap bad;
  bad["w"] = HostTensor::From<float>(std::vector<float>{1, 2}, {2}, DType::kF32);
  bad["w"].shape = {3};
  EXPECT_TRUE(IsInvalid(WriteSafetensors(dir + "/b.safetensors", bad), "\"w\"", "(3)"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

struct CorruptCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> message_parts;
};

TEST(SafetensorsTest, CorruptInputsAreInvalidArgument) {
  const std::string f32x2(8, '\0');
  const std::vector<CorruptCase> cases = {
      {"empty file", "", {"shorter than the 8-byte"}},
      {"7 bytes", std::string(7, '\0'), {"shorter than the 8-byte"}},
      {"header length past end", Raw("{}").substr(0, 9), {"header length 2", "runs past"}},
      {"huge header length", std::string(8, '\xff') + "{}", {"runs past"}},
      {"not json", Raw("{\"a\": "), {"not valid JSON"}},
      {"binary header", Raw(std::string("\x80\x81\x82\x83", 4)), {"not valid JSON"}},
      {"array header", Raw("[1, 2]"), {"not a JSON object"}},
      {"entry not object", Raw(R"({"w": 5})"), {"\"w\"", "not a JSON object"}},
      {"missing dtype", Raw(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "missing \"dtype\""}},
      {"missing shape", Raw(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "missing \"shape\""}},
      {"missing offsets", Raw(R"({"w": {"dtype": "F32", "shape": [2]}})", f32x2),
       {"\"w\"", "missing \"data_offsets\""}},
      {"dtype not string", Raw(R"({"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})",
                               f32x2),
       {"\"w\"", "\"dtype\" is not a string"}},
      {"unknown dtype",
       Raw(R"({"w": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "unsupported dtype", "F8_E4M3"}},
      {"shape not array",
       Raw(R"({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "\"shape\" is not an array"}},
      {"negative dim",
       Raw(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "negative"}},
      {"fractional dim",
       Raw(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "non-integer"}},
      {"overflowing shape",
       Raw(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})",
           f32x2),
       {"\"w\"", "too large"}},
      {"offsets arity",
       Raw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", f32x2),
       {"\"w\"", "data_offsets"}},
      {"negative offset",
       Raw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", f32x2),
       {"\"w\"", "non-negative"}},
      {"begin after end",
       Raw(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", f32x2),
       {"\"w\"", "outside the data region"}},
      {"end past data",
       Raw(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", f32x2),
       {"\"w\"", "outside the data region of 8 bytes"}},
      {"size mismatch",
       Raw(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", f32x2),
       {"\"w\"", "span 8 bytes", "(3)", "need 12"}},
      {"overlap",
       Raw(R"({"v": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           f32x2),
       {"overlap"}},
      {"metadata not object", Raw(R"({"__metadata__": [1]})"), {"__metadata__"}},
  };
  for (const CorruptCase& c : cases) {
    absl::StatusOr<TensorMap> r = ParseSafetensors(c.bytes, "bad.safetensors");
    ::testing::AssertionResult ok = IsInvalid(r, "bad.safetensors");
    for (const std::string& part : c.message_parts) {
      if (ok) ok = IsInvalid(r, part);
    }
    EXPECT_TRUE(ok) << c.label;
  }
}

TEST(SafetensorsTest, EveryTruncationIsRejected) {
  const std::string bytes = SerializeSafetensors(SampleTensors(), {{"format", "pt"}});
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::StatusOr<TensorMap> r = ParseSafetensors(bytes.substr(0, len), "cut");
    ASSERT_TRUE(IsInvalid(r, "cut")) << "length " << len;
  }
}

TEST(SafetensorsTest, ByteMutationsNeverCrash) {
  // Every byte replaced by a few values: any outcome is fine except a crash, and a success must
  // still describe tensors that fit their data.
  const std::string bytes = SerializeSafetensors(SampleTensors());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (char v : {'\0', '"', '9', '-', '[', '\xff'}) {
      std::string mutated = bytes;
      mutated[i] = v;
      absl::StatusOr<TensorMap> r = ParseSafetensors(mutated, "mut");
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
        continue;
      }
      for (const auto& [name, t] : *r) EXPECT_TRUE(ValidateTensor(t).ok()) << name;
    }
  }
}

}  // namespace
}  // namespace adjsh
