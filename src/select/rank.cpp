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

int operand_alignment(int address_alignment, std::int64_t lead, int element_bytes) {
  return std::min(address_alignment, largest_power_of_two_dividing(lead * element_bytes));
}

std::vector<KernelEstimate> rank_gemm_kernels(const GemmProblem& p, const GemmCatalog& c,
                                              double hbm_bytes_per_s) {
  if (!(hbm_bytes_per_s > 0))
    throw Error("rank_gemm_kernels: the memory rate must be above 0 bytes/s");
  std::vector<KernelEstimate> out;
  const CatalogGroup* g = c.group_for(p);
  if (g == nullptr || p.m <= 0 || p.n <= 0 || p.k <= 0) return out;
  const int e = gemm_operand_bytes(p.type);
  const int align_a = operand_alignment(p.align_a, p.lead_a(), e);
  const int align_b = operand_alignment(p.align_b, p.lead_b(), e);
  const int align_d = operand_alignment(p.align_d, p.lead_d(), p.output_bytes());
  const double mn = static_cast<double>(p.m) * static_cast<double>(p.n);
  const double once =
      (static_cast<double>(p.m) * p.k + static_cast<double>(p.k) * p.n) * e + mn * p.output_bytes();
  for (const CatalogKernel& ck : g->kernels) {
    if (align_a < ck.min_align_a || align_b < ck.min_align_b || align_d < ck.min_align_d) continue;
    const GemmKernel& k = ck.kernel;
    const auto [tm, tn, tk] = counted_tile(k);
    const double d_tiles = static_cast<double>(ceil_div(p.m, tm) * ceil_div(p.n, tn));
    for (const int split : kSplits) {
      if (split > 1 && (split > ck.max_split_k || p.k / split < std::max(kMinSliceK, tk) ||
                        d_tiles >= 2 * ck.slots))
        break;
      const double waves = std::ceil(d_tiles * split / ck.slots);
      const double steps = static_cast<double>(ceil_div(ceil_div(p.k, split), tk));
      double t = ck.fixed_s + waves * (ck.tile_s + steps * ck.kstep_s);
      if (split > 1) t += c.reduction_fixed_s + (2.0 * split + 1.0) * mn * 4.0 / hbm_bytes_per_s;
      t = std::max(t, ck.fixed_s + once / hbm_bytes_per_s);
      KernelEstimate est;
      est.kernel = k;
      est.kernel.split_k = split;
      est.kernel.reduction = split > 1 ? ck.split_reduction : SplitReduction::none;
      est.seconds = t;
      est.waves = waves;
      out.push_back(std::move(est));
    }
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

}  // namespace parity
