// The finite-value guard (see finite_guard.h). One grid-stride pass that only reads: a thread that
// meets a non-finite value swaps -1 for the step with a compare-and-swap, so a record, once made,
// is never overwritten (the first bad step stays) and a clean pass writes nothing.
#include "backend/gpu/finite_guard.h"

#include <algorithm>
#include <cstdint>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"

namespace parity::gpu {

namespace {

using elementwise::global_index;
using elementwise::grid_stride;
using elementwise::kBlock;

// Each thread reads 16 bytes at a time (a float4) where the buffer is 16-byte aligned: the dense
// parameters of a large model are tens of megabytes, read once per step.
__global__ __launch_bounds__(kBlock) void flag_nonfinite_kernel(const float* __restrict__ x,
                                                                std::int64_t n, bool vectors,
                                                                std::int64_t step,
                                                                std::int64_t* first_bad) {
  bool bad = false;
  const std::int64_t groups = vectors ? n / 4 : 0;
  const auto* x4 = reinterpret_cast<const float4*>(x);
  for (std::int64_t i = global_index(); i < groups && !bad; i += grid_stride()) {
    const float4 v = x4[i];
    bad = !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
  }
  for (std::int64_t i = 4 * groups + global_index(); i < n && !bad; i += grid_stride())
    bad = !isfinite(x[i]);
  if (bad) {
    auto* record = reinterpret_cast<unsigned long long*>(first_bad);
    atomicCAS(record, static_cast<unsigned long long>(-1), static_cast<unsigned long long>(step));
  }
}

}  // namespace

void flag_nonfinite(Stream_t s, const float* x, std::int64_t n, std::int64_t step,
                    std::int64_t* first_bad) {
  if (n <= 0) return;
  const bool vectors = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  // Enough blocks to fill the device a few times over, no more (each thread loops).
  const std::int64_t blocks =
      std::min(std::max<std::int64_t>(1, ceil_div(ceil_div(n, 4), std::int64_t{kBlock})),
               resident_blocks(flag_nonfinite_kernel, kBlock, 0) * 4);
  launch("flag_nonfinite", flag_nonfinite_kernel, {blocks, kBlock, 0}, s, x, n, vectors, step,
         first_bad);
}

}  // namespace parity::gpu
