// CpuBackend (the float instantiation) against the double instantiation of the same math, plus
// the properties GPU kernels will be held to: exact results on integer-valued inputs, bit-identical
// results whatever the thread count, clear validation errors, and views with ld > cols.
//
// Float outputs are poisoned with NaN before every call, so an element the op forgets to write
// fails the comparison; where a view is a block of a wider buffer, the columns outside it must
// still be NaN afterwards. Float and double runs get identical inputs (drawn as float).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/host_memory.h"
#include "cpu_test_util.h"
#include "parity/error.h"
#include "parity/random.h"

namespace parity {
namespace {

using test::convert;
using test::expect_close;
using test::Matrix;
using test::nan_matrix;
using test::Rand;
using test::random_matrix;
using test::random_vector;

// Float agrees with double within this, relative to |value| + rms(tensor) (see expect_close):
// the float path rounds each stored value once, and chained ops (cross layer) a few times.
constexpr double kFloatVsDouble = 1e-5;

// Float and double copies of the same random matrix.
struct Pair {
  Matrix<float> f;
  Matrix<double> d;
};
Pair random_pair(Rand& rand, std::int64_t rows, std::int64_t cols, double lo = -1.0,
                 double hi = 1.0) {
  Pair p;
  p.f = random_matrix<float>(rand, rows, cols, lo, hi);
  p.d = convert<double>(p.f);
  return p;
}

// ---------------------------------------------------------------- memory --

TEST(CpuBackendMemory, NameFactoryAndAlignment) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cpu");
  for (std::size_t bytes : {1u, 3u, 64u, 100u, 4096u, 1000001u}) {
    Buffer b(*backend, bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.get()) % 64, 0u) << bytes << " bytes";
    std::memset(b.get(), 0xab, bytes);  // the whole range is writable
  }
  Buffer empty(*backend, 0);
  EXPECT_EQ(empty.get(), nullptr);
}

TEST(CpuBackendMemory, CopiesAndFills) {
  CpuBackend be;
  std::vector<float> host{1, 2, 3, 4, 5};
  Buffer a(be, 5 * sizeof(float)), b(be, 5 * sizeof(float));
  be.copy_to_device(a.get(), host.data(), 5 * sizeof(float));
  std::vector<float> back(5, 0.0f);
  be.copy_to_host(back.data(), a.get(), 5 * sizeof(float));
  be.synchronize();
  EXPECT_EQ(back, host);
  be.fill(b.as<float>(), 5, -2.5f);
  be.copy_to_host(back.data(), b.get(), 5 * sizeof(float));
  EXPECT_EQ(back, std::vector<float>(5, -2.5f));
}

// flag_nonfinite records the step once, at the first NaN or infinity anywhere in the range (the
// parallel path included), and never overwrites a record.
TEST(CpuBackendGuard, FlagNonfiniteRecordsTheFirstBadStep) {
  CpuBackend be;
  std::vector<float> x(1 << 17, 0.5f);
  std::int64_t record = -1;
  be.flag_nonfinite(x.data(), static_cast<std::int64_t>(x.size()), 3, &record);
  EXPECT_EQ(record, -1);
  x.back() = std::numeric_limits<float>::infinity();
  be.flag_nonfinite(x.data(), static_cast<std::int64_t>(x.size()) - 1, 4, &record);
  EXPECT_EQ(record, -1) << "looked past n";
  be.flag_nonfinite(x.data(), static_cast<std::int64_t>(x.size()), 5, &record);
  EXPECT_EQ(record, 5);
  x[7] = std::nanf("");
  be.flag_nonfinite(x.data(), static_cast<std::int64_t>(x.size()), 6, &record);
  EXPECT_EQ(record, 5) << "a record was overwritten";
  EXPECT_THROW(be.flag_nonfinite(x.data(), 1, 1, nullptr), Error);
}

// Allocations past the host memory that was available are refused with the figures (Linux would
// grant them and kill the process when it touched the pages); freed memory counts again.
TEST(CpuBackendMemory, AllocationsBeyondTheHostAreInputErrors) {
  ASSERT_TRUE(host_memory_available().has_value()) << "no /proc/meminfo here";
  CpuBackend be;
  EXPECT_EQ(be.allocated_bytes(), 0u);
  try {
    be.allocate(std::size_t{1} << 50);
    FAIL() << "a petabyte was granted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("more memory than this machine has"), std::string::npos)
        << e.what();
  }
  const std::size_t half = static_cast<std::size_t>(*host_memory_available() / 2);
  {
    Buffer a(be, half / 2);
    EXPECT_GE(be.allocated_bytes(), half / 2);
    EXPECT_THROW(Buffer(be, half * 2), InputError);
  }
  EXPECT_EQ(be.allocated_bytes(), 0u);
  Buffer again(be, half / 2);  // what was freed is available again
}

// limit_memory (one GPU standing in for a smaller one) has nothing to limit on the host.
TEST(CpuBackendMemory, LimitMemoryIsRefusedByName) {
  CpuBackend be;
  try {
    be.limit_memory(std::size_t{1} << 30);
    FAIL() << "the cpu backend limited its memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the cpu backend has no device memory to limit"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuBackendMemory, FillUniformIsTheCounterFormula) {
  CpuBackend be;
  const std::int64_t n = 40000;  // large enough to run threaded
  std::vector<float> p(n), q(n);
  be.fill_uniform(p.data(), n, -0.25f, 0.75f, 42, 7);
  const std::uint64_t key = rng::key(42, 7);
  for (std::int64_t i = 0; i < n; ++i) {
    const float lo = -0.25f;
    const float hi = 0.75f;
    const float expected = static_cast<float>(lo + (hi - lo) * rng::uniform01(key, i));
    ASSERT_EQ(p[i], expected) << i;
    ASSERT_GE(p[i], lo);
    ASSERT_LE(p[i], hi);
  }
  be.fill_uniform(q.data(), n, -0.25f, 0.75f, 42, 8);
  EXPECT_NE(p, q) << "another stream gives other values";
}

// ------------------------------------------------------- float vs double --

class CpuFloatVsDouble : public ::testing::TestWithParam<int> {
 protected:
  CpuBackend be_;
};

TEST_P(CpuFloatVsDouble, Linear) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 100);
  const std::int64_t batch = rand.integer(1, 70);
  const std::int64_t in = rand.integer(1, 150);
  const std::int64_t out = rand.integer(1, 40);
  const Pair x = random_pair(rand, batch, in);
  const Pair w = random_pair(rand, out, in);
  const Pair bias = random_pair(rand, 1, out);
  const Pair dy = random_pair(rand, batch, out);
  for (Activation act : {Activation::none, Activation::relu}) {
    for (bool with_bias : {true, false}) {
      const std::string tag = std::string(act == Activation::relu ? "relu" : "none") +
                              (with_bias ? " bias " : " no-bias ");
      Matrix<float> yf = nan_matrix<float>(batch, out);
      Matrix<double> yd = nan_matrix<double>(batch, out);
      be_.linear_forward(x.f.cview(), w.f.cview(), with_bias ? bias.f.data.data() : nullptr, act,
                         yf.view());
      cpu::linear_forward<double>(x.d.cview(), w.d.cview(),
                                  with_bias ? bias.d.data.data() : nullptr, act, yd.view());
      expect_close(yf.cview(), yd.cview(), kFloatVsDouble, tag + "y");

      Matrix<float> dxf = nan_matrix<float>(batch, in), dwf = nan_matrix<float>(out, in);
      Matrix<double> dxd = nan_matrix<double>(batch, in), dwd = nan_matrix<double>(out, in);
      Matrix<float> dbf = nan_matrix<float>(1, out);
      Matrix<double> dbd = nan_matrix<double>(1, out);
      be_.linear_backward(x.f.cview(), w.f.cview(), yf.cview(), dy.f.cview(), act, dxf.view(),
                          dwf.view(), dbf.ptr());
      cpu::linear_backward<double>(x.d.cview(), w.d.cview(), yd.cview(), dy.d.cview(), act,
                                   dxd.view(), dwd.view(), dbd.ptr());
      expect_close(dxf.cview(), dxd.cview(), kFloatVsDouble, tag + "dx");
      expect_close(dwf.cview(), dwd.cview(), kFloatVsDouble, tag + "dw");
      expect_close(dbf.cview(), dbd.cview(), kFloatVsDouble, tag + "dbias");
    }
  }
}

