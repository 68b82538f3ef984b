#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "parity/dtype.h"
#include "parity/error.h"

namespace parity {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::i32,
                  DType::i64}) {
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
  EXPECT_EQ(round_to_dtype(1.0f / 3, DType::bf16), 0.333984375f);    // 0x3eab
  // Ties go to even: 1 + 2^-11 is halfway between fp16 neighbours 1 and 1 + 2^-10.
  EXPECT_EQ(round_to_dtype(1.0f + 0x1p-11f, DType::f16), 1.0f);
  EXPECT_EQ(round_to_dtype(1.0f + 3 * 0x1p-11f, DType::f16), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_to_dtype(1.0f + 0x1p-8f, DType::bf16), 1.0f);   // halfway, to even
  EXPECT_TRUE(std::isinf(round_to_dtype(65520.0f, DType::f16)));  // overflow
  EXPECT_EQ(round_to_dtype(65504.0f, DType::f16), 65504.0f);      // largest finite
  EXPECT_TRUE(std::isnan(round_to_dtype(NAN, DType::bf16)));
  // Idempotent.
  const float x = round_to_dtype(-0.1234567f, DType::bf16);
  EXPECT_EQ(round_to_dtype(x, DType::bf16), x);
}

// The integer fp16 conversion against the compiler's IEEE binary16 type, which rounds to nearest
// even in hardware or libgcc: every pattern back and forth, and floats all over the range.
TEST(DType, HalfBitsMatchTheCompilersBinary16) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = half_to_float(bits);
    const float want = static_cast<float>(std::bit_cast<_Float16>(bits));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), std::bit_cast<std::uint32_t>(want)) << std::hex << h;
    ASSERT_EQ(half_bits(f), bits) << std::hex << h;
  }
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto u = static_cast<std::uint32_t>(state >> 32);
    // Exponents around fp16's range: subnormals, normals, ties, overflow.
    const std::uint32_t e = 100u + (u >> 24) % 60u;
    const float f = std::bit_cast<float>((u & 0x807fffffu) | (e << 23));
    ASSERT_EQ(half_bits(f), std::bit_cast<std::uint16_t>(static_cast<_Float16>(f))) << f;
  }
  EXPECT_EQ(half_bits(65520.0f), 0x7c00u);  // halfway to 65536 rounds to even: infinity
  EXPECT_EQ(half_bits(-0.0f), 0x8000u);
  EXPECT_TRUE(std::isnan(half_to_float(half_bits(NAN))));
}

TEST(DType, LoadAndStoreElementsRoundOnce) {
  std::uint16_t h[2];
  store_element(h, DType::f16, 1, 1.0f / 3);
  EXPECT_EQ(load_element(h, DType::f16, 1), round_to_dtype(1.0f / 3, DType::f16));
  store_element(h, DType::bf16, 0, 1.0f / 3);
  EXPECT_EQ(load_element(h, DType::bf16, 0), round_to_dtype(1.0f / 3, DType::bf16));
  float f[1];
  store_element(f, DType::f32, 0, 0.1f);
  EXPECT_EQ(load_element(f, DType::f32, 0), 0.1f);
}

// Stochastic rounding goes to one of the two neighbours, and over every value of the random bits
// it rounds away from zero exactly as often as the dropped bits say: E[round(v)] = v.
TEST(DType, StochasticRoundingIsUnbiasedOverTheRandomBits) {
  struct Case {
    float v;
    DType t;
    int expected_up;  // of the 65536 values of r; -1: not checked (fp16 subnormals)
  };
  auto low = [](float v, std::uint32_t mask) {
    return static_cast<int>(std::bit_cast<std::uint32_t>(v) & mask);
  };
  const Case cases[] = {
      {1.0f / 3, DType::bf16, low(1.0f / 3, 0xffff)},
      {-0.1234567f, DType::bf16, low(-0.1234567f, 0xffff)},
      {1.0e30f, DType::bf16, low(1.0e30f, 0xffff)},
      {1.0f / 3, DType::f16, 8 * low(1.0f / 3, 0x1fff)},  // 13 dropped bits: r & 0x1fff
      {-1234.567f, DType::f16, 8 * low(-1234.567f, 0x1fff)},
      {3.0e-6f, DType::f16, -1},
      {-4.5e-7f, DType::f16, -1},
  };
  for (const Case& c : cases) {
    const bool half = c.t == DType::f16;
    auto value = [&](std::uint16_t b) { return half ? half_to_float(b) : bf16_to_float(b); };
    double sum = 0;
    int up = 0;
    float down_v = 0, up_v = 0;
    for (std::uint32_t r = 0; r < 65536; ++r) {
      const float x = value(half ? half_bits_sr(c.v, r) : bf16_bits_sr(c.v, r));
      sum += x;
      if (std::fabs(x) > std::fabs(c.v)) {
        ++up;
        ASSERT_TRUE(up_v == 0 || up_v == x) << c.v;  // always the same neighbour
        up_v = x;
      } else {
        ASSERT_TRUE(down_v == 0 || down_v == x) << c.v;
        down_v = x;
      }
    }
    EXPECT_GT(up, 0) << c.v;
    EXPECT_LT(up, 65536) << c.v;
    if (c.expected_up >= 0) {
      EXPECT_EQ(up, c.expected_up) << c.v << " " << dtype_name(c.t);
    }
    // The neighbours bracket v, and the mean is v up to the resolution of 16 random bits.
    EXPECT_TRUE(std::fabs(down_v) < std::fabs(c.v) && std::fabs(c.v) < std::fabs(up_v)) << c.v;
    EXPECT_NEAR(sum / 65536, c.v, std::fabs(up_v - down_v) / 65536 + 1e-30) << c.v;
  }
  // Exactly representable values never move; infinities, NaN and fp16's edge round to nearest.
  for (std::uint32_t r : {0u, 1u, 0x8000u, 0xffffu}) {
    EXPECT_EQ(bf16_bits_sr(1.5f, r), bf16_bits(1.5f));
    EXPECT_EQ(half_bits_sr(-0.75f, r), half_bits(-0.75f));
    EXPECT_EQ(bf16_bits_sr(INFINITY, r), bf16_bits(INFINITY));
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16_bits_sr(NAN, r))));
    EXPECT_EQ(half_bits_sr(65504.0f, r), half_bits(65504.0f));
    EXPECT_EQ(half_bits_sr(1e6f, r), 0x7c00u);
  }
}

}  // namespace
}  // namespace parity
