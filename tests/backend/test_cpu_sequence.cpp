// The HSTU ops of the CPU reference (cpu_sequence.cpp): each backward against central finite
// differences in double, the attention against a padded dense formulation written here from the
// op's definition, its masks and bias buckets, the float path against the double one, thread
// counts, and bad sequences refused by name.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "cpu_test_util.h"
#include "parity/error.h"

namespace parity {
namespace {

using test::Matrix;
using test::Rand;
using test::random_matrix;
using test::random_vector;

using test::check_gradient;
using test::dot;

// The element pointer of a matrix, for check_gradient (contiguous: ld == cols).
template <class T>
double* elements(Matrix<T>& m) {
  EXPECT_EQ(m.ld, m.cols);
  return m.ptr();
}

class SequenceSeeded : public ::testing::TestWithParam<int> {};

// ------------------------------------------------------------- layer norm --

TEST_P(SequenceSeeded, LayerNormGradients) {
  for (const bool affine : {false, true}) {
    Rand rand(static_cast<std::uint64_t>(GetParam()), affine ? 31 : 30);
    const std::int64_t rows = rand.integer(1, 5), cols = rand.integer(1, 9);
    Matrix<double> x = random_matrix<double>(rand, rows, cols, -2.0, 2.0);
    std::vector<double> gamma = random_vector<double>(rand, cols, 0.5, 1.5);
    std::vector<double> beta = random_vector<double>(rand, cols);
    Matrix<double> dy = random_matrix<double>(rand, rows, cols);
    Matrix<double> y(rows, cols);
    std::vector<double> mean(static_cast<std::size_t>(rows)), rstd(mean.size());
    const double* g = affine ? gamma.data() : nullptr;
    const double* b = affine ? beta.data() : nullptr;
    constexpr double eps = 1e-5;
    auto objective = [&] {
      cpu::layer_norm_forward<double>(x.cview(), g, b, eps, y.view(), mean.data(), rstd.data());
      return dot(dy.cview(), y.cview());
    };
    objective();
    Matrix<double> dx = test::nan_matrix<double>(rows, cols);
    std::vector<double> dgamma(static_cast<std::size_t>(cols), NAN), dbeta(dgamma);
    cpu::layer_norm_backward<double>(x.cview(), g, mean.data(), rstd.data(), dy.cview(), dx.view(),
                                     dgamma.data(), dbeta.data());
    const std::string tag = "seed " + std::to_string(GetParam()) + (affine ? " affine " : " ");
    check_gradient(tag + "dx", elements(x), dx.ptr(), rows * cols, objective);
    if (affine) {
      check_gradient(tag + "dgamma", gamma.data(), dgamma.data(), cols, objective);
      check_gradient(tag + "dbeta", beta.data(), dbeta.data(), cols, objective);
    }
  }
}

TEST(CpuSequence, LayerNormNormalises) {
  Rand rand(1, 32);
  Matrix<double> x = random_matrix<double>(rand, 3, 16, -4.0, 9.0);
  Matrix<double> y = test::nan_matrix<double>(3, 16);
  std::vector<double> mean(3), rstd(3);
  cpu::layer_norm_forward<double>(x.cview(), nullptr, nullptr, 1e-12, y.view(), mean.data(),
                                  rstd.data());
  for (int r = 0; r < 3; ++r) {
    double s = 0.0, sq = 0.0;
    for (int c = 0; c < 16; ++c) {
      s += y(r, c);
      sq += y(r, c) * y(r, c);
    }
    EXPECT_NEAR(s / 16, 0.0, 1e-12);
    EXPECT_NEAR(sq / 16, 1.0, 1e-9);
  }
}

TEST_P(SequenceSeeded, NormMulGradients) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 33);
  const std::int64_t rows = rand.integer(1, 5), cols = rand.integer(1, 9);
  Matrix<double> x = random_matrix<double>(rand, rows, cols, -2.0, 2.0);
  Matrix<double> u = random_matrix<double>(rand, rows, cols);
  Matrix<double> dy = random_matrix<double>(rand, rows, cols);
  Matrix<double> y(rows, cols);
  std::vector<double> mean(static_cast<std::size_t>(rows)), rstd(mean.size());
  auto objective = [&] {
    cpu::norm_mul_forward<double>(x.cview(), u.cview(), 1e-5, y.view(), mean.data(), rstd.data());
    return dot(dy.cview(), y.cview());
  };
  objective();
  Matrix<double> dx = test::nan_matrix<double>(rows, cols),
                 du = test::nan_matrix<double>(rows, cols);
  cpu::norm_mul_backward<double>(x.cview(), u.cview(), mean.data(), rstd.data(), dy.cview(),
                                 dx.view(), du.view());
  const std::string tag = "seed " + std::to_string(GetParam()) + " ";
  check_gradient(tag + "dx", elements(x), dx.ptr(), rows * cols, objective);
  check_gradient(tag + "du", elements(u), du.ptr(), rows * cols, objective);
}

