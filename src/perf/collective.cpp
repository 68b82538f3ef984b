// Collectives: latency plus bytes over bus bandwidth, with nccl-tests' bus-bandwidth
// factors (all-reduce 2(n-1)/n, the others (n-1)/n), hierarchical when the ranks span
// several scale-up domains (intra-domain over the scale-up links, inter-domain over
// each GPU's NIC).
#include <algorithm>
#include <cmath>

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

}  // namespace parity
