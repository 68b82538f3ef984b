// Dot interaction kernels (see dot_interaction.h).
//
// Why it is built this way: per example this is a Gram matrix of F <= ~30 feature vectors of
// D <= 256, far too small for a library call per example. One block holds one example's features
// in shared memory (rows padded to D + 1 floats so that threads working on different pairs hit
// different banks) and its threads take the pairs (forward) or the (feature, column) outputs
// (backward); each sum runs in ascending order in fp32. No warp-level primitives, so the file is
// the same for 32- and 64-lane warps.
//
// Where D is a multiple of 4 and every row is 16-byte aligned (the engine's x0 for dims that are
// multiples of 4) the kernels move 4 columns per access, in global and in shared memory: the
// scalar kernels issue two shared-memory loads per multiply-add and were bound by them; the vector
// ones issue one 16-byte load per 2 (forward: a pair's two rows) or 4 (backward) multiply-adds.
// From a handful of features on (F >= kTiledFeatures) shared memory's bandwidth still bounds them
// (with 27 features and D = 64 too: docs/perf/dense.md), so each thread computes a 4 x 4 register
// tile instead (forward: the dots of 4 features with 4 others;
// backward: 4 features' gradients in 4 columns), 8 multiply-adds per 16-byte load. Every sum keeps
// the scalar kernels' order (ascending d, or ascending j), so all give the same bits. The tiled
// forward's threads read groups of 4 rows at once: each group starts 4 floats further on, so that
// the groups fall in different banks (with rows of D + 4 floats alone they fell in two).
//
// Under bf16 dense math the next product reads the output as bf16: the forward writes that copy
// beside the output (BF16Copy), which saves a conversion pass over the fp32 output.
//
// A register tile's 16 outputs lie far apart in the output row, so the tiled forward puts them in
// shared memory and then writes the row with consecutive threads on consecutive columns; the tiled
// backward reads the row of pair gradients the same way before it lays out G. Written directly,
// a warp's store of 32 floats touched 32 sectors (docs/perf/zoo.md, "Models not in the zoo").
// Where the row does not fit in shared memory beside the features (hundreds of features) they
// fall back to the direct accesses.
#include "backend/gpu/dot_interaction.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "backend/gpu/runtime.h"
#include "parity/host_device.h"

