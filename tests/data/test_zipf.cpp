// ZipfSampler against the exact pmf. Draws use a fixed seed, so the tests are deterministic;
// the z-score bound (5) is loose enough that a correct sampler passes for any seed with
// overwhelming probability, and tight enough that an off-by-one in the rank, a wrong hat
// integral or a biased squeeze (all of which shift the head ranks by >> 5 sigma at 1e6 draws)
// fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"
#include "parity/random.h"

namespace parity {
namespace {

// Generalised harmonic number sum_{k=1}^{n} k^-alpha: exact sum for the head, Euler-Maclaurin
// for the tail (relative error far below 1e-12 with a head of 1e5 terms).
double harmonic(std::int64_t n, double alpha) {
  const std::int64_t head = std::min<std::int64_t>(n, 100000);
  double sum = 0.0;
  for (std::int64_t k = head; k >= 1; --k) sum += std::pow(static_cast<double>(k), -alpha);
  if (n == head) return sum;
  // sum_{k=m}^{n} f(k) ~ int_m^n f + (f(m) + f(n))/2 + (f'(n) - f'(m))/12, minus f(m) itself.
  const double m = static_cast<double>(head), nn = static_cast<double>(n);
  auto f = [&](double x) { return std::pow(x, -alpha); };
  auto df = [&](double x) { return -alpha * std::pow(x, -alpha - 1.0); };
  const double integral =
      std::abs(alpha - 1.0) < 1e-12
          ? std::log(nn / m)
          : (std::pow(nn, 1.0 - alpha) - std::pow(m, 1.0 - alpha)) / (1.0 - alpha);
  return sum + integral + (f(m) + f(nn)) / 2.0 + (df(nn) - df(m)) / 12.0 - f(m);
}

struct ZipfCase {
  std::int64_t n;
  double alpha;
};

class ZipfPmf : public ::testing::TestWithParam<ZipfCase> {};

TEST_P(ZipfPmf, HeadRanksMatchExactPmf) {
  const auto [n, alpha] = GetParam();
  const ZipfSampler zipf(n, alpha);
  EXPECT_EQ(zipf.n(), n);
  constexpr std::int64_t kDraws = 1'000'000;
  const int head = static_cast<int>(std::min<std::int64_t>(n, 20));
  std::vector<std::int64_t> counts(head + 1, 0);  // last bucket: every rank >= head
  const std::uint64_t key =
      rng::key(42, static_cast<std::uint64_t>(n), std::bit_cast<std::uint64_t>(alpha));
  for (std::int64_t i = 0; i < kDraws; ++i) {
    const std::int64_t k = zipf.sample(rng::uniform01(key, 2 * i), rng::uniform01(key, 2 * i + 1));
    ASSERT_GE(k, 0);
    ASSERT_LT(k, n);
    ++counts[std::min<std::int64_t>(k, head)];
  }
  const double norm = harmonic(n, alpha);
  double head_p = 0.0;
  for (int k = 0; k <= head; ++k) {
    const double p = k < head ? std::pow(k + 1.0, -alpha) / norm : 1.0 - head_p;
    if (k < head) head_p += p;
    if (p <= 0.0) {
      EXPECT_EQ(counts[k], 0);
      continue;
    }
    const double expected = kDraws * p;
    const double z = (counts[k] - expected) / std::sqrt(expected * (1.0 - p));
    EXPECT_LT(std::abs(z), 5.0) << "n=" << n << " alpha=" << alpha << " rank " << k
                                << (k == head ? " (tail bucket)" : "") << ": " << counts[k]
                                << " draws, expected " << expected;
  }
}

TEST_P(ZipfPmf, ChiSquareOverHeadAndTail) {
  const auto [n, alpha] = GetParam();
  const ZipfSampler zipf(n, alpha);
  constexpr std::int64_t kDraws = 1'000'000;
  const int head = static_cast<int>(std::min<std::int64_t>(n, 50));
  std::vector<std::int64_t> counts(head + 1, 0);
  const std::uint64_t key =
      rng::key(7, static_cast<std::uint64_t>(n), std::bit_cast<std::uint64_t>(alpha));
  for (std::int64_t i = 0; i < kDraws; ++i) {
    const std::int64_t k = zipf.sample(rng::uniform01(key, 2 * i), rng::uniform01(key, 2 * i + 1));
    ++counts[std::min<std::int64_t>(k, head)];
  }
  const double norm = harmonic(n, alpha);
  double chi2 = 0.0, head_p = 0.0;
  int dof = -1;
  for (int k = 0; k <= head; ++k) {
    const double p = k < head ? std::pow(k + 1.0, -alpha) / norm : 1.0 - head_p;
    if (k < head) head_p += p;
    const double expected = kDraws * p;
    if (expected < 5.0) continue;
    chi2 += (counts[k] - expected) * (counts[k] - expected) / expected;
    ++dof;
  }
  // Mean dof, sd sqrt(2 dof): dof + 6 sd is far in the tail of a correct sampler.
  EXPECT_LT(chi2, dof + 6.0 * std::sqrt(2.0 * dof)) << "n=" << n << " alpha=" << alpha;
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ZipfPmf,
    ::testing::Values(ZipfCase{10, 0.8}, ZipfCase{10, 1.0}, ZipfCase{10, 1.2}, ZipfCase{1000, 0.8},
                      ZipfCase{1000, 1.0}, ZipfCase{1000, 1.2}, ZipfCase{1'000'000'000, 0.8},
                      ZipfCase{1'000'000'000, 1.0}, ZipfCase{1'000'000'000, 1.2}),
    [](const ::testing::TestParamInfo<ZipfCase>& info) {
      // Appended piecewise: "n" + std::to_string(...) trips a false GCC 12 -Wrestrict at -O3.
      std::string name(1, 'n');
      name += std::to_string(info.param.n);
      name += "_alpha";
      name += std::to_string(static_cast<int>(std::lround(info.param.alpha * 10)));
      return name;
    });

TEST(Zipf, SingleElement) {
  const ZipfSampler zipf(1, 1.1);
  for (double u : {0.0, 0.3, 0.999999}) EXPECT_EQ(zipf.sample(u, u), 0);
}

TEST(Zipf, ExtremesStayInRange) {
  // Very flat, very steep, and the largest tables; the uniforms include the ends of [0, 1).
  const std::vector<double> us = {0.0, 1e-300, 1e-17, 0.5, 1.0 - 1e-16, 0.99999999999999989};
  for (std::int64_t n : {std::int64_t{2}, std::int64_t{3}, std::int64_t{1'000'000'000'000}}) {
    for (double alpha : {0.01, 0.5, 0.999999, 1.0, 1.000001, 2.0, 8.0}) {
      const ZipfSampler zipf(n, alpha);
      for (double u1 : us) {
        for (double u2 : us) {
          const std::int64_t k = zipf.sample(u1, u2);
          EXPECT_GE(k, 0) << n << " " << alpha << " " << u1 << " " << u2;
          EXPECT_LT(k, n) << n << " " << alpha << " " << u1 << " " << u2;
        }
      }
      const std::uint64_t key = rng::key(3, static_cast<std::uint64_t>(n));
      for (std::uint64_t i = 0; i < 20000; ++i) {
        const std::int64_t k =
            zipf.sample(rng::uniform01(key, 2 * i), rng::uniform01(key, 2 * i + 1));
        ASSERT_GE(k, 0);
        ASSERT_LT(k, n);
      }
    }
  }
}

TEST(Zipf, AlphaNearOneIsContinuous) {
  // alpha == 1 takes the log branch of the same formulas; alpha a hair away must give the same
  // ranks for the same uniforms (except where a uniform lies on a rank boundary).
  const std::int64_t n = 1'000'000;
  const ZipfSampler at(n, 1.0), below(n, 1.0 - 1e-12), above(n, 1.0 + 1e-12);
  const std::uint64_t key = rng::key(11, 1);
  int differ = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const double u1 = rng::uniform01(key, 2 * i), u2 = rng::uniform01(key, 2 * i + 1);
    const std::int64_t k = at.sample(u1, u2);
    differ += k != below.sample(u1, u2);
    differ += k != above.sample(u1, u2);
  }
  EXPECT_LE(differ, 5);
}

TEST(Zipf, RejectsBadParameters) {
  EXPECT_THROW(ZipfSampler(0, 1.0), Error);
  EXPECT_THROW(ZipfSampler(10, 0.0), Error);
  EXPECT_THROW(ZipfSampler(10, -1.0), Error);
  EXPECT_THROW(ZipfSampler(10, std::nan("")), Error);
}

}  // namespace
}  // namespace parity