TEST_P(CpuFloatVsDouble, Embedding) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 101);
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    const auto tables =
        test::pack_tables({rand.integer(1, 50), rand.integer(1, 9), rand.integer(1, 200)},
                          {static_cast<int>(rand.integer(1, 16)), 4, 8},
                          {Pooling::sum, Pooling::mean, Pooling::mean}, kind);
    const std::int64_t width = tables.back().out_col + tables.back().dim;
    const std::int64_t batch = rand.integer(1, 60);
    const test::SparseBatch sparse = test::random_sparse(rand, batch, tables, 6);
    const std::vector<float> wf = random_vector<float>(rand, test::total_weights(tables));
    const std::vector<double> wd = convert<double>(wf);

    Matrix<float> of = nan_matrix<float>(batch, width);
    Matrix<double> od = nan_matrix<double>(batch, width);
    be_.embedding_forward(tables, test::fp32_tables(wf.data()), sparse.input(), of.view());
    cpu::embedding_forward<double>(tables, test::fp32_tables(wd.data()), sparse.input(), od.view());
    expect_close(of.cview(), od.cview(), kFloatVsDouble, "out");

    const Pair dout = random_pair(rand, batch, width);
    std::int64_t state_size = 0;
    for (const auto& t : tables) {
      state_size += kind == OptimizerKind::rowwise_adagrad ? t.rows : t.rows * t.dim;
    }
    const std::vector<float> sf0 = random_vector<float>(rand, state_size, 0.0, 1.0);
    std::vector<float> sf = sf0, wf1 = wf;
    std::vector<double> sd = convert<double>(sf0), wd1 = wd;
    OptimizerParams opt;
    opt.kind = kind;
    opt.lr = 0.05f;
    opt.weight_decay = 0.01f;
    be_.embedding_backward_update(tables, test::fp32_tables(wf1.data()), sf.data(), sparse.input(),
                                  dout.f.cview(), opt, {});
    cpu::embedding_backward_update<double>(tables, test::fp32_tables(wd1.data()), sd.data(),
                                           sparse.input(), dout.d.cview(), opt, {});
    expect_close(wf1, wd1, kFloatVsDouble, "weights");
    expect_close(sf, sd, kFloatVsDouble, "state");
  }
}

TEST_P(CpuFloatVsDouble, DotInteraction) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 102);
  const std::int64_t batch = rand.integer(1, 40);
  const std::int64_t dim = rand.integer(1, 33);
  const int num_tables = static_cast<int>(rand.integer(0, 12));
  const std::int64_t f = num_tables + 1;
  const std::int64_t out_cols = dim + f * (f - 1) / 2;
  const Pair dense = random_pair(rand, batch, dim);
  const Pair emb = random_pair(rand, batch, num_tables * dim);
  const Pair dout = random_pair(rand, batch, out_cols);
  Matrix<float> of = nan_matrix<float>(batch, out_cols);
  Matrix<double> od = nan_matrix<double>(batch, out_cols);
  be_.dot_interaction_forward(dense.f.cview(), emb.f.cview(), num_tables, of.view());
  cpu::dot_interaction_forward<double>(dense.d.cview(), emb.d.cview(), num_tables, od.view());
  expect_close(of.cview(), od.cview(), kFloatVsDouble, "out");

  Matrix<float> ddf = nan_matrix<float>(batch, dim), def = nan_matrix<float>(batch, emb.f.cols);
  Matrix<double> ddd = nan_matrix<double>(batch, dim), ded = nan_matrix<double>(batch, emb.f.cols);
  be_.dot_interaction_backward(dense.f.cview(), emb.f.cview(), num_tables, dout.f.cview(),
                               ddf.view(), def.view());
  cpu::dot_interaction_backward<double>(dense.d.cview(), emb.d.cview(), num_tables, dout.d.cview(),
                                        ddd.view(), ded.view());
  expect_close(ddf.cview(), ddd.cview(), kFloatVsDouble, "ddense");
  expect_close(def.cview(), ded.cview(), kFloatVsDouble, "demb");
}

