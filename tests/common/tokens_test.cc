// Token files (.u32 / .u16) and the vocabulary check.
#include "common/tokens.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/token_data.h"
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

// A device never ends (/dev/zero was read until memory ran out): refused at once by name, by a
// whole read and by a mapping alike. A pipe, as `<(cmd)` gives one, is still read to its end.
TEST(TokensTest, DevicesAreRefusedPipesAreRead) {
  const std::string dir = ScratchDir("tokens_dev");
  std::filesystem::create_symlink("/dev/zero", dir + "/zero.u32");
  EXPECT_TRUE(StatusIs(ReadTokenFile(dir + "/zero.u32"), absl::StatusCode::kFailedPrecondition,
                       "zero.u32", "device"));
  EXPECT_TRUE(StatusIs(TokenData::Map(dir + "/zero.u32"), absl::StatusCode::kFailedPrecondition,
                       "zero.u32", "device"));
  EXPECT_TRUE(StatusIs(ReadTextAsBytes(std::vector<std::string>{dir + "/zero.u32"}),
                       absl::StatusCode::kFailedPrecondition, "device"));

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string ids("\x07\x00\x00\x00\x09\x00\x00\x00", 8);
  ASSERT_EQ(::write(fds[1], ids.data(), ids.size()), static_cast<ssize_t>(ids.size()));
  ::close(fds[1]);  // the writer is done: the read ends there
  std::filesystem::create_symlink("/proc/self/fd/" + std::to_string(fds[0]), dir + "/pipe.u32");
  absl::StatusOr<std::vector<uint32_t>> got = ReadTokenFile(dir + "/pipe.u32");
  ::close(fds[0]);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<uint32_t>{7, 9}));
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
