// GpuBackend: the Backend interface (include/parity/backend.h) on one GPU and one stream.
//
// Why it is built this way:
// - Every op enqueues on the backend's one stream and returns: a training step (forward,
//   backward, update) is one stream-ordered sequence with no host synchronisation inside it. The
//   exceptions are the copy_to_host family, synchronize() and raise_input_errors(), as the
//   interface says, and an embedding op given no id count (SparseInput::nnz of -1; the engine
//   always gives it), which reads it back.
// - Matrix products go through cuBLASLt (blas.h) with the bias and ReLU fused into the product's
//   epilogue; everything else is a kernel of its op's .cu file (fill, convert, linear, cross,
//   dot_interaction, loss, dense_optimizer, column_sum) or of the embedding module (embedding.h).
// - DenseMath picks how products are computed: fp32 (exact fp32, the default: it tracks the CPU
//   reference to rounding), tf32 (tensor cores read fp32 operands as tf32), bf16 (bf16 operands,
//   fp32 accumulation; master weights, weight gradients and the optimizer stay fp32). Under bf16
//   the activations are stored in bf16 too (activation_dtype; the engine stores the cross stack's
//   gradients so as well): the products read them as they are and write them rounded once (with a
//   bf16 bias), and the elementwise passes over them move half the bytes. fp32 operands (weights,
//   fp32 gradients) are converted per call, or once per step where the engine holds them constant
//   (operand_cache.h). Everything that is not a product computes in fp32 (or double) in every
//   mode.
// - Memory: parameters and activations come from allocate() (the engine allocates them once).
//   The backend's own scratch (bf16 operand copies, masked gradients, reduction partials, the
//   embedding backward's sort workspace) is kept per purpose and grows only when a larger shape
//   arrives, so after the first step of a run nothing is allocated; counters() lets tests check
//   that. The BLAS workspace is allocated at construction.
// - The HSTU attention runs on tensor cores (hstu_attention.h: bf16 operands, fp32 sums) under
//   bf16 dense math or with bf16 operands, and on the scalar fp32 kernels (sequence.h) otherwise.
// - This header names no vendor symbol (pimpl), so engine code can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parity/backend.h"
#include "parity/spec.h"

namespace parity {

class GpuBackend final : public Backend {
 public:
  // Uses the current device (throws Error with the reason where no GPU is usable). math is
  // fp32, tf32 or bf16 (DenseMath of spec.h; fp16 products are not implemented here yet).
  explicit GpuBackend(DenseMath math = DenseMath::fp32);
  ~GpuBackend() override;
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string name() const override;
  DenseMath dense_math() const;

  void* allocate(std::size_t bytes) override;
  void deallocate(void* p) noexcept override;
  // Asynchronous on the backend's stream (from pageable memory the runtime stages the data
  // before returning, so host_src may be reused at once).
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void fill(float* p, std::int64_t n, float value) override;
  using Backend::fill_uniform;
  void fill_uniform(void* p, DType dtype, std::int64_t n, float lo, float hi, std::uint64_t seed,
                    std::uint64_t stream) override;
  void flag_nonfinite(const float* x, std::int64_t n, std::int64_t step,
                      std::int64_t* first_bad) override;
  void synchronize() override;
  std::function<void()> fence() override;
  void use_from_this_thread() override;

  // Input pipeline: copies run on a second stream, ordered against the compute stream by
  // per-slot events (backend.h describes the protocol).
  bool copies_in_background() const override { return true; }
  void* allocate_pinned(std::size_t bytes) override;
  void deallocate_pinned(void* p) noexcept override;
  void begin_input(int slot) override;
  void input_copy(void* dst, const void* host_src, std::size_t bytes) override;
  bool makes_synthetic_data() const override { return true; }
  void make_synthetic(const SyntheticBatch& batch) override;
  double input_made_ms(int slot) override;
  void end_input(int slot) override;
  void use_input(int slot) override;
  void release_input(int slot) override;
  // Held memory's bf16 product operands are converted once and reused until release.
  void hold_constant(const void* p, std::size_t bytes) override;
  void release_constants() override;
  void rehearse(const std::function<void()>& ops) override;
  // Timing marks are device events recorded on the compute stream.
  void timing_mark(int i) override;
  double timing_elapsed_ms(int i, int j) override;

  // bf16 under bf16 dense math (products read bf16 activations directly), else fp32.
  DType activation_dtype() const override;

  void linear_forward(CAMat x, CMat w, const float* bias, Activation act, AMat y) override;
  // Checksummed products (product_checks.cu): each forward product's output rows against their
  // inputs, in fp32 before a bf16 output is rounded, within a bound from fp32's rounding. Under
  // fp32 or bf16 dense math (tf32 is refused).
  void set_product_checks(bool on) override;
  ProductChecks product_checks() override;
  void cross_feeds_product(CMat w) override;
  void inject_product_fault(const ProductFault& fault) override;
  // On (the default): under bf16 math, on a device of compute capability 9.0, a checked product
  // with a bf16 output, a depth that is a multiple of 8 and aligned operands runs in one kernel
  // that sums each row as it stores it (checked_product.cu), instead of the library's product
  // into fp32 and a pass over it (the path everywhere else; off: always, for comparing the two).
  // fused_checks(): the checked products since set_product_checks that ran in one kernel.
  void use_fused_checks(bool on);
  std::int64_t fused_checks() const;
  void linear_backward(CAMat x, CMat w, CAMat y, CAMat dy, Activation act, AMat dx, Mat dw,
                       float* dbias) override;

