// Dense optimizer kernels (see dense_optimizer.h): grid-stride loops, one element per iteration,
// in double; each output depends only on its own inputs.
#include "backend/gpu/dense_optimizer.h"

#include <cmath>

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu {

namespace {

using namespace elementwise;

struct OptArgs {
  double lr, eps, wd, beta1, beta2, correction1, correction2;
  bool decay;
};

__global__ __launch_bounds__(kBlock) void sgd_kernel(float* __restrict__ w,
                                                     const float* __restrict__ g, std::int64_t n,
                                                     OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = a.decay ? static_cast<double>(g[i]) + a.wd * wi : static_cast<double>(g[i]);
    w[i] = static_cast<float>(wi - a.lr * gi);
  }
}

__global__ __launch_bounds__(kBlock) void adagrad_kernel(float* __restrict__ w,
                                                         const float* __restrict__ g,
                                                         float* __restrict__ s, std::int64_t n,
                                                         OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = a.decay ? static_cast<double>(g[i]) + a.wd * wi : static_cast<double>(g[i]);
    const double sum = static_cast<double>(s[i]) + gi * gi;
    s[i] = static_cast<float>(sum);
    w[i] = static_cast<float>(wi - a.lr * gi / (sqrt(sum) + a.eps));
  }
}

__global__ __launch_bounds__(kBlock) void adam_kernel(float* __restrict__ w,
                                                      const float* __restrict__ g,
                                                      float* __restrict__ m, float* __restrict__ v,
                                                      std::int64_t n, OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = g[i];
    const double mi = a.beta1 * static_cast<double>(m[i]) + (1.0 - a.beta1) * gi;
    const double vi = a.beta2 * static_cast<double>(v[i]) + (1.0 - a.beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double step = (mi / a.correction1) / (sqrt(vi / a.correction2) + a.eps);
    w[i] = static_cast<float>(wi - a.lr * (a.decay ? step + a.wd * wi : step));
  }
}

}  // namespace

void dense_optimizer_step(Stream_t s, float* params, const float* grads, float* state,
                          std::int64_t n, const OptimizerParams& opt, std::int64_t step) {
  if (n <= 0) return;
  OptArgs a{};
  a.lr = opt.lr;
  a.eps = opt.eps;
  a.wd = opt.weight_decay;
  a.decay = a.wd != 0.0;
  a.beta1 = opt.beta1;
  a.beta2 = opt.beta2;
  // Bias corrections on the host, with the same std::pow the CPU reference uses.
  a.correction1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  a.correction2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  const LaunchShape shape{grid_for(n), kBlock, 0};
  switch (opt.kind) {
    case OptimizerKind::sgd:
      return launch("dense_sgd", sgd_kernel, shape, s, params, grads, n, a);
    case OptimizerKind::adagrad:
      return launch("dense_adagrad", adagrad_kernel, shape, s, params, grads, state, n, a);
    case OptimizerKind::adam:
      return launch("dense_adam", adam_kernel, shape, s, params, grads, state, state + n, n, a);
    case OptimizerKind::rowwise_adagrad:
      break;
  }
  throw Error(
      "dense_optimizer_step: rowwise_adagrad is an embedding optimizer (use sgd, adagrad or adam)");
}

}  // namespace parity::gpu
