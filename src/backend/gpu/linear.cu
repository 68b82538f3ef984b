// relu_backward (see linear.h): a row walk (elementwise.cuh), or the same pass with the bias
// gradient's column sums folded in (column_sum.cuh) so that dz is not read again.
#include "backend/gpu/linear.h"

#include "backend/gpu/column_sum.cuh"
#include "backend/gpu/column_sum.h"
#include "backend/gpu/fill.h"

namespace parity::gpu {

namespace {

using namespace elementwise;

// One group: dz = dy ⊙ (y > 0) into v, stored to dz (when not null) and dz16 (when not null).
template <int V, class S, class G>
__device__ __forceinline__ void relu_group(MatView<const S> y, MatView<const G> dy,
                                           float* __restrict__ dz, Bf16* __restrict__ dz16,
                                           std::int64_t r, std::int64_t c, float (&v)[V]) {
  float yv[V];
  load_vec<V>(y.data + r * y.ld + c, yv);
  load_vec<V>(dy.data + r * dy.ld + c, v);
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = yv[i] > 0.0f ? v[i] : 0.0f;
  const std::int64_t at = r * y.cols + c;
  if (dz != nullptr) store_vec_rn<V>(dz + at, v);
  if (dz16 != nullptr) store_vec_rn<V>(dz16 + at, v);
}

template <int V, class S, class G>
__global__ __launch_bounds__(kBlock) void relu_backward_kernel(MatView<const S> y,
                                                               MatView<const G> dy,
                                                               float* __restrict__ dz,
                                                               Bf16* __restrict__ dz16,
                                                               RowSpan span) {
  for_each_group<V>(y.rows, y.cols, span, [&](std::int64_t r, std::int64_t c) {
    float v[V];
    relu_group<V, S, G>(y, dy, dz, dz16, r, c, v);
  });
}

template <int V, class S, class G>
__global__ __launch_bounds__(kSumBlock) void relu_backward_sum_kernel(
    MatView<const S> y, MatView<const G> dy, float* __restrict__ dz, Bf16* __restrict__ dz16,
    int tpr, int tiles, double* __restrict__ partial) {
  rows_with_column_sums<V>(y.rows, y.cols, tpr, tiles, partial,
                           [&](std::int64_t r, std::int64_t c, float(&v)[V]) {
                             relu_group<V, S, G>(y, dy, dz, dz16, r, c, v);
                           });
}

}  // namespace

void relu_backward(Stream_t s, CAMat y, CAMat dy, float* dz, Bf16* dz16, float* dbias,
                   void* scratch, bool dz_bf16_only) {
  if (dbias != nullptr && y.rows <= 0) {
    fill(s, dbias, y.cols, 0.0f);
    return;
  }
  if (y.rows * y.cols <= 0) return;
  const int vec =
      vec_width(y.cols, {vec_view(y), vec_view(dy), packed(dz, y.cols), packed(dz16, y.cols, 2)});
  const bool fold = dbias != nullptr && fused_sum_fits(y.rows, y.cols, vec);
  // The folded sum needs no fp32 dz to read back.
  float* dz_out = fold && dz_bf16_only && dz16 != nullptr ? nullptr : dz;
  dispatch(
      "relu_backward", vec,
      [&](auto width, auto ys, auto gs) {
        constexpr int V = decltype(width)::value;
        using S = decltype(ys);
        using G = decltype(gs);
        if (fold) {
          const FoldShape f = device_fold_shape(y.rows, y.cols, V);
          launch("relu_backward_sum", relu_backward_sum_kernel<V, S, G>, {f.grid(), kSumBlock, 0},
                 s, typed<S>(y), typed<G>(dy), dz_out, dz16, f.tpr, static_cast<int>(f.tiles),
                 static_cast<double*>(scratch));
          folded_column_sums(s, "relu_backward_bias", f, y.cols, scratch, dbias);
          return;
        }
        const RowSpan span = row_span(y.cols / V);
        launch("relu_backward", relu_backward_kernel<V, S, G>, {row_grid(y.rows, span), kBlock, 0},
               s, typed<S>(y), typed<G>(dy), dz, dz16, span);
      },
      y.dtype, dy.dtype);
  if (dbias != nullptr && !fold) column_sum(s, CMat(dz, y.rows, y.cols), dbias, scratch);
}

}  // namespace parity::gpu