TEST_P(CpuFloatVsDouble, CrossLayer) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 103);
  const std::int64_t batch = rand.integer(1, 50);
  const std::int64_t n = rand.integer(1, 90);
  const std::int64_t rank = rand.integer(1, 20);
  const Pair x0 = random_pair(rand, batch, n), xl = random_pair(rand, batch, n);
  const Pair v = random_pair(rand, rank, n), w = random_pair(rand, n, rank);
  const Pair bias = random_pair(rand, 1, n), g = random_pair(rand, batch, n);
  const Pair dx0_start = random_pair(rand, batch, n);

  Matrix<float> uf = nan_matrix<float>(batch, rank), zf = nan_matrix<float>(batch, n),
                xf = nan_matrix<float>(batch, n);
  Matrix<double> ud = nan_matrix<double>(batch, rank), zd = nan_matrix<double>(batch, n),
                 xd = nan_matrix<double>(batch, n);
  be_.cross_forward(x0.f.cview(), xl.f.cview(), v.f.cview(), w.f.cview(), bias.f.ptr(), uf.view(),
                    zf.view(), xf.view());
  cpu::cross_forward<double>(x0.d.cview(), xl.d.cview(), v.d.cview(), w.d.cview(), bias.d.ptr(),
                             ud.view(), zd.view(), xd.view());
  expect_close(uf.cview(), ud.cview(), kFloatVsDouble, "u");
  expect_close(zf.cview(), zd.cview(), kFloatVsDouble, "z");
  expect_close(xf.cview(), xd.cview(), kFloatVsDouble, "x_next");

  Matrix<float> dx0f = dx0_start.f, dxlf = nan_matrix<float>(batch, n),
                dvf = nan_matrix<float>(rank, n), dwf = nan_matrix<float>(n, rank),
                dbf = nan_matrix<float>(1, n), duf = nan_matrix<float>(batch, rank);
  Matrix<double> dx0d = dx0_start.d, dxld = nan_matrix<double>(batch, n),
                 dvd = nan_matrix<double>(rank, n), dwd = nan_matrix<double>(n, rank),
                 dbd = nan_matrix<double>(1, n), dud = nan_matrix<double>(batch, rank);
  be_.cross_backward(x0.f.cview(), xl.f.cview(), v.f.cview(), w.f.cview(), uf.cview(), zf.cview(),
                     g.f.cview(), dx0f.view(), dxlf.view(), dvf.view(), dwf.view(), dbf.ptr(),
                     duf.view());
  cpu::cross_backward<double>(x0.d.cview(), xl.d.cview(), v.d.cview(), w.d.cview(), ud.cview(),
                              zd.cview(), g.d.cview(), dx0d.view(), dxld.view(), dvd.view(),
                              dwd.view(), dbd.ptr(), dud.view());
  expect_close(dx0f.cview(), dx0d.cview(), kFloatVsDouble, "dx0");
  expect_close(dxlf.cview(), dxld.cview(), kFloatVsDouble, "dxl");
  expect_close(dvf.cview(), dvd.cview(), kFloatVsDouble, "dv");
  expect_close(dwf.cview(), dwd.cview(), kFloatVsDouble, "dw");
  expect_close(dbf.cview(), dbd.cview(), kFloatVsDouble, "dbias");
  expect_close(duf.cview(), dud.cview(), kFloatVsDouble, "du");
}

TEST_P(CpuFloatVsDouble, LossHeadsAndAdd) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 104);
  const std::int64_t n = rand.integer(1, 3000);
  const Pair logits = random_pair(rand, 1, n, -30.0, 30.0);
  const Pair labels = random_pair(rand, 1, n, 0.0, 1.0);
  Matrix<float> gf = nan_matrix<float>(1, n), lf = nan_matrix<float>(1, 1);
  Matrix<double> gd = nan_matrix<double>(1, n), ld = nan_matrix<double>(1, 1);
  be_.bce_with_logits(logits.f.ptr(), labels.f.ptr(), n, gf.ptr(), lf.ptr());
  cpu::bce_with_logits<double>(logits.d.ptr(), labels.d.ptr(), n, gd.ptr(), ld.ptr());
  expect_close(gf.cview(), gd.cview(), kFloatVsDouble, "dlogits");
  expect_close(lf.cview(), ld.cview(), kFloatVsDouble, "loss");

  Matrix<float> pf = nan_matrix<float>(1, n);
  Matrix<double> pd = nan_matrix<double>(1, n);
  be_.sigmoid(logits.f.ptr(), pf.ptr(), n);
  cpu::sigmoid<double>(logits.d.ptr(), pd.ptr(), n);
  expect_close(pf.cview(), pd.cview(), kFloatVsDouble, "probs");
}

TEST_P(CpuFloatVsDouble, DenseOptimizers) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 105);
  const std::int64_t n = rand.integer(1, 5000);
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::adam}) {
    OptimizerParams opt;
    opt.kind = kind;
    opt.lr = 0.01f;
    opt.weight_decay = 0.001f;
    std::vector<float> pf = random_vector<float>(rand, n);
    std::vector<double> pd = convert<double>(pf);
    std::vector<float> sf(static_cast<std::size_t>(2 * n), 0.0f);
    std::vector<double> sd(static_cast<std::size_t>(2 * n), 0.0);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> gf = random_vector<float>(rand, n);
      const std::vector<double> gd = convert<double>(gf);
      be_.dense_optimizer_step(pf.data(), gf.data(), sf.data(), n, opt, step);
      cpu::dense_optimizer_step<double>(pd.data(), gd.data(), sd.data(), n, opt, step);
    }
    expect_close(pf, pd, kFloatVsDouble, "params");
    expect_close(sf, sd, kFloatVsDouble, "state");
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, CpuFloatVsDouble, ::testing::Range(0, 6));

// --------------------------------------------------------- exact results --

TEST(CpuExact, EmbeddingSumOfIntegers) {
  CpuBackend be;
  Rand rand(1, 200);
  const auto tables = test::pack_tables({30, 1000}, {5, 16}, {Pooling::sum, Pooling::sum});
  const std::int64_t batch = 300;
  const test::SparseBatch sparse = test::random_sparse(rand, batch, tables, 40);
  std::vector<float> weights(static_cast<std::size_t>(test::total_weights(tables)));
  for (auto& w : weights) w = static_cast<float>(rand.integer(-1000, 1000));
  Matrix<float> out = nan_matrix<float>(batch, 21);
  be.embedding_forward(tables, test::fp32_tables(weights.data()), sparse.input(), out.view());
  const SparseInput in = sparse.input();
  for (int t = 0; t < 2; ++t) {
    const TableLayout& tl = tables[t];
    for (std::int64_t b = 0; b < batch; ++b) {
      for (int d = 0; d < tl.dim; ++d) {
        std::int64_t sum = 0;
        for (std::int64_t j = in.offsets[t * batch + b]; j < in.offsets[t * batch + b + 1]; ++j) {
          sum += static_cast<std::int64_t>(weights[tl.weight_offset + in.ids[j] * tl.dim + d]);
        }
        ASSERT_EQ(out(b, tl.out_col + d), static_cast<float>(sum)) << t << " " << b << " " << d;
      }
    }
  }
}

TEST(CpuExact, LinearOfIntegers) {
  CpuBackend be;
  Rand rand(2, 201);
  const std::int64_t batch = 512, in = 144, out = 64;
  const Matrix<float> x = test::integer_matrix<float>(rand, batch, in, -8, 8);
  const Matrix<float> w = test::integer_matrix<float>(rand, out, in, -8, 8);
  const Matrix<float> bias = test::integer_matrix<float>(rand, 1, out, -100, 100);
  for (Activation act : {Activation::none, Activation::relu}) {
    Matrix<float> y = nan_matrix<float>(batch, out);
    be.linear_forward(x.cview(), w.cview(), bias.data.data(), act, y.view());
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t o = 0; o < out; ++o) {
        std::int64_t s = static_cast<std::int64_t>(bias(0, o));
        for (std::int64_t i = 0; i < in; ++i) {
          s += static_cast<std::int64_t>(x(b, i)) * static_cast<std::int64_t>(w(o, i));
        }
        if (act == Activation::relu && s < 0) s = 0;
        ASSERT_EQ(y(b, o), static_cast<float>(s)) << b << " " << o;
      }
    }
  }
}

