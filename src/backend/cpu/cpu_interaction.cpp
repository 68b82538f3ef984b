// Dot interaction and DCNv2 low-rank cross layer, forward and backward, for the CPU reference.
//
// Why it is built this way:
// - Dot interaction is, per example, a Gram matrix of F feature vectors (Z·Zᵀ, [F, F]) and its
//   backward is dZ = G·Z with G the symmetric matrix of pair gradients. Both are small products,
//   so each example copies its features into double scratch and calls the packed gemm on one
//   thread; threads split the examples. Every pair sum runs over d in ascending order, so the
//   result does not depend on the thread count, and <z_i, z_j> is the same bits as <z_j, z_i>.
// - The cross layer is five products through the same gemm plus elementwise epilogues. The
//   forward computes z from the stored u, and x_next from the stored z, so the saved tensors
//   are exactly the ones the outputs were made from. The backward keeps dz and du in double.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"

namespace parity::cpu {

using detail::check_shape;
using detail::column_sums;
using detail::kParallelElements;
using detail::scratch;
using detail::Slot;
using detail::store;

namespace {

// Shapes of a dot interaction: D, F and the output width D + F(F-1)/2.
struct DotShape {
  std::int64_t batch = 0;
  std::int64_t dim = 0;
  std::int64_t features = 0;
  std::int64_t out_cols = 0;
};

template <class T>
DotShape check_dot(const char* op, MatView<const T> dense, MatView<const T> emb, int num_tables) {
  DotShape s;
  s.out_cols = backend_checks::check_dot(op, dense, emb, num_tables);
  s.batch = dense.rows;
  s.dim = dense.cols;
  s.features = num_tables + 1;
  return s;
}

// z [F, D] (double) = the features of example b: dense row, then the table blocks of emb.
template <class T>
void gather_features(MatView<const T> dense, MatView<const T> emb, std::int64_t b,
                     const DotShape& s, double* z) {
  const T* d0 = dense.row(b);
  for (std::int64_t d = 0; d < s.dim; ++d) z[d] = static_cast<double>(d0[d]);
  const T* e = emb.row(b);
  for (std::int64_t k = 0; k < (s.features - 1) * s.dim; ++k) {
    z[s.dim + k] = static_cast<double>(e[k]);
  }
}

}  // namespace

template <class T>
void dot_interaction_forward(MatView<const T> dense, MatView<const T> emb, int num_tables,
                             MatView<T> out) {
  constexpr const char* op = "dot_interaction_forward";
  const DotShape s = check_dot(op, dense, emb, num_tables);
  check_shape(op, "out", out, s.batch, s.out_cols);
  const std::int64_t f = s.features;

#pragma omp parallel if (s.batch * f * f * s.dim >= kParallelElements)
  {
    std::vector<double> z(static_cast<std::size_t>(f * s.dim));  // [F, D]
    std::vector<double> gram(static_cast<std::size_t>(f * f));   // [F, F]
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < s.batch; ++b) {
      gather_features(dense, emb, b, s, z.data());
      const MatView<const double> zv(z.data(), f, s.dim);  // [F, D]
      gemm(as_strided(zv), transposed(zv), gram.data(), f, Threads::single);
      T* o = out.row(b);
      const T* d0 = dense.row(b);
      std::copy(d0, d0 + s.dim, o);
      std::int64_t c = s.dim;
      for (std::int64_t i = 1; i < f; ++i) {
        for (std::int64_t j = 0; j < i; ++j) o[c++] = static_cast<T>(gram[i * f + j]);
      }
    }
  }
}

