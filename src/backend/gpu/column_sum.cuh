// Column sums folded into an elementwise pass (relu_backward, cross_gradients), so that the
// values summed are not read again. Included by .cu files only.
//
// Each thread owns one group of V columns of a row lane and keeps its column sums in double across
// the rows it visits. A row's groups are cut into column tiles of tpr groups (threads per row, a
// power of two); a block of kSumBlock threads holds rpb = kSumBlock / tpr row lanes of one tile,
// and row block b takes rows b * rpb + l, + row_blocks * rpb, ... At the end the block adds its
// lanes' sums in shared memory (a fixed tree) and writes one double partial per column (each lane
// writes its own where a block has fewer than kBlockSumLanes); folded_column_sums adds the
// partials in a fixed order. One group per thread keeps the accumulators to V doubles (more groups
// per thread in smaller blocks left fewer warps in flight than the pass needs); tiles keep a wide
// row (a cross layer over 75 tables: 1,216 groups) in the folded pass instead of writing fp32 dz
// and reading it back. One partial per block rather than per lane: with 1024 lanes the second
// pass read 8 MB for 1024 columns and took 10 us a layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu::elementwise {

inline constexpr int kSumBlock = 1024;
// Row lanes at least: enough rows summed per lane that the partials stay small next to the pass.
inline constexpr std::int64_t kSumLanes = 1024;
// From this many lanes a block (narrow rows) the block adds its lanes before writing: for wide
// rows (a block of one or two lanes) the tree only lengthens the block's tail.
inline constexpr int kBlockSumLanes = 4;

struct FoldShape {
  int tpr = 1, rpb = 1;
  std::int64_t tiles = 1;       // column tiles of tpr groups
  std::int64_t row_blocks = 1;  // blocks per tile
  std::int64_t grid() const { return row_blocks * tiles; }
  std::int64_t lanes() const { return row_blocks * rpb; }
  // Partial sums per column: one per row block where a block holds kBlockSumLanes lanes or more,
  // else one per lane.
  std::int64_t partials() const { return rpb >= kBlockSumLanes ? row_blocks : lanes(); }
};
inline bool fused_sum_fits(std::int64_t rows, std::int64_t cols, int /*v*/) {
  // Rows and columns count in int; the row walk steps by at most rows + kSumBlock past the last.
  const std::int64_t limit = std::numeric_limits<int>::max() / 2 - kSumBlock;
  return rows <= limit && cols <= limit;
}
// `resident_threads`: threads the whole device holds at once (SMs x threads an SM); narrow rows
// get more lanes so that the pass fills the device, not only kSumLanes x tpr threads of it.
inline FoldShape fold_shape(std::int64_t rows, std::int64_t cols, int v,
                            std::int64_t resident_threads) {
  FoldShape f;
  const std::int64_t groups = std::max<std::int64_t>(ceil_div(cols, v), 1);
  if (groups <= kSumBlock) {
    while (f.tpr < groups) f.tpr *= 2;
  } else {
    // The tile width that leaves fewest threads idle in the last tile (the wider on a tie), from
    // 64 groups up: narrower tiles only multiply the partials.
    std::int64_t best_idle = std::numeric_limits<std::int64_t>::max();
    for (int t = 64; t <= kSumBlock; t *= 2) {
      const std::int64_t idle = ceil_div(groups, t) * t - groups;
      if (idle <= best_idle) best_idle = idle, f.tpr = t;
    }
  }
  f.tiles = ceil_div(groups, f.tpr);
  f.rpb = kSumBlock / f.tpr;
  const std::int64_t fill = ceil_div(std::max<std::int64_t>(resident_threads, 1), f.tpr * f.tiles);
  const std::int64_t lanes = std::min(std::max<std::int64_t>(rows, 1), std::max(kSumLanes, fill));
  f.row_blocks = std::max<std::int64_t>(1, ceil_div(lanes, f.rpb));
  return f;
}
// fold_shape on the current device.
FoldShape device_fold_shape(std::int64_t rows, std::int64_t cols, int v);

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
                                                      int tiles, double* __restrict__ partial,
                                                      F&& f) {
  __shared__ double lanes[kSumBlock];
  const int sub = static_cast<int>(threadIdx.x) / tpr;
  const int in_tile = static_cast<int>(threadIdx.x) - sub * tpr;
  const int rpb = kSumBlock / tpr;
  const int tile = static_cast<int>(blockIdx.x) % tiles;
  const int row_block = static_cast<int>(blockIdx.x) / tiles;
  const int c = (tile * tpr + in_tile) * V;
  const bool active = c < cols;
  // 32-bit row indices (fused_sum_fits): fewer registers under the 64 a 1024-thread block allows.
  const int lane = row_block * rpb + sub;
  double acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0;
  const int step = static_cast<int>(gridDim.x) / tiles * rpb;
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
      partial[static_cast<std::int64_t>(row_block) * cols + c + i] = lanes[threadIdx.x];
    __syncthreads();
  }
}

}  // namespace parity::gpu::elementwise
