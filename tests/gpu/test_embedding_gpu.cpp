// GPU embedding kernels against the CPU reference (backend/cpu), on random inputs: dims that are
// and are not multiples of the vector width, misaligned table offsets, pooling sizes 0 and 1,
// sum and mean, fp32/fp16/bf16 weights, fp32/bf16 outputs and gradients, uniform and
// duplicate-heavy Zipf ids, every embedding optimizer, stochastic rounding and determinism (with
// both radix sorts). Skips (with the reason) where no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"

namespace parity::gpu::test {
namespace {

constexpr std::uint32_t kPoisonWord = 0xffffffffu;  // NaN as fp32; two NaNs as bf16

// Runs the GPU forward for problem p and returns the output as floats [batch, ld] (poisoned
// columns stay NaN).
std::vector<float> gpu_forward(const Problem& p, const std::vector<float>& weights, DType wdtype,
                               DType odtype) {
  EmbeddingTables tables(p.tables);
  DeviceInput din(p);
  auto wbytes = encode(weights, wdtype);
  DeviceBuffer<std::uint8_t> w = to_device(wbytes);
  const std::size_t out_bytes = static_cast<std::size_t>(p.batch * p.ld) * dtype_size(odtype);
  std::vector<std::uint8_t> poison(out_bytes, 0xff);
  DeviceBuffer<std::uint8_t> out = to_device(poison);
  Stream s;
  embedding_forward(s.get(), tables, TableWeights::all(wdtype, w.data()), din.in,
                    {out.data(), odtype, p.batch, p.out_cols, p.ld});
  s.synchronize();
  tables.raise_input_errors(s.get());
  return decode(to_host(out, out_bytes), odtype);
}

bool is_table_col(const Problem& p, std::int64_t c) {
  for (const auto& t : p.tables) {
    if (c >= t.out_col && c < t.out_col + t.dim) return true;
  }
  return false;
}

// Compares a GPU forward with the CPU reference: |gpu - ref| <= tol_sum * Σ|terms| + tol_out *
// |ref| (Σ|terms| is the same pooling over |weights|: the scale of fp32 summation error), every
// table column written, every other column untouched.
void check_forward(const Problem& p, const std::vector<float>& weights, DType wdtype, DType odtype,
                   const std::string& what, double tol_sum = 1e-5, double tol_out = 0.0) {
  const std::vector<float> got = gpu_forward(p, weights, wdtype, odtype);
  const auto ref_tables = as_f32(p.tables);
  std::vector<float> ref(static_cast<std::size_t>(p.batch * p.ld), 0.0f), mag(ref.size(), 0.0f);
  std::vector<float> absw(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) absw[i] = std::fabs(weights[i]);
  cpu::embedding_forward<float>(ref_tables, TableWeights::all(DType::f32, weights.data()),
                                p.input(), {ref.data(), p.batch, p.out_cols, p.ld});
  cpu::embedding_forward<float>(ref_tables, TableWeights::all(DType::f32, absw.data()), p.input(),
                                {mag.data(), p.batch, p.out_cols, p.ld});
  int bad = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t c = 0; c < p.ld; ++c) {
      const std::size_t i = static_cast<std::size_t>(b * p.ld + c);
      if (!is_table_col(p, c)) {
        std::uint32_t bits;
        if (odtype == DType::f32) {
          std::memcpy(&bits, &got[i], 4);
        } else {
          bits = std::isnan(got[i]) ? kPoisonWord : 0u;
        }
        if (bits != kPoisonWord && ++bad <= 5)
          ADD_FAILURE() << what << ": column " << c << " of row " << b << " was written";
        continue;
      }
      const double tol = tol_sum * mag[i] + tol_out * std::fabs(ref[i]) + 1e-30;
      if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= tol) && ++bad <= 5) {
        ADD_FAILURE() << what << ": out(" << b << ", " << c << ") = " << got[i] << ", expected "
                      << ref[i] << " (tolerance " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

ProblemSpec mixed_dims_spec() {
  ProblemSpec s;
  s.dims = {1, 3, 4, 7, 8, 16, 33, 64, 128, 130};
  s.rows = {50, 7, 300, 1, 1000, 64};
  s.pooling = {Pooling::sum, Pooling::mean, Pooling::sum};
  s.batch = 97;
  s.max_pool = 9;
  return s;
}

// ---------------------------------------------------------------- forward --

TEST(GpuEmbeddingForward, IntegerWeightsPoolExactly) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s = mixed_dims_spec();
  s.pooling = {Pooling::sum};
  const Problem p = make_problem(s, 11);
  const auto w = random_values(p.weight_elems, 11, /*integers=*/true, DType::f32);
  check_forward(p, w, DType::f32, DType::f32, "fp32 integer sums", 0.0, 0.0);
}

class GpuForwardTypes : public ::testing::TestWithParam<std::tuple<DType, DType, double>> {};

TEST_P(GpuForwardTypes, MatchesCpuAcrossDimsAndPooling) {
  PARITY_REQUIRE_GPU();
  const auto [wdtype, odtype, zipf] = GetParam();
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    ProblemSpec s = mixed_dims_spec();
    s.dtype = wdtype;
    s.zipf_alpha = zipf;
    s.offset_pad = seed == 3 ? 1 : 0;  // misaligned table offsets: scalar path for every table
    // Pooling hints: groups of lanes then sum several bags each (seed 1: one bag each).
    if (seed > 1) s.ids_per_bag = {1.0, 4.0, 0.5, 2.0, 100.0};
    const Problem p = make_problem(s, seed);
    const auto w = random_values(p.weight_elems, seed, false, wdtype);
    // bf16 outputs are rounded once: half an ulp of bf16 is 2^-9 relative.
    const double tol_out = odtype == DType::bf16 ? 1.0 / 256.0 : 0.0;
    check_forward(p, w, wdtype, odtype,
                  std::string("weights ") + std::string(dtype_name(wdtype)) + " out " +
                      std::string(dtype_name(odtype)) + " seed " + std::to_string(seed),
                  1e-5, tol_out);
  }
}

