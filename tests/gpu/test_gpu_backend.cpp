// GpuBackend as an adapter: the embedding ops through it (layouts, the id count, output views
// with gaps, tables of mixed storage types, bf16 activations), misuse, and shape errors named like
// the CPU's.
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
  cpu.embedding_forward(p.tables, TableWeights::all(DType::f32, weights.data()), p.input(),
                        out.view());
  std::vector<float> aw(weights.size());
  for (std::size_t i = 0; i < aw.size(); ++i) aw[i] = std::fabs(weights[i]);
  cpu.embedding_forward(p.tables, TableWeights::all(DType::f32, aw.data()), p.input(), mag.view());
  const DevBf16 gout(gpu, out.poisoned());
  gpu.embedding_forward(p.tables, TableWeights::all(DType::f32, gw.get()), din, gout.view());
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
  cpu.embedding_backward_update(p.tables, TableWeights::all(DType::f32, w_cpu.data()), state.data(),
                                p.input(), dout16.cview(), opt, {});
  Buffer gs(gpu, state.size() * 4);
  gpu.fill(gs.as<float>(), static_cast<std::int64_t>(state.size()), 0.0f);
  const DevBf16 gdout(gpu, dout16);
  gpu.embedding_backward_update(p.tables, TableWeights::all(DType::f32, gw.get()), gs.as<float>(),
                                din, gdout.view(), opt, {});
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
// count, output views with gaps, and tables of three storage types interleaved (fp32, fp16, fp32,
// bf16), each in its own type's buffer as the engine lays them out.

// A problem's tables given storage types, each table at its offset in its type's buffer, with
// host values: uniform in [-1, 1), or (dyadic) multiples of 1/8 in [-1, 1], exact in every type.
struct MixedTables {
  std::vector<TableLayout> tables;
  std::vector<float> f32;
  std::vector<std::uint16_t> f16, bf16;

  MixedTables(const Problem& p, const std::vector<DType>& types, std::uint64_t seed, bool dyadic)
      : tables(p.tables) {
    Rand rand(seed, 3);
    for (std::size_t t = 0; t < tables.size(); ++t) {
      TableLayout& tl = tables[t];
      tl.dtype = types[t % types.size()];
      const std::int64_t n = tl.rows * tl.dim;
      tl.weight_offset = size(tl.dtype);
      for (std::int64_t i = 0; i < n; ++i) {
        const float v =
            dyadic ? static_cast<float>(rand.integer(-8, 8)) / 8 : rand.uniform(-1.0f, 1.0f);
        if (tl.dtype == DType::f32) f32.push_back(v);
        if (tl.dtype == DType::f16) f16.push_back(half_bits(v));
        if (tl.dtype == DType::bf16) bf16.push_back(bf16_bits(v));
      }
    }
  }
  std::int64_t size(DType t) const {
    return static_cast<std::int64_t>(t == DType::f32   ? f32.size()
                                     : t == DType::f16 ? f16.size()
                                                       : bf16.size());
  }
  TableWeights host() { return {f32.data(), f16.data(), bf16.data()}; }
  // |w| of every table (the scale of a forward's rounding error), all fp32.
  std::vector<float> magnitudes(std::vector<TableLayout>& layouts) const {
    std::vector<float> m;
    layouts = tables;
    for (TableLayout& tl : layouts) {
      const std::int64_t off = tl.weight_offset;
      const DType dt = tl.dtype;
      tl.weight_offset = static_cast<std::int64_t>(m.size());
      tl.dtype = DType::f32;
      for (std::int64_t i = 0; i < tl.rows * tl.dim; ++i) {
        const float v = dt == DType::f32   ? f32[static_cast<std::size_t>(off + i)]
                        : dt == DType::f16 ? half_to_float(f16[static_cast<std::size_t>(off + i)])
                                           : bf16_to_float(bf16[static_cast<std::size_t>(off + i)]);
        m.push_back(std::fabs(v));
      }
    }
    return m;
  }
};

// The same tables in GPU memory.
struct DeviceTables {
  Buffer f32, f16, bf16;
  DeviceTables(Backend& gpu, const MixedTables& m)
      : f32(gpu, std::max<std::size_t>(m.f32.size(), 1) * 4),
        f16(gpu, std::max<std::size_t>(m.f16.size(), 1) * 2),
        bf16(gpu, std::max<std::size_t>(m.bf16.size(), 1) * 2) {
    gpu.copy_to_device(f32.get(), m.f32.data(), m.f32.size() * 4);
    gpu.copy_to_device(f16.get(), m.f16.data(), m.f16.size() * 2);
    gpu.copy_to_device(bf16.get(), m.bf16.data(), m.bf16.size() * 2);
  }
  TableWeights weights() const { return {f32.get(), f16.get(), bf16.get()}; }
  void download(Backend& gpu, MixedTables& m) const {
    gpu.copy_to_host(m.f32.data(), f32.get(), m.f32.size() * 4);
    gpu.copy_to_host(m.f16.data(), f16.get(), m.f16.size() * 2);
    gpu.copy_to_host(m.bf16.data(), bf16.get(), m.bf16.size() * 2);
  }
};

