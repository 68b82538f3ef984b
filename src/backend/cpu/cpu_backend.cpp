// CpuBackend: forwards every op to the float instantiation of cpu_ops.h (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/checks.h"
#include "backend/cpu/cpu_ops.h"
#include "core/host_memory.h"
#include "parity/error.h"
#include "parity/random.h"

namespace parity {
namespace {

constexpr std::size_t kAlignment = 64;

[[noreturn]] void bad_dtype(const char* op, const char* name, DType t) {
  throw Error(
      fmt::format("{}: {} is stored as {}; activations are fp32 or bf16", op, name, dtype_name(t)));
}

// An fp32 view of a typed input: the view itself when it is fp32, else a widened copy.
class In {
 public:
  In(const char* op, const char* name, CAMat m) {
    if (m.is_f32()) {
      view_ = m.f32();
      return;
    }
    if (m.dtype != DType::bf16) bad_dtype(op, name, m.dtype);
    if (m.rows < 0 || m.cols < 0 || m.ld < m.cols ||
        m.data == nullptr) {  // the op's own check names it
      view_ = CMat(nullptr, m.rows, m.cols, m.ld);
      return;
    }
    buf_.resize(static_cast<std::size_t>(m.rows * m.cols));
    const auto* bits = static_cast<const std::uint16_t*>(m.data);
#pragma omp parallel for schedule(static) if (m.rows * m.cols >= (1 << 16))
    for (std::int64_t r = 0; r < m.rows; ++r)
      for (std::int64_t c = 0; c < m.cols; ++c)
        buf_[static_cast<std::size_t>(r * m.cols + c)] = bf16_to_float(bits[r * m.ld + c]);
    view_ = CMat(buf_.data(), m.rows, m.cols);
  }
  operator CMat() const {
    return view_;
  }  // NOLINT(google-explicit-constructor)

 private:
  std::vector<float> buf_;
  CMat view_;
};

// An fp32 view to compute a typed output into: the view itself when it is fp32, else scratch
// holding the target's current values (an op may leave elements alone: the embedding output's
// gaps) that store() rounds back into the bf16 target (exact for the untouched ones).
class Out {
 public:
  Out(const char* op, const char* name, AMat m) : target_(m) {
    if (m.is_f32()) {
      view_ = m.f32();
      return;
    }
    if (m.dtype != DType::bf16) bad_dtype(op, name, m.dtype);
    if (m.rows < 0 || m.cols < 0 || m.ld < m.cols) {
      view_ = Mat(nullptr, m.rows, m.cols, m.ld);
      return;
    }
    buf_.resize(static_cast<std::size_t>(m.rows * m.cols));
    view_ = Mat(m.data == nullptr ? nullptr : buf_.data(), m.rows, m.cols);
    if (view_.data == nullptr) return;
    const auto* bits = static_cast<const std::uint16_t*>(m.data);
#pragma omp parallel for schedule(static) if (m.rows * m.cols >= (1 << 16))
    for (std::int64_t r = 0; r < m.rows; ++r)
      for (std::int64_t c = 0; c < m.cols; ++c) view_(r, c) = bf16_to_float(bits[r * m.ld + c]);
  }
  operator Mat() const {
    return view_;
  }  // NOLINT(google-explicit-constructor)
  void store() const {
    if (target_.is_f32() || view_.data == nullptr) return;
    auto* bits = static_cast<std::uint16_t*>(target_.data);
#pragma omp parallel for schedule(static) if (view_.rows * view_.cols >= (1 << 16))
    for (std::int64_t r = 0; r < view_.rows; ++r)
      for (std::int64_t c = 0; c < view_.cols; ++c)
        bits[r * target_.ld + c] = bf16_bits(view_(r, c));
  }

 private:
  AMat target_;
  std::vector<float> buf_;
  Mat view_;
};

}  // namespace

CpuBackend::CpuBackend() : budget_(host_memory_available()) {}

void* CpuBackend::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  const std::lock_guard<std::mutex> lock(mutex_);
  // Checked against what the host had available when the backend was made: past it, the pages
  // would be granted (overcommit) and the process killed when it touched them.
  if (budget_ && allocated_ + rounded > *budget_)
    throw InputError(fmt::format(
        "cpu backend: {:.3g} GB more of host memory would make {:.3g} GB, and the host had "
        "{:.3g} GB available: the model and batch need more memory than this machine has (use a "
        "smaller --batch, or a GPU)",
        static_cast<double>(rounded) / 1e9, static_cast<double>(allocated_ + rounded) / 1e9,
        static_cast<double>(*budget_) / 1e9));
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    throw Error(fmt::format("cpu allocate: could not allocate {} bytes of host memory", bytes));
  }
  allocated_ += rounded;
  sizes_[p] = rounded;
  return p;
}

