// Helpers of the dense-path GPU tests (test_*_gpu.cpp): poisoned host and device matrices in
// fp32 and bf16, and the comparisons against the CPU reference.
//
// How results are judged. Every output buffer is poisoned (all bits set: NaN) before the op, and
// views have ld > cols, so an element the op failed to write shows as NaN and a padding column it
// must not write must still hold the poison. Products are judged against their magnitude: the
// same op run by the CPU on the absolute values of the inputs gives, per output, Σ|terms| (plus
// |bias|), the natural scale of rounding error; the test requires |gpu - cpu| <= tol · magnitude
// and prints the largest ratio it saw ("[ measured ]" lines), so the log records the tolerances
// actually needed. Per dense math:
//   fp32  tol 1e-5. Each output is a sum of K <= 512 fp32 products. The classic bound is K·u·Σ|t|
//         with u = 2^-24 (3e-5 at K = 512), but the error of a long fp32 sum grows like
//         sqrt(K)·u in practice (about 1.4e-6 at K = 512), so 1e-5 is 7x that with the worst-case
//         bound holding up to K = 167. The CPU reference sums in double, so all of the difference
//         is the GPU's rounding.
//   tf32  tol 2e-3. The tensor cores read each fp32 operand with a 10-bit mantissa: a relative
//         error up to 2^-11 (round to nearest) or 2^-10 (truncation) per operand, so up to about
//         2·2^-10 ≈ 2e-3 per product, times its |term|; summing keeps it under 2e-3·Σ|t|.
//   bf16  tol 1e-2. Operands rounded to bf16 (8-bit mantissa, nearest even): up to 2^-9 per
//         operand, 2^-8 ≈ 3.9e-3 per product; 1e-2 leaves room for the fp32 accumulation and, in
//         chained products (below), for the error carried in from the first product.
// An output computed from another product's output (z from u, x_next from z, dv and dxl from du)
// gets 3·tol: its error is its own product's plus the carried one, each bounded by tol·magnitude.
// Elementwise ops and reductions are computed in double on both sides and must agree to an ulp or
// two (the loss, sigmoid, optimizers, bias sums) or bit for bit (fills, rounding).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu/gpu_backend.h"
#include "gpu_test_util.h"
#include "parity/data.h"
#include "parity/spec.h"

namespace parity::gpu::test {

constexpr std::uint32_t kPoisonBits = 0xffffffffu;  // a NaN

inline float poison() {
  return std::bit_cast<float>(kPoisonBits);
}
inline bool is_poison(float v) {
  return std::bit_cast<std::uint32_t>(v) == kPoisonBits;
}

inline double tol_for(DenseMath m) {
  switch (m) {
    case DenseMath::fp32:
      return 1e-5;
    case DenseMath::tf32:
      return 2e-3;
    case DenseMath::bf16:
      return 1e-2;
    default:
      return 0.0;
  }
}

// A host matrix [rows, cols] with leading dimension ld; padding columns hold the poison.
struct HostMat {
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> v;

  HostMat(std::int64_t r, std::int64_t c, std::int64_t l)
      : rows(r),
        cols(c),
        ld(l),
        v(static_cast<std::size_t>(std::max<std::int64_t>(r * l, 1)), poison()) {}
  static HostMat random(std::int64_t r, std::int64_t c, std::int64_t pad, Rand& rand,
                        float lo = -1.0f, float hi = 1.0f) {
    HostMat m(r, c, c + pad);
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j) m.at(i, j) = rand.uniform(lo, hi);
    return m;
  }
  float& at(std::int64_t r, std::int64_t c) { return v[static_cast<std::size_t>(r * ld + c)]; }
  float at(std::int64_t r, std::int64_t c) const { return v[static_cast<std::size_t>(r * ld + c)]; }
  Mat view() { return {v.data(), rows, cols, ld}; }
  CMat cview() const { return {v.data(), rows, cols, ld}; }
  // |x| over the data, poison kept.
  HostMat abs() const {
    HostMat m = *this;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) m.at(i, j) = std::fabs(at(i, j));
    return m;
  }
  HostMat poisoned() const { return HostMat(rows, cols, ld); }
};

// A vector as a [1, n] matrix.
inline HostMat random_vec(std::int64_t n, Rand& rand, float lo = -1.0f, float hi = 1.0f) {
  return HostMat::random(1, n, 0, rand, lo, hi);
}

// A backend-memory copy of a host matrix (padding included).
class DevMat {
 public:
  DevMat(Backend& be, const HostMat& h)
      : be_(&be), buf_(be, h.v.size() * sizeof(float)), rows_(h.rows), cols_(h.cols), ld_(h.ld) {
    be.copy_to_device(buf_.get(), h.v.data(), h.v.size() * sizeof(float));
  }
  Mat view() const { return {buf_.as<float>(), rows_, cols_, ld_}; }
  float* data() const { return buf_.as<float>(); }
  HostMat download() const {
    HostMat h(rows_, cols_, ld_);
    be_->copy_to_host(h.v.data(), buf_.get(), h.v.size() * sizeof(float));
    return h;
  }

 private:
  Backend* be_;
  Buffer buf_;
  std::int64_t rows_, cols_, ld_;
};