struct DeviceCsr {
  Buffer ids, offsets;
  SparseInput in;
  DeviceCsr(Backend& gpu, const Problem& p)
      : ids(gpu, std::max<std::size_t>(p.ids.size(), 1) * 8), offsets(gpu, p.offsets.size() * 8) {
    gpu.copy_to_device(ids.get(), p.ids.data(), p.ids.size() * 8);
    gpu.copy_to_device(offsets.get(), p.offsets.data(), p.offsets.size() * 8);
    in = SparseInput{p.batch, static_cast<int>(p.tables.size()), ids.as<std::int64_t>(),
                     offsets.as<std::int64_t>()};
  }
};

const std::vector<DType> kMixed = {DType::f32, DType::f16, DType::f32, DType::bf16};

TEST(DenseGpu, EmbeddingOpsThroughTheBackend) {
  PARITY_REQUIRE_GPU();
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    GpuBackend gpu;
    CpuBackend cpu;
    ProblemSpec ps;
    ps.dims = {8, 16, 4, 16, 12};
    ps.rows = {100, 50, 30, 7, 40};
    ps.pooling = {Pooling::sum, Pooling::mean};
    ps.batch = 64;
    ps.kind = kind;
    ps.zipf_alpha = 1.1;
    const Problem p = make_problem(ps, 900 + static_cast<std::uint64_t>(kind));
    MixedTables host(p, kMixed, 901, false);
    const DeviceTables dev(gpu, host);
    std::vector<float> state(static_cast<std::size_t>(std::max<std::int64_t>(p.state_elems, 1)),
                             0.0f);
    Buffer gs(gpu, state.size() * 4);
    gpu.copy_to_device(gs.get(), state.data(), state.size() * 4);
    const DeviceCsr csr(gpu, p);

    HostMat out(p.batch, p.out_cols, p.ld), outm = out.poisoned();
    cpu.embedding_forward(host.tables, host.host(), p.input(), out.view());
    std::vector<TableLayout> mag_tables;
    const std::vector<float> mag = host.magnitudes(mag_tables);
    cpu.embedding_forward(mag_tables, TableWeights::all(DType::f32, mag.data()), p.input(),
                          outm.view());
    const DevMat gout(gpu, out.poisoned());
    gpu.embedding_forward(host.tables, dev.weights(), csr.in, gout.view());
    expect_close("embedding_forward (adapter, mixed types)", gout.download(), out, outm, 1e-6);

    Rand rand(902 + static_cast<std::uint64_t>(kind));
    const HostMat dout = HostMat::random(p.batch, p.out_cols, p.ld - p.out_cols, rand);
    OptimizerParams opt;
    opt.kind = kind;
    opt.lr = 0.1f;
    const StochasticRounding rounding{77, 5};
    MixedTables got = host;
    cpu.embedding_backward_update(host.tables, host.host(), state.data(), p.input(), dout.cview(),
                                  opt, rounding);
    const DevMat gdout(gpu, dout);
    gpu.embedding_backward_update(host.tables, dev.weights(), gs.as<float>(), csr.in, gdout.view(),
                                  opt, rounding);
    gpu.raise_input_errors();
    dev.download(gpu, got);
    // fp32 tables: the same sums in another order, an update of a few ulps. fp16/bf16 tables: the
    // same stochastic rounding (same bits) of nearly the same fp32 value: the same bits but where
    // the two values straddle the random rounding point, then one step apart.
    int bad = 0;
    std::int64_t narrow = 0, same = 0;
    for (std::size_t i = 0; i < host.f32.size(); ++i) {
      const float g = got.f32[i], e = host.f32[i];
      if (!(std::fabs(static_cast<double>(g) - e) <= 1e-5 * (std::fabs(e) + 1e-3)) && ++bad <= 5)
        ADD_FAILURE() << "fp32 element " << i << ": gpu " << g << " cpu " << e;
    }
    for (const DType dt : {DType::f16, DType::bf16}) {
      const auto& g = dt == DType::f16 ? got.f16 : got.bf16;
      const auto& e = dt == DType::f16 ? host.f16 : host.bf16;
      for (std::size_t i = 0; i < e.size(); ++i) {
        ++narrow;
        if (g[i] == e[i]) {
          ++same;
          continue;
        }
        const int steps = std::abs(static_cast<int>(g[i]) - static_cast<int>(e[i]));
        if (steps > 1 && ++bad <= 5)
          ADD_FAILURE() << dtype_name(dt) << " element " << i << ": gpu bits " << g[i] << " cpu "
                        << e[i];
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GE(same, narrow * 99 / 100) << "narrow elements with the CPU's exact bits";
    std::cout << "[ measured ] embedding_backward_update (adapter, optimizer "
              << static_cast<int>(kind) << "): " << same << " of " << narrow
              << " fp16/bf16 elements bit-identical\n";
  }
}

// Where the math is exact (sgd with a power-of-two rate, sums of dyadic values), the GPU's update
// of fp16 and bf16 rows is the CPU's bit for bit: the same fp32 value, the same random bits, the
// same rounding rule.
TEST(DenseGpu, NarrowTableUpdatesMatchTheCpuBitForBit) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  ProblemSpec ps;
  ps.dims = {16, 8, 3, 24, 64};  // vector and scalar paths (dim 3)
  ps.rows = {60, 9, 20, 30, 5};
  ps.pooling = {Pooling::sum};
  ps.batch = 128;
  ps.zipf_alpha = 1.2;  // duplicates, and heavy rows in the small tables
  ps.max_pool = 40;
  const Problem p = make_problem(ps, 4242);
  for (const auto& types :
       {kMixed, std::vector<DType>{DType::f16}, std::vector<DType>{DType::bf16}}) {
    MixedTables host(p, types, 4243, true);
    const DeviceTables dev(gpu, host);
    const DeviceCsr csr(gpu, p);
    Rand rand(4244);
    HostMat dout(p.batch, p.out_cols, p.ld);
    for (std::int64_t r = 0; r < p.batch; ++r)
      for (std::int64_t c = 0; c < p.out_cols; ++c)
        dout.at(r, c) = static_cast<float>(rand.integer(-4, 4)) / 4096;  // below both types' ulps
    OptimizerParams opt;
    opt.kind = OptimizerKind::sgd;
    opt.lr = 0.25f;
    const StochasticRounding rounding{9, 12};
    MixedTables got = host;
    cpu.embedding_backward_update(host.tables, host.host(), nullptr, p.input(), dout.cview(), opt,
                                  rounding);
    const DevMat gdout(gpu, dout);
    gpu.embedding_backward_update(host.tables, dev.weights(), nullptr, csr.in, gdout.view(), opt,
                                  rounding);
    gpu.raise_input_errors();
    dev.download(gpu, got);
    EXPECT_EQ(got.f32, host.f32);
    EXPECT_EQ(got.f16, host.f16);
    EXPECT_EQ(got.bf16, host.bf16);
    // The updates were rounded: some narrow element left its start value's grid of 1/8.
    std::int64_t off_grid = 0;
    for (std::uint16_t b : host.f16) off_grid += std::fmod(half_to_float(b) * 8, 1.0f) != 0;
    for (std::uint16_t b : host.bf16) off_grid += std::fmod(bf16_to_float(b) * 8, 1.0f) != 0;
    EXPECT_GT(off_grid, 0);
  }
}

