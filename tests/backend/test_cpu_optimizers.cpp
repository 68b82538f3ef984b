// Optimizer updates checked by hand on small cases, in float (through CpuBackend) and in double.
//
// Hyper-parameters are powers of two (or 1 - 2^-10), so that the float values the ops receive
// are exactly the numbers the expectations were worked out with (in Python, double precision).
// Float results are compared within 1e-6, double within 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "cpu_test_util.h"
#include "parity/error.h"

namespace parity {
namespace {

template <class T>
class CpuOptimizer : public ::testing::Test {
 protected:
  static constexpr double kTol = std::is_same_v<T, float> ? 1e-6 : 1e-12;

  void dense_step(std::vector<T>& params, const std::vector<T>& grads, std::vector<T>& state,
                  const OptimizerParams& opt, std::int64_t step) {
    const auto n = static_cast<std::int64_t>(params.size());
    if constexpr (std::is_same_v<T, float>) {
      backend_.dense_optimizer_step(params.data(), grads.data(), state.data(), n, opt, step);
    } else {
      cpu::dense_optimizer_step<T>(params.data(), grads.data(), state.data(), n, opt, step);
    }
  }

  void embedding_update(const std::vector<TableLayout>& tables, std::vector<T>& weights,
                        std::vector<T>& state, const test::SparseBatch& sparse,
                        const test::Matrix<T>& dout, const OptimizerParams& opt) {
    T* st = state.empty() ? nullptr : state.data();
    if constexpr (std::is_same_v<T, float>) {
      backend_.embedding_backward_update(tables, test::fp32_tables(weights.data()), st,
                                         sparse.input(), dout.cview(), opt, {});
    } else {
      cpu::embedding_backward_update<T>(tables, test::fp32_tables(weights.data()), st,
                                        sparse.input(), dout.cview(), opt, {});
    }
  }

  void expect_values(const std::vector<T>& actual, const std::vector<double>& expected,
                     const char* what) {
    ASSERT_EQ(actual.size(), expected.size()) << what;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(static_cast<double>(actual[i]), expected[i], kTol * (1.0 + std::abs(expected[i])))
          << what << "[" << i << "]";
    }
  }

  // One table of 5 rows, dim 2, row r = (1 + r, 0.5 r), in a buffer after 4 unrelated floats;
  // bags (1, 3, 1), (), (3), so the gradient is 2·dout(0) for row 1 and dout(0) + dout(2) for
  // row 3; the empty bag's dout must not matter.
  struct EmbeddingCase {
    std::vector<TableLayout> tables;
    std::vector<T> weights;
    test::SparseBatch sparse;
    test::Matrix<T> dout;
  };
  EmbeddingCase embedding_case(Pooling pooling, OptimizerKind kind) {
    EmbeddingCase c;
    c.tables = test::pack_tables({5}, {2}, {pooling}, kind);
    c.tables[0].weight_offset = 4;
    c.weights = {T(-9), T(-9), T(-9), T(-9)};
    for (int r = 0; r < 5; ++r) {
      c.weights.push_back(T(1 + r));
      c.weights.push_back(T(0.5 * r));
    }
    c.sparse = test::make_sparse({{{1, 3, 1}, {}, {3}}});
    c.dout = test::Matrix<T>(3, 2);
    c.dout(0, 0) = T(1);
    c.dout(0, 1) = T(2);
    c.dout(1, 0) = T(100);
    c.dout(1, 1) = T(100);
    c.dout(2, 0) = T(0.5);
    c.dout(2, 1) = T(-1);
    return c;
  }
  // Expected weight buffer: untouched rows (0, 2, 4) and the leading floats are unchanged.
  static std::vector<double> with_rows(std::vector<double> row1, std::vector<double> row3) {
    return {-9, -9, -9, -9, 1, 0, row1[0], row1[1], 3, 1, row3[0], row3[1], 5, 2};
  }

  CpuBackend backend_;
};

using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuOptimizer, Scalars);

TYPED_TEST(CpuOptimizer, DenseSgdWithWeightDecay) {
  using T = TypeParam;
  std::vector<T> w{1, -2, 0.5};
  std::vector<T> state;
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 0.125f;
  opt.weight_decay = 0.0625f;
  this->dense_step(w, {0.5, 0.25, -1}, state, opt, 1);
  // w - lr (g + wd w)
  this->expect_values(w, {0.9296875, -2.015625, 0.62109375}, "w");
}