TEST(CpuExact, DotInteractionOfIntegers) {
  CpuBackend be;
  Rand rand(3, 202);
  const std::int64_t batch = 20, dim = 16;
  const int num_tables = 5;
  const Matrix<float> dense = test::integer_matrix<float>(rand, batch, dim, -20, 20);
  const Matrix<float> emb = test::integer_matrix<float>(rand, batch, num_tables * dim, -20, 20);
  Matrix<float> out = nan_matrix<float>(batch, dim + 15);
  be.dot_interaction_forward(dense.cview(), emb.cview(), num_tables, out.view());
  for (std::int64_t b = 0; b < batch; ++b) {
    auto feature = [&](std::int64_t k, std::int64_t d) {
      return static_cast<std::int64_t>(k == 0 ? dense(b, d) : emb(b, (k - 1) * dim + d));
    };
    std::int64_t c = dim;
    for (std::int64_t i = 1; i <= num_tables; ++i) {
      for (std::int64_t j = 0; j < i; ++j) {
        std::int64_t s = 0;
        for (std::int64_t d = 0; d < dim; ++d) s += feature(i, d) * feature(j, d);
        ASSERT_EQ(out(b, c++), static_cast<float>(s));
      }
    }
    for (std::int64_t d = 0; d < dim; ++d) ASSERT_EQ(out(b, d), dense(b, d));
  }
}

// ----------------------------------------------------------- determinism --

// Runs every op once on fixed inputs large enough to take the threaded paths, and returns all
// outputs, flattened.
std::vector<std::vector<float>> run_every_op() {
  CpuBackend be;
  Rand rand(9, 300);
  std::vector<std::vector<float>> outputs;
  auto keep = [&](const Matrix<float>& m) { outputs.push_back(m.data); };

  // Linear.
  const std::int64_t batch = 300, in = 100, out = 70;
  const Matrix<float> x = random_matrix<float>(rand, batch, in);
  const Matrix<float> w = random_matrix<float>(rand, out, in);
  const Matrix<float> bias = random_matrix<float>(rand, 1, out);
  const Matrix<float> dy = random_matrix<float>(rand, batch, out);
  Matrix<float> y = nan_matrix<float>(batch, out), dx = nan_matrix<float>(batch, in),
                dw = nan_matrix<float>(out, in), db = nan_matrix<float>(1, out);
  be.linear_forward(x.cview(), w.cview(), bias.data.data(), Activation::relu, y.view());
  be.linear_backward(x.cview(), w.cview(), y.cview(), dy.cview(), Activation::relu, dx.view(),
                     dw.view(), db.ptr());
  keep(y), keep(dx), keep(dw), keep(db);

  // Embeddings: one update per optimizer.
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    const auto tables =
        test::pack_tables({5000, 300, 20, 1000}, {16, 8, 4, 32},
                          {Pooling::sum, Pooling::mean, Pooling::sum, Pooling::mean}, kind);
    const std::int64_t eb = 1024;
    const test::SparseBatch sparse = test::random_sparse(rand, eb, tables, 8);
    Matrix<float> weights = random_matrix<float>(rand, 1, test::total_weights(tables));
    Matrix<float> state = random_matrix<float>(rand, 1, test::total_weights(tables), 0.0, 1.0);
    Matrix<float> pooled = nan_matrix<float>(eb, 60);
    be.embedding_forward(tables, test::fp32_tables(weights.ptr()), sparse.input(), pooled.view());
    const Matrix<float> dout = random_matrix<float>(rand, eb, 60);
    OptimizerParams opt;
    opt.kind = kind;
    opt.lr = 0.1f;
    opt.weight_decay = 0.01f;
    be.embedding_backward_update(tables, test::fp32_tables(weights.ptr()), state.ptr(),
                                 sparse.input(), dout.cview(), opt, {});
    keep(pooled), keep(weights), keep(state);
  }

  // Dot interaction.
  {
    const std::int64_t b = 256, dim = 16;
    const int tables = 8;
    const std::int64_t cols = dim + 9 * 8 / 2;
    const Matrix<float> dense = random_matrix<float>(rand, b, dim);
    const Matrix<float> emb = random_matrix<float>(rand, b, tables * dim);
    const Matrix<float> dout = random_matrix<float>(rand, b, cols);
    Matrix<float> o = nan_matrix<float>(b, cols), dd = nan_matrix<float>(b, dim),
                  de = nan_matrix<float>(b, tables * dim);
    be.dot_interaction_forward(dense.cview(), emb.cview(), tables, o.view());
    be.dot_interaction_backward(dense.cview(), emb.cview(), tables, dout.cview(), dd.view(),
                                de.view());
    keep(o), keep(dd), keep(de);
  }

  // Cross layer.
  {
    const std::int64_t b = 256, n = 80, r = 16;
    const Matrix<float> x0 = random_matrix<float>(rand, b, n),
                        xl = random_matrix<float>(rand, b, n);
    const Matrix<float> v = random_matrix<float>(rand, r, n), cw = random_matrix<float>(rand, n, r);
    const Matrix<float> cb = random_matrix<float>(rand, 1, n), g = random_matrix<float>(rand, b, n);
    Matrix<float> u = nan_matrix<float>(b, r), z = nan_matrix<float>(b, n),
                  xn = nan_matrix<float>(b, n);
    be.cross_forward(x0.cview(), xl.cview(), v.cview(), cw.cview(), cb.data.data(), u.view(),
                     z.view(), xn.view());
    Matrix<float> dx0 = random_matrix<float>(rand, b, n), dxl = nan_matrix<float>(b, n),
                  dv = nan_matrix<float>(r, n), dcw = nan_matrix<float>(n, r),
                  dcb = nan_matrix<float>(1, n), du = nan_matrix<float>(b, r);
    be.cross_backward(x0.cview(), xl.cview(), v.cview(), cw.cview(), u.cview(), z.cview(),
                      g.cview(), dx0.view(), dxl.view(), dv.view(), dcw.view(), dcb.ptr(),
                      du.view());
    keep(u), keep(z), keep(xn), keep(dx0), keep(dxl), keep(dv), keep(dcw), keep(dcb), keep(du);
  }

  // Loss, heads, dense optimizers, fills.
  {
    const std::int64_t n = 50000;
    const Matrix<float> logits = random_matrix<float>(rand, 1, n, -10, 10);
    const Matrix<float> labels = random_matrix<float>(rand, 1, n, 0, 1);
    Matrix<float> dl = nan_matrix<float>(1, n), loss = nan_matrix<float>(1, 1),
                  probs = nan_matrix<float>(1, n);
    be.bce_with_logits(logits.data.data(), labels.data.data(), n, dl.ptr(), loss.ptr());
    be.sigmoid(logits.data.data(), probs.ptr(), n);
    keep(dl), keep(loss), keep(probs);
    for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::adam}) {
      OptimizerParams opt;
      opt.kind = kind;
      opt.weight_decay = 0.01f;
      Matrix<float> p = random_matrix<float>(rand, 1, n);
      Matrix<float> s = random_matrix<float>(rand, 1, 2 * n, 0, 1);
      be.dense_optimizer_step(p.ptr(), logits.data.data(), s.ptr(), n, opt, 2);
      keep(p), keep(s);
    }
    Matrix<float> filled = nan_matrix<float>(1, n);
    be.fill_uniform(filled.ptr(), n, -1.0f, 1.0f, 5, 6);
    keep(filled);
  }
  return outputs;
}