TEST_P(SequenceSeeded, SiluGradient) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 34);
  const std::int64_t rows = rand.integer(1, 5), cols = rand.integer(1, 9);
  Matrix<double> x = random_matrix<double>(rand, rows, cols, -6.0, 6.0);
  Matrix<double> dy = random_matrix<double>(rand, rows, cols);
  Matrix<double> y(rows, cols);
  auto objective = [&] {
    cpu::silu_forward<double>(x.cview(), y.view());
    return dot(dy.cview(), y.cview());
  };
  objective();
  EXPECT_DOUBLE_EQ(y(0, 0), x(0, 0) / (1.0 + std::exp(-x(0, 0))));
  Matrix<double> dx = test::nan_matrix<double>(rows, cols);
  cpu::silu_backward<double>(x.cview(), dy.cview(), dx.view());
  check_gradient("seed " + std::to_string(GetParam()) + " dx", elements(x), dx.ptr(), rows * cols,
                 objective);
}

// ------------------------------------------------------------ row copies --

TEST(CpuSequence, GatherAndScatterRows) {
  Rand rand(2, 35);
  Matrix<float> src = random_matrix<float>(rand, 6, 3);
  const std::vector<std::int64_t> index{5, 0, 3};
  Matrix<float> dst = test::nan_matrix<float>(3, 3);
  cpu::gather_rows<float>(src.cview(), index.data(), dst.view());
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(dst(i, c), src(index[i], c));

  Matrix<float> full = random_matrix<float>(rand, 6, 3);
  const Matrix<float> before = full;
  cpu::scatter_add_rows<float>(dst.cview(), index.data(), full.view());
  for (int r = 0; r < 6; ++r) {
    const auto it = std::find(index.begin(), index.end(), r);
    for (int c = 0; c < 3; ++c) {
      const float want =
          it == index.end()
              ? before(r, c)
              : static_cast<float>(static_cast<double>(before(r, c)) + dst(it - index.begin(), c));
      EXPECT_EQ(full(r, c), want) << r << ", " << c;
    }
  }

  const std::vector<std::int64_t> outside{1, 6, 2};
  EXPECT_THROW(cpu::gather_rows<float>(src.cview(), outside.data(), dst.view()), InputError);
  const std::vector<std::int64_t> twice{1, 4, 1};
  try {
    cpu::scatter_add_rows<float>(dst.cview(), twice.data(), full.view());
    ADD_FAILURE() << "a repeated index was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("index[2] is 1"), std::string::npos) << e.what();
  }
}

// scale_rows multiplies each row of a strided view by alpha times its factor, rounded to fp32
// first, and leaves the columns beside the view alone.
TEST(CpuSequence, ScaleRows) {
  Rand rand(2, 36);
  const Matrix<float> before = random_matrix<float>(rand, 5, 7);
  const std::vector<float> scale = random_vector<float>(rand, 5);
  auto backend = make_cpu_backend();
  Matrix<float> x = before;
  backend->scale_rows(scale.data(), 0.25f, Mat(x.ptr() + 2, 5, 4, 7));
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 7; ++c) {
      const float want = c < 2 || c >= 6 ? before(r, c) : before(r, c) * (0.25f * scale[r]);
      EXPECT_EQ(x(r, c), want) << r << ", " << c;
    }
  Matrix<float> y = before;
  backend->scale_rows(nullptr, -3.0f, y.view());
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 7; ++c) EXPECT_EQ(y(r, c), before(r, c) * -3.0f);
  EXPECT_THROW(backend->scale_rows(nullptr, 1.0f, Mat(y.ptr(), 5, 7, 6)), Error);
}

// ------------------------------------------------------- unpooled lookups --

