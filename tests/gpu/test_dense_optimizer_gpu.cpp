// The dense optimizers on the GPU against the CPU reference.
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(DenseGpu, DenseOptimizersMatchCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  const std::int64_t n = 100003;
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::adam}) {
    for (float wd : {0.0f, 0.01f}) {
      OptimizerParams opt;
      opt.kind = kind;
      opt.lr = 0.05f;
      opt.eps = 1e-8f;
      opt.weight_decay = wd;
      Rand rand(800 + static_cast<std::uint64_t>(kind) * 10 + (wd > 0));
      std::vector<float> w(static_cast<std::size_t>(n));
      for (auto& v : w) v = rand.uniform(-1.0f, 1.0f);
      const int k = optimizer_state_per_element(kind);
      std::vector<float> st(static_cast<std::size_t>(std::max<std::int64_t>(k * n, 1)), 0.0f);
      Buffer gw(gpu, w.size() * 4), gg(gpu, w.size() * 4), gs(gpu, st.size() * 4);
      gpu.copy_to_device(gw.get(), w.data(), w.size() * 4);
      gpu.copy_to_device(gs.get(), st.data(), st.size() * 4);
      for (std::int64_t step = 1; step <= 3; ++step) {
        std::vector<float> g(w.size());
        for (auto& v : g) v = rand.uniform(-0.1f, 0.1f);
        gpu.copy_to_device(gg.get(), g.data(), g.size() * 4);
        cpu.dense_optimizer_step(w.data(), g.data(), k > 0 ? st.data() : nullptr, n, opt, step);
        gpu.dense_optimizer_step(gw.as<float>(), gg.as<float>(), k > 0 ? gs.as<float>() : nullptr,
                                 n, opt, step);
      }
      const std::string what = std::string("optimizer ") +
                               (kind == OptimizerKind::sgd       ? "sgd"
                                : kind == OptimizerKind::adagrad ? "adagrad"
                                                                 : "adam") +
                               (wd > 0 ? " wd" : "") + " (3 steps)";
      // Same double formulas from the same fp32 values, rounded once: bit for bit or an ulp.
      expect_ulps(what + " params", download_vec(gpu, gw.as<float>(), w.size()), w, 1);
      if (k > 0) expect_ulps(what + " state", download_vec(gpu, gs.as<float>(), st.size()), st, 1);
    }
  }
}

}  // namespace
}  // namespace parity::gpu::test
