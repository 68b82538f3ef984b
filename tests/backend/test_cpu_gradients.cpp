// Finite-difference checks of every backward op of the CPU reference, in double.
//
// Each test draws random shapes and values from a seed, forms the scalar objective
// L = Σ dy ⊙ y(θ) with a random dy (the loss itself for bce), and compares the analytic gradient
// with central differences (h = 1e-6). Shapes are kept small so that the rounding error of L,
// divided by 2h, stays far below the 1e-6 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "cpu_test_util.h"

namespace parity {
namespace {

using test::Matrix;
using test::Rand;
using test::random_matrix;
using test::random_vector;

using test::check_gradient;
using test::dot;

class Seeded : public ::testing::TestWithParam<int> {};

// ------------------------------------------------------------------ linear --

void check_linear(int seed, Activation act) {
  Rand rand(static_cast<std::uint64_t>(seed), act == Activation::relu ? 11 : 10);
  const std::int64_t batch = rand.integer(1, 6);
  const std::int64_t in = rand.integer(1, 9);
  const std::int64_t out = rand.integer(1, 7);
  Matrix<double> x = random_matrix<double>(rand, batch, in);    // [B, in]
  Matrix<double> w = random_matrix<double>(rand, out, in);      // [out, in]
  std::vector<double> bias = random_vector<double>(rand, out);  // [out]
  Matrix<double> dy = random_matrix<double>(rand, batch, out);  // [B, out]

  // Keep pre-activations away from relu's kink: redraw a row of x while any |z| < 1e-3.
  if (act == Activation::relu) {
    Matrix<double> z(batch, out);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      cpu::linear_forward<double>(x.cview(), w.cview(), bias.data(), Activation::none, z.view());
      bool clear = true;
      for (std::int64_t b = 0; b < batch; ++b) {
        for (std::int64_t o = 0; o < out; ++o) {
          if (std::abs(z(b, o)) < 1e-3) {
            clear = false;
            for (std::int64_t i = 0; i < in; ++i) x(b, i) = rand.uniform();
            break;
          }
        }
      }
      if (clear) break;
    }
  }

