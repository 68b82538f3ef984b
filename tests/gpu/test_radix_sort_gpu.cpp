// The radix sort of the embedding backward against std::stable_sort, both methods.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(GpuRadixSort, MatchesStableSortForBothMethods) {
  PARITY_REQUIRE_GPU();
#if defined(PARITY_GPU_HIP)
  const SortMethod methods[] = {SortMethod::portable};  // no vendor sort on HIP
#else
  const SortMethod methods[] = {SortMethod::vendor, SortMethod::portable};
#endif
  for (SortMethod method : methods) {
    for (std::int64_t n : {0, 1, 2, 33, 4095, 4096, 4097, 100000, 1000003}) {
      for (int bits : {1, 8, 13, 24, 32}) {
        Rand rand(static_cast<std::uint64_t>(n * 97 + bits));
        std::vector<std::uint32_t> keys(static_cast<std::size_t>(n)), vals(keys.size());
        const std::uint64_t range =
            bits == 32 ? (std::uint64_t{1} << 32) : (std::uint64_t{1} << bits);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          // Few distinct values for small bit counts: many ties, so stability is tested.
          keys[i] =
              static_cast<std::uint32_t>(rand.integer(0, static_cast<std::int64_t>(range - 1)));
          vals[i] = static_cast<std::uint32_t>(i);
        }
        RadixSorter sorter(std::max<std::int64_t>(n, 1), method);
        DeviceBuffer<std::uint32_t> k0 = to_device(keys), k1(std::max<std::size_t>(keys.size(), 1));
        DeviceBuffer<std::uint32_t> v0 = to_device(vals), v1(std::max<std::size_t>(keys.size(), 1));
        std::uint32_t* const kb[2] = {k0.data(), k1.data()};
        std::uint32_t* const vb[2] = {v0.data(), v1.data()};
        Stream s;
        const int cur = sorter.sort_pairs(s.get(), kb, vb, n, bits);
        s.synchronize();
        const auto got_k = to_host(cur == 0 ? k0 : k1, keys.size());
        const auto got_v = to_host(cur == 0 ? v0 : v1, keys.size());
        std::vector<std::size_t> order(keys.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
        int bad = 0;
        for (std::size_t i = 0; i < order.size(); ++i) {
          if ((got_k[i] != keys[order[i]] || got_v[i] != vals[order[i]]) && ++bad <= 3) {
            ADD_FAILURE() << sort_method_name(sorter.method()) << " n=" << n << " bits=" << bits
                          << ": position " << i << " holds (" << got_k[i] << ", " << got_v[i]
                          << "), expected (" << keys[order[i]] << ", " << vals[order[i]] << ")";
          }
        }
        ASSERT_EQ(bad, 0);
      }
    }
  }
}

}  // namespace
}  // namespace parity::gpu::test
