// The backend interface: whole-batch ops that the engine composes into a
// training step. The CPU backend (src/backend/cpu) is the reference and the
// oracle for every GPU kernel; GPU backends implement the same set, so the same
// engine code and the same engine tests run on both.
//
// Conventions for every op:
// - matrices are row-major [rows, cols] views (tensor.h); pointers are in the
//   backend's memory space (host for cpu, device for gpu);
// - outputs are overwritten unless the comment says "accumulates";
// - ops are stream-ordered on the backend and do not synchronise the host,
//   except the copy_to_host family;
// - shapes are checked (throwing parity::Error that names the op) where it is cheap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "parity/dtype.h"
#include "parity/memory_pattern.h"
#include "parity/select.h"
#include "parity/spec.h"
#include "parity/tensor.h"

namespace parity {

enum class Activation : std::uint8_t { none, relu };

// ------------------------------------------------------------- embeddings --

// Where one table lives inside its group's buffers.
struct TableLayout {
  std::int64_t rows = 0;
  int dim = 0;
  Pooling pooling = Pooling::sum;
  // Elements into the weight buffer of the table's storage type (TableWeights); row r is at
  // weight_offset + r*dim.
  std::int64_t weight_offset = 0;
  std::int64_t state_offset = 0;  // elements into the (fp32) optimizer-state buffer:
                                  //   adagrad: rows*dim floats, row r at state_offset + r*dim
                                  //   rowwise_adagrad: rows floats, row r at state_offset + r
                                  //   sgd: unused
  std::int64_t out_col = 0;       // first column of this table's pooled output, relative to
                                  // the output view
  DType dtype = DType::f32;       // storage type of the weights: f32, f16 or bf16
  // About how many ids a bag holds (the model's pooling size; 0: unknown). A hint for how the
  // kernels share work, never a bound: any bag may hold any number.
  double ids_per_bag = 0;
  // Stochastic rounding (StochasticRounding) keys element (r, c) of this table as element
  // (r + round_row, c + round_col) of table round_table: a piece of a larger table (a shard)
  // then rounds as the whole table does. round_table < 0: the table's own index in the call.
  std::int64_t round_table = -1;
  std::int64_t round_row = 0;
  std::int64_t round_col = 0;