  Matrix<double> y(batch, out);
  auto objective = [&] {
    cpu::linear_forward<double>(x.cview(), w.cview(), bias.data(), act, y.view());
    return dot(dy.cview(), y.cview());
  };
  objective();
  Matrix<double> dx = test::nan_matrix<double>(batch, in);
  Matrix<double> dw = test::nan_matrix<double>(out, in);
  std::vector<double> dbias(static_cast<std::size_t>(out), NAN);
  cpu::linear_backward<double>(x.cview(), w.cview(), y.cview(), dy.cview(), act, dx.view(),
                               dw.view(), dbias.data());
  const std::string tag = "seed " + std::to_string(seed) + " ";
  check_gradient(tag + "dx", x.ptr(), dx.ptr(), batch * in, objective);
  check_gradient(tag + "dw", w.ptr(), dw.ptr(), out * in, objective);
  check_gradient(tag + "dbias", bias.data(), dbias.data(), out, objective);
}

TEST_P(Seeded, LinearNone) {
  check_linear(GetParam(), Activation::none);
}
TEST_P(Seeded, LinearRelu) {
  check_linear(GetParam(), Activation::relu);
}

// ------------------------------------------------------------- embeddings --

// Checks embedding_gradient against finite differences of L = Σ dout ⊙ out over every weight,
// and that it lists exactly the rows that occur, in ascending (table, row) order.
void check_embedding(const std::vector<TableLayout>& tables, const test::SparseBatch& sparse,
                     std::int64_t out_cols, Rand& rand, const std::string& tag) {
  const SparseInput in = sparse.input();
  std::vector<double> weights = random_vector<double>(rand, test::total_weights(tables));
  Matrix<double> dout = random_matrix<double>(rand, in.batch, out_cols);  // [B, out_cols]
  Matrix<double> out(in.batch, out_cols);                                 // [B, out_cols]

  auto objective = [&] {
    cpu::embedding_forward<double>(tables, test::fp32_tables(weights.data()), in, out.view());
    double s = 0.0;
    for (const TableLayout& tl : tables) {
      s += dot(out.cview().cols_slice(tl.out_col, tl.dim),
               dout.cview().cols_slice(tl.out_col, tl.dim));
    }
    return s;
  };

  const cpu::EmbeddingGradient g = cpu::embedding_gradient<double>(tables, in, dout.cview());
  ASSERT_EQ(g.table.size(), g.row.size());
  ASSERT_EQ(g.offset.size(), g.row.size() + 1);
  std::vector<double> dense(weights.size(), 0.0);  // the gradient scattered over all weights
  for (std::size_t u = 0; u < g.row.size(); ++u) {
    if (u > 0) {
      EXPECT_LT(std::make_pair(g.table[u - 1], g.row[u - 1]), std::make_pair(g.table[u], g.row[u]))
          << tag << "entries must be distinct and in ascending (table, row) order";
    }
    const TableLayout& tl = tables[g.table[u]];
    ASSERT_EQ(g.offset[u + 1] - g.offset[u], tl.dim);
    for (int d = 0; d < tl.dim; ++d) {
      dense[tl.weight_offset + g.row[u] * tl.dim + d] = g.grad[g.offset[u] + d];
    }
  }
  // The rows that occur, from the input directly.
  std::map<std::pair<int, std::int64_t>, int> occurs;
  for (int t = 0; t < in.num_tables; ++t) {
    for (std::int64_t j = in.offsets[t * in.batch]; j < in.offsets[(t + 1) * in.batch]; ++j) {
      occurs[{t, in.ids[j]}] = 1;
    }
  }
  EXPECT_EQ(occurs.size(), g.row.size()) << tag << "one entry per distinct occurring row";

  check_gradient(tag + "dweights", weights.data(), dense.data(),
                 static_cast<std::int64_t>(weights.size()), objective);
}

TEST(CpuGradients, EmbeddingDuplicatesAndEmptyBags) {
  Rand rand(7, 20);
  // Table 0 sum, tables 1 and 2 mean; output columns start at 1 and leave a gap at the end.
  const auto tables =
      test::pack_tables({5, 4, 6}, {3, 2, 4}, {Pooling::sum, Pooling::mean, Pooling::mean},
                        OptimizerKind::sgd, /*first_col=*/1);
  const test::SparseBatch sparse = test::make_sparse({
      {{1, 3, 1}, {}, {3}, {0, 0, 0}},  // table 0: duplicates within and across bags
      {{2}, {2, 2, 0}, {}, {1, 3}},     // table 1: mean with duplicates and an empty bag
      {{}, {}, {5, 5}, {5}},            // table 2: rows 0-4 never occur
  });
  check_embedding(tables, sparse, 1 + 3 + 2 + 4 + 2, rand, "explicit ");
}

TEST_P(Seeded, EmbeddingRandom) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 21);
  const int num_tables = static_cast<int>(rand.integer(1, 3));
  std::vector<std::int64_t> rows;
  std::vector<int> dims;
  std::vector<Pooling> pooling;
  for (int t = 0; t < num_tables; ++t) {
    rows.push_back(rand.integer(1, 6));
    dims.push_back(static_cast<int>(rand.integer(1, 4)));
    pooling.push_back(rand.integer(0, 1) == 0 ? Pooling::sum : Pooling::mean);
  }
  const auto tables = test::pack_tables(rows, dims, pooling);
  std::int64_t cols = 0;
  for (int d : dims) cols += d;
  const test::SparseBatch sparse = test::random_sparse(rand, rand.integer(1, 5), tables, 4);
  check_embedding(tables, sparse, cols, rand, "seed " + std::to_string(GetParam()) + " ");
}

// The fused update consumes exactly embedding_gradient: sgd with lr = 1 gives w - g.
TEST(CpuGradients, EmbeddingUpdateUsesTheGradient) {
  Rand rand(3, 22);
  const auto tables = test::pack_tables({7, 5}, {3, 2}, {Pooling::mean, Pooling::sum});
  const test::SparseBatch sparse = test::random_sparse(rand, 6, tables, 5);
  std::vector<double> weights = random_vector<double>(rand, test::total_weights(tables));
  const Matrix<double> dout = random_matrix<double>(rand, 6, 5);
  const cpu::EmbeddingGradient g =
      cpu::embedding_gradient<double>(tables, sparse.input(), dout.cview());
  std::vector<double> expected = weights;
  for (std::size_t u = 0; u < g.row.size(); ++u) {
    const TableLayout& tl = tables[g.table[u]];
    for (int d = 0; d < tl.dim; ++d) {
      expected[tl.weight_offset + g.row[u] * tl.dim + d] -= g.grad[g.offset[u] + d];
    }
  }
  OptimizerParams opt;
  opt.kind = OptimizerKind::sgd;
  opt.lr = 1.0f;
  cpu::embedding_backward_update<double>(tables, test::fp32_tables(weights.data()), nullptr,
                                         sparse.input(), dout.cview(), opt, {});
  EXPECT_EQ(weights, expected);
}

// -------------------------------------------------------- dot interaction --

