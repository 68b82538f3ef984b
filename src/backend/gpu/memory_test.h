// The device memory test and the copy of parity doctor (Backend::memory_pattern_write,
// memory_pattern_check, copy_within). Host entry points; kernels in memory_test.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/memory_pattern.h"

namespace parity::gpu {

// The 32-bit words of [p, p + bytes) = memory_pattern_word(pattern, i, seed).
void memory_pattern_write(Stream_t s, void* p, std::size_t bytes, MemoryPattern pattern,
                          std::uint64_t seed);
// Counts the words of [p, p + bytes) that differ from the pattern into result[0] and lowers
// result[1] to the index of the first (device memory, set by the caller to 0 and UINT64_MAX).
void memory_pattern_check(Stream_t s, const void* p, std::size_t bytes, MemoryPattern pattern,
                          std::uint64_t seed, unsigned long long* result);

}  // namespace parity::gpu
