// The dot interaction on the GPU against the CPU reference.
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

// A custom kernel, the same in every dense math: fp32 sums of D products (fwd) or F products
// (bwd) in ascending order. Worst case D·u = 128 · 6e-8 = 7.6e-6 of the magnitude: tol 1e-5.

TEST(DenseGpu, DotInteractionMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  struct Shape {
    std::int64_t batch;
    std::int64_t dim;
    int tables;
  };
  int seed = 0;
  for (const Shape& s : {Shape{33, 16, 8}, Shape{257, 128, 26}, Shape{5, 7, 1}, Shape{64, 32, 0}}) {
    Rand rand(500 + seed++);
    const std::int64_t f = s.tables + 1;
    const std::int64_t out_cols = s.dim + f * (f - 1) / 2;
    // dense and emb are column blocks of one x0 buffer, as in the engine (plus padding).
    HostMat x0 = HostMat::random(s.batch, s.dim * f, 3, rand);
    const DevMat gx0(gpu, x0);
    const CMat dense_h = x0.cview().cols_slice(0, s.dim),
               emb_h = x0.cview().cols_slice(s.dim, s.dim * s.tables);
    const HostMat ax0 = x0.abs();
    const CMat adense = ax0.cview().cols_slice(0, s.dim),
               aemb = ax0.cview().cols_slice(s.dim, s.dim * s.tables);
    const CMat dense_d = CMat(gx0.view()).cols_slice(0, s.dim),
               emb_d = CMat(gx0.view()).cols_slice(s.dim, s.dim * s.tables);

    HostMat out(s.batch, out_cols, out_cols + 2), outm = out.poisoned();
    cpu.dot_interaction_forward(dense_h, emb_h, s.tables, out.view());
    cpu.dot_interaction_forward(adense, aemb, s.tables, outm.view());
    const DevMat gout(gpu, out.poisoned());
    gpu.dot_interaction_forward(dense_d, emb_d, s.tables, gout.view());
    const std::string what =
        " B" + std::to_string(s.batch) + " D" + std::to_string(s.dim) + " F" + std::to_string(f);
    expect_close("dot_interaction_forward" + what, gout.download(), out, outm, 1e-5);

    const HostMat dout = HostMat::random(s.batch, out_cols, 1, rand);
    HostMat dx(s.batch, s.dim * f, s.dim * f + 4), dxm = dx.poisoned();
    cpu.dot_interaction_backward(dense_h, emb_h, s.tables, dout.cview(),
                                 dx.view().cols_slice(0, s.dim),
                                 dx.view().cols_slice(s.dim, s.dim * s.tables));
    cpu.dot_interaction_backward(adense, aemb, s.tables, dout.abs().cview(),
                                 dxm.view().cols_slice(0, s.dim),
                                 dxm.view().cols_slice(s.dim, s.dim * s.tables));
    const DevMat gdout(gpu, dout), gdx(gpu, dx.poisoned());
    gpu.dot_interaction_backward(dense_d, emb_d, s.tables, gdout.view(),
                                 gdx.view().cols_slice(0, s.dim),
                                 gdx.view().cols_slice(s.dim, s.dim * s.tables));
    expect_close("dot_interaction_backward" + what, gdx.download(), dx, dxm, 1e-5);
  }
}

}  // namespace
}  // namespace parity::gpu::test
