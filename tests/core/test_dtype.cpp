#include <gtest/gtest.h>

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