TEST_P(Seeded, DotInteraction) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 30);
  const std::int64_t batch = rand.integer(1, 3);
  const std::int64_t dim = rand.integer(1, 5);
  const int num_tables = static_cast<int>(rand.integer(0, 4));
  const std::int64_t f = num_tables + 1;
  const std::int64_t out_cols = dim + f * (f - 1) / 2;
  Matrix<double> dense = random_matrix<double>(rand, batch, dim);             // [B, D]
  Matrix<double> emb = random_matrix<double>(rand, batch, num_tables * dim);  // [B, T*D]
  Matrix<double> dout = random_matrix<double>(rand, batch, out_cols);         // [B, D + F(F-1)/2]
  Matrix<double> out(batch, out_cols);
  auto objective = [&] {
    cpu::dot_interaction_forward<double>(dense.cview(), emb.cview(), num_tables, out.view());
    return dot(dout.cview(), out.cview());
  };
  Matrix<double> ddense = test::nan_matrix<double>(batch, dim);
  Matrix<double> demb = test::nan_matrix<double>(batch, num_tables * dim);
  cpu::dot_interaction_backward<double>(dense.cview(), emb.cview(), num_tables, dout.cview(),
                                        ddense.view(), demb.view());
  const std::string tag = "seed " + std::to_string(GetParam()) + " ";
  check_gradient(tag + "ddense", dense.ptr(), ddense.ptr(), batch * dim, objective);
  check_gradient(tag + "demb", emb.ptr(), demb.ptr(), batch * num_tables * dim, objective);
}

// ------------------------------------------------------------- cross layer --

TEST_P(Seeded, CrossLayer) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 40);
  const std::int64_t batch = rand.integer(1, 4);
  const std::int64_t n = rand.integer(1, 6);
  const std::int64_t rank = rand.integer(1, 3);
  Matrix<double> x0 = random_matrix<double>(rand, batch, n);  // [B, N]
  Matrix<double> xl = random_matrix<double>(rand, batch, n);  // [B, N]
  Matrix<double> v = random_matrix<double>(rand, rank, n);    // [r, N]
  Matrix<double> w = random_matrix<double>(rand, n, rank);    // [N, r]
  std::vector<double> bias = random_vector<double>(rand, n);  // [N]
  Matrix<double> g = random_matrix<double>(rand, batch, n);   // [B, N] dL/dx_next
  Matrix<double> u(batch, rank), z(batch, n), x_next(batch, n);
  auto objective = [&] {
    cpu::cross_forward<double>(x0.cview(), xl.cview(), v.cview(), w.cview(), bias.data(), u.view(),
                               z.view(), x_next.view());
    return dot(g.cview(), x_next.cview());
  };
  objective();

  // dx0 accumulates: start it from known values and subtract them afterwards.
  const Matrix<double> dx0_start = random_matrix<double>(rand, batch, n);
  Matrix<double> dx0 = dx0_start;
  Matrix<double> dxl = test::nan_matrix<double>(batch, n);
  Matrix<double> dv = test::nan_matrix<double>(rank, n);
  Matrix<double> dw = test::nan_matrix<double>(n, rank);
  Matrix<double> du = test::nan_matrix<double>(batch, rank);
  std::vector<double> dbias(static_cast<std::size_t>(n), NAN);
  cpu::cross_backward<double>(x0.cview(), xl.cview(), v.cview(), w.cview(), u.cview(), z.cview(),
                              g.cview(), dx0.view(), dxl.view(), dv.view(), dw.view(), dbias.data(),
                              du.view());
  for (std::size_t i = 0; i < dx0.data.size(); ++i) dx0.data[i] -= dx0_start.data[i];

  const std::string tag = "seed " + std::to_string(GetParam()) + " ";
  check_gradient(tag + "dx0", x0.ptr(), dx0.ptr(), batch * n, objective);
  check_gradient(tag + "dxl", xl.ptr(), dxl.ptr(), batch * n, objective);
  check_gradient(tag + "dv", v.ptr(), dv.ptr(), rank * n, objective);
  check_gradient(tag + "dw", w.ptr(), dw.ptr(), n * rank, objective);
  check_gradient(tag + "dbias", bias.data(), dbias.data(), n, objective);
}

// --------------------------------------------------------------------- bce --

TEST_P(Seeded, BceWithLogits) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 50);
  const std::int64_t n = rand.integer(1, 10);
  std::vector<double> logits = random_vector<double>(rand, n, -4.0, 4.0);
  std::vector<double> labels(static_cast<std::size_t>(n));
  for (auto& y : labels) {  // hard labels, and some soft ones
    const std::int64_t k = rand.integer(0, 2);
    y = k == 2 ? rand.uniform(0.0, 1.0) : static_cast<double>(k);
  }
  std::vector<double> dlogits(static_cast<std::size_t>(n));
  double loss = 0.0;
  auto objective = [&] {
    std::vector<double> scratch(static_cast<std::size_t>(n));
    double l = 0.0;
    cpu::bce_with_logits<double>(logits.data(), labels.data(), n, scratch.data(), &l);
    return l;
  };
  cpu::bce_with_logits<double>(logits.data(), labels.data(), n, dlogits.data(), &loss);
  check_gradient("seed " + std::to_string(GetParam()) + " dlogits", logits.data(), dlogits.data(),
                 n, objective);
}

INSTANTIATE_TEST_SUITE_P(CpuGradients, Seeded, ::testing::Range(0, 8));

}  // namespace
}  // namespace parity
