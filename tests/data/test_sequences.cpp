// Synthetic HSTU data (SyntheticSequences): pure in (seed, split, example), well formed (lengths,
// ids, times), and its teacher sequential: the order of a history carries signal that an
// order-blind copy of the teacher misses, and a shuffled history keeps its events and labels.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "parity/data.h"
#include "parity/error.h"
#include "parity/spec.h"

namespace parity {
namespace {

ModelSpec hstu_model(const std::string& lengths = "uniform", int min_len = 1) {
  return parse_model_spec(
      fmt::format(R"(
name: seq-test
kind: hstu
batch_size: 64
sequence:
  max_len: 48
  min_len: {}
  targets: 3
  lengths: {}
  features:
    - {{name: item, rows: 5000, dim: 16, distribution: zipf, zipf_alpha: 1.05}}
    - {{name: action, rows: 5, dim: 16}}
context:
  - {{name: segment, rows: 40, dim: 16, pooling_size: 2}}
hstu: {{model_dim: 16, layers: 1, heads: 1, attention_dim: 8, value_dim: 8, position_buckets: 8, time_buckets: 8}}
tasks: [click, like]
optimizer:
  embedding: {{kind: rowwise_adagrad, lr: 0.05}}
  dense: {{kind: adam, lr: 0.001}}
)",
                  min_len, lengths == "uniform" ? "uniform" : "power_law\n  length_alpha: 1.3"),
      "<test>");
}

// Mann-Whitney AUC of scores against 0/1 labels (ties counted half).
double auc(const std::vector<float>& score, const std::vector<float>& label) {
  std::vector<std::size_t> idx(score.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::sort(idx.begin(), idx.end(),
            [&](std::size_t a, std::size_t b) { return score[a] < score[b]; });
  double rank_sum = 0.0, pos = 0.0;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j < idx.size() && score[idx[j]] == score[idx[i]]) ++j;
    const double mid = 0.5 * static_cast<double>(i + j + 1);
    for (std::size_t k = i; k < j; ++k)
      if (label[idx[k]] > 0.5f) {
        rank_sum += mid;
        pos += 1.0;
      }
    i = j;
  }
  const double neg = static_cast<double>(score.size()) - pos;
  return (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg);
}

TEST(SyntheticSequences, WellFormed) {
  const ModelSpec model = hstu_model();
  const SyntheticSequences data(model, 7);
  Batch b;
  data.make(Split::train, 0, 500, b);
  ASSERT_EQ(b.size, 500);
  EXPECT_EQ(b.targets, 3);
  EXPECT_EQ(b.tasks, 2);
  EXPECT_EQ(b.features, 2);
  EXPECT_EQ(b.num_tables, 1);
  EXPECT_EQ(b.num_dense, 0);
  ASSERT_EQ(b.history_offsets.size(), 501u);
  EXPECT_EQ(b.event_ids.size(), static_cast<std::size_t>(2 * b.events()));
  EXPECT_EQ(b.labels.size(), 500u * 3 * 2);
  std::int64_t shortest = 1 << 30, longest = 0;
  for (std::int64_t e = 0; e < 500; ++e) {
    const std::int64_t lo = b.history_offsets[e], hi = b.history_offsets[e + 1];
    shortest = std::min(shortest, hi - lo);
    longest = std::max(longest, hi - lo);
    for (std::int64_t j = lo; j < hi; ++j) {
      EXPECT_GE(b.event_ids[j], 0);
      EXPECT_LT(b.event_ids[j], 5000);
      EXPECT_GE(b.event_ids[b.events() + j], 0);
      EXPECT_LT(b.event_ids[b.events() + j], 5);
      if (j > lo) {
        EXPECT_GE(b.event_times[j], b.event_times[j - 1]);
      }
    }
    for (int t = 0; t < 3; ++t) {
      const std::int64_t at = e * 3 + t;
      EXPECT_GE(b.target_times[at], b.event_times[hi - 1]);
      if (t > 0) {
        EXPECT_GE(b.target_times[at], b.target_times[at - 1]);
      }
      EXPECT_GE(b.target_ids[at], 0);
      EXPECT_LT(b.target_ids[at], 5000);
    }
    EXPECT_EQ(b.offsets[e], 2 * e);  // the context table's bags of 2
  }
  EXPECT_EQ(shortest, 1);
  EXPECT_EQ(longest, 48);
  for (const std::int64_t id : b.ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 40);
  }
}

