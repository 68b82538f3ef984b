#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/backend.h"
#include "parity/error.h"
#if defined(PARITY_WITH_CUDA_BACKEND)
#include "backend/gpu/gpu_backend.h"
#endif

namespace parity {

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
#if defined(PARITY_WITH_CUDA_BACKEND)
  // Dense products in exact fp32 (GpuBackend's default); make_gpu_backend picks tf32 or bf16.
  if (name == "cuda") return make_gpu_backend(DenseMath::fp32);
  throw InputError("backend '" + name + "' is not available in this build (built: cpu, cuda)");
#else
  throw InputError("backend '" + name + "' is not available in this build (built: cpu)");
#endif
}

}  // namespace parity
