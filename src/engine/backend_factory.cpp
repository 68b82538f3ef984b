// make_backend: the cpu reference, and the GPU backend this build has (CUDA, or HIP in a build
// without CUDA: both compile the same GpuBackend sources, so one binary holds one of them).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "parity/backend.h"
#include "parity/error.h"
#if defined(PARITY_WITH_CUDA_BACKEND) || defined(PARITY_WITH_HIP_BACKEND)
#include "backend/gpu/gemm_calibration.h"
#include "backend/gpu/gpu_backend.h"
#define PARITY_WITH_GPU_BACKEND 1
#endif

namespace parity {

namespace {
#if defined(PARITY_WITH_CUDA_BACKEND)
constexpr const char* kGpuBackend = "cuda";
#elif defined(PARITY_WITH_HIP_BACKEND)
constexpr const char* kGpuBackend = "hip";
#endif
}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, DenseMath math) {
  if (name == "cpu") return make_cpu_backend();  // fp32 with double accumulation, whatever math
#if defined(PARITY_WITH_GPU_BACKEND)
  if (name == kGpuBackend || name == "gpu") return make_gpu_backend(math);
  if (name ==
      "auto") {  // the GPU where one is present (its errors are reported), else the reference
    if (gpu_device_name().empty()) return make_cpu_backend();
    return make_gpu_backend(math);
  }
  throw InputError(
      fmt::format("backend '{}' is not available in this build (built: auto, cpu, gpu = {})", name,
                  kGpuBackend));
#else
  (void)math;
  if (name == "auto") return make_cpu_backend();
  throw InputError(
      fmt::format("backend '{}' is not available in this build (built: auto, cpu)", name));
#endif
}

std::string detect_gpu() {
#if defined(PARITY_WITH_GPU_BACKEND)
  return gpu_device_name();
#else
  return {};
#endif
}

int detect_gpu_count() {
#if defined(PARITY_WITH_GPU_BACKEND)
  return gpu_device_count();
#else
  return 0;
#endif
}

void use_gpu_of_local_rank(int local_rank) {
#if defined(PARITY_WITH_GPU_BACKEND)
  use_gpu(local_rank);
#else
  (void)local_rank;
#endif
}

std::string detect_gpu_uuid() {
#if defined(PARITY_WITH_GPU_BACKEND)
  return gpu_device_uuid();
#else
  return {};
#endif
}

GemmCatalog measure_gemm_catalog_here(const std::vector<GemmType>& types, const std::string& device,
                                      double hbm_bytes_per_s,
                                      const std::function<void(const std::string&)>& progress,
                                      const std::function<void(const MeasuredKernel&)>& measured) {
#if defined(PARITY_WITH_GPU_BACKEND)
  gpu::GemmCalibrationRequest r;
  r.types = types;
  r.device = device;
  r.hbm_bytes_per_s = hbm_bytes_per_s;
  r.progress = progress;
  r.measured = measured;
  return gpu::measure_gemm_catalog(r);
#else
  (void)types, (void)device, (void)hbm_bytes_per_s, (void)progress, (void)measured;
  throw InputError(
      "measuring the kernel catalog needs a GPU: this build has no GPU backend (build with "
      "-DPARITY_BACKENDS=\"cpu;cuda\")");
#endif
}

}  // namespace parity
