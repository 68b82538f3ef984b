// Shared helpers for the CPU backend tests: seeded random matrices (owned, with an optional
// leading dimension wider than the columns), sparse batches in the CSR layout, and comparisons.
//
// Why it is built this way: every test draws its shapes and values from parity's own
// counter-based RNG with a fixed seed, so a failure is reproducible from the seed printed in the
// test name or message, and the float and double paths can be fed bit-identical inputs (values
// are drawn as float, then widened).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/random.h"
#include "parity/tensor.h"

namespace parity::test {

// Tables whose weights are all fp32 (of type T: the cpu ops' double instantiation reads the fp32
// buffer as double), in one buffer.
template <class T>
TableWeights fp32_tables(const T* w) {
  return TableWeights{const_cast<T*>(w), nullptr, nullptr};
}

// A seeded source of test values.
class Rand {
 public:
  explicit Rand(std::uint64_t seed, std::uint64_t stream = 0) : s_(rng::key(seed, stream)) {}
  // Uniform in [lo, hi), rounded to float so that float and double runs see the same values.
  double uniform(double lo = -1.0, double hi = 1.0) {
    return static_cast<double>(static_cast<float>(lo + (hi - lo) * s_.next_uniform()));
  }
  // Uniform integer in [lo, hi].
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(s_.next_below(static_cast<std::uint64_t>(hi - lo + 1)));
  }

 private:
  rng::Stream s_;
};

// An owned row-major matrix with leading dimension ld >= cols.
template <class T>
struct Matrix {
  std::vector<T> data;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;

  Matrix() = default;
  Matrix(std::int64_t r, std::int64_t c, std::int64_t l = -1, T init = T(0))
      : data(static_cast<std::size_t>(r * (l < 0 ? c : l)), init),
        rows(r),
        cols(c),
        ld(l < 0 ? c : l) {}
  MatView<T> view() { return {data.data(), rows, cols, ld}; }
  MatView<const T> cview() const { return {data.data(), rows, cols, ld}; }
  T& operator()(std::int64_t r, std::int64_t c) { return data[r * ld + c]; }
  T operator()(std::int64_t r, std::int64_t c) const { return data[r * ld + c]; }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
};

template <class T>
Matrix<T> random_matrix(Rand& rand, std::int64_t rows, std::int64_t cols, double lo = -1.0,
                        double hi = 1.0, std::int64_t ld = -1) {
  Matrix<T> m(rows, cols, ld, std::numeric_limits<T>::quiet_NaN());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) m(r, c) = static_cast<T>(rand.uniform(lo, hi));
  }
  return m;
}

template <class T>
Matrix<T> integer_matrix(Rand& rand, std::int64_t rows, std::int64_t cols, std::int64_t lo,
                         std::int64_t hi) {
  Matrix<T> m(rows, cols);
  for (auto& v : m.data) v = static_cast<T>(rand.integer(lo, hi));
  return m;
}

// A matrix filled with NaN (outputs are poisoned so that unwritten elements show).
template <class T>
Matrix<T> nan_matrix(std::int64_t rows, std::int64_t cols, std::int64_t ld = -1) {
  return Matrix<T>(rows, cols, ld, std::numeric_limits<T>::quiet_NaN());
}

template <class To, class From>
Matrix<To> convert(const Matrix<From>& m) {
  Matrix<To> out(m.rows, m.cols, m.ld);
  for (std::size_t i = 0; i < m.data.size(); ++i) out.data[i] = static_cast<To>(m.data[i]);
  return out;
}

template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

template <class T>
std::vector<T> random_vector(Rand& rand, std::int64_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(rand.uniform(lo, hi));
  return v;
}

// One batch of sparse input in the CSR layout of SparseInput, owning its arrays.
struct SparseBatch {
  std::int64_t batch = 0;
  int num_tables = 0;
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> offsets;
  SparseInput input() const { return {batch, num_tables, ids.data(), offsets.data()}; }
};

// Bags given explicitly: bags[t][b] is the id list of bag (t, b).
inline SparseBatch make_sparse(const std::vector<std::vector<std::vector<std::int64_t>>>& bags) {
  SparseBatch s;
  s.num_tables = static_cast<int>(bags.size());
  s.batch = bags.empty() ? 0 : static_cast<std::int64_t>(bags[0].size());
  s.offsets.push_back(0);
  for (const auto& table : bags) {
    for (const auto& bag : table) {
      s.ids.insert(s.ids.end(), bag.begin(), bag.end());
      s.offsets.push_back(static_cast<std::int64_t>(s.ids.size()));
    }
  }
  return s;
}

// Random bags: pooling size uniform in [0, max_pool], ids uniform in [0, rows of the table).
inline SparseBatch random_sparse(Rand& rand, std::int64_t batch,
                                 const std::vector<TableLayout>& tables, int max_pool) {
  std::vector<std::vector<std::vector<std::int64_t>>> bags(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    bags[t].resize(static_cast<std::size_t>(batch));
    for (auto& bag : bags[t]) {
      const std::int64_t n = rand.integer(0, max_pool);
      for (std::int64_t i = 0; i < n; ++i) bag.push_back(rand.integer(0, tables[t].rows - 1));
    }
  }
  return make_sparse(bags);
}

