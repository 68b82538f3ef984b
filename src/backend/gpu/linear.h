// The elementwise part of a linear layer's backward (the products are blas.h's): the ReLU mask
// through the saved output, with the bias gradient's column sums folded into the same pass.
// Host entry point; kernels in linear.cu. The math is Backend::linear_backward's
// (include/parity/backend.h) and the CPU reference's (src/backend/cpu/cpu_linear.cpp).
#pragma once

#include "backend/gpu/numerics.h"
#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// dz [rows, cols] packed = dy ⊙ (y > 0), the ReLU backward through the saved output y; when dz16
// is not null it also gets dz in bf16 (packed), for bf16 products. y and dy are stored in fp32 or
// bf16 (each its own). When dbias is not null, dbias[c] = Σ_r dz(r, c) (in double, a fixed
// order; folded into the pass below 2^30 rows and columns), with scratch holding
// gradient_sums_scratch_bytes(rows, cols) bytes (column_sum.h). dz_bf16_only: the caller reads
// only dz16, so dz is not written where the sum is folded (dz must still be given: the unfolded
// sum reads it).
void relu_backward(Stream_t s, CAMat y, CAMat dy, float* dz, Bf16* dz16, float* dbias = nullptr,
                   void* scratch = nullptr, bool dz_bf16_only = false);

}  // namespace parity::gpu
