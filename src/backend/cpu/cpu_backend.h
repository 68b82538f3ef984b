// The CPU backend: the Backend interface over host memory, running the float instantiation of the
// reference math in cpu_ops.h.
//
// Why it is built this way: the CPU backend is the oracle for every GPU kernel, so it holds no
// math of its own; it forwards to the templates that the tests also instantiate in double.
// Memory is 64-byte aligned host memory (a cache line, and the widest vector load), copies are
// memcpy, and every op completes before it returns, so synchronize() has nothing to wait for.
#pragma once

#include <memory>
#include <string>

#include "parity/backend.h"

namespace parity {

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* p) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill(float* p, std::int64_t n, float value) override;
  void round_to_dtype(float* p, std::int64_t n, DType dtype) override;
  void fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t seed,
                    std::uint64_t stream) override;
  void synchronize() override {}

  void linear_forward(CMat x, CMat w, const float* bias, Activation act, Mat y) override;
  void linear_backward(CMat x, CMat w, CMat y, CMat dy, Activation act, Mat dx, Mat dw,
                       float* dbias) override;

  void embedding_forward(std::span<const TableLayout> tables, const float* weights,
                         const SparseInput& in, Mat out) override;
  void embedding_backward_update(std::span<const TableLayout> tables, float* weights, float* state,
                                 const SparseInput& in, CMat dout,
                                 const OptimizerParams& opt) override;

  void dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) override;
  void dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                                Mat demb) override;
  void cross_forward(CMat x0, CMat xl, CMat v, CMat w, const float* bias, Mat u, Mat z,
                     Mat x_next) override;
  using Backend::cross_backward;
  void cross_backward(CMat x0, CMat xl, CMat v, CMat w, CMat u, CMat z, CMat dx_next, Mat dx0,
                      Mat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch, CrossBackwardMode mode) override;

  void bce_with_logits(const float* logits, const float* labels, std::int64_t n, float* dlogits,
                       float* loss_out) override;
  void sigmoid(const float* logits, float* probs, std::int64_t n) override;
  void add_inplace(Mat y, CMat x) override;

  void dense_optimizer_step(float* params, const float* grads, float* state, std::int64_t n,
                            const OptimizerParams& opt, std::int64_t step) override;
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace parity
