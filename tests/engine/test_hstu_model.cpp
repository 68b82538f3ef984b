// The HSTU engine (HstuModel) on the cpu backend: its backward as a whole against finite
// differences of its loss, determinism, bad batches refused by name, and learning: hstu-tiny on
// the planted sequential teacher beats what the same model learns from shuffled histories.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "adagrad_step.h"
#include "backend/cpu/cpu_backend.h"
#include "backends.h"
#include "parity/data.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/metrics.h"
#include "parity/spec.h"

namespace parity {
namespace {

ModelSpec tiny() {
  return load_model_spec(PARITY_SOURCE_DIR "/configs/models/hstu-tiny.yaml");
}

// A small HSTU with both combines covered by the caller, every op on its path.
ModelSpec small(const std::string& combine, const std::string& optimizers) {
  const bool concat = combine == "concat";
  return parse_model_spec(fmt::format(R"(
name: hstu-small
kind: hstu
batch_size: 8
sequence:
  max_len: 6
  targets: 2
  combine: {}
  features:
    - {{name: item, rows: 30, dim: {}}}
    - {{name: action, rows: 3, dim: {}}}
context:
  - {{name: segment, rows: 5, dim: 8, pooling_size: 2}}
hstu: {{model_dim: 8, layers: 2, heads: 2, attention_dim: 3, value_dim: 2, position_buckets: 4, time_buckets: 6}}
tasks: [click, like]
optimizer:
{}
)",
                                      combine, concat ? 5 : 8, concat ? 3 : 8, optimizers),
                          "<test>");
}

double log_loss(const std::vector<float>& probs, const std::vector<float>& labels) {
  double s = 0.0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const double p = probs[i];
    s -= labels[i] > 0.5f ? std::log(p) : std::log1p(-p);
  }
  return s / static_cast<double>(probs.size());
}

// With sgd at lr 1 a step moves every parameter by minus its gradient; those moves must match
// central differences of the loss that predict() gives (float: the step is 1e-3), for the dense
// parameters and the rows of the tables that occur.
void check_model_gradient(const std::string& combine) {
  const ModelSpec spec =
      small(combine, "  embedding: {kind: sgd, lr: 1.0}\n  dense: {kind: sgd, lr: 1.0}");
  Batch b;
  SyntheticSequences(spec, 3).make(Split::train, 0, 8, b);
  CpuBackend be;
  HstuModel trained(spec, be, 8, 21);
  HstuModel probe(spec, be, 8, 21);
  std::vector<std::vector<float>> before;
  for (const TensorRef& t : trained.tensors()) {
    const auto* p = static_cast<const float*>(t.data);
    before.emplace_back(p, p + t.elements());
  }
  trained.train_step(b);
  const std::vector<TensorRef> after = trained.tensors(), params = probe.tensors();
  std::vector<float> probs(b.labels.size());
  auto loss = [&] {
    probe.predict(b, probs.data());
    return log_loss(probs, b.labels);
  };
  int checked = 0, bad = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    auto* p = static_cast<float*>(params[t].data);
    const auto* q = static_cast<const float*>(after[t].data);
    const std::int64_t n = params[t].elements();
    for (std::int64_t i = 0; i < n; i += std::max<std::int64_t>(1, n / 7)) {
      const double g = static_cast<double>(before[t][i]) - q[i];
      const float saved = p[i];
      auto central = [&](float h) {
        p[i] = saved + h;
        const double plus = loss();
        p[i] = saved - h;
        const double minus = loss();
        p[i] = saved;
        return (plus - minus) / (2.0 * static_cast<double>(h));
      };
      // Richardson: the h^2 terms of two central differences cancel (the rab terms that most
      // pairs share curve the loss strongly).
      const double numeric = (4.0 * central(1e-3f) - central(2e-3f)) / 3.0;
      ++checked;
      if (std::abs(numeric - g) > 0.03 * std::abs(g) + 2e-4 && ++bad <= 8)
        ADD_FAILURE() << combine << " " << params[t].name << "[" << i << "]: step " << g
                      << ", numeric " << numeric;
    }
  }
  EXPECT_GT(checked, 60);
}

TEST(HstuModel, GradientMatchesFiniteDifferencesSum) {
  check_model_gradient("sum");
}
TEST(HstuModel, GradientMatchesFiniteDifferencesConcat) {
  check_model_gradient("concat");
}