  // Host placement. A table whose `host.weights` is set keeps all its rows in host memory that
  // the backend's kernels reach directly (Backend::allocate_host_resident), and the buffers at
  // weight_offset and state_offset hold `host.cache_rows` of them instead: its cache. Row r is
  // read and updated in cache row host.slot[r] where that is not kNotCached, else in host memory
  // (host.weights + r*dim, state in host.state at the offsets state_offset would give from 0).
  // The cache holds the true values of its rows; embedding_cache_copy moves them to and from
  // host memory. Nothing else changes: ids, sort keys and stochastic rounding use r.
  static constexpr std::uint32_t kNotCached = 0xffffffffu;
  struct HostRows {
    void* weights = nullptr;               // [rows, dim] of dtype; null: the table is not placed
    float* state = nullptr;                // host-resident optimizer state (null under sgd)
    const std::uint32_t* slot = nullptr;   // backend memory [rows]: cache row of r, or kNotCached
    const std::int64_t* cached = nullptr;  // backend memory [cache_rows]: the row in each cache row
    std::int64_t cache_rows = 0;
  };
  HostRows host;
  bool host_placed() const { return host.weights != nullptr; }
};

// The weight buffers of a set of tables, one per storage type (backend memory); a table's rows
// are in the buffer of its TableLayout::dtype. A buffer no table uses may be null.
struct TableWeights {
  void* f32 = nullptr;
  void* f16 = nullptr;
  void* bf16 = nullptr;
  // The buffer of storage type t (null for a type that is not a table storage type).
  void* of(DType t) const {
    return t == DType::f32 ? f32 : t == DType::f16 ? f16 : t == DType::bf16 ? bf16 : nullptr;
  }
  // Every table in one buffer of type t (const for the ops that only read it).
  static TableWeights all(DType t, const void* data) {
    void* p = const_cast<void*>(data);
    return TableWeights{t == DType::f32 ? p : nullptr, t == DType::f16 ? p : nullptr,
                        t == DType::bf16 ? p : nullptr};
  }
};
// Whether t is a table storage type (f32, f16, bf16).
inline bool is_table_dtype(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

// How fp16 and bf16 rows are rounded after an update: stochastically, element c of row r of
// table t with the 16 random bits rng::bits16(rng::row_key(rng::key(seed, step), t, r), c)
// (random.h), so a run is reproducible bit for bit on every backend and a resumed run continues
// the same stream.
struct StochasticRounding {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;  // the training step being taken (1-based)
};

// All embedding inputs of one batch, for all tables, in one CSR (table-major).
// Bag (t, b) holds ids[offsets[t*batch + b] .. offsets[t*batch + b + 1]).
// Pooling size 0 (empty bag) and variable pooling are natural.
struct SparseInput {
  std::int64_t batch = 0;
  int num_tables = 0;
  const std::int64_t* ids = nullptr;      // [offsets[num_tables*batch]]
  const std::int64_t* offsets = nullptr;  // [num_tables*batch + 1], offsets[0] == 0, non-decreasing
  std::int64_t nnz = -1;  // offsets[num_tables*batch] when the caller knows it (-1: unknown);
                          // spares a GPU backend a read of device memory, a host synchronisation
};

// Optimizer hyper-parameters as the ops see them (already resolved from the spec).
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.01f;
  float eps = 1e-8f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;
  float initial_accumulator = 0.0f;  // adagrad, rowwise_adagrad (OptimizerSpec)
};

// The value every float of an optimizer's state starts from: adagrad's and rowwise_adagrad's
// initial accumulator; 0 for adam's moments.
float initial_optimizer_state(const OptimizerParams& opt);

// Floats of optimizer state per parameter element (adagrad 1, adam 2, sgd 0);
// rowwise_adagrad keeps one float per table row instead (see TableLayout).
int optimizer_state_per_element(OptimizerKind kind);
// Floats of embedding optimizer state per table row: dim (adagrad), 1 (rowwise_adagrad), 0.
inline std::int64_t cache_state_per_row(OptimizerKind kind, int dim) {
  return kind == OptimizerKind::adagrad ? dim : kind == OptimizerKind::rowwise_adagrad ? 1 : 0;
}

// ------------------------------------------------------- sequences (HSTU) --

// The tokens of a batch of sequences (HSTU, spec.h HstuSpec): sequence b holds tokens
// [offsets[b], offsets[b + 1]) of every [tokens, ·] activation, in order; its last `targets`
// tokens are the targets it is scored on, the ones before them its history (contextual tokens
// first). Empty sequences are allowed; a non-empty one holds at least `targets` tokens.
struct SequenceBatch {
  std::int64_t batch = 0;                    // sequences
  std::int64_t tokens = 0;                   // offsets[batch]
  std::int64_t max_len = 0;                  // the longest sequence's tokens (a bound for launches)
  int targets = 0;                           // per non-empty sequence, >= 0
  const std::int64_t* offsets = nullptr;     // backend memory [batch + 1], from 0, non-decreasing
  const std::int64_t* timestamps = nullptr;  // backend memory [tokens], seconds, non-decreasing
                                             // within a sequence
  // Optional: backend memory [block_count], sequence_blocks() of the offsets, so that kernels
  // launch one workgroup per block of rows that holds a token, and none for the blocks a
  // max_len-sized grid has beyond the shorter sequences; the last packed_blocks of them are runs
  // of short sequences that share a block. Null: the kernels derive the blocks.
  const std::int64_t* blocks = nullptr;
  std::int64_t block_count = 0;
  std::int64_t packed_blocks = 0;
};

// The blocks of kSequenceBlockRows tokens of a batch of sequences that hold a token, each as
// (sequence << 20 | block index within it), ordered by block index descending and by sequence
// within one block index: the last, heaviest rows of the longest sequences first. Then runs of
// two or more consecutive sequences whose tokens fit in one block together, each as
// (first sequence << 20 | kPackedBlock | sequences in the run, empty ones included), their
// sequences not listed alone: a short history then costs a workgroup's share, not a
// workgroup. Returns how many such runs end the list.
inline constexpr int kSequenceBlockRows = 128;
inline constexpr std::int64_t kPackedBlock = std::int64_t{1} << 19;
std::int64_t sequence_blocks(std::span<const std::int64_t> offsets, std::vector<std::int64_t>& out);

// An HSTU layer's pointwise attention over a SequenceBatch, h heads. Token i of a sequence (0-based
// within it, n tokens, L = n - targets of them history) attends to token j when
//   visible(i, j) = j <= i and (j < L or j == i)   (causal; targets see the history and
//                                                   themselves, not each other)
// with the relative attention bias (rab) of head h
//   rab_h(i, j) = position[h * position_buckets + min(i - j, position_buckets - 1)]
//               + time[h * time_buckets + min(bit_width(max(ts_i - ts_j, 0)), time_buckets - 1)]
// (bit_width(0) = 0, bit_width(Δ) = floor(log2 Δ) + 1: log-scaled time buckets, exact in integers).
struct HstuAttention {
  int heads = 0;
  int attention_dim = 0;     // a: q and k hold heads * a columns, head h at columns [h a, (h+1) a)
  int value_dim = 0;         // v: v and the output hold heads * v columns
  float scale = 0.0f;        // multiplies q · k: 1 / sqrt(a)
  float inv_n = 0.0f;        // multiplies SiLU(s): 1 / the model's longest sequence
  int position_buckets = 0;  // >= 1
  int time_buckets = 0;      // >= 1
  const float* position = nullptr;  // backend memory [heads, position_buckets]
  const float* time = nullptr;      // backend memory [heads, time_buckets]
};

// ----------------------------------------------------------------- backend --

// A synthetic batch to make on the device (Backend::make_synthetic).
struct SyntheticBatch {
  // Backend memory holding a copy of SyntheticData::generator() (a synth::Generator block).
  const void* generator = nullptr;
  int num_dense = 0, num_tables = 0;
  std::int64_t ids_per_example = 0;
  int split = 0;  // 0 train, 1 eval
  std::int64_t first = 0, count = 0;
  // Outputs in backend memory: dense [count, num_dense], labels [count], ids
  // [count * ids_per_example] and offsets [num_tables * count + 1] (the table-major CSR).
  float* dense = nullptr;
  float* labels = nullptr;
  std::int64_t* ids = nullptr;
  std::int64_t* offsets = nullptr;
  // Backend memory of workspace_bytes(num_tables, count) bytes, not shared with the step.
  void* workspace = nullptr;
  static std::size_t workspace_bytes(int num_tables, std::int64_t count) {
    return 2 * sizeof(double) * static_cast<std::size_t>(num_tables) *
           static_cast<std::size_t>(count);
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", "hip"
  // Whether the backend's memory is the host's (the cpu backend), so that host code may read and
  // write what allocate() returns.
  virtual bool memory_is_host() const { return false; }

  // ---- memory (RAII wrapper: Buffer below) ----
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  // Enqueued like an op; host_src (pageable memory, not allocate_pinned's) may be reused once it
  // returns: the runtime copies it out first (CUDA's and HIP's documented behaviour for pageable
  // sources).
  virtual void copy_to_device(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src,
                            std::size_t bytes) = 0;  // synchronises
  virtual void fill(float* p, std::int64_t n, float value) = 0;
  // p[i] = lo + (hi - lo) * rng::uniform01(rng::key(seed, stream), i) for i in [0, n).
  // Stored as dtype (f32, f16 or bf16): the value rounded once to nearest even.
  virtual void fill_uniform(void* p, DType dtype, std::int64_t n, float lo, float hi,
                            std::uint64_t seed, std::uint64_t stream) = 0;
  void fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t seed,
                    std::uint64_t stream) {
    fill_uniform(p, DType::f32, n, lo, hi, seed, stream);
  }
  virtual void synchronize() = 0;
  // A mark in the backend's queue of work: the function returned, called from any thread, returns
  // once the work enqueued before the mark is done. Empty where an op's work is done when it
  // returns (the cpu backend).
  virtual std::function<void()> fence() { return {}; }
  // Makes a thread other than the one that made the backend ready to call it (a GPU backend's
  // device becomes that thread's current one).
  virtual void use_from_this_thread() {}