std::size_t CpuBackend::allocated_bytes() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

void CpuBackend::deallocate(void* p) noexcept {
  if (p == nullptr) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = sizes_.find(p); it != sizes_.end()) {
      allocated_ -= it->second;
      sizes_.erase(it);
    }
  }
  std::free(p);
}

void CpuBackend::copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::fill(float* p, std::int64_t n, float value) {
  cpu::fill(p, n, value);
}

void CpuBackend::flag_nonfinite(const float* x, std::int64_t n, std::int64_t step,
                                std::int64_t* first_bad) {
  if (n < 0 || (n > 0 && x == nullptr) || first_bad == nullptr)
    throw Error("flag_nonfinite: bad buffer");
  if (*first_bad != -1) return;
  bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) bad = bad || !std::isfinite(x[i]);
  if (bad) *first_bad = step;
}

void CpuBackend::fill_uniform(void* p, DType dtype, std::int64_t n, float lo, float hi,
                              std::uint64_t seed, std::uint64_t stream) {
  if (dtype == DType::f32)
    return cpu::fill_uniform(static_cast<float*>(p), n, lo, hi, seed, stream);
  if (dtype != DType::f16 && dtype != DType::bf16)
    throw Error(fmt::format("fill_uniform: {} is not fp32, fp16 or bf16", dtype_name(dtype)));
  if (n < 0 || (n > 0 && p == nullptr)) throw Error("fill_uniform: bad buffer");
  // The fp32 value (as the fp32 fill computes it), rounded once to nearest even, as the GPU does.
  auto* bits = static_cast<std::uint16_t*>(p);
  const std::uint64_t key = rng::key(seed, stream);
  const bool half = dtype == DType::f16;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) {
    const float v =
        static_cast<float>(lo + (hi - lo) * rng::uniform01(key, static_cast<std::uint64_t>(i)));
    bits[i] = half ? half_bits(v) : bf16_bits(v);
  }
}

void CpuBackend::linear_forward(CAMat x, CMat w, const float* bias, Activation act, AMat y) {
  constexpr const char* op = "linear_forward";
  const In xf(op, "x", x);
  const Out yf(op, "y", y);
  if (!checking_ && !fault_) {
    cpu::linear_forward<float>(xf, w, bias, act, yf);
  } else {  // the product checked before its activation, then the activation in place
    cpu::linear_forward<float>(xf, w, bias, Activation::none, yf);
    check_product(op, xf, w, bias, yf, DType::f32);  // the fp32 values store() will round
    const Mat v = yf;
    // The fused path rectifies z in double before rounding it: a tiny negative z gives +0 there
    // but rounds to -0.0f here, so -0.0f becomes +0 too (and a NaN stays a NaN, as there).
    if (act == Activation::relu)
      for (std::int64_t r = 0; r < v.rows; ++r)
        for (std::int64_t c = 0; c < v.cols; ++c)
          if (v(r, c) < 0.0f || (v(r, c) == 0.0f && std::signbit(v(r, c)))) v(r, c) = 0.0f;
  }
  yf.store();
}

void CpuBackend::linear_backward(CAMat x, CMat w, CAMat y, CAMat dy, Activation act, AMat dx,
                                 Mat dw, float* dbias) {
  constexpr const char* op = "linear_backward";
  const Out dxf(op, "dx", dx);
  cpu::linear_backward<float>(In(op, "x", x), w, In(op, "y", y), In(op, "dy", dy), act, dxf, dw,
                              dbias);
  dxf.store();
}

void CpuBackend::embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                                   const SparseInput& in, AMat out) {
  const Out of("embedding_forward", "out", out);
  cpu::embedding_forward<float>(tables, weights, in, of);
  of.store();
}

void CpuBackend::embedding_backward_update(std::span<const TableLayout> tables,
                                           const TableWeights& weights, float* state,
                                           const SparseInput& in, CAMat dout,
                                           const OptimizerParams& opt,
                                           const StochasticRounding& rounding) {
  cpu::embedding_backward_update<float>(
      tables, weights, state, in, In("embedding_backward_update", "dout", dout), opt, rounding);
}