  // Through the embedding module (embedding.h): each table in its storage type's buffer, fp16 and
  // bf16 rows updated in fp32 and stored with the stochastic rounding the call names. Ids out of
  // range are skipped and recorded, not thrown: they surface at raise_input_errors(). The module
  // needs the id count on the host: SparseInput::nnz, or where that is -1 a read of offsets[T*B] (a
  // host synchronisation, counted in host_syncs).
  void embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                         const SparseInput& in, AMat out) override;
  void embedding_backward_update(std::span<const TableLayout> tables, const TableWeights& weights,
                                 float* state, const SparseInput& in, CAMat dout,
                                 const OptimizerParams& opt,
                                 const StochasticRounding& rounding) override;
  // Host-placed tables: their rows in mapped, pinned host memory, read and written by the
  // embedding kernels in place (embedding_cache.cu has the cache's bookkeeping).
  void embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                               std::span<std::uint32_t* const> counts,
                               std::uint64_t* stats) override;
  void embedding_cache_copy(const TableLayout& table, const TableWeights& weights, float* state,
                            OptimizerKind opt, bool to_cache) override;
  void* allocate_host_resident(std::size_t bytes) override;
  std::map<std::string, std::size_t> internal_memory_bytes() const override;
  void limit_memory(std::size_t bytes) override;
  void memory_pattern_write(void* p, std::size_t bytes, MemoryPattern pattern,
                            std::uint64_t seed) override;
  MemoryCheck memory_pattern_check(const void* p, std::size_t bytes, MemoryPattern pattern,
                                   std::uint64_t seed) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  std::size_t free_memory_bytes() const override;
  void use_gemm_catalog(std::shared_ptr<const GemmCatalog> catalog, double hbm_bytes_per_s,
                        std::vector<GemmDecision> decisions = {}) override;
  GemmSelectionCounts gemm_selection_counts() const override;
  std::int64_t blas_library_version() const override;
  void deallocate_host_resident(void* p) noexcept override;

  void dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) override;
  void dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                                Mat demb) override;
  void cross_forward(CAMat x0, CAMat xl, CMat v, CMat w, const float* bias, AMat u, AMat z,
                     AMat x_next) override;
  using Backend::cross_backward;
  void cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next, AMat dx0,
                      AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                      CrossBackwardMode mode) override;

  // HSTU layers (sequence.h): fp32 activations.
  void embedding_sum_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                             const SparseInput& in, AMat out) override;
  void layer_norm_forward(CAMat x, const float* gamma, const float* beta, float eps, AMat y,
                          float* mean, float* rstd) override;
  void layer_norm_backward(CAMat x, const float* gamma, const float* mean, const float* rstd,
                           CAMat dy, AMat dx, float* dgamma, float* dbeta) override;
  void norm_mul_forward(CAMat x, CAMat u, float eps, AMat y, float* mean, float* rstd) override;
  void norm_mul_backward(CAMat x, CAMat u, const float* mean, const float* rstd, CAMat dy, AMat dx,
                         AMat du) override;
  void silu_forward(CAMat x, AMat y) override;
  void silu_backward(CAMat x, CAMat dy, AMat dx) override;
  void add_into(CAMat x, AMat y) override;
  void gather_rows(CAMat src, const std::int64_t* index, AMat dst) override;
  void scale_rows(const float* scale, float alpha, Mat x) override;
  void scatter_add_rows(CAMat src, const std::int64_t* index, AMat dst) override;
  void hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, CAMat q, CAMat k,
                              CAMat v, AMat out) override;
  void hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att, CAMat q, CAMat k,
                               CAMat v, CAMat dout, AMat dq, AMat dk, AMat dv, float* dposition,
                               float* dtime) override;

  void bce_with_logits(const float* logits, const float* labels, std::int64_t n, float* dlogits,
                       float* loss_out) override;
  void sigmoid(const float* logits, float* probs, std::int64_t n) override;

  void dense_optimizer_step(float* params, const float* grads, float* state, std::int64_t n,
                            const OptimizerParams& opt, std::int64_t step) override;

  // Synchronises; throws InputError if an embedding op met a bad id or offset since the last check.
  void raise_input_errors() override;

  // What the backend has done behind the interface, for tests and benchmarks.
  struct Counters {
    std::int64_t allocations = 0;         // allocate() calls
    std::int64_t pinned_allocations = 0;  // allocate_pinned() calls (non-empty)
    std::int64_t scratch_growths =
        0;                        // internal scratch (re)allocations, embedding workspace included
    std::int64_t blas_plans = 0;  // cuBLASLt descriptors + algorithms built
    std::int64_t blas_heuristics = 0;     // questions to the library's algorithm heuristic
    std::int64_t epilogue_fallbacks = 0;  // plans whose bias/ReLU could not be fused (blas.h)
    std::int64_t host_syncs = 0;  // id-count reads by the embedding ops (SparseInput::nnz -1)
  };
  Counters counters() const;

  // Why the tensor-core kernels would not run this attention under bf16 dense math (or bf16
  // operands), or empty when they would (see hstu_attention_forward).
  std::string tensor_core_attention_refusal(const HstuAttention& att) const;

 private:
  // Whether this attention runs on the tensor-core kernels (see hstu_attention_forward).
  bool tensor_core_attention(const char* op, const HstuAttention& att, CAMat q) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Backend> make_gpu_backend(DenseMath math = DenseMath::fp32);
// The current GPU's product name as the runtime reports it ("NVIDIA H200"); empty where no GPU
// is usable.
std::string gpu_device_name();
// Its UUID ("GPU-...", as nvidia-smi prints it); empty likewise.
std::string gpu_device_uuid();
// Makes GPU `index` modulo the visible GPUs this process's current one (nothing without a GPU).
void use_gpu(int index);
// The GPUs this process sees.
int gpu_device_count();

}  // namespace parity