TYPED_TEST(CpuOptimizer, DenseAdagrad) {
  using T = TypeParam;
  for (float wd : {0.0f, 0.0625f}) {
    std::vector<T> w{1, -2, 0.5};
    std::vector<T> s{0.5, 0, 2};
    OptimizerParams opt;
    opt.kind = OptimizerKind::adagrad;
    opt.lr = 0.125f;
    opt.eps = 1e-8f;
    opt.weight_decay = wd;
    this->dense_step(w, {0.5, 0.25, -1}, s, opt, 1);
    if (wd == 0.0f) {
      this->expect_values(s, {0.75, 0.0625, 3.0}, "s");
      this->expect_values(w, {0.9278312171846301, -2.124999995, 0.5721687832320366}, "w");
    } else {  // g' = g + wd w feeds both the state and the step
      this->expect_values(s, {0.81640625, 0.015625, 2.9384765625}, "s (wd)");
      this->expect_values(w, {0.9221821236763106, -2.124999990000001, 0.5706416135309034},
                          "w (wd)");
    }
  }
}

TYPED_TEST(CpuOptimizer, DenseAdamBiasCorrectionSteps1And2) {
  using T = TypeParam;
  for (float wd : {0.0f, 0.0625f}) {
    std::vector<T> w{1, -2};
    std::vector<T> state(4, T(0));  // m [0, 2), v [2, 4)
    OptimizerParams opt;
    opt.kind = OptimizerKind::adam;
    opt.lr = 0.015625f;
    opt.beta1 = 0.875f;
    opt.beta2 = 0.9990234375f;
    opt.eps = 1e-8f;
    opt.weight_decay = wd;
    this->dense_step(w, {0.5, -0.25}, state, opt, 1);
    // Step 1: m̂ = g and v̂ = g², so each weight moves by about lr (1 + wd w).
    this->expect_values(state, {0.0625, -0.03125, 0.000244140625, 6.103515625e-05}, "state 1");
    if (wd == 0.0f) {
      this->expect_values(w, {0.9843750003125, -1.984375000625}, "w 1");
    } else {
      this->expect_values(w, {0.9833984378125, -1.982421875625}, "w 1 (wd)");
    }
    this->dense_step(w, {T(0.1), T(0.3)}, state, opt, 2);
    if constexpr (std::is_same_v<T, double>) {
      // The step-2 gradient 0.1 is not a float; the float case starts from 0.1f, close enough.
      this->expect_values(
          state, {0.0671875, 0.010156249999999999, 0.00025366783142089845, 0.0001488661766052246},
          "state 2");
    }
    const std::vector<double> w2 =
        wd == 0.0f ? std::vector<double>{0.971949225548824, -1.9868269023286507}
                   : std::vector<double>{0.9700123130118977, -1.9829378184657356};
    for (std::size_t i = 0; i < 2; ++i) EXPECT_NEAR(w[i], w2[i], 1e-6) << "w 2 [" << i << "]";
  }
}

TYPED_TEST(CpuOptimizer, DenseRejectsRowwiseAndBadStep) {
  using T = TypeParam;
  std::vector<T> w{1}, s{0, 0};
  OptimizerParams opt;
  opt.kind = OptimizerKind::rowwise_adagrad;
  EXPECT_THROW(this->dense_step(w, {1}, s, opt, 1), Error);
  opt.kind = OptimizerKind::adam;
  EXPECT_THROW(this->dense_step(w, {1}, s, opt, 0), Error);
}

TYPED_TEST(CpuOptimizer, EmbeddingSgdCombinesDuplicates) {
  auto c = this->embedding_case(Pooling::sum, OptimizerKind::sgd);
  std::vector<TypeParam> no_state;
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 0.125f;
  this->embedding_update(c.tables, c.weights, no_state, c.sparse, c.dout, opt);
  // row 1: g = 2 dout(0) = (2, 4); row 3: g = dout(0) + dout(2) = (1.5, 1).
  this->expect_values(c.weights, this->with_rows({1.75, 0.0}, {3.8125, 1.375}), "weights");
}

