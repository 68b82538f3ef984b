// The loss and the prediction head: mean binary cross-entropy with logits and its gradient, and
// the sigmoid (Backend::bce_with_logits / sigmoid, include/parity/backend.h). Host entry points;
// kernels in loss.cu.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"

namespace parity::gpu {

// Bytes of scratch bce_with_logits needs (independent of n).
std::int64_t bce_scratch_bytes();
// Mean BCE with logits into loss_out[0] (device), dlogits[i] = (sigmoid(z_i) - y_i) / n.
void bce_with_logits(Stream_t s, const float* logits, const float* labels, std::int64_t n,
                     float* dlogits, float* loss_out, void* scratch);
// probs[i] = sigmoid(logits[i]).
void sigmoid(Stream_t s, const float* logits, float* probs, std::int64_t n);

}  // namespace parity::gpu
