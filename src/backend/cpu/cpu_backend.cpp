// CpuBackend: forwards every op to the float instantiation of cpu_ops.h (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "parity/error.h"

namespace parity {
namespace {

constexpr std::size_t kAlignment = 64;

}  // namespace

void* CpuBackend::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    throw Error("cpu allocate: could not allocate " + std::to_string(bytes) +
                " bytes of host memory");
  }
  return p;
}

void CpuBackend::deallocate(void* p) noexcept {
  std::free(p);
}

void CpuBackend::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::fill(float* p, std::int64_t n, float value) {
  cpu::fill(p, n, value);
}

void CpuBackend::round_to_dtype(float* p, std::int64_t n, DType dtype) {
  if (n < 0 || (n > 0 && p == nullptr)) throw Error("round_to_dtype: bad buffer");
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) p[i] = parity::round_to_dtype(p[i], dtype);
}

void CpuBackend::fill_uniform(float* p, std::int64_t n, float lo, float hi, std::uint64_t seed,
                              std::uint64_t stream) {
  cpu::fill_uniform(p, n, lo, hi, seed, stream);
}

void CpuBackend::linear_forward(CMat x, CMat w, const float* bias, Activation act, Mat y) {
  cpu::linear_forward(x, w, bias, act, y);
}

void CpuBackend::linear_backward(CMat x, CMat w, CMat y, CMat dy, Activation act, Mat dx, Mat dw,
                                 float* dbias) {
  cpu::linear_backward(x, w, y, dy, act, dx, dw, dbias);
}

void CpuBackend::embedding_forward(std::span<const TableLayout> tables, const float* weights,
                                   const SparseInput& in, Mat out) {
  cpu::embedding_forward(tables, weights, in, out);
}

void CpuBackend::embedding_backward_update(std::span<const TableLayout> tables, float* weights,
                                           float* state, const SparseInput& in, CMat dout,
                                           const OptimizerParams& opt) {
  cpu::embedding_backward_update(tables, weights, state, in, dout, opt);
}

void CpuBackend::dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) {
  cpu::dot_interaction_forward(dense, emb, num_tables, out);
}

void CpuBackend::dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout,
                                          Mat ddense, Mat demb) {
  cpu::dot_interaction_backward(dense, emb, num_tables, dout, ddense, demb);
}

void CpuBackend::cross_forward(CMat x0, CMat xl, CMat v, CMat w, const float* bias, Mat u, Mat z,
                               Mat x_next) {
  cpu::cross_forward(x0, xl, v, w, bias, u, z, x_next);
}

void CpuBackend::cross_backward(CMat x0, CMat xl, CMat v, CMat w, CMat u, CMat z, CMat dx_next,
                                Mat dx0, Mat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                                CrossBackwardMode mode) {
  cpu::cross_backward(x0, xl, v, w, u, z, dx_next, dx0, dxl, dv, dw, dbias, du_scratch, mode.first_into_dx0,
                      mode.xl_is_x0);
}

void CpuBackend::bce_with_logits(const float* logits, const float* labels, std::int64_t n,
                                 float* dlogits, float* loss_out) {
  cpu::bce_with_logits(logits, labels, n, dlogits, loss_out);
}

void CpuBackend::sigmoid(const float* logits, float* probs, std::int64_t n) {
  cpu::sigmoid(logits, probs, n);
}

void CpuBackend::add_inplace(Mat y, CMat x) {
  cpu::add_inplace(y, x);
}

void CpuBackend::dense_optimizer_step(float* params, const float* grads, float* state,
                                      std::int64_t n, const OptimizerParams& opt,
                                      std::int64_t step) {
  cpu::dense_optimizer_step(params, grads, state, n, opt, step);
}

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace parity
