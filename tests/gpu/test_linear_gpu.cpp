// Linear layers on the GPU against the CPU reference, in every dense math and with bf16 storage
// (dense_test_util.h says how results are judged).
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

class DenseGpuLinear : public ::testing::TestWithParam<DenseMath> {};

constexpr LinearShape kLinearShapes[] = {
    {67, 45, 33, 5, 2, 7},     // odd sizes, padded views (misaligned rows)
    {512, 256, 128, 0, 0, 0},  // the engine's shapes
    {300, 13, 1, 3, 0, 1},     // a logit layer
};

TEST_P(DenseGpuLinear, ForwardMatchesCpu) {
  PARITY_REQUIRE_GPU();
  const DenseMath math = GetParam();
  GpuBackend gpu(math);
  CpuBackend cpu;
  int seed = 0;
  for (const LinearShape& s : kLinearShapes) {
    for (Activation act : {Activation::none, Activation::relu}) {
      for (bool with_bias : {false, true}) {
        Rand rand(100 + seed++);
        const HostMat x = HostMat::random(s.batch, s.in, s.pad_x, rand);
        const HostMat w = HostMat::random(s.out, s.in, s.pad_w, rand, -0.5f, 0.5f);
        const HostMat bias = random_vec(s.out, rand);
        HostMat ref(s.batch, s.out, s.out + s.pad_y), mag = ref.poisoned();
        cpu.linear_forward(x.cview(), w.cview(), with_bias ? bias.v.data() : nullptr, act,
                           ref.view());
        const HostMat abias = bias.abs();
        cpu.linear_forward(x.abs().cview(), w.abs().cview(), with_bias ? abias.v.data() : nullptr,
                           Activation::none, mag.view());
        const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias), dy(gpu, ref.poisoned());
        gpu.linear_forward(dx.view(), dw.view(), with_bias ? db.data() : nullptr, act, dy.view());
        const std::string what =
            std::string("linear_forward ") + std::string(dense_math_name(math)) + " [" +
            std::to_string(s.batch) + "x" + std::to_string(s.in) + "]x[" + std::to_string(s.out) +
            "]" + (act == Activation::relu ? " relu" : "") + (with_bias ? " bias" : "");
        expect_close(what, dy.download(), ref, mag, tol_for(math));
      }
    }
  }
  std::cout << "[ measured ] linear_forward " << dense_math_name(math) << ": "
            << gpu.counters().blas_plans << " BLAS plans, " << gpu.counters().epilogue_fallbacks
            << " epilogue fallbacks\n";
}

TEST_P(DenseGpuLinear, BackwardMatchesCpu) {
  PARITY_REQUIRE_GPU();
  const DenseMath math = GetParam();
  GpuBackend gpu(math);
  CpuBackend cpu;
  int seed = 0;
  for (const LinearShape& s : kLinearShapes) {
    for (Activation act : {Activation::none, Activation::relu}) {
      for (bool want_dx : {true, false}) {
        Rand rand(200 + seed++);
        const HostMat x = HostMat::random(s.batch, s.in, s.pad_x, rand);
        const HostMat w = HostMat::random(s.out, s.in, s.pad_w, rand, -0.5f, 0.5f);
        const HostMat bias = random_vec(s.out, rand, -0.2f, 0.2f);
        HostMat y(s.batch, s.out, s.out + s.pad_y);  // the saved output, as the forward made it
        cpu.linear_forward(x.cview(), w.cview(), bias.v.data(), act, y.view());
        const HostMat dy = HostMat::random(s.batch, s.out, s.pad_y + 1, rand);
        HostMat dx_ref(s.batch, s.in, s.in + 3), dw_ref(s.out, s.in, s.in + 1),
            db_ref(1, s.out, s.out);
        HostMat dx_mag = dx_ref.poisoned(), dw_mag = dw_ref.poisoned(), db_mag = db_ref.poisoned();
        cpu.linear_backward(x.cview(), w.cview(), y.cview(), dy.cview(), act,
                            want_dx ? dx_ref.view() : Mat(), dw_ref.view(), db_ref.v.data());
        cpu.linear_backward(x.abs().cview(), w.abs().cview(), y.cview(), dy.abs().cview(), act,
                            want_dx ? dx_mag.view() : Mat(), dw_mag.view(), db_mag.v.data());
        const DevMat gx(gpu, x), gw(gpu, w), gy(gpu, y), gdy(gpu, dy);
        const DevMat gdx(gpu, dx_ref.poisoned()), gdw(gpu, dw_ref.poisoned()),
            gdb(gpu, db_ref.poisoned());
        gpu.linear_backward(gx.view(), gw.view(), gy.view(), gdy.view(), act,
                            want_dx ? gdx.view() : Mat(), gdw.view(), gdb.data());
        const std::string what = std::string(" ") + std::string(dense_math_name(math)) + " [" +
                                 std::to_string(s.batch) + "x" + std::to_string(s.in) + "]x[" +
                                 std::to_string(s.out) + "]" +
                                 (act == Activation::relu ? " relu" : "");
        expect_close("linear_backward dw" + what, gdw.download(), dw_ref, dw_mag, tol_for(math));
        // The bias gradient is a column sum of the fp32 gradient in every math (double
        // accumulation).
        expect_close("linear_backward dbias" + what, gdb.download(), db_ref, db_mag, 1e-6);
        if (want_dx)
          expect_close("linear_backward dx" + what, gdx.download(), dx_ref, dx_mag, tol_for(math));
      }
    }
  }
}

