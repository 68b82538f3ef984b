// The HSTU workload model (perf.h): tokens and attention pairs per example from the length
// distribution, and per layer the FLOPs and the activation bytes the backward keeps.
//
// Why exact sums: attention is quadratic in each sequence's length, so E[n²], not E[n]², sets
// its cost, and a heavy-tailed distribution makes the two far apart. The lengths are discrete and
// bounded (at most 2^20), so the model sums over every length with the probability the synthetic
// generator gives it (src/data/sequences.cpp draws the same way), instead of approximating.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "parity/error.h"
#include "parity/perf.h"

namespace parity {
namespace detail {

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

}  // namespace detail

SequenceMoments sequence_moments(const ModelSpec& m) {
  if (m.kind != ModelKind::hstu || !m.hstu)
    throw InputError("sequence_moments: model '" + m.name + "' is not an HSTU model");
  const SequenceSpec& s = m.hstu->sequence;
  const double c = m.num_tables(), t = s.targets;
  SequenceMoments r;
  for (int n = s.min_len; n <= s.max_len; ++n) {
    const double p = detail::length_probability(s, n);
    const double h = c + n;
    r.history += p * n;
    r.tokens_sq += p * (h + t) * (h + t);
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

double token_capacity(const SequenceMoments& s, double examples) {
  constexpr double kDeviations = 6.0;  // P(more) about 1e-9 under the normal approximation
  const double var = std::max(0.0, s.tokens_sq - s.tokens * s.tokens);
  const double bound = examples * s.tokens + kDeviations * std::sqrt(examples * var) + s.tokens_max;
  return std::ceil(std::min(bound, examples * s.tokens_max));
}

namespace {

// t(n) at one head dim, log-log between the table's lengths (and beyond its ends along the
// nearest segment); pass: forward or backward.
double at_length(const std::vector<const Calibration::AttentionPoint*>& pts, double n,
                 double Calibration::AttentionPoint::*pass) {
  if (pts.size() == 1) return pts[0]->*pass;
  std::size_t i = 1;
  while (i + 1 < pts.size() && pts[i]->n < n) ++i;
  const auto& lo = *pts[i - 1];
  const auto& hi = *pts[i];
  const double f = std::log(n / lo.n) / std::log(static_cast<double>(hi.n) / lo.n);
  return std::exp(std::log(lo.*pass) + f * (std::log(hi.*pass) - std::log(lo.*pass)));
}

// The table's points at one dim, by length.
std::vector<const Calibration::AttentionPoint*> points_at(const Calibration& cal, int dim) {
  std::vector<const Calibration::AttentionPoint*> out;
  for (const auto& p : cal.hstu_attention)
    if (p.dim == dim) out.push_back(&p);
  std::sort(out.begin(), out.end(), [](auto* x, auto* y) { return x->n < y->n; });
  return out;
}

}  // namespace

std::string hstu_attention_scalar_reason(const ModelSpec& m, DenseMath math,
                                         const DeviceSpec& dev) {
  const HstuSpec& h = *m.hstu;
  if (math != DenseMath::bf16) return fmt::format("{} dense math", dense_math_name(math));
  if (dev.vendor != Vendor::nvidia) return "the tensor-core kernels have no AMD (MFMA) form yet";
  const int a = h.attention_dim;
  if (a != h.value_dim || (a != 16 && a != 32 && a != 64 && a != 128))
    return fmt::format(
        "attention_dim {} and value_dim {}: the tensor-core kernels take equal "
        "dims of 16, 32, 64 or 128",
        a, h.value_dim);
  return {};
}

HstuAttentionCost hstu_attention_cost(const ModelSpec& m, double examples, DenseMath math,
                                      const DeviceSpec& dev, const Calibration& cal) {
  const SequenceMoments sm = sequence_moments(m);
  const HstuSpec& h = *m.hstu;
  const SequenceSpec& s = h.sequence;
  const double heads = h.heads, a = h.attention_dim, v = h.value_dim;
  HstuAttentionCost c;
  c.forward_flops = examples * 2.0 * sm.pairs * heads * (a + v);
  c.backward_flops = examples * 2.0 * sm.pairs * heads * (3.0 * a + 2.0 * v);
  c.tensor_cores = hstu_attention_scalar_reason(m, math, dev).empty();
  if (!c.tensor_cores) {
    const double rate = dev.fp32_flops.value * cal.hstu_attention_scalar_efficiency;
    c.forward_s = c.forward_flops / rate;
    c.backward_s = c.backward_flops / rate;
    return c;
  }
  if (cal.hstu_attention.empty())
    throw InputError(fmt::format(
        "the calibration '{}' has no hstu_attention table for the tensor-core attention on {} "
        "(measure it with attention_bench; docs/perf/hstu.md)",
        cal.source, dev.display_name));
  // The two measured dims nearest to the model's (linear in the dim between or beyond them).
  std::vector<int> dims;
  for (const auto& p : cal.hstu_attention)
    if (std::find(dims.begin(), dims.end(), p.dim) == dims.end()) dims.push_back(p.dim);
  std::sort(dims.begin(), dims.end(), [&](int x, int y) {
    return std::abs(x - h.attention_dim) != std::abs(y - h.attention_dim)
               ? std::abs(x - h.attention_dim) < std::abs(y - h.attention_dim)
               : x < y;
  });
  const auto p0 = points_at(cal, dims[0]);
  const auto p1 = dims.size() > 1 ? points_at(cal, dims[1]) : p0;
  const double shortest = std::max(p0.front()->n, p1.front()->n);
  auto per_token = [&](double n, double Calibration::AttentionPoint::*pass) {
    const double t0 = at_length(p0, n, pass), t1 = at_length(p1, n, pass);
    if (dims.size() < 2) return t0;
    const double f = static_cast<double>(h.attention_dim - dims[0]) / (dims[1] - dims[0]);
    return std::max(t0 + f * (t1 - t0), 0.25 * std::min(t0, t1));
  };
  const int contexts = m.num_tables();
  for (int n = s.min_len; n <= s.max_len; ++n) {
    const double p = detail::length_probability(s, n);
    const double len = std::max<double>(contexts + n + s.targets, shortest);
    c.forward_s += p * len * per_token(len, &Calibration::AttentionPoint::forward_s);
    c.backward_s += p * len * per_token(len, &Calibration::AttentionPoint::backward_s);
  }
  c.forward_s *= examples * heads;
  c.backward_s *= examples * heads;
  return c;
}

}  // namespace parity