// |got - ref| <= tol · mag over [rows, cols]; where ref holds the poison (columns the op must not
// write, and padding), got must still hold it bit for bit. Returns the largest |got - ref| / mag.
inline double expect_close(const std::string& what, const HostMat& got, const HostMat& ref,
                           const HostMat& mag, double tol) {
  EXPECT_EQ(got.v.size(), ref.v.size()) << what;
  int bad = 0;
  double worst = 0.0;
  for (std::int64_t r = 0; r < ref.rows; ++r) {
    for (std::int64_t c = 0; c < ref.ld; ++c) {
      const float g = got.at(r, c), e = ref.at(r, c);
      if (c >= ref.cols || is_poison(e)) {
        if (!is_poison(g) && ++bad <= 5)
          ADD_FAILURE() << what << ": (" << r << ", " << c << ") must keep the poison, holds " << g;
        continue;
      }
      const double err = std::fabs(static_cast<double>(g) - static_cast<double>(e));
      const double m = std::fabs(static_cast<double>(mag.at(r, c)));
      if (m > 0.0) worst = std::max(worst, err / m);
      if (!(err <= tol * m + 1e-37) && ++bad <= 5) {
        ADD_FAILURE() << what << ": (" << r << ", " << c << ") gpu " << g << " cpu " << e
                      << " |diff| " << err << " > " << tol << " x magnitude " << m;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
  std::cout << "[ measured ] " << what << ": max |gpu - cpu| / magnitude = " << worst
            << " (tolerance " << tol << ")\n";
  return worst;
}

// Distance in units in the last place between two finite floats.
inline std::int64_t ulp_distance(float a, float b) {
  auto ordered = [](float x) {
    const auto i = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(x));
    return i < 0 ? std::int64_t{INT32_MIN} - i : i;
  };
  return std::llabs(ordered(a) - ordered(b));
}

// got and ref agree to max_ulp ulps everywhere; prints how many differ at all.
inline void expect_ulps(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& ref, std::int64_t max_ulp) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::int64_t differ = 0, worst = 0;
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const std::int64_t d =
        std::isnan(got[i]) ? (std::int64_t{1} << 40) : ulp_distance(got[i], ref[i]);
    if (d != 0) ++differ;
    worst = std::max(worst, d);
    if (d > max_ulp && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " cpu " << ref[i] << " (" << d
                    << " ulp)";
  }
  EXPECT_EQ(bad, 0) << what;
  std::cout << "[ measured ] " << what << ": " << differ << " of " << ref.size()
            << " values differ from the CPU, by at most " << worst << " ulp (allowed " << max_ulp
            << ")\n";
}

inline std::vector<float> download_vec(Backend& be, const float* p, std::size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

inline std::string math_label(const ::testing::TestParamInfo<DenseMath>& info) {
  return std::string(dense_math_name(info.param));
}

// A matrix stored as bf16 bits in host memory (padding: all bits set, a NaN), and its copy in a
// backend's memory.
struct HostBf16 {
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::vector<std::uint16_t> bits;

  HostBf16(std::int64_t r, std::int64_t c, std::int64_t l)
      : rows(r),
        cols(c),
        ld(l),
        bits(static_cast<std::size_t>(std::max<std::int64_t>(r * l, 1)), 0xffffu) {}
  explicit HostBf16(const HostMat& m) : HostBf16(m.rows, m.cols, m.ld) {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        bits[static_cast<std::size_t>(i * ld + j)] = bf16_bits(m.at(i, j));
  }
  AMat view() { return {bits.data(), DType::bf16, rows, cols, ld}; }
  CAMat cview() const { return {bits.data(), DType::bf16, rows, cols, ld}; }
  // The values as floats; padding and unwritten elements (all bits set) as the fp32 poison.
  HostMat to_float() const {
    HostMat m(rows, cols, ld);
    for (std::size_t i = 0; i < bits.size(); ++i)
      m.v[i] = bits[i] == 0xffffu ? poison() : bf16_to_float(bits[i]);
    return m;
  }
  HostBf16 poisoned() const { return HostBf16(rows, cols, ld); }
};

class DevBf16 {
 public:
  DevBf16(Backend& be, const HostBf16& h)
      : be_(&be), buf_(be, h.bits.size() * 2), rows_(h.rows), cols_(h.cols), ld_(h.ld) {
    be.copy_to_device(buf_.get(), h.bits.data(), h.bits.size() * 2);
  }
  AMat view() const { return {buf_.get(), DType::bf16, rows_, cols_, ld_}; }
  HostBf16 download() const {
    HostBf16 h(rows_, cols_, ld_);
    be_->copy_to_host(h.bits.data(), buf_.get(), h.bits.size() * 2);
    return h;
  }

 private:
  Backend* be_;
  Buffer buf_;
  std::int64_t rows_, cols_, ld_;
};

// Random values already representable in bf16 (what a bf16 activation holds).
inline HostMat random_bf16_values(std::int64_t r, std::int64_t c, std::int64_t pad, Rand& rand) {
  HostMat m = HostMat::random(r, c, pad, rand);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j)
      m.at(i, j) = parity::round_to_dtype(m.at(i, j), DType::bf16);
  return m;
}

// Besides the shapes above: more rows than the folded column sums have lanes (each lane then sums
// several rows), a width whose groups do not fit one block (the unfolded path with a separate
// column sum), and an odd width (scalar loads).

struct LinearShape {
  std::int64_t batch, in, out;
  int pad_x, pad_w, pad_y;
};
struct CrossShape {
  std::int64_t batch, n, rank;
  int pad;
};

}  // namespace parity::gpu::test