TEST(CpuDeterminism, EveryOpBitIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run_every_op();
  for (int threads : {2, 4}) {
    omp_set_num_threads(threads);
    const auto many = run_every_op();
    ASSERT_EQ(one.size(), many.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(one[i].size(), many[i].size());
      EXPECT_EQ(std::memcmp(one[i].data(), many[i].data(), one[i].size() * sizeof(float)), 0)
          << "output " << i << " differs between 1 and " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// ------------------------------------------------------------ validation --

// fn throws parity::Error whose message contains every one of parts.
void expect_error(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* p : parts) {
      EXPECT_NE(message.find(p), std::string::npos) << "'" << message << "' lacks '" << p << "'";
    }
  }
}

TEST(CpuValidation, DenseShapes) {
  CpuBackend be;
  std::vector<float> buf(1000, 1.0f);
  float* p = buf.data();
  expect_error(
      [&] {
        be.linear_forward(CMat(p, 4, 7), CMat(p, 3, 8), nullptr, Activation::none,
                          Mat(p + 500, 4, 3));
      },
      {"linear_forward", "x has 7 columns, w has 8"});
  expect_error(
      [&] {
        be.linear_forward(CMat(p, 4, 8), CMat(p, 3, 8), nullptr, Activation::none,
                          Mat(p + 500, 4, 2));
      },
      {"linear_forward", "y"});
  expect_error(
      [&] {
        be.linear_forward(CMat(p, 4, 8, 6), CMat(p, 3, 8), nullptr, Activation::none,
                          Mat(p + 500, 4, 3));
      },
      {"linear_forward", "ld"});
  expect_error(
      [&] {
        be.linear_backward(CMat(p, 4, 8), CMat(p, 3, 8), CMat(p, 4, 3), CMat(p, 4, 3),
                           Activation::relu, Mat(p + 500, 4, 8), Mat(p + 600, 8, 3), nullptr);
      },
      {"linear_backward", "dw"});
  expect_error(
      [&] { be.dot_interaction_forward(CMat(p, 2, 4), CMat(p, 2, 7), 2, Mat(p + 500, 2, 7)); },
      {"dot_interaction_forward", "emb"});
  expect_error(
      [&] { be.dot_interaction_forward(CMat(p, 2, 4), CMat(p, 2, 8), 2, Mat(p + 500, 2, 6)); },
      {"dot_interaction_forward", "out"});
  expect_error(
      [&] {
        be.cross_forward(CMat(p, 2, 4), CMat(p, 2, 4), CMat(p, 3, 4), CMat(p, 3, 4), nullptr,
                         Mat(p + 500, 2, 3), Mat(p + 600, 2, 4), Mat(p + 700, 2, 4));
      },
      {"cross_forward", "w"});
  expect_error([&] { be.bce_with_logits(p, p, 0, p + 10, p + 20); }, {"bce_with_logits"});
  OptimizerParams opt;
  opt.kind = OptimizerKind::rowwise_adagrad;
  expect_error([&] { be.dense_optimizer_step(p, p + 10, p + 20, 5, opt, 1); },
               {"dense_optimizer_step", "rowwise_adagrad"});
}

TEST(CpuValidation, SparseInput) {
  CpuBackend be;
  const auto tables = test::pack_tables({10, 4}, {2, 3}, {Pooling::sum, Pooling::mean});
  std::vector<float> weights(static_cast<std::size_t>(test::total_weights(tables)), 1.0f);
  Matrix<float> out(3, 5);
  auto forward = [&](const test::SparseBatch& s) {
    be.embedding_forward(tables, test::fp32_tables(weights.data()), s.input(), out.view());
  };
  OptimizerParams opt;
  auto backward = [&](const test::SparseBatch& s) {
    be.embedding_backward_update(tables, test::fp32_tables(weights.data()), nullptr, s.input(),
                                 out.cview(), opt, {});
  };

  const test::SparseBatch good = test::make_sparse({{{1}, {}, {9, 9}}, {{0, 3}, {2}, {}}});
  EXPECT_NO_THROW(forward(good));
  EXPECT_NO_THROW(backward(good));

  test::SparseBatch bad = test::make_sparse({{{1}, {}, {9, 9}}, {{0, 3}, {2}, {4}}});
  expect_error([&] { forward(bad); }, {"embedding_forward", "table 1", "bag 2", "id 4"});
  expect_error([&] { backward(bad); }, {"embedding_backward_update", "table 1", "bag 2", "id 4"});
  bad = test::make_sparse({{{1}, {-1}, {9, 9}}, {{0, 3}, {2}, {}}});
  expect_error([&] { forward(bad); }, {"embedding_forward", "table 0", "bag 1", "id -1"});

  bad = good;
  bad.offsets[2] = 0;  // bag (0, 1) would end before it starts
  expect_error([&] { forward(bad); }, {"embedding_forward", "offsets", "decrease"});
  bad = good;
  bad.offsets[0] = 1;
  expect_error([&] { forward(bad); }, {"embedding_forward", "offsets[0]"});

  bad = good;
  bad.num_tables = 1;
  expect_error([&] { forward(bad); }, {"embedding_forward", "tables"});

  // A stated id count must agree with the offsets.
  SparseInput stated = good.input();
  stated.nnz = 6;
  EXPECT_NO_THROW(
      be.embedding_forward(tables, test::fp32_tables(weights.data()), stated, out.view()));
  stated.nnz = 4;
  expect_error(
      [&] { be.embedding_forward(tables, test::fp32_tables(weights.data()), stated, out.view()); },
      {"embedding_forward", "nnz is 4", "offsets end at 6"});

  Matrix<float> narrow(3, 4);
  expect_error(
      [&] {
        be.embedding_forward(tables, test::fp32_tables(weights.data()), good.input(),
                             narrow.view());
      },
      {"embedding_forward", "table 1", "columns"});
  Matrix<float> short_out(2, 5);
  expect_error(
      [&] {
        be.embedding_forward(tables, test::fp32_tables(weights.data()), good.input(),
                             short_out.view());
      },
      {"embedding_forward", "rows"});

  opt.kind = OptimizerKind::adam;
  expect_error([&] { backward(good); }, {"embedding_backward_update", "adam"});
  opt.kind = OptimizerKind::adagrad;
  expect_error([&] { backward(good); }, {"embedding_backward_update", "state"});
}

// ----------------------------------------------------- views, ld > cols --

TEST(CpuViews, LinearStridedInputAndOutput) {
  CpuBackend be;
  Rand rand(4, 400);
  const std::int64_t batch = 33, in = 21, out = 10;
  const Matrix<float> x = random_matrix<float>(rand, batch, in);
  // The same x inside a wider buffer at column 5; the gap holds NaN, which must not be read.
  Matrix<float> wide_x = nan_matrix<float>(batch, in + 9);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < in; ++i) wide_x(b, 5 + i) = x(b, i);
  }
  const CMat x_view = wide_x.cview().cols_slice(5, in);
  const Matrix<float> w = random_matrix<float>(rand, out, in);
  const Matrix<float> bias = random_matrix<float>(rand, 1, out);
  const Matrix<float> dy = random_matrix<float>(rand, batch, out);

  Matrix<float> y = nan_matrix<float>(batch, out);
  be.linear_forward(x.cview(), w.cview(), bias.data.data(), Activation::relu, y.view());
  Matrix<float> wide_y = nan_matrix<float>(batch, out + 7);
  const Mat y_view = wide_y.view().cols_slice(3, out);
  be.linear_forward(x_view, w.cview(), bias.data.data(), Activation::relu, y_view);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t o = 0; o < out; ++o) ASSERT_EQ(y_view(b, o), y(b, o));
  }
  test::expect_gap_untouched(wide_y, 3, out, "y");

  Matrix<float> dx = nan_matrix<float>(batch, in), dw = nan_matrix<float>(out, in);
  be.linear_backward(x.cview(), w.cview(), y.cview(), dy.cview(), Activation::relu, dx.view(),
                     dw.view(), nullptr);
  Matrix<float> wide_dx = nan_matrix<float>(batch, in + 4), dw2 = nan_matrix<float>(out, in);
  const Mat dx_view = wide_dx.view().cols_slice(2, in);
  be.linear_backward(x_view, w.cview(), y_view, dy.cview(), Activation::relu, dx_view, dw2.view(),
                     nullptr);
  EXPECT_EQ(dw2.data, dw.data);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < in; ++i) ASSERT_EQ(dx_view(b, i), dx(b, i));
  }
  test::expect_gap_untouched(wide_dx, 2, in, "dx");
}

