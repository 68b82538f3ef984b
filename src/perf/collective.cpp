// Collectives: latency plus bytes over bus bandwidth, with nccl-tests' bus-bandwidth
// factors (all-reduce 2(n-1)/n, the others (n-1)/n), hierarchical when the ranks span
// several scale-up domains (intra-domain over the scale-up links, inter-domain over
// each GPU's NIC).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "parity/error.h"
#include "parity/perf.h"

namespace parity {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_to_all:
      return "all_to_all";
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
  }
  return "?";
}

double collective_time(Collective c, double bytes, int gpus, const DeviceSpec& device,
                       const Calibration& cal) {
  if (gpus <= 1 || bytes <= 0) return 0;
  const double n = gpus;
  const double d = std::min(n, device.scale_up_domain.value);
  const double nodes = std::ceil(n / d);
  const double up = device.scale_up_bandwidth.value * cal.scale_up_efficiency;
  const double out = device.scale_out_bandwidth.value * cal.scale_out_efficiency;
  const double lat_up = cal.collective_latency_up_s, lat_out = cal.collective_latency_out_s;
  if (c == Collective::all_to_all) {
    // Each rank sends bytes/n to every rank; links run concurrently.
    const double intra = (d - 1) / n * bytes / up;
    const double inter = nodes > 1 ? (n - d) / n * bytes / out : 0;
    return (nodes > 1 ? lat_out : lat_up) + std::max(intra, inter);
  }
  const double factor = c == Collective::all_reduce ? 2.0 : 1.0;
  if (nodes <= 1) return lat_up + factor * (n - 1) / n * bytes / up;
  // Hierarchical: within the domain over scale-up, then 1/d of the data per GPU across
  // domains over its NIC.
  const double intra = factor * (d - 1) / d * bytes / up;
  const double inter = factor * (nodes - 1) / nodes * (bytes / d) / out;
  return factor * lat_up + lat_out + intra + inter;
}

CollectiveFit fit_scale_up(const std::vector<CollectiveSample>& samples, const DeviceSpec& device) {
  const double up = device.scale_up_bandwidth.value;
  if (!(up > 0))
    throw InputError(fmt::format("{}: no scale-up bandwidth to fit a collective model against",
                                 device.display_name));
  // Per sample: c, the seconds its bus bytes take at the full scale-up rate (collective_time's
  // within one domain, latency aside).
  std::vector<double> c, t;
  std::set<double> sizes;
  for (const CollectiveSample& s : samples) {
    if (s.gpus < 2 || s.gpus > device.scale_up_domain.value)
      throw InputError(fmt::format(
          "a {} sample over {} ranks: the scale-up fit takes 2 to {} ranks (one {} domain)",
          collective_name(s.kind), s.gpus, device.scale_up_domain.value, device.display_name));
    if (!(s.bytes > 0) || !(s.seconds > 0) || !std::isfinite(s.seconds))
      throw InputError(fmt::format("a {} sample of {} bytes in {} s: both must be positive",
                                   collective_name(s.kind), s.bytes, s.seconds));
    const double n = s.gpus;
    const double factor = s.kind == Collective::all_reduce ? 2.0 : 1.0;
    c.push_back(factor * (n - 1) / n * s.bytes / up);
    t.push_back(s.seconds);
    sizes.insert(s.bytes);
  }
  if (sizes.size() < 2)
    throw InputError(fmt::format("{} samples of {} distinct sizes: the fit needs two sizes or more",
                                 samples.size(), sizes.size()));
  // Minimise Σ ((L + c_i E - t_i) / t_i)² over L and E = 1 / efficiency: the 2x2 normal
  // equations, then each bound enforced with the other term refitted alone.
  double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double w = 1 / (t[i] * t[i]);
    a11 += w;
    a12 += w * c[i];
    a22 += w * c[i] * c[i];
    b1 += w * t[i];
    b2 += w * c[i] * t[i];
  }
  const double det = a11 * a22 - a12 * a12;
  double L = det > 0 ? (b1 * a22 - b2 * a12) / det : 0;
  double E = det > 0 ? (a11 * b2 - a12 * b1) / det : b2 / a22;
  if (L < 0) {
    L = 0;
    E = b2 / a22;
  }
  if (E < 1) {
    E = 1;
    L = std::max(0.0, (b1 - a12) / a11);
  }
  CollectiveFit fit;
  fit.latency_s = L;
  fit.efficiency = 1 / E;
  fit.samples = static_cast<int>(c.size());
  double squares = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double e = (L + c[i] * E - t[i]) / t[i];
    squares += e * e;
    fit.worst_relative_error = std::max(fit.worst_relative_error, std::fabs(e));
  }
  fit.rms_relative_error = std::sqrt(squares / static_cast<double>(c.size()));
  return fit;
}

}  // namespace parity
