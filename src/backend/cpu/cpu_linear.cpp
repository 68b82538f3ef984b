// Linear layer forward and backward for the CPU reference.
//
// Why it is built this way: all three products (y = x·wᵀ, dw = dzᵀ·x, dx = dz·w) go through the
// one packed gemm (cpu_gemm.h), which sums each output in ascending k in double and splits only
// independent output tiles across threads. dz = dy ⊙ act'(y) is formed once in double scratch
// (exact: it is dy or 0). The bias gradient is a column sum over the batch, done sequentially in
// batch order.
#include <algorithm>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"

namespace parity::cpu {

using detail::column_sums;
using detail::kParallelElements;
using detail::scratch;
using detail::Slot;
using detail::store;

template <class T>
void linear_forward(MatView<const T> x, MatView<const T> w, const T* bias, Activation act,
                    MatView<T> y) {
  backend_checks::check_linear_forward(x, w, y);
  const std::int64_t batch = x.rows;
  const std::int64_t out = w.rows;

  double* acc = scratch(Slot::result, batch * out);  // [batch, out]
  gemm(as_strided(x), transposed(w), acc, out);
#pragma omp parallel for schedule(static) if (batch * out >= kParallelElements)
  for (std::int64_t b = 0; b < batch; ++b) {
    const double* a = acc + b * out;
    T* yb = y.row(b);
    for (std::int64_t o = 0; o < out; ++o) {
      double z = a[o];
      if (bias != nullptr) z += static_cast<double>(bias[o]);
      if (act == Activation::relu && z < 0.0) z = 0.0;
      yb[o] = static_cast<T>(z);
    }
  }
}

template <class T>
void linear_backward(MatView<const T> x, MatView<const T> w, MatView<const T> y,
                     MatView<const T> dy, Activation act, MatView<T> dx, MatView<T> dw, T* dbias) {
  backend_checks::check_linear_backward(x, w, y, dy, dx, dw);
  const std::int64_t batch = x.rows;
  const std::int64_t in = x.cols;
  const std::int64_t out = w.rows;
  const bool want_dx = dx.data != nullptr;

  // dz = dy ⊙ act'(y), act' taken from the saved output (relu: 1 where y > 0).
  double* dz = scratch(Slot::gradient, batch * out);  // [batch, out]
#pragma omp parallel for schedule(static) if (batch * out >= kParallelElements)
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* yb = y.row(b);
    const T* dyb = dy.row(b);
    double* dzb = dz + b * out;
    for (std::int64_t o = 0; o < out; ++o) {
      const bool pass = act == Activation::none || yb[o] > T(0);
      dzb[o] = pass ? static_cast<double>(dyb[o]) : 0.0;
    }
  }
  const MatView<const double> dz_view(dz, batch, out);  // [batch, out]

  double* acc = scratch(Slot::result, std::max(out, batch) * in);  // [out, in], [batch, in]
  gemm(transposed(dz_view), as_strided(x), acc, in);
  store(acc, in, dw);

  if (dbias != nullptr) column_sums(dz, batch, out, dbias);

  if (want_dx) {
    gemm(as_strided(dz_view), as_strided(w), acc, in);
    store(acc, in, dx);
  }
}

template void linear_forward<float>(MatView<const float>, MatView<const float>, const float*,
                                    Activation, MatView<float>);
template void linear_forward<double>(MatView<const double>, MatView<const double>, const double*,
                                     Activation, MatView<double>);
template void linear_backward<float>(MatView<const float>, MatView<const float>,
                                     MatView<const float>, MatView<const float>, Activation,
                                     MatView<float>, MatView<float>, float*);
template void linear_backward<double>(MatView<const double>, MatView<const double>,
                                      MatView<const double>, MatView<const double>, Activation,
                                      MatView<double>, MatView<double>, double*);

}  // namespace parity::cpu