// The product's epilogue as a kernel of its own (gemm_epilogue.cu): for an empty inner dimension
// (y = act(bias), no library call), fp32 and bf16 outputs; and after the library's product where
// it could not fuse the bias (blas.cpp never fuses a bias that is not 16-byte aligned: the kernel
// adds it after the product). Each against the CPU reference.
TEST(DenseGpuEpilogue, EmptyProductsAndUnfusedBiasMatchCpu) {
  PARITY_REQUIRE_GPU();
  CpuBackend cpu;
  Rand rand(4242);
  const std::int64_t batch = 97, out = 45, in = 33;
  // [1, out + 1]: the bias starts one float in, 4-byte aligned only.
  const HostMat bias_buf = random_vec(out + 1, rand);
  const HostMat bias = random_vec(out, rand);
  for (Activation act : {Activation::none, Activation::relu}) {
    const std::string name = act == Activation::relu ? " relu" : "";
    // k = 0 into fp32 and into bf16: y = act(bias).
    for (DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
      GpuBackend gpu(math);
      const HostMat x(batch, 0, 1), w(out, 0, 1);
      HostMat ref(batch, out, out + 3);
      cpu.linear_forward(x.cview(), w.cview(), bias.v.data(), act, ref.view());
      const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias);
      const std::string what =
          std::string("empty product ") + std::string(dense_math_name(math)) + name;
      if (math == DenseMath::fp32) {
        const DevMat dy(gpu, ref.poisoned());
        gpu.linear_forward(dx.view(), dw.view(), db.data(), act, dy.view());
        expect_close(what, dy.download(), ref, ref.abs(), 1e-7);
      } else {
        const DevBf16 dy(gpu, HostBf16(ref).poisoned());
        gpu.linear_forward(dx.view(), dw.view(), db.data(), act, dy.view());
        // bf16 output: the bias rounded to bf16, then the sum rounded once.
        expect_close(what, dy.download().to_float(), ref, ref.abs(), 1.0 / 128);
      }
      EXPECT_EQ(gpu.counters().blas_plans, 0) << what << ": an empty product needs no library plan";
    }
    // An fp32 product whose bias the library cannot fuse.
    GpuBackend gpu(DenseMath::fp32);
    const HostMat x = HostMat::random(batch, in, 2, rand);
    const HostMat w = HostMat::random(out, in, 1, rand, -0.5f, 0.5f);
    HostMat ref(batch, out, out + 3), mag = ref.poisoned();
    cpu.linear_forward(x.cview(), w.cview(), bias_buf.v.data() + 1, act, ref.view());
    const HostMat abias = bias_buf.abs();
    cpu.linear_forward(x.abs().cview(), w.abs().cview(), abias.v.data() + 1, Activation::none,
                       mag.view());
    const DevMat dx(gpu, x), dw(gpu, w), db(gpu, bias_buf), dy(gpu, ref.poisoned());
    gpu.linear_forward(dx.view(), dw.view(), db.data() + 1, act, dy.view());
    expect_close("unfused bias fp32" + name, dy.download(), ref, mag, tol_for(DenseMath::fp32));
  }
}

