// Stable radix sort of (uint32 key, uint32 value) pairs on the device, with all temporary storage
// allocated once.
//
// Why it is built this way: the embedding backward groups the occurrences of each row by sorting
// linearised (table, row) keys; a stable sort keeps the occurrences of a row in batch order, so the
// gradient sum has a fixed order and the update is deterministic. Two implementations:
// - vendor: CUB's DeviceRadixSort on CUDA (the fastest we have there). Debian 12 ships rocPRIM
//   but no hipCUB, so there is no vendor path on HIP.
// - portable: our own LSD radix sort, 8-bit digits, one source for both vendors (warp 32 or 64):
//   per pass an up-sweep counts digits per tile (warp-aggregated: lanes with equal digits are
//   found with ballots and counted once), a scan turns the digit-major counts into offsets, and a
//   down-sweep ranks each element stably within its tile (per-warp counters, warps in tile order)
//   and scatters it. Deterministic: no atomics decide any position.
// Both give the same result bit for bit (a stable sort is unique), which the GPU tests check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "backend/gpu/port.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

enum class SortMethod : std::uint8_t { automatic, vendor, portable };
std::string_view sort_method_name(SortMethod m);  // "automatic", "vendor", "portable"
// The method `automatic` resolves to here (vendor on CUDA, portable on HIP).
SortMethod resolve_sort_method(SortMethod m);

class RadixSorter {
 public:
  // Storage for up to max_n pairs, for the given method (automatic is resolved here).
  RadixSorter(std::int64_t max_n, SortMethod method);
  SortMethod method() const { return method_; }
  std::size_t bytes() const { return temp_.bytes() + hist_.bytes() + scan_tmp_.bytes(); }

  // Stable sort of the n pairs in (keys[0], values[0]) by key bits [0, end_bit), using
  // (keys[1], values[1]) as the second buffer. Returns the index (0 or 1) of the buffer that
  // holds the sorted pairs. Stream-ordered; no host synchronisation.
  int sort_pairs(Stream_t stream, std::uint32_t* const keys[2], std::uint32_t* const values[2],
                 std::int64_t n, int end_bit);

 private:
  SortMethod method_;
  std::int64_t max_n_;
  DeviceBuffer<std::uint8_t> temp_;              // vendor temporary storage
  DeviceBuffer<std::uint32_t> hist_;             // portable: [256 * tiles] digit-major counts
  DeviceBuffer<std::uint32_t> scan_tmp_;         // portable: scan scratch
  [[maybe_unused]] std::size_t temp_bytes_ = 0;  // vendor path only
};

}  // namespace parity::gpu
