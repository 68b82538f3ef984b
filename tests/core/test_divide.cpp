#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "parity/divide.h"

namespace {

// Every divisor class (1, powers of two, their neighbours, the largest values) against the
// built-in division on edge numerators and random ones.
TEST(DivideBy, MatchesIntegerDivision) {
  std::vector<std::uint32_t> divisors = {
      1,     2,     3,      5,           7,           10,          26,          641,        65535,
      65536, 65537, 100000, 0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};
  for (int k = 2; k < 32; ++k) {
    divisors.push_back(std::uint32_t{1} << k);
    divisors.push_back((std::uint32_t{1} << k) - 1);
    divisors.push_back((std::uint32_t{1} << k) + 1);
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 200; ++i) divisors.push_back(gen() | 1u);
  for (const std::uint32_t d : divisors) {
    const parity::DivideBy div = parity::DivideBy::of(d);
    std::vector<std::uint32_t> ns = {0,           1,           d - 1,      d,
                                     d + 1,       2 * d - 1,   2 * d,      0x7fffffffu,
                                     0x80000000u, 0xfffffffeu, 0xffffffffu};
    for (std::uint32_t m = 1; m < 40; ++m) ns.push_back(m * 65536u - 1u);
    for (int i = 0; i < 2000; ++i) ns.push_back(gen());
    for (int i = 0; i < 200; ++i)
      ns.push_back(static_cast<std::uint32_t>(gen() % 64) * d +
                   static_cast<std::uint32_t>(gen() % 3));
    for (const std::uint32_t n : ns) ASSERT_EQ(div(n), n / d) << n << " / " << d;
  }
}

}  // namespace
