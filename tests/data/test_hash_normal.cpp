// The ziggurat normal generator behind the synthetic teacher and dense features: its table is
// consistent (the layers close at x = 0) and its output is N(0,1) (moments, tail mass and a
// Kolmogorov-Smirnov distance over 1e6 values; fixed keys, bounds at ~5 sigma).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "data/hash_normal.h"
#include "parity/random.h"

namespace parity {
namespace {

using data_detail::normal_value;
using data_detail::ziggurat_table;
using data_detail::ZigguratTable;

TEST(HashNormal, TableIsConsistent) {
  const ZigguratTable& z = ziggurat_table();
  constexpr double v = 9.91256303526217e-3;  // the area of every layer
  for (int i = 1; i < ZigguratTable::kLayers; ++i) {
    EXPECT_GT(z.x[i], z.x[i + 1]);
    EXPECT_NEAR(z.x[i] * (z.f[i + 1] - z.f[i]), v, 1e-9) << "layer " << i;
  }
  EXPECT_EQ(z.x[ZigguratTable::kLayers], 0.0);
  EXPECT_EQ(z.f[ZigguratTable::kLayers], 1.0);
  EXPECT_NEAR(z.x[0] * z.f[1], v, 1e-15);
}

TEST(HashNormal, IsStandardNormal) {
  const ZigguratTable& z = ziggurat_table();
  constexpr int kN = 1'000'000;
  const std::uint64_t key = rng::key(2718, 28);
  std::vector<double> x(kN);
  double sum = 0.0, sum2 = 0.0, sum4 = 0.0;
  int beyond_r = 0;
  for (int i = 0; i < kN; ++i) {
    x[i] = normal_value(z, key, i);
    ASSERT_TRUE(std::isfinite(x[i]));
    sum += x[i];
    sum2 += x[i] * x[i];
    sum4 += x[i] * x[i] * x[i] * x[i];
    beyond_r += std::abs(x[i]) > z.x[1];
  }
  const double mean = sum / kN, var = sum2 / kN - mean * mean, kurtosis = sum4 / kN;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(kN));
  EXPECT_NEAR(var, 1.0, 5.0 * std::sqrt(2.0 / kN));
  EXPECT_NEAR(kurtosis, 3.0, 5.0 * std::sqrt(96.0 / kN));
  // P(|x| > r) = erfc(r / sqrt 2) ~ 5.8e-4: the tail path is taken and lands beyond r.
  const double p_tail = std::erfc(z.x[1] / std::sqrt(2.0));
  EXPECT_NEAR(beyond_r, kN * p_tail, 5.0 * std::sqrt(kN * p_tail));
  // Kolmogorov-Smirnov distance to the normal cdf; 1.95/sqrt(N) is the 0.1% critical value.
  std::sort(x.begin(), x.end());
  double d = 0.0;
  for (int i = 0; i < kN; ++i) {
    const double cdf = 0.5 * std::erfc(-x[i] / std::sqrt(2.0));
    d = std::max({d, cdf - static_cast<double>(i) / kN, static_cast<double>(i + 1) / kN - cdf});
  }
  EXPECT_LT(d, 1.95 / std::sqrt(kN));
}

// Golden values: the dense features and the planted teacher of the synthetic data come from this
// function, so its values are part of the data's definition (as the ids' in test_synthetic.cpp).
// If this fails, the data changed: that needs a deliberate decision.
TEST(HashNormal, ValuesAreFrozen) {
  const ZigguratTable& z = ziggurat_table();
  const std::uint64_t key = rng::key(1, 2, 3);
  EXPECT_EQ(normal_value(z, key, 0), -0x1.6de554bb1ff26p+1);
  EXPECT_EQ(normal_value(z, key, 1), 0x1.d709e9c98e0e8p-3);
  EXPECT_EQ(normal_value(z, key, 12345), -0x1.e15ae0968a9ffp-2);
  EXPECT_EQ(normal_value(z, key, ~0ULL), 0x1.6e6438c109edfp+0);
  EXPECT_NE(normal_value(z, key, 7), normal_value(z, key + 1, 7));
}

}  // namespace
}  // namespace parity
