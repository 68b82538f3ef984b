// The dense part of a step as the plan evaluation needs it beside dense_op_costs (plan.h):
// the activation and gradient memory per example.
#pragma once

#include "parity/plan.h"

namespace parity::detail {

struct DenseMemory {
  double saved_bytes_per_example = 0;  // activations kept for the backward
  double grad_bytes_per_example = 0;   // the engine's gradient buffers
  // The GPU backend's own scratch (src/backend/gpu/gpu_backend.cpp, scratch.h) for b examples:
  // the widest product gradient dz in fp32 (and its bf16 copy under a 16-bit math), the cross
  // layers' du, and under a 16-bit math the two slots of bf16 copies of fp32 operands (the dense
  // input, or the widest weight). Each slot grows to kScratchGrowth times its largest request.
  double scratch_bytes(double b) const;
  double dz_bytes_per_example = 0;          // dz, dz16, du
  double input_copy_bytes_per_example = 0;  // the dense input in bf16 (0 under fp32 math)
  double weight_copy_bytes = 0;             // the widest weight in bf16 (0 under fp32 math)
};
// What the GPU backend's scratch slots allocate beyond a request (a quarter more,
// src/backend/gpu/scratch.cpp), so that a slowly growing shape does not reallocate every call.
inline constexpr double kScratchGrowth = 1.25;
DenseMemory dense_memory(const ModelSpec& m, DenseMath math);

}  // namespace parity::detail
