// convert (see convert.h): one row walk (elementwise.cuh) per storage pair and width.
#include "backend/gpu/convert.h"

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu {

namespace {

using namespace elementwise;

template <int V, class A, class B>
__global__ __launch_bounds__(kBlock) void convert_kernel(MatView<const A> src, MatView<B> dst,
                                                         RowSpan span) {
  for_each_group<V>(src.rows, src.cols, span, [&](std::int64_t r, std::int64_t c) {
    float v[V];
    load_vec<V>(src.data + r * src.ld + c, v);
    store_vec_rn<V>(dst.data + r * dst.ld + c, v);
  });
}

// Zeros in columns [cols, ld) of each of rows rows (fewer than 8 a row): one thread a row.
__global__ __launch_bounds__(kBlock) void zero_tail_kernel(std::uint16_t* __restrict__ p,
                                                           std::int64_t rows, std::int64_t cols,
                                                           std::int64_t ld) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (r >= rows) return;
  for (std::int64_t c = cols; c < ld; ++c) p[r * ld + c] = 0;  // +0.0 in bf16
}

}  // namespace

void convert_padded(Stream_t s, CMat src, AMat dst) {
  convert(s, src, dst);
  if (src.rows <= 0 || dst.ld == src.cols) return;
  if (dst.dtype != DType::bf16 || dst.ld < src.cols || dst.ld - src.cols >= 8)
    throw Error("convert_padded: expects a bf16 copy whose ld rounds cols up to a multiple of 8");
  launch("zero_tail", zero_tail_kernel, {ceil_div(src.rows, kBlock), kBlock, 0}, s,
         static_cast<std::uint16_t*>(dst.data), src.rows, src.cols, dst.ld);
}

void convert(Stream_t s, CAMat src, AMat dst) {
  if (src.rows <= 0 || src.cols <= 0) return;
  const int vec = vec_width(src.cols, {vec_view(src), vec_view(dst)});
  dispatch(
      "convert", vec,
      [&](auto width, auto a, auto b) {
        constexpr int V = decltype(width)::value;
        using A = decltype(a);
        using B = decltype(b);
        const RowSpan span = row_span(src.cols / V);
        launch("convert", convert_kernel<V, A, B>, {row_grid(src.rows, span), kBlock, 0}, s,
               typed<A>(src), typed<B>(AMat(dst.data, dst.dtype, src.rows, src.cols, dst.ld)),
               span);
      },
      src.dtype, dst.dtype);
}

}  // namespace parity::gpu
