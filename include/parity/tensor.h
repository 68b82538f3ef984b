// Views over contiguous row-major buffers. Tensors in parity are [rows, cols]
// matrices with a leading dimension (ld >= cols) so that a view can select a
// block of columns of a wider buffer (the embedding outputs are written straight
// into the interaction input, at a column offset). Views never own memory;
// backend buffers do (parity::Buffer in backend.h).
#pragma once

#include <cstdint>

namespace parity {

template <class T>
struct MatView {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;  // elements between the starts of consecutive rows

  MatView() = default;
  MatView(T* d, std::int64_t r, std::int64_t c) : data(d), rows(r), cols(c), ld(c) {}
  MatView(T* d, std::int64_t r, std::int64_t c, std::int64_t l) : data(d), rows(r), cols(c), ld(l) {}
  // A non-const view converts to a const one.
  template <class U>
  MatView(const MatView<U>& o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}  // NOLINT

  T& operator()(std::int64_t r, std::int64_t c) const { return data[r * ld + c]; }
  T* row(std::int64_t r) const { return data + r * ld; }
  bool empty() const { return data == nullptr; }
  // Columns [c0, c0+n) of every row.
  MatView cols_slice(std::int64_t c0, std::int64_t n) const { return {data + c0, rows, n, ld}; }
  // Rows [r0, r0+n).
  MatView rows_slice(std::int64_t r0, std::int64_t n) const { return {data + r0 * ld, n, cols, ld}; }
};

using Mat = MatView<float>;        // writable
using CMat = MatView<const float>;  // read-only

}  // namespace parity
