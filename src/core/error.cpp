#include <fmt/format.h>

#include "parity/error.h"

namespace parity {

void require(bool cond, const std::string& where, const std::string& message) {
  if (!cond) throw InputError(fmt::format("{}: {}", where, message));
}

}  // namespace parity
