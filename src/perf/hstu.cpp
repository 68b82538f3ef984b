// The HSTU workload model (perf.h): tokens and attention pairs per example from the length
// distribution, and per layer the FLOPs and the activation bytes the backward keeps.
//
// Why exact sums: attention is quadratic in each sequence's length, so E[n²], not E[n]², sets
// its cost, and a heavy-tailed distribution makes the two far apart. The lengths are discrete and
// bounded (at most 2^20), so the model sums over every length with the probability the synthetic
// generator gives it (src/data/sequences.cpp draws the same way), instead of approximating.
#include <algorithm>
#include <cmath>

#include "parity/error.h"
#include "parity/perf.h"

namespace parity {
namespace {

// P(L = n) for n in [min, max]: uniform, or the floored continuous power law p(x) ∝ x^-alpha on
// [min, max + 1) (the synthetic generator's).
double length_probability(const SequenceSpec& s, int n) {
  const double lo = s.min_len, hi = s.max_len + 1.0;
  if (s.lengths == LengthDistribution::uniform) return 1.0 / (hi - lo);
  const double a = s.length_alpha;
  auto cdf = [&](double x) {
    if (std::abs(a - 1.0) < 1e-12) return std::log(x / lo) / std::log(hi / lo);
    const double l = std::pow(lo, 1.0 - a), h = std::pow(hi, 1.0 - a);
    return (std::pow(x, 1.0 - a) - l) / (h - l);
  };
  return cdf(std::min(n + 1.0, hi)) - cdf(static_cast<double>(n));
}

}  // namespace

SequenceMoments sequence_moments(const ModelSpec& m) {
  if (m.kind != ModelKind::hstu || !m.hstu)
    throw InputError("sequence_moments: model '" + m.name + "' is not an HSTU model");
  const SequenceSpec& s = m.hstu->sequence;
  const double c = m.num_tables(), t = s.targets;
  SequenceMoments r;
  for (int n = s.min_len; n <= s.max_len; ++n) {
    const double p = length_probability(s, n);
    const double h = c + n;
    r.history += p * n;
    r.pairs += p * (h * (h + 1.0) / 2.0 + t * (h + 1.0));
  }
  r.tokens = c + r.history + t;
  r.tokens_max = c + s.max_len + t;
  return r;
}

HstuLayerWork hstu_layer_work(const ModelSpec& m, double element_bytes) {
  const SequenceMoments sm = sequence_moments(m);
  const HstuSpec& h = *m.hstu;
  const double d = h.model_dim, heads = h.heads, a = h.attention_dim, v = h.value_dim;
  const double hv = heads * v, proj = 2.0 * hv + 2.0 * heads * a;
  HstuLayerWork w;
  const double mads = sm.tokens * (d * proj + hv * d);  // the two projections' multiply-adds
  w.projection_flops_forward = 2.0 * mads;
  w.projection_flops_backward = 4.0 * mads;  // the input's gradient and the weights'
  w.attention_flops_forward = 2.0 * sm.pairs * heads * (a + v);
  w.attention_flops_backward = 2.0 * sm.pairs * heads * (3.0 * a + 2.0 * v);
  const double stats = 4.0;  // mean and rstd of the two layer norms
  w.activation_bytes_per_token = element_bytes * (2.0 * d + 2.0 * proj + 2.0 * hv + stats);
  w.activation_bytes_per_token_recompute = element_bytes * (d + proj + hv + stats);
  return w;
}

}  // namespace parity
