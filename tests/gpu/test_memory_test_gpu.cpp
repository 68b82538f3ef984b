// parity doctor's memory test on the GPU: every pattern written as the host computes it, word for
// word (a buffer poisoned first, with a tail of words past the last group of four); the check
// counts nothing on a clean buffer and finds planted flips, counting each and naming the first.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(MemoryTestGpu, PatternsAreTheHostsWordForWord) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  const std::size_t words = (std::size_t{1} << 22) + 3;  // 16 MiB and a tail of three words
  Buffer d(gpu, words * 4);
  std::vector<std::uint32_t> ref(words), got(words);
  for (const MemoryPattern p : kMemoryPatterns) {
    for (const std::uint64_t seed : {0ull, 12345ull}) {
      gpu.fill(d.as<float>(), static_cast<std::int64_t>(words), poison());
      gpu.memory_pattern_write(d.get(), words * 4, p, seed);
      cpu.memory_pattern_write(ref.data(), words * 4, p, seed);
      gpu.copy_to_host(got.data(), d.get(), words * 4);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), words * 4), 0)
          << memory_pattern_name(p) << " seed " << seed;
      const Backend::MemoryCheck clean = gpu.memory_pattern_check(d.get(), words * 4, p, seed);
      EXPECT_EQ(clean.errors, 0u) << memory_pattern_name(p);
    }
  }
}

TEST(MemoryTestGpu, PlantedFlipsAreCountedAndTheFirstNamed) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  const std::size_t words = (std::size_t{1} << 20) + 2;
  Buffer d(gpu, words * 4);
  gpu.memory_pattern_write(d.get(), words * 4, MemoryPattern::random, 9);
  // Flips in a whole group, in another, and in the tail; the lowest index is named.
  for (const std::size_t w : {std::size_t{700001}, std::size_t{4099}, words - 1}) {
    std::uint32_t v = 0;
    gpu.copy_to_host(&v, d.as<std::uint32_t>() + w, 4);
    v ^= 1u << (w % 32);
    gpu.copy_to_device(d.as<std::uint32_t>() + w, &v, 4);
  }
  const Backend::MemoryCheck c =
      gpu.memory_pattern_check(d.get(), words * 4, MemoryPattern::random, 9);
  EXPECT_EQ(c.errors, 3u);
  EXPECT_EQ(c.first_error_word, 4099u);
  // Read against another seed, every word is wrong bar chance matches.
  const Backend::MemoryCheck other =
      gpu.memory_pattern_check(d.get(), words * 4, MemoryPattern::random, 10);
  EXPECT_GT(other.errors, words - 16);
  EXPECT_EQ(other.first_error_word, 0u);
}

TEST(MemoryTestGpu, CopyWithinCopiesEveryByte) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  const std::size_t bytes = (std::size_t{1} << 24) + 8;
  Buffer a(gpu, bytes), b(gpu, bytes);
  gpu.memory_pattern_write(a.get(), bytes, MemoryPattern::address, 3);
  gpu.fill(b.as<float>(), static_cast<std::int64_t>(bytes / 4), poison());
  gpu.copy_within(b.get(), a.get(), bytes);
  EXPECT_EQ(gpu.memory_pattern_check(b.get(), bytes, MemoryPattern::address, 3).errors, 0u);
  EXPECT_GT(gpu.free_memory_bytes(), 0u);
}

}  // namespace
}  // namespace parity::gpu::test
