// Dtypes, bf16/f16 conversion and HostTensor conversions.
#include "common/tensor.h"

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::IsInvalid;

TEST(DTypeTest, NamesRoundTripAndSizes) {
  for (DType d : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kF64), 8);
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kU8), 1);
  EXPECT_TRUE(IsInvalid(ParseDType("F8_E4M3"), "F8_E4M3"));
  EXPECT_TRUE(IsInvalid(ParseDType("f32"), "f32"));  // names are case-sensitive
}

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(BF16Test, ExactValuesAndSpecials) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(BF16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToF32(0xc040), -3.0f);
}

TEST(BF16Test, RoundsToNearestEven) {
  // Near 1 a bf16 ulp is 2^-7; 2^-8 is exactly half an ulp.
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f), 0x3f80);              // tie, 0x3f80 is even: down
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);    // tie, 0x3f81 is odd: up
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);   // above the tie: up
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);   // below the tie: down
  EXPECT_EQ(F32ToBF16(-(1.0f + 0x1p-8f + 0x1p-20f)), 0xbf81);  // symmetric for negatives
  // The largest float rounds up past the largest bf16 (0x7f7f) to infinity.
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBF16(BF16ToF32(0x7f7f)), 0x7f7f);
  // Subnormals round like everything else.
  EXPECT_EQ(F32ToBF16(FromBits(0x00008000)), 0x0000);  // tie to even (0)
  EXPECT_EQ(F32ToBF16(FromBits(0x00018000)), 0x0002);  // tie to even (2)
}

TEST(BF16Test, NaNStaysNaN) {
  // A NaN whose payload lives only in the low 16 bits must not truncate to infinity.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const float nan = FromBits(bits);
    ASSERT_TRUE(std::isnan(nan));
    const uint16_t b = F32ToBF16(nan);
    EXPECT_TRUE(std::isnan(BF16ToF32(b))) << std::hex << bits;
    EXPECT_EQ(b >> 15, bits >> 31) << "sign kept";
  }
}

TEST(BF16Test, EveryBF16ValueRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BF16ToF32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(f))));
    } else {
      ASSERT_EQ(F32ToBF16(f), b) << std::hex << b;
    }
  }
}

TEST(F16Test, Values) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
}

TEST(HostTensorTest, NumelAndShapeString) {
  HostTensor scalar;
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(ShapeString(scalar.shape), "()");
  HostTensor t;
  t.shape = {2, 3, 4};
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(ShapeString(t.shape), "(2, 3, 4)");
  t.shape = {5, 0};
  EXPECT_EQ(t.numel(), 0);
}

TEST(HostTensorTest, FromToRoundTrip) {
  const std::vector<double> values = {1.0, -2.5, 0.1, 1e-30, 3e38};
  HostTensor f64 = HostTensor::From<double>(values, {5}, DType::kF64);
  EXPECT_EQ(f64.data.size(), 40u);
  EXPECT_EQ(*f64.To<double>(), values);

  HostTensor f32 = HostTensor::From<double>(values, {5}, DType::kF32);
  EXPECT_EQ(f32.data.size(), 20u);
  std::vector<float> as_float = *f32.To<float>();
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(as_float[i], static_cast<float>(values[i]));

  const std::vector<float> exact = {1.0f, -2.0f, 0.5f, 384.0f};  // representable in bf16
  HostTensor bf16 = HostTensor::From<float>(exact, {2, 2}, DType::kBF16);
  EXPECT_EQ(bf16.data.size(), 8u);
  EXPECT_EQ(*bf16.To<float>(), exact);
}

TEST(HostTensorTest, DoubleToBF16RoundsOnce) {
  // Via a nearest float this would hit the tie 1 + 2^-8 and round down to 1; correctly rounded
  // it is above the tie.
  const std::vector<double> v = {1.0 + 0x1p-8 + 0x1p-30, -(1.0 + 0x1p-8 + 0x1p-30), 1.0 + 0x1p-8,
                                 1e300};
  HostTensor t = HostTensor::From<double>(v, {4}, DType::kBF16);
  std::vector<double> back = *t.To<double>();
  EXPECT_EQ(back[0], 1.0 + 0x1p-7);
  EXPECT_EQ(back[1], -(1.0 + 0x1p-7));
  EXPECT_EQ(back[2], 1.0);
  EXPECT_EQ(back[3], std::numeric_limits<double>::infinity());
}

TEST(HostTensorTest, ToRejectsIntegersAndBadSizes) {
  HostTensor ints;
  ints.dtype = DType::kI32;
  ints.shape = {2};
  ints.data.assign(8, 0);
  EXPECT_TRUE(IsInvalid(ints.To<float>(), "I32"));

  HostTensor short_data = HostTensor::From<float>(std::vector<float>{1, 2, 3}, {3}, DType::kF32);
  short_data.data.pop_back();
  EXPECT_TRUE(IsInvalid(short_data.To<double>(), "needs 12 bytes"));
  EXPECT_TRUE(IsInvalid(ValidateTensor(short_data), "(3)"));
}

TEST(HostTensorDeathTest, FromChecksCount) {
  const std::vector<float> v = {1, 2, 3};
  EXPECT_DEATH(HostTensor::From<float>(v, {2, 2}, DType::kF32), "does not match the shape");
  EXPECT_DEATH(HostTensor::From<float>(v, {3}, DType::kI32), "F32, F64 and BF16 only");
}

}  // namespace
}  // namespace adjsh
