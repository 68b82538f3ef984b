// Evaluation metrics on the host.
#pragma once

#include <cstdint>
#include <span>

namespace parity {

// Exact area under the ROC curve: the probability that a random positive scores above a
// random negative, ties counted as one half (average ranks). Returns NaN when the labels
// are all of one class or a score is NaN (infinite scores rank as the extremes). O(n log n).
double roc_auc(std::span<const float> scores, std::span<const float> labels);

// Mean binary cross-entropy of probabilities (clamped to [1e-7, 1 - 1e-7]).
double log_loss(std::span<const float> probs, std::span<const float> labels);

}  // namespace parity