// Consecutive table layouts: weights packed table after table, output columns side by side
// starting at first_col; state laid out for the given optimizer.
inline std::vector<TableLayout> pack_tables(const std::vector<std::int64_t>& rows,
                                            const std::vector<int>& dims,
                                            const std::vector<Pooling>& pooling,
                                            OptimizerKind kind = OptimizerKind::sgd,
                                            std::int64_t first_col = 0) {
  std::vector<TableLayout> tables;
  std::int64_t weight = 0;
  std::int64_t state = 0;
  std::int64_t col = first_col;
  for (std::size_t t = 0; t < rows.size(); ++t) {
    TableLayout tl;
    tl.rows = rows[t];
    tl.dim = dims[t];
    tl.pooling = pooling[t];
    tl.weight_offset = weight;
    tl.state_offset = state;
    tl.out_col = col;
    weight += rows[t] * dims[t];
    state += kind == OptimizerKind::rowwise_adagrad ? rows[t] : rows[t] * dims[t];
    col += dims[t];
    tables.push_back(tl);
  }
  return tables;
}

inline std::int64_t total_weights(const std::vector<TableLayout>& tables) {
  std::int64_t n = 0;
  for (const auto& t : tables) n += t.rows * t.dim;
  return n;
}

// Root mean square of the elements of a view (a scale for relative comparisons).
template <class T>
double rms(MatView<const T> m) {
  double s = 0.0;
  for (std::int64_t r = 0; r < m.rows; ++r) {
    for (std::int64_t c = 0; c < m.cols; ++c) s += static_cast<double>(m(r, c)) * m(r, c);
  }
  return m.rows * m.cols > 0 ? std::sqrt(s / static_cast<double>(m.rows * m.cols)) : 0.0;
}

// Every element of f (float path) is within rel * (|d| + rms(d)) of d (double path); a NaN
// anywhere fails. Returns the number of mismatches (and reports the first few).
inline int expect_close(MatView<const float> f, MatView<const double> d, double rel,
                        const std::string& what) {
  EXPECT_EQ(f.rows, d.rows) << what;
  EXPECT_EQ(f.cols, d.cols) << what;
  const double scale = rms(d);
  int bad = 0;
  for (std::int64_t r = 0; r < d.rows; ++r) {
    for (std::int64_t c = 0; c < d.cols; ++c) {
      const double a = f(r, c);
      const double b = d(r, c);
      const bool ok = std::abs(a - b) <= rel * (std::abs(b) + scale);
      if (!ok && ++bad <= 5) {
        ADD_FAILURE() << what << " (" << r << ", " << c << "): float " << a << " vs double " << b;
      }
    }
  }
  return bad;
}

inline int expect_close(const std::vector<float>& f, const std::vector<double>& d, double rel,
                        const std::string& what) {
  const auto n = static_cast<std::int64_t>(d.size());
  EXPECT_EQ(f.size(), d.size()) << what;
  return expect_close(MatView<const float>(f.data(), 1, n), MatView<const double>(d.data(), 1, n),
                      rel, what);
}

// The gap columns [cols, ld) of every row are still NaN (nothing wrote past the view).
template <class T>
void expect_gap_untouched(const Matrix<T>& m, std::int64_t col0, std::int64_t cols,
                          const std::string& what) {
  for (std::int64_t r = 0; r < m.rows; ++r) {
    for (std::int64_t c = 0; c < m.ld; ++c) {
      if (c >= col0 && c < col0 + cols) continue;
      if (!std::isnan(static_cast<double>(m.data[r * m.ld + c]))) {
        ADD_FAILURE() << what << ": element (" << r << ", " << c
                      << ") outside the view was written";
        return;
      }
    }
  }
}

// Central differences (step 1e-6) of objective in p[i] against analytic[i], for every i in
// [0, n): relative error (to max(1, |analytic|)) at most 1e-6, the first few misses reported.
inline void check_gradient(const std::string& what, double* p, const double* analytic,
                           std::int64_t n, const std::function<double()>& objective) {
  constexpr double kStep = 1e-6, kTolerance = 1e-6;
  int bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double saved = p[i];
    p[i] = saved + kStep;
    const double plus = objective();
    p[i] = saved - kStep;
    const double minus = objective();
    p[i] = saved;
    const double numeric = (plus - minus) / (2.0 * kStep);
    const double err = std::abs(numeric - analytic[i]) / std::max(1.0, std::abs(analytic[i]));
    if (err > kTolerance && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric
                    << " (relative error " << err << ")";
  }
}

// Σ a ⊙ b over a view's elements (ld respected): the objective L = Σ dy ⊙ y of the checks.
inline double dot(MatView<const double> a, MatView<const double> b) {
  double s = 0.0;
  for (std::int64_t r = 0; r < a.rows; ++r)
    for (std::int64_t c = 0; c < a.cols; ++c) s += a(r, c) * b(r, c);
  return s;
}

}  // namespace parity::test
