// detmath (the exp/log family that rounds the same on host and device) against the C library:
// within a few ulp over the ranges the synthetic generators use and far beyond, exact at the
// special values. The GPU side is checked by the synthetic batches the device makes
// (tests/gpu/test_synthetic_gpu.cpp), which must equal the host's bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "parity/detmath.h"
#include "parity/random.h"

namespace parity {
namespace {

// Distance in units in the last place between two finite doubles of the same sign.
std::int64_t ulps(double a, double b) {
  if (a == b) return 0;
  const auto ia = std::bit_cast<std::int64_t>(a), ib = std::bit_cast<std::int64_t>(b);
  return ia > ib ? ia - ib : ib - ia;
}

// Largest ulp error of f against g over n points drawn uniformly in [lo, hi].
template <class F, class G>
std::int64_t worst_ulps(F f, G g, double lo, double hi, int n, std::uint64_t seed) {
  std::int64_t worst = 0;
  const std::uint64_t key = rng::key(seed, 0xde7);
  for (int i = 0; i < n; ++i) {
    const double x = lo + (hi - lo) * rng::uniform01(key, static_cast<std::uint64_t>(i));
    const double want = g(x), got = f(x);
    if (want == 0.0) {
      EXPECT_LE(std::abs(got), 1e-300) << x;
      continue;
    }
    EXPECT_EQ(std::signbit(want), std::signbit(got)) << x;
    const std::int64_t u = ulps(want, got);
    if (u > worst) worst = u;
  }
  return worst;
}

constexpr int kPoints = 200000;

TEST(Detmath, ExpWithinTwoUlps) {
  auto f = [](double x) { return detmath::exp(x); };
  auto g = [](double x) { return std::exp(x); };
  EXPECT_LE(worst_ulps(f, g, -1.0, 1.0, kPoints, 1), 2);
  EXPECT_LE(worst_ulps(f, g, -40.0, 40.0, kPoints, 2), 2);
  EXPECT_LE(worst_ulps(f, g, -700.0, 709.0, kPoints, 3), 2);
  // Results below the normal range keep their value to within the subnormal spacing.
  for (double x : {-708.5, -720.0, -740.0, -745.0})
    EXPECT_NEAR(detmath::exp(x), std::exp(x), std::exp(x) * 1e-3 + 5e-324) << x;
}

TEST(Detmath, LogWithinTwoUlps) {
  auto f = [](double x) { return detmath::log(x); };
  auto g = [](double x) { return std::log(x); };
  EXPECT_LE(worst_ulps(f, g, 0.5, 2.0, kPoints, 4), 2);
  EXPECT_LE(worst_ulps(f, g, 1e-9, 1.0, kPoints, 5), 2);
  EXPECT_LE(worst_ulps(f, g, 1.0, 1e12, kPoints, 6), 2);
  // Near 1 the result is small: relative accuracy must hold there too.
  EXPECT_LE(worst_ulps(f, g, 1.0 - 1e-6, 1.0 + 1e-6, kPoints, 7), 2);
  EXPECT_LE(ulps(detmath::log(1e-310), std::log(1e-310)), 2);  // subnormal input
  EXPECT_LE(ulps(detmath::log(1.7e308), std::log(1.7e308)), 2);
}

TEST(Detmath, Log1pAndExpm1WithinTwoUlps) {
  auto l = [](double x) { return detmath::log1p(x); };
  auto gl = [](double x) { return std::log1p(x); };
  EXPECT_LE(worst_ulps(l, gl, -1e-6, 1e-6, kPoints, 8), 2);
  EXPECT_LE(worst_ulps(l, gl, -0.99, 10.0, kPoints, 9), 2);
  EXPECT_LE(worst_ulps(l, gl, 10.0, 1e15, kPoints, 10), 2);
  auto e = [](double x) { return detmath::expm1(x); };
  auto ge = [](double x) { return std::expm1(x); };
  EXPECT_LE(worst_ulps(e, ge, -1e-6, 1e-6, kPoints, 11), 2);
  EXPECT_LE(worst_ulps(e, ge, -1.0, 1.0, kPoints, 12), 2);
  EXPECT_LE(worst_ulps(e, ge, -30.0, 700.0, kPoints, 13), 2);
}

TEST(Detmath, SpecialValues) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(detmath::exp(0.0), 1.0);
  EXPECT_EQ(detmath::exp(800.0), inf);
  EXPECT_EQ(detmath::exp(-800.0), 0.0);
  EXPECT_EQ(detmath::exp(-inf), 0.0);
  EXPECT_TRUE(std::isnan(detmath::exp(nan)));
  EXPECT_EQ(detmath::log(1.0), 0.0);
  EXPECT_EQ(detmath::log(0.0), -inf);
  EXPECT_EQ(detmath::log(inf), inf);
  EXPECT_TRUE(std::isnan(detmath::log(-1.0)));
  EXPECT_TRUE(std::isnan(detmath::log(nan)));
  EXPECT_EQ(detmath::log1p(0.0), 0.0);
  EXPECT_EQ(detmath::log1p(-1.0), -inf);
  EXPECT_TRUE(std::isnan(detmath::log1p(-2.0)));
  EXPECT_EQ(detmath::expm1(0.0), 0.0);
  EXPECT_TRUE(std::signbit(detmath::expm1(-0.0)));
  EXPECT_TRUE(std::signbit(detmath::log1p(-0.0)));
  EXPECT_EQ(detmath::expm1(-100.0), -1.0);
  EXPECT_EQ(detmath::expm1(1000.0), inf);
  // Tiny arguments: log1p(t) and expm1(t) are t to within an ulp.
  EXPECT_LE(ulps(detmath::log1p(1e-300), 1e-300), 1);
  EXPECT_LE(ulps(detmath::expm1(-1e-300), -1e-300), 1);
}

}  // namespace
}  // namespace parity
