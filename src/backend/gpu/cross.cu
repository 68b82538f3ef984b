// The cross layer's elementwise kernels (see cross.h). Where the CPU reference forms a value in
// double from fp32 inputs and rounds once (x0 ⊙ z + xl, dx0 += g ⊙ z), these kernels do the same,
// so they agree with it bit for bit or within an ulp; the device's double rate is far above what
// these memory-bound passes need.
#include "backend/gpu/cross.h"

#include <type_traits>

#include "backend/gpu/column_sum.cuh"
#include "backend/gpu/column_sum.h"
#include "backend/gpu/fill.h"

namespace parity::gpu {

namespace {

using namespace elementwise;

template <int V, class S>
__global__ __launch_bounds__(kBlock) void cross_combine_kernel(MatView<const S> x0,
                                                               MatView<const S> z,
                                                               MatView<const S> xl,
                                                               MatView<S> x_next, RowSpan span) {
  for_each_group<V>(x0.rows, x0.cols, span, [&](std::int64_t r, std::int64_t c) {
    float a[V], b[V], o[V];
    load_vec<V>(x0.data + r * x0.ld + c, a);
    load_vec<V>(z.data + r * z.ld + c, b);
    load_vec<V>(xl.data + r * xl.ld + c, o);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      o[i] = static_cast<float>(static_cast<double>(a[i]) * static_cast<double>(b[i]) +
                                static_cast<double>(o[i]));
    }
    store_vec_rn<V>(x_next.data + r * x_next.ld + c, o);
  });
}

// One group of the cross-layer gradients: dz = g ⊙ x0 (into d), dx0 (+)= g ⊙ z (+ g).
template <int V, class S, class G>
__device__ __forceinline__ void cross_gradient_group(MatView<const G> g, MatView<const S> x0,
                                                     MatView<const S> z, float* __restrict__ dz,
                                                     Bf16* __restrict__ dz16, MatView<G> dx0,
                                                     CrossGradientFlags flags, std::int64_t r,
                                                     std::int64_t c, float (&d)[V]) {
  float gv[V], xv[V], zv[V], a[V];
  load_vec<V>(g.data + r * g.ld + c, gv);
  load_vec<V>(x0.data + r * x0.ld + c, xv);
  load_vec<V>(z.data + r * z.ld + c, zv);
  G* o = dx0.data + r * dx0.ld + c;
  if (flags.overwrite) {
#pragma unroll
    for (int i = 0; i < V; ++i) a[i] = 0.0f;
  } else {
    load_vec<V>(o, a);
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const double gi = gv[i];
    d[i] = static_cast<float>(gi * static_cast<double>(xv[i]));
    a[i] = static_cast<float>(static_cast<double>(a[i]) + gi * static_cast<double>(zv[i]) +
                              (flags.add_g ? gi : 0.0));
  }
  const std::int64_t at = r * g.cols + c;
  if (!flags.dz_bf16_only) store_vec_rn<V>(dz + at, d);
  if (dz16 != nullptr) store_vec_rn<V>(dz16 + at, d);
  store_vec_rn<V>(o, a);
}

template <int V, class S, class G>
__global__ __launch_bounds__(kBlock) void cross_gradients_kernel(
    MatView<const G> g, MatView<const S> x0, MatView<const S> z, float* __restrict__ dz,
    Bf16* __restrict__ dz16, MatView<G> dx0, CrossGradientFlags flags, RowSpan span) {
  for_each_group<V>(g.rows, g.cols, span, [&](std::int64_t r, std::int64_t c) {
    float d[V];
    cross_gradient_group<V, S, G>(g, x0, z, dz, dz16, dx0, flags, r, c, d);
  });
}

template <int V, class S, class G>
__global__ __launch_bounds__(kSumBlock) void cross_gradients_sum_kernel(
    MatView<const G> g, MatView<const S> x0, MatView<const S> z, float* __restrict__ dz,
    Bf16* __restrict__ dz16, MatView<G> dx0, CrossGradientFlags flags, int tpr, int tiles,
    double* __restrict__ partial) {
  rows_with_column_sums<V>(g.rows, g.cols, tpr, tiles, partial,
                           [&](std::int64_t r, std::int64_t c, float(&d)[V]) {
                             cross_gradient_group<V, S, G>(g, x0, z, dz, dz16, dx0, flags, r, c, d);
                           });
}

}  // namespace

void cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next) {
  if (x0.rows * x0.cols <= 0) return;
  const int vec = vec_width(x0.cols, {vec_view(x0), vec_view(z), vec_view(xl), vec_view(x_next)});
  dispatch(
      "cross_combine", vec,
      [&](auto width, auto tag) {
        constexpr int V = decltype(width)::value;
        using S = decltype(tag);
        const RowSpan span = row_span(x0.cols / V);
        launch("cross_combine", cross_combine_kernel<V, S>, {row_grid(x0.rows, span), kBlock, 0}, s,
               typed<S>(x0), typed<S>(z), typed<S>(xl), typed<S>(x_next), span);
      },
      x0.dtype);
}

void cross_gradients(Stream_t s, CAMat g, CAMat x0, CAMat z, float* dz, Bf16* dz16, AMat dx0,
                     float* dbias, void* scratch, CrossGradientFlags flags) {
  if (dx0.dtype != g.dtype) throw Error("cross_gradients: g and dx0 must share one storage type");
  if (dbias != nullptr && g.rows <= 0) {
    fill(s, dbias, g.cols, 0.0f);
    return;
  }
  if (g.rows * g.cols <= 0) return;
  if (dz16 == nullptr) flags.dz_bf16_only = false;  // dz is the only copy then
  // Groups of 8 only for bf16 x0 and z: with fp32 ones the folded kernel spills at 8 per thread.
  const int vec =
      std::min(x0.dtype == DType::f32 ? 4 : 8,
               vec_width(g.cols, {vec_view(g), vec_view(x0), vec_view(z), packed(dz, g.cols),
                                  vec_view(dx0), packed(dz16, g.cols, 2)}));
  const bool fold = dbias != nullptr && fused_sum_fits(g.rows, g.cols, vec);
  if (dbias != nullptr && !fold) flags.dz_bf16_only = false;  // the column sum below reads dz
  dispatch(
      "cross_gradients", vec,
      [&](auto width, auto xs, auto gs) {
        constexpr int V = decltype(width)::value;
        using S = decltype(xs);
        using G = decltype(gs);
        if constexpr (V == 8 && std::is_same_v<S, float>) {
          throw Error("cross_gradients: groups of 8 with fp32 x0 (not instantiated)");
        } else if (fold) {
          const FoldShape f = device_fold_shape(g.rows, g.cols, V);
          launch("cross_gradients_sum", cross_gradients_sum_kernel<V, S, G>,
                 {f.grid(), kSumBlock, 0}, s, typed<G>(g), typed<S>(x0), typed<S>(z), dz, dz16,
                 typed<G>(dx0), flags, f.tpr, static_cast<int>(f.tiles),
                 static_cast<double*>(scratch));
          folded_column_sums(s, "cross_gradients_bias", f, g.cols, scratch, dbias);
        } else {
          const RowSpan span = row_span(g.cols / V);
          launch("cross_gradients", cross_gradients_kernel<V, S, G>,
                 {row_grid(g.rows, span), kBlock, 0}, s, typed<G>(g), typed<S>(x0), typed<S>(z), dz,
                 dz16, typed<G>(dx0), flags, span);
        }
      },
      x0.dtype, g.dtype);
  if (dbias != nullptr && !fold) column_sum(s, CMat(dz, g.rows, g.cols), dbias, scratch);
}

}  // namespace parity::gpu
