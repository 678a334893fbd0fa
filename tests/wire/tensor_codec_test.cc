// proto/tensor_codec: round trips of every shape kind at many piece sizes, through the protobuf
// wire format, and every malformed stream a peer can send, each with its status code.
#include "proto/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;
using ::adjsh::testing::StatusIs;

// Values with awkward bit patterns (NaN, infinities, signed zero, subnormals) among random ones,
// so that a byte-exact round trip is really byte-exact.
std::vector<double> Values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(), -0.0, 1e-310, 65504.0};
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i < 6 ? specials[i] : normal(rng);
  return v;
}

HostTensor MakeTensor(DType dtype, std::vector<int64_t> shape, uint32_t seed = 1) {
  const std::vector<double> v = Values(ShapeNumel(shape), seed);
  return HostTensor::From<double>(v, std::move(shape), dtype);
}

// Raw-byte tensors for the dtypes HostTensor::From does not build.
HostTensor RawTensor(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.numel() * DTypeSize(dtype)));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(i * 37 + 11);
  return t;
}

// The chunks a valid sender produces: header first only, contiguous offsets, pieces within the
// size, last on the final chunk only.
void ExpectWellFormed(const std::vector<v1::TensorChunk>& chunks, const std::string& name,
                      const HostTensor& t, size_t piece) {
  const size_t bytes = t.data.size();
  const size_t expected_chunks = bytes == 0 ? 1 : (bytes + piece - 1) / piece;
  ASSERT_EQ(chunks.size(), expected_chunks);
  uint64_t offset = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const v1::TensorChunk& c = chunks[i];
    EXPECT_EQ(c.has_header(), i == 0) << "chunk " << i;
    EXPECT_EQ(c.offset(), offset) << "chunk " << i;
    EXPECT_LE(c.data().size(), piece) << "chunk " << i;
    EXPECT_EQ(c.last(), i + 1 == chunks.size()) << "chunk " << i;
    offset += c.data().size();
  }
  EXPECT_EQ(offset, bytes);
  const v1::TensorHeader& h = chunks[0].header();
  EXPECT_EQ(h.name(), name);
  EXPECT_EQ(h.dtype(), ToProtoDType(t.dtype));
  EXPECT_EQ(std::vector<int64_t>(h.shape().begin(), h.shape().end()), t.shape);
  EXPECT_EQ(h.total_bytes(), bytes);
}

void ExpectSameTensor(const HostTensor& got, const HostTensor& want) {
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_TRUE(got.data == want.data) << "bytes differ";
}

// Sends the chunks through the protobuf wire format, as gRPC would.
std::vector<v1::TensorChunk> OverTheWire(const std::vector<v1::TensorChunk>& chunks) {
  std::vector<v1::TensorChunk> out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const std::string bytes = chunks[i].SerializeAsString();
    EXPECT_TRUE(out[i].ParseFromString(bytes));
  }
  return out;
}

// A header chunk for hand-built malformed streams.
v1::TensorChunk HeaderChunk(const std::string& name, v1::DType dtype,
                            std::vector<int64_t> shape, uint64_t total_bytes) {
  v1::TensorChunk c;
  v1::TensorHeader* h = c.mutable_header();
  h->set_name(name);
  h->set_dtype(dtype);
  h->mutable_shape()->Add(shape.begin(), shape.end());
  h->set_total_bytes(total_bytes);
  return c;
}

v1::TensorChunk DataChunk(uint64_t offset, size_t n, bool last) {
  v1::TensorChunk c;
  c.set_offset(offset);
  c.set_data(std::string(n, '\x5a'));
  c.set_last(last);
  return c;
}

// Feeds chunks until the first error; returns it, or Finish's status.
absl::Status Feed(TensorAssembler& a, const std::vector<v1::TensorChunk>& chunks) {
  for (const v1::TensorChunk& c : chunks) {
    absl::StatusOr<std::optional<NamedTensor>> r = a.Add(c);
    if (!r.ok()) return r.status();
  }
  return a.Finish();
}

absl::Status FeedAll(const std::vector<v1::TensorChunk>& chunks, AssemblerLimits limits = {}) {
  TensorAssembler a(limits);
  return Feed(a, chunks);
}

// ---------------------------------------------------------------------------------------------
// Round trips

struct RoundTripCase {
  DType dtype;
  std::vector<int64_t> shape;
};

