// The GPU runtime: device facts, allocation failures and launch-shape limits named in the error.
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

TEST(GpuRuntime, DeviceInfo) {
  PARITY_REQUIRE_GPU();
  const DeviceInfo& d = device_info();
  EXPECT_TRUE(d.warp_size == 32 || d.warp_size == 64) << d.warp_size;
  EXPECT_GT(d.multiprocessor_count, 0);
  EXPECT_GT(d.l2_cache_bytes, 0);
  EXPECT_GE(d.shared_memory_per_block_optin, d.shared_memory_per_block);
  EXPECT_GE(d.max_threads_per_multiprocessor, d.max_threads_per_block);
  std::printf("device: %s, %d SMs, warp %d, L2 %lld MB, %.1f GB\n", d.name.c_str(),
              d.multiprocessor_count, d.warp_size, static_cast<long long>(d.l2_cache_bytes >> 20),
              d.total_memory_bytes / 1e9);
}

TEST(GpuRuntime, AllocationFailureNamesTheBuffer) {
  PARITY_REQUIRE_GPU();
  try {
    DeviceBuffer<float> huge(std::size_t{1} << 50, "a buffer far too large");
    FAIL() << "allocating 4 PB succeeded";
  } catch (const GpuError& e) {
    EXPECT_NE(std::string(e.what()).find("a buffer far too large"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parity::gpu::test