  // ---- activation storage ----
  // The element type the engine stores activations in (the forward outputs that the backward
  // reads again: MLP outputs, x0, the cross layers' u, z and outputs): fp32 by default; GPU
  // backends under bf16 dense math store bf16, halving the traffic of every elementwise pass and
  // feeding the products without a conversion. With DCNv2 the engine stores the cross stack's
  // gradients (and dx0) the same way; weight gradients, bias sums and optimizer state are fp32.
  // Ops that take an AMat/CAMat accept fp32 and bf16 views on every backend: the cpu backend reads
  // bf16 exactly and rounds its fp32 results to bf16 once, nearest even, the oracle for the GPU's
  // bf16 storage up to the GPU's extra roundings, which stay within the op tests' tolerances (a
  // bf16 output's bias is read in bf16; layer 0's dx0 is rounded once per part).
  virtual DType activation_dtype() const { return DType::f32; }

  // ---- dense layers ----
  // y = act(x · wᵀ + bias).  x [B, in], w [out, in], bias [out] (may be null), y [B, out].
  virtual void linear_forward(CAMat x, CMat w, const float* bias, Activation act, AMat y) = 0;
  // With dz = dy ⊙ act'(y) (act' from the saved output y):
  //   dw = dzᵀ · x [out, in], dbias = Σ_rows dz [out] (skipped when null),
  //   dx = dz · w [B, in] (skipped when dx.data is null).
  // dy and dx may be stored in bf16 (the engine stores the gradients of the interaction's input
  // and output so under bf16 math); dw and dbias are fp32.
  virtual void linear_backward(CAMat x, CMat w, CAMat y, CAMat dy, Activation act, AMat dx, Mat dw,
                               float* dbias) = 0;

