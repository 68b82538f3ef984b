// The patterns of the device memory test (parity doctor): the value of 32-bit word i of a buffer
// under each pattern, a pure function of (pattern, i, seed) computed alike on the host and in
// kernels, so that a check needs nothing but the pattern to know what every word should hold.
//
// Why these: walking ones and zeros put every bit position at 1 (and at 0) beside neighbours of
// the other value, which finds stuck and coupled bits; the address pattern gives every word a
// value of its own, which finds address lines that alias two words; its inverse flips every bit
// of it; the random pattern (a new one per seed) finds what the regular ones miss.
#pragma once

#include <cstdint>
#include <string_view>

#include "parity/host_device.h"

namespace parity {

enum class MemoryPattern : std::uint8_t {
  walking_ones,
  walking_zeros,
  address,
  inverse_address,
  random
};

inline constexpr MemoryPattern kMemoryPatterns[] = {
    MemoryPattern::walking_ones, MemoryPattern::walking_zeros, MemoryPattern::address,
    MemoryPattern::inverse_address, MemoryPattern::random};

constexpr std::string_view memory_pattern_name(MemoryPattern p) {
  switch (p) {
    case MemoryPattern::walking_ones:
      return "walking ones";
    case MemoryPattern::walking_zeros:
      return "walking zeros";
    case MemoryPattern::address:
      return "address";
    case MemoryPattern::inverse_address:
      return "inverse address";
    case MemoryPattern::random:
      return "random";
  }
  return "?";
}

// splitmix64's finaliser (as parity/random.h's mix64; repeated here so that backend.h, which
// includes this header, stays free of random.h's device intrinsics in host-only translation units).
PARITY_HD std::uint64_t memory_pattern_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Word i's value. The address pattern is the word's index with the bits above the 32nd folded in
// (multiplied by an odd constant), so that words 16 GiB apart differ too, and a value of the seed
// mixed in, so that buffers tested with different seeds differ from each other. The walking
// patterns move by one position per word and by `seed` positions per pass.
PARITY_HD std::uint32_t memory_pattern_word(MemoryPattern p, std::uint64_t i, std::uint64_t seed) {
  const std::uint32_t walk = 1u << ((i + seed) & 31u);
  const std::uint32_t addr = static_cast<std::uint32_t>(i) ^
                             (static_cast<std::uint32_t>(i >> 32) * 0x9e3779b1u) ^
                             static_cast<std::uint32_t>(memory_pattern_mix(seed));
  switch (p) {
    case MemoryPattern::walking_ones:
      return walk;
    case MemoryPattern::walking_zeros:
      return ~walk;
    case MemoryPattern::address:
      return addr;
    case MemoryPattern::inverse_address:
      return ~addr;
    case MemoryPattern::random:
      return static_cast<std::uint32_t>(memory_pattern_mix(memory_pattern_mix(seed) ^ i) >> 32);
  }
  return 0;
}

}  // namespace parity
