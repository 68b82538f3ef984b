// Device-wide exclusive scan of 32-bit counts, portable across warp sizes (32 and 64), used by the
// portable radix sort (digit histograms) and by the embedding backward (segment compaction).
//
// Why it is built this way: three launches (reduce tiles, scan tile sums in one block, scan tiles
// again) need no inter-block communication inside a launch, so they are correct on any GPU and
// deterministic, and they cost about three passes over the counts, which are small next to the
// data they describe. The element count may live on the device (n_dev): the grid is sized for the
// host's upper bound and blocks past the device's count return at once, so no host
// synchronisation is needed between producer and scan.
//
// Load is a device functor `uint32_t operator()(int64_t i) const`; Store is
// `void operator()(int64_t i, uint32_t exclusive_prefix, uint32_t value) const`.
#pragma once

#include <cstdint>

#include "backend/gpu/launch.h"
#include "backend/gpu/port.h"

namespace parity::gpu::scan {

inline constexpr int kThreads = 256;
inline constexpr int kItems = 16;  // items per thread
inline constexpr std::int64_t kTile = kThreads * kItems;

inline std::int64_t tiles_for(std::int64_t n) {
  return n <= 0 ? 1 : ceil_div(n, kTile);
}

#if defined(PARITY_GPU_COMPILER)

inline constexpr int kWarps = kThreads / kWarpSize;

// Exclusive scan of one value per thread of a kThreads block; total gets the block's sum.
// smem holds kWarps + 1 words. Every thread of the block must call it.
__device__ __forceinline__ std::uint32_t block_exclusive_scan(std::uint32_t v, std::uint32_t& total,
                                                              std::uint32_t* smem) {
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  std::uint32_t x = v;
#pragma unroll
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const std::uint32_t y = shfl_up(kFullMask, x, d);
    if (lane >= d) x += y;
  }
  if (lane == kWarpSize - 1) smem[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const std::uint32_t t = lane < kWarps ? smem[lane] : 0u;
    std::uint32_t s = t;
#pragma unroll
    for (int d = 1; d < kWarps; d <<= 1) {
      const std::uint32_t y = shfl_up(kFullMask, s, d);
      if (lane >= d) s += y;
    }
    if (lane < kWarps) smem[lane] = s - t;
    if (lane == kWarps - 1) smem[kWarps] = s;
  }
  __syncthreads();
  const std::uint32_t excl = x - v + smem[warp];
  total = smem[kWarps];
  __syncthreads();  // smem may be reused by the caller
  return excl;
}

__device__ __forceinline__ std::int64_t count_of(std::int64_t n_max, const int* n_dev) {
  if (n_dev == nullptr) return n_max;
  const std::int64_t n = *n_dev;
  return n < n_max ? n : n_max;
}

template <class Load>
__global__ __launch_bounds__(kThreads) void reduce_tiles_kernel(Load load, std::int64_t n_max,
                                                                const int* n_dev,
                                                                std::uint32_t* tile_sums) {
  __shared__ std::uint32_t smem[kWarps + 1];
  const std::int64_t n = count_of(n_max, n_dev);
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kTile;
  if (base >= n) return;
  std::uint32_t s = 0;  // a sum: any order, so striped (coalesced) loads
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const std::int64_t i = base + k * kThreads + threadIdx.x;
    if (i < n) s += load(i);
  }
  std::uint32_t total = 0;
  (void)block_exclusive_scan(s, total, smem);
  if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// One block: tile_sums[0 .. tiles) becomes its exclusive scan; *total_out gets the sum.
// (A template so that every file including this header shares one definition.)
template <int kUnused = 0>
__global__ __launch_bounds__(kThreads) void scan_tile_sums_kernel(std::uint32_t* tile_sums,
                                                                  std::int64_t n_max,
                                                                  const int* n_dev,
                                                                  std::uint32_t* total_out) {
  __shared__ std::uint32_t smem[kWarps + 1];
  const std::int64_t n = count_of(n_max, n_dev);
  const std::int64_t tiles = n <= 0 ? 0 : (n + kTile - 1) / kTile;
  std::uint32_t carry = 0;
  for (std::int64_t c = 0; c < tiles; c += kThreads) {
    const std::int64_t i = c + threadIdx.x;
    const std::uint32_t v = i < tiles ? tile_sums[i] : 0u;
    std::uint32_t total = 0;
    const std::uint32_t excl = block_exclusive_scan(v, total, smem);
    if (i < tiles) tile_sums[i] = carry + excl;
    carry += total;
  }
  if (threadIdx.x == 0 && total_out != nullptr) *total_out = carry;
}

// Tile position with one word of padding every 32: a thread's kItems consecutive words then fall
// in different banks.
__device__ __forceinline__ int padded(int x) {
  return x + (x >> 5);
}

// The tile is loaded and stored in striped order (coalesced: lane l of a warp touches element
// base + k * kThreads + l) and scanned in blocked order (thread t owns kItems consecutive
// elements), through shared memory.
template <class Load, class Store>
__global__ __launch_bounds__(kThreads) void scan_tiles_kernel(Load load, Store store,
                                                              std::int64_t n_max, const int* n_dev,
                                                              const std::uint32_t* tile_prefix) {
  constexpr int kPadded = static_cast<int>(kTile) + static_cast<int>(kTile) / 32;
  __shared__ std::uint32_t vals[kPadded];
  __shared__ std::uint32_t pre[kPadded];
  __shared__ std::uint32_t smem[kWarps + 1];
  const std::int64_t n = count_of(n_max, n_dev);
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kTile;
  if (base >= n) return;
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int local = k * kThreads + tid;
    vals[padded(local)] = base + local < n ? load(base + local) : 0u;
  }
  __syncthreads();
  std::uint32_t s = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) s += vals[padded(tid * kItems + k)];
  std::uint32_t total = 0;
  std::uint32_t prefix = block_exclusive_scan(s, total, smem) + tile_prefix[blockIdx.x];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int idx = padded(tid * kItems + k);
    pre[idx] = prefix;
    prefix += vals[idx];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int local = k * kThreads + tid;
    if (base + local < n) store(base + local, pre[padded(local)], vals[padded(local)]);
  }
}

// Exclusive scan of load(i) for i in [0, n), n = min(n_max, *n_dev) (or n_max when n_dev is
// null): store(i, prefix, value) for each i; *total_out (if not null) gets the total.
// tile_sums holds tiles_for(n_max) words of scratch.
template <class Load, class Store>
void exclusive_scan(Stream_t stream, const char* name, std::int64_t n_max, const int* n_dev,
                    Load load, Store store, std::uint32_t* tile_sums, std::uint32_t* total_out) {
  const std::int64_t tiles = tiles_for(n_max);
  if (n_max > 0)
    launch(name, reduce_tiles_kernel<Load>, {tiles, kThreads, 0}, stream, load, n_max, n_dev,
           tile_sums);
  launch(name, scan_tile_sums_kernel<>, {1, kThreads, 0}, stream, tile_sums, n_max, n_dev,
         total_out);
  if (n_max > 0) {
    launch(name, scan_tiles_kernel<Load, Store>, {tiles, kThreads, 0}, stream, load, store, n_max,
           n_dev, static_cast<const std::uint32_t*>(tile_sums));
  }
}

#endif  // PARITY_GPU_COMPILER

}  // namespace parity::gpu::scan
