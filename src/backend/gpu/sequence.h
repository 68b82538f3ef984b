// The HSTU layer's ops on the GPU (Backend's "sequences" ops, include/parity/backend.h): layer
// norm, the norm-multiply, SiLU, residual add, row gather/scatter, unpooled lookups summed per
// token, and the jagged pointwise attention with its relative bias. Host entry points; kernels in
// sequence.cu. fp32 activations.
#pragma once

#include <cstdint>
#include <span>

#include "backend/gpu/port.h"
#include "parity/backend.h"
#include "parity/tensor.h"

namespace parity::gpu {

void layer_norm_forward(Stream_t s, CMat x, const float* gamma, const float* beta, float eps, Mat y,
                        float* mean, float* rstd);
// Bytes of scratch layer_norm_backward needs (the products dy ⊙ x̂ and the column sums').
std::int64_t layer_norm_scratch_bytes(std::int64_t rows, std::int64_t cols);
void layer_norm_backward(Stream_t s, CMat x, const float* gamma, const float* mean,
                         const float* rstd, CMat dy, Mat dx, float* dgamma, float* dbeta,
                         void* scratch);
void norm_mul_forward(Stream_t s, CMat x, CMat u, float eps, Mat y, float* mean, float* rstd);
void norm_mul_backward(Stream_t s, CMat x, CMat u, const float* mean, const float* rstd, CMat dy,
                       Mat dx, Mat du);
void silu_forward(Stream_t s, CMat x, Mat y);
void silu_backward(Stream_t s, CMat x, CMat dy, Mat dx);
void add_into(Stream_t s, CMat x, Mat y);
// Rows whose index is outside the matrix are skipped (the engine makes the indices).
void gather_rows(Stream_t s, CMat src, const std::int64_t* index, Mat dst);
// The same between element types (fp32, fp16, bf16; each element rounded to nearest even).
void gather_rows(Stream_t s, CAMat src, const std::int64_t* index, AMat dst);
void scale_rows(Stream_t s, const float* scale, float alpha, Mat x);
void scatter_add_rows(Stream_t s, CMat src, const std::int64_t* index, Mat dst);
// Every table of dim out.cols, in device memory (not host-placed); ids outside a table skipped.
void embedding_sum_forward(Stream_t s, std::span<const TableLayout> tables,
                           const TableWeights& weights, const SparseInput& in, Mat out,
                           void* scratch);
std::int64_t embedding_sum_scratch_bytes(std::size_t tables);

void hstu_attention_forward(Stream_t s, const SequenceBatch& seq, const HstuAttention& att, CMat q,
                            CMat k, CMat v, Mat out);
// Bytes of scratch hstu_attention_backward needs (the bias gradients' fixed-point sums).
std::int64_t attention_scratch_bytes(const HstuAttention& att);
void hstu_attention_backward(Stream_t s, const SequenceBatch& seq, const HstuAttention& att, CMat q,
                             CMat k, CMat v, CMat dout, Mat dq, Mat dk, Mat dv, float* dposition,
                             float* dtime, void* scratch);

}  // namespace parity::gpu
