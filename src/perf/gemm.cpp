// GEMM time: a roofline per candidate tile with tile quantization (the problem padded
// to whole tiles) and wave quantization (tiles run in waves of CUs x concurrent tiles),
// plus one launch; split-K candidates cut k into slices (more tiles for a small m x n) and pay
// for their partial results and a second launch. Ranking the candidates by this time is the
// zero-warm-up selection: no timing runs, and the same shape always gets the same answer.
#include <algorithm>
#include <cmath>
#include <limits>

#include "parity/perf.h"

namespace parity {

double dense_operand_bytes(DenseMath m) {
  return m == DenseMath::bf16 || m == DenseMath::fp16 ? 2.0 : 4.0;
}

std::vector<GemmTile> gemm_candidates(const DeviceSpec& device, DenseMath math) {
  std::vector<GemmTile> tiles;
  if (math == DenseMath::fp32) {
    // Vector (non-matrix-unit) kernels use smaller tiles.
    tiles = {{128, 128, 1}, {128, 64, 2}, {64, 128, 2}, {64, 64, 2}};
  } else if (device.vendor == Vendor::amd) {
    tiles = {{256, 256, 1}, {256, 128, 1}, {128, 256, 1}, {128, 128, 2}, {128, 64, 2}, {64, 64, 4}};
  } else {
    tiles = {{128, 256, 1}, {256, 128, 1}, {128, 128, 2}, {128, 64, 2}, {64, 128, 2}, {64, 64, 4}};
  }
  // Split-K variants of each tile: they fill the device when m x n has few tiles and k is long
  // (the weight gradients, whose k is the batch), as the libraries' out-of-place split-K does.
  std::vector<GemmTile> all;
  for (const GemmTile& t : tiles)
    for (int split : {1, 2, 4, 8, 16, 32}) {
      GemmTile c = t;
      c.split_k = split;
      all.push_back(c);
    }
  return all;
}

bool fused_checked_products(const DeviceSpec& device) {
  return device.vendor == Vendor::nvidia && device.arch == "sm_90";
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
  const double tiles =
      std::ceil(static_cast<double>(s.m) / tile.m) * std::ceil(static_cast<double>(s.n) / tile.n);
  const double slots = cus * tile.ctas_per_cu;
  const int split = std::max(tile.split_k, 1);
  e.flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;
  // A slice shorter than kMinSliceK is not modelled (the libraries do not cut k that fine).
  constexpr std::int64_t kMinSliceK = 256;
  if (split > 1 && s.k < split * kMinSliceK) {
    e.seconds = e.compute_s = std::numeric_limits<double>::infinity();
    return e;
  }
  const double slice_k = std::ceil(static_cast<double>(s.k) / split);
  e.waves = std::ceil(tiles * split / slots);
  // One wave: every slot computes a full tile (of one k slice) at 1/slots of the device's rate.
  e.compute_s = e.waves * (2.0 * tile.m * tile.n * slice_k) * slots / peak;
  const double sz = dense_operand_bytes(s.math);
  const double out = s.output_bytes > 0 ? s.output_bytes : sz;
  e.bytes = (static_cast<double>(s.m) * s.k + static_cast<double>(s.k) * s.n) * sz +
            static_cast<double>(s.m) * s.n * out;
  // Split-K: the slices' fp32 partial results are written, then read by the reduction.
  if (split > 1) e.bytes += 2.0 * split * static_cast<double>(s.m) * s.n * 4.0;
  e.memory_s = e.bytes / (device.hbm_bandwidth.value * cal.hbm_efficiency);
  e.seconds = std::max(e.compute_s, e.memory_s) + cal.kernel_launch_s * (split > 1 ? 2 : 1);
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
