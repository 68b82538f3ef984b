#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parity/metrics.h"

namespace parity {
namespace {

TEST(RocAuc, HandComputed) {
  const std::vector<float> y{0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, y), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, y), 0.0);
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, y), 0.5);
  // Pairs (pos, neg): (0.35 > 0.1), (0.35 > 0.4 no), (0.8 > both) -> 3 of 4.
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, y), 0.75);
  // A tie between a positive and a negative counts one half: (0.3=0.3 -> .5) + 1 + 1 + 1.
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.1f, 0.3f, 0.3f, 0.8f}, y), 3.5 / 4);
  EXPECT_TRUE(std::isnan(roc_auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 1})));
}

// A NaN score has no rank: the AUC is NaN, returned at once (a NaN once made the tie walk loop
// forever). Infinite scores rank as the extremes.
TEST(RocAuc, NanScoresGiveNanAndInfinitiesRank) {
  const std::vector<float> y{0, 1, 0, 1, 1};
  std::vector<float> s{0.1f, 0.9f, std::nanf(""), 0.7f, std::nanf("")};
  EXPECT_TRUE(std::isnan(roc_auc(s, y)));
  s = {-INFINITY, INFINITY, 0.2f, 0.7f, INFINITY};
  EXPECT_DOUBLE_EQ(roc_auc(s, y), 1.0);
}

TEST(RocAuc, MatchesPairCountOnRandomData) {
  std::vector<float> s, y;
  unsigned x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1103515245u + 12345u;
    s.push_back(static_cast<float>((x >> 16) % 50));  // many ties
    y.push_back(static_cast<float>((x >> 8) & 1));
  }
  double num = 0, den = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < s.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        den += 1;
        num += s[i] > s[j] ? 1 : (s[i] == s[j] ? 0.5 : 0);
      }
  EXPECT_NEAR(roc_auc(s, y), num / den, 1e-12);
}

TEST(LogLoss, HandComputed) {
  EXPECT_NEAR(log_loss(std::vector<float>{0.5f, 0.5f}, std::vector<float>{0, 1}), std::log(2.0),
              1e-7);
  EXPECT_NEAR(log_loss(std::vector<float>{0.9f}, std::vector<float>{1}), -std::log(0.9), 1e-6);
  EXPECT_TRUE(std::isfinite(log_loss(std::vector<float>{0.0f}, std::vector<float>{1})));
}

}  // namespace
}  // namespace parity