namespace parity::gpu {

namespace {

constexpr int kDotBlock = 128;  // the most threads a block has, but the tiled backward's
// The tiled backward takes one round of its (feature block, column block) items where up to this
// many threads do it: an example of 152 items took two rounds of 128, the second mostly idle.
// More items keep 128 threads and several rounds, which measured faster than 256.
constexpr int kDotBackwardBlock = 256;

// Threads for an example whose compute loop has `items` work items (pairs, tiles, or (feature,
// column) outputs): one per item, rounded up to whole warps, at most `most`. A block of 128 for
// an example of 3 pairs left 125 threads idle, and a multiprocessor holds a limited number of
// blocks; smaller blocks let more examples run at once. Each output's sum is the same.
int dot_threads(std::int64_t items, int most = kDotBlock) {
  const std::int64_t warp = device_info().warp_size;
  const std::int64_t threads = (std::max<std::int64_t>(items, 1) + warp - 1) / warp * warp;
  return static_cast<int>(std::min<std::int64_t>(threads, std::max<std::int64_t>(most, warp)));
}

// One example's output row, and its row of the bf16 copy where the caller wants one (BF16Copy):
// each element is written to both, the copy rounded to nearest even as gpu::convert rounds it, and
// the copy's columns past the output's are zeros (gpu::convert_padded's layout).
struct OutRow {
  float* f;
  Bf16* h;  // null: no copy
  __device__ __forceinline__ void put(int c, float v) const {
    f[c] = v;
    if (h != nullptr) h[c] = from_float_rn<Bf16>(v);
  }
  __device__ __forceinline__ void zero_tail(int cols, std::int64_t ld) const {
    if (h == nullptr) return;
    for (int c = cols + static_cast<int>(threadIdx.x); c < ld; c += blockDim.x) h[c] = Bf16{0};
  }
};
__device__ __forceinline__ OutRow out_row(Mat out, BF16Copy copy, std::int64_t b) {
  return {out.data + b * out.ld, copy.data != nullptr ? copy.data + b * copy.ld : nullptr};
}

// (i, j) with i > j of pair p in the row-major strict lower triangle: p = i(i-1)/2 + j.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * static_cast<double>(p))) * 0.5);
  while (i * (i - 1) / 2 > p) --i;
  while ((i + 1) * i / 2 <= p) ++i;
  j = p - i * (i - 1) / 2;
}

// gs [F, ld] = one example's pair gradients (pairs: its dout row past the D pass-through columns)
// as a symmetric matrix with a zero diagonal (entry (i, j), i > j, is pairs[i(i-1)/2 + j]);
// columns [F, ld) are zeros.
__device__ __forceinline__ void load_pair_gradients(const float* pairs, int features, int ld,
                                                    float* gs) {
  for (int idx = threadIdx.x; idx < features * ld; idx += blockDim.x) {
    const int i = idx / ld, j = idx - i * ld;
    const int hi = i > j ? i : j, lo = i > j ? j : i;
    gs[idx] = i == j || j >= features ? 0.0f : pairs[hi * (hi - 1) / 2 + lo];
  }
}

// The gradient of a dense feature: dout's pass-through column plus the interaction's sum, added
// in double and rounded once.
__device__ __forceinline__ float dense_gradient(float through, float interaction) {
  return static_cast<float>(static_cast<double>(through) + static_cast<double>(interaction));
}

__global__ __launch_bounds__(kDotBlock) void dot_forward_kernel(CMat dense, CMat emb, int features,
                                                                Mat out, BF16Copy copy) {
  extern __shared__ float zs[];  // [F, D + 1]
  const std::int64_t b = blockIdx.x;
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 1;
  const float* drow = dense.data + b * dense.ld;
  const float* erow = emb.data + b * emb.ld;
  const OutRow orow = out_row(out, copy, b);
  orow.zero_tail(static_cast<int>(out.cols), copy.ld);
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int f = idx / D, d = idx - f * D;
    const float v = f == 0 ? drow[d] : erow[(f - 1) * D + d];
    zs[f * stride + d] = v;
    if (f == 0) orow.put(d, v);
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
    orow.put(D + p, acc);
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
  load_pair_gradients(grow + D, features, features, gs);
  __syncthreads();
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int k = idx / D, d = idx - k * D;
    const float* gk = gs + k * features;
    float acc = 0.0f;
    for (int j = 0; j < features; ++j) acc = fmaf(gk[j], zs[j * D + d], acc);
    if (k == 0) {
      ddense.data[b * ddense.ld + d] = dense_gradient(grow[d], acc);
    } else {
      demb.data[b * demb.ld + (k - 1) * D + d] = acc;
    }
  }
}

// ---- 4 columns at a time (D % 4 == 0, rows 16-byte aligned) ----

// Rows padded to D + 4 floats: 16-byte aligned, and consecutive rows start 4 banks apart, so the
// 8 threads of a 16-byte load phase (consecutive pairs: the same row i, consecutive rows j) hit
// distinct banks.
// Feature f's row starts at f * stride + (f / 4) * group_pad floats: the register-tiled forward
// pads each group of 4 rows by 4 more floats (group_pad 4), so that the groups its threads read at
// once (rows 4 bi and 4 bj) start in different banks; the other kernels pass 0.
__device__ __forceinline__ void load_features4(const float* drow, const float* erow, int features,
                                               int D, int stride, float* zs, int group_pad = 0) {
  const int D4 = D / 4;
  for (int idx = threadIdx.x; idx < features * D4; idx += blockDim.x) {
    const int f = idx / D4, d = (idx - f * D4) * 4;
    const float4 v = *reinterpret_cast<const float4*>(f == 0 ? drow + d : erow + (f - 1) * D + d);
    *reinterpret_cast<float4*>(zs + f * stride + (f / 4) * group_pad + d) = v;
  }
}

