// Synthetic HSTU data with a planted sequential teacher (SyntheticSequences, data.h).
//
// Why it is built this way:
// - Every value is a pure function of (seed, split, example index): each purpose has its own
//   counter-based stream (random.h), and the counters of example e start at e times the most
//   that any example uses, so examples are independent whatever their lengths. A first pass draws
//   the lengths (one uniform each), a prefix sum places every example, and a parallel pass fills
//   them: the output is the same for any thread count.
// - The teacher has no memory per row: an item's latent vector and an action's weight are
//   ziggurat normals of hashes of (seed, row), as in the DLRM generator, so tables of a billion
//   rows cost nothing.
// - Its terms are scaled to unit variance (the user state per component, the task vectors to norm
//   sqrt(K)), so the coefficients below set the logit's spread, and with it the Bayes AUC, for
//   every model and length distribution alike.
// - The order-blind reference is the same teacher with every event weighted alike: what an
//   order-blind copy of the teacher reaches, so tests can show that order carries signal.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <numeric>
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
constexpr std::uint64_t kLengthStream = 0x1e46;
constexpr std::uint64_t kEventStream = 0xe7e47;
constexpr std::uint64_t kTargetStream = 0x7a46e7;
constexpr std::uint64_t kContextStream = 0xc07e47;
constexpr std::uint64_t kTimeStream = 0x71e5;
constexpr std::uint64_t kLabelStream = 0x1abe15;
constexpr std::uint64_t kShuffleStream = 0x5af1e;
constexpr std::uint64_t kLatentStream = 0x1a7e47;
constexpr std::uint64_t kActionStream = 0xac7;
constexpr std::uint64_t kItemStream = 0x17e4;
constexpr std::uint64_t kContextValueStream = 0xc7a1;
constexpr std::uint64_t kTaskStream = 0x7a5c;
constexpr std::uint64_t kScatterStream = 0x5ca75;

// The teacher. kLatent: components of an item's latent vector. kRecency: the weight of the event
// one step further back (γ); kActionWeight: how much an action scales its event (β).
constexpr int kLatent = 8;
constexpr double kRecency = 0.5;
constexpr double kActionWeight = 0.5;
// logit_k = kBias + k kTaskBiasStep + kInterest <u ⊙ m_k, z(i)> / sqrt(K) + kItem g(i)
//           + kContext (contexts' pooled values): terms of unit variance, std about 1.6.
constexpr double kBias = -1.0;
constexpr double kTaskBiasStep = -0.4;
constexpr double kInterest = 1.0;
constexpr double kItem = 0.6;
constexpr double kContext = 0.5;
// Re-engagement: kRepeatShare of the targets are items of the history, and the recency-weighted
// count of the target's occurrences there adds kRepeat (1 - k kRepeatTaskStep) to task k's logit.
constexpr double kRepeatShare = 0.5;
constexpr double kRepeat = 3.0;
constexpr double kRepeatTaskStep = 0.3;
// Timestamps: each history starts in [kEpoch, kEpoch + kEpochSpread) and advances by gaps
// exp(U · ln kMaxGap) - 1 seconds, U uniform: log-uniform from under a second to a month.
constexpr std::int64_t kEpoch = 1600000000;
constexpr double kEpochSpread = 1e8;
constexpr double kMaxGap = 2592000.0;

std::uint64_t split_code(Split split) {
  return split == Split::train ? 1 : 2;
}

// How one table's ids are drawn.
struct Draw {
  std::int64_t rows = 1;
  bool zipf = false;
  synth::Zipf ranks;
  synth::Scatter scatter;

  Draw(const TableSpec& t, std::uint64_t seed, std::uint64_t which) : rows(t.rows) {
    if (t.distribution == IdDistribution::zipf) {
      zipf = true;
      ranks = ZipfSampler(t.rows, t.zipf_alpha).params();
      scatter = synth::Scatter(t.rows, rng::key(seed, kScatterStream, which));
    }
  }
  std::int64_t id(std::uint64_t key, std::uint64_t c) const {
    if (zipf)
      return scatter(ranks.sample(rng::uniform01(key, 2 * c), rng::uniform01(key, 2 * c + 1)));
    return static_cast<std::int64_t>(
        rng::mul_hi64(rng::bits(key, c), static_cast<std::uint64_t>(rows)));
  }
};

}  // namespace

