// The math of every Backend op (include/parity/backend.h), as function templates over the scalar
// type T of the tensors.
//
// Why it is built this way: this is the oracle every GPU kernel is judged against, so it is
// written to be trusted rather than clever.
// - One source, two instantiations: T = float is what CpuBackend runs; T = double is used by the
//   tests to check the float path and to take finite differences.
// - Every sum and dot product accumulates in double and is stored to T once, so the float path
//   differs from exact arithmetic by about one rounding per stored value.
// - Threads (OpenMP) split only independent outputs and every sum has a fixed order, so results
//   are bit-identical whatever the thread count.
// - Embedding backward combines duplicate ids by a stable sort of the (table, row) keys and sums
//   each segment in occurrence order; the gradient is exposed on its own (embedding_gradient) so
//   tests can check it directly, and the fused update uses the same code.
// - Shapes and sparse inputs are validated here, so both instantiations throw the same
//   parity::Error, naming the op.
//
// Instantiated for float and double in cpu_linear.cpp, cpu_embedding.cpp, cpu_interaction.cpp,
// cpu_elementwise.cpp and cpu_sequence.cpp (one file per family of ops). Outputs must not overlap
// inputs unless a comment says so.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "parity/backend.h"
#include "parity/tensor.h"

namespace parity::cpu {

// ------------------------------------------------------------------ memory --

template <class T>
void fill(T* p, std::int64_t n, T value);
// p[i] = lo + (hi - lo) * rng::uniform01(rng::key(seed, stream), i), evaluated as that C++
// expression (hi - lo in T, the rest in double) and rounded to T once.
template <class T>
void fill_uniform(T* p, std::int64_t n, T lo, T hi, std::uint64_t seed, std::uint64_t stream);

// ------------------------------------------------------------ dense layers --

// y = act(x · wᵀ + bias). x [B, in], w [out, in], bias [out] or null, y [B, out].
template <class T>
void linear_forward(MatView<const T> x, MatView<const T> w, const T* bias, Activation act,
                    MatView<T> y);

// dz = dy ⊙ act'(y); dw = dzᵀ · x [out, in]; dbias = Σ_rows dz [out] (when not null);
// dx = dz · w [B, in] (when dx.data is not null).
template <class T>
void linear_backward(MatView<const T> x, MatView<const T> w, MatView<const T> y,
                     MatView<const T> dy, Activation act, MatView<T> dx, MatView<T> dw, T* dbias);

// -------------------------------------------------------------- embeddings --

// Throws parity::Error naming op, the table, the bag and the id when the CSR input is malformed
// (offsets not starting at 0 or decreasing, ids outside [0, rows) of their table) or when the
// tables do not match it. out_cols: columns of the pooled output the tables must fit in.
void validate_sparse_input(const char* op, std::span<const TableLayout> tables,
                           const SparseInput& in, std::int64_t out_rows, std::int64_t out_cols);

// out(b, out_col_t + d) = pool over bag (t, b) of w_t[weight_offset_t + id * dim_t + d], w_t the
// buffer of table t's storage type (fp32 tables: weights.f32 holds T; fp16/bf16: 16-bit patterns).
// out [B, >= Σ dims], may be a column block of a wider buffer.
template <class T>
void embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                       const SparseInput& in, MatView<T> out);

// The gradient of every embedding row that occurs in the batch: one entry per distinct
// (table, row), in ascending (table, row) order. The gradient of row r of table t is the sum,
// over the occurrences of r in the batch in CSR order, of dout(b, out_col_t + ·) (divided by the
// bag size for mean pooling), in double. No weight decay.
struct EmbeddingGradient {
  std::vector<int> table;            // [U]
  std::vector<std::int64_t> row;     // [U]
  std::vector<std::int64_t> offset;  // [U + 1]: entry u is grad[offset[u] .. offset[u + 1])
  std::vector<double> grad;          // [Σ_u dim of table[u]]
};
template <class T>
EmbeddingGradient embedding_gradient(std::span<const TableLayout> tables, const SparseInput& in,
                                     MatView<const T> dout);

// The gradient above, then one optimizer step per distinct row (sgd, adagrad, rowwise_adagrad;
// see Backend::embedding_backward_update). Rows that do not occur, and their state, are left
// untouched. g += weight_decay * w (L2) before the step. state may be null for sgd. The update is
// in double; an fp16/bf16 row is then rounded to fp32 and stochastically to its type, with the
// bits the GPU kernels use (Backend::embedding_backward_update).
template <class T>
void embedding_backward_update(std::span<const TableLayout> tables, const TableWeights& weights,
                               T* state, const SparseInput& in, MatView<const T> dout,
                               const OptimizerParams& opt, const StochasticRounding& rounding);

// Host-placed tables' caches (Backend::embedding_cache_observe and embedding_cache_copy).
void embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                             std::span<std::uint32_t* const> counts, std::uint64_t* stats);
void embedding_cache_copy(const TableLayout& table, const TableWeights& weights, float* state,
                          OptimizerKind opt, bool to_cache);

// ------------------------------------------------------------ interactions --

// out = [dense | <z_i, z_j> for i = 1..F-1, j = 0..i-1], z_0 = dense [B, D],
// z_k = emb columns [(k-1)D, kD); out [B, D + F(F-1)/2], F = num_tables + 1.
template <class T>
void dot_interaction_forward(MatView<const T> dense, MatView<const T> emb, int num_tables,
                             MatView<T> out);
