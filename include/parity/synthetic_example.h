// One synthetic example as a pure function of (the generator, split, example index): the math of
// SyntheticData (data.h) written once, for the host generator and for a GPU backend that makes the
// same batches on the device (Backend::make_synthetic).
//
// Why it is built this way: a batch made on the device must be the batch the host makes, bit for
// bit, so both run this code. Everything is integers, IEEE double operations and parity/detmath.h
// (never the C library's exp or log, whose last bits differ between vendors), and the generator is
// one flat block of memory without pointers (Generator, then its arrays at offsets), copied to a
// device as it is. The sums are taken in one fixed order: the dense terms in feature order, the
// tables' terms in table order, then the table pairs and the dense x table terms.
//
// The pieces: normal values by the ziggurat method (Marsaglia and Tsang 2000; the table is built
// on the host, src/data/hash_normal.cpp), Zipf ranks by rejection-inversion (Hörmann and
// Derflinger 1996, src/data/zipf.cpp says why), Zipf ranks scattered over rows by a seeded
// bijection (Scatter), and the planted teacher (src/data/synthetic.cpp).
#pragma once

#include <bit>
#include <cstdint>

#include "parity/detmath.h"
#include "parity/host_device.h"
#include "parity/random.h"

namespace parity::synth {

// ---- normal values: ziggurat over 128 layers of equal area ----
struct Ziggurat {
  static constexpr int kLayers = 128;
  static constexpr double kR = 3.442619855899;  // the base layer's edge for 128 layers
  // x[0] = v/f(r) (the base layer with its tail), x[1] = r, ..., x[128] = 0; f[i] = f(x[i]).
  double x[kLayers + 1];
  double f[kLayers + 1];
};

// The half-normal density without its constant.
PARITY_HD double density(double x) {
  return detmath::exp(-0.5 * x * x);
}

// The rare paths (the wedge beside a layer's rectangle and the tail beyond r), drawing extra
// uniforms from a stream keyed by (key, i), so that the value stays a pure function of (key, i).
PARITY_HD double normal_slow(const Ziggurat& z, std::uint64_t key, std::uint64_t i,
                             std::uint64_t bits) {
  rng::Stream extra(rng::key(key, i, 0xfa11bacc));
  for (;;) {
    const int layer = static_cast<int>(bits & (Ziggurat::kLayers - 1));
    const bool negative = (bits & 128) != 0;
    const double x = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) * z.x[layer];
    if (x < z.x[layer + 1]) return negative ? -x : x;
    if (layer == 0) {
      // Tail beyond r: x = r + e1/r with e1, e2 exponential, accepted when 2*e2 > (e1/r)^2.
      double t, e;
      do {
        t = -detmath::log(extra.next_uniform_open()) / Ziggurat::kR;
        e = -detmath::log(extra.next_uniform_open());
      } while (2.0 * e < t * t);
      return negative ? -(Ziggurat::kR + t) : Ziggurat::kR + t;
    }
    // Wedge: a uniform height in the layer's rectangle, under the curve?
    const double y = z.f[layer] + extra.next_uniform() * (z.f[layer + 1] - z.f[layer]);
    if (y < density(x)) return negative ? -x : x;
    bits = extra.next_bits();  // rejected: a fresh layer, sign and position
  }
}

// N(0,1) value number i of the stream with the given key. The common path (97% of values): one
// hash, one table lookup, one multiply and one compare.
PARITY_HD double normal(const Ziggurat& z, std::uint64_t key, std::uint64_t i) {
  const std::uint64_t bits = rng::bits(key, i);
  const int layer = static_cast<int>(bits & (Ziggurat::kLayers - 1));
  const double x = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0) * z.x[layer];
  if (x < z.x[layer + 1]) return (bits & 128) ? -x : x;
  return normal_slow(z, key, i, bits);
}

// ---- Zipf ranks by rejection-inversion ----
// Ranks k = 1..n internally, returned as k - 1. Hat h(x) = x^-alpha, H its integral from 1.
struct Zipf {
  std::int64_t n = 1;
  double alpha = 1.0;
  double h_x1 = 0.0, h_n = 0.0, s = 0.0;  // the hat integral's ends; the squeeze

