// Elementwise ops for the CPU reference: fills, loss, sigmoid, dense optimizer steps.
//
// Why it is built this way: each output element depends on its own inputs only, so threads split
// the index range and nothing depends on the thread count. The one reduction (the mean loss) is
// summed sequentially in index order, in double, after the per-element terms are computed in
// parallel. Optimizer math is done in double from the stored values and rounded to T once per
// stored value; sigmoid and softplus use the overflow-free forms.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_ops.h"
#include "parity/random.h"

namespace parity::cpu {

using detail::fail;
using detail::kParallelElements;
using detail::stable_sigmoid;

namespace {

// log(1 + exp(z)) without overflow.
double softplus(double z) {
  return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
}

void check_flat(const char* op, const char* name, const void* p, std::int64_t n) {
  if (n < 0) fail(op, "n is {}, expected >= 0", n);
  if (p == nullptr && n > 0) fail(op, "{} is null", name);
}

}  // namespace

template <class T>
void fill(T* p, std::int64_t n, T value) {
  check_flat("fill", "p", p, n);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) p[i] = value;
}

template <class T>
void fill_uniform(T* p, std::int64_t n, T lo, T hi, std::uint64_t seed, std::uint64_t stream) {
  check_flat("fill_uniform", "p", p, n);
  const std::uint64_t key = rng::key(seed, stream);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<T>(lo + (hi - lo) * rng::uniform01(key, static_cast<std::uint64_t>(i)));
  }
}

template <class T>
void bce_with_logits(const T* logits, const T* labels, std::int64_t n, T* dlogits, T* loss_out) {
  constexpr const char* op = "bce_with_logits";
  if (n <= 0) fail(op, "n is {}, expected > 0", n);
  check_flat(op, "logits", logits, n);
  check_flat(op, "labels", labels, n);
  check_flat(op, "dlogits", dlogits, n);
  if (loss_out == nullptr) fail(op, "loss_out is null");
  const double count = static_cast<double>(n);
  double* terms = detail::scratch(detail::Slot::terms, n);  // [n]
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) {
    const double z = logits[i];
    const double y = labels[i];
    terms[i] = softplus(z) - y * z;
    dlogits[i] = static_cast<T>((stable_sigmoid(z) - y) / count);
  }
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) total += terms[i];
  loss_out[0] = static_cast<T>(total / count);
}

template <class T>
void sigmoid(const T* logits, T* probs, std::int64_t n) {
  check_flat("sigmoid", "logits", logits, n);
  check_flat("sigmoid", "probs", probs, n);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (std::int64_t i = 0; i < n; ++i) {
    probs[i] = static_cast<T>(stable_sigmoid(static_cast<double>(logits[i])));
  }
}

template <class T>
void dense_optimizer_step(T* params, const T* grads, T* state, std::int64_t n,
                          const OptimizerParams& opt, std::int64_t step) {
  constexpr const char* op = "dense_optimizer_step";
  check_flat(op, "params", params, n);
  check_flat(op, "grads", grads, n);
  const double lr = opt.lr;
  const double eps = opt.eps;
  const double wd = opt.weight_decay;
  const bool decay = wd != 0.0;
  switch (opt.kind) {
    case OptimizerKind::sgd: {
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (std::int64_t i = 0; i < n; ++i) {
        const double w = params[i];
        const double g = decay ? grads[i] + wd * w : grads[i];
        params[i] = static_cast<T>(w - lr * g);
      }
      return;
    }
    case OptimizerKind::adagrad: {
      check_flat(op, "state", state, n);
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (std::int64_t i = 0; i < n; ++i) {
        const double w = params[i];
        const double g = decay ? grads[i] + wd * w : grads[i];
        const double sum = static_cast<double>(state[i]) + g * g;
        state[i] = static_cast<T>(sum);
        params[i] = static_cast<T>(w - lr * g / (std::sqrt(sum) + eps));
      }
      return;
    }
    case OptimizerKind::adam: {
      check_flat(op, "state", state, 2 * n);
      if (step < 1) fail(op, "adam step is {}, expected >= 1 (1-based)", step);
      const double beta1 = opt.beta1;
      const double beta2 = opt.beta2;
      const double correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
      const double correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
      T* m = state;      // [n]
      T* v = state + n;  // [n]
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
      for (std::int64_t i = 0; i < n; ++i) {
        const double w = params[i];
        const double g = grads[i];
        const double mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * g;
        const double vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * g * g;
        m[i] = static_cast<T>(mi);
        v[i] = static_cast<T>(vi);
        const double adam = (mi / correction1) / (std::sqrt(vi / correction2) + eps);
        params[i] = static_cast<T>(w - lr * (decay ? adam + wd * w : adam));
      }
      return;
    }
    case OptimizerKind::rowwise_adagrad:
      fail(op, "rowwise_adagrad is an embedding optimizer (use sgd, adagrad or adam)");
  }
  fail(op, "unknown optimizer kind {}", static_cast<int>(opt.kind));
}

#define PARITY_INSTANTIATE(T)                                                                   \
  template void fill<T>(T*, std::int64_t, T);                                                   \
  template void fill_uniform<T>(T*, std::int64_t, T, T, std::uint64_t, std::uint64_t);          \
  template void bce_with_logits<T>(const T*, const T*, std::int64_t, T*, T*);                   \
  template void sigmoid<T>(const T*, T*, std::int64_t);                                         \
  template void dense_optimizer_step<T>(T*, const T*, T*, std::int64_t, const OptimizerParams&, \
                                        std::int64_t);
PARITY_INSTANTIATE(float)
PARITY_INSTANTIATE(double)
#undef PARITY_INSTANTIATE

}  // namespace parity::cpu