// ddense [B, D] and demb [B, T*D] are overwritten.
template <class T>
void dot_interaction_backward(MatView<const T> dense, MatView<const T> emb, int num_tables,
                              MatView<const T> dout, MatView<T> ddense, MatView<T> demb);

// u = xl · vᵀ [B, r]; z = u · wᵀ + bias [B, N]; x_next = x0 ⊙ z + xl [B, N].
// z is computed from the stored (rounded) u, as the backward sees it. storage (fp32 or bf16) is the
// type the caller stores u and z in: each is rounded to it before it is read again (the second
// product reads u, the combine reads z), as on a GPU that writes them to memory in between.
template <class T>
void cross_forward(MatView<const T> x0, MatView<const T> xl, MatView<const T> v, MatView<const T> w,
                   const T* bias, MatView<T> u, MatView<T> z, MatView<T> x_next,
                   DType storage = DType::f32);
// With g = dx_next: dz = g ⊙ x0; dx0 += g ⊙ z (accumulates); dw = dzᵀ · u; dbias = Σ dz;
// du = dz · w; dv = duᵀ · xl; dxl = g + du · v (overwritten). du_scratch [B, r] receives du.
// dxl may be the same view as dx_next (g is read element by element before dxl is written).
// first_into_dx0: dx0 = g ⊙ z (not accumulated); xl_is_x0: dx0 += g ⊙ z + g + du · v and dxl is
// not written (Backend::CrossBackwardMode).
template <class T>
void cross_backward(MatView<const T> x0, MatView<const T> xl, MatView<const T> v,
                    MatView<const T> w, MatView<const T> u, MatView<const T> z,
                    MatView<const T> dx_next, MatView<T> dx0, MatView<T> dxl, MatView<T> dv,
                    MatView<T> dw, T* dbias, MatView<T> du_scratch, bool first_into_dx0 = false,
                    bool xl_is_x0 = false);

// ------------------------------------------------------ sequences (HSTU) --

// out(b, d) = Σ_t pool over bag (t, b) of w_t[id, d], every table of dim out.cols, summed in
// double in table then CSR order and stored once (Backend::embedding_sum_forward).
template <class T>
void embedding_sum_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                           const SparseInput& in, MatView<T> out);

// Throws InputError naming the sequence when the offsets do not start at 0, decrease, do not
// end at seq.tokens, a non-empty sequence is shorter than seq.targets or longer than
// seq.max_len, or its timestamps decrease (SequenceBatch).
void validate_sequences(const char* op, const SequenceBatch& seq);

// Layer norm, row by row, in double (Backend::layer_norm_forward and layer_norm_backward);
// mean and rstd are stored to T and the backward reads them as stored.
template <class T>
void layer_norm_forward(MatView<const T> x, const T* gamma, const T* beta, double eps, MatView<T> y,
                        T* mean, T* rstd);
template <class T>
void layer_norm_backward(MatView<const T> x, const T* gamma, const T* mean, const T* rstd,
                         MatView<const T> dy, MatView<T> dx, T* dgamma, T* dbeta);
// y = x̂ ⊙ u and its backward (Backend::norm_mul_forward and norm_mul_backward).
template <class T>
void norm_mul_forward(MatView<const T> x, MatView<const T> u, double eps, MatView<T> y, T* mean,
                      T* rstd);
template <class T>
void norm_mul_backward(MatView<const T> x, MatView<const T> u, const T* mean, const T* rstd,
                       MatView<const T> dy, MatView<T> dx, MatView<T> du);

// y = x σ(x); dx = dy σ(x) (1 + x (1 - σ(x))). In place allowed (y = x, dx = dy).
template <class T>
void silu_forward(MatView<const T> x, MatView<T> y);
template <class T>
void silu_backward(MatView<const T> x, MatView<const T> dy, MatView<T> dx);
// y += x.
template <class T>
void add_into(MatView<const T> x, MatView<T> y);
// dst(i, ·) = src(index[i], ·); and dst(index[i], ·) += src(i, ·) with distinct indices (checked).
template <class T>
void gather_rows(MatView<const T> src, const std::int64_t* index, MatView<T> dst);
template <class T>
void scatter_add_rows(MatView<const T> src, const std::int64_t* index, MatView<T> dst);

// HSTU attention (Backend::hstu_attention_forward and hstu_attention_backward) with the
// relative-bias tables position [heads, position_buckets] and time [heads, time_buckets] given as
// T (att's own pointers are not read). One thread per (sequence, head); every sum in double in
// ascending token order, so results do not depend on the thread count.
template <class T>
void hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, const T* position,
                            const T* time, MatView<const T> q, MatView<const T> k,
                            MatView<const T> v, MatView<T> out);
template <class T>
void hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att, const T* position,
                             const T* time, MatView<const T> q, MatView<const T> k,
                             MatView<const T> v, MatView<const T> dout, MatView<T> dq,
                             MatView<T> dk, MatView<T> dv, T* dposition, T* dtime);

// ------------------------------------------------------------ loss, heads --

// loss_out[0] = mean(softplus(z) - y z); dlogits[i] = (sigmoid(z_i) - y_i) / n. n > 0.
template <class T>
void bce_with_logits(const T* logits, const T* labels, std::int64_t n, T* dlogits, T* loss_out);
template <class T>
void sigmoid(const T* logits, T* probs, std::int64_t n);

// -------------------------------------------------------- dense optimizer --

// One step of sgd, adagrad or adam over a flat buffer (see Backend::dense_optimizer_step).
template <class T>
void dense_optimizer_step(T* params, const T* grads, T* state, std::int64_t n,
                          const OptimizerParams& opt, std::int64_t step);

}  // namespace parity::cpu
