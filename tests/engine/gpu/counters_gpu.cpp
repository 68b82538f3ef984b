// gpu_counters (backends.h) in a build with the GPU backend: CMake adds this file or
// counters_none.cpp to test_engine (cmake/ParityGpu.cmake).
#include "../backends.h"

namespace parity::testing {

std::optional<GpuBackend::Counters> gpu_counters(Backend& backend) {
  if (const auto* gpu = dynamic_cast<const GpuBackend*>(&backend)) return gpu->counters();
  return std::nullopt;
}

}  // namespace parity::testing
