// Checksummed products (ABFT) on the cpu backend: Backend's "checksummed products" section says
// what is checked.
//
// Why the bound is what it is: the output column sum c_j = Σ_i out_ij and its prediction
// r_j = Σ_k (Σ_i a_ik) b_jk + n bias_j are both formed in double. Each stored out_ij is its exact
// value (summed in double, then the bias added) rounded once to its storage type, so to first
// order |c_j - r_j| <= (u_out + n 2^-53) Σ_i |out_ij| (the storage's rounding, and the column sum
// of the stored values) + (2k + n + 4) 2^-53 (Σ_k (Σ_i |a_ik|) |b_jk| + n |bias_j|) (the dot
// products, the input sums and the prediction) + n floor_out (the storage's spacing near zero).
// Nothing in it is tuned. Columns whose inputs are not finite, or whose products may overflow the
// storage type, are left to the finite-value guard: they are divergence or bad data, not a wrong
// product.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "parity/error.h"

namespace parity {
namespace {

// The unit roundoff of a stored output and its spacing near zero (fp32 and bf16 share fp32's
// exponent range; a bf16 output is rounded to fp32 first, then to bf16).
struct Rounding {
  double unit, floor, largest;
};
Rounding rounding_of(DType stored) {
  if (stored == DType::bf16)
    return {std::ldexp(1.0, -8) + std::ldexp(1.0, -23), std::ldexp(1.0, -133), 3.3895e38};
  if (stored != DType::f32)
    throw Error(fmt::format("checksummed products: outputs stored as {} are not checked",
                            dtype_name(stored)));
  return {std::ldexp(1.0, -24), std::ldexp(1.0, -149), 3.4028234663852886e38};
}

// Empty, or the first column whose sums differ by more than the bound.
std::string check_columns(CMat a, CMat b, const float* bias, CMat out, const Rounding& rd) {
  const std::int64_t n = a.rows, k = a.cols, m = b.rows;
  std::vector<double> s(static_cast<std::size_t>(k), 0.0), s_abs(static_cast<std::size_t>(k), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < k; ++c) {
      const double v = a(i, c);
      s[static_cast<std::size_t>(c)] += v;
      s_abs[static_cast<std::size_t>(c)] += std::abs(v);
    }
  std::vector<double> col(static_cast<std::size_t>(m), 0.0),
      col_abs(static_cast<std::size_t>(m), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < m; ++j) {
      const double v = out(i, j);
      col[static_cast<std::size_t>(j)] += v;
      col_abs[static_cast<std::size_t>(j)] += std::abs(v);
    }
  const double u_double = std::ldexp(1.0, -53);
  for (std::int64_t j = 0; j < m; ++j) {
    double r = 0, mag = 0;
    for (std::int64_t c = 0; c < k; ++c) {
      r += s[static_cast<std::size_t>(c)] * b(j, c);
      mag += s_abs[static_cast<std::size_t>(c)] * std::abs(b(j, c));
    }
    if (bias != nullptr) {
      r += static_cast<double>(n) * bias[j];
      mag += static_cast<double>(n) * std::abs(bias[j]);
    }
    // Not finite inputs, or products that may overflow: the finite-value guard's to report.
    if (!std::isfinite(mag) || mag > rd.largest) continue;
    const double bound =
        (rd.unit + static_cast<double>(n) * u_double) * col_abs[static_cast<std::size_t>(j)] +
        static_cast<double>(2 * k + n + 4) * u_double * mag + static_cast<double>(n) * rd.floor;
    const double diff = std::abs(col[static_cast<std::size_t>(j)] - r);
    if (!(diff <= bound))  // a NaN or an infinity in the output fails too
      return fmt::format(
          "column {} of [{} x {}]: its sum is {:.9g}, the inputs predict {:.9g} "
          "(difference {:.3g}, bound {:.3g})",
          j, n, m, col[static_cast<std::size_t>(j)], r, diff, bound);
  }
  return {};
}

}  // namespace

void CpuBackend::set_product_checks(bool on) {
  checking_ = on;
  checks_ = {};
  fault_.reset();
  products_seen_ = 0;
}

void CpuBackend::inject_product_fault(const ProductFault& f) {
  if (f.product < 0 || f.element < 0 || f.bit < 0 || f.bit > 31)
    throw Error(
        fmt::format("inject_product_fault: product {}, element {}, bit {}: expected "
                    "non-negative numbers and a bit of 0 to 31",
                    f.product, f.element, f.bit));
  fault_ = f;
  fault_->product += products_seen_;
}

void CpuBackend::check_product(const char* what, CMat a, CMat b, const float* bias, Mat out,
                               DType stored) {
  if (!checking_ && !fault_) return;
  const std::int64_t index = products_seen_++;
  if (fault_ && fault_->product == index && out.rows * out.cols > 0) {
    // The element the fault names, wrapped into this product's output.
    const std::int64_t e = fault_->element % (out.rows * out.cols);
    float& v = out.data[(e / out.cols) * out.ld + e % out.cols];
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    // Bit `bit` of the stored element: of the fp32 value, or of its upper 16 bits where the
    // output is stored as bf16 (bf16 bit 15, the sign, is fp32 bit 31).
    const int bit = stored == DType::bf16 ? 16 + fault_->bit % 16 : fault_->bit;
    bits ^= std::uint32_t{1} << bit;
    std::memcpy(&v, &bits, sizeof bits);
    fault_.reset();
  }
  if (!checking_) return;  // a fault planted for the finite-value guard or the replay
  ++checks_.products;
  const std::string failure = check_columns(a, b, bias, out, rounding_of(stored));
  if (failure.empty()) return;
  if (checks_.failures++ == 0)
    checks_.first_failure = fmt::format("product {} ({}): {}", index, what, failure);
}

}  // namespace parity
