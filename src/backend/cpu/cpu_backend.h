// The CPU backend: the Backend interface over host memory, running the float instantiation of the
// reference math in cpu_ops.h.
//
// Why it is built this way: the CPU backend is the oracle for every GPU kernel, so it holds no
// math of its own; it forwards to the templates that the tests also instantiate in double.
// Activations stored in bf16 (AMat/CAMat views) are widened to fp32 scratch before the op and its
// fp32 outputs rounded to bf16 after it (nearest even): exactly the values a GPU kernel that reads
// bf16, computes in fp32/double and rounds once on store produces. The engine itself stores fp32
// activations on this backend (activation_dtype() is fp32); bf16 views come from the tests.
// Memory is 64-byte aligned host memory (a cache line, and the widest vector load), copies are
// memcpy, and every op completes before it returns, so synchronize() has nothing to wait for.
// Allocations are counted against the host memory available when the backend is made, so that a
// model or batch too large for the machine is an InputError with the figures, not a kill.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "parity/backend.h"

namespace parity {

class CpuBackend : public Backend {
 public:
  CpuBackend();
  std::string name() const override { return "cpu"; }
  bool memory_is_host() const override { return true; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void fill(float* p, std::int64_t n, float value) override;
  void flag_nonfinite(const float* x, std::int64_t n, std::int64_t step,
                      std::int64_t* first_bad) override;
  using Backend::fill_uniform;
  void fill_uniform(void* p, DType dtype, std::int64_t n, float lo, float hi, std::uint64_t seed,
                    std::uint64_t stream) override;
  void synchronize() override {}

  void linear_forward(CAMat x, CMat w, const float* bias, Activation act, AMat y) override;
  void linear_backward(CAMat x, CMat w, CAMat y, CAMat dy, Activation act, AMat dx, Mat dw,
                       float* dbias) override;

  void embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                         const SparseInput& in, AMat out) override;
  void embedding_backward_update(std::span<const TableLayout> tables, const TableWeights& weights,
                                 float* state, const SparseInput& in, CAMat dout,
                                 const OptimizerParams& opt,
                                 const StochasticRounding& rounding) override;
  void embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                               std::span<std::uint32_t* const> counts,
                               std::uint64_t* stats) override;
  void embedding_cache_copy(const TableLayout& table, const TableWeights& weights, float* state,
                            OptimizerKind opt, bool to_cache) override;

  void dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) override;
  void dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                                Mat demb) override;
  void cross_forward(CAMat x0, CAMat xl, CMat v, CMat w, const float* bias, AMat u, AMat z,
                     AMat x_next) override;
  using Backend::cross_backward;
  void cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next, AMat dx0,
                      AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                      CrossBackwardMode mode) override;

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

  // Bytes held by allocate() now.
  std::size_t allocated_bytes() const;

  void set_product_checks(bool on) override;
  ProductChecks product_checks() override {
    ProductChecks c = checks_;
    c.fault_pending = fault_.has_value();
    return c;
  }
  void inject_product_fault(const ProductFault& fault) override;

 private:
  // With checks on or a fault armed: counts the product and flips the armed fault's bit if it is
  // this product's; with checks on, tests out = a · bᵀ + bias (stored as `stored`) by its column
  // sums.
  void check_product(const char* what, CMat a, CMat b, const float* bias, Mat out, DType stored);

  std::optional<std::uint64_t> budget_;  // host memory available when the backend was made
  bool checking_ = false;
  ProductChecks checks_;
  std::optional<ProductFault> fault_;  // its product: an index into products_seen_
  std::int64_t products_seen_ = 0;     // forward products since checks or a fault were armed
  mutable std::mutex mutex_;
  std::size_t allocated_ = 0;
  std::unordered_map<void*, std::size_t> sizes_;
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace parity