// embedding_sum_forward adds each table's pooled rows; its backward is embedding_gradient with
// every table's out_col 0 (Backend::embedding_sum_forward).
TEST(CpuSequence, EmbeddingSumAndItsGradient) {
  Rand rand(3, 36);
  auto tables =
      test::pack_tables({9, 4, 3}, {5, 5, 5}, {Pooling::sum, Pooling::sum, Pooling::mean});
  // One id per token for the item and action features; the third, a mean over 0..3 ids.
  std::vector<std::vector<std::vector<std::int64_t>>> bags(3);
  const std::int64_t tokens = 7;
  for (std::int64_t b = 0; b < tokens; ++b) {
    bags[0].push_back({rand.integer(0, 8)});
    bags[1].push_back({rand.integer(0, 3)});
    std::vector<std::int64_t> bag;
    for (std::int64_t i = rand.integer(0, 3); i > 0; --i) bag.push_back(rand.integer(0, 2));
    bags[2].push_back(bag);
  }
  bags[0][3] = bags[0][1];  // a repeated item
  const test::SparseBatch sparse = test::make_sparse(bags);
  const SparseInput in = sparse.input();
  std::vector<double> weights = random_vector<double>(rand, test::total_weights(tables));
  Matrix<double> dout = random_matrix<double>(rand, tokens, 5);
  Matrix<double> out = test::nan_matrix<double>(tokens, 5);

  // Against the concatenated lookup, summed here.
  Matrix<double> concat(tokens, 15);
  cpu::embedding_forward<double>(tables, test::fp32_tables(weights.data()), in, concat.view());
  cpu::embedding_sum_forward<double>(tables, test::fp32_tables(weights.data()), in, out.view());
  for (std::int64_t b = 0; b < tokens; ++b)
    for (int d = 0; d < 5; ++d)
      EXPECT_NEAR(out(b, d), concat(b, d) + concat(b, 5 + d) + concat(b, 10 + d), 1e-15);

  auto objective = [&] {
    cpu::embedding_sum_forward<double>(tables, test::fp32_tables(weights.data()), in, out.view());
    return dot(dout.cview(), out.cview());
  };
  for (TableLayout& tl : tables) tl.out_col = 0;
  const cpu::EmbeddingGradient g = cpu::embedding_gradient<double>(tables, in, dout.cview());
  std::vector<double> dense(weights.size(), 0.0);
  for (std::size_t u = 0; u < g.row.size(); ++u) {
    const TableLayout& tl = tables[g.table[u]];
    for (int d = 0; d < tl.dim; ++d)
      dense[tl.weight_offset + g.row[u] * tl.dim + d] = g.grad[g.offset[u] + d];
  }
  check_gradient("embedding_sum dweights", weights.data(), dense.data(),
                 static_cast<std::int64_t>(weights.size()), objective);

  Matrix<double> narrow(tokens, 4);
  EXPECT_THROW(cpu::embedding_sum_forward<double>(tables, test::fp32_tables(weights.data()), in,
                                                  narrow.view()),
               Error);
}

// -------------------------------------------------------------- attention --

// A batch of sequences: lengths as given, timestamps with gaps from seconds to months (so that
// many time buckets occur), non-decreasing, ties included.
struct Sequences {
  std::vector<std::int64_t> offsets{0};
  std::vector<std::int64_t> timestamps;
  int targets = 0;
  std::int64_t max_len = 0;
  Sequences(Rand& rand, const std::vector<std::int64_t>& lengths, int num_targets)
      : targets(num_targets) {
    static constexpr std::int64_t kGaps[] = {0, 1, 2, 7, 90, 3600, 86400, 2500000};
    for (const std::int64_t n : lengths) {
      std::int64_t ts = rand.integer(1600000000, 1700000000);
      for (std::int64_t i = 0; i < n; ++i) {
        timestamps.push_back(ts);
        ts += kGaps[rand.integer(0, 7)] + rand.integer(0, 3);
      }
      offsets.push_back(offsets.back() + n);
      max_len = std::max(max_len, n);
    }
  }
  SequenceBatch batch() const {
    return {static_cast<std::int64_t>(offsets.size()) - 1,
            offsets.back(),
            max_len,
            targets,
            offsets.data(),
            timestamps.data()};
  }
};

HstuAttention attention(int heads, int a, int v, int pb, int tb, double n) {
  HstuAttention att;
  att.heads = heads;
  att.attention_dim = a;
  att.value_dim = v;
  att.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a)));
  att.inv_n = static_cast<float>(1.0 / n);
  att.position_buckets = pb;
  att.time_buckets = tb;
  return att;
}