__global__ __launch_bounds__(kDotBlock) void dot_forward4_kernel(CMat dense, CMat emb, int features,
                                                                 Mat out, BF16Copy copy) {
  extern __shared__ float zs[];  // [F, D + 4]
  const std::int64_t b = blockIdx.x;
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 4;
  const float* drow = dense.data + b * dense.ld;
  const OutRow orow = out_row(out, copy, b);
  orow.zero_tail(static_cast<int>(out.cols), copy.ld);
  load_features4(drow, emb.data + b * emb.ld, features, D, stride, zs);
  for (int d = threadIdx.x; d < D; d += blockDim.x) orow.put(d, drow[d]);  // out may be unaligned
  __syncthreads();
  const int pairs = features * (features - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int i, j;
    pair_of(p, i, j);
    const float4* zi = reinterpret_cast<const float4*>(zs + i * stride);
    const float4* zj = reinterpret_cast<const float4*>(zs + j * stride);
    float acc = 0.0f;
    for (int q = 0; q < D / 4; ++q) {
      const float4 a = zi[q], c = zj[q];
      acc = fmaf(a.x, c.x, acc);
      acc = fmaf(a.y, c.y, acc);
      acc = fmaf(a.z, c.z, acc);
      acc = fmaf(a.w, c.w, acc);
    }
    orow.put(D + p, acc);
  }
}

__global__ __launch_bounds__(kDotBlock) void dot_backward4_kernel(CMat dense, CMat emb,
                                                                  int features, CMat dout,
                                                                  Mat ddense, Mat demb) {
  extern __shared__ float sm[];
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 4;
  float* zs = sm;                      // [F, D + 4]
  float* gs = sm + features * stride;  // [F, F] symmetric, zero diagonal
  const std::int64_t b = blockIdx.x;
  const float* grow = dout.data + b * dout.ld;
  load_features4(dense.data + b * dense.ld, emb.data + b * emb.ld, features, D, stride, zs);
  load_pair_gradients(grow + D, features, features, gs);
  __syncthreads();
  const int D4 = D / 4;
  for (int idx = threadIdx.x; idx < features * D4; idx += blockDim.x) {
    const int k = idx / D4, d = (idx - k * D4) * 4;
    const float* gk = gs + k * features;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < features; ++j) {
      const float g = gk[j];
      const float4 z = *reinterpret_cast<const float4*>(zs + j * stride + d);
      acc.x = fmaf(g, z.x, acc.x);
      acc.y = fmaf(g, z.y, acc.y);
      acc.z = fmaf(g, z.z, acc.z);
      acc.w = fmaf(g, z.w, acc.w);
    }
    if (k == 0) {
      float* dst = ddense.data + b * ddense.ld + d;
      const float a[4] = {acc.x, acc.y, acc.z, acc.w};
      for (int e = 0; e < 4; ++e) dst[e] = dense_gradient(grow[d + e], a[e]);
    } else {
      *reinterpret_cast<float4*>(demb.data + b * demb.ld + (k - 1) * D + d) = acc;
    }
  }
}

// ---- 4 x 4 register tiles (F >= kTiledFeatures, and the conditions above) ----

constexpr int kTiledFeatures = 8;

// The tiled forward's features in shared memory: fp rows of D + 4 floats, plus 4 floats for each
// group of 4 rows (load_features4's group_pad).
PARITY_HD constexpr std::size_t tiled_forward_floats(int fp, int dim) {
  return static_cast<std::size_t>(fp) * static_cast<std::size_t>(dim + 4) +
         static_cast<std::size_t>(fp);
}
constexpr std::size_t pair_count(int features) {
  return static_cast<std::size_t>(features) * static_cast<std::size_t>(features - 1) / 2;
}

// (bi, bj) with bi >= bj of tile t in the row-major lower triangle with its diagonal:
// t = bi(bi+1)/2 + bj.
__device__ __forceinline__ void tile_of(int t, int& bi, int& bj) {
  bi = static_cast<int>((sqrt(8.0 * static_cast<double>(t) + 1.0) - 1.0) * 0.5);
  while (bi * (bi + 1) / 2 > t) --bi;
  while ((bi + 1) * (bi + 2) / 2 <= t) ++bi;
  bj = t - bi * (bi + 1) / 2;
}

