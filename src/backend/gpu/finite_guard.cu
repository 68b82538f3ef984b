// The finite-value guard (see finite_guard.h). One grid-stride pass that only reads: a thread that
// meets a non-finite value swaps -1 for the step with a compare-and-swap, so a record, once made,
// is never overwritten (the first bad step stays) and a clean pass writes nothing. The grid is
// kept small (the buffers it reads are the loss and the dense gradients, megabytes at most).
#include "backend/gpu/finite_guard.h"

#include <algorithm>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"

namespace parity::gpu {

namespace {

using elementwise::global_index;
using elementwise::grid_stride;
using elementwise::kBlock;

constexpr std::int64_t kGuardMaxBlocks = 256;

__global__ __launch_bounds__(kBlock) void flag_nonfinite_kernel(const float* __restrict__ x,
                                                                std::int64_t n, std::int64_t step,
                                                                std::int64_t* first_bad) {
  bool bad = false;
  for (std::int64_t i = global_index(); i < n && !bad; i += grid_stride()) {
    bad = !isfinite(x[i]);
  }
  if (bad) {
    auto* record = reinterpret_cast<unsigned long long*>(first_bad);
    atomicCAS(record, static_cast<unsigned long long>(-1), static_cast<unsigned long long>(step));
  }
}

}  // namespace

void flag_nonfinite(Stream_t s, const float* x, std::int64_t n, std::int64_t step,
                    std::int64_t* first_bad) {
  if (n <= 0) return;
  const std::int64_t blocks = std::min(ceil_div(n, std::int64_t{kBlock}), kGuardMaxBlocks);
  launch("flag_nonfinite", flag_nonfinite_kernel, {blocks, kBlock, 0}, s, x, n, step, first_bad);
}

}  // namespace parity::gpu
