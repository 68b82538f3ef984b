// GpuBackend as an adapter: the embedding ops through it (layouts, the id count, output views
// with gaps, emulated narrow tables, bf16 storage), misuse, and shape errors named like the CPU's.
#include <gtest/gtest.h>

#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

TEST(DenseGpuBf16Storage, EmbeddingIntoAndFromBf16) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  CpuBackend cpu;
  ProblemSpec ps;
  ps.dims = {8, 16, 4};
  ps.rows = {100, 50, 30};
  ps.pooling = {Pooling::sum, Pooling::mean};
  ps.batch = 64;
  ps.zipf_alpha = 1.1;
  ps.kind = OptimizerKind::rowwise_adagrad;
  const Problem p = make_problem(ps, 1700);
  const std::vector<float> weights = random_values(p.weight_elems, 1701, false, DType::f32);
  const auto nids = static_cast<std::int64_t>(p.ids.size());
  Buffer gw(gpu, weights.size() * 4),
      gids(gpu, static_cast<std::size_t>(std::max<std::int64_t>(nids, 1)) * 8),
      goff(gpu, p.offsets.size() * 8);
  gpu.copy_to_device(gw.get(), weights.data(), weights.size() * 4);
  gpu.copy_to_device(gids.get(), p.ids.data(), static_cast<std::size_t>(nids) * 8);
  gpu.copy_to_device(goff.get(), p.offsets.data(), p.offsets.size() * 8);
  const SparseInput din{p.batch, static_cast<int>(p.tables.size()), gids.as<std::int64_t>(),
                        goff.as<std::int64_t>()};
  HostBf16 out(p.batch, p.out_cols, p.ld);
  HostMat mag(p.batch, p.out_cols, p.ld);
  cpu.embedding_forward(p.tables, weights.data(), p.input(), out.view());
  std::vector<float> aw(weights.size());
  for (std::size_t i = 0; i < aw.size(); ++i) aw[i] = std::fabs(weights[i]);
  cpu.embedding_forward(p.tables, aw.data(), p.input(), mag.view());
  const DevBf16 gout(gpu, out.poisoned());
  gpu.embedding_forward(p.tables, gw.as<float>(), din, gout.view());
  // fp32 sums in another order, then one rounding to bf16: at most one bf16 step apart.
  expect_close("embedding_forward into bf16", gout.download().to_float(), out.to_float(), mag,
               0x1p-7);

  // The backward from a bf16 gradient (the gradient of x0 under bf16 math), rowwise Adagrad.
  Rand rand(1702);
  const HostBf16 dout16(random_bf16_values(p.batch, p.out_cols, p.ld - p.out_cols, rand));
  std::vector<float> w_cpu = weights,
                     state(static_cast<std::size_t>(std::max<std::int64_t>(p.state_elems, 1)),
                           0.0f);
  OptimizerParams opt;
  opt.kind = OptimizerKind::rowwise_adagrad;
  opt.lr = 0.1f;
  cpu.embedding_backward_update(p.tables, w_cpu.data(), state.data(), p.input(), dout16.cview(),
                                opt);
  Buffer gs(gpu, state.size() * 4);
  gpu.fill(gs.as<float>(), static_cast<std::int64_t>(state.size()), 0.0f);
  const DevBf16 gdout(gpu, dout16);
  gpu.embedding_backward_update(p.tables, gw.as<float>(), gs.as<float>(), din, gdout.view(), opt);
  gpu.raise_input_errors();
  const auto got = download_vec(gpu, gw.as<float>(), weights.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - w_cpu[i]) <=
          1e-5 * (std::fabs(w_cpu[i]) + 1e-3)) &&
        ++bad <= 5)
      ADD_FAILURE() << "embedding update from a bf16 gradient, element " << i << ": gpu " << got[i]
                    << " cpu " << w_cpu[i];
  EXPECT_EQ(bad, 0);
}

TEST(DenseGpuBf16Storage, MisuseIsAnError) {
  PARITY_REQUIRE_GPU();
  GpuBackend fp32(DenseMath::fp32), bf16(DenseMath::bf16);
  Buffer a(fp32, 1 << 16), b(bf16, 1 << 16), wa(fp32, 1 << 16), wb(bf16, 1 << 16);
  // A bf16 activation under fp32 math: the product cannot read it.
  EXPECT_THROW(fp32.linear_forward(AMat(a.get(), DType::bf16, 4, 8), CMat(wa.as<float>(), 2, 8),
                                   nullptr, Activation::none, Mat(a.as<float>() + 4096, 4, 2)),
               Error);
  // Cross activations of mixed storage.
  const std::int64_t B = 4, N = 8, r = 2;
  const AMat x16(b.get(), DType::bf16, B, N);
  const Mat x32(b.as<float>() + 2048, B, N);
  EXPECT_THROW(
      bf16.cross_forward(x16, x32, CMat(wb.as<float>(), r, N), CMat(wb.as<float>() + 64, N, r),
                         nullptr, Mat(b.as<float>() + 4096, B, r), Mat(b.as<float>() + 6144, B, N),
                         Mat(b.as<float>() + 8192, B, N)),
      Error);
}

// The adapter onto the embedding module (whose kernels have their own tests): layouts, the id
// count, output views with gaps, and emulated bf16 tables.