INSTANTIATE_TEST_SUITE_P(, GpuForwardTypes,
                         ::testing::Values(std::make_tuple(DType::f32, DType::f32, 0.0),
                                           std::make_tuple(DType::f32, DType::f32, 1.1),
                                           std::make_tuple(DType::f32, DType::bf16, 0.0),
                                           std::make_tuple(DType::f16, DType::f32, 0.0),
                                           std::make_tuple(DType::f16, DType::bf16, 1.1),
                                           std::make_tuple(DType::bf16, DType::f32, 0.0),
                                           std::make_tuple(DType::bf16, DType::bf16, 0.0)));

TEST(GpuEmbeddingForward, DimTooLargeIsRejectedWithAMessage) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {8192};
  s.rows = {4};
  s.pooling = {Pooling::sum};
  s.batch = 2;
  const Problem p = make_problem(s, 1);
  try {
    (void)gpu_forward(p, std::vector<float>(p.weight_elems, 1.0f), DType::f32, DType::f32);
    FAIL() << "dim 8192 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 8192"), std::string::npos) << e.what();
  }
}

TEST(GpuEmbeddingForward, LongBagsAndWideRows) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {128, 256, 512, 40};
  s.rows = {100000, 5000};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 300;
  s.max_pool = 130;
  s.gap = 0;
  s.ld_extra = 0;
  const Problem p = make_problem(s, 5);
  const auto w = random_values(p.weight_elems, 5, false, DType::f32);
  check_forward(p, w, DType::f32, DType::f32, "long bags");
}

// Several bags per group of lanes (short bags, many of them empty), with bags that straddle the
// groups' ranges and a batch that is not a multiple of any group's bags.
TEST(GpuEmbeddingForward, ManyShortBagsPerGroupMatch) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {128, 16, 64, 3, 256, 24};
  s.rows = {1000, 37, 5000};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 1001;
  s.max_pool = 3;
  s.ids_per_bag = {1.0, 0.25, 2.0};
  for (const DType w : {DType::f32, DType::f16}) {
    s.dtype = w;
    const Problem p = make_problem(s, 17);
    const auto v = random_values(p.weight_elems, 17, false, w);
    check_forward(p, v, w, DType::f32, std::string("short bags, ") + std::string(dtype_name(w)));
  }
}

TEST(GpuEmbeddingForward, BadOffsetsAreReportedWithTheirBag) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {32};
  s.rows = {100};
  s.pooling = {Pooling::sum};
  s.batch = 64;
  s.max_pool = 2;
  s.ids_per_bag = {1.0};
  Problem p = make_problem(s, 3);
  std::int64_t bag = -1;  // a bag whose end goes below its start
  for (std::int64_t b = 10; b < p.batch && bag < 0; ++b)
    if (p.offsets[b] > 0) bag = b;
  ASSERT_GE(bag, 0);
  p.offsets[bag + 1] = p.offsets[bag] - 1;
  const auto w = random_values(p.weight_elems, 3, false, DType::f32);
  try {
    (void)gpu_forward(p, w, DType::f32, DType::f32);
    FAIL() << "decreasing offsets went unreported";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("offsets decrease"), std::string::npos) << m;
    EXPECT_NE(m.find("table 0"), std::string::npos) << m;
  }
}

