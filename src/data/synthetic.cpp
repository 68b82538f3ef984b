// Synthetic DLRM data with a planted teacher.
//
// Why it is built this way:
// - Every value is a pure function of (seed, split, example index): each (split, table) has its
//   own counter-based stream (random.h) and id j of example e is counter e*pooling + j of it.
//   So batch k is the same whichever thread makes it and in whichever order, a resumed run sees
//   exactly the data it would have seen, and make() can split examples over OpenMP threads with
//   no reduction across examples: results are bit-identical for any thread count.
// - The teacher has no memory per row: h_t(row) and g_t(row) are two independent N(0,1) values
//   (ziggurat normals of hashes of (seed, table, row), see hash_normal.h), so tables of
//   1e12 rows cost nothing. The teacher and the Zipf row permutation depend on the seed only,
//   not on the split: train and eval are different samples of the same task.
// - The logit is a sum of terms of known variance (dense linear, per-table pooled value,
//   products of two tables' pooled values, dense x pooled value). Coefficients have random
//   signs and sizes from the seed and are then scaled so each group gets a fixed share of a
//   fixed logit variance; the total sets the Bayes AUC (~0.83), the shares set how much of
//   it needs embeddings and interactions. The pooled values are centred with their exact
//   means under the table's id distribution (computed from the head rows at construction), so
//   the logit's mean is the bias and its variance the target for every seed. Zipf tables get twice
//   the raw weight: their hot rows are seen often enough for a student to learn them.
// - One pass per example writes its ids straight into the table-major CSR (bag offsets are
//   fixed by the pooling sizes, so every example knows where its bags go) and computes the
//   teacher on the fly; the only scratch is a per-thread vector of T doubles kept across calls.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/hash_normal.h"
#include "data/model_names.h"
#include "data/row_scatter.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/random.h"

