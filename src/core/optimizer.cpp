#include "parity/backend.h"

namespace parity {

int optimizer_state_per_element(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd:
      return 0;
    case OptimizerKind::adagrad:
      return 1;
    case OptimizerKind::rowwise_adagrad:
      return 0;  // one float per row, not per element
    case OptimizerKind::adam:
      return 2;
  }
  return 0;
}

float initial_optimizer_state(const OptimizerParams& opt) {
  const bool adagrad =
      opt.kind == OptimizerKind::adagrad || opt.kind == OptimizerKind::rowwise_adagrad;
  return adagrad ? opt.initial_accumulator : 0.0f;
}

}  // namespace parity
