// A seeded bijection of [0, n), used to scatter Zipf ranks over a table's rows so that the hot
// rows are not rows 0, 1, 2, ... (which would make every cache and every range-sharding look
// better than it is on real data). It is synth::Scatter (parity/synthetic_example.h, which the
// device runs too).
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

#include "parity/synthetic_example.h"

namespace parity::data_detail {

using RowScatter = synth::Scatter;

}  // namespace parity::data_detail
