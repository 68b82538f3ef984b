// Standard normal values as pure functions of (stream key, counter), by the ziggurat method
// (Marsaglia and Tsang, "The ziggurat method for generating random variables", 2000).
//
// Why: the synthetic teacher needs one or two N(0,1) values per embedding id (h_t(row),
// g_t(row)), which is hundreds of millions per second at MLPerf batch sizes. Box-Muller costs a
// log, a sqrt and a cos per value (~30 ns); the ziggurat's common path (97% of values) is one
// hash, one table lookup, one multiply and one compare. It is exact, not an approximation: the
// rare paths (the wedge between a layer's rectangle and the curve, and the tail beyond r) draw
// extra uniforms from a stream keyed by (key, counter), so the value stays a pure function of
// (key, counter). The sampling itself is parity/synthetic_example.h (host and device); this is
// the table, built once on the host. Internal to src/data.
//
// 128 layers of equal area v over the half-normal f(x) = exp(-x^2/2); the 64-bit hash supplies
// the layer (7 bits), the sign (1 bit) and a 53-bit uniform.
#pragma once

#include <cstdint>

#include "parity/synthetic_example.h"

namespace parity::data_detail {

using ZigguratTable = synth::Ziggurat;

// Built once (thread-safe static), then read-only.
const ZigguratTable& ziggurat_table();

// N(0,1) value number i of the stream with the given key.
inline double normal_value(const ZigguratTable& z, std::uint64_t key, std::uint64_t i) {
  return synth::normal(z, key, i);
}

}  // namespace parity::data_detail
