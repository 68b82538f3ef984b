// Loss kernels (see loss.h). Each term is formed in double, as the CPU reference forms it; the
// mean is a two-pass sum in a fixed order (per-block partials, then one block), so the same
// inputs give the same bits on every run. Block reductions go through shared memory, the same
// for 32- and 64-lane warps.
#include "backend/gpu/loss.h"

#include <algorithm>
#include <cmath>

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu {

namespace {

using namespace elementwise;

__device__ __forceinline__ double stable_sigmoid(double z) {
  if (z >= 0.0) return 1.0 / (1.0 + exp(-z));
  const double e = exp(z);
  return e / (1.0 + e);
}
__device__ __forceinline__ double softplus(double z) {
  return fmax(z, 0.0) + log1p(exp(-fabs(z)));
}

constexpr std::int64_t kLossMaxBlocks = 1024;

__device__ __forceinline__ void block_sum_store(double* sh, double v, double* out) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}

__global__ __launch_bounds__(kBlock) void bce_terms_kernel(const float* __restrict__ logits,
                                                           const float* __restrict__ labels,
                                                           std::int64_t n,
                                                           float* __restrict__ dlogits,
                                                           double* __restrict__ partial) {
  __shared__ double sh[kBlock];
  const double count = static_cast<double>(n);
  double acc = 0.0;
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double z = logits[i];
    const double y = labels[i];
    acc += softplus(z) - y * z;
    dlogits[i] = static_cast<float>((stable_sigmoid(z) - y) / count);
  }
  block_sum_store(sh, acc, partial + blockIdx.x);
}

__global__ __launch_bounds__(kBlock) void bce_final_kernel(const double* __restrict__ partial,
                                                           std::int64_t blocks, std::int64_t n,
                                                           float* __restrict__ loss_out,
                                                           double* __restrict__ total) {
  __shared__ double sh[kBlock];
  double acc = 0.0;
  for (std::int64_t k = threadIdx.x; k < blocks; k += blockDim.x) acc += partial[k];
  block_sum_store(sh, acc, total);
  if (threadIdx.x == 0) loss_out[0] = static_cast<float>(*total / static_cast<double>(n));
}

__global__ __launch_bounds__(kBlock) void sigmoid_kernel(const float* __restrict__ logits,
                                                         float* __restrict__ probs,
                                                         std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    probs[i] = static_cast<float>(stable_sigmoid(static_cast<double>(logits[i])));
  }
}

}  // namespace

std::int64_t bce_scratch_bytes() {
  return (kLossMaxBlocks + 1) * static_cast<std::int64_t>(sizeof(double));
}

void bce_with_logits(Stream_t s, const float* logits, const float* labels, std::int64_t n,
                     float* dlogits, float* loss_out, void* scratch) {
  auto* partial = static_cast<double*>(scratch);  // [blocks], then the total
  const std::int64_t blocks = std::min(ceil_div(n, kBlock), kLossMaxBlocks);
  launch("bce_terms", bce_terms_kernel, {blocks, kBlock, 0}, s, logits, labels, n, dlogits,
         partial);
  launch("bce_final", bce_final_kernel, {1, kBlock, 0}, s, static_cast<const double*>(partial),
         blocks, n, loss_out, partial + kLossMaxBlocks);
}

void sigmoid(Stream_t s, const float* logits, float* probs, std::int64_t n) {
  if (n <= 0) return;
  launch("sigmoid", sigmoid_kernel, {grid_for(n), kBlock, 0}, s, logits, probs, n);
}

}  // namespace parity::gpu
