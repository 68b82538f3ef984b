// Conversions between the storage types of the dense path (fp32 and bf16): the bf16 copies of
// fp32 product operands, a bf16 bias, widening a bf16 gradient. Host entry point; kernel in
// convert.cu.
#pragma once

#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// dst = src over [rows, cols] views (each fp32 or bf16, with its own leading dimension): copied,
// widened exactly, or rounded to nearest even. dst takes src's shape.
void convert(Stream_t s, CAMat src, AMat dst);

// The bf16 copy of an fp32 operand for the matrix products: dst [rows, cols] with dst.ld >= cols
// gets src rounded to nearest even, and its columns [cols, ld) zeros, so that a product may run
// over ld columns where cols is not a multiple of 8 (the library's fast kernels want it).
void convert_padded(Stream_t s, CMat src, AMat dst);

}  // namespace parity::gpu