__global__ __launch_bounds__(kDotBlock) void dot_forward_tiled_kernel(CMat dense, CMat emb,
                                                                      int features, Mat out,
                                                                      BF16Copy copy, bool staged) {
  // [Fp, D + 4], Fp = features rounded up to 4, each group of 4 rows 4 floats further on
  // (load_features4's group_pad); pad rows zero. Then, where staged, the row's pairs [P].
  extern __shared__ float zs[];
  const std::int64_t b = blockIdx.x;
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 4;
  const int fp = (features + 3) / 4 * 4;
  float* pairs_row = zs + tiled_forward_floats(fp, D);
  const float* drow = dense.data + b * dense.ld;
  const OutRow orow = out_row(out, copy, b);
  orow.zero_tail(static_cast<int>(out.cols), copy.ld);
  load_features4(drow, emb.data + b * emb.ld, features, D, stride, zs, 4);
  for (int idx = threadIdx.x; idx < (fp - features) * D; idx += blockDim.x) {
    const int f = features + idx / D;
    zs[f * stride + (f / 4) * 4 + idx % D] = 0.0f;
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) orow.put(d, drow[d]);
  __syncthreads();
  const int blocks = fp / 4;
  const int tiles = blocks * (blocks + 1) / 2;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    int bi, bj;
    tile_of(t, bi, bj);
    float acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
    }
    const float* zi = zs + 4 * bi * stride + 4 * bi;
    const float* zj = zs + 4 * bj * stride + 4 * bj;
    for (int d = 0; d < D; d += 4) {
      float4 a[4], c[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a[r] = *reinterpret_cast<const float4*>(zi + r * stride + d);
        c[r] = *reinterpret_cast<const float4*>(zj + r * stride + d);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[r][q] = fmaf(a[r].x, c[q].x, acc[r][q]);
          acc[r][q] = fmaf(a[r].y, c[q].y, acc[r][q]);
          acc[r][q] = fmaf(a[r].z, c[q].z, acc[r][q]);
          acc[r][q] = fmaf(a[r].w, c[q].w, acc[r][q]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = 4 * bi + r, j = 4 * bj + q;
        if (i >= features || j >= i) continue;
        if (staged) {
          pairs_row[i * (i - 1) / 2 + j] = acc[r][q];
        } else {
          orow.put(D + i * (i - 1) / 2 + j, acc[r][q]);
        }
      }
    }
  }
  if (!staged) return;
  __syncthreads();
  const int pairs = features * (features - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) orow.put(D + p, pairs_row[p]);
}