void CpuBackend::embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                                         std::span<std::uint32_t* const> counts,
                                         std::uint64_t* stats) {
  cpu::embedding_cache_observe(tables, in, counts, stats);
}

void CpuBackend::embedding_cache_copy(const TableLayout& table, const TableWeights& weights,
                                      float* state, OptimizerKind opt, bool to_cache) {
  cpu::embedding_cache_copy(table, weights, state, opt, to_cache);
}

void CpuBackend::dot_interaction_forward(CMat dense, CMat emb, int num_tables, Mat out) {
  cpu::dot_interaction_forward(dense, emb, num_tables, out);
}

void CpuBackend::dot_interaction_backward(CMat dense, CMat emb, int num_tables, CMat dout,
                                          Mat ddense, Mat demb) {
  cpu::dot_interaction_backward(dense, emb, num_tables, dout, ddense, demb);
}

void CpuBackend::cross_forward(CAMat x0, CAMat xl, CMat v, CMat w, const float* bias, AMat u,
                               AMat z, AMat x_next) {
  constexpr const char* op = "cross_forward";
  backend_checks::check_cross_storage(op, {x0.dtype, xl.dtype, u.dtype, z.dtype, x_next.dtype});
  const Out uf(op, "u", u), zf(op, "z", z), nf(op, "x_next", x_next);
  if (x0.is_f32()) {
    cpu::cross_forward<float>(x0.f32(), xl.f32(), v, w, bias, uf, zf, nf);
    check_product("cross_forward u = xl · vᵀ", xl.f32(), v, nullptr, uf, u.dtype);
  } else {
    // Stored in bf16: z is rounded before the combine reads it and u before the second product,
    // as they are when the GPU writes them to memory between its steps.
    const In x0f(op, "x0", x0), xlf(op, "xl", xl);
    cpu::cross_forward<float>(x0f, xlf, v, w, bias, uf, zf, nf, DType::bf16);
    check_product("cross_forward u = xl · vᵀ", xlf, v, nullptr, uf, u.dtype);
  }
  check_product("cross_forward z = u · wᵀ + bias", Mat(uf), w, bias, zf, z.dtype);
  uf.store();
  zf.store();
  nf.store();
}

void CpuBackend::cross_backward(CAMat x0, CAMat xl, CMat v, CMat w, CAMat u, CAMat z, CAMat dx_next,
                                AMat dx0, AMat dxl, Mat dv, Mat dw, float* dbias, Mat du_scratch,
                                CrossBackwardMode mode) {
  constexpr const char* op = "cross_backward";
  backend_checks::check_cross_storage(
      op, {x0.dtype, xl.dtype, u.dtype, z.dtype},
      {dx_next.dtype, dx0.dtype, mode.xl_is_x0 ? dx0.dtype : dxl.dtype});
  // dx0 is read and written: Out starts from its stored values, and the layer's sum is rounded once
  // (a GPU that adds du · v in a second pass rounds between the two parts in layer 0).
  const Out dx0f(op, "dx0", dx0), dxlf(op, "dxl", dxl);
  cpu::cross_backward<float>(In(op, "x0", x0), In(op, "xl", xl), v, w, In(op, "u", u),
                             In(op, "z", z), In(op, "dx_next", dx_next), dx0f, dxlf, dv, dw, dbias,
                             du_scratch, mode.first_into_dx0, mode.xl_is_x0);
  dx0f.store();
  dxlf.store();
}

void CpuBackend::embedding_sum_forward(std::span<const TableLayout> tables,
                                       const TableWeights& weights, const SparseInput& in,
                                       AMat out) {
  const Out of("embedding_sum_forward", "out", out);
  cpu::embedding_sum_forward<float>(tables, weights, in, of);
  of.store();
}

void CpuBackend::layer_norm_forward(CAMat x, const float* gamma, const float* beta, float eps,
                                    AMat y, float* mean, float* rstd) {
  constexpr const char* op = "layer_norm_forward";
  const Out yf(op, "y", y);
  cpu::layer_norm_forward<float>(In(op, "x", x), gamma, beta, eps, yf, mean, rstd);
  yf.store();
}