TEST(SyntheticSequences, PureInSeedSplitAndExample) {
  const ModelSpec model = hstu_model();
  const SyntheticSequences data(model, 11);
  Batch whole, part, other;
  data.make(Split::train, 0, 300, whole);
  omp_set_num_threads(1);
  data.make(Split::train, 100, 50, part);
  omp_set_num_threads(omp_get_num_procs());
  const std::int64_t e0 = whole.history_offsets[100], e1 = whole.history_offsets[150];
  ASSERT_EQ(part.events(), e1 - e0);
  for (std::int64_t j = 0; j < part.events(); ++j) {
    EXPECT_EQ(part.event_ids[j], whole.event_ids[e0 + j]);
    EXPECT_EQ(part.event_ids[part.events() + j], whole.event_ids[whole.events() + e0 + j]);
    EXPECT_EQ(part.event_times[j], whole.event_times[e0 + j]);
  }
  for (std::size_t i = 0; i < part.labels.size(); ++i) {
    EXPECT_EQ(part.labels[i], whole.labels[100 * 6 + i]);
    EXPECT_EQ(part.teacher_prob[i], whole.teacher_prob[100 * 6 + i]);
  }
  for (std::size_t i = 0; i < part.target_ids.size(); ++i)
    EXPECT_EQ(part.target_ids[i], whole.target_ids[300 + i]);
  data.make(Split::eval, 0, 300, other);
  EXPECT_NE(other.target_ids, whole.target_ids);
  SyntheticSequences(model, 12).make(Split::train, 0, 300, other);
  EXPECT_NE(other.target_ids, whole.target_ids);
}

TEST(SyntheticSequences, PowerLawLengthsAreMostlyShort) {
  const SyntheticSequences uniform(hstu_model("uniform", 4), 3);
  const SyntheticSequences heavy(hstu_model("power_law", 4), 3);
  Batch u, h;
  uniform.make(Split::train, 0, 4000, u);
  heavy.make(Split::train, 0, 4000, h);
  auto median = [](const Batch& b) {
    std::vector<std::int64_t> n;
    for (std::int64_t e = 0; e < b.size; ++e)
      n.push_back(b.history_offsets[e + 1] - b.history_offsets[e]);
    std::sort(n.begin(), n.end());
    EXPECT_GE(n.front(), 4);
    EXPECT_LE(n.back(), 48);
    return n[n.size() / 2];
  };
  EXPECT_NEAR(static_cast<double>(median(u)), 26.0, 3.0);
  EXPECT_LT(median(h), 14);
}

// The teacher's AUC is the ceiling; the same teacher blind to order stays clearly below it.
TEST(SyntheticSequences, OrderCarriesSignal) {
  const SyntheticSequences data(hstu_model(), 5);
  Batch b;
  data.make(Split::train, 0, 20000, b);
  std::vector<float> labels, teacher, blind;
  for (std::size_t i = 0; i < b.labels.size(); i += 2) {  // task 0
    labels.push_back(b.labels[i]);
    teacher.push_back(b.teacher_prob[i]);
    blind.push_back(b.unordered_prob[i]);
  }
  const double ceiling = auc(teacher, labels), order_blind = auc(blind, labels);
  EXPECT_GT(ceiling, 0.78) << "teacher AUC";
  EXPECT_GT(ceiling - order_blind, 0.06)
      << "teacher " << ceiling << ", order-blind " << order_blind;
  double mean = 0.0;
  for (const float y : labels) mean += y;
  mean /= static_cast<double>(labels.size());
  EXPECT_GT(mean, 0.2);
  EXPECT_LT(mean, 0.5);
}

TEST(SyntheticSequences, ShuffledHistoriesKeepEventsTimesAndLabels) {
  const ModelSpec model = hstu_model();
  Batch in_order, shuffled;
  SyntheticSequences(model, 9).make(Split::train, 0, 200, in_order);
  SyntheticSequences(model, 9, true).make(Split::train, 0, 200, shuffled);
  EXPECT_EQ(in_order.history_offsets, shuffled.history_offsets);
  EXPECT_EQ(in_order.event_times, shuffled.event_times);
  EXPECT_EQ(in_order.labels, shuffled.labels);
  EXPECT_EQ(in_order.target_ids, shuffled.target_ids);
  EXPECT_NE(in_order.event_ids, shuffled.event_ids);
  const std::int64_t events = in_order.events();
  for (std::int64_t e = 0; e < 200; ++e) {
    const std::int64_t lo = in_order.history_offsets[e], hi = in_order.history_offsets[e + 1];
    std::vector<std::pair<std::int64_t, std::int64_t>> a, s;  // (item, action) per event
    for (std::int64_t j = lo; j < hi; ++j) {
      a.emplace_back(in_order.event_ids[j], in_order.event_ids[events + j]);
      s.emplace_back(shuffled.event_ids[j], shuffled.event_ids[events + j]);
    }
    std::sort(a.begin(), a.end());
    std::sort(s.begin(), s.end());
    EXPECT_EQ(a, s) << "example " << e;
  }
}

TEST(SyntheticSequences, RefusesDlrmModels) {
  try {
    SyntheticSequences(load_model_spec(PARITY_SOURCE_DIR "/configs/models/tiny.yaml"), 1);
    ADD_FAILURE() << "a DLRM model was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("kind: hstu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parity