template <class T>
void dot_interaction_backward(MatView<const T> dense, MatView<const T> emb, int num_tables,
                              MatView<const T> dout, MatView<T> ddense, MatView<T> demb) {
  constexpr const char* op = "dot_interaction_backward";
  const DotShape s = check_dot(op, dense, emb, num_tables);
  check_shape(op, "dout", dout, s.batch, s.out_cols);
  check_shape(op, "ddense", ddense, s.batch, s.dim);
  check_shape(op, "demb", demb, s.batch, emb.cols);
  const std::int64_t f = s.features;

#pragma omp parallel if (s.batch * f * f * s.dim >= kParallelElements)
  {
    std::vector<double> z(static_cast<std::size_t>(f * s.dim));   // [F, D]
    std::vector<double> g(static_cast<std::size_t>(f * f));       // [F, F]
    std::vector<double> dz(static_cast<std::size_t>(f * s.dim));  // [F, D]
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < s.batch; ++b) {
      gather_features(dense, emb, b, s, z.data());
      // g symmetric, zero diagonal: out pair (i, j) feeds both z_i and z_j.
      const T* go = dout.row(b);
      std::int64_t c = s.dim;
      for (std::int64_t i = 0; i < f; ++i) g[i * f + i] = 0.0;
      for (std::int64_t i = 1; i < f; ++i) {
        for (std::int64_t j = 0; j < i; ++j) {
          const double v = static_cast<double>(go[c++]);
          g[i * f + j] = v;
          g[j * f + i] = v;
        }
      }
      const MatView<const double> gv(g.data(), f, f);      // [F, F]
      const MatView<const double> zv(z.data(), f, s.dim);  // [F, D]
      gemm(as_strided(gv), as_strided(zv), dz.data(), s.dim, Threads::single);
      T* dd = ddense.row(b);
      for (std::int64_t d = 0; d < s.dim; ++d) {
        dd[d] = static_cast<T>(static_cast<double>(go[d]) + dz[d]);
      }
      T* de = demb.row(b);
      for (std::int64_t k = 0; k < (f - 1) * s.dim; ++k) de[k] = static_cast<T>(dz[s.dim + k]);
    }
  }
}

template <class T>
void cross_forward(MatView<const T> x0, MatView<const T> xl, MatView<const T> v, MatView<const T> w,
                   const T* bias, MatView<T> u, MatView<T> z, MatView<T> x_next, DType storage) {
  backend_checks::check_cross_forward(x0, xl, v, w, u, z, x_next);
  const std::int64_t batch = x0.rows;
  const std::int64_t n = x0.cols;
  const std::int64_t rank = v.rows;

  double* acc = scratch(Slot::result, batch * std::max(rank, n));  // [batch, rank], [batch, n]
  gemm(as_strided(xl), transposed(v), acc, rank);
  store(acc, rank, u);
  const auto stored = [storage](T x) {
    return storage == DType::f32 ? x
                                 : static_cast<T>(round_to_dtype(static_cast<float>(x), storage));
  };
  if (storage != DType::f32) {
#pragma omp parallel for schedule(static) if (batch * rank >= kParallelElements)
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < rank; ++i) u(b, i) = stored(u(b, i));
  }
  gemm(as_strided(MatView<const T>(u)), transposed(w), acc, n);
#pragma omp parallel for schedule(static) if (batch * n >= kParallelElements)
  for (std::int64_t b = 0; b < batch; ++b) {
    const double* a = acc + b * n;
    const T* x0b = x0.row(b);
    const T* xlb = xl.row(b);
    T* zb = z.row(b);
    T* xnb = x_next.row(b);
    for (std::int64_t i = 0; i < n; ++i) {
      double zi = a[i];
      if (bias != nullptr) zi += static_cast<double>(bias[i]);
      zb[i] = stored(static_cast<T>(zi));
      xnb[i] = static_cast<T>(static_cast<double>(x0b[i]) * static_cast<double>(zb[i]) +
                              static_cast<double>(xlb[i]));
    }
  }
}

