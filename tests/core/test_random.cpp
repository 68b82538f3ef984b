// The rounding bits (random.h): uniform, independent of the row and of the element's position, and
// the same bits whether drawn one element at a time (bits16) or two at a time (bits32).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>

#include "parity/random.h"

namespace parity {
namespace {

// Chi-square statistic of 16-bit draws over 64 equal bins.
template <class Draw>
double chi_square(int n, Draw draw) {
  std::array<int, 64> bins{};
  for (int i = 0; i < n; ++i) ++bins[static_cast<std::size_t>(draw(i) >> 10)];
  const double expected = static_cast<double>(n) / 64;
  double chi = 0;
  for (int b : bins) chi += (b - expected) * (b - expected) / expected;
  return chi;
}

TEST(RoundingBits, UniformAcrossElementsRowsAndSteps) {
  const std::uint64_t step = rng::key(7, 3);
  // 63 degrees of freedom: the 99.99th percentile is about 117.
  constexpr double kLimit = 117;
  // Along one row's elements.
  const std::uint64_t row = rng::row_key(step, 2, 1000);
  EXPECT_LT(chi_square(1 << 16, [&](int i) { return rng::bits16(row, i); }), kLimit);
  // Element 0 of consecutive rows, and of consecutive tables.
  EXPECT_LT(chi_square(1 << 16, [&](int i) { return rng::bits16(rng::row_key(step, 0, i), 0); }),
            kLimit);
  EXPECT_LT(chi_square(1 << 16, [&](int i) { return rng::bits16(rng::row_key(step, i, 5), 3); }),
            kLimit);
  // The same element of the same row over consecutive steps.
  EXPECT_LT(chi_square(1 << 16,
                       [&](int i) { return rng::bits16(rng::row_key(rng::key(7, i), 0, 9), 1); }),
            kLimit);
  // Neighbouring elements are not correlated: the two halves of one 32-bit draw.
  double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) {
    const double x = rng::bits16(row, 2 * static_cast<std::uint64_t>(i));
    const double y = rng::bits16(row, 2 * static_cast<std::uint64_t>(i) + 1);
    sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
  }
  const double corr = (sxy / n - sx / n * sy / n) /
                      std::sqrt((sxx / n - sx * sx / n / n) * (syy / n - sy * sy / n / n));
  EXPECT_LT(std::fabs(corr), 0.02);
}

TEST(RoundingBits, PairsAndSingleElementsAgree) {
  const std::uint64_t row = rng::row_key(rng::key(1, 2), 3, 4);
  for (std::uint64_t j = 0; j < 100; ++j) {
    const std::uint32_t pair = rng::bits32(row, j);
    EXPECT_EQ(rng::bits16(row, 2 * j), pair & 0xffffU);
    EXPECT_EQ(rng::bits16(row, 2 * j + 1), pair >> 16);
  }
  EXPECT_NE(rng::row_key(5, 0, 1), rng::row_key(5, 1, 0));
}

}  // namespace
}  // namespace parity
