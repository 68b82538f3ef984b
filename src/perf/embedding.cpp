// Embedding lookup and update cost: bytes that must move per step, over the device's
// copy bandwidth times the achieved fraction of the table-batched kernels. Unique rows
// per step (what the fused update reads and writes) come from the id distribution:
// uniform exactly, Zipf by summing the first ranks and integrating the tail.
#include <algorithm>
#include <bit>
#include <cmath>

#include "parity/embedding_kernels.h"
#include "parity/perf.h"

namespace parity {
namespace {

constexpr int kExactRanks = 64;  // ranks summed term by term before the tail integral
constexpr int kTailSteps = 64;   // Simpson intervals (even) over log(rank) in the tail

// Generalised harmonic number sum_{k=1..n} k^-alpha: exact head, then Euler-Maclaurin
// (integral, end-point and first-derivative corrections) for the tail.
double harmonic(double n, double alpha) {
  if (n <= 0) return 0;
  const double head_n = std::min(std::floor(n), static_cast<double>(kExactRanks));
  double h = 0;
  for (int k = 1; k <= static_cast<int>(head_n); ++k) h += std::pow(k, -alpha);
  if (n > head_n) {
    const double a = head_n + 1, b = std::floor(n);
    auto f = [&](double x) { return std::pow(x, -alpha); };
    auto df = [&](double x) { return -alpha * std::pow(x, -alpha - 1); };
    const double integral = std::abs(alpha - 1) < 1e-12
                                ? std::log(b / a)
                                : (std::pow(b, 1 - alpha) - std::pow(a, 1 - alpha)) / (1 - alpha);
    h += integral + (f(a) + f(b)) / 2 + (df(b) - df(a)) / 12;
  }
  return h;
}

// sum_{k=lo..hi} f(k) for smooth f, as the integral over [lo-0.5, hi+0.5] with x = e^t.
template <class F>
double tail_integral(double lo, double hi, F f) {
  if (hi < lo) return 0;
  const double a = std::log(lo - 0.5), b = std::log(hi + 0.5);
  const double step = (b - a) / kTailSteps;
  double s = 0;
  for (int i = 0; i <= kTailSteps; ++i) {
    const double t = a + i * step;
    const double x = std::exp(t);
    const double w = (i == 0 || i == kTailSteps) ? 1 : (i % 2 ? 4 : 2);
    s += w * f(x) * x;  // dx = x dt
  }
  return s * step / 3;
}

}  // namespace

std::string_view placement_name(Placement p) {
  return name_in(kPlacementNames, p);
}

double expected_unique_rows(std::int64_t rows, IdDistribution dist, double alpha, double draws) {
  if (rows <= 0 || draws <= 0) return 0;
  const double r = static_cast<double>(rows);
  if (dist == IdDistribution::uniform || alpha <= 0)
    return rows == 1 ? 1.0 : -r * std::expm1(draws * std::log1p(-1.0 / r));
  // Poisson approximation: E[distinct] = sum_k 1 - exp(-draws * p_k).
  const double h = harmonic(r, alpha);
  auto term = [&](double k) { return -std::expm1(-draws * std::pow(k, -alpha) / h); };
  const double head_n = std::min(r, static_cast<double>(kExactRanks));
  double u = 0;
  for (int k = 1; k <= static_cast<int>(head_n); ++k) u += term(k);
  if (r > head_n) u += tail_integral(head_n + 1, r, term);
  return std::min(u, std::min(r, draws));
}

double hot_fraction(std::int64_t rows, IdDistribution dist, double alpha, double cached) {
  if (rows <= 0) return 1;
  const double r = static_cast<double>(rows);
  const double c = std::clamp(cached, 0.0, r);
  if (dist == IdDistribution::uniform || alpha <= 0) return c / r;
  return harmonic(c, alpha) / harmonic(r, alpha);
}

double expected_heavy_ids(std::int64_t rows, IdDistribution dist, double alpha, double draws) {
  constexpr double kHeavy = kEmbeddingHeavyRow;
  if (rows <= 0 || draws <= kHeavy) return 0;  // a heavy row needs more than kHeavy ids
  const double r = static_cast<double>(rows);
  if (dist == IdDistribution::uniform || alpha <= 0) {
    // An id's row holds Poisson(lambda) other ids: heavy where those reach kHeavy. The tail is
    // summed where it is small (1 - the head would be rounding noise), the head where it is not.
    const double lambda = draws / r;
    const auto pmf = [&](double j) {
      return std::exp(j * std::log(lambda) - lambda - std::lgamma(j + 1.0));
    };
    double p = 0;
    if (lambda < 2 * kHeavy) {
      const double last = kHeavy + 4 * kHeavy + 20 * std::sqrt(lambda);
      for (double j = kHeavy; j <= last; ++j) p += pmf(j);
    } else {
      double below = 0;
      for (double j = 0; j < kHeavy; ++j) below += pmf(j);
      p = 1 - below;
    }
    return draws * std::clamp(p, 0.0, 1.0);
  }
  // Rank k is drawn draws k^-alpha / H(rows) times on average: heavy for k below the rank where
  // that falls to kHeavy.
  const double h = harmonic(r, alpha);
  const double ranks = std::min(r, std::floor(std::pow(draws / (kHeavy * h), 1.0 / alpha)));
  // Alpha near 0 is nearly uniform, where counts' spread, not their means, makes rows heavy:
  // this form counts means only (the zoo's Zipf tables have alpha of 1.05 and more).
  return ranks < 1 ? 0.0 : draws * hot_fraction(rows, dist, alpha, ranks);
}

double optimizer_state_bytes_per_row(OptimizerKind k, int dim) {
  switch (k) {
    case OptimizerKind::sgd:
      return 0;
    case OptimizerKind::rowwise_adagrad:
      return 4;
    case OptimizerKind::adagrad:
      return 4.0 * dim;
    case OptimizerKind::adam:
      return 8.0 * dim;
  }
  return 0;
}

RadixSort default_radix_sort(const DeviceSpec& device) {
  return device.vendor == Vendor::nvidia ? RadixSort::vendor : RadixSort::portable;
}

double radix_sort_bytes(RadixSort sort, double n, int key_bits) {
  constexpr double kPairBytes = 8, kKeyBytes = 4, kCountBytes = 4;
  constexpr int kDigits = 256;
  const int passes = (std::min(key_bits, 32) + 7) / 8;
  if (sort == RadixSort::vendor) return kKeyBytes * n + passes * 2 * kPairBytes * n;
  const double tiles = std::max(1.0, std::ceil(n / static_cast<double>(kPortableSortTile)));
  return passes * (kKeyBytes * n + 2 * kPairBytes * n + 3 * kCountBytes * kDigits * tiles);
}

int embedding_key_bits(double rows) {
  return static_cast<int>(std::bit_width(static_cast<std::uint64_t>(std::max(rows, 0.0))));
}

EmbeddingTraffic embedding_traffic(const EmbeddingBatch& b) {
  constexpr double kIdBytes = 8;    // ids and offsets are int64
  constexpr double kWordBytes = 4;  // keys, bag indices and segment starts are uint32
  const double sw = static_cast<double>(dtype_size(b.weight_dtype));
  const double io = static_cast<double>(dtype_size(b.io_dtype));
  const double offsets = kIdBytes * (static_cast<double>(b.tables.size()) * b.batch + 1);
  EmbeddingTraffic t;
  t.weight_dtype = b.weight_dtype;
  double ids = 0, unique = 0;
  t.forward = offsets;
  for (const auto& tb : b.tables) {
    ids += tb.ids;
    unique += tb.unique_rows;
    t.heavy_ids += tb.heavy_ids;
    t.forward += kIdBytes * tb.ids + tb.ids * tb.dim * sw + b.batch * tb.dim * io;
    const double slice = b.batch * tb.dim * io;
    t.gradients += slice;
    if (b.cache_bytes > 0 && slice > b.cache_bytes) {
      t.gradient_rereads +=
          std::max(0.0, tb.ids - b.batch) * tb.dim * io * (1 - b.cache_bytes / slice);
    }
    t.rows +=
        2 * tb.unique_rows * (tb.dim * sw + optimizer_state_bytes_per_row(b.optimizer, tb.dim));
  }
  // Keys: read ids and offsets, write (key, bag) pairs. Segments: read the sorted keys, write
  // each distinct row's start. Update: read the starts (begin and end) and the sorted pairs.
  t.ids_and_keys = kIdBytes * ids + offsets + 2 * kWordBytes * ids + kWordBytes * ids +
                   kWordBytes * unique + 2 * kWordBytes * unique + 2 * kWordBytes * ids;
  t.sort = radix_sort_bytes(b.sort, ids, b.key_bits);
  return t;
}

double embedding_backward_seconds(const EmbeddingTraffic& t, const DeviceSpec& device,
                                  const Calibration& cal) {
  const double copy_bw = device.hbm_bandwidth.value * cal.hbm_efficiency;
  const bool narrow = dtype_size(t.weight_dtype) == 2;
  const double rows_eff =
      narrow ? cal.embedding_update_efficiency_16bit : cal.embedding_backward_efficiency;
  return (t.backward() - t.rows) / (copy_bw * cal.embedding_backward_efficiency) +
         t.rows / (copy_bw * rows_eff) + t.heavy_ids * cal.embedding_heavy_lookup_s;
}

double embedding_backward_fixed_seconds(bool any_heavy, const Calibration& cal) {
  return cal.embedding_backward_fixed_s + (any_heavy ? cal.embedding_heavy_fixed_s : 0.0);
}

EmbeddingCost embedding_cost(const EmbeddingShardWork& w, const DeviceSpec& device,
                             const Calibration& cal) {
  EmbeddingCost c;
  if (w.rows <= 0 || w.dim <= 0) return c;
  const double sw = static_cast<double>(dtype_size(w.weight_dtype));
  const double d = w.dim;
  // The shard as a group of its own, its sort keys as wide as the device's tables need.
  c.unique_rows = expected_unique_rows(w.rows, w.distribution, w.zipf_alpha, w.lookups);
  c.heavy_ids = expected_heavy_ids(w.rows, w.distribution, w.zipf_alpha, w.lookups);
  const EmbeddingBatch::Table table{w.dim, w.lookups, c.unique_rows, c.heavy_ids};
  const EmbeddingTraffic t = embedding_traffic({{&table, 1},
                                                w.bags,
                                                w.weight_dtype,
                                                w.io_dtype,
                                                w.optimizer,
                                                default_radix_sort(device),
                                                w.key_bits,
                                                device.l2_bytes.value + device.llc_bytes.value});
  c.forward_bytes = t.forward;
  c.backward_bytes = t.backward();
  const double state = optimizer_state_bytes_per_row(w.optimizer, w.dim);
  const double copy_bw = device.hbm_bandwidth.value * cal.hbm_efficiency;
  c.forward_s =
      c.forward_bytes / (copy_bw * cal.embedding_forward_efficiency) + cal.kernel_launch_s;
  c.backward_s = embedding_backward_seconds(t, device, cal);
  if (w.placement == Placement::host) {
    // The kernels reach rows missing from the HBM cache in host memory, over the host link:
    // the forward reads the row of every missed lookup, scattered single rows at the link's
    // gather rate; the backward reads and writes each missed row once with its state, in both
    // directions at once. The cold ids are treated as uniform over the cold rows (an upper
    // bound for Zipf).
    const double hit = hot_fraction(w.rows, w.distribution, w.zipf_alpha, w.cache_rows);
    const auto cold_rows =
        static_cast<std::int64_t>(std::max(1.0, static_cast<double>(w.rows) - w.cache_rows));
    const double missed_lookups = w.lookups * (1 - hit);
    const double missed =
        expected_unique_rows(cold_rows, IdDistribution::uniform, 0, missed_lookups);
    const double gathered = missed_lookups * d * sw, updated = 2 * missed * (d * sw + state);
    c.host_bytes = gathered + updated;
    c.host_s = gathered / (device.host_link_bandwidth.value * cal.host_gather_efficiency) +
               updated / (device.host_link_bandwidth.value * cal.host_link_efficiency);
  }
  return c;
}

}  // namespace parity
