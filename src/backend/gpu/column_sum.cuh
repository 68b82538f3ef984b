// Column sums folded into an elementwise pass (relu_backward, cross_gradients), so that the
// values summed are not read again. Included by .cu files only.
//
// Each thread owns one group of V columns of a row lane and keeps its column sums in double across
// the rows it visits: a block of kSumBlock threads holds kSumBlock / tpr row lanes (tpr = threads
// per row, a power of two covering the row's groups), lane l of block b takes rows b * rpb + l,
// + grid * rpb, ... At the end the block adds its lanes' sums in shared memory (a fixed tree) and
// writes one double partial per column (each lane writes its own where a block has fewer than
// kBlockSumLanes); folded_column_sums adds the partials in a fixed order. One group per thread
// keeps the accumulators to V doubles: more groups per thread in smaller blocks left fewer warps in
// flight than the pass needs. One partial per block rather than per lane: with 1024 lanes the
// second pass read 8 MB for 1024 columns and took 10 us a layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu::elementwise {

inline constexpr int kSumBlock = 1024;
inline constexpr std::int64_t kSumLanes = 1024;  // row lanes in all
// From this many lanes a block (narrow rows) the block adds its lanes before writing: for wide
// rows (a block of one or two lanes) the tree only lengthens the block's tail.
inline constexpr int kBlockSumLanes = 4;

struct FoldShape {
  int tpr = 1, rpb = 1;
  std::int64_t grid = 1;
  std::int64_t lanes() const { return grid * rpb; }
  // Partial sums per column: one per block where a block holds kBlockSumLanes lanes or more, else
  // one per lane.
  std::int64_t partials() const { return rpb >= kBlockSumLanes ? grid : grid * rpb; }
};
inline bool fused_sum_fits(std::int64_t rows, std::int64_t cols, int v) {
  // The row walk counts in int and steps by at most 2 kSumLanes past the last row.
  return cols / v <= kSumBlock && rows <= std::numeric_limits<int>::max() - 2 * kSumLanes;
}
inline FoldShape fold_shape(std::int64_t rows, std::int64_t cols, int v) {
  FoldShape f;
  while (f.tpr < kSumBlock && f.tpr < cols / v) f.tpr *= 2;
  f.rpb = kSumBlock / f.tpr;
  const std::int64_t lanes = std::min(std::max<std::int64_t>(rows, 1), kSumLanes);
  f.grid = std::max<std::int64_t>(1, ceil_div(lanes, f.rpb));
  return f;
}

// The second pass of a folded kernel's column sums: out[c] = the lanes' partials of column c
// (scratch, written by rows_with_column_sums) added in a fixed order. `name` names the launch.
void folded_column_sums(Stream_t s, const char* name, const FoldShape& f, std::int64_t cols,
                        const void* scratch, float* out);

// The row walk of the folded kernels: calls f(r, c, d) for the thread's group of every row it
// visits, f writing the group's V values to sum into d, and writes its block's column sums,
// partial[block * cols + col] (or its lane's, partial[lane * cols + col]: FoldShape::partials).
// Every thread of the block must call it (it synchronises the block).
template <int V, class F>
__device__ __forceinline__ void rows_with_column_sums(std::int64_t rows, std::int64_t cols, int tpr,
                                                      double* __restrict__ partial, F&& f) {
  __shared__ double lanes[kSumBlock];
  const int sub = static_cast<int>(threadIdx.x) / tpr;
  const int grp = static_cast<int>(threadIdx.x) - sub * tpr;
  const int rpb = kSumBlock / tpr;
  const bool active = static_cast<std::int64_t>(grp) * V < cols;
  // 32-bit row indices (fused_sum_fits): fewer registers under the 64 a 1024-thread block allows.
  const int lane = static_cast<int>(blockIdx.x) * rpb + sub;
  const int c = grp * V;
  double acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0;
  const int step = static_cast<int>(gridDim.x) * rpb;
  const int nrows = active ? static_cast<int>(rows) : 0;
  for (int r = lane; r < nrows; r += step) {
    float d[V];
    f(r, c, d);
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] += static_cast<double>(d[i]);
  }
  if (rpb < kBlockSumLanes) {  // the same for the whole block
    if (active) {
#pragma unroll
      for (int i = 0; i < V; ++i) partial[static_cast<std::int64_t>(lane) * cols + c + i] = acc[i];
    }
    return;
  }
  // The block's rpb lanes added per column: a tree over the lanes, one column of each group at a
  // time.
#pragma unroll
  for (int i = 0; i < V; ++i) {
    lanes[threadIdx.x] = acc[i];
    __syncthreads();
    for (int half = rpb / 2; half > 0; half /= 2) {
      if (sub < half) lanes[threadIdx.x] += lanes[threadIdx.x + half * tpr];
      __syncthreads();
    }
    if (sub == 0 && active)
      partial[static_cast<std::int64_t>(blockIdx.x) * cols + c + i] = lanes[threadIdx.x];
    __syncthreads();
  }
}

}  // namespace parity::gpu::elementwise
