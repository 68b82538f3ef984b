// Pruning a measured catalog to the configurations the ranking can prefer (parity/select.h).
#include <set>
#include <string>

#include "parity/select.h"

namespace parity {

std::vector<CatalogKernel> useful_kernels(const GemmCatalog& c, const CatalogGroup& g,
                                          double hbm_bytes_per_s) {
  GemmCatalog one;
  one.reduction_fixed_s = c.reduction_fixed_s;
  one.multiprocessors = c.multiprocessors;
  one.l2_bytes = c.l2_bytes;
  // Without the floor of the cheapest call: on small shapes it would tie every configuration
  // and keep them all.
  one.call_s = 0;
  one.groups.push_back(g);
  std::set<std::string> keep;
  const std::int64_t sizes[] = {64, 256, 1024, 4096, 16384, 65536};
  const std::int64_t depths[] = {64, 512, 4096, 32768};
  for (const std::int64_t m : sizes)
    for (const std::int64_t n : sizes)
      for (const std::int64_t k : depths)
        for (const std::int64_t past : {0, 1, 2, 4}) {
          GemmProblem p = g.kind();
          p.m = m + past;
          p.n = n + past;
          p.k = k + past;
          const auto r = rank_gemm_kernels(p, one, hbm_bytes_per_s);
          for (std::size_t i = 0; i < r.size(); ++i) {
            if (i >= 3 && r[i].seconds > 1.03 * r[0].seconds) break;
            GemmKernel base = r[i].kernel;
            base.split_k = 1;
            base.reduction = SplitReduction::none;
            keep.insert(base.key());
          }
        }
  std::vector<CatalogKernel> out;
  for (const CatalogKernel& k : g.kernels)
    if (keep.count(k.kernel.key())) out.push_back(k);
  return out;
}

void prune_gemm_catalog(GemmCatalog& c, double hbm_bytes_per_s) {
  for (CatalogGroup& g : c.groups) g.kernels = useful_kernels(c, g, hbm_bytes_per_s);
}

}  // namespace parity