  // ---- embeddings ----
  // out(b, out_col_t + d) = pool_{id in bag(t,b)} w_t[weight_offset_t + id*dim_t + d]
  // sum, or mean (an empty bag gives zeros), with w_t = weights.of(dtype_t) and the sum in fp32
  // or wider.  out [B, >= Σ dims] (a column block of a wider buffer).
  virtual void embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                                 const SparseInput& in, AMat out) = 0;
  // Backward fused with the optimizer update. The gradient of row r of table t is the sum over
  // every occurrence of r in the batch of dout(b, out_col_t + ·) (divided by the bag size for
  // mean pooling); occurrences are combined before the update, and only rows that occur are
  // updated. Then, with g that gradient (plus weight_decay * w):
  //   sgd:             w -= lr * g
  //   adagrad:         s += g²;            w -= lr * g / (sqrt(s) + eps)      (s per element)
  //   rowwise_adagrad: s += mean_d(g²);    w -= lr * g / (sqrt(s) + eps)      (s per row)
  // dout is fp32 or bf16 (the gradient of x0 under bf16 math); the sums and the update are fp32
  // or wider; the state is fp32. An fp16 or bf16 row is read, updated in fp32 and stored rounded
  // as `rounding` says; no other row is touched.
  virtual void embedding_backward_update(std::span<const TableLayout> tables,
                                         const TableWeights& weights, float* state,
                                         const SparseInput& in, CAMat dout,
                                         const OptimizerParams& opt,
                                         const StochasticRounding& rounding) = 0;

