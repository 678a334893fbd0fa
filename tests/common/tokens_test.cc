// Token files (.u32 / .u16) and the vocabulary check.
#include "common/tokens.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;
using ::adjsh::testing::ScratchDir;
using ::adjsh::testing::StatusIs;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

TEST(TokensTest, RoundTripU32AndU16) {
  const std::string dir = ScratchDir("tokens_rt");
  const std::vector<uint32_t> big = {0, 1, 50279, 65535, 65536, 0xffffffffu};
  ASSERT_TRUE(WriteTokenFile(dir + "/a.u32", big).ok());
  EXPECT_EQ(std::filesystem::file_size(dir + "/a.u32"), 4 * big.size());
  EXPECT_EQ(*ReadTokenFile(dir + "/a.u32"), big);

  const std::vector<uint32_t> small = {0, 1, 258, 50279, 65535};
  ASSERT_TRUE(WriteTokenFile(dir + "/a.u16", small).ok());
  EXPECT_EQ(std::filesystem::file_size(dir + "/a.u16"), 2 * small.size());
  EXPECT_EQ(*ReadTokenFile(dir + "/a.u16"), small);

  ASSERT_TRUE(WriteTokenFile(dir + "/empty.u32", {}).ok());
  EXPECT_TRUE(ReadTokenFile(dir + "/empty.u32")->empty());
}

TEST(TokensTest, LittleEndianOnDisk) {
  const std::string dir = ScratchDir("tokens_le");
  WriteBytes(dir + "/t.u16", std::string("\x02\x01\xff\x00", 4));
  EXPECT_EQ(*ReadTokenFile(dir + "/t.u16"), (std::vector<uint32_t>{0x0102, 0x00ff}));
  WriteBytes(dir + "/t.u32", std::string("\x04\x03\x02\x01", 4));
  EXPECT_EQ(*ReadTokenFile(dir + "/t.u32"), (std::vector<uint32_t>{0x01020304}));
}

TEST(TokensTest, Errors) {
  const std::string dir = ScratchDir("tokens_err");
  WriteBytes(dir + "/odd.u16", "abc");
  EXPECT_TRUE(IsInvalid(ReadTokenFile(dir + "/odd.u16"), "odd.u16", "not a multiple of 2"));
  WriteBytes(dir + "/odd.u32", "abcdef");
  EXPECT_TRUE(IsInvalid(ReadTokenFile(dir + "/odd.u32"), "not a multiple of 4"));
  WriteBytes(dir + "/t.bin", "abcd");
  EXPECT_TRUE(IsInvalid(ReadTokenFile(dir + "/t.bin"), "t.bin", "extension"));
  EXPECT_TRUE(IsInvalid(WriteTokenFile(dir + "/t.txt", std::vector<uint32_t>{1}), "extension"));
  EXPECT_TRUE(StatusIs(ReadTokenFile(dir + "/missing.u32"), absl::StatusCode::kNotFound,
                       "missing.u32"));
  // A u16 file cannot hold ids above 65535; nothing is written.
  EXPECT_TRUE(IsInvalid(WriteTokenFile(dir + "/big.u16", std::vector<uint32_t>{1, 70000}),
                        "70000", "position 1"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/big.u16"));
}

TEST(TokensTest, CheckTokensInVocab) {
  const std::vector<uint32_t> tokens = {0, 5, 9, 10, 3};
  EXPECT_TRUE(CheckTokensInVocab(tokens, 11).ok());
  EXPECT_TRUE(IsInvalid(CheckTokensInVocab(tokens, 10), "position 3", "id 10", "vocab_size 10"));
  EXPECT_TRUE(CheckTokensInVocab({}, 1).ok());
  EXPECT_TRUE(IsInvalid(CheckTokensInVocab(std::vector<uint32_t>{0}, 0), "position 0"));
}

}  // namespace
}  // namespace adjsh
