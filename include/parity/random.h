// Counter-based random numbers: value i of stream s is a pure function of
// (seed, stream, i). Any element can be generated independently, in any order,
// on any thread or device, and the result is the same bit for bit. This is what
// makes initialisation, synthetic data and resume deterministic.
#pragma once

#include <cmath>
#include <cstdint>

#include "parity/host_device.h"

namespace parity::rng {

// splitmix64 finaliser: a bijective 64-bit mixer with good avalanche.
PARITY_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Key of one stream: combine a seed with up to three stream coordinates.
PARITY_HD std::uint64_t key(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0,
                            std::uint64_t c = 0) {
  return mix64(mix64(mix64(seed ^ mix64(a)) ^ b) ^ mix64(c + 0x632be59bd9b4e019ULL));
}

// 64 random bits for counter i of the stream with the given key.
PARITY_HD std::uint64_t bits(std::uint64_t stream_key, std::uint64_t i) {
  return mix64(stream_key ^ mix64(i));
}

// A 32-bit integer hash with good avalanche (two multiplies: on a GPU several times cheaper than
// the 64-bit mixer), for bits drawn per element inside kernels.
PARITY_HD std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The key of row `row` of table `table` within the stream `stream_key` (one 64-bit mix). Rows
// below 2^40 of tables below 2^24 get distinct inputs; beyond, some rows share keys, which
// correlates their random bits and changes nothing else.
PARITY_HD std::uint64_t row_key(std::uint64_t stream_key, std::uint64_t table, std::uint64_t row) {
  return mix64(stream_key ^ (table << 40 | row));
}

// 32 random bits for pair j of a row's elements (elements 2j and 2j + 1): a hash of the row key's
// low word and j.
PARITY_HD std::uint32_t bits32(std::uint64_t row, std::uint64_t j) {
  return hash32(static_cast<std::uint32_t>(row) ^ static_cast<std::uint32_t>(j) * 0x9e3779b9U);
}

// 16 random bits for element i of a row: the low half of bits32(row, i / 2) for even i, the high
// half for odd i (so a kernel rounding two elements makes one draw).
PARITY_HD std::uint32_t bits16(std::uint64_t row, std::uint64_t i) {
  return (bits32(row, i >> 1) >> (16 * (i & 1))) & 0xffffU;
}

// The high 64 bits of the 128-bit product a * b: mul_hi64(bits, n) is a uniform integer in [0, n).
PARITY_HD std::uint64_t mul_hi64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __umul64hi(a, b);
#else
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// Uniform double in [0, 1) with 53 random bits.
PARITY_HD double uniform01(std::uint64_t stream_key, std::uint64_t i) {
  return static_cast<double>(bits(stream_key, i) >> 11) * (1.0 / 9007199254740992.0);
}

// Uniform double in (0, 1): never 0, safe for log().
PARITY_HD double uniform_open(std::uint64_t stream_key, std::uint64_t i) {
  return (static_cast<double>(bits(stream_key, i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal from two counters (Box-Muller, first output only).
PARITY_HD double normal(std::uint64_t stream_key, std::uint64_t i) {
  const double u1 = uniform_open(stream_key, 2 * i);
  const double u2 = uniform01(stream_key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Sequential generator over one stream, for loops that need many draws.
class Stream {
 public:
  PARITY_HD explicit Stream(std::uint64_t stream_key) : key_(stream_key) {}
  PARITY_HD std::uint64_t next_bits() { return bits(key_, counter_++); }
  PARITY_HD double next_uniform() { return uniform01(key_, counter_++); }
  PARITY_HD double next_uniform_open() { return uniform_open(key_, counter_++); }
  PARITY_HD double next_normal() {
    const double v = normal(key_, counter_);
    ++counter_;
    return v;
  }
  // Uniform integer in [0, n), n > 0 (bias below 2^-64·n).
  PARITY_HD std::uint64_t next_below(std::uint64_t n) { return mul_hi64(next_bits(), n); }

 private:
  std::uint64_t key_;
  std::uint64_t counter_ = 0;
};

}  // namespace parity::rng
