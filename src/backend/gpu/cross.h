// The elementwise parts of the DCNv2 cross layer (the products are blas.h's): the forward's
// x0 ⊙ z + xl, and the backward's gradient pass with the bias gradient's column sums folded in.
// Host entry points; kernels in cross.cu. The math is Backend::cross_forward / cross_backward's
// (include/parity/backend.h) and the CPU reference's (src/backend/cpu/cpu_interaction.cpp).
#pragma once

#include "backend/gpu/numerics.h"
#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// x_next = x0 ⊙ z + xl. x0, z, xl and x_next share one storage type (fp32 or bf16); the sum is
// formed in double and rounded once to fp32, then to bf16 where stored so.
void cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next);

// How cross_gradients treats dx0 and dz:
//   overwrite:    dx0 = g ⊙ z (dx0 not read);
//   add_g:        dx0 gets g added as well;
//   dz_bf16_only: the caller reads only dz16 (bf16 products), so dz is not written where the
//                 bias sum is folded into the pass (dz must still be given).
struct CrossGradientFlags {
  bool overwrite = false;
  bool add_g = false;
  bool dz_bf16_only = false;
};

// dz [rows, cols] packed = g ⊙ x0 (and in bf16 into dz16 when not null); dx0 += g ⊙ z; when
// dbias is not null, dbias[c] = Σ_r dz(r, c) (in double, a fixed order, folded into the same pass
// below 2^30 rows and columns), with scratch holding gradient_sums_scratch_bytes(rows, cols) bytes
// (column_sum.h). x0 and z share one storage type (fp32 or bf16), g and dx0 another; dz is fp32.
void cross_gradients(Stream_t s, CAMat g, CAMat x0, CAMat z, float* dz, Bf16* dz16, AMat dx0,
                     float* dbias = nullptr, void* scratch = nullptr,
                     CrossGradientFlags flags = {});

}  // namespace parity::gpu
