// DCNv2 cross layers on the GPU against the CPU reference, in every dense math and with bf16
// storage (dense_test_util.h says how results are judged).
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

class DenseGpuCross : public ::testing::TestWithParam<DenseMath> {};

// {24, 4104, ...}: more groups than one block holds, so the folded bias sums cut rows into tiles.
constexpr CrossShape kCrossShapes[] = {
    {70, 40, 8, 5}, {512, 144, 8, 0}, {33, 300, 64, 3}, {24, 4104, 8, 0}};

TEST_P(DenseGpuCross, ForwardMatchesCpu) {
  PARITY_REQUIRE_GPU();
  const DenseMath math = GetParam();
  const double tol = tol_for(math);
  GpuBackend gpu(math);
  CpuBackend cpu;
  int seed = 0;
  for (const CrossShape& s : kCrossShapes) {
    Rand rand(300 + seed++);
    const HostMat x0 = HostMat::random(s.batch, s.n, s.pad, rand);
    const HostMat xl = HostMat::random(s.batch, s.n, s.pad + 2, rand);
    const HostMat v = HostMat::random(s.rank, s.n, 1, rand, -0.3f, 0.3f);
    const HostMat w = HostMat::random(s.n, s.rank, 0, rand, -0.3f, 0.3f);
    const HostMat bias = random_vec(s.n, rand);
    HostMat u(s.batch, s.rank, s.rank + 1), z(s.batch, s.n, s.n + s.pad), xn(s.batch, s.n, s.n + 4);
    HostMat um = u.poisoned(), zm = z.poisoned(), xnm = xn.poisoned();
    cpu.cross_forward(x0.cview(), xl.cview(), v.cview(), w.cview(), bias.v.data(), u.view(),
                      z.view(), xn.view());
    const HostMat ab = bias.abs();
    cpu.cross_forward(x0.abs().cview(), xl.abs().cview(), v.abs().cview(), w.abs().cview(),
                      ab.v.data(), um.view(), zm.view(), xnm.view());
    const DevMat gx0(gpu, x0), gxl(gpu, xl), gv(gpu, v), gw(gpu, w), gb(gpu, bias);
    const DevMat gu(gpu, u.poisoned()), gz(gpu, z.poisoned()), gxn(gpu, xn.poisoned());
    gpu.cross_forward(gx0.view(), gxl.view(), gv.view(), gw.view(), gb.data(), gu.view(), gz.view(),
                      gxn.view());
    const std::string what = std::string(" ") + std::string(dense_math_name(math)) + " B" +
                             std::to_string(s.batch) + " N" + std::to_string(s.n) + " r" +
                             std::to_string(s.rank);
    expect_close("cross_forward u" + what, gu.download(), u, um, tol);
    expect_close("cross_forward z" + what, gz.download(), z, zm, 3 * tol);
    expect_close("cross_forward x_next" + what, gxn.download(), xn, xnm, 3 * tol);
  }
}

