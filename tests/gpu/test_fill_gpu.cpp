// Fills (in every table storage type) and the finite-value guard on the GPU against the CPU
// reference, bit for bit.
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

// Tables are initialised in their storage type: the fp32 value rounded once, to nearest even.
TEST(DenseGpu, FillUniformIntoNarrowTypesIsBitIdentical) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  for (const DType t : {DType::f16, DType::bf16}) {
    for (const std::int64_t n : {std::int64_t{3}, std::int64_t{1000003}}) {
      const std::size_t bytes = static_cast<std::size_t>(n) * 2;
      std::vector<std::uint16_t> ref(static_cast<std::size_t>(n));
      // A range reaching fp16's subnormals and beyond its largest finite value.
      const float lo = t == DType::f16 ? -7.0e4f : -3.0f, hi = t == DType::f16 ? 1e-6f : 0.1f;
      cpu.fill_uniform(ref.data(), t, n, lo, hi, 17, 5);
      Buffer d(gpu, bytes);
      gpu.fill(d.as<float>(), n / 2, poison());
      gpu.fill_uniform(d.get(), t, n, lo, hi, 17, 5);
      std::vector<std::uint16_t> got(static_cast<std::size_t>(n));
      gpu.copy_to_host(got.data(), d.get(), bytes);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), bytes), 0) << dtype_name(t) << " n=" << n;
      const std::vector<float> as_f32 = [&] {
        std::vector<float> v(static_cast<std::size_t>(n));
        cpu.fill_uniform(v.data(), n, lo, hi, 17, 5);
        return v;
      }();
      for (std::size_t i = 0; i < 1000 && i < ref.size(); ++i)  // the fp32 fill, rounded once
        ASSERT_EQ(ref[i], t == DType::f16 ? half_bits(as_f32[i]) : bf16_bits(as_f32[i]));
    }
  }
  EXPECT_THROW(gpu.fill_uniform(nullptr, DType::i32, 4, 0.0f, 1.0f, 1, 1), Error);
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