TEST(GpuEmbeddingForward, BadIdsAreSkippedAndReported) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {16, 8};
  s.rows = {10, 20};
  s.pooling = {Pooling::sum};
  s.batch = 4;
  Problem p = make_problem(s, 9);
  ASSERT_GT(p.ids.size(), 3u);
  p.ids[p.ids.size() - 1] = 20;  // table 1 has rows [0, 20)
  const auto w = random_values(p.weight_elems, 9, false, DType::f32);
  try {
    (void)gpu_forward(p, w, DType::f32, DType::f32);
    FAIL() << "a bad id went unreported";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("table 1"), std::string::npos) << m;
    EXPECT_NE(m.find("id 20"), std::string::npos) << m;
  }
}

// Launches are split by storage type and lane shape, tables kept in input order within each;
// with more shapes than launch groups, by vectors per lane, then by type only.
TEST(GpuEmbeddingTables, LaunchGroupsSplitByTypeAndShape) {
  const auto layout = [](std::vector<std::pair<int, DType>> dims) {
    std::vector<TableLayout> t;
    for (const auto& [d, dt] : dims) {
      TableLayout l;
      l.rows = 10;
      l.dim = d;
      l.dtype = dt;
      t.push_back(l);
    }
    return t;
  };
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(launch_groups(layout({{128, DType::f32},
                                  {64, DType::f32},
                                  {128, DType::f16},
                                  {128, DType::f32},
                                  {100, DType::f32}}),
                          32),
            (G{{0, 3}, {1}, {4}, {2}}));
  // Eight lane shapes in each of two types: more than the launch groups, so they merge by
  // vectors per lane: dims up to 128 fp32 / 256 fp16 read one vector a lane forward, more read two.
  std::vector<std::pair<int, DType>> many;
  for (const DType dt : {DType::f32, DType::f16}) {
    const int v = dt == DType::f32 ? 1 : 2;
    for (const int d : {16, 17, 32, 33, 64, 65, 128, 129}) many.push_back({d * v, dt});
  }
  const G merged = launch_groups(layout(many), 32);
  EXPECT_EQ(merged, (G{{0, 1, 2, 3, 4, 5, 6}, {7}, {8, 9, 10, 11, 12, 13, 14}, {15}}));
  std::size_t n = 0;
  for (const auto& g : merged) n += g.size();
  EXPECT_EQ(n, many.size());
}

// ---------------------------------------------------------------- backward --

struct BackwardCase {
  OptimizerKind kind = OptimizerKind::sgd;
  DType wdtype = DType::f32;
  DType gdtype = DType::f32;
  double zipf = 0.0;
  float weight_decay = 0.0f;
  bool integers = false;
  SortMethod sort = SortMethod::automatic;
  std::uint64_t seed = 1;
  int vectors_per_lane = 0;
};

struct BackwardResult {
  std::vector<float> weights;  // after the update, as floats
  std::vector<float> state;
  std::vector<std::uint8_t> raw_weights;
  EmbeddingWorkspace::Stats stats;
  int fit_group = 0;            // EmbeddingWorkspace::last_rows_fit_group
  std::vector<int> fit_groups;  // EmbeddingWorkspace::last_rows_fit_groups
};

BackwardResult gpu_backward(const Problem& p, const std::vector<float>& w0,
                            const std::vector<float>& s0, const std::vector<float>& dout,
                            const BackwardCase& c, const OptimizerParams& opt,
                            const UpdateOptions& upd) {
  EmbeddingTables tables(p.tables);
  DeviceInput din(p);
  DeviceBuffer<std::uint8_t> w = to_device(encode(w0, c.wdtype));
  DeviceBuffer<float> st = to_device(s0);
  DeviceBuffer<std::uint8_t> g = to_device(encode(dout, c.gdtype));
  EmbeddingWorkspace ws(tables, p.batch, static_cast<std::int64_t>(p.ids.size()), c.sort);
  Stream s;
  embedding_backward_update(s.get(), tables, TableWeights::all(c.wdtype, w.data()),
                            s0.empty() ? nullptr : st.data(), din.in,
                            {g.data(), c.gdtype, p.batch, p.out_cols, p.ld}, opt, upd, ws);
  s.synchronize();
  tables.raise_input_errors(s.get());
  BackwardResult r;
  r.raw_weights = to_host(w, w0.size() * dtype_size(c.wdtype));
  r.weights = decode(r.raw_weights, c.wdtype);
  r.state = s0.empty() ? std::vector<float>{} : to_host(st, s0.size());
  r.stats = ws.last_stats(s.get());
  r.fit_group = ws.last_rows_fit_group();
  r.fit_groups = ws.last_rows_fit_groups();
  return r;
}