TEST(TensorCodec, RoundTripsEveryShapeAtEveryPieceSize) {
  const std::vector<RoundTripCase> cases = {
      {DType::kF32, {}},          {DType::kF64, {}},        {DType::kBF16, {}},
      {DType::kF32, {0}},         {DType::kF64, {3, 0, 2}}, {DType::kBF16, {0, 5}},
      {DType::kF32, {7}},         {DType::kF64, {3, 5}},    {DType::kBF16, {2, 3, 5}},
      {DType::kF32, {4, 1, 33}},  {DType::kF64, {1, 1, 1}}, {DType::kBF16, {129}},
  };
  const std::vector<size_t> pieces = {1, 2, 3, 5, 7, 13, 64, 1000, kDefaultPieceBytes};
  uint32_t seed = 0;
  for (const RoundTripCase& rc : cases) {
    const HostTensor t = MakeTensor(rc.dtype, rc.shape, ++seed);
    // Piece sizes around the tensor's own size too: exactly it, one less, one more.
    std::vector<size_t> sizes = pieces;
    if (!t.data.empty()) {
      sizes.push_back(t.data.size());
      sizes.push_back(t.data.size() + 1);
      if (t.data.size() > 1) sizes.push_back(t.data.size() - 1);
    }
    for (size_t piece : sizes) {
      SCOPED_TRACE(::testing::Message() << DTypeName(rc.dtype) << " " << ShapeString(rc.shape)
                                        << " piece " << piece);
      const std::vector<v1::TensorChunk> chunks = SplitTensor("w", t, piece);
      ExpectWellFormed(chunks, "w", t, piece);
      TensorAssembler a;
      std::optional<NamedTensor> got;
      for (size_t i = 0; i < chunks.size(); ++i) {
        absl::StatusOr<std::optional<NamedTensor>> r = a.Add(OverTheWire({chunks[i]})[0]);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->has_value(), i + 1 == chunks.size()) << "completed early or late";
        if (r->has_value()) got = std::move(*r);
      }
      ASSERT_TRUE(a.Finish().ok());
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->name, "w");
      ExpectSameTensor(got->tensor, t);
      EXPECT_EQ(a.tensors_completed(), 1);
      EXPECT_EQ(a.total_bytes(), t.data.size());
    }
  }
}

TEST(TensorCodec, RoundTripsValuesOfF32F64AndBF16) {
  const std::vector<double> v = Values(40, 7);
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16}) {
    const HostTensor t = HostTensor::From<double>(v, {5, 8}, dtype);
    absl::StatusOr<TensorMap> m = AssembleTensors(OverTheWire(SplitTensor("x", t, 11)));
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<std::vector<double>> got = m->at("x").To<double>();
    absl::StatusOr<std::vector<double>> want = t.To<double>();
    ASSERT_TRUE(got.ok() && want.ok());
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan((*want)[i])) {
        EXPECT_TRUE(std::isnan((*got)[i])) << i;
      } else {
        EXPECT_EQ((*got)[i], (*want)[i]) << i;
      }
    }
  }
}

TEST(TensorCodec, RoundTripsRawDTypes) {
  for (DType dtype : {DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    const HostTensor t = RawTensor(dtype, {3, 7});
    absl::StatusOr<TensorMap> m = AssembleTensors(SplitTensor("r", t, 5));
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectSameTensor(m->at("r"), t);
  }
}

TEST(TensorCodec, SeveralTensorsInOneStream) {
  TensorMap want;
  want["backbone.layers.0.mixer.A_log"] = MakeTensor(DType::kF32, {8, 4}, 1);
  want["du"] = MakeTensor(DType::kF64, {3, 16}, 2);
  want["empty"] = MakeTensor(DType::kBF16, {0, 16}, 3);
  want["loss"] = MakeTensor(DType::kF64, {}, 4);
  std::vector<v1::TensorChunk> stream;
  for (const auto& [name, t] : want) {
    for (v1::TensorChunk& c : SplitTensor(name, t, 10)) stream.push_back(std::move(c));
  }
  absl::StatusOr<TensorMap> got = AssembleTensors(OverTheWire(stream));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want.size());
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    ExpectSameTensor(got->at(name), t);
  }
}

TEST(TensorCodec, DefaultPiecesFitGrpcDefaultMessageLimit) {
  const HostTensor t = RawTensor(DType::kU8, {3 * (1 << 20) + 17});
  const std::vector<v1::TensorChunk> chunks = SplitTensor(std::string(1024, 'n'), t);
  ASSERT_EQ(chunks.size(), 4u);
  for (const v1::TensorChunk& c : chunks) EXPECT_LT(c.ByteSizeLong(), size_t{4} << 20);
  absl::StatusOr<TensorMap> m = AssembleTensors(chunks);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectSameTensor(m->begin()->second, t);
}

