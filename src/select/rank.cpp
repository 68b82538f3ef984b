// Ranking the catalog's configurations for one problem (the formula is in parity/select.h).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "parity/error.h"
#include "parity/select.h"

namespace parity {
namespace {

// The split-K depths tried for a configuration whose tiles of D fill less than two waves (the
// enumeration's rule, blas_kernels.h), with at least kMinSliceK of k a slice.
constexpr int kSplits[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
constexpr std::int64_t kMinSliceK = 128;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

int largest_power_of_two_dividing(std::int64_t v) {
  if (v <= 0) return 256;
  const std::int64_t low = v & -v;
  return static_cast<int>(std::min<std::int64_t>(low, 256));
}

}  // namespace

double catalog_tiles(const GemmKernel& k, std::int64_t m, std::int64_t n) {
  const auto [tm, tn, tk] = counted_tile(k);
  const std::int64_t cm = std::max(k.cluster_m, 1), cn = std::max(k.cluster_n, 1);
  return static_cast<double>(ceil_div(ceil_div(m, tm), cm) * cm) *
         static_cast<double>(ceil_div(ceil_div(n, tn), cn) * cn);
}

double catalog_waves(double tiles, double slots, int multiprocessors) {
  const double p = multiprocessors;
  if (p > 0 && slots > p) return std::ceil(tiles / p) * p / slots;
  return std::ceil(tiles / slots);
}

int operand_alignment(int address_alignment, std::int64_t lead, int element_bytes) {
  return std::min(address_alignment, largest_power_of_two_dividing(lead * element_bytes));
}

int operand_alignment(int address_alignment, std::int64_t rows, std::int64_t /*cols*/,
                      std::int64_t lead, int element_bytes) {
  if (rows == 1) return address_alignment;
  return operand_alignment(address_alignment, lead, element_bytes);
}

int operand_alignment(int address_alignment, std::int64_t rows, std::int64_t cols,
                      std::int64_t lead, int element_bytes, bool k_along_cols) {
  if (k_along_cols ? rows == 1 : cols == 1 && lead == 1) return address_alignment;
  return operand_alignment(address_alignment, lead, element_bytes);
}

double memory_regime(const GemmProblem& p, std::int64_t l2_bytes) {
  if (l2_bytes <= 0) return 0.0;
  const double e = gemm_operand_bytes(p.type);
  const double footprint = (static_cast<double>(p.m) * p.k + static_cast<double>(p.k) * p.n) * e +
                           static_cast<double>(p.m) * p.n * p.output_bytes();
  return std::clamp(std::log2(footprint / static_cast<double>(l2_bytes)), 0.0, 1.0);
}

std::vector<KernelEstimate> rank_gemm_kernels(const GemmProblem& p, const GemmCatalog& c,
                                              double hbm_bytes_per_s) {
  if (!(hbm_bytes_per_s > 0))
    throw Error("rank_gemm_kernels: the memory rate must be above 0 bytes/s");
  std::vector<KernelEstimate> out;
  const CatalogGroup* g = c.group_for(p);
  if (g == nullptr || p.m <= 0 || p.n <= 0 || p.k <= 0) return out;
  const int e = gemm_operand_bytes(p.type);
  // A and B as stored: [k, m] or [m, k], [n, k] or [k, n].
  const int align_a =
      operand_alignment(p.align_a, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lead_a(), e, !p.ta);
  const int align_b =
      operand_alignment(p.align_b, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.lead_b(), e, p.tb);
  const int align_d = operand_alignment(p.align_d, p.m, p.n, p.lead_d(), p.output_bytes());
  const double mn = static_cast<double>(p.m) * static_cast<double>(p.n);
  const double once =
      (static_cast<double>(p.m) * p.k + static_cast<double>(p.k) * p.n) * e + mn * p.output_bytes();
  // The kind's measured peak bounds every configuration (a catalog made in code may have none).
  const double compute_floor =
      g->peak_flops_per_s > 0 ? 2.0 * mn * static_cast<double>(p.k) / g->peak_flops_per_s : 0.0;
  const double streamed = memory_regime(p, c.l2_bytes);
  for (const CatalogKernel& ck : g->kernels) {
    if (align_a < ck.min_align_a || align_b < ck.min_align_b || align_d < ck.min_align_d) continue;
    const GemmKernel& k = ck.kernel;
    const double w = ck.has_stream_costs() ? streamed : 0.0;
    const double tile_s = (1 - w) * ck.tile_s + w * ck.stream_tile_s;
    const double kstep_s = (1 - w) * ck.kstep_s + w * ck.stream_kstep_s;
    const std::int64_t tk = counted_tile(k).k;
    const double d_tiles = catalog_tiles(k, p.m, p.n);
    // The configuration's fastest split (the first on equal times): one entry a configuration.
    double best_t = 0, best_waves = 0;
    int best_split = 0;
    for (const int split : kSplits) {
      if (split > 1 && (split > ck.max_split_k || p.k / split < std::max(kMinSliceK, tk) ||
                        d_tiles >= 2 * ck.slots || split * mn * 4.0 > kGemmWorkspaceBytes))
        break;
      const double waves = catalog_waves(d_tiles * split, ck.slots, c.multiprocessors);
      const double steps = static_cast<double>(ceil_div(ceil_div(p.k, split), tk));
      double t = ck.fixed_s + waves * (tile_s + steps * kstep_s);
      if (split > 1) t += c.reduction_fixed_s + (2.0 * split + 1.0) * mn * 4.0 / hbm_bytes_per_s;
      t = std::max({t, ck.fixed_s + once / hbm_bytes_per_s, ck.fixed_s + compute_floor, c.call_s});
      if (best_split == 0 || t < best_t) {
        best_t = t;
        best_waves = waves;
        best_split = split;
      }
    }
    KernelEstimate est;
    est.kernel = k;
    est.kernel.split_k = best_split;
    est.kernel.reduction = best_split > 1 ? ck.split_reduction : SplitReduction::none;
    est.seconds = best_t;
    est.waves = best_waves;
    out.push_back(std::move(est));
  }
  // Fastest first; equal times in the order of the configurations' fields.
  const auto fields = [](const GemmKernel& k) {
    return std::tie(k.algo, k.tile_m, k.tile_n, k.tile_k, k.stages, k.cluster_m, k.cluster_n,
                    k.split_k, k.reduction, k.swizzle, k.custom, k.inner);
  };
  std::sort(out.begin(), out.end(), [&](const KernelEstimate& a, const KernelEstimate& b) {
    if (a.seconds != b.seconds) return a.seconds < b.seconds;
    return fields(a.kernel) < fields(b.kernel);
  });
  return out;
}

bool find_catalog_kernel(const GemmCatalog& c, const GemmProblem& kind, const std::string& key,
                         GemmKernel& out) {
  const CatalogGroup* g = c.group_for(kind);
  if (g == nullptr) return false;
  for (const CatalogKernel& ck : g->kernels)
    for (const int split : kSplits) {
      if (split > 1 && split > ck.max_split_k) break;
      GemmKernel k = ck.kernel;
      k.split_k = split;
      k.reduction = split > 1 ? ck.split_reduction : SplitReduction::none;
      if (k.key() == key) {
        out = k;
        return true;
      }
    }
  return false;
}

}  // namespace parity
