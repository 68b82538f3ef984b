// The dot interaction on the GPU against the CPU reference.
#include <gtest/gtest.h>

#include "backend/gpu/runtime.h"
#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

// A custom kernel, the same in every dense math: fp32 sums of D products (fwd) or F products
// (bwd) in ascending order. Worst case D·u = 128 · 6e-8 = 7.6e-6 of the magnitude: tol 1e-5.

// Each shape twice: x0 rows padded by 4 floats (rows 16-byte aligned where D % 4 == 0: the
// 4-column kernels, or from 8 features on the register-tiled ones) and by 3 (the scalar
// kernels); both against the CPU, and the two GPU results bit for bit (the same sums in the same
// order).
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
  for (const Shape& s : {Shape{33, 16, 8}, Shape{257, 128, 26}, Shape{5, 7, 1}, Shape{64, 32, 0},
                         Shape{300, 64, 26}, Shape{19, 4, 3}, Shape{70, 64, 40}, Shape{33, 16, 35},
                         Shape{9, 256, 54}, Shape{33, 16, 5}, Shape{17, 64, 6}, Shape{9, 32, 7},
                         // 61 narrow features (the rows staged in shared memory), and 200 (the
                         // backward's row of pair gradients no longer fits there: read directly)
                         Shape{40, 16, 60}, Shape{5, 64, 199}}) {
    Rand rand(500 + seed++);
    const std::int64_t f = s.tables + 1;
    // The 200-feature backward holds its features and G in shared memory: 211 KB, which not every
    // GPU has (a block may have 160 KB on MI350X); there the shape is left out.
    const std::size_t backward_smem =
        static_cast<std::size_t>(f * (s.dim + 4) + f * ((f + 3) / 4 * 4)) * sizeof(float);
    if (f >= 200 && backward_smem > device_info().shared_memory_per_block_optin) continue;
    const std::int64_t out_cols = s.dim + f * (f - 1) / 2;
    const HostMat x0 = HostMat::random(s.batch, s.dim * f, 0, rand);
    const HostMat dout = HostMat::random(s.batch, out_cols, 1, rand);
    std::vector<HostMat> got_out, got_dx;
    for (const int pad : {4, 3}) {
      // dense and emb are column blocks of one x0 buffer, as in the engine (plus padding).
      HostMat px0(s.batch, s.dim * f, s.dim * f + pad);
      for (std::int64_t r = 0; r < s.batch; ++r)
        for (std::int64_t c = 0; c < s.dim * f; ++c) px0.at(r, c) = x0.at(r, c);
      const DevMat gx0(gpu, px0);
      const CMat dense_h = px0.cview().cols_slice(0, s.dim),
                 emb_h = px0.cview().cols_slice(s.dim, s.dim * s.tables);
      const HostMat ax0 = px0.abs();
      const CMat adense = ax0.cview().cols_slice(0, s.dim),
                 aemb = ax0.cview().cols_slice(s.dim, s.dim * s.tables);
      const CMat dense_d = CMat(gx0.view()).cols_slice(0, s.dim),
                 emb_d = CMat(gx0.view()).cols_slice(s.dim, s.dim * s.tables);

      HostMat out(s.batch, out_cols, out_cols + 2), outm = out.poisoned();
      cpu.dot_interaction_forward(dense_h, emb_h, s.tables, out.view());
      cpu.dot_interaction_forward(adense, aemb, s.tables, outm.view());
      const DevMat gout(gpu, out.poisoned());
      gpu.dot_interaction_forward(dense_d, emb_d, s.tables, gout.view());
      const std::string what = " B" + std::to_string(s.batch) + " D" + std::to_string(s.dim) +
                               " F" + std::to_string(f) + " pad " + std::to_string(pad);
      got_out.push_back(gout.download());
      expect_close("dot_interaction_forward" + what, got_out.back(), out, outm, 1e-5);

      HostMat dx(s.batch, s.dim * f, s.dim * f + pad), dxm = dx.poisoned();
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
      got_dx.push_back(gdx.download());
      expect_close("dot_interaction_backward" + what, got_dx.back(), dx, dxm, 1e-5);
    }
    for (std::int64_t r = 0; r < s.batch; ++r) {
      for (std::int64_t c = 0; c < out_cols; ++c)
        ASSERT_EQ(got_out[0].at(r, c), got_out[1].at(r, c)) << "forward, row " << r << " col " << c;
      for (std::int64_t c = 0; c < s.dim * f; ++c)
        ASSERT_EQ(got_dx[0].at(r, c), got_dx[1].at(r, c)) << "backward, row " << r << " col " << c;
    }
  }
}