TEST(TensorCodec, StreamTensorStopsAtTheSinksFirstError) {
  const HostTensor t = RawTensor(DType::kU8, {10});
  int calls = 0;
  absl::Status s = StreamTensor("t", t, 3, [&](const v1::TensorChunk&) {
    return ++calls == 2 ? absl::UnavailableError("stream broken") : absl::OkStatus();
  });
  EXPECT_TRUE(StatusIs(s, absl::StatusCode::kUnavailable, "stream broken"));
  EXPECT_EQ(calls, 2);
}

TEST(TensorCodec, DTypeConversionBothWays) {
  const std::pair<DType, v1::DType> pairs[] = {
      {DType::kF32, v1::F32}, {DType::kF64, v1::F64}, {DType::kBF16, v1::BF16},
      {DType::kF16, v1::F16}, {DType::kI32, v1::I32}, {DType::kI64, v1::I64},
      {DType::kU8, v1::U8}};
  for (const auto& [ours, wire] : pairs) {
    EXPECT_EQ(ToProtoDType(ours), wire);
    absl::StatusOr<DType> back = FromProtoDType(wire);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, ours);
  }
  EXPECT_TRUE(IsInvalid(FromProtoDType(v1::DTYPE_UNSPECIFIED), "DTYPE_UNSPECIFIED"));
  EXPECT_TRUE(IsInvalid(FromProtoDType(static_cast<v1::DType>(99)), "99"));
}

// ---------------------------------------------------------------------------------------------
// Malformed streams: INVALID_ARGUMENT, naming the problem

TEST(TensorAssembler, RejectsAFirstChunkWithoutHeader) {
  EXPECT_TRUE(IsInvalid(FeedAll({DataChunk(0, 4, true)}), "no tensor header"));
}

TEST(TensorAssembler, RejectsAHeaderlessChunkAfterACompletedTensor) {
  std::vector<v1::TensorChunk> s = SplitTensor("a", RawTensor(DType::kU8, {4}), 4);
  s.push_back(DataChunk(0, 4, true));
  EXPECT_TRUE(IsInvalid(FeedAll(s), "without a header"));
}

TEST(TensorAssembler, RejectsANewHeaderWhileATensorIsIncomplete) {
  std::vector<v1::TensorChunk> s = SplitTensor("a", RawTensor(DType::kU8, {8}), 4);
  s.pop_back();  // "a" never gets its last chunk
  for (auto& c : SplitTensor("b", RawTensor(DType::kU8, {2}), 4)) s.push_back(c);
  EXPECT_TRUE(IsInvalid(FeedAll(s), "\"b\"", "\"a\" is incomplete", "4 of 8"));
}

TEST(TensorAssembler, RejectsAHeaderInsideATensorEvenAtItsEnd) {
  // All bytes of "a" arrived but its last flag did not: the next header is still an error.
  v1::TensorChunk c = HeaderChunk("a", v1::U8, {4}, 4);
  c.set_data("abcd");
  EXPECT_TRUE(IsInvalid(FeedAll({c, HeaderChunk("b", v1::U8, {0}, 0)}), "incomplete"));
}

TEST(TensorAssembler, RejectsBadNames) {
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("", v1::U8, {0}, 0)}), "empty name"));
  const std::string long_name(kMaxTensorNameBytes + 1, 'x');
  absl::Status s = FeedAll({HeaderChunk(long_name, v1::U8, {0}, 0)});
  EXPECT_TRUE(IsInvalid(s, "longer than 1024"));
  EXPECT_LT(s.message().size(), 400u) << "the hostile name is not quoted in full";
  v1::TensorChunk ok = HeaderChunk(std::string(kMaxTensorNameBytes, 'x'), v1::U8, {0}, 0);
  ok.set_last(true);
  EXPECT_TRUE(FeedAll({ok}).ok());
}

TEST(TensorAssembler, RejectsDuplicateNames) {
  std::vector<v1::TensorChunk> s = SplitTensor("g", RawTensor(DType::kU8, {3}), 2);
  for (auto& c : SplitTensor("g", RawTensor(DType::kU8, {3}), 2)) s.push_back(c);
  EXPECT_TRUE(IsInvalid(FeedAll(s), "\"g\" appears twice"));
}

