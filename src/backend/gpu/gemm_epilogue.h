// The epilogue of a matrix product as a kernel of its own: for a product with an empty inner
// dimension (k = 0), and for a product whose bias or ReLU the library could not fuse (blas.cpp).
// Host entry point; kernel in gemm_epilogue.cu.
#pragma once

#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// d [m, n] (fp32 or bf16, with its ld) = beta · d (+ bias[col]) (then max(·, 0) when relu),
// formed in fp32 and rounded once to d's type. bias (may be null) is of d's type; d is not read
// when beta is 0.
void gemm_epilogue(Stream_t s, AMat d, float beta, const void* bias, bool relu);

}  // namespace parity::gpu