TEST(HstuModel, SameSeedSameLosses) {
  const ModelSpec spec = tiny();
  const SyntheticSequences data(spec, 4);
  std::vector<float> runs[2];
  for (auto& losses : runs) {
    CpuBackend be;
    HstuModel model(spec, be, 64, 9);
    Batch b;
    for (int s = 0; s < 5; ++s) {
      data.batch(Split::train, s, 64, b);
      model.train_step(b);
      losses.push_back(model.last_loss());
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_TRUE(std::isfinite(runs[0].back()));
}

// The recipe's warm-up after a larger batch: step 0 trains as the model with its learning rates
// times lr_factor(0), bit for bit.
TEST(HstuModel, WarmUpStepTrainsAtItsShareOfTheRates) {
  ModelSpec warm = tiny();
  warm.lr_batch_scale = 2.0;
  warm.lr_warmup_steps = 10;
  ModelSpec plain = warm;
  plain.lr_batch_scale = 1.0;
  plain.embedding_optimizer.lr *= warm.lr_factor(0);
  plain.dense_optimizer.lr *= warm.lr_factor(0);
  ModelSpec full = warm;
  full.lr_warmup_steps = 0;
  const SyntheticSequences data(warm, 4);
  Batch b;
  data.batch(Split::train, 0, 64, b);
  std::vector<std::vector<unsigned char>> after[3];
  int i = 0;
  for (const ModelSpec* spec : {&warm, &plain, &full}) {
    CpuBackend be;
    HstuModel model(*spec, be, 64, 9);
    model.train_step(b);
    for (const TensorRef& t : model.tensors()) {
      const auto* p = static_cast<const unsigned char*>(t.data);
      after[i].emplace_back(p, p + t.bytes());
    }
    ++i;
  }
  EXPECT_EQ(after[0], after[1]);
  EXPECT_NE(after[0], after[2]);
}

// Recompute forms the activations it does not keep again with the forward's own ops, and a
// token capacity below a batch's tokens grows: neither changes a bit of the losses or the
// parameters, and recompute keeps fewer activation bytes.
TEST(HstuModel, RecomputeAndTokenCapacityChangeNoBits) {
  const ModelSpec spec = small("sum",
                               "  embedding: {kind: rowwise_adagrad, lr: 0.05}\n"
                               "  dense: {kind: adam, lr: 0.01}");
  const SyntheticSequences data(spec, 5);
  struct Run {
    std::vector<float> losses, params;
    std::size_t activations = 0;
    std::int64_t capacity = 0;
    int growths = 0;
  };
  auto run = [&](HstuModel::Options o) {
    CpuBackend be;
    HstuModel model(spec, be, 8, 17, o);
    Run r;
    Batch b;
    for (int s = 0; s < 4; ++s) {
      data.batch(Split::train, s, 8, b);
      model.train_step(b);
      r.losses.push_back(model.last_loss());
    }
    for (const TensorRef& t : model.tensors()) {
      if (t.dtype != DType::f32) continue;
      const auto* p = static_cast<const float*>(t.data);
      r.params.insert(r.params.end(), p, p + t.elements());
    }
    r.activations = model.allocated_bytes_by_category().at("activations");
    r.capacity = model.token_capacity();
    r.growths = model.token_capacity_growths();
    return r;
  };
  const Run plain = run({});
  HstuModel::Options rc;
  rc.recompute = true;
  const Run recomputed = run(rc);
  HstuModel::Options small_capacity;
  small_capacity.token_capacity = 5;
  const Run grown = run(small_capacity);
  EXPECT_EQ(recomputed.losses, plain.losses);
  EXPECT_EQ(recomputed.params, plain.params);
  EXPECT_LT(recomputed.activations, plain.activations);
  EXPECT_EQ(grown.losses, plain.losses);
  EXPECT_EQ(grown.params, plain.params);
  EXPECT_GE(grown.growths, 1);
  EXPECT_GT(grown.capacity, 5);
  EXPECT_LT(grown.capacity, plain.capacity);
  EXPECT_EQ(plain.growths, 0);
  HstuModel::Options bad;
  bad.token_capacity = -1;
  CpuBackend be;
  EXPECT_THROW(HstuModel(spec, be, 8, 17, bad), InputError);
}

TEST(HstuModel, BadBatchesAreRefusedByName) {
  const ModelSpec spec = small("sum",
                               "  embedding: {kind: rowwise_adagrad, lr: 0.05}\n  dense: "
                               "{kind: adam, lr: 0.001}");
  CpuBackend be;
  HstuModel model(spec, be, 8, 1);
  Batch good;
  SyntheticSequences(spec, 3).make(Split::train, 0, 8, good);
  auto message = [&](const Batch& b, HstuModel& m) {
    try {
      m.train_step(b);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  // A history of 7 events for a max_len of 6: refused, or its last 6 kept.
  Batch longer = good;
  const std::int64_t events = good.events();
  std::vector<std::int64_t> ids;
  for (int f = 0; f < 2; ++f) {
    ids.insert(ids.end(), good.event_ids.begin() + f * events,
               good.event_ids.begin() + f * events + good.history_offsets[1]);
    for (std::int64_t k = good.history_offsets[1]; k < 7; ++k) ids.push_back(1);
    ids.insert(ids.end(), good.event_ids.begin() + f * events + good.history_offsets[1],
               good.event_ids.begin() + (f + 1) * events);
  }
  const std::int64_t extra = 7 - good.history_offsets[1];
  longer.event_ids = ids;
  longer.event_times.insert(longer.event_times.begin() + good.history_offsets[1], extra,
                            good.event_times[good.history_offsets[1] - 1]);
  for (std::size_t e = 1; e < longer.history_offsets.size(); ++e)
    longer.history_offsets[e] += extra;
  EXPECT_NE(message(longer, model)
                .find("batch example 0: a history of 7 events, longer than the "
                      "model's max_len 6"),
            std::string::npos)
      << message(longer, model);
  HstuModel truncating(spec, be, 8, 1, HstuModel::Options{true});
  EXPECT_EQ(message(longer, truncating), "(accepted)");

  Batch bad = good;
  bad.event_ids[0] = 30;
  EXPECT_NE(message(bad, model).find("feature 'item' of event 0 is id 30, outside [0, 30)"),
            std::string::npos)
      << message(bad, model);
  bad = good;
  bad.target_ids[3] = -1;
  EXPECT_NE(message(bad, model).find("batch example 1: target 1 is item -1"), std::string::npos)
      << message(bad, model);
  bad = good;
  std::int64_t e = 0;
  while (e < 8 && good.history_offsets[e + 1] - good.history_offsets[e] < 2) ++e;
  ASSERT_LT(e, 8) << "no example with two events";
  const std::int64_t lo = good.history_offsets[e];
  bad.event_times[lo + 1] = bad.event_times[lo] - 5;
  EXPECT_NE(message(bad, model).find(fmt::format("batch example {}: event 1 has timestamp", e)),
            std::string::npos)
      << message(bad, model);
  bad = good;  // a contextual bag longer than its table's pooling size
  bad.ids.push_back(0);
  for (std::size_t i = 1; i < bad.offsets.size(); ++i) ++bad.offsets[i];
  EXPECT_NE(message(bad, model).find("at most 16 ids (the tables' pooling sizes)"),
            std::string::npos)
      << message(bad, model);
  EXPECT_THROW(HstuModel(load_model_spec(PARITY_SOURCE_DIR "/configs/models/tiny.yaml"), be, 8, 1),
               InputError);
}

// Mean over tasks of the held-out AUC after `steps` steps of batch 64.
double learned_auc(bool shuffled, int steps) {
  const ModelSpec spec = tiny();
  const SyntheticSequences data(spec, 17, shuffled);
  CpuBackend be;
  HstuModel model(spec, be, 256, 5);
  Batch b;
  for (int s = 0; s < steps; ++s) {
    data.batch(Split::train, s, 64, b);
    model.train_step(b);
  }
  std::vector<float> probs, labels, p;
  for (int k = 0; k < 8; ++k) {
    data.batch(Split::eval, k, 256, b);
    p.resize(b.labels.size());
    model.predict(b, p.data());
    probs.insert(probs.end(), p.begin(), p.end());
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  double sum = 0.0;
  const int tasks = b.tasks;
  for (int t = 0; t < tasks; ++t) {
    std::vector<float> ps, ls;
    for (std::size_t i = t; i < probs.size(); i += tasks) {
      ps.push_back(probs[i]);
      ls.push_back(labels[i]);
    }
    sum += roc_auc(ps, ls);
  }
  return sum / tasks;
}

// hstu-tiny learns the planted sequential teacher on two cores in about a minute, and learns it
// only from the order of the histories: trained on the same data with each history shuffled (the
// labels unchanged), it stays clearly lower. Measured (2026-12-02): 0.702 in order, 0.676
// shuffled after 1,200 steps of 64; the teacher's own AUC is 0.80 and its order-blind copy's 0.70.
TEST(HstuModel, LearnsTheOrderOfHistories) {
  const double ordered = learned_auc(false, 1200);
  const double shuffled = learned_auc(true, 1200);
  RecordProperty("auc", std::to_string(ordered));
  RecordProperty("auc_shuffled", std::to_string(shuffled));
  EXPECT_GT(ordered, 0.68);
  EXPECT_GT(ordered - shuffled, 0.01) << "in order " << ordered << ", shuffled " << shuffled;
}

// The step on every backend this build has is the cpu's, within the per-op tolerance compounded
// over a few steps.
class HstuOnEveryBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(HstuOnEveryBackend, StepsMatchTheCpu) {
  PARITY_REQUIRE_BACKEND(GetParam());
  if (GetParam() == "cpu") GTEST_SKIP() << "the cpu is the reference the others are compared with";
  const ModelSpec spec = tiny();
  const SyntheticSequences data(spec, 4);
  std::vector<float> losses[2];
  std::vector<float> probs[2];
  const std::string names[2] = {"cpu", GetParam()};
  for (int k = 0; k < 2; ++k) {
    const std::unique_ptr<Backend> be = make_backend(names[k]);
    HstuModel model(spec, *be, 64, 9);
    Batch b;
    for (int s = 0; s < 4; ++s) {
      data.batch(Split::train, s, 64, b);
      model.train_step(b);
      losses[k].push_back(model.last_loss());
    }
    data.batch(Split::eval, 0, 64, b);
    probs[k].resize(b.labels.size());
    model.predict(b, probs[k].data());
  }
  for (std::size_t s = 0; s < losses[0].size(); ++s)
    EXPECT_NEAR(losses[1][s], losses[0][s], 1e-4 * std::abs(losses[0][s])) << "step " << s + 1;
  for (std::size_t i = 0; i < probs[0].size(); ++i)
    EXPECT_NEAR(probs[1][i], probs[0][i], 1e-3) << "prediction " << i;
}

// Recompute on every backend, under every dense math it runs: the same losses, bit for bit.
TEST_P(HstuOnEveryBackend, RecomputeChangesNoBits) {
  PARITY_REQUIRE_BACKEND(GetParam());
  const ModelSpec spec = tiny();
  const SyntheticSequences data(spec, 4);
  const bool gpu = GetParam() != "cpu";
  for (const DenseMath math : {DenseMath::fp32, DenseMath::bf16}) {
    if (!gpu && math != DenseMath::fp32) continue;
    std::vector<float> losses[2];
    for (int k = 0; k < 2; ++k) {
      const std::unique_ptr<Backend> be = make_backend(GetParam(), math);
      HstuModel::Options o;
      o.recompute = k == 1;
      HstuModel model(spec, *be, 64, 9, o);
      Batch b;
      for (int s = 0; s < 3; ++s) {
        data.batch(Split::train, s, 64, b);
        model.train_step(b);
        losses[k].push_back(model.last_loss());
      }
    }
    EXPECT_EQ(losses[1], losses[0]) << dense_math_name(math);
  }
}

// Adagrad's initial accumulator in the HSTU engine, dense layers (adagrad) and tables (rowwise):
// every state starts at its value, and the first step is the one adagrad_step.h derives from the
// same model without one.
TEST_P(HstuOnEveryBackend, AdagradStartsFromTheInitialAccumulator) {
  PARITY_REQUIRE_BACKEND(GetParam());
  ModelSpec zero = tiny();
  zero.dense_optimizer.kind = OptimizerKind::adagrad;
  zero.dense_optimizer.lr = 0.05;
  ASSERT_EQ(zero.embedding_optimizer.kind, OptimizerKind::rowwise_adagrad);
  ModelSpec held = zero;
  held.dense_optimizer.initial_accumulator = 0.25;
  held.embedding_optimizer.initial_accumulator = 0.125;
  const std::unique_ptr<Backend> be = make_backend(GetParam());
  HstuModel z(zero, *be, 64, 9), a(held, *be, 64, 9);
  auto floats = [&](HstuModel& m, const std::string& name) {
    return testing::tensor_floats(*be, m, name);
  };
  auto dense = [&](HstuModel& m) { return testing::dense_floats(*be, m); };
  const std::string dense_state = "optimizer.dense.state";
  for (const float s : floats(a, dense_state)) ASSERT_EQ(s, 0.25f);
  for (const char* t : {"item", "action", "user_segment"})
    for (const float s : floats(a, fmt::format("optimizer.embedding.{}.state", t)))
      ASSERT_EQ(s, 0.125f) << t;
  const std::vector<float> w0 = dense(a), e0 = floats(a, "embedding.item.weight");
  ASSERT_EQ(w0, dense(z));

  Batch b;
  SyntheticSequences(zero, 4).batch(Split::train, 0, 64, b);
  z.train_step(b);
  a.train_step(b);
  testing::expect_first_adagrad_step(w0, dense(z), dense(a), floats(z, dense_state),
                                     floats(a, dense_state), 0.25, zero.dense_optimizer.eps, 1,
                                     "dense");
  testing::expect_first_adagrad_step(
      e0, floats(z, "embedding.item.weight"), floats(a, "embedding.item.weight"),
      floats(z, "optimizer.embedding.item.state"), floats(a, "optimizer.embedding.item.state"),
      0.125, zero.embedding_optimizer.eps, 32, "table item");
}

INSTANTIATE_TEST_SUITE_P(Backends, HstuOnEveryBackend,
                         ::testing::ValuesIn(testing::engine_backends()),
                         testing::backend_param_name);

}  // namespace
}  // namespace parity