template <class T>
void cross_backward(MatView<const T> x0, MatView<const T> xl, MatView<const T> v,
                    MatView<const T> w, MatView<const T> u, MatView<const T> z,
                    MatView<const T> dx_next, MatView<T> dx0, MatView<T> dxl, MatView<T> dv,
                    MatView<T> dw, T* dbias, MatView<T> du_scratch, bool first_into_dx0,
                    bool xl_is_x0) {
  backend_checks::check_cross_backward(x0, xl, v, w, u, z, dx_next, dx0, dxl, dv, dw, du_scratch,
                                       xl_is_x0);
  const std::int64_t batch = x0.rows;
  const std::int64_t n = x0.cols;
  const std::int64_t rank = v.rows;
  const bool want_du = du_scratch.data != nullptr;

  // dz = g ⊙ x0 (exact in double for float inputs); dx0 += g ⊙ z (+ g when xl is x0).
  double* dz = scratch(Slot::gradient, batch * n);  // [batch, n]
#pragma omp parallel for schedule(static) if (batch * n >= kParallelElements)
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* gb = dx_next.row(b);
    const T* x0b = x0.row(b);
    const T* zb = z.row(b);
    T* dx0b = dx0.row(b);
    double* dzb = dz + b * n;
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = static_cast<double>(gb[i]);
      dzb[i] = g * static_cast<double>(x0b[i]);
      const double before = first_into_dx0 ? 0.0 : static_cast<double>(dx0b[i]);
      dx0b[i] = static_cast<T>(before + g * static_cast<double>(zb[i]) + (xl_is_x0 ? g : 0.0));
    }
  }
  const MatView<const double> dz_view(dz, batch, n);  // [batch, n]

  double* acc = scratch(Slot::result, std::max(n * rank, batch * n));  // [n, r], [r, n], [batch, n]
  gemm(transposed(dz_view), as_strided(u), acc, rank);
  store(acc, rank, dw);

  if (dbias != nullptr) column_sums(dz, batch, n, dbias);

  double* du = scratch(Slot::second_gradient, batch * rank);  // [batch, rank]
  gemm(as_strided(dz_view), as_strided(w), du, rank);
  if (want_du) store(du, rank, du_scratch);
  const MatView<const double> du_view(du, batch, rank);  // [batch, rank]

  gemm(transposed(du_view), as_strided(xl), acc, n);
  store(acc, n, dv);

  gemm(as_strided(du_view), as_strided(v), acc, n);
#pragma omp parallel for schedule(static) if (batch * n >= kParallelElements)
  for (std::int64_t b = 0; b < batch; ++b) {
    const double* a = acc + b * n;
    if (xl_is_x0) {  // dx0 already holds g ⊙ z + g: add du · v
      T* dx0b = dx0.row(b);
      for (std::int64_t i = 0; i < n; ++i)
        dx0b[i] = static_cast<T>(static_cast<double>(dx0b[i]) + a[i]);
      continue;
    }
    const T* gb = dx_next.row(b);
    T* dxlb = dxl.row(b);
    for (std::int64_t i = 0; i < n; ++i) {
      dxlb[i] = static_cast<T>(static_cast<double>(gb[i]) + a[i]);
    }
  }
}

#define PARITY_INSTANTIATE(T)                                                                    \
  template void dot_interaction_forward<T>(MatView<const T>, MatView<const T>, int, MatView<T>); \
  template void dot_interaction_backward<T>(MatView<const T>, MatView<const T>, int,             \
                                            MatView<const T>, MatView<T>, MatView<T>);           \
  template void cross_forward<T>(MatView<const T>, MatView<const T>, MatView<const T>,           \
                                 MatView<const T>, const T*, MatView<T>, MatView<T>, MatView<T>, \
                                 DType);                                                         \
  template void cross_backward<T>(MatView<const T>, MatView<const T>, MatView<const T>,          \
                                  MatView<const T>, MatView<const T>, MatView<const T>,          \
                                  MatView<const T>, MatView<T>, MatView<T>, MatView<T>,          \
                                  MatView<T>, T*, MatView<T>, bool, bool);
PARITY_INSTANTIATE(float)
PARITY_INSTANTIATE(double)
#undef PARITY_INSTANTIATE

}  // namespace parity::cpu
