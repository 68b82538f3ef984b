// Fills and rounding on the GPU against the CPU reference, bit for bit.
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(DenseGpu, FillAndFillUniformAreBitIdentical) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{1000003}}) {
    for (const auto& [lo, hi, seed, stream] :
         {std::tuple{-0.5f, 0.5f, 1ull, 7ull}, std::tuple{-3.0f, 0.1f, 99ull, 3ull << 32}}) {
      std::vector<float> ref(static_cast<std::size_t>(n));
      cpu.fill_uniform(ref.data(), n, lo, hi, seed, stream);
      Buffer d(gpu, static_cast<std::size_t>(n) * 4);
      gpu.fill(d.as<float>(), n, poison());
      gpu.fill_uniform(d.as<float>(), n, lo, hi, seed, stream);
      const auto got = download_vec(gpu, d.as<float>(), static_cast<std::size_t>(n));
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0)
          << "fill_uniform n=" << n << " seed " << seed;
      gpu.fill(d.as<float>(), n, -2.5f);
      const auto filled = download_vec(gpu, d.as<float>(), static_cast<std::size_t>(n));
      EXPECT_TRUE(std::all_of(filled.begin(), filled.end(), [](float v) { return v == -2.5f; }))
          << "fill n=" << n;
    }
  }
}

TEST(DenseGpu, RoundToDtypeIsBitIdentical) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  // Random bit patterns (every exponent, subnormals included), exact ties, near-overflow values
  // and infinities; no NaN (the CPU's fp16 path may change a NaN's payload).
  std::vector<float> v;
  rng::Stream st(rng::key(5, 5));
  while (v.size() < 200000) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(st.next_bits()));
    if (!std::isnan(f)) v.push_back(f);
  }
  for (float f : {1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-7f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                  65504.0f, 65519.0f, 65520.0f, 3.0e38f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 1e-40f,
                  INFINITY, -INFINITY, 0.0f, -0.0f}) {
    v.push_back(f);
    v.push_back(-f);
  }
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    std::vector<float> ref = v;
    cpu.round_to_dtype(ref.data(), static_cast<std::int64_t>(ref.size()), t);
    Buffer d(gpu, v.size() * 4);
    gpu.copy_to_device(d.get(), v.data(), v.size() * 4);
    gpu.round_to_dtype(d.as<float>(), static_cast<std::int64_t>(v.size()), t);
    const auto got = download_vec(gpu, d.as<float>(), v.size());
    std::int64_t differ = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(ref[i]) &&
          ++differ <= 5)
        ADD_FAILURE() << dtype_name(t) << ": round(" << v[i] << ") gpu " << got[i] << " cpu "
                      << ref[i];
    }
    EXPECT_EQ(differ, 0) << dtype_name(t);
  }
  EXPECT_THROW(gpu.round_to_dtype(nullptr, 0, DType::i32), Error);
}

}  // namespace
}  // namespace parity::gpu::test