__global__ __launch_bounds__(kDotBackwardBlock) void dot_backward_tiled_kernel(
    CMat dense, CMat emb, int features, CMat dout, Mat ddense, Mat demb, bool staged) {
  extern __shared__ float sm[];
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 4;
  const int fp = (features + 3) / 4 * 4;
  float* zs = sm;                      // [F, D + 4]
  float* gs = sm + features * stride;  // [F, Fp]: G (symmetric, zero diagonal), pad columns zero
  const std::int64_t b = blockIdx.x;
  const float* grow = dout.data + b * dout.ld;
  load_features4(dense.data + b * dense.ld, emb.data + b * emb.ld, features, D, stride, zs);
  if (staged) {
    // The row's pair gradients [P] after G, read in order; G's layout then reads shared memory.
    float* pairs_row = gs + features * fp;
    const int pairs = features * (features - 1) / 2;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) pairs_row[p] = grow[D + p];
    __syncthreads();
    load_pair_gradients(pairs_row, features, fp, gs);
  } else {
    load_pair_gradients(grow + D, features, fp, gs);
  }
  __syncthreads();
  const int kblocks = fp / 4, dblocks = D / 4;
  for (int t = threadIdx.x; t < kblocks * dblocks; t += blockDim.x) {
    const int kb = t / dblocks, d = (t - kb * dblocks) * 4;
    float acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
    }
    for (int j = 0; j < features; ++j) {
      const float4 g = *reinterpret_cast<const float4*>(gs + j * fp + 4 * kb);  // G[k][j], 4 k
      const float4 z = *reinterpret_cast<const float4*>(zs + j * stride + d);
      const float gv[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[r][0] = fmaf(gv[r], z.x, acc[r][0]);
        acc[r][1] = fmaf(gv[r], z.y, acc[r][1]);
        acc[r][2] = fmaf(gv[r], z.z, acc[r][2]);
        acc[r][3] = fmaf(gv[r], z.w, acc[r][3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int k = 4 * kb + r;
      if (k >= features) continue;
      if (k == 0) {
        float* dst = ddense.data + b * ddense.ld + d;
        for (int e = 0; e < 4; ++e) dst[e] = dense_gradient(grow[d + e], acc[r][e]);
      } else {
        *reinterpret_cast<float4*>(demb.data + b * demb.ld + (k - 1) * D + d) =
            make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      }
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}
// Whether the 4-column kernels apply: D % 4 == 0 and every row of these views 16-byte aligned.
bool by_four(CMat dense, CMat emb, std::initializer_list<CMat> more = {}) {
  if (dense.cols % 4 != 0) return false;
  for (const CMat& m : {dense, emb})
    if (!aligned16(m.data) || m.ld % 4 != 0) return false;
  for (const CMat& m : more)
    if (!aligned16(m.data) || m.ld % 4 != 0) return false;
  return true;
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

void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out, BF16Copy copy) {
  if (dense.rows <= 0) return;
  if (copy.data != nullptr && (copy.ld < out.cols || copy.ld - out.cols >= 8))
    throw Error(cat("dot_interaction_forward: a bf16 copy of ld ", copy.ld, " for ", out.cols,
                    " columns; expected the columns rounded up to a multiple of 8"));
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  if (by_four(dense, emb) && features >= kTiledFeatures) {
    const int fp = (features + 3) / 4 * 4;
    std::size_t smem = tiled_forward_floats(fp, dim) * sizeof(float);
    check_dot_smem("dot_interaction_forward", smem, features, dim);
    const std::size_t staged_smem = smem + pair_count(features) * sizeof(float);
    const bool staged = staged_smem <= device_info().shared_memory_per_block_optin;
    if (staged) smem = staged_smem;
    const int tiles = fp / 4 * (fp / 4 + 1) / 2;
    return launch("dot_interaction_forward", dot_forward_tiled_kernel,
                  {dense.rows, dot_threads(tiles), smem}, s, dense, emb, features, out, copy,
                  staged);
  }
  if (by_four(dense, emb)) {
    const std::size_t smem = dot_forward_smem(features, dim + 3);  // rows of D + 4
    check_dot_smem("dot_interaction_forward", smem, features, dim);
    return launch("dot_interaction_forward", dot_forward4_kernel,
                  {dense.rows, dot_threads(pair_count(features)), smem}, s, dense, emb, features,
                  out, copy);
  }
  const std::size_t smem = dot_forward_smem(features, dim);
  check_dot_smem("dot_interaction_forward", smem, features, dim);
  launch("dot_interaction_forward", dot_forward_kernel,
         {dense.rows, dot_threads(pair_count(features)), smem}, s, dense, emb, features, out, copy);
}

void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                  Mat demb) {
  if (dense.rows <= 0) return;
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  if (by_four(dense, emb, {demb}) && features >= kTiledFeatures) {
    const int fp = (features + 3) / 4 * 4;
    std::size_t smem =
        (static_cast<std::size_t>(features) * (dim + 4) + static_cast<std::size_t>(features) * fp) *
        sizeof(float);
    check_dot_smem("dot_interaction_backward", smem, features, dim);
    const std::size_t staged_smem = smem + pair_count(features) * sizeof(float);
    const bool staged = staged_smem <= device_info().shared_memory_per_block_optin;
    if (staged) smem = staged_smem;
    // At least kDotBlock threads: laying out G takes as long as the tiles, and fewer slowed it.
    const std::int64_t items = std::int64_t{fp / 4} * (dim / 4);
    const int threads = items <= kDotBackwardBlock
                            ? std::max(kDotBlock, dot_threads(items, kDotBackwardBlock))
                            : kDotBlock;
    return launch("dot_interaction_backward", dot_backward_tiled_kernel,
                  {dense.rows, threads, smem}, s, dense, emb, features, dout, ddense, demb, staged);
  }
  if (by_four(dense, emb, {demb})) {
    const std::size_t smem = dot_backward_smem(features, dim + 4);  // rows of D + 4
    check_dot_smem("dot_interaction_backward", smem, features, dim);
    return launch("dot_interaction_backward", dot_backward4_kernel,
                  {dense.rows, dot_threads(std::int64_t{features} * (dim / 4)), smem}, s, dense,
                  emb, features, dout, ddense, demb);
  }
  const std::size_t smem = dot_backward_smem(features, dim);
  check_dot_smem("dot_interaction_backward", smem, features, dim);
  launch("dot_interaction_backward", dot_backward_kernel,
         {dense.rows, dot_threads(std::int64_t{features} * dim), smem}, s, dense, emb, features,
         dout, ddense, demb);
}

}  // namespace parity::gpu
