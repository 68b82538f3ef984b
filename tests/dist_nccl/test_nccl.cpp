// The NCCL engine on one GPU (world size 1, as `parity train` runs it on one GPU): every
// collective on host spans (staged through device memory) and on device spans (in place) gives
// what one rank must get, its outputs poisoned first. Skipped where no GPU is present. Several
// ranks need several GPUs (NCCL refuses two ranks on one GPU): the multi-GPU issue runs them.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "backend/gpu/port.h"
#include "parity/dist.h"

namespace parity {
namespace {

bool have_gpu() {
  int n = 0;
  return gpu::get_device_count(&n) == gpu::kSuccess && n > 0;
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    comm_ = make_nccl_communicator(ProcessGroupInfo{});
  }
  std::unique_ptr<Communicator> comm_;
};

TEST_F(Nccl, OneRankOnHostSpans) {
  EXPECT_EQ(comm_->engine(), "nccl");
  EXPECT_EQ(comm_->size(), 1);
  std::vector<float> f(1000);
  std::iota(f.begin(), f.end(), -3.5f);
  const std::vector<float> f0 = f;
  comm_->all_reduce_sum(f);
  EXPECT_EQ(f, f0);
  std::vector<double> d = {1e-300, -2.0, 3.25};
  const std::vector<double> d0 = d;
  comm_->all_reduce_sum(d);
  EXPECT_EQ(d, d0);
  std::vector<float> rs(f.size(), 777.0f);
  comm_->reduce_scatter_sum(f0, rs);
  EXPECT_EQ(rs, f0);
  std::vector<std::byte> send(333), recv(333, std::byte{0xAB});
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = std::byte(i * 7);
  comm_->all_gather(send, recv);
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), std::byte{0xCD});
  const std::int64_t n = 333;
  comm_->all_to_all_v(send, std::span<const std::int64_t>(&n, 1), recv,
                      std::span<const std::int64_t>(&n, 1));
  EXPECT_EQ(recv, send);
  comm_->barrier();
}

TEST_F(Nccl, OneRankOnDeviceSpansInPlace) {
  constexpr std::size_t kN = 1 << 20;
  std::vector<float> host(kN);
  for (std::size_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 977) * 0.25f - 7.0f;
  float* dev = nullptr;
  ASSERT_EQ(gpu::malloc_device(reinterpret_cast<void**>(&dev), 2 * kN * sizeof(float)),
            gpu::kSuccess);
  ASSERT_TRUE(gpu::is_device_pointer(dev));
  ASSERT_FALSE(gpu::is_device_pointer(host.data()));
  gpu::Stream_t s = nullptr;
  ASSERT_EQ(gpu::stream_create(&s), gpu::kSuccess);
  ASSERT_EQ(gpu::memcpy_async(dev, host.data(), kN * sizeof(float), s), gpu::kSuccess);
  ASSERT_EQ(gpu::memset_async(dev + kN, 0xFF, kN * sizeof(float), s), gpu::kSuccess);  // NaNs
  ASSERT_EQ(gpu::stream_synchronize(s), gpu::kSuccess);
  comm_->all_reduce_sum(std::span<float>(dev, kN));
  comm_->reduce_scatter_sum(std::span<const float>(dev, kN), std::span<float>(dev + kN, kN));
  std::vector<float> back(2 * kN, 1.0f);
  ASSERT_EQ(gpu::memcpy_async(back.data(), dev, 2 * kN * sizeof(float), s), gpu::kSuccess);
  ASSERT_EQ(gpu::stream_synchronize(s), gpu::kSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(back.data() + kN, host.data(), kN * sizeof(float)), 0);
  (void)gpu::stream_destroy(s);
  (void)gpu::free_device(dev);
}

TEST(NcclEngine, ABadTimeOutIsRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  EXPECT_THROW((void)make_nccl_communicator(ProcessGroupInfo{}, nullptr, 0.0), Error);
}

}  // namespace
}  // namespace parity
