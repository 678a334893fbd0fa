// TokenData (common/token_data.h): a mapped token file reads the same ids as a whole read, in
// any slice; bad files are refused as a whole read refuses them; reading a file slice by slice
// leaves resident memory flat.
#include "common/token_data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/proc_stats.h"
#include "common/tokens.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::ScratchDir;

std::vector<uint32_t> RandomIds(size_t n, uint32_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> ids(n);
  for (uint32_t& id : ids) id = static_cast<uint32_t>(rng() % below);
  return ids;
}

TEST(TokenDataTest, MappedSlicesEqualTheWholeRead) {
  const std::string dir = ScratchDir("token_data_slices");
  for (const char* ext : {".u16", ".u32"}) {
    const std::string path = dir + "/t" + ext;
    const std::vector<uint32_t> ids = RandomIds(100003, ext[2] == '1' ? 65536 : 1u << 31, 4);
    ASSERT_TRUE(WriteTokenFile(path, ids).ok());
    absl::StatusOr<TokenData> data = TokenData::Map(path);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(data->mapped());
    ASSERT_EQ(data->size(), static_cast<int64_t>(ids.size()));
    for (int64_t start : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{99000}}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1003}}) {
        const std::vector<uint32_t> got = data->Slice(start, n);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), ids.begin() + start)) << ext << start;
      }
    }
    // Read again after the pages were dropped: the same ids.
    EXPECT_EQ(data->Slice(0, data->size()), ids) << ext;
    TokenData moved = std::move(*data);
    EXPECT_EQ(moved.Slice(5, 3), std::vector<uint32_t>(ids.begin() + 5, ids.begin() + 8));
  }
}

TEST(TokenDataTest, BadFilesAreRefusedByName) {
  const std::string dir = ScratchDir("token_data_bad");
  std::FILE* f = std::fopen((dir + "/odd.u32").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("abcdef", f);  // 6 bytes: not a whole number of u32 ids
  std::fclose(f);
  absl::StatusOr<TokenData> odd = TokenData::Map(dir + "/odd.u32");
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(odd.status().message()).find("odd.u32"), std::string::npos);
  EXPECT_EQ(TokenData::Map(dir + "/missing.u16").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenData::Map(dir + "/odd.txt").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenData::Map(dir).status().code(), absl::StatusCode::kInvalidArgument);  // ext
  ASSERT_EQ(::mkfifo((dir + "/fifo.u16").c_str(), 0600), 0);
  EXPECT_EQ(TokenData::Map(dir + "/fifo.u16", {.regular_only = true}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TokenData::Map(dir + "/odd.u32", {.max_bytes = 4}).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(WriteTokenFile(dir + "/empty.u16", {}).ok());
  absl::StatusOr<TokenData> empty = TokenData::Map(dir + "/empty.u16");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
}

TEST(TokenDataTest, VocabularyCheckNamesThePosition) {
  const std::string dir = ScratchDir("token_data_vocab");
  std::vector<uint32_t> ids(3000000, 7);
  ids[2500001] = 300;
  ASSERT_TRUE(WriteTokenFile(dir + "/t.u16", ids).ok());
  absl::StatusOr<TokenData> data = TokenData::Map(dir + "/t.u16");
  ASSERT_TRUE(data.ok());
  EXPECT_TRUE(data->CheckInVocab(301).ok());
  const absl::Status s = data->CheckInVocab(300);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("position 2500001"), std::string::npos) << s;
  EXPECT_EQ(TokenData::FromIds(ids).CheckInVocab(300).code(), absl::StatusCode::kInvalidArgument);
}

// 256 MiB of ids read through in 1 MiB slices, then checked against a vocabulary: the resident
// set grows by well under the file's size (each slice's pages are dropped once copied; what is
// left is the slice buffer and allocator slack).
TEST(TokenDataTest, ReadingTheWholeFileKeepsResidentMemoryFlat) {
  const std::string dir = ScratchDir("token_data_rss");
  const std::string path = dir + "/big.u32";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::vector<uint32_t> block(1 << 20);
    for (int b = 0; b < 64; ++b) {
      for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint32_t>((b + i) % 1000);
      ASSERT_EQ(std::fwrite(block.data(), 4, block.size(), f), block.size());
    }
    std::fclose(f);
  }
  absl::StatusOr<TokenData> data = TokenData::Map(path);
  ASSERT_TRUE(data.ok());
  const int64_t before = ResidentBytes();
  std::vector<uint32_t> slice(1 << 18);
  uint64_t sum = 0;
  for (int64_t s = 0; s < data->size(); s += static_cast<int64_t>(slice.size())) {
    data->Copy(s, static_cast<int64_t>(slice.size()), slice.data());
    sum += slice[0];
  }
  EXPECT_TRUE(data->CheckInVocab(1000).ok());
  const int64_t grown = ResidentBytes() - before;
  EXPECT_GT(sum, 0u);
  EXPECT_LT(grown, 32 << 20) << "resident memory grew by " << grown << " bytes for a 256 MiB file";
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace adjsh