TEST(CpuViews, EmbeddingOutputAndGradientAsColumnBlocks) {
  CpuBackend be;
  Rand rand(5, 401);
  const auto tables =
      test::pack_tables({40, 7}, {6, 3}, {Pooling::sum, Pooling::mean}, OptimizerKind::adagrad);
  const std::int64_t batch = 25, width = 9;
  const test::SparseBatch sparse = test::random_sparse(rand, batch, tables, 5);
  const std::vector<float> weights = random_vector<float>(rand, test::total_weights(tables));

  // Pooled output written into columns [4, 13) of a [batch, 16] buffer (the interaction input).
  Matrix<float> out = nan_matrix<float>(batch, width);
  be.embedding_forward(tables, test::fp32_tables(weights.data()), sparse.input(), out.view());
  Matrix<float> wide = nan_matrix<float>(batch, 16);
  const Mat block = wide.view().cols_slice(4, width);
  be.embedding_forward(tables, test::fp32_tables(weights.data()), sparse.input(), block);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t c = 0; c < width; ++c) ASSERT_EQ(block(b, c), out(b, c));
  }
  test::expect_gap_untouched(wide, 4, width, "pooled output");

  // The gradient read from a column block gives the same update as from a contiguous copy.
  const Matrix<float> dout = random_matrix<float>(rand, batch, width);
  Matrix<float> wide_dout = nan_matrix<float>(batch, width + 6);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t c = 0; c < width; ++c) wide_dout(b, 2 + c) = dout(b, c);
  }
  OptimizerParams opt;
  opt.kind = OptimizerKind::adagrad;
  opt.lr = 0.1f;
  std::vector<float> w1 = weights, w2 = weights;
  std::vector<float> s1(weights.size(), 0.5f), s2 = s1;
  be.embedding_backward_update(tables, test::fp32_tables(w1.data()), s1.data(), sparse.input(),
                               dout.cview(), opt, {});
  be.embedding_backward_update(tables, test::fp32_tables(w2.data()), s2.data(), sparse.input(),
                               wide_dout.cview().cols_slice(2, width), opt, {});
  EXPECT_EQ(w1, w2);
  EXPECT_EQ(s1, s2);
}

TEST(CpuViews, DotInteractionOverOneInteractionBuffer) {
  // The engine's layout: [dense | emb] side by side in one buffer.
  CpuBackend be;
  Rand rand(6, 402);
  const std::int64_t batch = 9, dim = 4;
  const int num_tables = 3;
  const Matrix<float> both = random_matrix<float>(rand, batch, dim * (num_tables + 1));
  Matrix<float> dense(batch, dim), emb(batch, num_tables * dim);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t c = 0; c < dim * (num_tables + 1); ++c) {
      if (c < dim)
        dense(b, c) = both(b, c);
      else
        emb(b, c - dim) = both(b, c);
    }
  }
  Matrix<float> out1 = nan_matrix<float>(batch, dim + 6), out2 = nan_matrix<float>(batch, dim + 6);
  be.dot_interaction_forward(dense.cview(), emb.cview(), num_tables, out1.view());
  be.dot_interaction_forward(both.cview().cols_slice(0, dim),
                             both.cview().cols_slice(dim, num_tables * dim), num_tables,
                             out2.view());
  EXPECT_EQ(out1.data, out2.data);
}

TEST(CpuViews, CrossBackwardDxlMayAliasDxNext) {
  CpuBackend be;
  Rand rand(7, 403);
  const std::int64_t batch = 12, n = 10, rank = 3;
  const Matrix<float> x0 = random_matrix<float>(rand, batch, n),
                      xl = random_matrix<float>(rand, batch, n);
  const Matrix<float> v = random_matrix<float>(rand, rank, n),
                      w = random_matrix<float>(rand, n, rank);
  Matrix<float> u(batch, rank), z(batch, n), xn(batch, n);
  be.cross_forward(x0.cview(), xl.cview(), v.cview(), w.cview(), nullptr, u.view(), z.view(),
                   xn.view());
  const Matrix<float> g = random_matrix<float>(rand, batch, n);
  Matrix<float> dx0(batch, n), dxl(batch, n), dv(rank, n), dw(n, rank), du(batch, rank);
  be.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(), g.cview(),
                    dx0.view(), dxl.view(), dv.view(), dw.view(), nullptr, du.view());
  Matrix<float> g_then_dxl = g;
  Matrix<float> dx0b(batch, n), dv2(rank, n), dw2(n, rank);
  be.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                    g_then_dxl.cview(), dx0b.view(), g_then_dxl.view(), dv2.view(), dw2.view(),
                    nullptr, Mat());
  EXPECT_EQ(g_then_dxl.data, dxl.data);
  EXPECT_EQ(dv2.data, dv.data);
  EXPECT_EQ(dw2.data, dw.data);
  EXPECT_EQ(dx0b.data, dx0.data);
}

