// Dot interaction kernels (see dot_interaction.h).
//
// Why it is built this way: per example this is a Gram matrix of F <= ~30 feature vectors of
// D <= 256, far too small for a library call per example. One block holds one example's features
// in shared memory (rows padded to D + 1 floats so that threads working on different pairs hit
// different banks) and its threads take the pairs (forward) or the (feature, column) outputs
// (backward); each sum runs in ascending order in fp32. No warp-level primitives, so the file is
// the same for 32- and 64-lane warps.
#include "backend/gpu/dot_interaction.h"

#include <cmath>
#include <cstddef>

#include "backend/gpu/launch.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

namespace {

constexpr int kDotBlock = 128;

// (i, j) with i > j of pair p in the row-major strict lower triangle: p = i(i-1)/2 + j.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * static_cast<double>(p))) * 0.5);
  while (i * (i - 1) / 2 > p) --i;
  while ((i + 1) * i / 2 <= p) ++i;
  j = p - i * (i - 1) / 2;
}

__global__ __launch_bounds__(kDotBlock) void dot_forward_kernel(CMat dense, CMat emb, int features,
                                                                Mat out) {
  extern __shared__ float zs[];  // [F, D + 1]
  const std::int64_t b = blockIdx.x;
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 1;
  const float* drow = dense.data + b * dense.ld;
  const float* erow = emb.data + b * emb.ld;
  float* orow = out.data + b * out.ld;
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int f = idx / D, d = idx - f * D;
    const float v = f == 0 ? drow[d] : erow[(f - 1) * D + d];
    zs[f * stride + d] = v;
    if (f == 0) orow[d] = v;
  }
  __syncthreads();
  const int pairs = features * (features - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int i, j;
    pair_of(p, i, j);
    const float* zi = zs + i * stride;
    const float* zj = zs + j * stride;
    float acc = 0.0f;
    for (int d = 0; d < D; ++d) acc = fmaf(zi[d], zj[d], acc);
    orow[D + p] = acc;
  }
}

__global__ __launch_bounds__(kDotBlock) void dot_backward_kernel(CMat dense, CMat emb, int features,
                                                                 CMat dout, Mat ddense, Mat demb) {
  extern __shared__ float sm[];
  const int D = static_cast<int>(dense.cols);
  float* zs = sm;                 // [F, D]
  float* gs = sm + features * D;  // [F, F] symmetric, zero diagonal
  const std::int64_t b = blockIdx.x;
  const float* drow = dense.data + b * dense.ld;
  const float* erow = emb.data + b * emb.ld;
  const float* grow = dout.data + b * dout.ld;
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int f = idx / D, d = idx - f * D;
    zs[idx] = f == 0 ? drow[d] : erow[(f - 1) * D + d];
  }
  for (int idx = threadIdx.x; idx < features * features; idx += blockDim.x) {
    const int i = idx / features, j = idx - i * features;
    const int hi = i > j ? i : j, lo = i > j ? j : i;
    gs[idx] = i == j ? 0.0f : grow[D + hi * (hi - 1) / 2 + lo];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int k = idx / D, d = idx - k * D;
    const float* gk = gs + k * features;
    float acc = 0.0f;
    for (int j = 0; j < features; ++j) acc = fmaf(gk[j], zs[j * D + d], acc);
    if (k == 0) {
      ddense.data[b * ddense.ld + d] =
          static_cast<float>(static_cast<double>(grow[d]) + static_cast<double>(acc));
    } else {
      demb.data[b * demb.ld + (k - 1) * D + d] = acc;
    }
  }
}

std::size_t dot_forward_smem(int features, int dim) {
  return static_cast<std::size_t>(features) * static_cast<std::size_t>(dim + 1) * sizeof(float);
}
std::size_t dot_backward_smem(int features, int dim) {
  return (static_cast<std::size_t>(features) * dim +
          static_cast<std::size_t>(features) * features) *
         sizeof(float);
}
void check_dot_smem(const char* op, std::size_t bytes, int features, int dim) {
  const std::size_t limit = device_info().shared_memory_per_block_optin;
  if (bytes > limit) {
    throw Error(cat(op, ": ", features, " features of dimension ", dim, " need ", bytes,
                    " bytes of shared memory per example; this device allows ", limit,
                    " (use fewer tables or a smaller embedding dimension)"));
  }
}

}  // namespace

void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out) {
  if (dense.rows <= 0) return;
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  const std::size_t smem = dot_forward_smem(features, dim);
  check_dot_smem("dot_interaction_forward", smem, features, dim);
  launch("dot_interaction_forward", dot_forward_kernel, {dense.rows, kDotBlock, smem}, s, dense,
         emb, features, out);
}

void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                  Mat demb) {
  if (dense.rows <= 0) return;
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  const std::size_t smem = dot_backward_smem(features, dim);
  check_dot_smem("dot_interaction_backward", smem, features, dim);
  launch("dot_interaction_backward", dot_backward_kernel, {dense.rows, kDotBlock, smem}, s, dense,
         emb, features, dout, ddense, demb);
}

}  // namespace parity::gpu
