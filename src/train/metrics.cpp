#include "parity/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "parity/error.h"

namespace parity {

double roc_auc(std::span<const float> scores, std::span<const float> labels) {
  if (scores.size() != labels.size()) throw Error("roc_auc: scores and labels differ in length");
  const std::size_t n = scores.size();
  // NaN compares false with everything: the sort below would have no strict weak order and the
  // tie walk would never advance. It has no rank, so the AUC is not defined.
  if (std::any_of(scores.begin(), scores.end(), [](float s) { return std::isnan(s); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](std::uint32_t a, std::uint32_t b) { return scores[a] < scores[b]; });
  double pos = 0, rank_sum = 0;  // sum of the (1-based, tie-averaged) ranks of the positives
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    double tie_pos = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      tie_pos += labels[order[j]] > 0.5f ? 1 : 0;
      ++j;
    }
    const double avg_rank = 0.5 * static_cast<double>(i + 1 + j);  // ranks i+1 .. j
    rank_sum += tie_pos * avg_rank;
    pos += tie_pos;
    i = j;
  }
  const double neg = static_cast<double>(n) - pos;
  if (pos == 0 || neg == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

double log_loss(std::span<const float> probs, std::span<const float> labels) {
  if (probs.size() != labels.size()) throw Error("log_loss: probs and labels differ in length");
  if (probs.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probs[i]), 1e-7, 1 - 1e-7);
    s -= labels[i] > 0.5f ? std::log(p) : std::log1p(-p);
  }
  return s / static_cast<double>(probs.size());
}

}  // namespace parity