// The modes a stack of cross layers uses (the last starts dx0, layer 0 adds its dxl into it) give
// what the plain op followed by a zeroing or a sum gives.
TEST(CpuViews, CrossBackwardModesMatchTheComposition) {
  CpuBackend be;
  Rand rand(7, 404);
  const std::int64_t batch = 9, n = 12, rank = 4;
  const Matrix<float> x0 = random_matrix<float>(rand, batch, n), xl = x0;
  const Matrix<float> v = random_matrix<float>(rand, rank, n),
                      w = random_matrix<float>(rand, n, rank);
  Matrix<float> u(batch, rank), z(batch, n), xn(batch, n);
  be.cross_forward(x0.cview(), xl.cview(), v.cview(), w.cview(), nullptr, u.view(), z.view(),
                   xn.view());
  const Matrix<float> g = random_matrix<float>(rand, batch, n);
  const Matrix<float> start = random_matrix<float>(rand, batch, n);  // what dx0 holds before
  // Plain: dx0 += g ⊙ z, dxl written.
  Matrix<float> plain_dx0 = start, dxl(batch, n), dv(rank, n), dw(n, rank);
  std::vector<float> db(static_cast<std::size_t>(n));
  be.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(), g.cview(),
                    plain_dx0.view(), dxl.view(), dv.view(), dw.view(), db.data(), Mat());
  for (const bool first : {false, true}) {
    for (const bool into : {false, true}) {
      Matrix<float> dx0 = start, dxl2(batch, n), dv2(rank, n), dw2(n, rank);
      std::vector<float> db2(static_cast<std::size_t>(n));
      be.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                        g.cview(), dx0.view(), into ? Mat() : dxl2.view(), dv2.view(), dw2.view(),
                        db2.data(), Mat(), Backend::CrossBackwardMode{first, into});
      EXPECT_EQ(dv2.data, dv.data);
      EXPECT_EQ(dw2.data, dw.data);
      EXPECT_EQ(db2, db);
      if (!into) {
        EXPECT_EQ(dxl2.data, dxl.data);
      }
      for (std::int64_t i = 0; i < batch * n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const double want = (first ? plain_dx0.data[k] - start.data[k] : plain_dx0.data[k]) +
                            (into ? dxl.data[k] : 0.0);
        EXPECT_NEAR(dx0.data[k], want, 1e-5 * (1.0 + std::fabs(want)))
            << "first " << first << " into " << into << " at " << i;
      }
    }
  }
}

// ------------------------------------------------- bf16 activation storage --
// Activations stored in bf16 (the GPU under bf16 math): the CPU reads them exactly and rounds its
// fp32 results once. In the cross layer, u and z are rounded before they are read again (z from
// the stored u, x_next from the stored z), as a GPU that writes them to memory in between does.

std::vector<std::uint16_t> to_bf16(const Matrix<float>& m) {
  std::vector<std::uint16_t> b(m.data.size());
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16_bits(m.data[i]);
  return b;
}
Matrix<float> widen(const std::vector<std::uint16_t>& b, std::int64_t rows, std::int64_t cols) {
  Matrix<float> m(rows, cols);
  for (std::size_t i = 0; i < b.size(); ++i) m.data[i] = bf16_to_float(b[i]);
  return m;
}

TEST(CpuBf16Storage, CrossForwardRoundsWhatItStores) {
  CpuBackend cpu;
  Rand rand(77);
  const std::int64_t B = 9, N = 12, r = 3;
  const auto x0 = random_matrix<float>(rand, B, N), xl = random_matrix<float>(rand, B, N);
  const auto v = random_matrix<float>(rand, r, N, -0.5, 0.5),
             w = random_matrix<float>(rand, N, r, -0.5, 0.5);
  const auto bias = random_vector<float>(rand, N);
  const std::vector<std::uint16_t> x016 = to_bf16(x0), xl16 = to_bf16(xl);
  std::vector<std::uint16_t> u16(static_cast<std::size_t>(B * r)),
      z16(static_cast<std::size_t>(B * N)), xn16(static_cast<std::size_t>(B * N));
  cpu.cross_forward(CAMat(x016.data(), DType::bf16, B, N), CAMat(xl16.data(), DType::bf16, B, N),
                    v.cview(), w.cview(), bias.data(), AMat(u16.data(), DType::bf16, B, r),
                    AMat(z16.data(), DType::bf16, B, N), AMat(xn16.data(), DType::bf16, B, N));
  // u: the fp32 product of the stored inputs, rounded once.
  const Matrix<float> x0s = widen(x016, B, N), xls = widen(xl16, B, N);
  Matrix<float> u32(B, r), z32(B, N);
  cpu.linear_forward(xls.cview(), v.cview(), nullptr, Activation::none, u32.view());
  for (std::int64_t i = 0; i < B * r; ++i)
    EXPECT_EQ(u16[static_cast<std::size_t>(i)], bf16_bits(u32.data[static_cast<std::size_t>(i)]))
        << "u " << i;
  // z: from the stored u; x_next: from the stored z, both rounded once.
  const Matrix<float> us = widen(u16, B, r);
  cpu.linear_forward(us.cview(), w.cview(), bias.data(), Activation::none, z32.view());
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t c = 0; c < N; ++c) {
      const auto i = static_cast<std::size_t>(b * N + c);
      EXPECT_EQ(z16[i], bf16_bits(z32.data[i])) << "z " << i;
      const double zs = bf16_to_float(z16[i]);
      const auto want = static_cast<float>(static_cast<double>(x0s.data[i]) * zs +
                                           static_cast<double>(xls.data[i]));
      EXPECT_EQ(xn16[i], bf16_bits(want)) << "x_next " << i;
    }
  }
}