struct SyntheticSequences::Impl {
  std::uint64_t seed = 0;
  bool shuffled = false;
  SequenceSpec seq;
  int tasks = 0;
  std::vector<Draw> features;  // per sequence feature
  std::vector<Draw> contexts;  // per contextual table
  std::vector<int> context_pooling;
  std::vector<std::int64_t> context_prefix;       // ids of the contexts before each, per example
  std::int64_t context_ids = 0;                   // per example
  std::vector<double> task_vectors;               // [tasks, kLatent], each of norm sqrt(kLatent)
  std::vector<std::uint64_t> context_value_keys;  // per contextual table
  std::uint64_t latent_key = 0;
  const data_detail::ZigguratTable* zig = nullptr;

  std::int64_t length(int si, std::uint64_t e) const {
    const double u =
        rng::uniform01(rng::key(seed, kLengthStream, static_cast<std::uint64_t>(si)), e);
    const double lo = seq.min_len, hi = seq.max_len + 1.0;
    double n = lo + u * (hi - lo);
    if (seq.lengths == LengthDistribution::power_law) {
      // A continuous power law p(x) ∝ x^-alpha on [lo, hi), floored.
      const double a = seq.length_alpha;
      if (std::abs(a - 1.0) < 1e-12) {
        n = lo * std::exp(u * std::log(hi / lo));
      } else {
        const double l = std::pow(lo, 1.0 - a), h = std::pow(hi, 1.0 - a);
        n = std::pow(l + u * (h - l), 1.0 / (1.0 - a));
      }
    }
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(n), seq.min_len, seq.max_len);
  }
  double latent(std::int64_t item, int k) const {
    return synth::normal(
        *zig, latent_key,
        static_cast<std::uint64_t>(item) * kLatent + static_cast<std::uint64_t>(k));
  }
};

SyntheticSequences::SyntheticSequences(const ModelSpec& model, std::uint64_t seed,
                                       bool shuffled_history) {
  if (model.kind != ModelKind::hstu || !model.hstu)
    throw InputError(
        fmt::format("{}: synthetic sequences are made for HSTU models (kind: hstu), "
                    "and this model is a {} model",
                    data_detail::model_where(model), model_kind_name(model.kind)));
  auto impl = std::make_shared<Impl>();
  impl->seed = seed;
  impl->shuffled = shuffled_history;
  impl->seq = model.hstu->sequence;
  impl->tasks = static_cast<int>(model.hstu->tasks.size());
  if (impl->seq.features.empty() || impl->seq.max_len < 1 || impl->tasks < 1)
    throw InputError(
        fmt::format("{}: an HSTU model needs sequence features, max_len >= 1 and a "
                    "task",
                    data_detail::model_where(model)));
  for (std::size_t f = 0; f < impl->seq.features.size(); ++f)
    impl->features.emplace_back(impl->seq.features[f], seed, f);
  for (std::size_t c = 0; c < model.tables.size(); ++c) {
    impl->contexts.emplace_back(model.tables[c], seed, 1000 + c);
    impl->context_pooling.push_back(model.tables[c].pooling_size);
    impl->context_prefix.push_back(impl->context_ids);
    impl->context_ids += model.tables[c].pooling_size;
  }
  for (int k = 0; k < impl->tasks; ++k) {
    double norm = 0.0;
    std::vector<double> m(kLatent);
    for (int c = 0; c < kLatent; ++c) {
      m[c] = rng::normal(rng::key(seed, kTaskStream, static_cast<std::uint64_t>(k)),
                         static_cast<std::uint64_t>(c));
      norm += m[c] * m[c];
    }
    const double f = std::sqrt(kLatent / std::max(norm, 1e-12));
    for (double v : m) impl->task_vectors.push_back(v * f);
  }
  for (std::size_t c = 0; c < model.tables.size(); ++c)
    impl->context_value_keys.push_back(rng::key(seed, kContextValueStream, c));
  impl->latent_key = rng::key(seed, kLatentStream);
  impl->zig = &data_detail::ziggurat_table();
  impl_ = std::move(impl);
}

