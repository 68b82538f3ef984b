// Helpers shared by the CPU ops: shape checks that throw parity::Error naming the op, reusable
// per-thread double scratch, and the sizes below which a loop stays on the calling thread.
//
// Why it is built this way: every op checks its views the same way and says the same thing
// ("linear_forward: x has 7 columns, w has 8"), so the messages are written once here. Checks
// cost a few comparisons per call, never a pass over the data (the sparse-input check in
// cpu_embedding.cpp is the one exception, and it is linear in the ids).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "parity/error.h"
#include "parity/tensor.h"

namespace parity::cpu::detail {

// Elementwise loops smaller than this run on the calling thread (fork/join costs more).
inline constexpr std::int64_t kParallelElements = std::int64_t{1} << 14;

template <class... Args>
[[noreturn]] void fail(const char* op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(std::string(op) + ": " + fmt::format(format, std::forward<Args>(args)...));
}

// A view is well formed: non-negative shape, ld >= cols, data present when it has elements.
template <class T>
void check_view(const char* op, const char* name, MatView<T> m) {
  if (m.rows < 0 || m.cols < 0) fail(op, "{} has a negative shape [{}, {}]", name, m.rows, m.cols);
  if (m.ld < m.cols) fail(op, "{} has ld {} smaller than its {} columns", name, m.ld, m.cols);
  if (m.data == nullptr && m.rows > 0 && m.cols > 0) fail(op, "{} is null", name);
}

// The view is [rows, cols] and well formed.
template <class T>
void check_shape(const char* op, const char* name, MatView<T> m, std::int64_t rows,
                 std::int64_t cols) {
  check_view(op, name, m);
  if (m.rows != rows || m.cols != cols) {
    fail(op, "{} is [{}, {}], expected [{}, {}]", name, m.rows, m.cols, rows, cols);
  }
}

// Per-thread double scratch buffers, one per purpose. An op asks for a slot, uses it, and does
// not ask for the same slot again while it still needs the first buffer.
enum class Slot : int { pack_a, pack_b, result, gradient, second_gradient, terms, count };

// At least n doubles of this thread's buffer for slot, contents unspecified. The buffers only grow
// and are reused across calls: ops run thousands of times per training run on the same shapes,
// and a fresh large allocation would pay its page faults every time.
inline double* scratch(Slot slot, std::int64_t n) {
  thread_local std::vector<double> buffers[static_cast<int>(Slot::count)];
  std::vector<double>& b = buffers[static_cast<int>(slot)];
  const auto size = static_cast<std::size_t>(n > 0 ? n : 1);
  if (b.size() < size) b.resize(size);
  return b.data();
}

// dst = (T) acc, row by row; acc [rows, cols] with leading dimension ld_acc.
template <class T>
void store(const double* acc, std::int64_t ld_acc, MatView<T> dst) {
#pragma omp parallel for schedule(static) if (dst.rows * dst.cols >= kParallelElements)
  for (std::int64_t r = 0; r < dst.rows; ++r) {
    const double* a = acc + r * ld_acc;
    T* d = dst.row(r);
    for (std::int64_t c = 0; c < dst.cols; ++c) d[c] = static_cast<T>(a[c]);
  }
}

// out[c] = (T) Σ_r g[r * cols + c], summed in double over rows in order (a bias gradient): the
// same order on every run and every thread count.
template <class T>
void column_sums(const double* g, std::int64_t rows, std::int64_t cols, T* out) {
  double* sum = scratch(Slot::terms, cols);  // [cols]
  std::fill(sum, sum + cols, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* gr = g + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) sum[c] += gr[c];
  }
  for (std::int64_t c = 0; c < cols; ++c) out[c] = static_cast<T>(sum[c]);
}

}  // namespace parity::cpu::detail