TYPED_TEST(CpuOptimizer, EmbeddingSgdWeightDecayOnTouchedRowsOnly) {
  auto c = this->embedding_case(Pooling::sum, OptimizerKind::sgd);
  std::vector<TypeParam> no_state;
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 0.125f;
  opt.weight_decay = 0.0625f;
  this->embedding_update(c.tables, c.weights, no_state, c.sparse, c.dout, opt);
  this->expect_values(c.weights, this->with_rows({1.734375, -0.00390625}, {3.78125, 1.36328125}),
                      "weights");
}

TYPED_TEST(CpuOptimizer, EmbeddingMeanPoolingDividesByBagSize) {
  auto c = this->embedding_case(Pooling::mean, OptimizerKind::sgd);
  std::vector<TypeParam> no_state;
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 0.125f;
  this->embedding_update(c.tables, c.weights, no_state, c.sparse, c.dout, opt);
  // row 1: 2 dout(0) / 3; row 3: dout(0) / 3 + dout(2) / 1.
  this->expect_values(c.weights,
                      this->with_rows({1.9166666666666667, 0.33333333333333337},
                                      {3.8958333333333335, 1.5416666666666667}),
                      "weights");
}

TYPED_TEST(CpuOptimizer, EmbeddingAdagradTouchedStateOnly) {
  using T = TypeParam;
  auto c = this->embedding_case(Pooling::sum, OptimizerKind::adagrad);
  std::vector<T> state(2 + 10, T(1));  // two leading floats, then 5 rows x 2
  c.tables[0].state_offset = 2;
  OptimizerParams opt;
  opt.kind = OptimizerKind::adagrad;
  opt.lr = 0.125f;
  opt.eps = 1e-8f;
  this->embedding_update(c.tables, c.weights, state, c.sparse, c.dout, opt);
  this->expect_values(c.weights,
                      this->with_rows({1.8881966016250105, 0.3787321877759512},
                                      {3.8959937137846925, 1.4116116529766816}),
                      "weights");
  this->expect_values(state, {1, 1, 1, 1, 5, 17, 1, 1, 3.25, 2, 1, 1}, "state");
}

TYPED_TEST(CpuOptimizer, EmbeddingRowwiseAdagradTouchedStateOnly) {
  using T = TypeParam;
  auto c = this->embedding_case(Pooling::sum, OptimizerKind::rowwise_adagrad);
  std::vector<T> state(5, T(1));  // one per row
  OptimizerParams opt;
  opt.kind = OptimizerKind::rowwise_adagrad;
  opt.lr = 0.125f;
  opt.eps = 1e-8f;
  this->embedding_update(c.tables, c.weights, state, c.sparse, c.dout, opt);
  // s += mean_d(g²): row 1 (4 + 16) / 2 = 10, row 3 (2.25 + 1) / 2 = 1.625.
  this->expect_values(state, {1, 11, 1, 2.625, 1}, "state");
  this->expect_values(c.weights,
                      this->with_rows({1.9246221640828318, 0.34924432816566364},
                                      {3.8842724882427166, 1.4228483254951445}),
                      "weights");
}

TYPED_TEST(CpuOptimizer, EmbeddingSameIdInTwoTablesIsTwoRows) {
  using T = TypeParam;
  // Two tables of 3 rows, dim 1, in one buffer; id 2 occurs in both.
  const auto tables = test::pack_tables({3, 3}, {1, 1}, {Pooling::sum, Pooling::sum});
  std::vector<T> weights{0, 0, 0, 0, 0, 0};
  std::vector<T> no_state;
  const test::SparseBatch sparse = test::make_sparse({{{2}, {2}}, {{2}, {0}}});
  test::Matrix<T> dout(2, 2);  // columns: table 0, table 1
  dout(0, 0) = T(1);
  dout(1, 0) = T(2);
  dout(0, 1) = T(4);
  dout(1, 1) = T(8);
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 1.0f;
  this->embedding_update(tables, weights, no_state, sparse, dout, opt);
  this->expect_values(weights, {0, 0, -3, -8, 0, -4}, "weights");
}