void CpuBackend::layer_norm_backward(CAMat x, const float* gamma, const float* mean,
                                     const float* rstd, CAMat dy, AMat dx, float* dgamma,
                                     float* dbeta) {
  constexpr const char* op = "layer_norm_backward";
  const Out dxf(op, "dx", dx);
  cpu::layer_norm_backward<float>(In(op, "x", x), gamma, mean, rstd, In(op, "dy", dy), dxf, dgamma,
                                  dbeta);
  dxf.store();
}

void CpuBackend::norm_mul_forward(CAMat x, CAMat u, float eps, AMat y, float* mean, float* rstd) {
  constexpr const char* op = "norm_mul_forward";
  const Out yf(op, "y", y);
  cpu::norm_mul_forward<float>(In(op, "x", x), In(op, "u", u), eps, yf, mean, rstd);
  yf.store();
}

void CpuBackend::norm_mul_backward(CAMat x, CAMat u, const float* mean, const float* rstd, CAMat dy,
                                   AMat dx, AMat du) {
  constexpr const char* op = "norm_mul_backward";
  const Out dxf(op, "dx", dx), duf(op, "du", du);
  cpu::norm_mul_backward<float>(In(op, "x", x), In(op, "u", u), mean, rstd, In(op, "dy", dy), dxf,
                                duf);
  dxf.store();
  duf.store();
}

void CpuBackend::silu_forward(CAMat x, AMat y) {
  const In xf("silu_forward", "x", x);
  const Out yf("silu_forward", "y", y);
  cpu::silu_forward<float>(xf, yf);
  yf.store();
}

void CpuBackend::silu_backward(CAMat x, CAMat dy, AMat dx) {
  constexpr const char* op = "silu_backward";
  const In xf(op, "x", x), dyf(op, "dy", dy);
  const Out dxf(op, "dx", dx);
  cpu::silu_backward<float>(xf, dyf, dxf);
  dxf.store();
}

void CpuBackend::add_into(CAMat x, AMat y) {
  const In xf("add_into", "x", x);
  const Out yf("add_into", "y", y);
  cpu::add_into<float>(xf, yf);
  yf.store();
}

void CpuBackend::gather_rows(CAMat src, const std::int64_t* index, AMat dst) {
  const Out df("gather_rows", "dst", dst);
  cpu::gather_rows<float>(In("gather_rows", "src", src), index, df);
  df.store();
}

void CpuBackend::scale_rows(const float* scale, float alpha, Mat x) {
  backend_checks::check_view("scale_rows", "x", x);
#pragma omp parallel for schedule(static) if (x.rows * x.cols >= (1 << 16))
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const float f = scale == nullptr ? alpha : alpha * scale[r];
    for (std::int64_t c = 0; c < x.cols; ++c) x.data[r * x.ld + c] *= f;
  }
}

void CpuBackend::scatter_add_rows(CAMat src, const std::int64_t* index, AMat dst) {
  const Out df("scatter_add_rows", "dst", dst);
  cpu::scatter_add_rows<float>(In("scatter_add_rows", "src", src), index, df);
  df.store();
}

void CpuBackend::hstu_attention_forward(const SequenceBatch& seq, const HstuAttention& att, CAMat q,
                                        CAMat k, CAMat v, AMat out) {
  constexpr const char* op = "hstu_attention_forward";
  const Out of(op, "out", out);
  cpu::hstu_attention_forward<float>(seq, att, att.position, att.time, In(op, "q", q),
                                     In(op, "k", k), In(op, "v", v), of);
  of.store();
}

void CpuBackend::hstu_attention_backward(const SequenceBatch& seq, const HstuAttention& att,
                                         CAMat q, CAMat k, CAMat v, CAMat dout, AMat dq, AMat dk,
                                         AMat dv, float* dposition, float* dtime) {
  constexpr const char* op = "hstu_attention_backward";
  const Out dqf(op, "dq", dq), dkf(op, "dk", dk), dvf(op, "dv", dv);
  cpu::hstu_attention_backward<float>(seq, att, att.position, att.time, In(op, "q", q),
                                      In(op, "k", k), In(op, "v", v), In(op, "dout", dout), dqf,
                                      dkf, dvf, dposition, dtime);
  dqf.store();
  dkf.store();
  dvf.store();
}

void CpuBackend::bce_with_logits(const float* logits, const float* labels, std::int64_t n,
                                 float* dlogits, float* loss_out) {
  cpu::bce_with_logits(logits, labels, n, dlogits, loss_out);
}

void CpuBackend::sigmoid(const float* logits, float* probs, std::int64_t n) {
  cpu::sigmoid(logits, probs, n);
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
