// The device memory test (see memory_test.h). Each pattern is written in one grid-stride pass and
// checked in another, 16 bytes per thread per iteration, so both run at the memory's rate: a test
// of most of an H200's memory takes well under a second per pattern. A buffer many times the L2
// cache leaves the cache before it is read back, so the check reads the memory cells themselves.
// The check writes nothing unless a word differs: then one atomic counts it and another keeps the
// lowest index.
#include "backend/gpu/memory_test.h"

#include <algorithm>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"

namespace parity::gpu {

namespace {

using elementwise::global_index;
using elementwise::grid_stride;
using elementwise::kBlock;

__global__ __launch_bounds__(kBlock) void memory_pattern_write_kernel(uint4* __restrict__ p,
                                                                      std::uint64_t groups,
                                                                      MemoryPattern pattern,
                                                                      std::uint64_t seed) {
  for (std::uint64_t g = global_index(); g < groups; g += grid_stride()) {
    const std::uint64_t i = 4 * g;
    p[g] = make_uint4(
        memory_pattern_word(pattern, i, seed), memory_pattern_word(pattern, i + 1, seed),
        memory_pattern_word(pattern, i + 2, seed), memory_pattern_word(pattern, i + 3, seed));
  }
}

__device__ __forceinline__ void note_error(unsigned long long* result, std::uint64_t i) {
  atomicAdd(result, 1ull);
  atomicMin(result + 1, static_cast<unsigned long long>(i));
}

__global__ __launch_bounds__(kBlock) void memory_pattern_check_kernel(const uint4* __restrict__ p,
                                                                      std::uint64_t groups,
                                                                      MemoryPattern pattern,
                                                                      std::uint64_t seed,
                                                                      unsigned long long* result) {
  for (std::uint64_t g = global_index(); g < groups; g += grid_stride()) {
    const uint4 v = p[g];
    const std::uint64_t i = 4 * g;
    if (v.x != memory_pattern_word(pattern, i, seed)) note_error(result, i);
    if (v.y != memory_pattern_word(pattern, i + 1, seed)) note_error(result, i + 1);
    if (v.z != memory_pattern_word(pattern, i + 2, seed)) note_error(result, i + 2);
    if (v.w != memory_pattern_word(pattern, i + 3, seed)) note_error(result, i + 3);
  }
}

// The words past the last whole group of four.
__global__ void memory_pattern_tail_kernel(std::uint32_t* p, std::uint64_t first, std::uint64_t n,
                                           MemoryPattern pattern, std::uint64_t seed,
                                           unsigned long long* result) {
  for (std::uint64_t i = first + threadIdx.x; i < n; i += blockDim.x) {
    if (result == nullptr)
      p[i] = memory_pattern_word(pattern, i, seed);
    else if (p[i] != memory_pattern_word(pattern, i, seed))
      note_error(result, i);
  }
}

std::int64_t blocks_for(std::uint64_t groups, std::int64_t resident) {
  return std::clamp<std::int64_t>(ceil_div(static_cast<std::int64_t>(groups), kBlock), 1,
                                  resident * 4);
}

// 16-byte groups of words the vector kernels take: whole groups, only where p is 16-byte aligned
// (device allocations are); the tail kernel takes the words after them.
std::uint64_t whole_groups(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 ? bytes / 16 : 0;
}

}  // namespace

void memory_pattern_write(Stream_t s, void* p, std::size_t bytes, MemoryPattern pattern,
                          std::uint64_t seed) {
  const std::uint64_t words = bytes / 4, whole = whole_groups(p, bytes);
  if (whole > 0)
    launch("memory_pattern_write", memory_pattern_write_kernel,
           {blocks_for(whole, resident_blocks(memory_pattern_write_kernel, kBlock, 0)), kBlock, 0},
           s, static_cast<uint4*>(p), whole, pattern, seed);
  if (4 * whole < words)
    launch("memory_pattern_tail", memory_pattern_tail_kernel, {1, kBlock, 0}, s,
           static_cast<std::uint32_t*>(p), 4 * whole, words, pattern, seed,
           static_cast<unsigned long long*>(nullptr));
}

void memory_pattern_check(Stream_t s, const void* p, std::size_t bytes, MemoryPattern pattern,
                          std::uint64_t seed, unsigned long long* result) {
  const std::uint64_t words = bytes / 4, whole = whole_groups(p, bytes);
  if (whole > 0)
    launch("memory_pattern_check", memory_pattern_check_kernel,
           {blocks_for(whole, resident_blocks(memory_pattern_check_kernel, kBlock, 0)), kBlock, 0},
           s, static_cast<const uint4*>(p), whole, pattern, seed, result);
  if (4 * whole < words)
    launch("memory_pattern_tail", memory_pattern_tail_kernel, {1, kBlock, 0}, s,
           const_cast<std::uint32_t*>(static_cast<const std::uint32_t*>(p)), 4 * whole, words,
           pattern, seed, result);
}

}  // namespace parity::gpu