// One ulp of x in the storage type (the spacing of its neighbours at |x|).
double ulp(double x, DType t) {
  const int mant = t == DType::f16 ? 10 : 7;
  const int min_exp = t == DType::f16 ? -14 : -126;
  int e = 0;
  (void)std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const int ex = std::max(e - 1, min_exp);
  return std::ldexp(1.0, ex - mant);
}

// The CPU reference update, then the comparison. fp32 results are within 1e-5 relative of the
// scale of what was summed: the gradient of an element is a sum of many terms, so its fp32 error
// is bounded by ~n eps Σ|terms| (G below), not by |g| (terms can cancel). So
//   weights: |gpu - ref| <= 1e-5 (|ref| + |step| + |step| G / |g|) + 1e-7,  step = ref - w0
//   state:   |gpu - ref| <= 1e-5 (|ref| + 2 |g| G) (adagrad; rowwise: the row's mean of 2 |g| G).
// fp16/bf16 with stochastic rounding: every element is one of the two storage values around the
// exact result (within that same slack), and the roundings are unbiased on average.
// What a backward case ran: the rows kernel's specialization group (0: the general kernel) and the
// workspace's counts.
struct CaseOutcome {
  int fit_group = 0;            // of the first launch group
  std::vector<int> fit_groups;  // of each launch group
  EmbeddingWorkspace::Stats stats;
};
CaseOutcome run_backward_case(const ProblemSpec& spec, const BackwardCase& c,
                              const std::string& what) {
  ProblemSpec s = spec;
  s.kind = c.kind;
  s.dtype = c.wdtype;
  s.zipf_alpha = c.zipf;
  const Problem p = make_problem(s, c.seed);
  const auto w0 = random_values(p.weight_elems, c.seed, c.integers, c.wdtype);
  std::vector<float> s0;
  if (c.kind != OptimizerKind::sgd)
    s0 = random_values(p.state_elems, c.seed + 7, false, DType::f32, 0.0f, 2.0f);
  auto dout = random_values(p.batch * p.ld, c.seed + 3, c.integers, c.gdtype);
  OptimizerParams opt;
  opt.kind = c.kind;
  opt.lr = c.integers ? 1.0f : 0.05f;
  opt.eps = 1e-8f;
  opt.weight_decay = c.weight_decay;
  UpdateOptions upd;
  upd.seed = 1234;
  upd.step = 7;
  upd.vectors_per_lane = c.vectors_per_lane;

  const BackwardResult r = gpu_backward(p, w0, s0, dout, c, opt, upd);

  const auto ref_tables = as_f32(p.tables);
  std::vector<float> ref_w = w0, ref_s = s0;
  cpu::embedding_backward_update<float>(ref_tables, TableWeights::all(DType::f32, ref_w.data()),
                                        ref_s.empty() ? nullptr : ref_s.data(), p.input(),
                                        {dout.data(), p.batch, p.out_cols, p.ld}, opt, {});
  // Per weight element: the gradient g (with weight decay) and the scale G of its terms.
  std::vector<double> g(w0.size(), 0.0), big_g(w0.size(), 0.0), state_tol(s0.size(), 0.0);
  {
    std::vector<float> absd(dout.size());
    for (std::size_t i = 0; i < dout.size(); ++i) absd[i] = std::fabs(dout[i]);
    const auto gv = cpu::embedding_gradient<float>(ref_tables, p.input(),
                                                   {dout.data(), p.batch, p.out_cols, p.ld});
    const auto ga = cpu::embedding_gradient<float>(ref_tables, p.input(),
                                                   {absd.data(), p.batch, p.out_cols, p.ld});
    for (std::size_t u = 0; u < gv.table.size(); ++u) {
      const TableLayout& tl = p.tables[gv.table[u]];
      double row_term = 0.0;
      for (int d = 0; d < tl.dim; ++d) {
        const std::size_t wi = static_cast<std::size_t>(tl.weight_offset + gv.row[u] * tl.dim + d);
        g[wi] = gv.grad[gv.offset[u] + d] + c.weight_decay * w0[wi];
        big_g[wi] = ga.grad[ga.offset[u] + d] + std::fabs(c.weight_decay * w0[wi]);
        const double term = 2.0 * std::fabs(g[wi]) * big_g[wi];
        if (c.kind == OptimizerKind::adagrad)
          state_tol[tl.state_offset + gv.row[u] * tl.dim + d] = term;
        row_term += term;
      }
      if (c.kind == OptimizerKind::rowwise_adagrad)
        state_tol[tl.state_offset + gv.row[u]] = row_term / tl.dim;
    }
  }
  int bad = 0;
  double sum_err_ulps = 0.0;
  std::int64_t n_rounded = 0;
  for (std::size_t i = 0; i < w0.size(); ++i) {
    const double got = r.weights[i];
    const double ref = ref_w[i];
    const double step = std::fabs(ref - w0[i]);
    const double slack =
        1e-5 * (step + (std::fabs(g[i]) > 0 ? step * big_g[i] / std::fabs(g[i]) : 0.0));
    bool ok;
    if (std::memcmp(&ref_w[i], &w0[i], 4) == 0) {
      ok = std::memcmp(&r.weights[i], &w0[i], 4) == 0;  // untouched (or a zero step): bit-identical
      if (!ok)
        ok = std::fabs(got - ref) <=
             1e-5 * std::fabs(ref) + 1e-7 + (c.wdtype == DType::f32 ? 0.0 : ulp(ref, c.wdtype));
    } else if (c.wdtype == DType::f32) {
      ok = std::fabs(got - ref) <= 1e-5 * std::fabs(ref) + slack + 1e-7;
    } else {
      const double u = ulp(ref, c.wdtype);
      ok = std::fabs(got - ref) <= u * (1.0 + 1e-3) + slack;
      sum_err_ulps += (got - ref) / u;
      ++n_rounded;
    }
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << what << ": weight " << i << " = " << got << ", expected " << ref << " (was "
                    << w0[i] << ", g " << g[i] << ", G " << big_g[i] << ")";
    }
  }
  for (std::size_t i = 0; i < s0.size(); ++i) {
    const double got = r.state[i];
    const double ref = ref_s[i];
    if (!(std::fabs(got - ref) <= 1e-5 * (std::fabs(ref) + state_tol[i]) + 1e-7) && ++bad <= 5) {
      ADD_FAILURE() << what << ": state " << i << " = " << got << ", expected " << ref << " (was "
                    << s0[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
  if (n_rounded > 20000) {
    // Stochastic rounding is unbiased: the mean error is near 0 ulp (it would be near ±0.25 for a
    // truncation and is ~0.5/sqrt(n) for a fair one).
    EXPECT_LT(std::fabs(sum_err_ulps / n_rounded), 0.03)
        << what << ": mean rounding error over " << n_rounded;
  }
  return {r.fit_group, r.fit_groups, r.stats};
}

ProblemSpec backward_spec() {
  ProblemSpec s;
  s.dims = {1, 4, 7, 16, 33, 128, 130, 64};
  s.rows = {40, 3, 1000, 200, 7};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 200;
  s.max_pool = 12;
  return s;
}

TEST(GpuEmbeddingBackward, IntegerSgdIsExact) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s = backward_spec();
  s.pooling = {Pooling::sum};
  BackwardCase c;
  c.integers = true;
  c.zipf = 1.2;
  run_backward_case(s, c, "sgd integers");
}

class GpuBackwardOptimizers
    : public ::testing::TestWithParam<std::tuple<OptimizerKind, double, DType>> {};

TEST_P(GpuBackwardOptimizers, MatchesCpu) {
  PARITY_REQUIRE_GPU();
  const auto [kind, zipf, gdtype] = GetParam();
  for (std::uint64_t seed : {1u, 2u}) {
    for (float wd : {0.0f, 0.01f}) {
      BackwardCase c;
      c.kind = kind;
      c.zipf = zipf;
      c.gdtype = gdtype;
      c.weight_decay = wd;
      c.seed = seed;
      ProblemSpec s = backward_spec();
      s.offset_pad = seed == 2 ? 1 : 0;
      run_backward_case(s, c,
                        std::string(optimizer_name(kind)) + " zipf " + std::to_string(zipf) +
                            " grad " + std::string(dtype_name(gdtype)) + " wd " +
                            std::to_string(wd) + " seed " + std::to_string(seed));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    , GpuBackwardOptimizers,
    ::testing::Values(std::make_tuple(OptimizerKind::sgd, 0.0, DType::f32),
                      std::make_tuple(OptimizerKind::sgd, 1.2, DType::f32),
                      std::make_tuple(OptimizerKind::adagrad, 0.0, DType::f32),
                      std::make_tuple(OptimizerKind::adagrad, 1.2, DType::bf16),
                      std::make_tuple(OptimizerKind::rowwise_adagrad, 0.0, DType::f32),
                      std::make_tuple(OptimizerKind::rowwise_adagrad, 1.2, DType::f32),
                      std::make_tuple(OptimizerKind::rowwise_adagrad, 1.2, DType::bf16)));

// Every table fills its lane group exactly and every row is 16-byte aligned (the DLRM layout): the
// rows kernel's specialization runs, for each group it has (4, 8, 16 lanes), each optimizer,
// fp32 and bf16 gradients, fp32, bf16 and fp16 weights, sum and mean pooling, and heavy rows; a
// misaligned gradient view (or one table of another dim) takes the general kernel.
TEST(GpuEmbeddingBackward, RowsThatFillTheGroupMatch) {
  PARITY_REQUIRE_GPU();
  const int warp = device_info().warp_size;
  struct Shape {
    int dim;
    DType wdtype;
    int group;
  };
  for (const Shape sh :
       {Shape{64, DType::f32, 4}, Shape{128, DType::f32, 8}, Shape{256, DType::f32, 16},
        Shape{128, DType::bf16, 8}, Shape{64, DType::f16, 4}}) {
    if (sh.group > warp) continue;
    for (OptimizerKind kind :
         {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
      for (DType gdtype : {DType::f32, DType::bf16}) {
        ProblemSpec s;
        s.dims = {sh.dim, sh.dim, sh.dim};
        s.rows = {40, 1000, 7};
        s.pooling = {Pooling::sum, Pooling::mean};
        s.batch = 300;
        s.max_pool = 12;
        s.gap = 8;
        s.ld_extra = 8;
        BackwardCase c;
        c.kind = kind;
        c.wdtype = sh.wdtype;
        c.gdtype = gdtype;
        c.zipf = 1.2;  // repeated rows, and heavy ones in the 7-row table
        const std::string what =
            "dim " + std::to_string(sh.dim) + " " + std::string(dtype_name(sh.wdtype)) + " " +
            std::string(optimizer_name(kind)) + " grad " + std::string(dtype_name(gdtype));
        const CaseOutcome fits = run_backward_case(s, c, what + " (fits)");
        EXPECT_EQ(fits.fit_group, sh.group) << what;
        EXPECT_GT(fits.stats.heavy_rows, 0) << what;
        s.gap = 1;  // gradient rows no longer aligned
        EXPECT_EQ(run_backward_case(s, c, what + " (misaligned)").fit_group, 0) << what;
        s.gap = 8;
        // One narrower table: a launch group of its own, so the others still fit; it fits a
        // group of half the lanes where the kernel has that specialization.
        s.dims.back() = sh.dim / 2;
        const CaseOutcome mixed = run_backward_case(s, c, what + " (mixed dims)");
        const int half = sh.group / 2;
        EXPECT_EQ(mixed.fit_groups, (std::vector<int>{sh.group, half >= 4 ? half : 0})) << what;
      }
    }
  }
}

// Enough distinct rows that every group of the specialized rows kernel's persistent grid walks
// many segments (the indices fetched ahead, in two stages, are used), for each optimizer.
TEST(GpuEmbeddingBackward, RowsThatFillTheGroupManySegments) {
  PARITY_REQUIRE_GPU();
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    ProblemSpec s;
    s.dims = {128, 128, 128};
    s.rows = {400000, 60000, 9};
    s.pooling = {Pooling::sum, Pooling::mean};
    s.batch = 16384;
    s.max_pool = 16;
    s.gap = 8;
    s.ld_extra = 8;
    BackwardCase c;
    c.kind = kind;
    c.gdtype = DType::bf16;
    const std::string what = std::string("many segments ") + std::string(optimizer_name(kind));
    const CaseOutcome r = run_backward_case(s, c, what);
    EXPECT_EQ(r.fit_group, 8) << what;
    // More than 4 segments per group even on a grid of 8 blocks per SM (the kernel fits at most
    // 5) of 16 groups (128 threads, 8 lanes per row).
    const std::int64_t most_groups =
        static_cast<std::int64_t>(device_info().multiprocessor_count) * 8 * 16;
    EXPECT_GT(r.stats.unique_rows, 4 * most_groups) << what;
  }
}

TEST(GpuEmbeddingBackward, EveryLaneShapeMatches) {
  PARITY_REQUIRE_GPU();
  for (int vpl : {1, 2, 4}) {
    for (DType wdtype : {DType::f32, DType::bf16}) {
      for (OptimizerKind kind :
           {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
        BackwardCase c;
        c.kind = kind;
        c.wdtype = wdtype;
        c.zipf = 1.2;
        c.vectors_per_lane = vpl;
        run_backward_case(backward_spec(), c,
                          std::string("vectors per lane ") + std::to_string(vpl) + " " +
                              std::string(dtype_name(wdtype)) + " " +
                              std::string(optimizer_name(kind)));
      }
    }
  }
}

TEST(GpuEmbeddingBackward, HeavyRowsTakeTheChunkedPathAndMatch) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {128, 8, 33};
  s.rows = {5, 2, 3};  // tiny tables: every row has hundreds of occurrences
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 3000;
  s.max_pool = 20;
  for (OptimizerKind kind :
       {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad}) {
    BackwardCase c;
    c.kind = kind;
    run_backward_case(s, c, std::string("heavy rows ") + std::string(optimizer_name(kind)));
  }
  // And the stats show the heavy path was taken.
  const Problem p = make_problem(s, 1);
  BackwardCase c;
  const auto r = gpu_backward(p, random_values(p.weight_elems, 1, false, DType::f32), {},
                              random_values(p.batch * p.ld, 2, false, DType::f32), c,
                              OptimizerParams{}, UpdateOptions{});
  EXPECT_EQ(r.stats.unique_rows, 10);
  EXPECT_EQ(r.stats.heavy_rows, 10);
  EXPECT_GT(r.stats.heavy_chunks, 100);
}

// A narrow table's hot rows beside a wide table: the heavy kernel's block holds one partial row
// per group of lanes, and a narrow table's groups are single lanes (256 of them a block). Sized
// by the widest table of the model, that was 512 KB of shared memory, more than any GPU has.
TEST(GpuEmbeddingBackward, HeavyRowsOfANarrowTableBesideAWideOneMatch) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {16, 512, 8};
  s.rows = {3, 1000, 2};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 3000;
  s.max_pool = 20;
  for (DType wdtype : {DType::f32, DType::f16}) {
    for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::rowwise_adagrad}) {
      BackwardCase c;
      c.kind = kind;
      c.wdtype = wdtype;
      const CaseOutcome o =
          run_backward_case(s, c,
                            std::string("narrow heavy rows ") + std::string(dtype_name(wdtype)) +
                                " " + std::string(optimizer_name(kind)));
      EXPECT_GE(o.stats.heavy_rows, 5);
    }
  }
}

