// Deterministic column sums over [rows, cols] views: the bias gradients of the dense layers.
// Host entry points; kernels in column_sum.cu, the pieces that fold the sums into another
// elementwise pass in column_sum.cuh.
//
// Determinism: no floating-point atomics. A first pass writes one double partial per (chunk,
// column), or per row lane where the sum is folded into another pass; a second pass adds the
// partials in index order. The split depends only on the shape, so the same inputs give the same
// bits on every run.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// Bytes of scratch column_sum needs for a [rows, cols] input.
std::int64_t column_sum_scratch_bytes(std::int64_t rows, std::int64_t cols);
// out[c] = Σ_r m(r, c), summed in double in a fixed order, rounded once. scratch holds
// column_sum_scratch_bytes(rows, cols) bytes (8-byte aligned).
void column_sum(Stream_t s, CMat m, float* out, void* scratch);

// Bytes of scratch for the column sums of a pass over [rows, cols] that folds them in
// (relu_backward, cross_gradients), or falls back to column_sum.
std::int64_t gradient_sums_scratch_bytes(std::int64_t rows, std::int64_t cols);

}  // namespace parity::gpu