// So many features that the tiled forward's output row does not fit in shared memory beside them:
// it writes the pairs where it computes them (the backward of this shape needs more shared memory
// than a block has, and says so).
TEST(DenseGpu, DotInteractionForwardOfHundredsOfFeaturesMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  const std::int64_t batch = 3, dim = 16;
  const int tables = 329;
  const std::int64_t f = tables + 1, out_cols = dim + f * (f - 1) / 2;
  Rand rand(77);
  const HostMat x0 = HostMat::random(batch, dim * f, 0, rand);
  const CMat dense_h = x0.cview().cols_slice(0, dim),
             emb_h = x0.cview().cols_slice(dim, dim * tables);
  const HostMat ax0 = x0.abs();
  HostMat out(batch, out_cols, out_cols), outm = out.poisoned();
  cpu.dot_interaction_forward(dense_h, emb_h, tables, out.view());
  cpu.dot_interaction_forward(ax0.cview().cols_slice(0, dim),
                              ax0.cview().cols_slice(dim, dim * tables), tables, outm.view());
  const DevMat gx0(gpu, x0), gout(gpu, out.poisoned());
  gpu.dot_interaction_forward(CMat(gx0.view()).cols_slice(0, dim),
                              CMat(gx0.view()).cols_slice(dim, dim * tables), tables, gout.view());
  expect_close("dot_interaction_forward, 330 features", gout.download(), out, outm, 1e-5);
}

// Under bf16 math the forward writes its output's bf16 copy beside it, for the next product: the
// product of the held output reads that copy and gives the bits it gives from an unheld copy of the
// same output (converted by the product itself). Odd widths (the copy's rows padded with zeros) and
// every kernel: the scalar, the 4-column and the register-tiled.
TEST(DenseGpu, DotInteractionWritesTheBf16CopyTheProductReads) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  struct Shape {
    std::int64_t batch, dim;
    int tables, pad;
  };
  int seed = 0;
  for (const Shape& s :
       {Shape{65, 64, 26, 4}, Shape{33, 16, 5, 4}, Shape{17, 7, 3, 3}, Shape{40, 128, 36, 4}}) {
    Rand rand(900 + seed++);
    const std::int64_t f = s.tables + 1, out_cols = s.dim + f * (f - 1) / 2, units = 24;
    HostMat x0(s.batch, s.dim * f, s.dim * f + s.pad);
    const HostMat r0 = HostMat::random(s.batch, s.dim * f, 0, rand);
    for (std::int64_t r = 0; r < s.batch; ++r)
      for (std::int64_t c = 0; c < s.dim * f; ++c) x0.at(r, c) = r0.at(r, c);
    const DevMat gx0(gpu, x0);
    const CMat dense = CMat(gx0.view()).cols_slice(0, s.dim),
               emb = CMat(gx0.view()).cols_slice(s.dim, s.dim * s.tables);
    const DevMat out(gpu, HostMat(s.batch, out_cols, out_cols));
    const DevMat w(gpu, HostMat::random(units, out_cols, 1, rand));
    const DevMat y_held(gpu, HostMat(s.batch, units, units)),
        y_plain(gpu, HostMat(s.batch, units, units));

    gpu.release_constants();
    gpu.dot_interaction_forward(dense, emb, s.tables, out.view());
    gpu.hold_constant(out.data(), static_cast<std::size_t>(s.batch * out_cols) * sizeof(float));
    gpu.linear_forward(out.view(), w.view(), nullptr, Activation::none, y_held.view());
    gpu.release_constants();
    const DevMat plain(gpu, out.download());  // the same output, not held
    gpu.linear_forward(plain.view(), w.view(), nullptr, Activation::none, y_plain.view());
    const HostMat a = y_held.download(), b = y_plain.download();
    for (std::int64_t r = 0; r < s.batch; ++r)
      for (std::int64_t c = 0; c < units; ++c)
        ASSERT_EQ(a.at(r, c), b.at(r, c))
            << "D" << s.dim << " F" << f << " pad " << s.pad << ": row " << r << " col " << c;
  }
}

}  // namespace
}  // namespace parity::gpu::test