TEST(GpuEmbeddingBackward, ZipfLargeBatchMatchesCpu) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {128, 64};
  s.rows = {200000, 1000};
  s.pooling = {Pooling::sum};
  s.batch = 4096;
  s.max_pool = 20;
  BackwardCase c;
  c.kind = OptimizerKind::rowwise_adagrad;
  c.zipf = 1.05;
  run_backward_case(s, c, "zipf 1.05 rowwise, batch 4096");
}

class GpuBackwardNarrowWeights : public ::testing::TestWithParam<std::tuple<DType, OptimizerKind>> {
};

TEST_P(GpuBackwardNarrowWeights, StochasticRoundingBracketsAndIsUnbiased) {
  PARITY_REQUIRE_GPU();
  const auto [wdtype, kind] = GetParam();
  ProblemSpec s;
  s.dims = {128, 7, 64};
  s.rows = {3000, 50};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 2048;
  s.max_pool = 10;
  BackwardCase c;
  c.kind = kind;
  c.wdtype = wdtype;
  c.zipf = 1.1;
  run_backward_case(s, c,
                    std::string(dtype_name(wdtype)) + " " + std::string(optimizer_name(kind)));
}

INSTANTIATE_TEST_SUITE_P(, GpuBackwardNarrowWeights,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(OptimizerKind::sgd,
                                                              OptimizerKind::adagrad,
                                                              OptimizerKind::rowwise_adagrad)));