void SyntheticSequences::make(Split split, std::int64_t first, std::int64_t count,
                              Batch& out) const {
  if (first < 0 || count < 0)
    throw Error(
        fmt::format("SyntheticSequences::make: first and count must be >= 0, got first={} count={}",
                    first, count));
  const Impl& m = *impl_;
  const std::uint64_t sc = split_code(split);
  const int si = static_cast<int>(sc) - 1;
  const int nf = static_cast<int>(m.features.size());
  const int nc = static_cast<int>(m.contexts.size());
  const int targets = m.seq.targets, tasks = m.tasks;
  const auto max_len = static_cast<std::uint64_t>(m.seq.max_len);
  const auto tgt = static_cast<std::uint64_t>(targets);

  out.size = count;
  out.num_dense = 0;
  out.dense.clear();
  out.num_tables = nc;
  out.targets = targets;
  out.tasks = tasks;
  out.features = nf;
  out.history_offsets.resize(static_cast<std::size_t>(count) + 1);
  out.history_offsets[0] = 0;
  for (std::int64_t b = 0; b < count; ++b)
    out.history_offsets[b + 1] =
        out.history_offsets[b] + m.length(si, static_cast<std::uint64_t>(first + b));
  const std::int64_t events = out.history_offsets[count];
  out.event_ids.resize(static_cast<std::size_t>(nf * events));
  out.event_times.resize(static_cast<std::size_t>(events));
  out.target_ids.resize(static_cast<std::size_t>(count * targets));
  out.target_times.resize(static_cast<std::size_t>(count * targets));
  const auto scores = static_cast<std::size_t>(count * targets * tasks);
  out.labels.resize(scores);
  out.teacher_prob.resize(scores);
  out.unordered_prob.resize(scores);
  out.ids.resize(static_cast<std::size_t>(count * m.context_ids));
  out.offsets.resize(static_cast<std::size_t>(nc * count) + 1);
  out.offsets[static_cast<std::size_t>(nc * count)] = count * m.context_ids;

  std::vector<std::uint64_t> feature_keys, context_keys;
  for (int f = 0; f < nf; ++f)
    feature_keys.push_back(rng::key(m.seed, kEventStream, sc, static_cast<std::uint64_t>(f)));
  for (int c = 0; c < nc; ++c)
    context_keys.push_back(rng::key(m.seed, kContextStream, sc, static_cast<std::uint64_t>(c)));
  const std::uint64_t target_key = rng::key(m.seed, kTargetStream, sc);
  const std::uint64_t time_key = rng::key(m.seed, kTimeStream, sc);
  const std::uint64_t label_key = rng::key(m.seed, kLabelStream, sc);
  const std::uint64_t shuffle_key = rng::key(m.seed, kShuffleStream, sc);
  const std::uint64_t action_key = rng::key(m.seed, kActionStream);
  const std::uint64_t item_key = rng::key(m.seed, kItemStream);
  const double log_gap = std::log(kMaxGap + 1.0);

#pragma omp parallel if (events >= 4096)
  {
    std::vector<std::int64_t> ids;    // [nf, L] this example's events in their true order
    std::vector<std::int64_t> order;  // [L] the event shown at each position
    std::vector<double> u(kLatent), u_flat(kLatent), z(kLatent);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < count; ++b) {
      const auto e = static_cast<std::uint64_t>(first + b);
      const std::int64_t start = out.history_offsets[b];
      const std::int64_t len = out.history_offsets[b + 1] - start;
      ids.resize(static_cast<std::size_t>(nf * len));
      for (int f = 0; f < nf; ++f)
        for (std::int64_t j = 0; j < len; ++j)
          ids[f * len + j] = m.features[f].id(feature_keys[f], e * max_len + j);

      // Times: a start, then log-uniform gaps through the history and the targets.
      const std::uint64_t c0 = e * (max_len + tgt + 1);
      auto ts = static_cast<std::int64_t>(kEpoch + rng::uniform01(time_key, c0) * kEpochSpread);
      auto gap = [&](std::uint64_t c) {
        return static_cast<std::int64_t>(std::exp(rng::uniform01(time_key, c) * log_gap) - 1.0);
      };
      for (std::int64_t j = 0; j < len; ++j) {
        if (j > 0) ts += gap(c0 + j);
        out.event_times[start + j] = ts;
      }

      // The user's state, recency-weighted and order-blind, each of unit variance per component.
      std::fill(u.begin(), u.end(), 0.0);
      std::fill(u_flat.begin(), u_flat.end(), 0.0);
      double w2 = 0.0, alpha = 1.0;
      for (std::int64_t j = len - 1; j >= 0; --j, alpha *= kRecency) {
        const double act =
            nf > 1 ? synth::normal(*m.zig, action_key, static_cast<std::uint64_t>(ids[len + j]))
                   : 0.0;
        const double weight = 1.0 + kActionWeight * act;
        for (int c = 0; c < kLatent; ++c) {
          const double zc = m.latent(ids[j], c) * weight;
          u[c] += alpha * zc;
          u_flat[c] += zc;
        }
        w2 += alpha * alpha;
      }
      const double act_var = 1.0 + (nf > 1 ? kActionWeight * kActionWeight : 0.0);
      const double su = len > 0 ? 1.0 / std::sqrt(w2 * act_var) : 0.0;
      const double sf = len > 0 ? 1.0 / std::sqrt(static_cast<double>(len) * act_var) : 0.0;

      // Contexts: fixed-size bags, and their pooled values (unit variance over the draw).
      double ctx = 0.0;
      for (int c = 0; c < nc; ++c) {
        const int pool = m.context_pooling[c];
        const std::int64_t at = count * m.context_prefix[c] + b * pool;
        out.offsets[static_cast<std::size_t>(c * count + b)] = at;
        double sum = 0.0;
        for (int j = 0; j < pool; ++j) {
          const std::int64_t row =
              m.contexts[c].id(context_keys[c], e * static_cast<std::uint64_t>(pool) + j);
          out.ids[at + j] = row;
          sum += synth::normal(*m.zig, m.context_value_keys[c], static_cast<std::uint64_t>(row));
        }
        if (pool > 0) ctx += sum / std::sqrt(static_cast<double>(pool));
      }
      if (nc > 0) ctx /= std::sqrt(static_cast<double>(nc));

      // Targets and their labels.
      for (int t = 0; t < targets; ++t) {
        const std::size_t ti = static_cast<std::size_t>(b * targets + t);
        // Half the targets are items of the history (re-engagement candidates), picked
        // uniformly over its events; the others come from the item distribution.
        const bool from_history =
            len > 0 && rng::uniform01(target_key, 3 * (e * tgt + t)) < kRepeatShare;
        const std::int64_t item = from_history
                                      ? ids[static_cast<std::int64_t>(rng::mul_hi64(
                                            rng::bits(target_key, 3 * (e * tgt + t) + 1),
                                            static_cast<std::uint64_t>(len)))]
                                      : m.features[0].id(target_key, 3 * (e * tgt + t) + 2);
        // Re-engagement: the recency-weighted occurrences of the item in the history, and the
        // same weight spread evenly over the events for the order-blind copy.
        double repeat = 0.0, occurrences = 0.0, weight_sum = 0.0, a = 1.0;
        for (std::int64_t j = len - 1; j >= 0; --j, a *= kRecency) {
          weight_sum += a;
          if (ids[j] == item) {
            repeat += a;
            occurrences += 1.0;
          }
        }
        const double repeat_flat =
            len > 0 ? occurrences * weight_sum / static_cast<double>(len) : 0.0;
        out.target_ids[ti] = item;
        ts += gap(c0 + max_len + t);
        out.target_times[ti] = ts;
        for (int c = 0; c < kLatent; ++c) z[c] = m.latent(item, c);
        const double pop = synth::normal(*m.zig, item_key, static_cast<std::uint64_t>(item));
        for (int k = 0; k < tasks; ++k) {
          const double* mk = m.task_vectors.data() + k * kLatent;
          double dot = 0.0, dot_flat = 0.0;
          for (int c = 0; c < kLatent; ++c) {
            dot += u[c] * mk[c] * z[c];
            dot_flat += u_flat[c] * mk[c] * z[c];
          }
          const double rest = kBias + k * kTaskBiasStep + kItem * pop + kContext * ctx;
          const double scale = kInterest / std::sqrt(static_cast<double>(kLatent));
          const double r = kRepeat * (1.0 - kRepeatTaskStep * k);
          const double p = synth::probability(rest + scale * su * dot + r * repeat);
          const double p_flat = synth::probability(rest + scale * sf * dot_flat + r * repeat_flat);
          const std::size_t si_k = ti * static_cast<std::size_t>(tasks) + k;
          out.teacher_prob[si_k] = static_cast<float>(p);
          out.unordered_prob[si_k] = static_cast<float>(p_flat);
          out.labels[si_k] = rng::uniform01(label_key, (e * tgt + t) * tasks + k) < p ? 1.0f : 0.0f;
        }
      }

      // The history as shown: in order, or shuffled (Fisher-Yates) with the times left in place.
      order.resize(static_cast<std::size_t>(len));
      std::iota(order.begin(), order.end(), std::int64_t{0});
      if (m.shuffled)
        for (std::int64_t j = len - 1; j > 0; --j) {
          const auto r = static_cast<std::int64_t>(rng::mul_hi64(
              rng::bits(shuffle_key, e * max_len + j), static_cast<std::uint64_t>(j + 1)));
          std::swap(order[j], order[r]);
        }
      for (int f = 0; f < nf; ++f)
        for (std::int64_t j = 0; j < len; ++j)
          out.event_ids[f * events + start + j] = ids[f * len + order[j]];
    }
  }
}

}  // namespace parity
