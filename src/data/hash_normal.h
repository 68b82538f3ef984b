// Standard normal values as pure functions of (stream key, counter), by the ziggurat method
// (Marsaglia and Tsang, "The ziggurat method for generating random variables", 2000).
//
// Why: the synthetic teacher needs one or two N(0,1) values per embedding id (h_t(row),
// g_t(row)), which is hundreds of millions per second at MLPerf batch sizes. Box-Muller costs a
// log, a sqrt and a cos per value (~30 ns); the ziggurat's common path (97% of values) is one
// hash, one table lookup, one multiply and one compare. It is exact, not an approximation: the
// rare paths (the wedge between a layer's rectangle and the curve, and the tail beyond r) draw
// extra uniforms from a stream keyed by (key, counter), so the value stays a pure function of
// (key, counter).
//
// 128 layers of equal area v over the half-normal f(x) = exp(-x^2/2); the 64-bit hash supplies
// the layer (7 bits), the sign (1 bit) and a 53-bit uniform. Internal to src/data.
#pragma once

#include <cstdint>

#include "parity/random.h"

namespace parity::data_detail {

struct ZigguratTable {
  static constexpr int kLayers = 128;
  double
      x[kLayers + 1];  // layer edges: x[0] = v/f(r) (base layer incl. tail), x[1] = r, x[128] = 0
  double f[kLayers + 1];  // f(x[i])
};

// Built once (thread-safe static), then read-only.
const ZigguratTable& ziggurat_table();

// The rare paths of normal_value.
double normal_value_slow(const ZigguratTable& z, std::uint64_t key, std::uint64_t i,
                         std::uint64_t bits);

// N(0,1) value number i of the stream with the given key.
inline double normal_value(const ZigguratTable& z, std::uint64_t key, std::uint64_t i) {
  const std::uint64_t bits = rng::bits(key, i);
  const int layer = static_cast<int>(bits & (ZigguratTable::kLayers - 1));
  const double x = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) * z.x[layer];
  if (x < z.x[layer + 1]) return (bits & 128) ? -x : x;
  return normal_value_slow(z, key, i, bits);
}

}  // namespace parity::data_detail