// The attention of one batch in the padded dense formulation: per sequence and head, the n x n
// score matrix, the mask built from "causal, and targets see only themselves among targets", the
// buckets counted by halving, then A V. An independent statement of
// Backend::hstu_attention_forward.
Matrix<double> dense_attention(const Sequences& s, const HstuAttention& att,
                               const std::vector<double>& position, const std::vector<double>& time,
                               const Matrix<double>& q, const Matrix<double>& k,
                               const Matrix<double>& v) {
  const int h_count = att.heads, a = att.attention_dim, vd = att.value_dim;
  Matrix<double> out(q.rows, h_count * vd);
  for (std::size_t b = 0; b + 1 < s.offsets.size(); ++b) {
    const std::int64_t o = s.offsets[b], n = s.offsets[b + 1] - o;
    if (n == 0) continue;
    std::vector<double> mask(static_cast<std::size_t>(n * n), 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j <= i; ++j) mask[i * n + j] = 1.0;
    for (std::int64_t i = n - s.targets; i < n; ++i)
      for (std::int64_t j = n - s.targets; j < n; ++j)
        if (i != j) mask[i * n + j] = 0.0;
    for (int h = 0; h < h_count; ++h) {
      for (std::int64_t i = 0; i < n; ++i) {
        for (int c = 0; c < vd; ++c) out(o + i, h * vd + c) = 0.0;
        for (std::int64_t j = 0; j < n; ++j) {
          double qk = 0.0;
          for (int c = 0; c < a; ++c) qk += q(o + i, h * a + c) * k(o + j, h * a + c);
          const std::int64_t dist =
              std::min<std::int64_t>(std::max<std::int64_t>(i - j, 0), att.position_buckets - 1);
          std::int64_t delta = std::max<std::int64_t>(s.timestamps[o + i] - s.timestamps[o + j], 0);
          std::int64_t bucket = 0;
          while (delta > 0) {
            ++bucket;
            delta /= 2;
          }
          bucket = std::min<std::int64_t>(bucket, att.time_buckets - 1);
          const double score = att.scale * qk + position[h * att.position_buckets + dist] +
                               time[h * att.time_buckets + bucket];
          const double weight = mask[i * n + j] * score / (1.0 + std::exp(-score)) * att.inv_n;
          for (int c = 0; c < vd; ++c) out(o + i, h * vd + c) += weight * v(o + j, h * vd + c);
        }
      }
    }
  }
  return out;
}

struct AttentionCase {
  Sequences seq;
  HstuAttention att;
  std::vector<double> position, time;
  Matrix<double> q, k, v;
};

AttentionCase random_attention(Rand& rand, const std::vector<std::int64_t>& lengths, int targets,
                               int heads, int a, int vd, int pb, int tb) {
  Sequences s(rand, lengths, targets);
  const std::int64_t tokens = s.offsets.back();
  AttentionCase c{
      s,
      attention(heads, a, vd, pb, tb, static_cast<double>(std::max<std::int64_t>(s.max_len, 1))),
      random_vector<double>(rand, heads * pb),
      random_vector<double>(rand, heads * tb),
      random_matrix<double>(rand, tokens, heads * a),
      random_matrix<double>(rand, tokens, heads * a),
      random_matrix<double>(rand, tokens, heads * vd)};
  return c;
}

TEST(CpuSequence, AttentionMatchesTheDenseFormulation) {
  Rand rand(4, 37);
  // Empty, length-1, targets-only and longer sequences; few position buckets, so distances clamp.
  AttentionCase c = random_attention(rand, {5, 0, 1, 2, 9, 3, 17}, 1, 2, 3, 4, 6, 12);
  c.seq.targets = 1;
  Matrix<double> out = test::nan_matrix<double>(c.q.rows, 8);
  cpu::hstu_attention_forward<double>(c.seq.batch(), c.att, c.position.data(), c.time.data(),
                                      c.q.cview(), c.k.cview(), c.v.cview(), out.view());
  const Matrix<double> want = dense_attention(c.seq, c.att, c.position, c.time, c.q, c.k, c.v);
  for (std::int64_t r = 0; r < out.rows; ++r)
    for (std::int64_t col = 0; col < out.cols; ++col)
      EXPECT_NEAR(out(r, col), want(r, col), 1e-13) << r << ", " << col;

  // Two and three targets per sequence (the shortest non-empty sequences are all targets).
  for (const int targets : {2, 3}) {
    AttentionCase t = random_attention(rand, {3, 8, 0, 4, 11}, targets, 3, 2, 2, 5, 20);
    Matrix<double> o = test::nan_matrix<double>(t.q.rows, 6);
    cpu::hstu_attention_forward<double>(t.seq.batch(), t.att, t.position.data(), t.time.data(),
                                        t.q.cview(), t.k.cview(), t.v.cview(), o.view());
    const Matrix<double> w = dense_attention(t.seq, t.att, t.position, t.time, t.q, t.k, t.v);
    for (std::int64_t r = 0; r < o.rows; ++r)
      for (std::int64_t col = 0; col < o.cols; ++col)
        EXPECT_NEAR(o(r, col), w(r, col), 1e-13) << targets << " targets: " << r << ", " << col;
  }
}

