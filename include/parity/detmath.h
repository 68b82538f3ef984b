// exp, log, log1p and expm1 in double precision that give the same bits on the host and on a GPU.
//
// Why: the synthetic data made on the device must be the data the host generator makes, bit for
// bit (the Zipf sampler rounds an inverse to the nearest rank, the labels compare a uniform with
// sigmoid(logit)), and the C library's and the GPU vendors' transcendental functions differ in
// their last bits. These are written with IEEE operations only (+, -, *, / are correctly rounded
// everywhere, floor is exact), so every compiler gives the same result provided it does not fuse
// a multiply and an add: host code builds with -ffp-contract=off and device code that calls these
// with -fmad=false (hipcc: -ffp-contract=off). Accuracy: within 2 ulp of the C library over the
// ranges tests/core/test_detmath.cpp draws from, which is all the generators need; speed: a
// polynomial of 12 to 19 terms, like a libm's.
//
// The reductions are the textbook ones (Muller, "Elementary Functions", 3rd ed., ch. 11): exp
// by x = k ln2 + r with ln2 split in two so that k ln2_hi is exact, then a Taylor polynomial on
// |r| <= ln2/2; log by x = 2^e m with m in [sqrt(1/2), sqrt(2)), then log(m) = 2 atanh(s) with
// s = (m-1)/(m+1), an odd series in s; log1p and expm1 take their series on small arguments
// directly, so that there is no cancellation near 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "parity/host_device.h"

namespace parity::detmath {
namespace detail {

// ln 2 in two parts: the high part has 32 significant bits, so k * kLn2Hi is exact for |k| < 2^20.
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;
constexpr double kSqrt2 = 1.41421356237309514547e+00;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

PARITY_HD std::uint64_t to_bits(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
PARITY_HD double from_bits(std::uint64_t b) {
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
// 2^n for n in [-1022, 1023].
PARITY_HD double pow2(int n) {
  return from_bits(static_cast<std::uint64_t>(n + 1023) << 52);
}
// p * 2^n for n in [-1100, 1100] (two steps where 2^n alone is not a normal double).
PARITY_HD double scale(double p, int n) {
  if (n > 1023) {
    p *= pow2(1023);
    n -= 1023;
  } else if (n < -1022) {
    p *= pow2(-1022);
    n += 1022;
  }
  return p * pow2(n);
}

// exp(r) for |r| <= 0.35: Taylor to degree 13 (the next term is below 2^-57 relative).
PARITY_HD double exp_small(double r) {
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  return p * r + 1.0;
}

// (exp(r) - 1 - r) / r^2 for |r| < 1: Taylor to degree 18 in r (the next term is below 2^-60
// relative), so that expm1(r) = r + r^2 q keeps the large part exact.
PARITY_HD double expm1_small_rest(double r) {
  constexpr double kInvFactorial[] = {1.0 / 2432902008176640000.0,
                                      1.0 / 121645100408832000.0,
                                      1.0 / 6402373705728000.0,
                                      1.0 / 355687428096000.0,
                                      1.0 / 20922789888000.0,
                                      1.0 / 1307674368000.0,
                                      1.0 / 87178291200.0,
                                      1.0 / 6227020800.0,
                                      1.0 / 479001600.0,
                                      1.0 / 39916800.0,
                                      1.0 / 3628800.0,
                                      1.0 / 362880.0,
                                      1.0 / 40320.0,
                                      1.0 / 5040.0,
                                      1.0 / 720.0,
                                      1.0 / 120.0,
                                      1.0 / 24.0,
                                      1.0 / 6.0};  // 1/20! .. 1/3!
  double p = kInvFactorial[0];
  for (int i = 1; i < 18; ++i) p = p * r + kInvFactorial[i];
  return p * r + 0.5;
}

// log(1 + f) for 1 + f in [sqrt(1/2), sqrt(2)] with f exact, as fdlibm writes it: with
// s = f / (2 + f) (|s| <= 0.1716, z = s^2 <= 0.02944), log(1 + f) = 2 atanh(s) = 2s + s R(z),
// R = 2z/3 + 2z^2/5 + ... (to z^11: the next term is below 2^-57 relative), and 2s = f - s f
// gives log(1 + f) = f - (f^2/2 - s (f^2/2 + R)): f carries the result, the rest is a
// correction, so the error stays near half an ulp. ln2_lo (times the exponent e) joins the
// correction before f is added.
PARITY_HD double log1p_reduced(double f, double e_ln2_lo = 0.0) {
  const double s = f / (2.0 + f);
  const double z = s * s;
  double r = 2.0 / 23.0;
  r = r * z + 2.0 / 21.0;
  r = r * z + 2.0 / 19.0;
  r = r * z + 2.0 / 17.0;
  r = r * z + 2.0 / 15.0;
  r = r * z + 2.0 / 13.0;
  r = r * z + 2.0 / 11.0;
  r = r * z + 2.0 / 9.0;
  r = r * z + 2.0 / 7.0;
  r = r * z + 2.0 / 5.0;
  r = r * z + 2.0 / 3.0;
  r = r * z;
  const double hfsq = 0.5 * f * f;
  return f - (hfsq - (s * (hfsq + r) + e_ln2_lo));
}

}  // namespace detail

PARITY_HD double exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return detail::kInf;
  if (x < -745.1332191019412) return 0.0;
  const double k = std::floor(x * detail::kInvLn2 + 0.5);
  const double r = (x - k * detail::kLn2Hi) - k * detail::kLn2Lo;
  return detail::scale(detail::exp_small(r), static_cast<int>(k));
}

PARITY_HD double log(double x) {
  if (x != x) return x;
  if (x < 0.0) return detail::kNaN;
  if (x == 0.0) return -detail::kInf;
  if (x == detail::kInf) return x;
  int e = 0;
  if (x < 2.2250738585072014e-308) {  // subnormal: make it normal first
    x *= 18014398509481984.0;         // 2^54
    e = -54;
  }
  const std::uint64_t b = detail::to_bits(x);
  e += static_cast<int>((b >> 52) & 0x7ff) - 1023;
  double m = detail::from_bits((b & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1023} << 52));
  if (m > detail::kSqrt2) {
    m *= 0.5;
    ++e;
  }
  const double ed = static_cast<double>(e);
  return ed * detail::kLn2Hi + detail::log1p_reduced(m - 1.0, ed * detail::kLn2Lo);  // m-1 exact
}

PARITY_HD double log1p(double t) {
  if (t != t) return t;
  if (t < -1.0) return detail::kNaN;
  if (t == -1.0) return -detail::kInf;
  if (t == detail::kInf) return t;
  if (t > -0.29 && t < 0.41) return detail::log1p_reduced(t);
  // 1 + t rounds; the rounding error, divided by 1 + t, is log's first-order correction.
  const double u = 1.0 + t;
  return log(u) + (t - (u - 1.0)) / u;
}

PARITY_HD double expm1(double t) {
  if (t != t || t == 0.0) return t;  // NaN; +-0 keeps its sign
  if (t > -1.0 && t < 1.0) return t + t * (t * detail::expm1_small_rest(t));
  if (t < -40.0) return -1.0;
  return exp(t) - 1.0;
}

}  // namespace parity::detmath
