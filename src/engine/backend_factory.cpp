#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/backend.h"
#include "parity/error.h"
#if defined(PARITY_WITH_CUDA_BACKEND)
#include "backend/gpu/gpu_backend.h"
#endif

namespace parity {

std::unique_ptr<Backend> make_backend(const std::string& name, DenseMath math) {
  if (name == "cpu") return make_cpu_backend();  // fp32 with double accumulation, whatever math
#if defined(PARITY_WITH_CUDA_BACKEND)
  if (name == "cuda" || name == "gpu") return make_gpu_backend(math);
  if (name == "auto") {
    try {
      return make_gpu_backend(math);
    } catch (const Error&) {  // no usable GPU here: the reference backend
      return make_cpu_backend();
    }
  }
  throw InputError("backend '" + name + "' is not available in this build (built: auto, cpu, gpu = cuda)");
#else
  (void)math;
  if (name == "auto") return make_cpu_backend();
  throw InputError("backend '" + name + "' is not available in this build (built: auto, cpu)");
#endif
}

std::string detect_gpu() {
#if defined(PARITY_WITH_CUDA_BACKEND)
  try {
    return gpu_device_name();
  } catch (const Error&) {
    return {};
  }
#else
  return {};
#endif
}

}  // namespace parity