TEST(TensorAssembler, RejectsUnknownDTypes) {
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::DTYPE_UNSPECIFIED, {0}, 0)}),
                        "\"t\"", "DTYPE_UNSPECIFIED"));
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", static_cast<v1::DType>(42), {0}, 0)}),
                        "\"t\"", "unknown dtype value 42"));
  // An unknown enum value survives the wire (proto3 enums are open) and is still caught.
  std::vector<v1::TensorChunk> wire =
      OverTheWire({HeaderChunk("t", static_cast<v1::DType>(-7), {0}, 0)});
  EXPECT_TRUE(IsInvalid(FeedAll(wire), "unknown dtype value -7"));
}

TEST(TensorAssembler, RejectsNegativeDimensions) {
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F32, {2, -1}, 0)}), "negative dimension",
                        "(2, -1)"));
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F32, {0, -3}, 0)}), "negative dimension"));
}

TEST(TensorAssembler, RejectsShapesWhoseSizeOverflows) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::U8, {big, big}, 0)}), "overflows"));
  // numel fits in 64 bits, numel * 8 bytes does not.
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F64, {int64_t{1} << 61}, 0)}),
                        "byte size", "overflows"));
  // A zero after the overflow: the running product (as ShapeNumel computes it) overflows first.
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::U8, {big, big, 0}, 0)}), "overflows"));
  // A zero first keeps every running product at 0: a valid empty tensor.
  v1::TensorChunk ok = HeaderChunk("t", v1::U8, {0, big, big}, 0);
  ok.set_last(true);
  EXPECT_TRUE(FeedAll({ok}).ok());
}

TEST(TensorAssembler, RejectsTotalBytesThatDisagreeWithTheShape) {
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F32, {2, 3}, 23)}), "total_bytes 23",
                        "(24 bytes)"));
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::BF16, {}, 4)}), "total_bytes 4",
                        "(2 bytes)"));
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F64, {0}, 8)}), "total_bytes 8"));
}

TEST(TensorAssembler, RejectsNonContiguousOffsets) {
  // First chunk not at 0.
  v1::TensorChunk first = HeaderChunk("t", v1::U8, {8}, 8);
  first.set_offset(1);
  first.set_data("abcdefg");
  first.set_last(true);
  EXPECT_TRUE(IsInvalid(FeedAll({first}), "offset 1, expected 0"));

  std::vector<v1::TensorChunk> s = SplitTensor("t", RawTensor(DType::kU8, {9}), 3);
  ASSERT_EQ(s.size(), 3u);
  // A gap: the middle piece is lost.
  EXPECT_TRUE(IsInvalid(FeedAll({s[0], s[2]}), "offset 6, expected 3"));
  // An overlap: a piece is sent twice.
  EXPECT_TRUE(IsInvalid(FeedAll({s[0], s[1], s[1], s[2]}), "offset 3, expected 6"));
  // Out of order.
  EXPECT_TRUE(IsInvalid(FeedAll({s[0], s[2], s[1]}), "contiguous"));
}

TEST(TensorAssembler, RejectsDataPastTotalBytes) {
  v1::TensorChunk one = HeaderChunk("t", v1::U8, {4}, 4);
  one.set_data("abcde");
  one.set_last(true);
  EXPECT_TRUE(IsInvalid(FeedAll({one}), "[0, 5)", "past total_bytes 4"));

  v1::TensorChunk head = HeaderChunk("t", v1::U8, {4}, 4);
  head.set_data("abc");
  EXPECT_TRUE(IsInvalid(FeedAll({head, DataChunk(3, 2, true)}), "[3, 5)", "past total_bytes 4"));
  // An empty tensor with data.
  v1::TensorChunk empty = HeaderChunk("t", v1::F32, {0, 3}, 0);
  empty.set_data("x");
  EXPECT_TRUE(IsInvalid(FeedAll({empty}), "past total_bytes 0"));
}

TEST(TensorAssembler, RejectsALastChunkBeforeAllBytes) {
  v1::TensorChunk head = HeaderChunk("t", v1::F32, {2}, 8);
  head.set_data("abcd");
  head.set_last(true);
  EXPECT_TRUE(IsInvalid(FeedAll({head}), "last chunk ends at byte 4 of 8"));
}