TEST(GpuEmbeddingBackward, DeterministicAcrossRunsAndSortMethods) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {128, 16, 130};
  s.rows = {5000, 4, 300};
  s.pooling = {Pooling::sum, Pooling::mean};
  s.batch = 4096;
  s.max_pool = 16;
  for (DType wdtype : {DType::f32, DType::bf16}) {
    BackwardCase c;
    c.kind = OptimizerKind::rowwise_adagrad;
    c.wdtype = wdtype;
    c.zipf = 1.2;
    s.kind = c.kind;
    s.dtype = wdtype;
    s.zipf_alpha = c.zipf;
    const Problem p = make_problem(s, 3);
    const auto w0 = random_values(p.weight_elems, 3, false, wdtype);
    const auto s0 = random_values(p.state_elems, 4, false, DType::f32, 0.0f, 1.0f);
    const auto dout = random_values(p.batch * p.ld, 5, false, DType::f32);
    OptimizerParams opt;
    opt.kind = c.kind;
    opt.lr = 0.05f;
    UpdateOptions upd;
    upd.seed = 99;
    upd.step = 3;
    const auto a = gpu_backward(p, w0, s0, dout, c, opt, upd);
    const auto b = gpu_backward(p, w0, s0, dout, c, opt, upd);
    c.sort = SortMethod::portable;
    const auto d = gpu_backward(p, w0, s0, dout, c, opt, upd);
    EXPECT_GT(a.stats.heavy_rows, 0);
    EXPECT_TRUE(a.raw_weights == b.raw_weights) << "two runs differ (" << dtype_name(wdtype) << ")";
    EXPECT_TRUE(a.raw_weights == d.raw_weights)
        << "vendor and portable sorts differ (" << dtype_name(wdtype) << ")";
    EXPECT_TRUE(a.state == b.state && a.state == d.state);
    if (wdtype != DType::f32) {
      upd.step = 4;  // another step draws other random bits
      const auto e = gpu_backward(p, w0, s0, dout, c, opt, upd);
      EXPECT_FALSE(a.raw_weights == e.raw_weights) << "stochastic rounding ignores the step";
    }
  }
}