  // ---- host-placed tables and their caches (TableLayout::host) ----
  // For each host-placed table t, stats[2t] += its lookups in this batch that hit its cache and
  // stats[2t + 1] += all its lookups (ids in range); where counts[t] is not null (backend
  // memory, [rows]), counts[t][r] += the lookups of row r (saturating at 2^32 - 1). stats is
  // backend memory [2 * tables] of uint64; tables not host-placed are not touched.
  virtual void embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                                       std::span<std::uint32_t* const> counts,
                                       std::uint64_t* stats) = 0;
  // Copies every cache row i of a host-placed table between the cache and host memory: to_cache,
  // cache row i = host row cached[i] (weights and state); otherwise host row cached[i] = cache
  // row i. Rows whose cached[i] is negative are skipped.
  // `opt` says the state a row has (cache_state_per_row).
  virtual void embedding_cache_copy(const TableLayout& table, const TableWeights& weights,
                                    float* state, OptimizerKind opt, bool to_cache) = 0;

  // ---- interactions ----
  // Dot interaction. Features z_0 = dense [B, D], z_k = emb columns [(k-1)D, kD) for k = 1..T
  // (F = T + 1 features). out = [dense | <z_i, z_j> for i = 1..F-1, j = 0..i-1 (row-major strict
  // lower triangle)]: out [B, D + F(F-1)/2].
  virtual void dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) = 0;
  // ddense [B, D] and demb [B, T*D] are overwritten.
  virtual void dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                                        Mat demb) = 0;

  // DCNv2 low-rank cross layer, N features, rank r:
  //   u = xl · vᵀ [B, r];  z = u · wᵀ + bias [B, N];  x_next = x0 ⊙ z + xl [B, N]
  // v [r, N], w [N, r], bias [N]. u and z are saved for the backward.
  // x0, xl, u, z and x_next share one storage type (fp32 or bf16).
  virtual void cross_forward(CAMat x0, CAMat xl, CMat v, CMat w, const float* bias, AMat u, AMat z,
                             AMat x_next) = 0;
  // With g = dx_next:  dz = g ⊙ x0;  dx0 += g ⊙ z  (accumulates);  dw = dzᵀ · u;  dbias = Σ dz;
  //   du = dz · w;  dv = duᵀ · xl;  dxl = g + du · v (overwritten).
  // du_scratch [B, r] is working space. The mode saves passes over dx0 in a stack of layers run
  // last to first: first_into_dx0 makes the last layer start dx0 (dx0 = g ⊙ z, no zeroing
  // before); xl_is_x0 (layer 0, whose xl is x0) adds dxl into dx0 instead of writing it (dxl is
  // then not used and may be empty): dx0 += g ⊙ z + g + du · v.
  struct CrossBackwardMode {
    bool first_into_dx0 = false;
    bool xl_is_x0 = false;
  };
  // x0, xl, u and z share one storage type; dx_next, dx0 and dxl share one (fp32, or bf16 under
  // bf16 math: the gradients of the cross stack, each layer's sum formed in fp32/double and
  // rounded once, or once per part where a backend adds du · v in a second pass, as the GPU does
  // in layer 0); dv, dw, dbias and du_scratch are fp32.
  virtual void cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next,
                              AMat dx0, AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                              CrossBackwardMode mode) = 0;
  void cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next, AMat dx0,
                      AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch) {
    cross_backward(x0, xl, v, w, u, z, dx_next, dx0, dxl, dv, dw, dbias, du_scratch,
                   CrossBackwardMode{});
  }

  // ---- sequences (HSTU layers) ----
  // These ops have defaults that throw, naming the op and the backend: a backend that does not
  // run HSTU layers yet says so at the first one. Activations (AMat/CAMat) are fp32 or bf16 as
  // elsewhere; statistics (mean, rstd) and parameter gradients are fp32.
  //
  // Unpooled lookups summed into one token: out(b, d) = Σ_t pool_{id in bag(t,b)} w_t[id, d] for
  // d < out.cols, every table of dim out.cols (out_col is not used). The backward of this sum is
  // embedding_backward_update with every table's out_col 0 (each table's gradient is dout).
  virtual void embedding_sum_forward(std::span<const TableLayout> tables,
                                     const TableWeights& weights, const SparseInput& in, AMat out);
  // Per row r of x [R, C]: mean[r] = μ = mean_c x(r, c), rstd[r] = ρ = 1 / sqrt(var + eps) with
  // var = mean_c (x(r, c) - μ)², x̂ = (x - μ) ρ, and y = x̂ ⊙ gamma + beta (gamma, beta [C], each
  // null for 1 and 0).  y [R, C]; mean, rstd [R] (fp32, for the backward).
  virtual void layer_norm_forward(CAMat x, const float* gamma, const float* beta, float eps, AMat y,
                                  float* mean, float* rstd);
  // With g = dy ⊙ gamma: dx = ρ (g - mean_c(g) - x̂ mean_c(g ⊙ x̂)) [R, C];
  // dgamma = Σ_r dy ⊙ x̂ and dbeta = Σ_r dy [C] (overwritten; each skipped when null).
  virtual void layer_norm_backward(CAMat x, const float* gamma, const float* mean,
                                   const float* rstd, CAMat dy, AMat dx, float* dgamma,
                                   float* dbeta);
  // y = x̂ ⊙ u, x̂ the layer norm of x (no gamma or beta): the HSTU layer's LayerNorm(A V) ⊙ U.
  // x, u, y [R, C]; mean, rstd [R] saved as layer_norm_forward saves them.
  virtual void norm_mul_forward(CAMat x, CAMat u, float eps, AMat y, float* mean, float* rstd);
  // du = dy ⊙ x̂; dx = the layer norm backward of g = dy ⊙ u (above).
  virtual void norm_mul_backward(CAMat x, CAMat u, const float* mean, const float* rstd, CAMat dy,
                                 AMat dx, AMat du);
  // y = SiLU(x) = x σ(x).  x, y [R, C]; y may be x (in place).
  virtual void silu_forward(CAMat x, AMat y);
  // dx = dy ⊙ σ(x) (1 + x (1 - σ(x))); dx may be dy (in place).
  virtual void silu_backward(CAMat x, CAMat dy, AMat dx);
  // y += x (a residual connection, or a gradient that two paths share).  x, y [R, C].
  virtual void add_into(CAMat x, AMat y);
  // dst(i, ·) = src(index[i], ·) for i < dst.rows; index backend memory [dst.rows], each in
  // [0, src.rows).  src [S, C], dst [R, C], each fp32 or bf16 (a bf16 dst of an fp32 src rounded
  // to nearest even).
  virtual void gather_rows(CAMat src, const std::int64_t* index, AMat dst);
  // dst(index[i], ·) += src(i, ·) for i < src.rows: the backward of gather_rows, indices distinct.
  virtual void scatter_add_rows(CAMat src, const std::int64_t* index, AMat dst);
  // x(i, ·) *= alpha · scale[i] for i < x.rows, the factor rounded to fp32 first; scale is
  // backend memory [x.rows], or null for alpha alone. x [R, C] fp32.
  virtual void scale_rows(const float* scale, float alpha, Mat x);
  // HSTU pointwise attention (HstuAttention above), per sequence, head h and visible (i, j):
  //   s = scale · <q_i,h, k_j,h> + rab_h(i, j);  out_i,h = inv_n · Σ_j visible SiLU(s) v_j,h
  // (no softmax). q, k [tokens, heads·a], v and out [tokens, heads·v] (column blocks of wider
  // buffers allowed); rows of empty sequences do not exist, and out is written for every token.
  virtual void hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, CAMat q,
                                      CAMat k, CAMat v, AMat out);
  // With g = dout and, per visible (i, j) and head h, ds = inv_n · <g_i,h, v_j,h> · SiLU'(s):
  //   dq_i,h = scale Σ_j ds k_j,h;  dk_j,h = scale Σ_i ds q_i,h;  dv_j,h = inv_n Σ_i SiLU(s) g_i,h;
  //   dposition[h, p] = Σ ds over the pairs in position bucket p; dtime likewise
  // (SiLU'(s) = σ(s) (1 + s (1 - σ(s)))). Every output is overwritten; dposition and dtime are
  // [heads, buckets] fp32 (backend memory).
  virtual void hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att, CAMat q,
                                       CAMat k, CAMat v, CAMat dout, AMat dq, AMat dk, AMat dv,
                                       float* dposition, float* dtime);

  // ---- loss and heads ----
  // Mean sigmoid binary cross-entropy over n examples: loss = mean(softplus(z) - y*z).
  // dlogits[i] = (sigmoid(z_i) - y_i) / n. loss_out (one float, backend memory) gets the mean loss.
  virtual void bce_with_logits(const float* logits, const float* labels, std::int64_t n,
                               float* dlogits, float* loss_out) = 0;
  // probs[i] = sigmoid(logits[i]).
  virtual void sigmoid(const float* logits, float* probs, std::int64_t n) = 0;

  // ---- dense optimizer ----
  // One step over a flat parameter buffer. state holds optimizer_state_per_element(kind) * n
  // floats (adam: m in [0, n), v in [n, 2n)). step is 1-based (adam's bias correction).
  //   sgd:     w -= lr * (g + wd*w)
  //   adagrad: g' = g + wd*w; s += g'²; w -= lr * g' / (sqrt(s) + eps)
  //   adam:    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
  //            w -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd*w )
  virtual void dense_optimizer_step(float* params, const float* grads, float* state, std::int64_t n,
                                    const OptimizerParams& opt, std::int64_t step) = 0;

  // ---- input pipeline: the next batch's copy overlaps the current step ----
  // The engine keeps a few input slots (device buffers it owns). For each batch:
  //   begin_input(slot)            the host waits until the slot's previous copies have read
  //                                their host sources (so pinned staging memory may be refilled);
  //                                later copies into the slot wait until the step that last
  //                                used it is finished (release_input);
  //   input_copy(dst, src, bytes)  enqueued on a copy queue beside the compute queue; src should
  //                                come from allocate_pinned for a truly asynchronous copy;
  //   end_input(slot)              marks the slot's copies complete;
  //   use_input(slot)              compute work enqueued next waits for those copies;
  //   release_input(slot)          marks the compute work that reads the slot enqueued so far.
  // Backends without a second queue (cpu) copy at once; the defaults below are that.
  // True where input_copy runs in the background (the engine then stages batches in pinned
  // memory first); false where it copies at once (cpu), so the batch is copied from directly.
  virtual bool copies_in_background() const { return false; }
  // Any thread may call these two.
  virtual void* allocate_pinned(std::size_t bytes);
  virtual void deallocate_pinned(void* p) noexcept;
  // Host memory that this backend's ops read and write directly, at the same address (mapped,
  // pinned memory on a GPU; ordinary memory on the cpu): where host-placed tables live
  // (TableLayout::host). Throws naming the bytes when the host has too little.
  virtual void* allocate_host_resident(std::size_t bytes);
  virtual void deallocate_host_resident(void* p) noexcept;
  virtual void begin_input(int slot) { (void)slot; }
  virtual void input_copy(void* dst, const void* host_src, std::size_t bytes) {
    copy_to_device(dst, host_src, bytes);
  }
  virtual void end_input(int slot) { (void)slot; }
  virtual void use_input(int slot) { (void)slot; }
  virtual void release_input(int slot) { (void)slot; }

  // ---- synthetic data made on the device ----
  // True where make_synthetic runs (GPU backends): the engine then makes synthetic training
  // batches on the device, with no host work and no copy; elsewhere (cpu) the host makes them.
  virtual bool makes_synthetic_data() const { return false; }
  // Examples [first, first + count) of one split of the synthetic data (data.h, SyntheticData)
  // into an input slot, bit for bit what SyntheticData::make gives. Enqueued on the copy queue,
  // between begin_input and end_input, in place of input_copy.
  virtual void make_synthetic(const SyntheticBatch& batch);
  // The milliseconds the last make_synthetic into slot spanned on the copy queue, from its start
  // to its end (beside the compute queue's work, so its span, not time it had the device alone);
  // waits for it. Negative where the slot's last batch was not made on the device.
  virtual double input_made_ms(int slot) {
    (void)slot;
    return -1.0;
  }

  // ---- constant operands ----
  // hold_constant(p, bytes) promises that [p, p + bytes) will not be written until the next
  // release_constants(): a backend may then keep what it derives from that memory (in bf16
  // dense math, the GPU backend keeps the bf16 copy a matrix product makes of an operand, and
  // converts each held activation once per step instead of once per product). The engine holds
  // each forward activation once it is written and releases everything when a step begins.
  virtual void hold_constant(const void* p, std::size_t bytes) {
    (void)p;
    (void)bytes;
  }
  virtual void release_constants() {}

  // Runs `ops` (calls of this backend's ops with a step's real shapes) as a rehearsal: each op
  // sizes its scratch and workspaces and plans its library calls as it would for real, and
  // nothing else happens: no kernel, copy or library call is enqueued and no value changes. After
  // a rehearsal of the step, the step itself allocates and plans nothing (Model::prepare). Backends
  // with nothing to prepare (cpu) do not call `ops`.
  virtual void rehearse(const std::function<void()>& ops) { (void)ops; }

  // ---- checksummed products (silent-data-corruption detection) ----
  // With checks on, every forward dense product (linear_forward's, and both of cross_forward's: u
  // and z) verifies its output with checksums (ABFT) before any activation, within a bound
  // derived from rounding alone: the cpu backend each output column's sum over the batch against
  // (Σ_rows a) · bᵀ + rows · bias (a worst-case bound: its sums are in double), the GPU backend
  // each output row's sum against its prediction in fp32 before a bf16 output is rounded (a
  // probabilistic bound on fp32 sums, src/backend/gpu/product_checks.cu). A clean product does
  // not exceed it; a flipped high bit of an element that is not tiny beside the others does. A
  // mismatch is counted, never thrown (GPU kernels cannot throw): the trainer reads the counts
  // where it synchronises.
  struct ProductChecks {
    std::int64_t products = 0;  // products checked since the checks were turned on
    std::int64_t failures = 0;
    std::string first_failure;   // which product and column, by how much, and the bound
    bool fault_pending = false;  // an injected fault whose product has not come yet
  };
  // Throws Error where the backend has no checksummed products.
  virtual void set_product_checks(bool on);
  // A hint for the next cross_forward: the next forward product reads its x_next with weights w
  // [m, N] (the top MLP's first layer after the last cross layer). With the checks on, a backend
  // may sum that product's check terms as the layer writes x_next, sparing the check a read of
  // it. The default ignores it.
  virtual void cross_feeds_product(CMat w) { (void)w; }
  virtual ProductChecks product_checks() { return {}; }
  // Fault injection, to test detection end to end: flips bit `bit` (0: the least significant of
  // the stored element) of element `element` (row-major) of the output of forward product
  // `product` counted from now (0: the next), after the product and before its check (with the
  // checks off the flip is planted all the same: a fault for the finite-value guard and the
  // trainer's replay to find). Throws Error where the backend has no checksummed products.
  struct ProductFault {
    std::int64_t product = 0;
    std::int64_t element = 0;
    int bit = 31;
  };
  virtual void inject_product_fault(const ProductFault& fault);

  // ---- device self-tests (parity doctor) ----
  // memory_pattern_write fills the 32-bit words of [p, p + bytes) with memory_pattern_word(pattern,
  // i, seed) (include/parity/memory_pattern.h); memory_pattern_check reads every word back (a pass
  // of its own, after the write has left the caches for memory where the buffer is larger than
  // them) and counts the words that differ, with the index of the first. bytes: a multiple of 4.
  struct MemoryCheck {
    std::uint64_t errors = 0;
    std::uint64_t first_error_word = 0;  // meaningful where errors > 0
  };
  virtual void memory_pattern_write(void* p, std::size_t bytes, MemoryPattern pattern,
                                    std::uint64_t seed);
  virtual MemoryCheck memory_pattern_check(const void* p, std::size_t bytes, MemoryPattern pattern,
                                           std::uint64_t seed);
  // dst = src, both in backend memory, enqueued like an op (the copy-bandwidth test).
  virtual void copy_within(void* dst, const void* src, std::size_t bytes);
  // Bytes the backend could still allocate (device memory; 0 where unknown, as on the cpu).
  virtual std::size_t free_memory_bytes() const { return 0; }

  // ---- bad inputs recorded where they cannot be thrown ----
  // Ops that run where they cannot throw (GPU kernels) skip a bad input (an id outside its table,
  // offsets that decrease) and record the first one. raise_input_errors() waits for the work
  // enqueued so far and throws an InputError naming the table, the bag and the id ("table t, bag
  // b: id x is outside [0, rows)", as the cpu backend says at the op itself), clearing the record.
  // Backends that throw at the op (cpu) have nothing to raise. The trainer calls it at every
  // evaluation, checkpoint and at the end.
  virtual void raise_input_errors() {}

  // ---- numerical health ----
  // *first_bad (backend memory, one int64 that holds -1 until a record is made) = step, where it
  // holds -1 and some x[i], i in [0, n), is NaN or infinite; otherwise nothing changes. Enqueued
  // like any op, never synchronising: the engine flags each step's loss and dense parameters and
  // reads the record where the host waits anyway (Model::first_nonfinite_step).
  virtual void flag_nonfinite(const float* x, std::int64_t n, std::int64_t step,
                              std::int64_t* first_bad) = 0;

  // ---- memory outside the engine's buffers ----
  // Bytes of backend memory the backend holds for itself now (scratch, workspaces, library
  // handles' workspaces, cached operand copies), by purpose; empty where it holds none (cpu).
  virtual std::map<std::string, std::size_t> internal_memory_bytes() const { return {}; }
  // Holds all but `bytes` of the device's memory until the backend is destroyed, so that the run
  // has a device of `bytes` (what is in use already, the runtime's own included, counts against
  // it): one GPU standing in for a smaller one. Not counted in internal_memory_bytes. Throws Error
  // where the backend has no device memory (cpu), where the device has no more than `bytes`, or
  // where more than `bytes` are in use already.
  virtual void limit_memory(std::size_t bytes);
  // GPU backends: from now on every new matrix product takes the kernel catalog's ranking's first
  // configuration the library accepts (parity/select.h), the library heuristic's where none is;
  // the cpu backend has one way to multiply and ignores it. hbm_bytes_per_s: the ranking's floor.
  // A product the plan decided (decisions, Plan::kernels) runs the first of its configurations
  // the library accepts, said on stderr where it passes one over.
  virtual void use_gemm_catalog(std::shared_ptr<const GemmCatalog> catalog, double hbm_bytes_per_s,
                                std::vector<GemmDecision> decisions = {}) {
    (void)catalog, (void)hbm_bytes_per_s, (void)decisions;
  }
  // Where the products' configurations came from so far.
  virtual GemmSelectionCounts gemm_selection_counts() const { return {}; }
  // The BLAS library's version (0: none, the cpu backend), to compare with a plan's catalog.
  virtual std::int64_t blas_library_version() const { return 0; }

  // ---- profiling: timing marks on the compute queue ----
  // timing_mark(i) records mark i (device events on GPUs: the time the queue reaches it; the
  // wall clock on the cpu, whose ops complete before they return). timing_elapsed_ms(i, j)
  // waits for mark j and returns the milliseconds from mark i to mark j.
  virtual void timing_mark(int i);
  virtual double timing_elapsed_ms(int i, int j);

 private:
  std::vector<double> marks_;  // the default timing marks: wall-clock milliseconds
};

