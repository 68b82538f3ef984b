// The dense part of a step as the plan evaluation needs it beside dense_op_costs (plan.h):
// the activation and gradient memory per example.
#pragma once

#include "parity/plan.h"

namespace parity::detail {

struct DenseMemory {
  double saved_bytes_per_example = 0;  // activations kept for the backward
  double grad_bytes_per_example = 0;   // gradients and gradient scratch
};
DenseMemory dense_memory(const ModelSpec& m, DenseMath math);

}  // namespace parity::detail
