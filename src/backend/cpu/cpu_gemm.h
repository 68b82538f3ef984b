// Matrix products for the CPU reference backend.
//
// Why it is built this way: the reference has to be exact enough to judge GPU kernels and quick
// enough to train the default model on two cores. One rule gives both: every output element is
// the sum over k, in ascending k, of double products, starting from +0, exactly as the naive
// triple loop `double s = 0; for (k) s += a(m,k) * b(k,n);` computes it. Blocking never changes
// that order (partial sums are kept in double between depth blocks), so the result is
// bit-identical to the naive loop whatever the blocking and whatever the thread count; threads
// only split independent output tiles.
//
// Speed comes from the classic packed layout: operands are converted to double into contiguous
// panels (which also absorbs transposes and strided views), and a small register tile of
// kTileRows x kTileCols outputs walks k. The tile's inner loop runs over independent outputs, so
// the compiler vectorises it without reassociating any sum.
#pragma once

#include <cstdint>

#include "parity/tensor.h"

namespace parity::cpu {

// A read-only matrix whose element (r, c) is data[r * row_stride + c * col_stride]: a row-major
// view or its transpose, without a copy.
template <class T>
struct Strided {
  const T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 1;

  T operator()(std::int64_t r, std::int64_t c) const {
    return data[r * row_stride + c * col_stride];
  }
};

template <class T>
Strided<T> as_strided(MatView<const T> m) {
  return {m.data, m.rows, m.cols, m.ld, 1};
}
template <class T>
Strided<T> as_strided(MatView<T> m) {
  return {m.data, m.rows, m.cols, m.ld, 1};
}
template <class T>
Strided<T> transposed(MatView<const T> m) {
  return {m.data, m.cols, m.rows, 1, m.ld};
}
template <class T>
Strided<T> transposed(MatView<T> m) {
  return {m.data, m.cols, m.rows, 1, m.ld};
}

// Whether gemm may open an OpenMP parallel region. Callers that already run inside one (one
// product per example) pass Threads::single.
enum class Threads : std::uint8_t { single, parallel };

// c(m, n) = Σ_k a(m, k) · b(k, n), summed in double in ascending k (see the file comment).
// a [M, K], b [K, N], c [M, N] with leading dimension ldc >= N; c is overwritten.
// Instantiated for (float, float), (double, double) and (double, float).
template <class TA, class TB>
void gemm(Strided<TA> a, Strided<TB> b, double* c, std::int64_t ldc,
          Threads threads = Threads::parallel);

}  // namespace parity::cpu
