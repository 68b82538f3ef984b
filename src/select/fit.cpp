// The catalog's per-configuration constants from timed runs (the formula is in parity/select.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "parity/error.h"
#include "parity/select.h"

namespace parity {
namespace {

using Vec = std::array<double, 3>;

Vec features(const CostSample& s) {
  return {1.0, s.waves, s.waves * s.steps};
}

// Solves the n×n system a·x = b in place (partial pivoting); false when it is singular.
bool solve(std::array<Vec, 3>& a, Vec& b, int n) {
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    if (!(std::abs(a[pivot][c]) > 1e-300)) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 0; c < n; ++c) b[c] /= a[c][c];
  return true;
}

}  // namespace

CostFit fit_stream_costs(double fixed_s, const CostSample& shallow, const CostSample& deep) {
  for (const CostSample* s : {&shallow, &deep})
    if (!(s->seconds > 0) || !(s->waves > 0) || !(s->steps > 0))
      throw Error(
          "fitting a configuration's streaming costs: a run with a time, waves or steps "
          "not above 0");
  if (!(deep.steps > shallow.steps))
    throw Error("fitting a configuration's streaming costs needs a deeper second run");
  // Per wave, less the fixed cost: tile + steps · kstep at each depth.
  const double a = std::max(shallow.seconds - fixed_s, 0.0) / shallow.waves;
  const double b = std::max(deep.seconds - fixed_s, 0.0) / deep.waves;
  CostFit f;
  f.fixed_s = fixed_s;
  f.kstep_s = (b - a) / (deep.steps - shallow.steps);
  f.tile_s = a - shallow.steps * f.kstep_s;
  if (f.kstep_s < 0) {
    f.kstep_s = 0;
    f.tile_s = b;
  } else if (f.tile_s < 0) {
    f.tile_s = 0;
    f.kstep_s = b / deep.steps;
  }
  double sq = 0;
  for (const CostSample* s : {&shallow, &deep}) {
    const double e = (fixed_s + s->waves * (f.tile_s + s->steps * f.kstep_s)) / s->seconds - 1.0;
    sq += e * e;
  }
  f.rms_relative_error = std::sqrt(sq / 2);
  return f;
}

CostFit fit_kernel_costs(const std::vector<CostSample>& samples) {
  if (samples.size() < 3)
    throw Error("fitting a configuration's costs needs at least three timed runs");
  for (const CostSample& s : samples)
    if (!(s.seconds > 0) || !(s.waves > 0) || !(s.steps > 0))
      throw Error("fitting a configuration's costs: a run with a time, waves or steps not above 0");
  // Every subset of the three constants free (the others 0), solved for the least squares of the
  // relative error; the best whose constants are all non-negative. The full set is tried first.
  CostFit best;
  double best_sq = std::numeric_limits<double>::infinity();
  for (const unsigned mask : {7u, 6u, 5u, 3u, 4u, 2u, 1u}) {
    int idx[3], n = 0;
    for (int i = 0; i < 3; ++i)
      if (mask & (1u << i)) idx[n++] = i;
    std::array<Vec, 3> a{};
    Vec b{};
    for (const CostSample& s : samples) {
      const Vec f = features(s);
      const double w = 1.0 / (s.seconds * s.seconds);
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) a[r][c] += w * f[idx[r]] * f[idx[c]];
        b[r] += w * f[idx[r]] * s.seconds;
      }
    }
    if (!solve(a, b, n)) continue;
    Vec x{};
    bool ok = true;
    for (int r = 0; r < n; ++r) {
      x[idx[r]] = b[r];
      ok = ok && b[r] >= 0;
    }
    if (!ok) continue;
    double sq = 0;
    for (const CostSample& s : samples) {
      const Vec f = features(s);
      const double e = (x[0] * f[0] + x[1] * f[1] + x[2] * f[2]) / s.seconds - 1.0;
      sq += e * e;
    }
    if (sq < best_sq) {
      best_sq = sq;
      best.fixed_s = x[0];
      best.tile_s = x[1];
      best.kstep_s = x[2];
    }
  }
  best.rms_relative_error = std::sqrt(best_sq / static_cast<double>(samples.size()));
  return best;
}

}  // namespace parity