// Changing a token's key and value changes only the outputs of the tokens that see it: later
// history tokens and every target, never an earlier token or another target.
TEST(CpuSequence, AttentionMasks) {
  Rand rand(5, 38);
  AttentionCase c = random_attention(rand, {8}, 3, 1, 4, 4, 8, 8);
  auto run = [&] {
    Matrix<double> out(8, 4);
    cpu::hstu_attention_forward<double>(c.seq.batch(), c.att, c.position.data(), c.time.data(),
                                        c.q.cview(), c.k.cview(), c.v.cview(), out.view());
    return out;
  };
  const Matrix<double> base = run();
  for (std::int64_t j = 0; j < 8; ++j) {
    const Matrix<double> k0 = c.k, v0 = c.v;
    for (int col = 0; col < 4; ++col) {
      c.k(j, col) += 0.5;
      c.v(j, col) -= 0.25;
    }
    const Matrix<double> moved = run();
    c.k = k0;
    c.v = v0;
    for (std::int64_t i = 0; i < 8; ++i) {
      const bool sees = j <= i && (j < 5 || j == i);
      bool changed = false;
      for (int col = 0; col < 4; ++col) changed |= moved(i, col) != base(i, col);
      EXPECT_EQ(changed, sees) << "token " << i << " and a change of token " << j;
    }
  }
}

TEST_P(SequenceSeeded, AttentionGradients) {
  Rand rand(static_cast<std::uint64_t>(GetParam()), 39);
  std::vector<std::int64_t> lengths;
  const int targets = static_cast<int>(rand.integer(0, 2));
  for (std::int64_t b = rand.integer(1, 4); b > 0; --b) {
    const std::int64_t n = rand.integer(0, 7);
    lengths.push_back(n == 0 ? 0 : std::max<std::int64_t>(n, targets));
  }
  lengths.push_back(1 > targets ? 1 : targets);  // a length-1 (or all-targets) sequence
  const int heads = static_cast<int>(rand.integer(1, 2));
  const int a = static_cast<int>(rand.integer(1, 3)), vd = static_cast<int>(rand.integer(1, 3));
  AttentionCase c =
      random_attention(rand, lengths, targets, heads, a, vd, static_cast<int>(rand.integer(1, 5)),
                       static_cast<int>(rand.integer(1, 24)));
  const std::int64_t tokens = c.q.rows;
  Matrix<double> dout = random_matrix<double>(rand, tokens, heads * vd);
  Matrix<double> out(tokens, heads * vd);
  const SequenceBatch seq = c.seq.batch();
  auto objective = [&] {
    cpu::hstu_attention_forward<double>(seq, c.att, c.position.data(), c.time.data(), c.q.cview(),
                                        c.k.cview(), c.v.cview(), out.view());
    return dot(dout.cview(), out.cview());
  };
  Matrix<double> dq = test::nan_matrix<double>(tokens, heads * a);
  Matrix<double> dk = test::nan_matrix<double>(tokens, heads * a);
  Matrix<double> dv = test::nan_matrix<double>(tokens, heads * vd);
  std::vector<double> dpos(c.position.size(), NAN), dtime(c.time.size(), NAN);
  cpu::hstu_attention_backward<double>(seq, c.att, c.position.data(), c.time.data(), c.q.cview(),
                                       c.k.cview(), c.v.cview(), dout.cview(), dq.view(), dk.view(),
                                       dv.view(), dpos.data(), dtime.data());
  const std::string tag = "seed " + std::to_string(GetParam()) + " ";
  check_gradient(tag + "dq", elements(c.q), dq.ptr(), tokens * heads * a, objective);
  check_gradient(tag + "dk", elements(c.k), dk.ptr(), tokens * heads * a, objective);
  check_gradient(tag + "dv", elements(c.v), dv.ptr(), tokens * heads * vd, objective);
  check_gradient(tag + "dposition", c.position.data(), dpos.data(),
                 static_cast<std::int64_t>(dpos.size()), objective);
  check_gradient(tag + "dtime", c.time.data(), dtime.data(),
                 static_cast<std::int64_t>(dtime.size()), objective);
}