  // log1p(t) / t and expm1(t) / t, continuous at t = 0.
  PARITY_HD static double log1p_over(double t) {
    if (t > 1e-8 || t < -1e-8) return detmath::log1p(t) / t;
    return 1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t));
  }
  PARITY_HD static double expm1_over(double t) {
    if (t > 1e-8 || t < -1e-8) return detmath::expm1(t) / t;
    return 1.0 + 0.5 * t * (1.0 + t / 3.0 * (1.0 + 0.25 * t));
  }
  // H(x) = log(x) expm1((1-alpha) log x) / ((1-alpha) log x).
  PARITY_HD double hat_integral(double x) const {
    const double log_x = detmath::log(x);
    return expm1_over((1.0 - alpha) * log_x) * log_x;
  }
  // H^-1(y) = exp(y log1p((1-alpha) y) / ((1-alpha) y)).
  PARITY_HD double hat_integral_inverse(double y) const {
    double t = (1.0 - alpha) * y;
    // For alpha > 1, H is bounded by 1/(alpha-1); rounding can push y onto the bound, where the
    // inverse is +infinity (and the caller clamps it to n).
    if (t < -1.0) t = -1.0;
    return detmath::exp(log1p_over(t) * y);
  }
  // u1, u2 uniform in [0, 1); the rank (0 is the most frequent).
  PARITY_HD std::int64_t sample(double u1, double u2) const {
    if (n == 1) return 0;
    const double nd = static_cast<double>(n);
    double u = u1;
    for (std::uint64_t attempt = 0;; ++attempt) {
      const double y = h_n + u * (h_x1 - h_n);  // uniform over the hat's integral
      const double x = hat_integral_inverse(y);
      double k = std::floor(x + 0.5);
      if (!(k >= 1.0)) k = 1.0;  // also catches NaN
      if (k > nd) k = nd;
      if (k - x <= s || y >= hat_integral(k + 0.5) - detmath::exp(-alpha * detmath::log(k))) {
        return static_cast<std::int64_t>(k) - 1;
      }
      // Rejected (rare). The second try uses u2; later ones use uniforms derived from both
      // inputs, so the result stays a pure function of (u1, u2).
      if (attempt == 0) {
        u = u2;
      } else {
        const std::uint64_t b = rng::mix64(detmath::detail::to_bits(u1) ^
                                           rng::mix64(detmath::detail::to_bits(u2) + attempt));
        u = static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0);
      }
    }
  }
};

// ---- a seeded bijection of [0, n) ----
// Scatters Zipf ranks over a table's rows so that the hot rows are not rows 0, 1, 2, ... Two
// rounds of (odd multiply + add, mod 2^w) and an xorshift permute [0, 2^w), the power of two just
// covering n, and cycle-walking restricts that to [0, n) (fewer than two rounds on average).
struct Scatter {
  std::uint64_t n = 1, mask = 0;
  int shift = 1;
  std::uint64_t mul1 = 1, add1 = 0, mul2 = 1, add2 = 0;

  Scatter() = default;
  Scatter(std::int64_t rows, std::uint64_t seed) : n(static_cast<std::uint64_t>(rows)) {
    if (n <= 1) return;
    const int w = std::bit_width(n - 1);  // 1..63
    mask = (std::uint64_t{1} << w) - 1;
    shift = (w + 1) / 2;
    mul1 = rng::mix64(seed ^ 0x5ca77e2d00000001ULL) | 1;
    add1 = rng::mix64(seed ^ 0x5ca77e2d00000002ULL);
    mul2 = rng::mix64(seed ^ 0x5ca77e2d00000003ULL) | 1;
    add2 = rng::mix64(seed ^ 0x5ca77e2d00000004ULL);
  }
  // Row of rank x, x in [0, n).
  PARITY_HD std::int64_t operator()(std::int64_t x) const {
    if (n <= 1) return 0;
    std::uint64_t y = static_cast<std::uint64_t>(x);
    do {
      y = (y * mul1 + add1) & mask;
      y ^= y >> shift;
      y = (y * mul2 + add2) & mask;
      y ^= y >> shift;
    } while (y >= n);
    return static_cast<std::int64_t>(y);
  }
};

// ---- the generator: one flat block ----
struct Table {
  std::int64_t rows = 1;
  std::int64_t id_prefix = 0;  // sum of the pooling sizes of the tables before this one
  std::int32_t pooling = 0;
  std::uint8_t zipf = 0;              // ids Zipf(alpha) ranks scattered over rows; else uniform
  std::uint8_t needs_g = 0;           // the teacher uses pool(g_t)
  double pool_scale = 0.0;            // 1/sqrt(L) for sum, 1/L for mean, 0 for L == 0
  double p_mean = 0.0, q_mean = 0.0;  // the means of pool(h_t) and pool(g_t) over examples
  double s = 0.0;                     // coefficient of pool(h_t) in the logit
  Zipf ranks;
  Scatter scatter;
  std::uint64_t id_key[2] = {0, 0};    // per split
  std::uint64_t h_key = 0, g_key = 0;  // teacher value streams, indexed by row
};

struct Pair {  // c * q_t * q_u
  std::int32_t t = 0, u = 0;
  double c = 0.0;
};

struct Cross {  // c * dense_k * q_t
  std::int32_t k = 0, t = 0;
  double c = 0.0;
};

