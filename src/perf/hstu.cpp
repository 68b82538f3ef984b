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

// The tensor-core kernels' tiling (src/backend/gpu/hstu_attention.cu): blocks of kRows rows; the
// forward walks key tiles 32 wide at head dims of 128 and more, 64 below; both backward kernels
// walk 64.
constexpr int kRows = 128;
int forward_walk(int dim) {
  return dim >= 128 ? 32 : 64;
}
constexpr int kBackwardWalk = 64;

// Blocks and walked tiles of one head of a sequence of n tokens: block i covers rows
// [128 i, 128 (i + 1)) and walks the tiles up to its last row.
struct Tiles {
  double blocks = 0, tiles = 0;
  double last = 0;  // tiles the last (heaviest) block walks
};
Tiles causal_tiles(std::int64_t n, int walk) {
  Tiles t;
  for (std::int64_t i = 0; i * kRows < n; ++i) {
    const std::int64_t hi = std::min<std::int64_t>(n, (i + 1) * kRows);
    t.blocks += 1;
    t.last = static_cast<double>((hi + walk - 1) / walk);
    t.tiles += t.last;
  }
  return t;
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
  const int contexts = m.num_tables();
  const int fw = forward_walk(h.attention_dim);
  Tiles fwd, bwd;  // per example and head, in expectation
  Tiles fwd_max, bwd_max;
  for (int n = s.min_len; n <= s.max_len; ++n) {
    const double p = detail::length_probability(s, n);
    const std::int64_t len = contexts + n + s.targets;
    const Tiles f = causal_tiles(len, fw), b = causal_tiles(len, kBackwardWalk);
    fwd.blocks += p * f.blocks;
    fwd.tiles += p * f.tiles;
    bwd.blocks += p * b.blocks;
    bwd.tiles += p * b.tiles;
    if (n == s.max_len) {
      fwd_max = f;
      bwd_max = b;
    }
  }
  const double sms = dev.compute_units.value;
  const double peak_per_sm = dev.bf16_flops.value / sms;
  // SM-seconds of one tile: its pairs' elementwise step and their products.
  const double fwd_tile =
      kRows * fw *
      (cal.hstu_attention_forward_pair_s +
       2.0 * (a + v) / (peak_per_sm * cal.hstu_attention_forward_mma_efficiency));
  const double bwd_tile = kRows * kBackwardWalk *
                          (cal.hstu_attention_backward_pair_s +
                           2.0 * (3.0 * a + 2.0 * v) / 2.5 /
                               (peak_per_sm * cal.hstu_attention_backward_mma_efficiency));
  auto pass = [&](const Tiles& mean, const Tiles& longest, double block_s, double tile_s) {
    const double work = examples * heads * (mean.blocks * block_s + mean.tiles * tile_s);
    // The heaviest block (the last rows of the longest sequence) bounds a pass from below.
    return std::max(work / sms, block_s + longest.last * tile_s);
  };
  c.forward_s = pass(fwd, fwd_max, cal.hstu_attention_forward_block_s, fwd_tile);
  c.backward_s = pass(bwd, bwd_max, cal.hstu_attention_backward_block_s, bwd_tile);
  c.blocks = examples * heads * fwd.blocks;
  c.tiles = examples * heads * fwd.tiles;
  return c;
}

}  // namespace parity
