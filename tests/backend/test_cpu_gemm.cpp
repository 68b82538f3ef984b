// The packed gemm must equal the naive double loop bit for bit (its contract, cpu_gemm.h): for
// every shape, including edge tiles, more than one depth block, transposed and strided operands,
// and any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "cpu_test_util.h"
#include "parity/error.h"

namespace parity {
namespace {

using cpu::Strided;
using test::Matrix;
using test::Rand;

template <class TA, class TB>
std::vector<double> naive(Strided<TA> a, Strided<TB> b) {
  std::vector<double> c(static_cast<std::size_t>(a.rows * b.cols));  // [M, N]
  for (std::int64_t m = 0; m < a.rows; ++m) {
    for (std::int64_t n = 0; n < b.cols; ++n) {
      double s = 0.0;
      for (std::int64_t k = 0; k < a.cols; ++k) {
        s += static_cast<double>(a(m, k)) * static_cast<double>(b(k, n));
      }
      c[m * b.cols + n] = s;
    }
  }
  return c;
}

struct Shape {
  std::int64_t m, n, k;
};

class GemmShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmShapes, EqualsNaiveLoopBitForBit) {
  const Shape s = GetParam();
  Rand rand(static_cast<std::uint64_t>(s.m * 1000003 + s.n * 1009 + s.k), 1);
  // a is stored transposed with a wider leading dimension; b is a column block of a wider buffer.
  const Matrix<double> at = test::random_matrix<double>(rand, s.k, s.m, -1, 1, s.m + 3);  // [K, M]
  const Matrix<float> b = test::random_matrix<float>(rand, s.k, s.n + 2, -1, 1);  // [K, N+2]
  const Strided<double> a = cpu::transposed(at.cview());
  const Strided<float> bv = cpu::as_strided(b.cview().cols_slice(1, s.n));
  const std::vector<double> expected = naive(a, bv);
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<double> c(static_cast<std::size_t>(s.m * (s.n + 1)), NAN);  // [M, N], ldc N+1
    cpu::gemm(a, bv, c.data(), s.n + 1);
    for (std::int64_t m = 0; m < s.m && s.n > 0; ++m) {
      ASSERT_EQ(
          std::memcmp(c.data() + m * (s.n + 1), expected.data() + m * s.n, sizeof(double) * s.n), 0)
          << "row " << m << " with " << threads << " threads";
      EXPECT_TRUE(std::isnan(c[m * (s.n + 1) + s.n])) << "ldc gap written";
    }
  }
  omp_set_num_threads(saved_threads);
}

INSTANTIATE_TEST_SUITE_P(CpuGemm, GemmShapes,
                         ::testing::Values(Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{4, 4, 4},
                                           Shape{17, 9, 1}, Shape{64, 33, 300}, Shape{5, 70, 513},
                                           Shape{130, 2, 40}, Shape{0, 3, 4}, Shape{3, 0, 4},
                                           Shape{6, 5, 0}));

TEST(CpuGemm, FloatOperands) {
  Rand rand(5, 2);
  const Matrix<float> a = test::random_matrix<float>(rand, 37, 261);  // [M, K]
  const Matrix<float> w = test::random_matrix<float>(rand, 19, 261);  // [N, K]
  const Strided<float> av = cpu::as_strided(a.cview());
  const Strided<float> bv = cpu::transposed(w.cview());
  const std::vector<double> expected = naive(av, bv);
  std::vector<double> c(expected.size());
  cpu::gemm(av, bv, c.data(), 19);
  EXPECT_EQ(std::memcmp(c.data(), expected.data(), sizeof(double) * c.size()), 0);
}

TEST(CpuGemm, RejectsMismatchedDepth) {
  std::vector<float> a(6), b(6);
  std::vector<double> c(9);
  EXPECT_THROW(cpu::gemm(Strided<float>{a.data(), 3, 2, 2, 1}, Strided<float>{b.data(), 3, 2, 2, 1},
                         c.data(), 2),
               Error);
}

}  // namespace
}  // namespace parity