// Creates a backend by name: "cpu"; "gpu" (= "cuda" where built); "auto" (the GPU where one is
// built and usable, else cpu). `math` is the precision of the
// dense matrix products (a plan's dense_math); the cpu backend always computes in fp32 with
// double accumulation. Throws InputError for an unknown or unbuilt backend.
std::unique_ptr<Backend> make_backend(const std::string& name, DenseMath math = DenseMath::fp32);
// The product name of the GPU a GPU backend would use ("NVIDIA H200"); empty where this build
// has no GPU backend or no GPU is usable.
std::string detect_gpu();
// Its UUID ("GPU-5d3c...", as nvidia-smi prints it), the key of the health ledger; empty likewise.
std::string detect_gpu_uuid();
// How many GPUs this process sees (0 where this build has no GPU backend or none is usable).
int detect_gpu_count();
// Makes the GPU of a rank's local rank (modulo the GPUs this process sees) the one a GPU
// backend made after it uses: ranks on one host each take their own while there are enough.
// Nothing where this build has no GPU backend or no GPU is usable.
void use_gpu_of_local_rank(int local_rank);

// Measures the BLAS library's kernel catalog (parity/select.h) on this machine's GPU for the
// operand types asked for (`parity calibrate --kernels`); `device` is the spec's name written into
// it, hbm_bytes_per_s the device's achieved memory rate; `measured`, where set, receives every
// configuration timed (kept or not) with its runs. InputError where the build has no GPU backend.
GemmCatalog measure_gemm_catalog_here(
    const std::vector<GemmType>& types, const std::string& device, double hbm_bytes_per_s,
    const std::function<void(const std::string&)>& progress,
    const std::function<void(const MeasuredKernel&)>& measured = {});

// RAII buffer in a backend's memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, std::size_t bytes)
      : backend_(&backend), ptr_(bytes ? backend.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : backend_(o.backend_), ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void reset() noexcept {
    if (ptr_ != nullptr) backend_->deallocate(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace parity
