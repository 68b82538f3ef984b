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

}  // namespace parity
