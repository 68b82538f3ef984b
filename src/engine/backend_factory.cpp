#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/backend.h"
#include "parity/error.h"

namespace parity {

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  throw InputError("backend '" + name + "' is not available in this build (built: cpu)");
}

}  // namespace parity