TEST(CpuBf16Storage, LinearBackwardReadsTheStoredValues) {
  CpuBackend cpu;
  Rand rand(78);
  const std::int64_t B = 7, in = 10, out = 6;
  const auto x = random_matrix<float>(rand, B, in), w = random_matrix<float>(rand, out, in);
  const auto y = random_matrix<float>(rand, B, out), dy = random_matrix<float>(rand, B, out);
  const std::vector<std::uint16_t> x16 = to_bf16(x), y16 = to_bf16(y);
  Matrix<float> dx(B, in), dw(out, in), dx_ref(B, in), dw_ref(out, in);
  std::vector<float> db(static_cast<std::size_t>(out)), db_ref(static_cast<std::size_t>(out));
  cpu.linear_backward(CAMat(x16.data(), DType::bf16, B, in), w.cview(),
                      CAMat(y16.data(), DType::bf16, B, out), dy.cview(), Activation::relu,
                      dx.view(), dw.view(), db.data());
  const Matrix<float> xs = widen(x16, B, in), ys = widen(y16, B, out);
  cpu.linear_backward(xs.cview(), w.cview(), ys.cview(), dy.cview(), Activation::relu,
                      dx_ref.view(), dw_ref.view(), db_ref.data());
  EXPECT_EQ(dx.data, dx_ref.data);
  EXPECT_EQ(dw.data, dw_ref.data);
  EXPECT_EQ(db, db_ref);
}

TEST(CpuBf16Storage, EmbeddingIntoAColumnBlockOfBf16) {
  CpuBackend be;
  Rand rand(5, 402);
  auto tables =
      test::pack_tables({40, 7}, {6, 3}, {Pooling::sum, Pooling::mean}, OptimizerKind::sgd);
  tables[1].out_col =
      8;  // columns 6 and 7 of the output belong to no table: the op leaves them alone
  const std::int64_t batch = 25, width = 11, wide = 16;
  const test::SparseBatch sparse = test::random_sparse(rand, batch, tables, 5);
  const std::vector<float> weights = random_vector<float>(rand, test::total_weights(tables));
  Matrix<float> out = nan_matrix<float>(batch, width);
  be.embedding_forward(tables, test::fp32_tables(weights.data()), sparse.input(), out.view());
  // Columns [4, 15) of a bf16 [batch, 16] buffer; the others (and the two gap columns) hold a
  // pattern that must survive.
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(batch * wide));
  for (std::size_t i = 0; i < bits.size(); ++i)
    bits[i] = static_cast<std::uint16_t>(0x3f80u + i % 97);
  const std::vector<std::uint16_t> before = bits;
  be.embedding_forward(tables, test::fp32_tables(weights.data()), sparse.input(),
                       AMat(bits.data(), DType::bf16, batch, wide).cols_slice(4, width));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t c = 0; c < wide; ++c) {
      const auto i = static_cast<std::size_t>(b * wide + c);
      if (c >= 4 && c < 4 + width && !(c - 4 == 6 || c - 4 == 7))
        EXPECT_EQ(bits[i], bf16_bits(out(b, c - 4))) << b << ", " << c;
      else
        EXPECT_EQ(bits[i], before[i]) << "gap " << b << ", " << c;
    }
  }
}

TEST(CpuBf16Storage, CrossBackwardWithBf16Gradients) {
  CpuBackend cpu;
  Rand rand(79);
  const std::int64_t B = 8, N = 12, r = 3;
  const auto x0 = random_matrix<float>(rand, B, N), xl = random_matrix<float>(rand, B, N);
  const auto v = random_matrix<float>(rand, r, N), w = random_matrix<float>(rand, N, r);
  const auto u = random_matrix<float>(rand, B, r), z = random_matrix<float>(rand, B, N);
  const auto g = random_matrix<float>(rand, B, N);
  const std::vector<std::uint16_t> g16 = to_bf16(g);
  const Matrix<float> gs = widen(g16, B, N);
  // Reference: fp32 views of the stored gradient; dxl rounded once.
  // dx0 starts from stored bf16 values (a middle layer accumulates into it).
  const auto dx0_init = random_matrix<float>(rand, B, N);
  std::vector<std::uint16_t> dx016 = to_bf16(dx0_init);
  Matrix<float> dx0_ref = widen(dx016, B, N), dxl_ref(B, N), dv_ref(r, N), dw_ref(N, r), dv(r, N),
                dw(N, r);
  std::vector<float> db_ref(static_cast<std::size_t>(N)), db(static_cast<std::size_t>(N));
  cpu.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(), gs.cview(),
                     dx0_ref.view(), dxl_ref.view(), dv_ref.view(), dw_ref.view(), db_ref.data(),
                     Mat(), {false, false});
  std::vector<std::uint16_t> dxl16(static_cast<std::size_t>(B * N));
  cpu.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                     CAMat(g16.data(), DType::bf16, B, N), AMat(dx016.data(), DType::bf16, B, N),
                     AMat(dxl16.data(), DType::bf16, B, N), dv.view(), dw.view(), db.data(), Mat(),
                     {false, false});
  EXPECT_EQ(dv.data, dv_ref.data);
  EXPECT_EQ(dw.data, dw_ref.data);
  EXPECT_EQ(db, db_ref);
  for (std::size_t i = 0; i < dxl16.size(); ++i) {
    EXPECT_EQ(dxl16[i], bf16_bits(dxl_ref.data[i])) << i;
    EXPECT_EQ(dx016[i], bf16_bits(dx0_ref.data[i])) << i;
  }
  Matrix<float> dx0(B, N);
  // The gradients must share a storage type: dxl in fp32 beside a bf16 g and dx0, and dx0 in
  // fp32 beside a bf16 g and dxl.
  Matrix<float> dxl32(B, N);
  EXPECT_THROW(cpu.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(),
                                  z.cview(), CAMat(g16.data(), DType::bf16, B, N),
                                  AMat(dx016.data(), DType::bf16, B, N), dxl32.view(), dv.view(),
                                  dw.view(), db.data(), Mat(), {false, false}),
               Error);
  EXPECT_THROW(cpu.cross_backward(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(),
                                  z.cview(), CAMat(g16.data(), DType::bf16, B, N), dx0.view(),
                                  AMat(dxl16.data(), DType::bf16, B, N), dv.view(), dw.view(),
                                  db.data(), Mat(), {false, false}),
               Error);
}

TEST(CpuBf16Storage, OtherStorageTypesAndMixedStorageAreErrors) {
  CpuBackend cpu;
  std::vector<std::uint16_t> h(64, 0);
  Matrix<float> w(2, 4), y(4, 2), z(4, 4);
  try {
    cpu.linear_forward(CAMat(h.data(), DType::f16, 4, 4), w.cview(), nullptr, Activation::none,
                       y.view());
    FAIL() << "an fp16 activation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward: x is stored as fp16"), std::string::npos)
        << e.what();
  }
  // A null bf16 view is the op's error, not a crash in the widening.
  EXPECT_THROW(cpu.linear_forward(CAMat(nullptr, DType::bf16, 4, 4), w.cview(), nullptr,
                                  Activation::none, y.view()),
               Error);
  Matrix<float> v(2, 4), wc(4, 2), u(4, 2), xn(4, 4);
  EXPECT_THROW(cpu.cross_forward(CAMat(h.data(), DType::bf16, 4, 4), z.cview(), v.cview(),
                                 wc.cview(), nullptr, u.view(), z.view(), xn.view()),
               Error);
}

}  // namespace
}  // namespace parity
