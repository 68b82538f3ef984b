// gpu_counters (backends.h) in a build without a GPU backend: no backend counts anything. CMake
// adds this file or counters_gpu.cpp to test_engine (cmake/ParityGpu.cmake).
#include "../backends.h"

namespace parity::testing {

std::optional<GpuBackend::Counters> gpu_counters(Backend&) {
  return std::nullopt;
}

}  // namespace parity::testing
