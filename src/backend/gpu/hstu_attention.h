// The jagged HSTU attention on tensor cores: bf16 operands, fp32 accumulation, the n x n score
// matrix never stored (Backend::hstu_attention_forward/backward give the math). Host entry points;
// kernels in hstu_attention.cu. sequence.h keeps the scalar fp32 kernels, the exact path.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/backend.h"
#include "parity/tensor.h"

namespace parity::gpu {

// Why the tensor-core kernels cannot run this attention on this build and device, or empty when
// they can: NVIDIA sm_80 or later, attention_dim == value_dim in {16, 32, 64, 128}, and the bias
// tables within shared memory.
std::string tensor_core_attention_refusal(const HstuAttention& att);

// q, k, v (and dout) bf16 views whose rows start on 16 bytes; out, dq, dk, dv fp32 or bf16. The
// backward's scratch is attention_scratch_bytes(att) long (sequence.h: the same fixed-point sums).
void hstu_attention_forward_tc(Stream_t s, const SequenceBatch& seq, const HstuAttention& att,
                               CAMat q, CAMat k, CAMat v, AMat out);
void hstu_attention_backward_tc(Stream_t s, const SequenceBatch& seq, const HstuAttention& att,
                                CAMat q, CAMat k, CAMat v, CAMat dout, AMat dq, AMat dk, AMat dv,
                                float* dposition, float* dtime, void* scratch);

}  // namespace parity::gpu
