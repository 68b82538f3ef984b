// Fills (see fill.h). Grid-stride loops over elements; each value depends only on its index (and
// (seed, stream) for the uniform fill), so the grid shape never changes the result.
#include "backend/gpu/fill.h"

#include <algorithm>
#include <cmath>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "parity/random.h"

namespace parity::gpu {

namespace {

using elementwise::global_index;
using elementwise::grid_for;
using elementwise::grid_stride;
using elementwise::kBlock;

__global__ __launch_bounds__(kBlock) void fill_kernel(float* __restrict__ p, std::int64_t n,
                                                      float value) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) p[i] = value;
}

template <class T>
__global__ __launch_bounds__(kBlock) void fill_uniform_kernel(T* __restrict__ p, std::int64_t n,
                                                              float lo, float span,
                                                              std::uint64_t key) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double v = static_cast<double>(lo) +
                     static_cast<double>(span) * rng::uniform01(key, static_cast<std::uint64_t>(i));
    p[i] = from_float_rn<T>(static_cast<float>(v));
  }
}

template <class T>
void launch_fill_uniform(Stream_t s, void* p, std::int64_t n, float lo, float hi,
                         std::uint64_t key) {
  auto kernel = fill_uniform_kernel<T>;
  const std::int64_t blocks =
      std::min<std::int64_t>(ceil_div(n, kBlock), resident_blocks(kernel, kBlock, 0) * 4);
  launch("fill_uniform", kernel, {blocks, kBlock, 0}, s, static_cast<T*>(p), n, lo, hi - lo, key);
}

}  // namespace

void fill(Stream_t s, float* p, std::int64_t n, float value) {
  if (n <= 0) return;
  if (value == 0.0f && !std::signbit(value)) {  // +0.0f is all zero bits: the memset is fastest
    if (!rehearsing()) {
      check(memset_async(p, 0, static_cast<std::size_t>(n) * sizeof(float), s), "fill (memset)");
    }
    return;
  }
  launch("fill", fill_kernel, {grid_for(n), kBlock, 0}, s, p, n, value);
}

void fill_uniform(Stream_t s, void* p, DType dtype, std::int64_t n, float lo, float hi,
                  std::uint64_t seed, std::uint64_t stream) {
  if (n <= 0) return;
  const std::uint64_t key = rng::key(seed, stream);
  switch (dtype) {
    case DType::f16:
      return launch_fill_uniform<F16>(s, p, n, lo, hi, key);
    case DType::bf16:
      return launch_fill_uniform<Bf16>(s, p, n, lo, hi, key);
    case DType::f32:
      return launch_fill_uniform<float>(s, p, n, lo, hi, key);
    default:
      throw GpuError(cat("fill_uniform: ", dtype_name(dtype), " is not fp32, fp16 or bf16"));
  }
}

}  // namespace parity::gpu
