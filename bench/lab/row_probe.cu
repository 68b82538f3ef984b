// Lab: what HBM gives for the embedding backward's access pattern, with no arithmetic and no
// index chain: read a 512-byte row (fp32, dim 128) at each of a sorted list of distinct random
// rows, add 1, write it back. The backward's rows kernel cannot beat this (it moves the same
// weight bytes, plus state and gradients), so it is the ceiling its bandwidth is judged against,
// next to the device copy.
//
// Shape: 8 lanes per row, 4 16-byte vectors per lane (the rows kernel's shape), few registers and
// 256-thread blocks so that the multiprocessors are full (as many rows in flight as the hardware
// takes); streaming (evict-first) accesses like the rows kernel's.
#include <cstdint>

#include "backend/gpu/launch.h"
#include "backend/gpu/port.h"
#include "row_probe.h"

namespace parity::gpu::lab {

namespace {

__global__ __launch_bounds__(256) void row_rmw_kernel(float* __restrict__ w,
                                                      const std::uint32_t* __restrict__ rows,
                                                      std::int64_t n, int dim) {
  const int lane = static_cast<int>(threadIdx.x) & 7;
  const std::int64_t groups = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 8);
  for (std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
       i < n; i += groups) {
    uint4* row = reinterpret_cast<uint4*>(w + static_cast<std::int64_t>(rows[i]) * dim);
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = load_streaming(row + lane + 8 * k);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k].x = __float_as_uint(__uint_as_float(v[k].x) + 1.0f);
      v[k].y = __float_as_uint(__uint_as_float(v[k].y) + 1.0f);
      v[k].z = __float_as_uint(__uint_as_float(v[k].z) + 1.0f);
      v[k].w = __float_as_uint(__uint_as_float(v[k].w) + 1.0f);
      store_streaming(row + lane + 8 * k, v[k]);
    }
  }
}

}  // namespace

void row_read_modify_write(Stream_t s, float* weights, const std::uint32_t* rows, std::int64_t n,
                           int dim) {
  if (dim != 128) throw GpuError("row_read_modify_write: the probe is written for dim 128");
  const std::int64_t blocks = resident_blocks(row_rmw_kernel, 256, 0);
  launch("row_rmw", row_rmw_kernel, {blocks, 256, 0}, s, weights, rows, n, dim);
}

}  // namespace parity::gpu::lab
