// GEMM time: a roofline per candidate tile with tile quantization (the problem padded
// to whole tiles) and wave quantization (tiles run in waves of CUs x concurrent tiles),
// plus one launch. Ranking the candidates by this time is the zero-warm-up selection:
// no timing runs, and the same shape always gets the same answer.
#include <algorithm>
#include <cmath>

#include "parity/perf.h"

namespace parity {
namespace {

double math_bytes(DenseMath m) { return m == DenseMath::bf16 || m == DenseMath::fp16 ? 2.0 : 4.0; }

}  // namespace

std::vector<GemmTile> gemm_candidates(const DeviceSpec& device, DenseMath math) {
  if (math == DenseMath::fp32) {
    // Vector (non-matrix-unit) kernels use smaller tiles.
    return {{128, 128, 1}, {128, 64, 2}, {64, 128, 2}, {64, 64, 2}};
  }
  if (device.vendor == Vendor::amd) {
    return {{256, 256, 1}, {256, 128, 1}, {128, 256, 1}, {128, 128, 2}, {128, 64, 2}, {64, 64, 4}};
  }
  return {{128, 256, 1}, {256, 128, 1}, {128, 128, 2}, {128, 64, 2}, {64, 128, 2}, {64, 64, 4}};
}

double memory_pass_time(double bytes, const DeviceSpec& device, const Calibration& cal) {
  return bytes / (device.hbm_bandwidth.value * cal.hbm_efficiency) + cal.kernel_launch_s;
}

GemmEstimate gemm_time(const GemmShape& s, const GemmTile& tile, const DeviceSpec& device,
                       const Calibration& cal) {
  GemmEstimate e;
  e.tile = tile;
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) return e;
  const double peak = device.dense_flops(s.math) * cal.gemm_efficiency(s.math);
  const double cus = device.compute_units.value;
  const double tiles = std::ceil(static_cast<double>(s.m) / tile.m) *
                       std::ceil(static_cast<double>(s.n) / tile.n);
  const double slots = cus * tile.ctas_per_cu;
  e.waves = std::ceil(tiles / slots);
  // One wave: every slot computes a full tile at 1/slots of the device's rate.
  e.compute_s = e.waves * (2.0 * tile.m * tile.n * static_cast<double>(s.k)) * slots / peak;
  const double sz = math_bytes(s.math);
  e.bytes = (static_cast<double>(s.m) * s.k + static_cast<double>(s.k) * s.n +
             static_cast<double>(s.m) * s.n) * sz;
  e.memory_s = e.bytes / (device.hbm_bandwidth.value * cal.hbm_efficiency);
  e.flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;
  e.seconds = std::max(e.compute_s, e.memory_s) + cal.kernel_launch_s;
  return e;
}

GemmEstimate gemm_best(const GemmShape& s, const DeviceSpec& device, const Calibration& cal) {
  GemmEstimate best;
  bool first = true;
  for (const auto& t : gemm_candidates(device, s.math)) {
    const GemmEstimate e = gemm_time(s, t, device, cal);
    if (first || e.seconds < best.seconds) best = e;
    first = false;
  }
  return best;
}

}  // namespace parity
