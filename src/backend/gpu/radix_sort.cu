// Stable radix sort of (uint32, uint32) pairs: CUB on CUDA, our own portable LSD sort on both
// vendors (see radix_sort.h for why).
#include "backend/gpu/radix_sort.h"

#include <algorithm>

#include "backend/gpu/launch.h"
#include "backend/gpu/scan.cuh"
#include "parity/perf.h"

#if defined(PARITY_GPU_CUDA)
#include <cub/device/device_radix_sort.cuh>
#endif

namespace parity::gpu {

std::string_view sort_method_name(SortMethod m) {
  switch (m) {
    case SortMethod::automatic:
      return "automatic";
    case SortMethod::vendor:
      return "vendor";
    case SortMethod::portable:
      return "portable";
  }
  return "?";
}

SortMethod resolve_sort_method(SortMethod m) {
#if defined(PARITY_GPU_CUDA)
  return m == SortMethod::automatic ? SortMethod::vendor : m;
#else
  if (m == SortMethod::vendor) {
    throw GpuError(
        "radix sort: no vendor sort on HIP (Debian 12 ships no hipCUB); use the portable sort");
  }
  return SortMethod::portable;
#endif
}

namespace {

constexpr int kSortThreads = 256;
constexpr int kSortItems = 16;  // consecutive rounds of one warp-wide load each
constexpr std::int64_t kSortTile = std::int64_t{kSortThreads} * kSortItems;
// The bytes the sort moves are counted on the host (radix_sort_bytes, parity/perf.h), per tile.
static_assert(kSortTile == kPortableSortTile,
              "radix_sort_bytes counts the digit counts of this tile");
constexpr int kRadix = 256;
static_assert(kSortThreads == kRadix, "one thread per digit in the per-tile steps");

std::int64_t sort_tiles(std::int64_t n) {
  return std::max<std::int64_t>(1, ceil_div(n, kSortTile));
}

// Lanes of this warp whose valid element has the same 8-bit digit as this lane's (0 if invalid).
// Every lane of the warp must call it.
__device__ __forceinline__ LaneMask match_digit(std::uint32_t digit, bool valid) {
  LaneMask peers = ballot(kFullMask, valid);
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const bool bit = (digit >> b) & 1u;
    const LaneMask m = ballot(kFullMask, bit);
    peers &= bit ? m : ~m;
  }
  return valid ? peers : LaneMask{0};
}

// The first index of this lane's items in its block's tile: each warp loads kSortItems rounds of
// kWarpSize consecutive keys (coalesced), lane l taking item l of each round.
__device__ __forceinline__ std::int64_t tile_base(int warp, int lane) {
  return static_cast<std::int64_t>(blockIdx.x) * kSortTile +
         static_cast<std::int64_t>(warp) * kWarpSize * kSortItems + lane;
}
// v[r] = src[base + r * kWarpSize], or 0 past n.
__device__ __forceinline__ void load_items(const std::uint32_t* __restrict__ src, std::int64_t base,
                                           std::int64_t n, std::uint32_t (&v)[kSortItems]) {
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    const std::int64_t i = base + static_cast<std::int64_t>(r) * kWarpSize;
    v[r] = i < n ? src[i] : 0u;
  }
}

// Item r of this lane (load_items): whether it exists, its digit at `shift`, and the lanes of the
// warp whose item r has the same digit. Every lane of the warp must call it.
struct ItemDigit {
  bool valid;
  std::uint32_t digit;
  LaneMask peers;
};
__device__ __forceinline__ ItemDigit item_digit(std::uint32_t key, std::int64_t base, int r,
                                                std::int64_t n, int shift) {
  const bool valid = base + static_cast<std::int64_t>(r) * kWarpSize < n;
  const std::uint32_t d = (key >> shift) & 0xffu;
  return {valid, d, match_digit(d, valid)};
}

// Digit counts of one tile: hist[digit * tiles + tile].
__global__ __launch_bounds__(kSortThreads) void radix_upsweep_kernel(
    const std::uint32_t* __restrict__ keys, std::int64_t n, int shift,
    std::uint32_t* __restrict__ hist, std::int64_t tiles) {
  __shared__ std::uint32_t counts[kRadix];
  counts[threadIdx.x] = 0;
  __syncthreads();
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const std::int64_t base = tile_base(warp, lane);
  std::uint32_t key[kSortItems];
  load_items(keys, base, n, key);
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    const ItemDigit it = item_digit(key[r], base, r, n, shift);
    const bool valid = it.valid;
    const std::uint32_t d = it.digit;
    const LaneMask peers = it.peers;
    if (valid && lowest_lane(peers) == lane)
      atomicAdd(&counts[d], static_cast<std::uint32_t>(popc(peers)));
  }
  __syncthreads();
  hist[static_cast<std::int64_t>(threadIdx.x) * tiles + blockIdx.x] = counts[threadIdx.x];
}

