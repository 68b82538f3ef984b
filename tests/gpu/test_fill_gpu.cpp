// Fills, rounding and the finite-value guard on the GPU against the CPU reference, bit for bit.
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

// The guard over random finite values with NaN and infinities planted at random places (the
// first and last element included), at sizes around the grid's reach: the GPU records exactly
// where the CPU does, and neither overwrites a record.
TEST(DenseGpu, FlagNonfiniteMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  rng::Stream st(rng::key(8, 1));
  Buffer record(gpu, sizeof(std::int64_t));
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{255}, std::int64_t{65537}, std::int64_t{3000001}}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& f : v) f = static_cast<float>(st.next_uniform()) - 0.5f;
    Buffer d(gpu, v.size() * 4);
    std::int64_t step = 0;
    for (const std::int64_t at : {std::int64_t{-1}, n - 1, std::int64_t{0}, n / 2}) {
      std::vector<float> w = v;
      if (at >= 0) w[static_cast<std::size_t>(at)] = (at % 2 == 0) ? std::nanf("") : -INFINITY;
      gpu.copy_to_device(d.get(), w.data(), w.size() * 4);
      for (const std::int64_t start : {std::int64_t{-1}, std::int64_t{7}}) {
        ++step;
        std::int64_t want = start;
        cpu.flag_nonfinite(w.data(), n, step, &want);
        gpu.copy_to_device(record.get(), &start, sizeof start);
        gpu.flag_nonfinite(d.as<float>(), n, step, record.as<std::int64_t>());
        std::int64_t got = -2;
        gpu.copy_to_host(&got, record.get(), sizeof got);
        EXPECT_EQ(got, want) << "n " << n << ", bad element at " << at << ", record " << start;
      }
    }
  }
  EXPECT_THROW(gpu.flag_nonfinite(nullptr, 4, 1, record.as<std::int64_t>()), Error);
}

}  // namespace
}  // namespace parity::gpu::test