// ============================================================== errors ==

// limit_memory: the rest of the device is held, so that an allocation past the limit fails and
// one within it succeeds; limits at or past the device's size, or under what is in use, are
// refused with the figures; the hold ends with the backend.
TEST(DenseGpu, LimitMemoryHoldsTheRest) {
  PARITY_REQUIRE_GPU();
  const std::size_t gb = 1000000000;
  const auto [free0, total] = memory_info();
  {
    GpuBackend be;
    EXPECT_THROW(be.limit_memory(total), Error);
    const std::size_t in_use = total - memory_info().first;
    try {
      be.limit_memory(in_use / 2);
      FAIL() << "a limit under the memory in use was granted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("in use already"), std::string::npos) << e.what();
    }
    be.limit_memory(in_use + 2 * gb);
    EXPECT_LT(memory_info().first, 2 * gb + gb / 10);
    EXPECT_THROW(be.allocate(3 * gb), Error);
    void* p = be.allocate(gb);
    EXPECT_NE(p, nullptr);
    be.deallocate(p);
    be.limit_memory(in_use + 4 * gb);  // a second limit replaces the first
    p = be.allocate(3 * gb);
    EXPECT_NE(p, nullptr);
    be.deallocate(p);
  }
  EXPECT_GT(memory_info().first + gb, free0);  // held no longer
}

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
