#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace parity {
namespace {

TEST(Crc32c, KnownValues) {
  // The check value of the CRC-32C catalogue entry, and RFC 3720's test vectors (iSCSI).
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  std::vector<unsigned char> up(32);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(up.data(), up.size()), 0x46dd794eu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c_text(0xe3069283u), "crc32c:e3069283");
}

TEST(Crc32c, ContinuesAcrossChunksAndSeesEveryBitFlip) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(1000 + 13);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c(data.data(), data.size());
  EXPECT_EQ(crc32c_portable(data.data(), data.size()), whole);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xe3069283u);
  for (std::size_t cut : {0, 1, 7, 8, 9, 500, 1012, 1013}) {
    const std::uint32_t a = crc32c(data.data(), cut);
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, a), whole) << "cut at " << cut;
  }
  for (std::size_t byte = 0; byte < data.size(); byte += 37) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] ^= static_cast<unsigned char>(1u << bit);
      EXPECT_NE(crc32c(data.data(), data.size()), whole) << byte << ":" << bit;
      data[byte] ^= static_cast<unsigned char>(1u << bit);
    }
  }
}

}  // namespace
}  // namespace parity