// The float path is the double path rounded once per stored value, at any thread count.
TEST(CpuSequence, AttentionFloatMatchesDoubleAtAnyThreadCount) {
  Rand rand(6, 40);
  AttentionCase c = random_attention(rand, {40, 2, 0, 77, 13, 64}, 2, 2, 8, 8, 16, 24);
  const std::int64_t tokens = c.q.rows;
  Matrix<double> dout = random_matrix<double>(rand, tokens, 16);
  const SequenceBatch seq = c.seq.batch();
  Matrix<double> out(tokens, 16), dq(tokens, 16), dk(tokens, 16), dv(tokens, 16);
  std::vector<double> dpos(c.position.size()), dtime(c.time.size());
  cpu::hstu_attention_forward<double>(seq, c.att, c.position.data(), c.time.data(), c.q.cview(),
                                      c.k.cview(), c.v.cview(), out.view());
  cpu::hstu_attention_backward<double>(seq, c.att, c.position.data(), c.time.data(), c.q.cview(),
                                       c.k.cview(), c.v.cview(), dout.cview(), dq.view(), dk.view(),
                                       dv.view(), dpos.data(), dtime.data());
  const auto qf = test::convert<float>(c.q), kf = test::convert<float>(c.k),
             vf = test::convert<float>(c.v), gf = test::convert<float>(dout);
  const auto pf = test::convert<float>(c.position), tf = test::convert<float>(c.time);
  std::vector<std::vector<float>> runs;
  for (const int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Matrix<float> o = test::nan_matrix<float>(tokens, 16), fq = test::nan_matrix<float>(tokens, 16),
                  fk = test::nan_matrix<float>(tokens, 16),
                  fv = test::nan_matrix<float>(tokens, 16);
    std::vector<float> fp(pf.size(), NAN), ft(tf.size(), NAN);
    cpu::hstu_attention_forward<float>(seq, c.att, pf.data(), tf.data(), qf.cview(), kf.cview(),
                                       vf.cview(), o.view());
    cpu::hstu_attention_backward<float>(seq, c.att, pf.data(), tf.data(), qf.cview(), kf.cview(),
                                        vf.cview(), gf.cview(), fq.view(), fk.view(), fv.view(),
                                        fp.data(), ft.data());
    const std::string tag = std::to_string(threads) + " threads: ";
    test::expect_close(o.cview(), out.cview(), 1e-6, tag + "out");
    test::expect_close(fq.cview(), dq.cview(), 1e-6, tag + "dq");
    test::expect_close(fk.cview(), dk.cview(), 1e-6, tag + "dk");
    test::expect_close(fv.cview(), dv.cview(), 1e-6, tag + "dv");
    test::expect_close(fp, dpos, 1e-6, tag + "dposition");
    test::expect_close(ft, dtime, 1e-6, tag + "dtime");
    std::vector<float> all = o.data;
    for (const auto* m : {&fq, &fk, &fv}) all.insert(all.end(), m->data.begin(), m->data.end());
    all.insert(all.end(), fp.begin(), fp.end());
    all.insert(all.end(), ft.begin(), ft.end());
    runs.push_back(all);
  }
  omp_set_num_threads(omp_get_num_procs());
  for (std::size_t r = 1; r < runs.size(); ++r)
    EXPECT_EQ(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0)
        << "results differ between thread counts";
}