TEST(TensorAssembler, FinishDetectsAnIncompleteTensor) {
  std::vector<v1::TensorChunk> s = SplitTensor("t", RawTensor(DType::kF32, {4}), 6);
  s.pop_back();
  EXPECT_TRUE(IsInvalid(FeedAll(s), "ended inside tensor \"t\"", "12 of 16"));
  // All bytes there, but no last flag.
  v1::TensorChunk head = HeaderChunk("u", v1::U8, {2}, 2);
  head.set_data("ab");
  EXPECT_TRUE(IsInvalid(FeedAll({head}), "ended inside tensor \"u\"", "2 of 2"));
  // A header alone.
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("v", v1::U8, {0}, 0)}), "\"v\"", "no last chunk"));
  // A last flag on a separate empty chunk completes the tensor.
  EXPECT_TRUE(FeedAll({head, DataChunk(2, 0, true)}).ok());
}

TEST(TensorAssembler, AnEmptyStreamIsFine) {
  absl::StatusOr<TensorMap> m = AssembleTensors({});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->empty());
}

TEST(TensorAssembler, TheFirstErrorIsSticky) {
  TensorAssembler a;
  EXPECT_TRUE(IsInvalid(a.Add(DataChunk(0, 1, true)), "no tensor header"));
  // A valid tensor afterwards is refused with the same error, and so is Finish.
  const std::vector<v1::TensorChunk> good = SplitTensor("t", RawTensor(DType::kU8, {1}), 1);
  EXPECT_TRUE(IsInvalid(a.Add(good[0]), "no tensor header"));
  EXPECT_TRUE(IsInvalid(a.Finish(), "no tensor header"));
}

TEST(TensorAssembler, AddAfterFinishIsAFailedPrecondition) {
  TensorAssembler a;
  ASSERT_TRUE(a.Finish().ok());
  const std::vector<v1::TensorChunk> good = SplitTensor("t", RawTensor(DType::kU8, {1}), 1);
  EXPECT_TRUE(StatusIs(a.Add(good[0]), absl::StatusCode::kFailedPrecondition, "after Finish"));
}

// ---------------------------------------------------------------------------------------------
// Limits: RESOURCE_EXHAUSTED, checked at the header before anything is allocated

TEST(TensorAssembler, PerTensorLimit) {
  const AssemblerLimits limits{.max_tensor_bytes = 64, .max_total_bytes = 1 << 20};
  EXPECT_TRUE(FeedAll(SplitTensor("t", RawTensor(DType::kF32, {16}), 7), limits).ok());
  EXPECT_TRUE(StatusIs(FeedAll(SplitTensor("t", RawTensor(DType::kF32, {17}), 7), limits),
                       absl::StatusCode::kResourceExhausted, "68 bytes", "limit of 64"));
}

TEST(TensorAssembler, TotalLimit) {
  const AssemblerLimits limits{.max_tensor_bytes = 64, .max_total_bytes = 100};
  std::vector<v1::TensorChunk> s = SplitTensor("a", RawTensor(DType::kU8, {60}), 16);
  for (auto& c : SplitTensor("b", RawTensor(DType::kU8, {40}), 16)) s.push_back(c);
  EXPECT_TRUE(FeedAll(s, limits).ok());  // exactly 100
  for (auto& c : SplitTensor("c", RawTensor(DType::kU8, {}), 16)) s.push_back(c);
  EXPECT_TRUE(StatusIs(FeedAll(s, limits), absl::StatusCode::kResourceExhausted, "\"c\"",
                       "101 bytes", "limit of 100"));
}

TEST(TensorAssembler, AHugeDeclaredSizeIsRefusedWithoutAllocating) {
  // 2^60 consistent bytes: reserving them would throw or exhaust memory; the limit comes first.
  const int64_t n = int64_t{1} << 57;
  EXPECT_TRUE(StatusIs(FeedAll({HeaderChunk("t", v1::F64, {n}, uint64_t{1} << 60)}),
                       absl::StatusCode::kResourceExhausted, "limit"));
  const AssemblerLimits unlimited_tensor{.max_tensor_bytes = ~uint64_t{0},
                                         .max_total_bytes = uint64_t{1} << 40};
  EXPECT_TRUE(StatusIs(FeedAll({HeaderChunk("t", v1::F64, {n}, uint64_t{1} << 60)},
                               unlimited_tensor),
                       absl::StatusCode::kResourceExhausted, "over the limit of 1099511627776"));
}

TEST(TensorAssembler, MalformedIsReportedBeforeOverLimit) {
  // A header that is both inconsistent and too big is malformed first (never retry it).
  const AssemblerLimits limits{.max_tensor_bytes = 8, .max_total_bytes = 8};
  EXPECT_TRUE(IsInvalid(FeedAll({HeaderChunk("t", v1::F32, {100}, 7)}, limits), "total_bytes"));
}

}  // namespace
}  // namespace adjsh