TYPED_TEST(CpuOptimizer, EmbeddingRejectsAdamAndMissingState) {
  auto c = this->embedding_case(Pooling::sum, OptimizerKind::adagrad);
  std::vector<TypeParam> no_state;
  OptimizerParams opt;
  opt.kind = OptimizerKind::adam;
  EXPECT_THROW(this->embedding_update(c.tables, c.weights, no_state, c.sparse, c.dout, opt), Error);
  opt.kind = OptimizerKind::adagrad;
  EXPECT_THROW(this->embedding_update(c.tables, c.weights, no_state, c.sparse, c.dout, opt), Error);
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// fp16/bf16 tables live in a buffer of their own type: an updated row is its update in double,
// rounded to fp32 and then stochastically with the bits of (seed, step, table, row, column), as
// the GPU kernels round; untouched rows keep their bits, and fp32 tables beside them are updated
// as before.
TEST(CpuEmbeddingPrecision, NarrowTablesAreStoredAndRoundedStochastically) {
  CpuBackend backend;
  for (DType dt : {DType::f16, DType::bf16}) {
    auto tables = test::pack_tables({3, 5}, {2, 2}, {Pooling::sum, Pooling::sum});
    tables[1].dtype = dt;
    tables[1].weight_offset = 0;  // the first table of its own buffer
    std::vector<float> w32 = {1, 2, 3, 4, 5, 6};
    const std::vector<float> start = {1, 0, 2, 0.5f, 3, 1, 4, 1.5f, 5, 2};
    std::vector<std::uint16_t> w16(start.size());
    for (std::size_t i = 0; i < start.size(); ++i)
      store_element(w16.data(), dt, static_cast<std::int64_t>(i), start[i]);
    const std::vector<std::uint16_t> before = w16;
    const auto sparse = test::make_sparse({{{0}, {}, {2}}, {{1, 3, 1}, {}, {3}}});
    test::Matrix<float> dout(3, 4);
    const float g[3][4] = {{0.25f, -1, 1, 2}, {100, 100, 100, 100}, {2, 0.5f, 0.5f, -1}};
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) dout(r, c) = g[r][c];
    OptimizerParams opt;
    opt.kind = OptimizerKind::sgd;
    opt.lr = 0.0123f;  // not a power of two: the results are not representable in fp16/bf16
    const StochasticRounding rounding{7, 3};
    TableWeights weights;
    weights.f32 = w32.data();
    (dt == DType::f16 ? weights.f16 : weights.bf16) = w16.data();
    backend.embedding_backward_update(tables, weights, nullptr, sparse.input(), dout.cview(), opt,
                                      rounding);
    const double lr = opt.lr;
    // Table 0 (fp32): rows 0 and 2, each once.
    EXPECT_EQ(w32[0], static_cast<float>(1 - lr * 0.25));
    EXPECT_EQ(w32[5], static_cast<float>(6 - lr * 0.5));
    EXPECT_EQ(w32[2], 3);
    // Table 1: row 1 twice in bag 0 (g = 2 dout(0, 2..3)); row 3 in bags 0 and 2.
    auto expect_row = [&](std::int64_t row, double g0, double g1) {
      const std::uint64_t key = rng::row_key(rng::key(7, 3), 1, static_cast<std::uint64_t>(row));
      const double grad[2] = {g0, g1};
      for (int c = 0; c < 2; ++c) {
        const auto i = static_cast<std::size_t>(row * 2 + c);
        const auto v = static_cast<float>(start[i] - lr * grad[c]);
        const std::uint32_t bits = rng::bits16(key, static_cast<std::uint64_t>(c));
        EXPECT_EQ(w16[i], dt == DType::f16 ? half_bits_sr(v, bits) : bf16_bits_sr(v, bits))
            << dtype_name(dt) << " row " << row << " col " << c;
        // Either neighbour of the exact value, never further.
        const float got = load_element(w16.data(), dt, static_cast<std::int64_t>(i));
        EXPECT_LE(std::fabs(got - v), std::fabs(v) * (dt == DType::f16 ? 1e-3f : 8e-3f));
      }
    };
    expect_row(1, 2.0, 4.0);
    expect_row(3, 1.5, 1.0);
    for (const std::size_t i : {0u, 1u, 4u, 5u, 8u, 9u}) EXPECT_EQ(w16[i], before[i]);
  }
}

}  // namespace
}  // namespace parity