INSTANTIATE_TEST_SUITE_P(Dense, DenseGpuLinear,
                         ::testing::Values(DenseMath::fp32, DenseMath::tf32, DenseMath::bf16),
                         math_label);

// Under bf16 math the engine stores activations in bf16 (Backend::activation_dtype). The ops that
// read or write them take bf16 views; the CPU reference takes the same views (it widens them
// exactly and rounds its fp32 results once), so GPU and CPU see the same stored inputs and the
// same rule for stored outputs. An output stored in bf16 may differ by one bf16 step (2^-8 of its
// value, below tol · magnitude) where the two results straddle a rounding point.

// Besides the shapes above: more rows than the folded column sums have lanes (each lane then sums
// several rows), widths whose groups do not fit one block (the folded sums in column tiles: groups
// of 4, and 1031 single columns) and an odd width (scalar loads).

constexpr LinearShape kBf16LinearShapes[] = {{67, 45, 33, 5, 2, 7},   {512, 256, 128, 0, 0, 0},
                                             {300, 13, 1, 3, 0, 1},   {3000, 40, 24, 0, 0, 0},
                                             {64, 16, 4100, 0, 0, 0}, {301, 33, 37, 1, 2, 3},
                                             {50, 8, 1031, 0, 0, 1}};

// Products whose row count changes every call (the token count of jagged sequence batches):
// every result right, and the library's heuristic asked once for the first shape and once for
// the shape class the rest share, not once per shape.
TEST(DenseGpuEpilogue, ChangingRowsShareTheirClassAlgorithm) {
  PARITY_REQUIRE_GPU();
  for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
    GpuBackend gpu(math);
    CpuBackend cpu;
    Rand rand(17);
    const HostMat w = HostMat::random(96, 64, 0, rand), bias = random_vec(96, rand);
    const DevMat dw(gpu, w), db(gpu, bias);
    const std::int64_t before = gpu.counters().blas_heuristics;
    for (std::int64_t rows = 1100; rows < 1500; rows += 23) {  // one class: (1024, 1536]
      const HostMat x = HostMat::random(rows, 64, 0, rand);
      HostMat ref(rows, 96, 96), mag = ref.poisoned();
      cpu.linear_forward(x.cview(), w.cview(), bias.v.data(), Activation::relu, ref.view());
      const HostMat abias = bias.abs();
      cpu.linear_forward(x.abs().cview(), w.abs().cview(), abias.v.data(), Activation::none,
                         mag.view());
      const DevMat dx(gpu, x), dy(gpu, ref.poisoned());
      gpu.linear_forward(dx.view(), dw.view(), db.data(), Activation::relu, dy.view());
      expect_close(std::string("linear_forward ") + std::string(dense_math_name(math)) + " rows " +
                       std::to_string(rows),
                   dy.download(), ref, mag, tol_for(math));
    }
    EXPECT_EQ(gpu.counters().blas_heuristics - before, 2) << dense_math_name(math);
  }
}