TEST(CpuSequence, BadSequencesAreRefusedByName) {
  Rand rand(7, 41);
  AttentionCase c = random_attention(rand, {4, 3}, 2, 1, 2, 2, 4, 4);
  Matrix<double> out(7, 2);
  auto message = [&](const Sequences& s) {
    SequenceBatch batch = s.batch();
    batch.tokens = 7;  // the tokens of q, k and v, whatever the offsets say
    try {
      cpu::hstu_attention_forward<double>(batch, c.att, c.position.data(), c.time.data(),
                                          c.q.cview(), c.k.cview(), c.v.cview(), out.view());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  Sequences s = c.seq;
  s.timestamps[5] = s.timestamps[4] - 1;
  EXPECT_NE(message(s).find("sequence 1: timestamp"), std::string::npos) << message(s);
  s = c.seq;
  s.targets = 4;
  EXPECT_NE(message(s).find("sequence 1 holds 3 tokens, fewer than its 4 targets"),
            std::string::npos)
      << message(s);
  s = c.seq;
  s.max_len = 3;
  EXPECT_NE(message(s).find("sequence 0 holds 4 tokens, more than max_len 3"), std::string::npos)
      << message(s);
  s = c.seq;
  s.offsets = {0, 3, 2};
  EXPECT_NE(message(s).find("sequence 1: offsets decrease"), std::string::npos) << message(s);
}

// The backend interface runs the float reference itself (cpu_backend.cpp forwards, nothing
// more): the same bits through both, for every sequence op.
TEST(CpuSequence, TheCpuBackendRunsTheReference) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  Rand rand(8, 42);
  AttentionCase c = random_attention(rand, {6, 0, 9, 1}, 1, 2, 4, 4, 8, 16);
  const SequenceBatch seq = c.seq.batch();
  const std::int64_t tokens = c.q.rows;
  const auto q = test::convert<float>(c.q), k = test::convert<float>(c.k),
             v = test::convert<float>(c.v);
  const auto pos = test::convert<float>(c.position), tim = test::convert<float>(c.time);
  const Matrix<float> g = random_matrix<float>(rand, tokens, 8);
  auto same = [](const Matrix<float>& a, const Matrix<float>& b, const char* what) {
    EXPECT_EQ(std::memcmp(a.ptr(), b.ptr(), a.data.size() * sizeof(float)), 0) << what;
  };
  HstuAttention att = c.att;
  att.position = pos.data();
  att.time = tim.data();

  Matrix<float> o1 = test::nan_matrix<float>(tokens, 8), o2 = o1;
  backend->hstu_attention_forward(seq, att, q.cview(), k.cview(), v.cview(), o1.view());
  cpu::hstu_attention_forward<float>(seq, att, pos.data(), tim.data(), q.cview(), k.cview(),
                                     v.cview(), o2.view());
  same(o1, o2, "attention forward");
  Matrix<float> dq1 = test::nan_matrix<float>(tokens, 8), dk1 = dq1, dv1 = dq1, dq2 = dq1,
                dk2 = dq1, dv2 = dq1;
  std::vector<float> dp1(pos.size()), dt1(tim.size()), dp2(pos.size()), dt2(tim.size());
  backend->hstu_attention_backward(seq, att, q.cview(), k.cview(), v.cview(), g.cview(), dq1.view(),
                                   dk1.view(), dv1.view(), dp1.data(), dt1.data());
  cpu::hstu_attention_backward<float>(seq, att, pos.data(), tim.data(), q.cview(), k.cview(),
                                      v.cview(), g.cview(), dq2.view(), dk2.view(), dv2.view(),
                                      dp2.data(), dt2.data());
  same(dq1, dq2, "dq");
  same(dk1, dk2, "dk");
  same(dv1, dv2, "dv");
  EXPECT_EQ(dp1, dp2);
  EXPECT_EQ(dt1, dt2);

  const std::vector<float> gamma = random_vector<float>(rand, 8),
                           beta = random_vector<float>(rand, 8);
  std::vector<float> m1(static_cast<std::size_t>(tokens)), r1(m1), m2(m1), r2(m1);
  backend->layer_norm_forward(o1.cview(), gamma.data(), beta.data(), 1e-5f, dq1.view(), m1.data(),
                              r1.data());
  cpu::layer_norm_forward<float>(o1.cview(), gamma.data(), beta.data(), 1e-5f, dq2.view(),
                                 m2.data(), r2.data());
  same(dq1, dq2, "layer norm");
  std::vector<float> dg1(8), db1(8), dg2(8), db2(8);
  backend->layer_norm_backward(o1.cview(), gamma.data(), m1.data(), r1.data(), g.cview(),
                               dk1.view(), dg1.data(), db1.data());
  cpu::layer_norm_backward<float>(o1.cview(), gamma.data(), m2.data(), r2.data(), g.cview(),
                                  dk2.view(), dg2.data(), db2.data());
  same(dk1, dk2, "layer norm dx");
  EXPECT_EQ(dg1, dg2);
  EXPECT_EQ(db1, db2);
  backend->norm_mul_forward(o1.cview(), g.cview(), 1e-5f, dq1.view(), m1.data(), r1.data());
  cpu::norm_mul_forward<float>(o1.cview(), g.cview(), 1e-5f, dq2.view(), m2.data(), r2.data());
  same(dq1, dq2, "norm_mul");
  backend->norm_mul_backward(o1.cview(), g.cview(), m1.data(), r1.data(), dq1.cview(), dk1.view(),
                             dv1.view());
  cpu::norm_mul_backward<float>(o1.cview(), g.cview(), m2.data(), r2.data(), dq2.cview(),
                                dk2.view(), dv2.view());
  same(dk1, dk2, "norm_mul dx");
  same(dv1, dv2, "norm_mul du");
  backend->silu_forward(o1.cview(), dq1.view());
  cpu::silu_forward<float>(o1.cview(), dq2.view());
  same(dq1, dq2, "silu");
  backend->silu_backward(o1.cview(), g.cview(), dq1.view());
  cpu::silu_backward<float>(o1.cview(), g.cview(), dq2.view());
  same(dq1, dq2, "silu backward");
  backend->add_into(g.cview(), dq1.view());
  cpu::add_into<float>(g.cview(), dq2.view());
  same(dq1, dq2, "add_into");
  const std::vector<std::int64_t> index{3, 0, 15};
  Matrix<float> rows1 = test::nan_matrix<float>(3, 8), rows2 = rows1;
  backend->gather_rows(dq1.cview(), index.data(), rows1.view());
  cpu::gather_rows<float>(dq1.cview(), index.data(), rows2.view());
  same(rows1, rows2, "gather_rows");
  backend->scatter_add_rows(rows1.cview(), index.data(), dq1.view());
  cpu::scatter_add_rows<float>(rows2.cview(), index.data(), dq2.view());
  same(dq1, dq2, "scatter_add_rows");

  const auto tables = test::pack_tables({5, 3}, {8, 8}, {Pooling::sum, Pooling::sum});
  const std::vector<float> w = random_vector<float>(rand, test::total_weights(tables));
  const test::SparseBatch sparse = test::make_sparse({{{1}, {4}, {0}}, {{2}, {2}, {}}});
  Matrix<float> e1 = test::nan_matrix<float>(3, 8), e2 = e1;
  backend->embedding_sum_forward(tables, test::fp32_tables(w.data()), sparse.input(), e1.view());
  cpu::embedding_sum_forward<float>(tables, test::fp32_tables(w.data()), sparse.input(), e2.view());
  same(e1, e2, "embedding_sum_forward");
}

INSTANTIATE_TEST_SUITE_P(CpuSequence, SequenceSeeded, ::testing::Range(0, 8));

}  // namespace
}  // namespace parity

