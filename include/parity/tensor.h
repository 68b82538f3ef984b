// Views over contiguous row-major buffers. Tensors in parity are [rows, cols]
// matrices with a leading dimension (ld >= cols) so that a view can select a
// block of columns of a wider buffer (the embedding outputs are written straight
// into the interaction input, at a column offset). Views never own memory;
// backend buffers do (parity::Buffer in backend.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "parity/dtype.h"

namespace parity {

template <class T>
struct MatView {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;  // elements between the starts of consecutive rows

  MatView() = default;
  MatView(T* d, std::int64_t r, std::int64_t c) : data(d), rows(r), cols(c), ld(c) {}
  MatView(T* d, std::int64_t r, std::int64_t c, std::int64_t l)
      : data(d), rows(r), cols(c), ld(l) {}
  // A non-const view converts to a const one.
  template <class U>
  MatView(const MatView<U>& o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}  // NOLINT

  T& operator()(std::int64_t r, std::int64_t c) const { return data[r * ld + c]; }
  T* row(std::int64_t r) const { return data + r * ld; }
  bool empty() const { return data == nullptr; }
  // Columns [c0, c0+n) of every row.
  MatView cols_slice(std::int64_t c0, std::int64_t n) const { return {data + c0, rows, n, ld}; }
  // Rows [r0, r0+n).
  MatView rows_slice(std::int64_t r0, std::int64_t n) const {
    return {data + r0 * ld, n, cols, ld};
  }
};

using Mat = MatView<float>;         // writable
using CMat = MatView<const float>;  // read-only

// A view whose element type is known at run time: activations are stored in fp32, or in bf16 under
// bf16 dense math on a GPU (Backend::activation_dtype). Element (r, c) is at byte
// (r * ld + c) * dtype_size(dtype) from data. An fp32 MatView converts to one implicitly, so ops
// that take activations accept plain float views as they always did.
template <class V>  // void (writable) or const void
struct TypedView {
  V* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;

  TypedView() = default;
  TypedView(V* d, DType t, std::int64_t r, std::int64_t c, std::int64_t l)
      : data(d), dtype(t), rows(r), cols(c), ld(l) {}
  TypedView(V* d, DType t, std::int64_t r, std::int64_t c) : TypedView(d, t, r, c, c) {}
  // Implicit on purpose (an fp32 view, or a writable one, is accepted where a TypedView is
  // taken). clang-format 14 misreads requires-clauses, hence the guard.
  // clang-format off
  template <class T>
    requires std::is_convertible_v<T*, V*> && std::is_same_v<std::remove_const_t<T>, float>
  TypedView(const MatView<T>& m)  // NOLINT(google-explicit-constructor)
      : data(m.data), dtype(DType::f32), rows(m.rows), cols(m.cols), ld(m.ld) {}
  template <class U>
    requires std::is_convertible_v<U*, V*>
  TypedView(const TypedView<U>& o)  // NOLINT(google-explicit-constructor)
      : data(o.data), dtype(o.dtype), rows(o.rows), cols(o.cols), ld(o.ld) {}
  // clang-format on

  bool empty() const { return data == nullptr; }
  bool is_f32() const { return dtype == DType::f32; }
  std::size_t element_bytes() const { return dtype_size(dtype); }
  // The fp32 view of an fp32 TypedView (callers check is_f32 first).
  MatView<std::conditional_t<std::is_const_v<V>, const float, float>> f32() const {
    return {static_cast<std::conditional_t<std::is_const_v<V>, const float, float>*>(data), rows,
            cols, ld};
  }
  // Columns [c0, c0+n) of every row.
  TypedView cols_slice(std::int64_t c0, std::int64_t n) const {
    return {offset(c0), dtype, rows, n, ld};
  }
  // Rows [r0, r0+n).
  TypedView rows_slice(std::int64_t r0, std::int64_t n) const {
    return {offset(r0 * ld), dtype, n, cols, ld};
  }

 private:
  V* offset(std::int64_t elements) const {
    using Byte = std::conditional_t<std::is_const_v<V>, const std::byte, std::byte>;
    return static_cast<V*>(static_cast<Byte*>(data) +
                           elements * static_cast<std::int64_t>(dtype_size(dtype)));
  }
};

using AMat = TypedView<void>;         // writable, fp32 or bf16
using CAMat = TypedView<const void>;  // read-only, fp32 or bf16

}  // namespace parity