TEST_P(DenseGpuCross, BackwardMatchesCpu) {
  PARITY_REQUIRE_GPU();
  const DenseMath math = GetParam();
  const double tol = tol_for(math);
  GpuBackend gpu(math);
  CpuBackend cpu;
  int seed = 0;
  for (const CrossShape& s : kCrossShapes) {
    // Modes: plain, the last layer of a stack (starts dx0), layer 0 (adds dxl into dx0), both.
    for (int m = 0; m < 4; ++m) {
      const bool give_du = m == 0 || m == 3;
      const Backend::CrossBackwardMode mode{m == 1 || m == 3, m >= 2};
      Rand rand(400 + seed++);
      const HostMat x0 = HostMat::random(s.batch, s.n, s.pad, rand);
      const HostMat xl = HostMat::random(s.batch, s.n, s.pad, rand);
      const HostMat v = HostMat::random(s.rank, s.n, 0, rand, -0.3f, 0.3f);
      const HostMat w = HostMat::random(s.n, s.rank, 2, rand, -0.3f, 0.3f);
      const HostMat u = HostMat::random(s.batch, s.rank, 0, rand);
      const HostMat z = HostMat::random(s.batch, s.n, 1, rand);
      const HostMat g = HostMat::random(s.batch, s.n, s.pad, rand);
      const HostMat dx0_init = HostMat::random(s.batch, s.n, 3, rand);
      HostMat dx0 = dx0_init, dxl(s.batch, s.n, s.n + 2), dv(s.rank, s.n, s.n),
              dw(s.n, s.rank, s.rank + 1), db(1, s.n, s.n), du(s.batch, s.rank, s.rank);
      HostMat dx0m = dx0_init.abs(), dxlm = dxl.poisoned(), dvm = dv.poisoned(),
              dwm = dw.poisoned(), dbm = db.poisoned(), dum = du.poisoned();
      cpu.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                         g.cview(), dx0.view(), dxl.view(), dv.view(), dw.view(), db.v.data(),
                         du.view(), mode);
      cpu.cross_backward(x0.abs().cview(), xl.abs().cview(), v.abs().cview(), w.abs().cview(),
                         u.abs().cview(), z.abs().cview(), g.abs().cview(), dx0m.view(),
                         dxlm.view(), dvm.view(), dwm.view(), dbm.v.data(), dum.view(), mode);
      const DevMat gx0(gpu, x0), gxl(gpu, xl), gv(gpu, v), gw(gpu, w), gu(gpu, u), gz(gpu, z),
          gg(gpu, g);
      const DevMat gdx0(gpu, dx0_init), gdxl(gpu, dxl.poisoned()), gdv(gpu, dv.poisoned()),
          gdw(gpu, dw.poisoned()), gdb(gpu, db.poisoned()), gdu(gpu, du.poisoned());
      gpu.cross_backward(gx0.view(), gxl.view(), gv.view(), gw.view(), gu.view(), gz.view(),
                         gg.view(), gdx0.view(), mode.xl_is_x0 ? Mat() : gdxl.view(), gdv.view(),
                         gdw.view(), gdb.data(), give_du ? gdu.view() : Mat(), mode);
      const std::string what = std::string(" ") + std::string(dense_math_name(math)) + " B" +
                               std::to_string(s.batch) + " N" + std::to_string(s.n) + " r" +
                               std::to_string(s.rank) + " mode " + std::to_string(m);
      // dx0 += g ⊙ z is elementwise in double on both sides: an ulp of its magnitude; with
      // xl_is_x0 it also holds the product du · v.
      expect_close("cross_backward dx0" + what, gdx0.download(), dx0, dx0m,
                   mode.xl_is_x0 ? 3 * tol : 1e-6);
      expect_close("cross_backward dw" + what, gdw.download(), dw, dwm, tol);
      expect_close("cross_backward dbias" + what, gdb.download(), db, dbm, 1e-6);
      expect_close("cross_backward dv" + what, gdv.download(), dv, dvm, 3 * tol);
      if (!mode.xl_is_x0)
        expect_close("cross_backward dxl" + what, gdxl.download(), dxl, dxlm, 3 * tol);
      if (give_du) expect_close("cross_backward du" + what, gdu.download(), du, dum, tol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dense, DenseGpuCross,
                         ::testing::Values(DenseMath::fp32, DenseMath::tf32, DenseMath::bf16),
                         math_label);

// Under bf16 math the engine stores activations in bf16 (Backend::activation_dtype). The ops that
// read or write them take bf16 views; the CPU reference takes the same views (it widens them
// exactly and rounds its fp32 results once), so GPU and CPU see the same stored inputs and the
// same rule for stored outputs. An output stored in bf16 may differ by one bf16 step (2^-8 of its
// value, below tol · magnitude) where the two results straddle a rounding point.

constexpr CrossShape kBf16CrossShapes[] = {{70, 40, 8, 5},    {512, 144, 8, 0},  {33, 300, 64, 3},
                                           {3000, 144, 8, 0}, {40, 9728, 16, 0}, {20, 1031, 8, 1}};

TEST(DenseGpuBf16Storage, CrossMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  CpuBackend cpu;
  const double tol = tol_for(DenseMath::bf16);
  int seed = 0;
  for (const CrossShape& s : kBf16CrossShapes) {
    Rand rand(1600 + seed++);
    const HostMat x0 = random_bf16_values(s.batch, s.n, s.pad, rand);
    const HostMat xl = random_bf16_values(s.batch, s.n, s.pad + 2, rand);
    const HostMat v = HostMat::random(s.rank, s.n, 1, rand, -0.3f, 0.3f);
    const HostMat w = HostMat::random(s.n, s.rank, 0, rand, -0.3f, 0.3f);
    const HostMat bias = random_vec(s.n, rand);
    const HostBf16 x016(x0), xl16(xl);
    HostBf16 u(s.batch, s.rank, s.rank + 1), z(s.batch, s.n, s.n + s.pad),
        xn(s.batch, s.n, s.n + 4);
    HostMat um(s.batch, s.rank, s.rank + 1), zm(s.batch, s.n, s.n + s.pad),
        xnm(s.batch, s.n, s.n + 4);
    cpu.cross_forward(x016.cview(), xl16.cview(), v.cview(), w.cview(), bias.v.data(), u.view(),
                      z.view(), xn.view());
    const HostMat ab = bias.abs();
    cpu.cross_forward(x0.abs().cview(), xl.abs().cview(), v.abs().cview(), w.abs().cview(),
                      ab.v.data(), um.view(), zm.view(), xnm.view());
    const DevBf16 gx0(gpu, x016), gxl(gpu, xl16), gu(gpu, u.poisoned()), gz(gpu, z.poisoned()),
        gxn(gpu, xn.poisoned());
    const DevMat gv(gpu, v), gw(gpu, w), gb(gpu, bias);
    gpu.cross_forward(gx0.view(), gxl.view(), gv.view(), gw.view(), gb.data(), gu.view(), gz.view(),
                      gxn.view());
    const std::string what = " bf16 storage B" + std::to_string(s.batch) + " N" +
                             std::to_string(s.n) + " r" + std::to_string(s.rank);
    expect_close("cross_forward u" + what, gu.download().to_float(), u.to_float(), um, tol);
    expect_close("cross_forward z" + what, gz.download().to_float(), z.to_float(), zm, 3 * tol);
    expect_close("cross_forward x_next" + what, gxn.download().to_float(), xn.to_float(), xnm,
                 3 * tol);

    // Backward from the CPU's stored u and z, every mode, with the gradients g, dx0 and dxl in
    // fp32 and in bf16 (as the engine stores them under bf16 math).
    for (int m = 0; m < 8; ++m) {
      const Backend::CrossBackwardMode mode{(m & 1) != 0, (m & 2) != 0};
      const bool g16 = (m & 4) != 0;
      const HostMat g = g16 ? random_bf16_values(s.batch, s.n, s.pad, rand)
                            : HostMat::random(s.batch, s.n, s.pad, rand);
      const HostMat dx0_init =
          g16 ? random_bf16_values(s.batch, s.n, 3, rand) : HostMat::random(s.batch, s.n, 3, rand);
      HostMat dx0 = dx0_init, dxl(s.batch, s.n, s.n + 2), dv(s.rank, s.n, s.n),
              dw(s.n, s.rank, s.rank + 1), db(1, s.n, s.n);
      HostMat dx0m = dx0_init.abs(), dxlm = dxl.poisoned(), dvm = dv.poisoned(),
              dwm = dw.poisoned(), dbm = db.poisoned();
      HostMat du(s.batch, s.rank, s.rank), dum = du.poisoned();
      const HostBf16 g_16(g);
      HostBf16 dxl16(s.batch, s.n, s.n + 2), dx016(dx0_init);
      cpu.cross_backward(x016.cview(), xl16.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                         g16 ? g_16.cview() : CAMat(g.cview()),
                         g16 ? dx016.view() : AMat(dx0.view()),
                         g16 ? dxl16.view() : AMat(dxl.view()), dv.view(), dw.view(), db.v.data(),
                         du.view(), mode);
      if (g16) {
        dxl = dxl16.to_float();
        dx0 = dx016.to_float();
      }
      cpu.cross_backward(x0.abs().cview(), xl.abs().cview(), v.abs().cview(), w.abs().cview(),
                         u.to_float().abs().cview(), z.to_float().abs().cview(), g.abs().cview(),
                         dx0m.view(), dxlm.view(), dvm.view(), dwm.view(), dbm.v.data(), dum.view(),
                         mode);
      const DevBf16 gus(gpu, u), gzs(gpu, z), gg16(gpu, g_16), gdxl16(gpu, dxl16.poisoned()),
          gdx016(gpu, HostBf16(dx0_init));
      const DevMat gg(gpu, g), gdx0(gpu, dx0_init), gdxl(gpu, dxl.poisoned()),
          gdv(gpu, dv.poisoned()), gdw(gpu, dw.poisoned()), gdb(gpu, db.poisoned());
      const AMat gpu_dxl = mode.xl_is_x0 ? AMat() : g16 ? gdxl16.view() : AMat(gdxl.view());
      gpu.cross_backward(gx0.view(), gxl.view(), gv.view(), gw.view(), gus.view(), gzs.view(),
                         g16 ? CAMat(gg16.view()) : CAMat(gg.view()),
                         g16 ? gdx016.view() : AMat(gdx0.view()), gpu_dxl, gdv.view(), gdw.view(),
                         gdb.data(), Mat(), mode);
      const std::string wm =
          what + " mode " + std::to_string(m & 3) + (g16 ? " bf16 gradients" : "");
      // dx0 in bf16: the same sum rounded once more (layer 0: once per part); dx0m is its
      // magnitude.
      expect_close("cross_backward dx0" + wm, g16 ? gdx016.download().to_float() : gdx0.download(),
                   dx0, dx0m,
                   mode.xl_is_x0 ? 3 * tol
                   : g16         ? 0x1p-7
                                 : 1e-6);
      expect_close("cross_backward dw" + wm, gdw.download(), dw, dwm, tol);
      expect_close("cross_backward dbias" + wm, gdb.download(), db, dbm, 1e-6);
      expect_close("cross_backward dv" + wm, gdv.download(), dv, dvm, 3 * tol);
      if (!mode.xl_is_x0)
        expect_close("cross_backward dxl" + wm,
                     g16 ? gdxl16.download().to_float() : gdxl.download(), dxl, dxlm, 3 * tol);
    }
  }
}

}  // namespace
}  // namespace parity::gpu::test
