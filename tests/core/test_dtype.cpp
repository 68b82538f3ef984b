#include <gtest/gtest.h>

#include <cmath>

#include "parity/dtype.h"
#include "parity/error.h"

namespace parity {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2,
                  DType::i32, DType::i64}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_safetensors_dtype(dtype_safetensors_name(t)), t);
  }
  EXPECT_FALSE(parse_dtype("float32").has_value());
  EXPECT_FALSE(parse_safetensors_dtype("f32").has_value());
}

TEST(DType, Sizes) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::fp8_e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
}

TEST(Require, ThrowsWithLocation) {
  EXPECT_NO_THROW(require(true, "f.yaml:3", "x"));
  try {
    require(false, "f.yaml:3", "field 'a': expected a number");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:3: field 'a': expected a number");
  }
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

TEST(RoundToDtype, NearestEvenInFp16AndBf16) {
  EXPECT_EQ(round_to_dtype(1.0f / 3, DType::f32), 1.0f / 3);
  EXPECT_EQ(round_to_dtype(1.0f / 3, DType::f16), 0.333251953125f);  // 0x3555
  EXPECT_EQ(round_to_dtype(1.0f / 3, DType::bf16), 0.333984375f);     // 0x3eab
  // Ties go to even: 1 + 2^-11 is halfway between fp16 neighbours 1 and 1 + 2^-10.
  EXPECT_EQ(round_to_dtype(1.0f + 0x1p-11f, DType::f16), 1.0f);
  EXPECT_EQ(round_to_dtype(1.0f + 3 * 0x1p-11f, DType::f16), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1p-8f, DType::bf16), 1.0f);       // halfway, to even
  EXPECT_TRUE(std::isinf(round_to_dtype(65520.0f, DType::f16)));       // overflow
  EXPECT_EQ(round_to_dtype(65504.0f, DType::f16), 65504.0f);           // largest finite
  EXPECT_TRUE(std::isnan(round_to_dtype(NAN, DType::bf16)));
  // Idempotent.
  const float x = round_to_dtype(-0.1234567f, DType::bf16);
  EXPECT_EQ(round_to_dtype(x, DType::bf16), x);
}

}  // namespace
}  // namespace parity
