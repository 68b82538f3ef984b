// The loss and the sigmoid on the GPU against the CPU reference.
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(DenseGpu, BceWithLogitsMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{512}, std::int64_t{1000}, std::int64_t{300001}}) {
    Rand rand(600 + static_cast<std::uint64_t>(n));
    std::vector<float> z(static_cast<std::size_t>(n)), y(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) {
      z[i] = rand.uniform(-30.0f, 30.0f);
      const double r = rand.u();
      y[i] = r < 0.45 ? 0.0f : (r < 0.9 ? 1.0f : static_cast<float>(rand.u()));
    }
    std::vector<float> dref(z.size());
    float lref = 0.0f;
    cpu.bce_with_logits(z.data(), y.data(), n, dref.data(), &lref);
    Buffer gz(gpu, z.size() * 4), gy(gpu, z.size() * 4), gd(gpu, z.size() * 4), gl(gpu, 4);
    gpu.copy_to_device(gz.get(), z.data(), z.size() * 4);
    gpu.copy_to_device(gy.get(), y.data(), y.size() * 4);
    gpu.fill(gd.as<float>(), n, poison());
    gpu.fill(gl.as<float>(), 1, poison());
    gpu.bce_with_logits(gz.as<float>(), gy.as<float>(), n, gd.as<float>(), gl.as<float>());
    // Per-element terms in double on both sides; the mean is a double sum in another order,
    // rounded once to fp32: at most an ulp apart.
    expect_ulps("bce loss n=" + std::to_string(n), download_vec(gpu, gl.as<float>(), 1), {lref}, 1);
    expect_ulps("bce dlogits n=" + std::to_string(n), download_vec(gpu, gd.as<float>(), z.size()),
                dref, 1);
    // The same inputs give the same bits again (fixed-order reduction).
    const float first = download_vec(gpu, gl.as<float>(), 1)[0];
    gpu.fill(gl.as<float>(), 1, poison());
    gpu.bce_with_logits(gz.as<float>(), gy.as<float>(), n, gd.as<float>(), gl.as<float>());
    EXPECT_EQ(std::bit_cast<std::uint32_t>(download_vec(gpu, gl.as<float>(), 1)[0]),
              std::bit_cast<std::uint32_t>(first))
        << "bce loss changed between two runs on the same inputs";
  }
}

TEST(DenseGpu, SigmoidMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  Rand rand(700);
  const std::int64_t n = 100003;
  std::vector<float> z(static_cast<std::size_t>(n));
  for (auto& v : z) v = rand.uniform(-40.0f, 40.0f);
  std::vector<float> pref(z.size());
  cpu.sigmoid(z.data(), pref.data(), n);
  Buffer gz(gpu, z.size() * 4), gp(gpu, z.size() * 4);
  gpu.copy_to_device(gz.get(), z.data(), z.size() * 4);
  gpu.fill(gp.as<float>(), n, poison());
  gpu.sigmoid(gz.as<float>(), gp.as<float>(), n);
  expect_ulps("sigmoid", download_vec(gpu, gp.as<float>(), z.size()), pref, 1);
}

}  // namespace
}  // namespace parity::gpu::test
