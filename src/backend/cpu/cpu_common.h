// Helpers shared by the CPU ops: the shape checks (backend/checks.h, shared with the GPU backend so
// that both say the same thing), reusable per-thread double scratch, and the sizes below which a
// loop stays on the calling thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "backend/checks.h"
#include "parity/error.h"
#include "parity/tensor.h"

namespace parity::cpu::detail {

// Elementwise loops smaller than this run on the calling thread (fork/join costs more).
inline constexpr std::int64_t kParallelElements = std::int64_t{1} << 14;

using backend_checks::check_shape;  // shared with the GPU backend (backend/checks.h)
using backend_checks::check_view;
using backend_checks::fail;

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

// σ(z) without overflow for any z.
inline double stable_sigmoid(double z) {
  if (z >= 0.0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
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
