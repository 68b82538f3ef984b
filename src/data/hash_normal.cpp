// The table of the ziggurat normal generator (see hash_normal.h for why).
//
// With 128 layers each of area v, the base layer is the rectangle [0, r] x [0, f(r)] plus the
// tail beyond r; layer i >= 1 is the rectangle [0, x[i]] x [f(x[i]), f(x[i+1])]. A point drawn
// uniformly in a layer's rectangle with x < x[i+1] is certainly under the curve (the fast path);
// otherwise it is under the curve with the probability its wedge test gives, and the tail
// beyond r is sampled by Marsaglia's exponential method (synth::normal_slow). r and v are the
// published values for 128 layers, for which x[128] comes out as 0. The table is data, built
// here once and copied as it is to a device, so the C library's functions may build it.
#include "data/hash_normal.h"

#include <cmath>

namespace parity::data_detail {
namespace {

constexpr double kV = 9.91256303526217e-3;

double density(double x) {
  return std::exp(-0.5 * x * x);
}

ZigguratTable build() {
  ZigguratTable z;
  constexpr int n = ZigguratTable::kLayers;
  constexpr double r = ZigguratTable::kR;
  z.x[0] = kV / density(r);
  z.x[1] = r;
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

}  // namespace parity::data_detail