namespace parity {
namespace {

// Stream purposes (first coordinate of rng::key). Fixed forever: changing one changes the data.
constexpr std::uint64_t kIdStream = 0x1d5;
constexpr std::uint64_t kDenseStream = 0xde45e;
constexpr std::uint64_t kLabelStream = 0x1abe1;
constexpr std::uint64_t kTeacherRowStream = 0x7eac4e2;
constexpr std::uint64_t kCoefficientStream = 0xc0ef;
constexpr std::uint64_t kScatterStream = 0x5ca7;

// The teacher's logit: kBias plus centred terms whose variances add up to kLogitStd^2. With
// labels drawn as Bernoulli(sigmoid(logit)) the Bayes AUC is set by the logit's spread: std 1.7
// gives ~0.83 (measured: 0.832-0.836 over seeds and models), std 2.0 would give ~0.86 and 2.5
// ~0.90. kBias = -1 puts the label mean near 0.34.
constexpr double kBias = -1.0;
constexpr double kLogitStd = 1.7;
// Shares of the logit variance per group of terms (renormalised over the groups a model has).
constexpr double kShareDense = 0.20;
constexpr double kShareTables = 0.45;
constexpr double kSharePairs = 0.20;
constexpr double kShareCross = 0.15;
constexpr double kZipfWeight = 2.0;  // raw weight of a Zipf table relative to a uniform one

std::uint64_t split_code(Split split) {
  return split == Split::train ? 1 : 2;
}

struct TableGen {
  std::int64_t rows = 1;
  int pooling = 0;
  double pool_scale = 0.0;  // 1/sqrt(L) for sum, 1/L for mean, 0 for L == 0
  // Mean and variance over examples of pool(h_t) and pool(g_t): the teacher uses centred pooled
  // values, and scales its coefficients by these variances.
  double p_mean = 0.0, p_var = 0.0, q_mean = 0.0, q_var = 0.0;
  std::optional<ZipfSampler> zipf;
  double zipf_alpha = 0.0;
  data_detail::RowScatter scatter;
  std::uint64_t id_key[2] = {0, 0};    // per split
  std::uint64_t h_key = 0, g_key = 0;  // teacher value streams, indexed by row
  double s = 0.0;                      // coefficient of pool(h_t)
  bool needs_g = false;
  std::int64_t id_prefix = 0;  // sum of pooling sizes of the tables before this one
};

struct PairTerm {
  int t, u;
  double c;
};

struct CrossTerm {
  int k, t;
  double c;
};

// Raw coefficient: random sign, magnitude in [0.5, 1.5).
double raw_coefficient(rng::Stream& stream) {
  const double magnitude = 0.5 + stream.next_uniform();
  return (stream.next_bits() & 1) ? magnitude : -magnitude;
}

// Multiplies coefficients so that sum(c_i^2 * var_i) == target.
template <typename Var>
void scale_to_variance(std::vector<double>& coefs, Var&& var_of, double target) {
  double v = 0.0;
  for (std::size_t i = 0; i < coefs.size(); ++i) v += coefs[i] * coefs[i] * var_of(i);
  if (v <= 0.0) return;
  const double f = std::sqrt(target / v);
  for (double& c : coefs) c *= f;
}

struct RowValues {
  double h, g;
};

// h and g of one row.
inline RowValues row_values(const data_detail::ZigguratTable& z, const TableGen& g,
                            std::int64_t row, bool needs_g) {
  const std::uint64_t r = static_cast<std::uint64_t>(row);
  return {data_detail::normal_value(z, g.h_key, r),
          needs_g ? data_detail::normal_value(z, g.g_key, r) : 0.0};
}

// expm1(t) / t, continuous at t = 0.
double expm1_over(double t) {
  if (std::abs(t) > 1e-8) return std::expm1(t) / t;
  return 1.0 + 0.5 * t * (1.0 + t / 3.0 * (1.0 + 0.25 * t));
}

// Rows (uniform tables) or head ranks (Zipf tables) summed exactly for the moments below.
constexpr std::int64_t kMomentRows = 16384;

struct RowMoments {
  double mean_h = 0.0, square_h = 1.0, mean_g = 0.0, square_g = 1.0;  // E[h], E[h^2], ...
};

// Moments of (h, g) of the row of one id draw. Exact for uniform tables of up to kMomentRows
// rows and for the kMomentRows most frequent ranks of a Zipf table; rows beyond contribute their
// expectation over the hash (mean 0, second moment 1), which is accurate because there are
// many of them, each with a tiny share of the draws.
RowMoments row_moments(const TableGen& g) {
  const data_detail::ZigguratTable& z = data_detail::ziggurat_table();
  RowMoments m;
  if (!g.zipf && g.rows > kMomentRows) return m;
  const std::int64_t head = std::min(g.rows, kMomentRows);
  std::vector<double> weight(head, 1.0);
  double total = static_cast<double>(g.rows);
  if (g.zipf) {
    const double alpha = g.zipf_alpha;
    double sum = 0.0;
    for (std::int64_t k = head - 1; k >= 0; --k) {
      weight[k] = std::exp(-alpha * std::log(static_cast<double>(k + 1)));
      sum += weight[k];
    }
    total = sum;
    if (g.rows > head) {
      // sum_{k=head+1}^{rows} k^-alpha by Euler-Maclaurin: integral + end corrections.
      const double a = static_cast<double>(head), b = static_cast<double>(g.rows);
      const double log_ratio = std::log(b / a);
      const double integral =
          std::exp((1.0 - alpha) * std::log(a)) * log_ratio * expm1_over((1.0 - alpha) * log_ratio);
      auto f = [&](double x) { return std::exp(-alpha * std::log(x)); };
      auto df = [&](double x) { return -alpha * f(x) / x; };
      total += integral + (f(b) - f(a)) / 2.0 + (df(b) - df(a)) / 12.0;
    }
  }
  double mean_h = 0.0, square_h = 0.0, mean_g = 0.0, square_g = 0.0, head_mass = 0.0;
  for (std::int64_t k = 0; k < head; ++k) {
    const double w = weight[k] / total;
    const RowValues v = row_values(z, g, g.zipf ? g.scatter(k) : k, true);
    mean_h += w * v.h;
    square_h += w * v.h * v.h;
    mean_g += w * v.g;
    square_g += w * v.g * v.g;
    head_mass += w;
  }
  const double tail_mass = std::max(0.0, 1.0 - head_mass);
  return {mean_h, square_h + tail_mass, mean_g, square_g + tail_mass};
}

}  // namespace

struct SyntheticData::Impl {
  int num_dense = 0;
  std::int64_t ids_per_example = 0;
  std::vector<TableGen> tables;
  std::vector<double> dense_coef;  // a_k
  std::vector<PairTerm> pairs;
  std::vector<CrossTerm> cross;
  std::uint64_t dense_key[2] = {0, 0};
  std::uint64_t label_key[2] = {0, 0};
};

SyntheticData::SyntheticData(const ModelSpec& model, std::uint64_t seed) {
  require(model.dense_features >= 0, data_detail::model_where(model),
          fmt::format("dense_features must be >= 0, got {}", model.dense_features));
  auto impl = std::make_shared<Impl>();
  impl->num_dense = model.dense_features;
  const int num_tables = model.num_tables();
  impl->tables.resize(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const TableSpec& spec = model.tables[t];
    const std::string twhere = data_detail::table_where(model, t);
    require(spec.rows > 0, twhere, fmt::format("rows must be > 0, got {}", spec.rows));
    require(spec.pooling_size >= 0, twhere,
            fmt::format("pooling_size must be >= 0, got {}", spec.pooling_size));
    TableGen& g = impl->tables[t];
    g.rows = spec.rows;
    g.pooling = spec.pooling_size;
    if (spec.distribution == IdDistribution::zipf) {
      require(spec.zipf_alpha > 0.0 && std::isfinite(spec.zipf_alpha), twhere,
              fmt::format("zipf_alpha must be a finite number > 0 for a zipf table, got {:f}",
                          spec.zipf_alpha));
      g.zipf.emplace(spec.rows, spec.zipf_alpha);
      g.zipf_alpha = spec.zipf_alpha;
      g.scatter = data_detail::RowScatter(spec.rows, rng::key(seed, kScatterStream, t));
    }
    g.id_key[0] = rng::key(seed, kIdStream, split_code(Split::train), t);
    g.id_key[1] = rng::key(seed, kIdStream, split_code(Split::eval), t);
    g.h_key = rng::key(seed, kTeacherRowStream, t, 0);
    g.g_key = rng::key(seed, kTeacherRowStream, t, 1);
    if (g.pooling > 0) {
      // A bag of L independent draws: pool = scale * sum, so mean = scale*L*E[h] and
      // variance = scale^2 * L * var(h).
      const double l = g.pooling;
      g.pool_scale = spec.pooling == Pooling::mean ? 1.0 / l : 1.0 / std::sqrt(l);
      const RowMoments rm = row_moments(g);
      g.p_mean = g.pool_scale * l * rm.mean_h;
      g.q_mean = g.pool_scale * l * rm.mean_g;
      g.p_var =
          g.pool_scale * g.pool_scale * l * std::max(0.0, rm.square_h - rm.mean_h * rm.mean_h);
      g.q_var =
          g.pool_scale * g.pool_scale * l * std::max(0.0, rm.square_g - rm.mean_g * rm.mean_g);
    }
    g.id_prefix = impl->ids_per_example;
    impl->ids_per_example += g.pooling;
  }
  for (Split s : {Split::train, Split::eval}) {
    impl->dense_key[split_code(s) - 1] = rng::key(seed, kDenseStream, split_code(s));
    impl->label_key[split_code(s) - 1] = rng::key(seed, kLabelStream, split_code(s));
  }

  // ---- teacher coefficients ----
  rng::Stream coef(rng::key(seed, kCoefficientStream));
  std::vector<int> eligible;  // tables with a non-empty bag
  for (int t = 0; t < num_tables; ++t) {
    if (impl->tables[t].pooling > 0) eligible.push_back(t);
  }
  const int ne = static_cast<int>(eligible.size());
  const int nd = impl->num_dense;

  // Table pairs: a few distinct unordered pairs of eligible tables.
  const std::int64_t max_pairs = static_cast<std::int64_t>(ne) * (ne - 1) / 2;
  const int num_pairs = static_cast<int>(std::min<std::int64_t>(max_pairs, std::max(1, ne / 3)));
  while (static_cast<int>(impl->pairs.size()) < num_pairs) {
    int a = eligible[coef.next_below(ne)];
    int b = eligible[coef.next_below(ne)];
    if (a == b) continue;
    if (a > b) std::swap(a, b);
    const bool seen = std::any_of(impl->pairs.begin(), impl->pairs.end(),
                                  [&](const PairTerm& p) { return p.t == a && p.u == b; });
    if (!seen) impl->pairs.push_back({a, b, raw_coefficient(coef)});
  }
  // Dense x table terms: a few distinct (dense feature, eligible table) pairs.
  const std::int64_t max_cross = static_cast<std::int64_t>(nd) * ne;
  const int num_cross = static_cast<int>(std::min<std::int64_t>(max_cross, std::max(2, ne / 4)));
  while (static_cast<int>(impl->cross.size()) < num_cross) {
    const int k = static_cast<int>(coef.next_below(nd));
    const int t = eligible[coef.next_below(ne)];
    const bool seen = std::any_of(impl->cross.begin(), impl->cross.end(),
                                  [&](const CrossTerm& c) { return c.k == k && c.t == t; });
    if (!seen) impl->cross.push_back({k, t, raw_coefficient(coef)});
  }

  // Variance shares over the groups this model has.
  const double share_dense = nd > 0 ? kShareDense : 0.0;
  const double share_tables = ne > 0 ? kShareTables : 0.0;
  const double share_pairs = num_pairs > 0 ? kSharePairs : 0.0;
  const double share_cross = num_cross > 0 ? kShareCross : 0.0;
  const double share_sum = share_dense + share_tables + share_pairs + share_cross;
  const double total_var = kLogitStd * kLogitStd;
  auto target = [&](double share) { return share_sum > 0 ? total_var * share / share_sum : 0.0; };

  std::vector<double> c(nd);
  for (double& x : c) x = raw_coefficient(coef);
  scale_to_variance(
      c, [](std::size_t) { return 1.0; }, target(share_dense));
  impl->dense_coef = c;

  c.assign(num_tables, 0.0);
  for (int t : eligible) {
    c[t] = raw_coefficient(coef) * (impl->tables[t].zipf ? kZipfWeight : 1.0);
  }
  scale_to_variance(
      c, [&](std::size_t t) { return impl->tables[t].p_var; }, target(share_tables));
  for (int t = 0; t < num_tables; ++t) impl->tables[t].s = c[t];

  c.resize(impl->pairs.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = impl->pairs[i].c;
  scale_to_variance(
      c,
      [&](std::size_t i) {
        return impl->tables[impl->pairs[i].t].q_var * impl->tables[impl->pairs[i].u].q_var;
      },
      target(share_pairs));
  for (std::size_t i = 0; i < c.size(); ++i) impl->pairs[i].c = c[i];

  c.resize(impl->cross.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = impl->cross[i].c;
  scale_to_variance(
      c, [&](std::size_t i) { return impl->tables[impl->cross[i].t].q_var; }, target(share_cross));
  for (std::size_t i = 0; i < c.size(); ++i) impl->cross[i].c = c[i];

  for (const PairTerm& p : impl->pairs) {
    impl->tables[p.t].needs_g = impl->tables[p.u].needs_g = true;
  }
  for (const CrossTerm& x : impl->cross) impl->tables[x.t].needs_g = true;
  impl_ = std::move(impl);
}

void SyntheticData::make(Split split, std::int64_t first, std::int64_t count, Batch& out) const {
  if (first < 0 || count < 0) {
    throw Error(fmt::format(
        "SyntheticData::make: first and count must be >= 0, got first={} count={}", first, count));
  }
  const Impl& m = *impl_;
  const int nt = static_cast<int>(m.tables.size());
  const int nd = m.num_dense;
  const int si = static_cast<int>(split_code(split)) - 1;
  out.size = count;
  out.num_dense = nd;
  out.num_tables = nt;
  out.dense.resize(static_cast<std::size_t>(count) * nd);
  out.labels.resize(count);
  out.teacher_prob.resize(count);
  out.ids.resize(static_cast<std::size_t>(count) * m.ids_per_example);
  out.offsets.resize(static_cast<std::size_t>(nt) * count + 1);
  out.offsets[static_cast<std::size_t>(nt) * count] = count * m.ids_per_example;

  float* dense = out.dense.data();
  float* labels = out.labels.data();
  float* probs = out.teacher_prob.data();
  std::int64_t* ids = out.ids.data();
  std::int64_t* offsets = out.offsets.data();
  const data_detail::ZigguratTable& zig = data_detail::ziggurat_table();

#pragma omp parallel if (count >= 256)
  {
    thread_local std::vector<double> q_scratch;
    q_scratch.resize(nt);
    double* q = q_scratch.data();  // pool_t(g_t) of the current example
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < count; ++b) {
      const std::uint64_t e = static_cast<std::uint64_t>(first + b);
      double logit = kBias;
      float* x = dense + b * nd;  // [num_dense]
      for (int k = 0; k < nd; ++k) {
        x[k] = static_cast<float>(data_detail::normal_value(zig, m.dense_key[si], e * nd + k));
        logit += m.dense_coef[k] * x[k];
      }
      for (int t = 0; t < nt; ++t) {
        const TableGen& g = m.tables[t];
        const std::int64_t start = count * g.id_prefix + b * g.pooling;
        offsets[static_cast<std::int64_t>(t) * count + b] = start;
        std::int64_t* bag = ids + start;
        const std::uint64_t key = g.id_key[si];
        const std::uint64_t c0 = e * static_cast<std::uint64_t>(g.pooling);
        double sum_h = 0.0, sum_g = 0.0;
        for (int j = 0; j < g.pooling; ++j) {
          const std::uint64_t c = c0 + j;
          std::int64_t row;
          if (g.zipf) {
            const std::int64_t rank =
                g.zipf->sample(rng::uniform01(key, 2 * c), rng::uniform01(key, 2 * c + 1));
            row = g.scatter(rank);
          } else {
            row = static_cast<std::int64_t>(
                (static_cast<unsigned __int128>(rng::bits(key, c)) * g.rows) >> 64);
          }
          bag[j] = row;
          const RowValues v = row_values(zig, g, row, g.needs_g);
          sum_h += v.h;
          sum_g += v.g;
        }
        logit += g.s * (sum_h * g.pool_scale - g.p_mean);
        q[t] = sum_g * g.pool_scale - g.q_mean;
      }
      for (const PairTerm& p : m.pairs) logit += p.c * q[p.t] * q[p.u];
      for (const CrossTerm& c : m.cross) logit += c.c * x[c.k] * q[c.t];
      const double prob = 1.0 / (1.0 + std::exp(-logit));
      probs[b] = static_cast<float>(prob);
      labels[b] = rng::uniform01(m.label_key[si], e) < prob ? 1.0f : 0.0f;
    }
  }
}

}  // namespace parity
