// Table and rare paths of the ziggurat normal generator (see hash_normal.h for why).
//
// With 128 layers each of area v, the base layer is the rectangle [0, r] x [0, f(r)] plus the
// tail beyond r; layer i >= 1 is the rectangle [0, x[i]] x [f(x[i]), f(x[i+1])]. A point drawn
// uniformly in a layer's rectangle with x < x[i+1] is certainly under the curve (the fast path);
// otherwise it is under the curve with the probability its wedge test gives, and the tail
// beyond r is sampled by Marsaglia's exponential method. r and v are the published values for
// 128 layers, for which x[128] comes out as 0.
#include "data/hash_normal.h"

#include <cmath>

namespace parity::data_detail {
namespace {

constexpr double kR = 3.442619855899;
constexpr double kV = 9.91256303526217e-3;

double density(double x) {
  return std::exp(-0.5 * x * x);
}

ZigguratTable build() {
  ZigguratTable z;
  constexpr int n = ZigguratTable::kLayers;
  z.x[0] = kV / density(kR);
  z.x[1] = kR;
  for (int i = 1; i < n - 1; ++i) {
    z.x[i + 1] = std::sqrt(-2.0 * std::log(density(z.x[i]) + kV / z.x[i]));
  }
  z.x[n] = 0.0;
  for (int i = 0; i <= n; ++i) z.f[i] = density(z.x[i]);
  return z;
}

}  // namespace

const ZigguratTable& ziggurat_table() {
  static const ZigguratTable table = build();
  return table;
}

double normal_value_slow(const ZigguratTable& z, std::uint64_t key, std::uint64_t i,
                         std::uint64_t bits) {
  rng::Stream extra(rng::key(key, i, 0xfa11bacc));
  for (;;) {
    const int layer = static_cast<int>(bits & (ZigguratTable::kLayers - 1));
    const bool negative = (bits & 128) != 0;
    const double x = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) * z.x[layer];
    if (x < z.x[layer + 1]) return negative ? -x : x;
    if (layer == 0) {
      // Tail beyond r: x = r + e1/r with e1, e2 exponential, accepted when 2*e2 > (e1/r)^2.
      double t, e;
      do {
        t = -std::log(extra.next_uniform_open()) / kR;
        e = -std::log(extra.next_uniform_open());
      } while (2.0 * e < t * t);
      return negative ? -(kR + t) : kR + t;
    }
    // Wedge: a uniform height in the layer's rectangle, under the curve?
    const double y = z.f[layer] + extra.next_uniform() * (z.f[layer + 1] - z.f[layer]);
    if (y < density(x)) return negative ? -x : x;
    bits = extra.next_bits();  // rejected: a fresh layer, sign and position
  }
}

}  // namespace parity::data_detail
