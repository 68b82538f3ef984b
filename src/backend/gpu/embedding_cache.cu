// The bookkeeping of host-placed tables' HBM caches (TableLayout::host): counting lookups, and
// moving rows between a cache and host memory.
//
// Why it is built this way: both run off the step's critical path or beside it. The count is one
// pass over a host-placed table's ids (its CSR range, read from the offsets on the device, so the
// host never waits): integer atomics per row, whose sum does not depend on their order, and one
// pair of 64-bit atomics per block for the hit totals. The copy moves whole rows (and their
// optimizer state) between HBM and host memory over the host link, one thread per 4-byte (or
// 2-byte) word, so that each warp reads and writes contiguous runs of a row.
#include <algorithm>
#include <string>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/embedding.h"
#include "backend/gpu/launch.h"
#include "parity/error.h"

namespace parity::gpu {

namespace {

using elementwise::global_index;
using elementwise::grid_for;
using elementwise::grid_stride;
using elementwise::kBlock;

__global__ __launch_bounds__(kBlock) void cache_observe_kernel(
    const std::int64_t* __restrict__ ids, const std::int64_t* __restrict__ offsets,
    std::int64_t first_bag, std::int64_t end_bag, std::int64_t nnz, std::int64_t rows,
    const std::uint32_t* __restrict__ slot, std::uint32_t* __restrict__ counts,
    unsigned long long* __restrict__ stats) {
  __shared__ unsigned long long block_hits, block_lookups;
  if (threadIdx.x == 0) block_hits = block_lookups = 0;
  __syncthreads();
  // Offsets outside [0, nnz] or decreasing are the embedding kernels' to report: none read here.
  std::int64_t lo = offsets[first_bag], hi = offsets[end_bag];
  lo = lo < 0 ? 0 : (lo > nnz ? nnz : lo);
  hi = hi < lo ? lo : (hi > nnz ? nnz : hi);
  unsigned long long hits = 0, lookups = 0;
  for (std::int64_t j = lo + global_index(); j < hi; j += grid_stride()) {
    const std::int64_t id = ids[j];
    if (id < 0 || id >= rows) continue;  // the embedding ops record it
    ++lookups;
    hits += slot[id] != TableLayout::kNotCached ? 1 : 0;
    if (counts != nullptr) {
      // Saturating: a count that wrapped is set back to the largest value.
      if (atomicAdd(counts + id, 1u) == 0xffffffffu) atomicMax(counts + id, 0xffffffffu);
    }
  }
  if (lookups > 0) {
    atomicAdd(&block_hits, hits);
    atomicAdd(&block_lookups, lookups);
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_lookups > 0) {
    atomicAdd(stats, block_hits);
    atomicAdd(stats + 1, block_lookups);
  }
}

// Element k of the copy: cache row i = k / per, word k % per (the row's words, then its state).
template <class U>
__global__ __launch_bounds__(kBlock) void cache_copy_kernel(
    U* __restrict__ cache, U* __restrict__ host, const std::int64_t* __restrict__ cached,
    std::int64_t cache_rows, std::int64_t rows, std::int64_t row_words, float* __restrict__ cstate,
    float* __restrict__ hstate, std::int64_t state_per_row, bool to_cache) {
  const std::int64_t per = row_words + state_per_row;
  const std::int64_t n = cache_rows * per;
  for (std::int64_t k = global_index(); k < n; k += grid_stride()) {
    const std::int64_t i = k / per, w = k - i * per;
    const std::int64_t r = cached[i];
    if (r < 0 || r >= rows) continue;
    if (w < row_words) {
      U* c = cache + i * row_words + w;
      U* h = host + r * row_words + w;
      if (to_cache)
        *c = *h;
      else
        *h = *c;
    } else {
      float* c = cstate + i * state_per_row + (w - row_words);
      float* h = hstate + r * state_per_row + (w - row_words);
      if (to_cache)
        *c = *h;
      else
        *h = *c;
    }
  }
}

}  // namespace

void embedding_cache_observe(Stream_t stream, const TableLayout& table, int t,
                             const DeviceSparseInput& in, std::uint32_t* counts,
                             std::uint64_t* stats) {
  if (!table.host_placed() || table.host.slot == nullptr)
    throw InputError("embedding_cache_observe: table " + std::to_string(t) + " is not host-placed");
  if (in.batch == 0 || in.nnz == 0) return;
  const std::int64_t first = static_cast<std::int64_t>(t) * in.batch;
  // Enough blocks for the table's share of the ids (the offsets that bound it are on the device).
  const std::int64_t share = in.nnz / std::max(1, in.num_tables) + 1;
  launch("embedding_cache_observe", cache_observe_kernel, {grid_for(share), kBlock, 0}, stream,
         in.ids, in.offsets, first, first + in.batch, in.nnz, table.rows, table.host.slot, counts,
         reinterpret_cast<unsigned long long*>(stats));
}

void embedding_cache_copy(Stream_t stream, const TableLayout& table, void* weights, float* state,
                          std::int64_t state_per_row, bool to_cache) {
  if (!table.host_placed())
    throw InputError("embedding_cache_copy: the table is not host-placed (TableLayout::host)");
  if (table.host.cache_rows == 0) return;
  if (weights == nullptr) throw InputError("embedding_cache_copy: the weight buffer is null");
  if (state_per_row > 0 && (state == nullptr || table.host.state == nullptr))
    throw InputError("embedding_cache_copy: the table's optimizer keeps state, and it is null");
  const std::int64_t row_bytes = table.dim * static_cast<std::int64_t>(dtype_size(table.dtype));
  auto* cache = static_cast<std::byte*>(weights) +
                table.weight_offset * static_cast<std::int64_t>(dtype_size(table.dtype));
  float* cstate = state_per_row > 0 ? state + table.state_offset : nullptr;
  const std::int64_t n = table.host.cache_rows;
  if (row_bytes % 4 == 0) {
    launch("embedding_cache_copy", cache_copy_kernel<std::uint32_t>,
           {grid_for(n * (row_bytes / 4 + state_per_row)), kBlock, 0}, stream,
           reinterpret_cast<std::uint32_t*>(cache), static_cast<std::uint32_t*>(table.host.weights),
           table.host.cached, n, table.rows, row_bytes / 4, cstate, table.host.state, state_per_row,
           to_cache);
  } else {
    launch("embedding_cache_copy", cache_copy_kernel<std::uint16_t>,
           {grid_for(n * (row_bytes / 2 + state_per_row)), kBlock, 0}, stream,
           reinterpret_cast<std::uint16_t*>(cache), static_cast<std::uint16_t*>(table.host.weights),
           table.host.cached, n, table.rows, row_bytes / 2, cstate, table.host.state, state_per_row,
           to_cache);
  }
}

}  // namespace parity::gpu
