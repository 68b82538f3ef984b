// The one checked kernel launcher. Only .cu files include it (it uses the launch syntax).
//
// Why it is built this way: a launch with a bad configuration fails later and far away ("invalid
// argument" at the next synchronisation) and names nothing. launch() checks the grid, the block
// and the shared memory against the device's limits before launching, raises the kernel's
// dynamic shared-memory limit when it needs more than the default, checks the launch error after,
// and names the kernel in every message. With PARITY_GPU_SYNC_LAUNCHES=1 in the environment it
// also synchronises after every launch, so a fault is reported at the kernel that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/gpu/port.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

struct LaunchShape {
  std::int64_t grid = 1;  // blocks (1-D)
  int block = 1;          // threads per block (1-D)
  std::size_t smem = 0;   // dynamic shared memory bytes
};

namespace detail {
// Throws GpuError naming the kernel when the shape exceeds the device's limits; raises the
// kernel's dynamic shared-memory limit when needed.
void validate_launch(const char* name, const void* kernel, const LaunchShape& shape);
// Checks the launch error (and synchronises first when PARITY_GPU_SYNC_LAUNCHES=1).
void after_launch(const char* name, Stream_t stream);
}  // namespace detail

#if defined(PARITY_GPU_COMPILER)
template <class... KernelArgs, class... Args>
void launch(const char* name, void (*kernel)(KernelArgs...), const LaunchShape& shape,
            Stream_t stream, Args&&... args) {
  if (shape.grid == 0) return;  // nothing to do
  detail::validate_launch(name, reinterpret_cast<const void*>(kernel), shape);
  if (rehearsing()) return;  // checked, not enqueued (RehearsalScope)
  kernel<<<dim3(static_cast<unsigned>(shape.grid)), dim3(static_cast<unsigned>(shape.block)),
           shape.smem, stream>>>(std::forward<Args>(args)...);
  detail::after_launch(name, stream);
}

// Blocks of `block` threads that fit on the whole device at once (a persistent grid for
// grid-stride kernels whose work count is only known on the device).
template <class... KernelArgs>
std::int64_t resident_blocks(void (*kernel)(KernelArgs...), int block, std::size_t smem) {
  int per_sm = 0;
  check(occupancy_max_active_blocks(&per_sm, reinterpret_cast<const void*>(kernel), block, smem),
        "occupancy_max_active_blocks");
  if (per_sm < 1) per_sm = 1;
  return static_cast<std::int64_t>(per_sm) * device_info().multiprocessor_count;
}
#endif

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace parity::gpu
