// Column sums (see column_sum.h). Pass 1: a block of 32 columns x 8 row lanes over one chunk of
// rows writes partial[chunk, col] in double. Pass 2: per column, the partials in chunk order.
#include "backend/gpu/column_sum.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/gpu/column_sum.cuh"
#include "backend/gpu/fill.h"

namespace parity::gpu {

namespace {

using namespace elementwise;

constexpr int kColTile = 32;
constexpr int kRowLanes = kBlock / kColTile;
constexpr std::int64_t kRowsPerChunkMin = 64;
constexpr std::int64_t kMaxChunks = 1024;

struct ColumnSplit {
  std::int64_t chunks = 1;
  std::int64_t rows_per_chunk = 1;
  std::int64_t col_tiles = 1;
};
ColumnSplit column_split(std::int64_t rows, std::int64_t cols) {
  ColumnSplit s;
  s.chunks = std::clamp<std::int64_t>(ceil_div(rows, kRowsPerChunkMin), 1, kMaxChunks);
  s.rows_per_chunk = std::max<std::int64_t>(1, ceil_div(rows, s.chunks));
  s.chunks = std::max<std::int64_t>(1, ceil_div(rows, s.rows_per_chunk));
  s.col_tiles = ceil_div(cols, kColTile);
  return s;
}

__global__ __launch_bounds__(kBlock) void column_partial_kernel(CMat m, std::int64_t col_tiles,
                                                                std::int64_t rows_per_chunk,
                                                                double* __restrict__ partial) {
  __shared__ double sh[kRowLanes][kColTile];
  const std::int64_t tile = blockIdx.x % col_tiles;
  const std::int64_t chunk = blockIdx.x / col_tiles;
  const int tx = static_cast<int>(threadIdx.x) % kColTile;
  const int ly = static_cast<int>(threadIdx.x) / kColTile;
  const std::int64_t c = tile * kColTile + tx;
  const std::int64_t r0 = chunk * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < m.rows ? r0 + rows_per_chunk : m.rows;
  double acc = 0.0;
  if (c < m.cols) {
    for (std::int64_t r = r0 + ly; r < r1; r += kRowLanes) {
      acc += static_cast<double>(m.data[r * m.ld + c]);
    }
  }
  sh[ly][tx] = acc;
  __syncthreads();
  if (ly == 0 && c < m.cols) {
    double t = sh[0][tx];
    for (int k = 1; k < kRowLanes; ++k) t += sh[k][tx];
    partial[chunk * m.cols + c] = t;
  }
}

// Columns per block of pass 2: enough lanes per column that each adds about kPartialsPerLane
// partials (a long serial sum per column is latency-bound on a few dozen blocks), then as many
// columns as the block has room for (at most kColTile).
constexpr std::int64_t kPartialsPerLane = 16;
int final_columns_per_block(std::int64_t chunks, std::int64_t cols) {
  int lanes = 1;
  while (lanes < kBlock && lanes * kPartialsPerLane < chunks) lanes *= 2;
  int cpb = 1;
  while (cpb < kColTile && cpb < cols && cpb * 2 * lanes <= kBlock) cpb *= 2;
  return cpb;
}

// Pass 2: a block takes `cpb` columns (a power of two up to 32); its kBlock / cpb lanes per column
// add strided subsets of the chunks in index order, then a fixed tree in shared memory adds the
// lanes: the same order on every run, and enough threads that a [B, 1] column is not a long
// serial loop.
__global__ __launch_bounds__(kBlock) void column_final_kernel(const double* __restrict__ partial,
                                                              std::int64_t chunks,
                                                              std::int64_t cols, int cpb,
                                                              float* __restrict__ out) {
  __shared__ double sh[kBlock];
  const int lanes = kBlock / cpb;
  const int lane = static_cast<int>(threadIdx.x) / cpb;
  const int tx = static_cast<int>(threadIdx.x) - lane * cpb;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * cpb + tx;
  double t = 0.0;
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t k = lane; k < chunks; k += lanes) t += partial[k * cols + c];
  }
  sh[threadIdx.x] = t;
  __syncthreads();
  for (int half = lanes / 2; half > 0; half /= 2) {
    if (lane < half) sh[threadIdx.x] += sh[threadIdx.x + half * cpb];
    __syncthreads();
  }
  if (lane == 0 && c < cols) out[c] = static_cast<float>(sh[threadIdx.x]);
}

void final_sums(Stream_t s, const char* name, const double* partial, std::int64_t chunks,
                std::int64_t cols, float* out) {
  const int cpb = final_columns_per_block(chunks, cols);
  launch(name, column_final_kernel, {ceil_div(cols, cpb), kBlock, 0}, s, partial, chunks, cols, cpb,
         out);
}

}  // namespace

std::int64_t column_sum_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  const ColumnSplit sp = column_split(rows, cols);
  return sp.chunks * std::max<std::int64_t>(cols, 1) * static_cast<std::int64_t>(sizeof(double));
}

void column_sum(Stream_t s, CMat m, float* out, void* scratch) {
  if (m.cols <= 0) return;
  if (m.rows <= 0) {
    fill(s, out, m.cols, 0.0f);
    return;
  }
  const ColumnSplit sp = column_split(m.rows, m.cols);
  auto* partial = static_cast<double*>(scratch);
  launch("column_sum_partial", column_partial_kernel, {sp.col_tiles * sp.chunks, kBlock, 0}, s, m,
         sp.col_tiles, sp.rows_per_chunk, partial);
  final_sums(s, "column_sum_final", partial, sp.chunks, m.cols, out);
}

std::int64_t gradient_sums_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  std::int64_t partials = 0;
  for (int v : {1, 4, 8})
    partials = std::max(partials, device_fold_shape(rows, cols, v).partials());
  return std::max(
      column_sum_scratch_bytes(rows, cols),
      partials * std::max<std::int64_t>(cols, 1) * static_cast<std::int64_t>(sizeof(double)));
}

namespace elementwise {
FoldShape device_fold_shape(std::int64_t rows, std::int64_t cols, int v) {
  const DeviceInfo& d = device_info();
  return fold_shape(
      rows, cols, v,
      static_cast<std::int64_t>(d.multiprocessor_count) * d.max_threads_per_multiprocessor);
}

void folded_column_sums(Stream_t s, const char* name, const FoldShape& f, std::int64_t cols,
                        const void* scratch, float* out) {
  final_sums(s, name, static_cast<const double*>(scratch), f.partials(), cols, out);
}
}  // namespace elementwise

}  // namespace parity::gpu