TEST(DenseGpuBf16Storage, LinearMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  CpuBackend cpu;
  EXPECT_EQ(gpu.activation_dtype(), DType::bf16);
  EXPECT_EQ(cpu.activation_dtype(), DType::f32);
  const double tol = tol_for(DenseMath::bf16);
  int seed = 0;
  for (const LinearShape& s : kBf16LinearShapes) {
    for (Activation act : {Activation::none, Activation::relu}) {
      Rand rand(1500 + seed++);
      const HostMat x = random_bf16_values(s.batch, s.in, s.pad_x, rand);
      const HostMat w = HostMat::random(s.out, s.in, s.pad_w, rand, -0.5f, 0.5f);
      const HostMat bias = random_vec(s.out, rand);
      const HostBf16 x16(x);
      // Forward: y stored in bf16 on both sides.
      HostBf16 y16(s.batch, s.out, s.out + s.pad_y);
      HostMat mag(s.batch, s.out, s.out + s.pad_y);
      cpu.linear_forward(x16.cview(), w.cview(), bias.v.data(), act, y16.view());
      const HostMat ab = bias.abs();
      cpu.linear_forward(x.abs().cview(), w.abs().cview(), ab.v.data(), Activation::none,
                         mag.view());
      const DevBf16 gx(gpu, x16), gy(gpu, y16.poisoned());
      const DevMat gw(gpu, w), gb(gpu, bias);
      gpu.linear_forward(gx.view(), gw.view(), gb.data(), act, gy.view());
      const std::string what = " bf16 storage [" + std::to_string(s.batch) + "x" +
                               std::to_string(s.in) + "]x[" + std::to_string(s.out) + "]" +
                               (act == Activation::relu ? " relu" : "");
      expect_close("linear_forward y" + what, gy.download().to_float(), y16.to_float(), mag, tol);
      // Backward from the CPU's stored y (both sides read the same mask).
      const HostMat dy = HostMat::random(s.batch, s.out, s.pad_y + 1, rand);
      HostMat dx(s.batch, s.in, s.in + 3), dw(s.out, s.in, s.in + 1), db(1, s.out, s.out);
      HostMat dxm = dx.poisoned(), dwm = dw.poisoned(), dbm = db.poisoned();
      cpu.linear_backward(x16.cview(), w.cview(), y16.cview(), dy.cview(), act, dx.view(),
                          dw.view(), db.v.data());
      cpu.linear_backward(x.abs().cview(), w.abs().cview(), y16.cview(), dy.abs().cview(), act,
                          dxm.view(), dwm.view(), dbm.v.data());
      const DevBf16 gy_saved(gpu, y16);
      const DevMat gdy(gpu, dy), gdx(gpu, dx.poisoned()), gdw(gpu, dw.poisoned()),
          gdb(gpu, db.poisoned());
      gpu.linear_backward(gx.view(), gw.view(), gy_saved.view(), gdy.view(), act, gdx.view(),
                          gdw.view(), gdb.data());
      expect_close("linear_backward dw" + what, gdw.download(), dw, dwm, tol);
      expect_close("linear_backward dx" + what, gdx.download(), dx, dxm, tol);
      expect_close("linear_backward dbias" + what, gdb.download(), db, dbm, 1e-6);
      // dy and dx stored in bf16 (the gradients of the interaction's input and output under bf16
      // math).
      const HostBf16 dy16(dy);
      HostBf16 dx16(s.batch, s.in, s.in + 3);
      HostMat dw2(s.out, s.in, s.in + 1), db2(1, s.out, s.out);
      cpu.linear_backward(x16.cview(), w.cview(), y16.cview(), dy16.cview(), act, dx16.view(),
                          dw2.view(), db2.v.data());
      const DevBf16 gdx16(gpu, dx16.poisoned()), gdy16(gpu, dy16);
      const DevMat gdw2(gpu, dw2.poisoned()), gdb2(gpu, db2.poisoned());
      gpu.linear_backward(gx.view(), gw.view(), gy_saved.view(), gdy16.view(), act, gdx16.view(),
                          gdw2.view(), gdb2.data());
      expect_close("linear_backward dx (bf16 dy, dx)" + what, gdx16.download().to_float(),
                   dx16.to_float(), dxm, tol);
      expect_close("linear_backward dw (bf16 dy)" + what, gdw2.download(), dw2, dwm, tol);
      expect_close("linear_backward dbias (bf16 dy)" + what, gdb2.download(), db2, dbm, 1e-6);
    }
  }
}

}  // namespace
}  // namespace parity::gpu::test
