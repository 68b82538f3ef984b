// The dense optimizers (Backend::dense_optimizer_step, include/parity/backend.h): one step of SGD,
// Adagrad or Adam over a flat parameter buffer. Host entry point; kernels in dense_optimizer.cu.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/backend.h"

namespace parity::gpu {

// One step over params [n] with grads [n] and the optimizer's state (adagrad: n floats; adam: m
// then v, 2n floats; sgd: unused), in double from the stored fp32 values and rounded once per
// stored value, as the CPU reference does. step is 1-based (Adam's bias correction).
void dense_optimizer_step(Stream_t s, float* params, const float* grads, float* state,
                          std::int64_t n, const OptimizerParams& opt, std::int64_t step);

}  // namespace parity::gpu