namespace parity {
namespace {

// The row blocks of a batch: every block holding a token once, the last blocks of the longest
// sequences first; empty sequences have none.
TEST(SequenceBlocks, ListsEveryBlockThatHoldsATokenHeaviestFirst) {
  const std::vector<std::int64_t> offsets{0, 0, 130, 135, 400, 528};  // 0, 130, 5, 265, 128
  std::vector<std::int64_t> blocks{99};
  EXPECT_EQ(sequence_blocks(offsets, blocks), 0);  // no two short neighbours to pack
  auto item = [](std::int64_t seq, std::int64_t block) { return seq << 20 | block; };
  const std::vector<std::int64_t> want{item(3, 2), item(1, 1), item(3, 1), item(1, 0),
                                       item(2, 0), item(3, 0), item(4, 0)};
  EXPECT_EQ(blocks, want);
  EXPECT_EQ(sequence_blocks(std::vector<std::int64_t>{0, 0}, blocks), 0);
  EXPECT_TRUE(blocks.empty());
}

// Consecutive sequences whose tokens fit in one block together become one run (empty ones inside
// it counted), listed after every other block; a run needs two non-empty sequences, and a
// sequence longer than a block, or one that would overflow the run, ends it.
TEST(SequenceBlocks, PacksRunsOfShortSequencesIntoOneBlock) {
  const std::vector<std::int64_t> lengths{3, 0, 60, 70, 200, 10, 20, 128, 1, 1};
  std::vector<std::int64_t> offsets{0};
  for (const std::int64_t n : lengths) offsets.push_back(offsets.back() + n);
  std::vector<std::int64_t> blocks;
  EXPECT_EQ(sequence_blocks(offsets, blocks), 3);
  auto item = [](std::int64_t seq, std::int64_t block) { return seq << 20 | block; };
  auto run = [](std::int64_t seq, std::int64_t count) { return seq << 20 | kPackedBlock | count; };
  const std::vector<std::int64_t> want{item(4, 1), item(3, 0), item(4, 0), item(7, 0),
                                       run(0, 3),  run(5, 2),  run(8, 2)};
  EXPECT_EQ(blocks, want);
  // Every token in exactly one listed block.
  std::vector<int> covered(static_cast<std::size_t>(offsets.back()), 0);
  for (const std::int64_t b : blocks) {
    const std::int64_t seq = b >> 20;
    if (b & kPackedBlock) {
      for (std::int64_t t = offsets[seq]; t < offsets[seq + (b & (kPackedBlock - 1))]; ++t)
        ++covered[static_cast<std::size_t>(t)];
    } else {
      const std::int64_t lo = offsets[seq] + (b & (kPackedBlock - 1)) * kSequenceBlockRows;
      for (std::int64_t t = lo; t < std::min(offsets[seq + 1], lo + kSequenceBlockRows); ++t)
        ++covered[static_cast<std::size_t>(t)];
    }
  }
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), offsets.back());
}

}  // namespace
}  // namespace parity