TEST(GpuEmbeddingBackward, NearestRoundingWhenAsked) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {64};
  s.rows = {500};
  s.pooling = {Pooling::sum};
  s.batch = 256;
  s.dtype = DType::bf16;
  const Problem p = make_problem(s, 8);
  const auto w0 = random_values(p.weight_elems, 8, false, DType::bf16);
  const auto dout = random_values(p.batch * p.ld, 9, false, DType::f32);
  OptimizerParams opt;
  opt.lr = 0.01f;
  UpdateOptions upd;
  upd.stochastic_rounding = false;
  BackwardCase c;
  c.wdtype = DType::bf16;
  const auto r = gpu_backward(p, w0, {}, dout, c, opt, upd);
  std::vector<float> ref = w0;
  cpu::embedding_backward_update<float>(as_f32(p.tables), TableWeights::all(DType::f32, ref.data()),
                                        nullptr, p.input(),
                                        {dout.data(), p.batch, p.out_cols, p.ld}, opt, {});
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float nearest = bf16_to_float(bf16_bits(ref[i]));
    // fp32 (GPU) and double (CPU) steps may straddle a rounding midpoint: allow one ulp there.
    if (r.weights[i] != nearest &&
        std::fabs(r.weights[i] - ref[i]) > ulp(ref[i], DType::bf16) * 0.5001 && ++bad <= 5) {
      ADD_FAILURE() << "weight " << i << " = " << r.weights[i] << ", nearest bf16 of " << ref[i]
                    << " is " << nearest;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(GpuEmbeddingBackward, EmptyBatchAndEmptyBags) {
  PARITY_REQUIRE_GPU();
  ProblemSpec s;
  s.dims = {16};
  s.rows = {10};
  s.pooling = {Pooling::mean};
  s.batch = 8;
  s.max_pool = 0;  // 10% empty, 10% single, else empty: mostly empty bags
  BackwardCase c;
  c.kind = OptimizerKind::rowwise_adagrad;
  run_backward_case(s, c, "mostly empty bags");
}

}  // namespace
}  // namespace parity::gpu::test
