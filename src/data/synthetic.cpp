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
//   teacher on the fly; the only scratch is a per-thread vector of 2T doubles kept across calls.
// - The per-example math is parity/synthetic_example.h, over the generator as one flat block
//   (synth::Generator) that this file builds: a GPU backend runs the same code on a copy of the
//   block (Backend::make_synthetic) and makes the same batches, bit for bit.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
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
inline RowValues row_values(const data_detail::ZigguratTable& z, const synth::Table& g,
                            std::int64_t row) {
  const std::uint64_t r = static_cast<std::uint64_t>(row);
  return {data_detail::normal_value(z, g.h_key, r), data_detail::normal_value(z, g.g_key, r)};
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
RowMoments row_moments(const synth::Table& g) {
  const data_detail::ZigguratTable& z = data_detail::ziggurat_table();
  RowMoments m;
  if (!g.zipf && g.rows > kMomentRows) return m;
  const std::int64_t head = std::min(g.rows, kMomentRows);
  std::vector<double> weight(head, 1.0);
  double total = static_cast<double>(g.rows);
  if (g.zipf) {
    const double alpha = g.ranks.alpha;
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
      const double integral = std::exp((1.0 - alpha) * std::log(a)) * log_ratio *
                              synth::Zipf::expm1_over((1.0 - alpha) * log_ratio);
      auto f = [&](double x) { return std::exp(-alpha * std::log(x)); };
      auto df = [&](double x) { return -alpha * f(x) / x; };
      total += integral + (f(b) - f(a)) / 2.0 + (df(b) - df(a)) / 12.0;
    }
  }
  double mean_h = 0.0, square_h = 0.0, mean_g = 0.0, square_g = 0.0, head_mass = 0.0;
  for (std::int64_t k = 0; k < head; ++k) {
    const double w = weight[k] / total;
    const RowValues v = row_values(z, g, g.zipf ? g.scatter(k) : k);
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
  // The generator as one flat block: synth::Generator, then its arrays (8-byte aligned storage).
  std::vector<std::uint64_t> block;
  const synth::Generator& gen() const {
    return *reinterpret_cast<const synth::Generator*>(block.data());
  }
};

namespace {

// Lays the generator's parts out as one block: the header, then each array 8-byte aligned.
std::vector<std::uint64_t> pack(synth::Generator head, const std::vector<synth::Table>& tables,
                                const std::vector<PairTerm>& pairs,
                                const std::vector<CrossTerm>& cross,
                                const std::vector<double>& dense_coef) {
  auto up8 = [](std::uint64_t x) { return (x + 7) / 8 * 8; };
  head.num_tables = static_cast<std::int32_t>(tables.size());
  head.num_pairs = static_cast<std::int32_t>(pairs.size());
  head.num_cross = static_cast<std::int32_t>(cross.size());
  head.num_dense = static_cast<std::int32_t>(dense_coef.size());
  head.tables_at = up8(sizeof(synth::Generator));
  head.pairs_at = up8(head.tables_at + tables.size() * sizeof(synth::Table));
  head.cross_at = up8(head.pairs_at + pairs.size() * sizeof(synth::Pair));
  head.dense_coef_at = up8(head.cross_at + cross.size() * sizeof(synth::Cross));
  head.bytes = up8(head.dense_coef_at + dense_coef.size() * sizeof(double));
  std::vector<std::uint64_t> block(head.bytes / 8, 0);
  auto* base = reinterpret_cast<unsigned char*>(block.data());
  std::memcpy(base, &head, sizeof head);
  if (!tables.empty())
    std::memcpy(base + head.tables_at, tables.data(), tables.size() * sizeof(synth::Table));
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const synth::Pair p{pairs[i].t, pairs[i].u, pairs[i].c};
    std::memcpy(base + head.pairs_at + i * sizeof p, &p, sizeof p);
  }
  for (std::size_t i = 0; i < cross.size(); ++i) {
    const synth::Cross c{cross[i].k, cross[i].t, cross[i].c};
    std::memcpy(base + head.cross_at + i * sizeof c, &c, sizeof c);
  }
  if (!dense_coef.empty())
    std::memcpy(base + head.dense_coef_at, dense_coef.data(), dense_coef.size() * sizeof(double));
  return block;
}

}  // namespace

