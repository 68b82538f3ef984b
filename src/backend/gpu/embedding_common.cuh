// Pieces shared by the embedding forward and backward kernels: how lanes are grouped over a row,
// how a lane's elements map to columns, alignment tests, and input-error recording.
//
// Lane groups: a row of dim elements is read as dim/V vectors of 16 bytes (V = 4 floats or 8
// halves). A group of G lanes (a power of two <= warp size) owns one bag (forward) or one
// distinct row (backward); lane l of the group holds vectors l, l + G, ..., l + (kVecs-1)G. G and
// kVecs are chosen once per table group from the largest dim: the smallest G with G*kVecs*V >= dim,
// so small dims share a warp between several bags instead of idling lanes. When a table's rows
// (or the output or gradient rows) are not 16-byte aligned (dim not a multiple of V, odd offsets,
// odd ld) the group reads elements one by one instead: lane l holds columns l, l + G, ... .
#pragma once

#include <cstdint>

#include "backend/gpu/embedding.h"
#include "backend/gpu/numerics.h"
#include "backend/gpu/port.h"
#include "parity/embedding_kernels.h"
#include "parity/host_device.h"

namespace parity::gpu::detail {

inline constexpr int kBlock = 256;         // threads per block of every embedding kernel
inline constexpr int kMaxVecsPerLane = 4;  // dims up to 4 * warp size * V (512 fp32 on NVIDIA)
// Backward: a distinct row with more occurrences than kHeavyRow is summed in chunks of kChunk
// occurrences by many groups (partial sums), then the chunks are summed in chunk order.
inline constexpr int kHeavyRow = kEmbeddingHeavyRow;
inline constexpr int kChunk = 64;
// A heavy row's chunk sums are summed kMerge at a time (in order, by many groups) before the
// row's block sums those: the hottest Zipf rows have tens of thousands of chunks, which one block
// alone would take milliseconds to add.
inline constexpr int kMerge = 64;

// Blocks per multiprocessor the kernels ask the register allocator for (__launch_bounds__): as
// many as fit without spills for the common shapes (fp32 rows of up to 128 * warp/32 elements get
// 3 blocks, 80 registers), fewer for wide or 16-bit rows whose accumulators need more registers.
template <class W, int kVecs>
constexpr int min_blocks() {
  return kVecs >= 4 ? 1 : (kVecs == 1 && sizeof(W) == 4 ? 3 : 2);
}

// Lanes per group and vectors per lane, for a largest dim, a vector width V and a warp size.
struct GroupShape {
  int group = 1;
  int vecs = 1;
};
GroupShape group_shape(int max_dim, int vec_width, int warp_size);  // throws when dim is too large
// The backward's shape: by default 16 floats per lane (4 vectors of fp32, 2 of fp16/bf16) and as
// few lanes per row as that allows, so that a warp updates several rows at once: the update is
// latency-bound (index, gradient and row loads in a chain), and more rows in flight per warp is
// what hides it.
// vectors_per_lane (1, 2 or 4) overrides the default; it is raised when the dim needs more.
GroupShape backward_group_shape(int max_dim, int vec_width, int warp_size,
                                int vectors_per_lane = 0);

// The forward's short-bag kernel sums several bags per group of lanes, one accumulator each: at
// most as many as its rows in flight per lane (8 / vecs), and at most 32 floats of accumulators.
PARITY_HD constexpr int forward_max_bags(int vecs, int vec_width) {
  const int by_rows = 8 / vecs, by_regs = 32 / (vecs * vec_width);
  return by_rows < by_regs ? by_rows : by_regs;
}
// Its bags per group for a table of about ids_per_bag ids a bag (0: unknown), at vecs vectors of
// vec_width per lane: enough bags that the rows in flight come from several short bags; 1, 2, 4
// or 8, and 1 where the pooling is unknown or long.
int forward_bags_per_group(double ids_per_bag, int vecs, int vec_width);

// Checks shared by forward and backward (shapes, dtypes, sizes); throws InputError naming op.
void check_embedding_call(const char* op, const EmbeddingTables& tables,
                          const TableWeights& weights, const DeviceSparseInput& in, CAMat m,
                          const char* m_name);

#if defined(PARITY_GPU_COMPILER)

__device__ __forceinline__ bool aligned_to(const void* p, unsigned bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) == 0;
}

// Column of element (v, e) of a lane's registers: vector path, and scalar path.
__device__ __forceinline__ int vec_col(int glane, int v, int e, int group, int V) {
  return (glane + v * group) * V + e;
}
__device__ __forceinline__ int scalar_col(int glane, int v, int e, int group, int V) {
  return glane + (v * V + e) * group;
}

// The row store of the embedding kernels, written once: a lane's values of one row (vals[v][e],
// kVecs vectors of V elements at the lane's columns) go to row[column]. With vector access (vec;
// always under kFit > 0, where every column of the lane lies in the row) put stores one vector
// group, put(row + c, vals[v], c); else put_one stores one element, put_one(row + c, vals[v][e],
// c). Columns past dim are skipped.
template <int kVecs, int V, int kFit = 0, class T, class Put, class PutOne>
__device__ __forceinline__ void store_row(T* __restrict__ row, const float (&vals)[kVecs][V],
                                          bool vec, int glane, int group, int dim, Put&& put,
                                          PutOne&& put_one) {
  if (kFit > 0 || vec) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int c = vec_col(glane, v, 0, group, V);
      if (kFit > 0 || c < dim) put(row + c, vals[v], c);
    }
  } else {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int c = scalar_col(glane, v, e, group, V);
        if (c < dim) put_one(row + c, vals[v][e], c);
      }
    }
  }
}

__device__ __forceinline__ void record_input_error(InputErrorRecord* rec, int code, int table,
                                                   std::int64_t bag, std::int64_t id) {
  if (*reinterpret_cast<volatile int*>(&rec->code) != 0) return;
  if (atomicCAS(&rec->code, 0, code) == 0) {
    rec->table = table;
    rec->bag = bag;
    rec->id = id;
  }
}

#endif  // PARITY_GPU_COMPILER

}  // namespace parity::gpu::detail
