// Counter-based uniform fill (see fill.h). A grid-stride loop over elements; each value depends
// only on (seed, stream, i), so the grid shape never changes the result.
#include "backend/gpu/fill.h"

#include <algorithm>

#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "parity/random.h"

namespace parity::gpu {

namespace {

template <class T>
__global__ __launch_bounds__(256) void fill_uniform_kernel(T* __restrict__ p, std::int64_t n, float lo, float span,
                                                           std::uint64_t key) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = static_cast<double>(lo) + static_cast<double>(span) * rng::uniform01(key, static_cast<std::uint64_t>(i));
    p[i] = from_float_rn<T>(static_cast<float>(v));
  }
}

template <class T>
void launch_fill(Stream_t s, void* p, std::int64_t n, float lo, float hi, std::uint64_t key) {
  auto kernel = fill_uniform_kernel<T>;
  const std::int64_t blocks = std::min<std::int64_t>(ceil_div(n, 256), resident_blocks(kernel, 256, 0) * 4);
  launch("fill_uniform", kernel, {blocks, 256, 0}, s, static_cast<T*>(p), n, lo, hi - lo, key);
}

}  // namespace

void fill_uniform(Stream_t s, void* p, DType dtype, std::int64_t n, float lo, float hi, std::uint64_t seed,
                  std::uint64_t stream) {
  if (n <= 0) return;
  const std::uint64_t key = rng::key(seed, stream);
  switch (dtype) {
    case DType::f16: return launch_fill<F16>(s, p, n, lo, hi, key);
    case DType::bf16: return launch_fill<Bf16>(s, p, n, lo, hi, key);
    case DType::f32: return launch_fill<float>(s, p, n, lo, hi, key);
    default: throw GpuError(cat("fill_uniform: dtype ", static_cast<int>(dtype), " is not f32, f16 or bf16"));
  }
}

}  // namespace parity::gpu