struct Generator {
  std::uint64_t bytes = 0;  // the whole block: this header and its arrays
  std::int32_t num_dense = 0, num_tables = 0, num_pairs = 0, num_cross = 0;
  std::int64_t ids_per_example = 0;
  double bias = 0.0;
  std::uint64_t dense_key[2] = {0, 0}, label_key[2] = {0, 0};  // per split
  // Offsets from the start of the block: Table[num_tables], Pair[num_pairs], Cross[num_cross],
  // double[num_dense] (the dense coefficients).
  std::uint64_t tables_at = 0, pairs_at = 0, cross_at = 0, dense_coef_at = 0;
  Ziggurat zig;

  template <class T>
  PARITY_HD const T* at(std::uint64_t offset) const {
    return reinterpret_cast<const T*>(reinterpret_cast<const unsigned char*>(this) + offset);
  }
  PARITY_HD const Table& table(int t) const { return at<Table>(tables_at)[t]; }
  PARITY_HD const Pair& pair(int i) const { return at<Pair>(pairs_at)[i]; }
  PARITY_HD const Cross& cross(int i) const { return at<Cross>(cross_at)[i]; }
  PARITY_HD double dense_coef(int k) const { return at<double>(dense_coef_at)[k]; }
};

// `split` below is 0 for the training split, 1 for the held-out one.

// Dense feature k of example e.
PARITY_HD float dense_value(const Generator& g, int split, std::uint64_t e, int k) {
  const auto nd = static_cast<std::uint64_t>(g.num_dense);
  return static_cast<float>(
      normal(g.zig, g.dense_key[split], e * nd + static_cast<std::uint64_t>(k)));
}

// The teacher's terms of one table for one example: p = s_t (pool(h_t) - mean), added to the
// logit; q = pool(g_t) - mean, used by the pair and cross terms.
struct TableTerms {
  double p, q;
};

// The bag of table t of example e: its pooling ids written to bag[0..pooling), and its terms.
PARITY_HD TableTerms table_bag(const Generator& g, int split, int t, std::uint64_t e,
                               std::int64_t* bag) {
  const Table& tb = g.table(t);
  const std::uint64_t key = tb.id_key[split];
  const std::uint64_t c0 = e * static_cast<std::uint64_t>(tb.pooling);
  double sum_h = 0.0, sum_g = 0.0;
  for (int j = 0; j < tb.pooling; ++j) {
    const std::uint64_t c = c0 + static_cast<std::uint64_t>(j);
    std::int64_t row;
    if (tb.zipf) {
      row = tb.scatter(tb.ranks.sample(rng::uniform01(key, 2 * c), rng::uniform01(key, 2 * c + 1)));
    } else {
      row = static_cast<std::int64_t>(
          rng::mul_hi64(rng::bits(key, c), static_cast<std::uint64_t>(tb.rows)));
    }
    bag[j] = row;
    const auto r = static_cast<std::uint64_t>(row);
    sum_h += normal(g.zig, tb.h_key, r);
    if (tb.needs_g) sum_g += normal(g.zig, tb.g_key, r);
  }
  return {tb.s * (sum_h * tb.pool_scale - tb.p_mean), sum_g * tb.pool_scale - tb.q_mean};
}

// The teacher's logit of an example from its dense features x[k] and its tables' terms p[t *
// stride], q[t * stride].
PARITY_HD double logit(const Generator& g, const float* x, const double* p, const double* q,
                       std::int64_t stride) {
  double l = g.bias;
  for (int k = 0; k < g.num_dense; ++k) l += g.dense_coef(k) * x[k];
  for (int t = 0; t < g.num_tables; ++t) l += p[t * stride];
  for (int i = 0; i < g.num_pairs; ++i) {
    const Pair& pr = g.pair(i);
    l += pr.c * q[pr.t * stride] * q[pr.u * stride];
  }
  for (int i = 0; i < g.num_cross; ++i) {
    const Cross& c = g.cross(i);
    l += c.c * x[c.k] * q[c.t * stride];
  }
  return l;
}

// P(label = 1) and the label of example e.
PARITY_HD double probability(double logit) {
  return 1.0 / (1.0 + detmath::exp(-logit));
}
PARITY_HD float label(const Generator& g, int split, std::uint64_t e, double prob) {
  return rng::uniform01(g.label_key[split], e) < prob ? 1.0f : 0.0f;
}

// Where the bag of table t of example b of a batch of `count` starts in the batch's table-major
// CSR (bags have fixed sizes, so every example knows where its bags go).
PARITY_HD std::int64_t bag_start(const Generator& g, int t, std::int64_t b, std::int64_t count) {
  const Table& tb = g.table(t);
  return count * tb.id_prefix + b * tb.pooling;
}

}  // namespace parity::synth
