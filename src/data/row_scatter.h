// A seeded bijection of [0, n), used to scatter Zipf ranks over a table's rows so that the hot
// rows are not rows 0, 1, 2, ... (which would make every cache and every range-sharding look
// better than it is on real data).
//
// Why this shape: an affine map mod n needs a 128-bit multiply and a 128-by-64 division per id
// (tens of cycles, on the hot path of every Zipf id). Instead we permute the power-of-two
// domain [0, 2^w) that just covers n with two rounds of (odd multiply + add, mod 2^w) and an
// xorshift (each step is invertible on w bits), and cycle-walk: re-apply until the value falls
// below n. Restricting a permutation of a superset to [0, n) by cycle-walking is again a
// permutation, and since 2^w < 2n fewer than two rounds are needed on average.
//
// Internal to src/data (the tests include it to check bijectivity); not part of the public API.
#pragma once

#include <bit>
#include <cstdint>

#include "parity/random.h"

namespace parity::data_detail {

class RowScatter {
 public:
  RowScatter() = default;
  RowScatter(std::int64_t n, std::uint64_t seed) : n_(static_cast<std::uint64_t>(n)) {
    if (n_ <= 1) return;
    const int w = std::bit_width(n_ - 1);  // 1..63
    mask_ = w == 64 ? ~0ULL : (1ULL << w) - 1;
    shift_ = (w + 1) / 2;
    mul1_ = rng::mix64(seed ^ 0x5ca77e2d00000001ULL) | 1;
    add1_ = rng::mix64(seed ^ 0x5ca77e2d00000002ULL);
    mul2_ = rng::mix64(seed ^ 0x5ca77e2d00000003ULL) | 1;
    add2_ = rng::mix64(seed ^ 0x5ca77e2d00000004ULL);
  }

  // Row of rank x, x in [0, n).
  std::int64_t operator()(std::int64_t x) const {
    if (n_ <= 1) return 0;
    std::uint64_t y = static_cast<std::uint64_t>(x);
    do {
      y = round(y);
    } while (y >= n_);
    return static_cast<std::int64_t>(y);
  }

 private:
  std::uint64_t n_ = 1;
  std::uint64_t mask_ = 0;
  int shift_ = 1;
  std::uint64_t mul1_ = 1, add1_ = 0, mul2_ = 1, add2_ = 0;

  // One permutation of [0, 2^w).
  std::uint64_t round(std::uint64_t y) const {
    y = (y * mul1_ + add1_) & mask_;
    y ^= y >> shift_;
    y = (y * mul2_ + add2_) & mask_;
    y ^= y >> shift_;
    return y;
  }
};

}  // namespace parity::data_detail
