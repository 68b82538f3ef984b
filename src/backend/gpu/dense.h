// The dense path's own kernels (everything that is not a matrix product): activation masks and
// bf16 conversions around the products, deterministic column sums (bias gradients), the
// elementwise parts of the DCNv2 cross layer, the dot interaction, the loss, fills, emulated
// fp16/bf16 rounding and the dense optimizers. Host entry points only; kernels in dense.cu.
//
// The math of each is Backend's (include/parity/backend.h) and the CPU reference's
// (src/backend/cpu): the tests compare them element by element. Every entry point enqueues on the
// given stream and returns; none synchronises the host. Views are parity's row-major [rows, cols]
// with a leading dimension (tensor.h), in device memory; shapes are checked by the caller
// (gpu_backend.cpp), these functions trust them.
//
// Determinism: no kernel here uses floating-point atomics. Reductions (column sums, the loss) are
// two passes with a fixed order that depends only on the shape.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/backend.h"
#include "parity/dtype.h"
#include "parity/tensor.h"

namespace parity::gpu::dense {

// p[i] = value.
void fill(Stream_t s, float* p, std::int64_t n, float value);
// p[i] = round_to_dtype(p[i], dtype) (dtype.h): f16 or bf16, nearest even; f32 is a no-op.
void round_to_dtype(Stream_t s, float* p, std::int64_t n, DType dtype);

// dz [rows, cols] packed = dy ⊙ (y > 0), the ReLU backward through the saved output. When dz16
// is not null it also gets dz as bf16 bits (packed), for bf16 products.
// y and dy are stored in fp32 or bf16 (each its own). When dbias is not null, dbias[c] = Σ_r dz(r, c) (double, a fixed
// order; folded into the pass where the width allows), with scratch holding
// gradient_sums_scratch_bytes(rows, cols) bytes; dz_bf16_only: the caller reads only dz16, so dz
// is not written where the sum is folded (dz must still be given).
void relu_backward(Stream_t s, CAMat y, CAMat dy, float* dz, std::uint16_t* dz16, float* dbias = nullptr,
                   void* scratch = nullptr, bool dz_bf16_only = false);
// dst [rows, cols] (leading dimension dst_ld, or packed: -1) = src as bf16 (nearest even).
void to_bf16(Stream_t s, CMat src, std::uint16_t* dst, std::int64_t dst_ld = -1);
// dst = src over [rows, cols] views, each fp32 or bf16 (copied, widened exactly, or rounded to
// nearest even).
void convert(Stream_t s, CAMat src, AMat dst);

// Bytes of scratch column_sum needs for a [rows, cols] input.
std::int64_t column_sum_scratch_bytes(std::int64_t rows, std::int64_t cols);
// out[c] = Σ_r m(r, c), summed in double in a fixed order, rounded once. scratch holds
// column_sum_scratch_bytes(rows, cols) bytes (8-byte aligned).
void column_sum(Stream_t s, CMat m, float* out, void* scratch);

// Cross layer, forward: x_next = x0 ⊙ z + xl. x0, z, xl and x_next share one storage type (fp32
// or bf16; the sum is formed in double and rounded once to fp32, then to bf16 where stored so).
void cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next);
// Cross layer, backward: dz [rows, cols] packed = g ⊙ x0 (and as bf16 bits into dz16 when not
// null); dx0 += g ⊙ z; when dbias is not null, dbias[c] = Σ_r dz(r, c) (in double, a fixed
// order, folded into the same pass where the width allows), with scratch holding
// cross_gradients_scratch_bytes(rows, cols) bytes.
// flags.overwrite: dx0 = g ⊙ z (dx0 not read); flags.add_g: dx0 gets g added as well;
// flags.dz_bf16_only: the caller reads only dz16 (bf16 products), so dz is not written where the
// bias sum is folded into the pass (cross_gradients_fold_sum); dz must still be given.
struct CrossGradientFlags {
  bool overwrite = false;
  bool add_g = false;
  bool dz_bf16_only = false;
};
// Bytes of scratch for the column sums of relu_backward and cross_gradients over [rows, cols].
std::int64_t gradient_sums_scratch_bytes(std::int64_t rows, std::int64_t cols);
// x0 and z share one storage type (fp32 or bf16), g and dx0 another; dz is fp32.
void cross_gradients(Stream_t s, CAMat g, CAMat x0, CAMat z, float* dz, std::uint16_t* dz16, AMat dx0,
                     float* dbias = nullptr, void* scratch = nullptr, CrossGradientFlags flags = {});

// Dot interaction (Backend::dot_interaction_forward / _backward); num_tables + 1 features of
// dense.cols each. Throws Error when one example's features do not fit in shared memory.
void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out);
void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense, Mat demb);

// Bytes of scratch bce_with_logits needs (independent of n).
std::int64_t bce_scratch_bytes();
// Mean BCE with logits into loss_out[0] (device), dlogits[i] = (sigmoid(z_i) - y_i) / n.
void bce_with_logits(Stream_t s, const float* logits, const float* labels, std::int64_t n, float* dlogits,
                     float* loss_out, void* scratch);
void sigmoid(Stream_t s, const float* logits, float* probs, std::int64_t n);
// y += x.
void add_inplace(Stream_t s, Mat y, CMat x);

// Backend::dense_optimizer_step (sgd, adagrad, adam) over a flat buffer, in double from the
// stored fp32 values and rounded once per stored value, as the CPU reference does.
void optimizer_step(Stream_t s, float* params, const float* grads, float* state, std::int64_t n,
                    const OptimizerParams& opt, std::int64_t step);

// d [m, n] (ldd) = beta · d (+ bias) (relu): a product with an empty inner dimension.
void gemm_empty_k(Stream_t s, std::int64_t m, std::int64_t n, float beta, float* d, std::int64_t ldd,
                  const float* bias, bool relu);
// The same for a bf16 output (bf16 bits, ldd; bias in bf16 bits): d = 0 (+ bias) (relu).
void gemm_empty_k_bf16(Stream_t s, std::int64_t m, std::int64_t n, std::uint16_t* d, std::int64_t ldd,
                       const std::uint16_t* bias, bool relu);
// d [m, n] (bf16 bits, ldd) = bf16(d + bias) (relu): the epilogue of a bf16-output product whose
// library plan could not fuse it.
void epilogue_bf16(Stream_t s, std::int64_t m, std::int64_t n, std::uint16_t* d, std::int64_t ldd,
                   const std::uint16_t* bias, bool relu);
// dst [n] = src as bf16 bits (nearest even): a bias for a bf16-output product.
void vector_to_bf16(Stream_t s, const float* src, std::uint16_t* dst, std::int64_t n);

}  // namespace parity::gpu::dense
