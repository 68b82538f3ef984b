// What the elementwise kernels of the dense path share: the row walk over [rows, cols] views, the
// choice of vector width, and the one dispatch from run-time storage types and widths to kernel
// instantiations. Included by .cu files only.
//
// Why it is built this way:
// - Kernels walk rows, not a flat index: a flat index would need a 64-bit division per element to
//   find (row, column), which costs more than the memory traffic on a [65536, 3456] activation. A
//   row is taken by `tpr` consecutive threads (a power of two up to the block), so loads are
//   coalesced; a block holds kBlock / tpr rows at a time. Each output depends only on its own
//   inputs, so the grid shape never changes a result.
// - Each thread moves groups of V elements (numerics.h's load_vec/store_vec_rn): V = 8 (16 bytes
//   of bf16, two 16-byte accesses of fp32), 4 or 1, the widest every view of the call allows
//   (vec_width, checked on the host).
// - Activations are stored in fp32 or bf16 (Backend::activation_dtype); `dispatch` turns the
//   run-time storage types of a call's views and its width into one instantiation, so an op
//   names its kernel once instead of writing out the nested cases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "backend/gpu/runtime.h"
#include "parity/dtype.h"
#include "parity/tensor.h"

namespace parity::gpu::elementwise {

inline constexpr int kBlock = 256;
inline constexpr std::int64_t kMaxGrid = std::int64_t{1} << 20;

// Blocks of a grid-stride loop over n elements.
inline std::int64_t grid_for(std::int64_t n) {
  return std::max<std::int64_t>(1, std::min(ceil_div(n, kBlock), kMaxGrid));
}

__device__ __forceinline__ std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// ------------------------------------------------------------- row walk --

struct RowSpan {
  int tpr = kBlock;  // threads per row
  int rpb = 1;       // rows per block step
};
// The span for rows of `groups` vector groups.
inline RowSpan row_span(std::int64_t groups) {
  RowSpan r;
  int t = 1;
  while (t < kBlock && t < groups) t *= 2;
  r.tpr = t;
  r.rpb = kBlock / t;
  return r;
}
inline std::int64_t row_grid(std::int64_t rows, RowSpan span) {
  return std::max<std::int64_t>(1, std::min(ceil_div(rows, span.rpb), kMaxGrid));
}

// Calls f(r, c) for every group of V consecutive elements of a row (c = the group's first column,
// cols a multiple of V), each thread a fixed set of groups.
template <int V, class F>
__device__ __forceinline__ void for_each_group(std::int64_t rows, std::int64_t cols, RowSpan span,
                                               F&& f) {
  const int sub = static_cast<int>(threadIdx.x) / span.tpr;  // once per thread, small ints
  const int c0 = static_cast<int>(threadIdx.x) - sub * span.tpr;
  const std::int64_t groups = cols / V;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * span.rpb;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * span.rpb + sub; r < rows;
       r += step) {
#pragma unroll 4
    for (std::int64_t g = c0; g < groups; g += span.tpr) f(r, g * V);
  }
}

// ----------------------------------------------------------- vector width --

// One view of a call as the width test sees it: base, leading dimension, element bytes.
struct VecView {
  const void* p;
  std::int64_t ld;
  std::int64_t bytes = 4;
};
inline VecView vec_view(CAMat m) {
  return {m.data, m.ld, static_cast<std::int64_t>(m.element_bytes())};
}
// A packed [rows, cols] buffer of `bytes`-byte elements (p may be null: not part of the call).
inline VecView packed(const void* p, std::int64_t cols, std::int64_t bytes = 4) {
  return {p, cols, bytes};
}

// The widest group every view can be read in: 8, 4 or 1. A width w needs cols and every ld
// multiples of w and every base aligned to min(w elements, 16 bytes).
inline bool width_ok(int w, std::int64_t cols, std::initializer_list<VecView> views) {
  if (cols % w != 0) return false;
  for (const VecView& v : views) {
    if (v.p == nullptr) continue;
    const auto align = static_cast<std::uintptr_t>(std::min<std::int64_t>(w * v.bytes, 16));
    if (reinterpret_cast<std::uintptr_t>(v.p) % align != 0 || v.ld % w != 0) return false;
  }
  return true;
}
inline int vec_width(std::int64_t cols, std::initializer_list<VecView> views) {
  return width_ok(8, cols, views) ? 8 : width_ok(4, cols, views) ? 4 : 1;
}

// ---------------------------------------------------------------- dispatch --

// A device view of a view stored as S (float or Bf16).
template <class S>
MatView<const S> typed(CAMat m) {
  return {static_cast<const S*>(m.data), m.rows, m.cols, m.ld};
}
template <class S>
MatView<S> typed(AMat m) {
  return {static_cast<S*>(m.data), m.rows, m.cols, m.ld};
}

namespace detail {
template <class F>
void with_storages(const char*, F&& f) {
  f();
}
template <class F, class... Rest>
void with_storages(const char* op, F&& f, DType t, Rest... rest) {
  auto next = [&](auto tag) {
    with_storages(
        op, [&](auto... tags) { f(tag, tags...); }, rest...);
  };
  if (t == DType::bf16) {
    next(Bf16{});
  } else if (t == DType::f32) {
    next(float{});
  } else {
    throw Error(cat(op, ": a view stored as ", dtype_name(t), "; fp32 or bf16 expected"));
  }
}
}  // namespace detail

// f(std::integral_constant<int, V>{}, S...{}) with V the width (8, 4 or 1) and one element type
// S (float or Bf16) per storage type given, in order. Throws Error naming op for other types.
template <class F, class... Types>
void dispatch(const char* op, int width, F&& f, Types... storage) {
  auto with = [&](auto v) {
    detail::with_storages(
        op, [&](auto... tags) { f(v, tags...); }, storage...);
  };
  if (width == 8) {
    with(std::integral_constant<int, 8>{});
  } else if (width == 4) {
    with(std::integral_constant<int, 4>{});
  } else {
    with(std::integral_constant<int, 1>{});
  }
}

}  // namespace parity::gpu::elementwise
