// Shape checks shared by every backend, so that each op says the same thing on the CPU and on a
// GPU ("linear_forward: x has 7 columns, w has 8"). Plain host C++ (no OpenMP, no vendor names):
// the CPU ops and the GPU backend's host code include it alike. Each check costs a few
// comparisons, never a pass over the data.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "parity/error.h"

namespace parity::backend_checks {

// Throws parity::Error "op: message".
template <class... Args>
[[noreturn]] void fail(const char* op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(std::string(op) + ": " + fmt::format(format, std::forward<Args>(args)...));
}

// A view (MatView or TypedView) is well formed: non-negative shape, ld >= cols, data present
// when it has elements.
template <class View>
void check_view(const char* op, const char* name, const View& m) {
  if (m.rows < 0 || m.cols < 0) fail(op, "{} has a negative shape [{}, {}]", name, m.rows, m.cols);
  if (m.ld < m.cols) fail(op, "{} has ld {} smaller than its {} columns", name, m.ld, m.cols);
  if (m.data == nullptr && m.rows > 0 && m.cols > 0) fail(op, "{} is null", name);
}

// The view is [rows, cols] and well formed.
template <class View>
void check_shape(const char* op, const char* name, const View& m, std::int64_t rows, std::int64_t cols) {
  check_view(op, name, m);
  if (m.rows != rows || m.cols != cols) fail(op, "{} is [{}, {}], expected [{}, {}]", name, m.rows, m.cols, rows, cols);
}

}  // namespace parity::backend_checks