TEST(DenseGpu, EmbeddingOpsThroughTheBackend) {
  PARITY_REQUIRE_GPU();
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    GpuBackend gpu;
    CpuBackend cpu;
    ProblemSpec ps;
    ps.dims = {8, 16, 4, 16};
    ps.rows = {100, 50, 30, 7};
    ps.pooling = {Pooling::sum, Pooling::mean};
    ps.batch = 64;
    ps.kind = kind;
    ps.zipf_alpha = 1.1;
    Problem p = make_problem(ps, 900 + static_cast<std::uint64_t>(kind));
    p.tables[3].dtype = DType::bf16;  // emulated: fp32 storage rounded after each update
    const auto nids = static_cast<std::int64_t>(p.ids.size());
    std::vector<float> weights = random_values(p.weight_elems, 901, false, DType::f32);
    const std::int64_t off3 = p.tables[3].weight_offset, n3 = p.tables[3].rows * p.tables[3].dim;
    cpu.round_to_dtype(weights.data() + off3, n3, DType::bf16);
    std::vector<float> state(static_cast<std::size_t>(std::max<std::int64_t>(p.state_elems, 1)),
                             0.0f);

    Buffer gw(gpu, weights.size() * 4), gs(gpu, state.size() * 4),
        gids(gpu, static_cast<std::size_t>(std::max<std::int64_t>(nids, 1)) * 8),
        goff(gpu, p.offsets.size() * 8);
    gpu.copy_to_device(gw.get(), weights.data(), weights.size() * 4);
    gpu.copy_to_device(gs.get(), state.data(), state.size() * 4);
    gpu.copy_to_device(gids.get(), p.ids.data(), static_cast<std::size_t>(nids) * 8);
    gpu.copy_to_device(goff.get(), p.offsets.data(), p.offsets.size() * 8);
    const SparseInput din{p.batch, static_cast<int>(p.tables.size()), gids.as<std::int64_t>(),
                          goff.as<std::int64_t>()};

    HostMat out(p.batch, p.out_cols, p.ld), outm = out.poisoned();
    cpu.embedding_forward(p.tables, weights.data(), p.input(), out.view());
    std::vector<float> aw(weights.size());
    for (std::size_t i = 0; i < aw.size(); ++i) aw[i] = std::fabs(weights[i]);
    cpu.embedding_forward(p.tables, aw.data(), p.input(), outm.view());
    const DevMat gout(gpu, out.poisoned());
    gpu.embedding_forward(p.tables, gw.as<float>(), din, gout.view());
    expect_close("embedding_forward (adapter)", gout.download(), out, outm, 1e-6);

    Rand rand(902 + static_cast<std::uint64_t>(kind));
    const HostMat dout = HostMat::random(p.batch, p.out_cols, p.ld - p.out_cols, rand);
    OptimizerParams opt;
    opt.kind = kind;
    opt.lr = 0.1f;
    cpu.embedding_backward_update(p.tables, weights.data(), state.data(), p.input(), dout.cview(),
                                  opt);
    const DevMat gdout(gpu, dout);
    gpu.embedding_backward_update(p.tables, gw.as<float>(), gs.as<float>(), din, gdout.view(), opt);
    gpu.raise_input_errors();
    const auto gotw = download_vec(gpu, gw.as<float>(), weights.size());
    // fp32 tables: the same sums in another order, an update of a few ulps; bf16 table: the same
    // rounding of nearly the same value (one bf16 step where the two straddle a rounding point).
    int bad = 0;
    double worst = 0;
    for (std::size_t t = 0; t < p.tables.size(); ++t) {
      const auto& tl = p.tables[t];
      for (std::int64_t i = tl.weight_offset; i < tl.weight_offset + tl.rows * tl.dim; ++i) {
        const float g = gotw[static_cast<std::size_t>(i)], e = weights[static_cast<std::size_t>(i)];
        const double tol =
            tl.dtype == DType::bf16 ? 0x1p-7 * std::fabs(e) + 1e-30 : 1e-5 * (std::fabs(e) + 1e-3);
        worst = std::max(worst, std::fabs(static_cast<double>(g) - e));
        if (!(std::fabs(static_cast<double>(g) - e) <= tol) && ++bad <= 5)
          ADD_FAILURE() << "embedding update, table " << t << " element " << i << ": gpu " << g
                        << " cpu " << e;
        if (tl.dtype == DType::bf16 && parity::round_to_dtype(g, DType::bf16) != g && ++bad <= 5)
          ADD_FAILURE() << "bf16 table element " << i << " = " << g << " is not a bf16 value";
      }
    }
    EXPECT_EQ(bad, 0);
    std::cout << "[ measured ] embedding_backward_update (adapter, optimizer "
              << static_cast<int>(kind) << "): max |gpu - cpu| = " << worst << "\n";
  }
}

// ============================================================== errors ==

TEST(DenseGpu, ShapeErrorsNameTheOp) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  Buffer b(gpu, 4096);
  const Mat m(b.as<float>(), 4, 8);
  try {
    gpu.linear_forward(m, Mat(b.as<float>(), 3, 7), nullptr, Activation::none, m);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpu.dense_optimizer_step(b.as<float>(), b.as<float>(), nullptr, 4,
                                        OptimizerParams{OptimizerKind::adam}, 1),
               Error);
  EXPECT_THROW(GpuBackend(DenseMath::fp16), Error);
}

}  // namespace
}  // namespace parity::gpu::test