SyntheticData::SyntheticData(const ModelSpec& model, std::uint64_t seed) {
  require_dlrm(model, "the synthetic data generator");
  require(model.dense_features >= 0, data_detail::model_where(model),
          fmt::format("dense_features must be >= 0, got {}", model.dense_features));
  const int num_tables = model.num_tables();
  const int nd = model.dense_features;
  synth::Generator head;
  head.bias = kBias;
  head.zig = data_detail::ziggurat_table();
  std::vector<synth::Table> tables(num_tables);
  // Variances over examples of pool(h_t) and pool(g_t): the coefficients are scaled by them.
  std::vector<double> p_var(num_tables, 0.0), q_var(num_tables, 0.0);
  for (int t = 0; t < num_tables; ++t) {
    const TableSpec& spec = model.tables[t];
    const std::string twhere = data_detail::table_where(model, t);
    require(spec.rows > 0, twhere, fmt::format("rows must be > 0, got {}", spec.rows));
    require(spec.pooling_size >= 0, twhere,
            fmt::format("pooling_size must be >= 0, got {}", spec.pooling_size));
    synth::Table& g = tables[t];
    g.rows = spec.rows;
    g.pooling = spec.pooling_size;
    if (spec.distribution == IdDistribution::zipf) {
      require(spec.zipf_alpha > 0.0 && std::isfinite(spec.zipf_alpha), twhere,
              fmt::format("zipf_alpha must be a finite number > 0 for a zipf table, got {:f}",
                          spec.zipf_alpha));
      g.zipf = 1;
      g.ranks = ZipfSampler(spec.rows, spec.zipf_alpha).params();
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
      p_var[t] =
          g.pool_scale * g.pool_scale * l * std::max(0.0, rm.square_h - rm.mean_h * rm.mean_h);
      q_var[t] =
          g.pool_scale * g.pool_scale * l * std::max(0.0, rm.square_g - rm.mean_g * rm.mean_g);
    }
    g.id_prefix = head.ids_per_example;
    head.ids_per_example += g.pooling;
  }
  for (Split s : {Split::train, Split::eval}) {
    head.dense_key[split_code(s) - 1] = rng::key(seed, kDenseStream, split_code(s));
    head.label_key[split_code(s) - 1] = rng::key(seed, kLabelStream, split_code(s));
  }

  // ---- teacher coefficients ----
  rng::Stream coef(rng::key(seed, kCoefficientStream));
  std::vector<int> eligible;  // tables with a non-empty bag
  for (int t = 0; t < num_tables; ++t) {
    if (tables[t].pooling > 0) eligible.push_back(t);
  }
  const int ne = static_cast<int>(eligible.size());

  // Table pairs: a few distinct unordered pairs of eligible tables.
  std::vector<PairTerm> pairs;
  const std::int64_t max_pairs = static_cast<std::int64_t>(ne) * (ne - 1) / 2;
  const int num_pairs = static_cast<int>(std::min<std::int64_t>(max_pairs, std::max(1, ne / 3)));
  while (static_cast<int>(pairs.size()) < num_pairs) {
    int a = eligible[coef.next_below(ne)];
    int b = eligible[coef.next_below(ne)];
    if (a == b) continue;
    if (a > b) std::swap(a, b);
    const bool seen = std::any_of(pairs.begin(), pairs.end(),
                                  [&](const PairTerm& p) { return p.t == a && p.u == b; });
    if (!seen) pairs.push_back({a, b, raw_coefficient(coef)});
  }
  // Dense x table terms: a few distinct (dense feature, eligible table) pairs.
  std::vector<CrossTerm> cross;
  const std::int64_t max_cross = static_cast<std::int64_t>(nd) * ne;
  const int num_cross = static_cast<int>(std::min<std::int64_t>(max_cross, std::max(2, ne / 4)));
  while (static_cast<int>(cross.size()) < num_cross) {
    const int k = static_cast<int>(coef.next_below(nd));
    const int t = eligible[coef.next_below(ne)];
    const bool seen = std::any_of(cross.begin(), cross.end(),
                                  [&](const CrossTerm& c) { return c.k == k && c.t == t; });
    if (!seen) cross.push_back({k, t, raw_coefficient(coef)});
  }

  // Variance shares over the groups this model has.
  const double share_dense = nd > 0 ? kShareDense : 0.0;
  const double share_tables = ne > 0 ? kShareTables : 0.0;
  const double share_pairs = num_pairs > 0 ? kSharePairs : 0.0;
  const double share_cross = num_cross > 0 ? kShareCross : 0.0;
  const double share_sum = share_dense + share_tables + share_pairs + share_cross;
  const double total_var = kLogitStd * kLogitStd;
  auto target = [&](double share) { return share_sum > 0 ? total_var * share / share_sum : 0.0; };

  std::vector<double> dense_coef(nd);
  for (double& x : dense_coef) x = raw_coefficient(coef);
  scale_to_variance(
      dense_coef, [](std::size_t) { return 1.0; }, target(share_dense));

  std::vector<double> c(num_tables, 0.0);
  for (int t : eligible) c[t] = raw_coefficient(coef) * (tables[t].zipf ? kZipfWeight : 1.0);
  scale_to_variance(
      c, [&](std::size_t t) { return p_var[t]; }, target(share_tables));
  for (int t = 0; t < num_tables; ++t) tables[t].s = c[t];

  c.resize(pairs.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = pairs[i].c;
  scale_to_variance(
      c, [&](std::size_t i) { return q_var[pairs[i].t] * q_var[pairs[i].u]; }, target(share_pairs));
  for (std::size_t i = 0; i < c.size(); ++i) pairs[i].c = c[i];

  c.resize(cross.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = cross[i].c;
  scale_to_variance(
      c, [&](std::size_t i) { return q_var[cross[i].t]; }, target(share_cross));
  for (std::size_t i = 0; i < c.size(); ++i) cross[i].c = c[i];

  for (const PairTerm& p : pairs) tables[p.t].needs_g = tables[p.u].needs_g = 1;
  for (const CrossTerm& x : cross) tables[x.t].needs_g = 1;
  auto impl = std::make_shared<Impl>();
  impl->block = pack(head, tables, pairs, cross, dense_coef);
  impl_ = std::move(impl);
}

std::span<const std::byte> SyntheticData::generator() const {
  return std::as_bytes(std::span<const std::uint64_t>(impl_->block));
}

std::int64_t SyntheticData::ids_per_example() const {
  return impl_->gen().ids_per_example;
}

void SyntheticData::make(Split split, std::int64_t first, std::int64_t count, Batch& out) const {
  if (first < 0 || count < 0) {
    throw Error(fmt::format(
        "SyntheticData::make: first and count must be >= 0, got first={} count={}", first, count));
  }
  const synth::Generator& g = impl_->gen();
  const int nt = g.num_tables;
  const int nd = g.num_dense;
  const int si = static_cast<int>(split_code(split)) - 1;
  out.size = count;
  out.num_dense = nd;
  out.num_tables = nt;
  out.dense.resize(static_cast<std::size_t>(count) * nd);
  out.labels.resize(count);
  out.teacher_prob.resize(count);
  out.ids.resize(static_cast<std::size_t>(count) * g.ids_per_example);
  out.offsets.resize(static_cast<std::size_t>(nt) * count + 1);
  out.offsets[static_cast<std::size_t>(nt) * count] = count * g.ids_per_example;

  float* dense = out.dense.data();
  float* labels = out.labels.data();
  float* probs = out.teacher_prob.data();
  std::int64_t* ids = out.ids.data();
  std::int64_t* offsets = out.offsets.data();

#pragma omp parallel if (count >= 256)
  {
    thread_local std::vector<double> scratch;
    scratch.resize(2 * static_cast<std::size_t>(nt));
    double* p = scratch.data();  // the tables' terms of the current example
    double* q = p + nt;
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < count; ++b) {
      const std::uint64_t e = static_cast<std::uint64_t>(first + b);
      float* x = dense + b * nd;  // [num_dense]
      for (int k = 0; k < nd; ++k) x[k] = synth::dense_value(g, si, e, k);
      for (int t = 0; t < nt; ++t) {
        const std::int64_t start = synth::bag_start(g, t, b, count);
        offsets[static_cast<std::int64_t>(t) * count + b] = start;
        const synth::TableTerms terms = synth::table_bag(g, si, t, e, ids + start);
        p[t] = terms.p;
        q[t] = terms.q;
      }
      const double prob = synth::probability(synth::logit(g, x, p, q, 1));
      probs[b] = static_cast<float>(prob);
      labels[b] = synth::label(g, si, e, prob);
    }
  }
}

}  // namespace parity