// Stable scatter of one tile: position = scanned digit offset of this tile + rank in the tile.
__global__ __launch_bounds__(kSortThreads) void radix_downsweep_kernel(
    const std::uint32_t* __restrict__ keys_in, const std::uint32_t* __restrict__ values_in,
    std::uint32_t* __restrict__ keys_out, std::uint32_t* __restrict__ values_out, std::int64_t n,
    int shift, const std::uint32_t* __restrict__ hist_scanned, std::int64_t tiles) {
  constexpr int kWarps = kSortThreads / kWarpSize;
  __shared__ std::uint32_t warp_counts[kWarps][kRadix];  // per-warp running counts, then positions
#pragma unroll
  for (int w = 0; w < kWarps; ++w) warp_counts[w][threadIdx.x] = 0;
  __syncthreads();
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const std::int64_t base = tile_base(warp, lane);
  std::uint32_t key[kSortItems];
  std::uint32_t value[kSortItems];
  std::uint32_t rank[kSortItems];
  load_items(keys_in, base, n, key);
  load_items(values_in, base, n, value);
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    const ItemDigit it = item_digit(key[r], base, r, n, shift);
    const bool valid = it.valid;
    const std::uint32_t d = it.digit;
    const LaneMask peers = it.peers;
    const std::uint32_t before = valid ? warp_counts[warp][d] : 0u;
    sync_warp();
    if (valid && lowest_lane(peers) == lane)
      warp_counts[warp][d] = before + static_cast<std::uint32_t>(popc(peers));
    sync_warp();
    rank[r] = before + static_cast<std::uint32_t>(popc(peers & lanemask_lt()));
  }
  __syncthreads();
  {
    const int d = static_cast<int>(threadIdx.x);
    std::uint32_t run = hist_scanned[static_cast<std::int64_t>(d) * tiles + blockIdx.x];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const std::uint32_t c = warp_counts[w][d];
      warp_counts[w][d] = run;
      run += c;
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    if (base + static_cast<std::int64_t>(r) * kWarpSize < n) {
      const std::uint32_t d = (key[r] >> shift) & 0xffu;
      const std::uint32_t pos = warp_counts[warp][d] + rank[r];
      keys_out[pos] = key[r];
      values_out[pos] = value[r];
    }
  }
}

struct LoadWords {
  const std::uint32_t* p;
  __device__ std::uint32_t operator()(std::int64_t i) const { return p[i]; }
};
struct StorePrefix {
  std::uint32_t* p;
  __device__ void operator()(std::int64_t i, std::uint32_t prefix, std::uint32_t) const {
    p[i] = prefix;
  }
};

}  // namespace

RadixSorter::RadixSorter(std::int64_t max_n, SortMethod method)
    : method_(resolve_sort_method(method)), max_n_(std::max<std::int64_t>(max_n, 1)) {
  if (max_n_ >= (std::int64_t{1} << 31)) {
    throw GpuError(cat("radix sort: ", max_n_, " pairs is beyond the 2^31 this sort handles"));
  }
  if (method_ == SortMethod::vendor) {
#if defined(PARITY_GPU_CUDA)
    cub::DoubleBuffer<std::uint32_t> k(nullptr, nullptr);
    cub::DoubleBuffer<std::uint32_t> v(nullptr, nullptr);
    check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes_, k, v, static_cast<int>(max_n_), 0,
                                          32),
          "cub::DeviceRadixSort::SortPairs (size query)");
    temp_ = DeviceBuffer<std::uint8_t>(std::max<std::size_t>(temp_bytes_, 16),
                                       "radix sort temporary storage");
#endif
  } else {
    const std::int64_t tiles = sort_tiles(max_n_);
    hist_ = DeviceBuffer<std::uint32_t>(static_cast<std::size_t>(kRadix * tiles),
                                        "radix sort histogram");
    scan_tmp_ = DeviceBuffer<std::uint32_t>(
        static_cast<std::size_t>(scan::tiles_for(kRadix * tiles)), "radix sort scan scratch");
  }
}

int RadixSorter::sort_pairs(Stream_t stream, std::uint32_t* const keys[2],
                            std::uint32_t* const values[2], std::int64_t n, int end_bit) {
  if (n > max_n_) {
    throw GpuError(
        cat("radix sort: ", n, " pairs exceed the ", max_n_, " this sorter was sized for"));
  }
  if (n <= 1 || end_bit <= 0) return 0;
  end_bit = std::min(end_bit, 32);
  if (method_ == SortMethod::vendor) {
#if defined(PARITY_GPU_CUDA)
    cub::DoubleBuffer<std::uint32_t> k(keys[0], keys[1]);
    cub::DoubleBuffer<std::uint32_t> v(values[0], values[1]);
    std::size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k, v, static_cast<int>(n), 0, end_bit,
                                          stream),
          "cub::DeviceRadixSort::SortPairs (size query)");
    if (bytes > temp_bytes_) {
      throw GpuError(cat("radix sort: CUB needs ", bytes, " bytes of temporary storage, ",
                         temp_bytes_, " were reserved"));
    }
    bytes = temp_bytes_;
    if (rehearsing()) return 0;  // sized, not enqueued (RehearsalScope)
    check(cub::DeviceRadixSort::SortPairs(temp_.data(), bytes, k, v, static_cast<int>(n), 0,
                                          end_bit, stream),
          "cub::DeviceRadixSort::SortPairs");
    return k.selector;
#endif
  }
  const std::int64_t tiles = sort_tiles(n);
  int cur = 0;
  for (int shift = 0; shift < end_bit; shift += 8) {
    launch("radix_upsweep", radix_upsweep_kernel, {tiles, kSortThreads, 0}, stream,
           static_cast<const std::uint32_t*>(keys[cur]), n, shift, hist_.data(), tiles);
    scan::exclusive_scan(stream, "radix_scan", kRadix * tiles, nullptr, LoadWords{hist_.data()},
                         StorePrefix{hist_.data()}, scan_tmp_.data(), nullptr);
    launch("radix_downsweep", radix_downsweep_kernel, {tiles, kSortThreads, 0}, stream,
           static_cast<const std::uint32_t*>(keys[cur]),
           static_cast<const std::uint32_t*>(values[cur]), keys[1 - cur], values[1 - cur], n, shift,
           static_cast<const std::uint32_t*>(hist_.data()), tiles);
    cur = 1 - cur;
  }
  return cur;
}

}  // namespace parity::gpu
