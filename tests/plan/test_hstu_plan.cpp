// The planner on HSTU models: the batch is the largest whose memory fits, a device with more HBM
// never gets a smaller one, recompute is chosen only for the larger batch it allows, the attention
// model follows its tiles, and the plan file carries the HSTU decisions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "parity/error.h"
#include "parity/perf.h"
#include "parity/plan.h"
#include "plan_test_util.h"

using namespace parity::plan_test;  // NOLINT: the shipped configs, in every test below

namespace parity {
namespace {

// An HSTU model whose tables are small, so that activations bind the batch.
ModelSpec long_histories(int max_len, std::int64_t max_batch) {
  return parse_model_spec(fmt::format(R"(
name: hstu-long
kind: hstu
batch_size: 64
sequence:
  max_len: {}
  targets: 4
  lengths: uniform
  features:
    - {{name: item, rows: 1000000, dim: 512}}
    - {{name: action, rows: 8, dim: 512}}
hstu: {{model_dim: 512, layers: 4, heads: 4, attention_dim: 128, value_dim: 128, position_buckets: 128, time_buckets: 64}}
tasks: [click]
optimizer:
  embedding: {{kind: rowwise_adagrad, lr: 0.02}}
  dense: {{kind: adam, lr: 0.001}}
recipe:
  dense_math: [fp32, bf16]
  max_global_batch: {}
)",
                                      max_len, max_batch),
                          "<test>");
}

Plan at_batch(Plan p, const ModelSpec& m, const DeviceSpec& dev, std::int64_t b) {
  p.per_device_batch = p.global_batch = b;
  p.token_capacity =
      static_cast<std::int64_t>(token_capacity(sequence_moments(m), static_cast<double>(b)));
  p.prediction = evaluate_plan(p, m, dev, calibration_for(dev, kConfigs));
  return p;
}

TEST(HstuPlanner, FeedModelOnOneH200FitsTheLargestBatch) {
  const ModelSpec m = model("hstu-feed-1k");
  const DeviceSpec dev = device("h200");
  const Plan p = make_plan(m, dev, 1, options());
  EXPECT_EQ(p.dense_math, DenseMath::bf16);
  EXPECT_LE(p.prediction.peak_memory_bytes, dev.hbm_bytes.value);
  EXPECT_GT(p.token_capacity, 0);
  const SequenceMoments sm = sequence_moments(m);
  EXPECT_GT(static_cast<double>(p.token_capacity), p.global_batch * sm.tokens);
  EXPECT_LT(static_cast<double>(p.token_capacity), p.global_batch * sm.tokens_max);
  // The largest that fits: the recipe's limit, or one more example does not fit.
  if (p.global_batch < m.max_global_batch) {
    const Plan more = at_batch(p, m, dev, p.global_batch + 1);
    EXPECT_GT(more.prediction.peak_memory_bytes, dev.hbm_bytes.value);
  }
  for (const char* category : {"attention", "projections", "norms", "embedding_forward",
                               "embedding_backward", "head", "input", "dense_optimizer"})
    EXPECT_GT(p.prediction.time_s.count(category), 0u) << category;
  EXPECT_GT(p.prediction.step_s, p.prediction.floor_s);
}

// Capacity sets the batch: where the activations bind, more HBM gives a batch at least as large
// and a prediction at least as fast; a bigger limit is reached only where it fits.
TEST(HstuPlanner, MoreMemoryNeverPlansASmallerBatch) {
  const ModelSpec m = long_histories(4096, 1 << 20);
  const Plan small = make_plan(m, device("h100"), 1, options());
  const Plan large = make_plan(m, device("h200"), 1, options());
  EXPECT_LT(small.global_batch, 1 << 20);
  EXPECT_GE(large.global_batch, small.global_batch);
  EXPECT_LE(small.prediction.peak_memory_bytes, device("h100").hbm_bytes.value);
  EXPECT_LE(large.prediction.peak_memory_bytes, device("h200").hbm_bytes.value);
}

// Recompute keeps fewer activation bytes and costs the recomputed ops' time; where the planner
// turns it on, the plan without it does not fit, and the change names it.
TEST(HstuPlanner, RecomputeTradesActivationsForTime) {
  const ModelSpec m = long_histories(8192, 1 << 20);
  const DeviceSpec dev = device("h200");
  const Plan p = make_plan(m, dev, 1, options());
  Plan off = p;
  off.recompute = false;
  Plan on = p;
  on.recompute = true;
  const Calibration cal = calibration_for(dev, kConfigs);
  const Prediction poff = evaluate_plan(off, m, dev, cal), pon = evaluate_plan(on, m, dev, cal);
  EXPECT_LT(pon.memory_bytes.at("activations"), poff.memory_bytes.at("activations"));
  EXPECT_GT(pon.step_s, poff.step_s);  // the recomputed ops cost time
  EXPECT_GT(pon.time_s.at("recompute"), 0);
  const auto change = std::find_if(p.changes.begin(), p.changes.end(), [](const RecipeChange& c) {
    return c.what == "activation recompute";
  });
  EXPECT_EQ(change != p.changes.end(), p.recompute);
  if (p.recompute) {
    EXPECT_GT(poff.peak_memory_bytes, dev.hbm_bytes.value);
  }
}

// The attention's predicted time follows its tiles: full-length sequences of twice the length at
// the same token count take about twice as long (pairs double), jagged ones less than full ones.
TEST(HstuPlanner, AttentionCostFollowsTheTiles) {
  const DeviceSpec dev = device("h200");
  const Calibration cal = calibration_for(dev, kConfigs);
  auto cost = [&](int n, bool uniform) {
    ModelSpec m = long_histories(n, 1024);
    m.hstu->sequence.min_len = uniform ? 1 : n;
    const double examples = 65536.0 / sequence_moments(m).tokens;
    return hstu_attention_cost(m, examples, DenseMath::bf16, dev, cal);
  };
  const HstuAttentionCost a = cost(2048, false), b = cost(4096, false), j = cost(4096, true);
  EXPECT_TRUE(a.tensor_cores);
  EXPECT_NEAR(b.forward_flops / a.forward_flops, 2.0, 0.05);
  EXPECT_GT(b.forward_s / a.forward_s, 1.5);
  EXPECT_LT(b.forward_s / a.forward_s, 2.2);
  EXPECT_LT(j.forward_s, b.forward_s);
  EXPECT_GT(b.backward_s, b.forward_s);
  // fp32 takes the scalar kernels, and the AMD devices too until they have MFMA forms.
  ModelSpec m = long_histories(1024, 1024);
  EXPECT_FALSE(hstu_attention_cost(m, 64, DenseMath::fp32, dev, cal).tensor_cores);
  EXPECT_FALSE(hstu_attention_cost(m, 64, DenseMath::bf16, device("mi350x"), cal).tensor_cores);
  EXPECT_NE(hstu_attention_scalar_reason(m, DenseMath::bf16, device("mi350x")), "");
}

TEST(HstuPlanner, TheBatchCapacityHoldsNearlyEveryBatch) {
  const ModelSpec m = model("hstu-feed-1k");
  const SequenceMoments sm = sequence_moments(m);
  EXPECT_GT(sm.tokens_sq, sm.tokens * sm.tokens);  // lengths vary
  EXPECT_DOUBLE_EQ(token_capacity(sm, 1), sm.tokens_max);
  const double c = token_capacity(sm, 4096);
  EXPECT_GT(c, 4096 * sm.tokens);
  EXPECT_LT(c, 1.2 * 4096 * sm.tokens);
}

TEST(HstuPlanner, PlanFileCarriesTokensAndRecompute) {
  const ModelSpec m = model("hstu-feed-1k");
  Plan p = make_plan(m, device("h200"), 1, options());
  p.recompute = true;
  const Plan q = plan_from_json(plan_to_json(p), "<test>");
  EXPECT_EQ(q.token_capacity, p.token_capacity);
  EXPECT_TRUE(q.recompute);
  EXPECT_EQ(q.tables.size(), p.tables.size());
  std::string text = plan_to_json(p);
  text.replace(text.find("\"recompute\": true"), 17, "\"recompute\": 1");
  try {
    (void)plan_from_json(text, "plan.json");
    ADD_FAILURE() << "a recompute of 1 was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("field 'recompute': expected true or false"),
              std::string::npos)
        << e.what();
  }
}

TEST(HstuPlanner, WhatCannotRunIsRefusedByName) {
  const ModelSpec m = model("hstu-feed-1k");
  const Plan p = make_plan(m, device("h200"), 1, options());
  ExecutionTarget target;
  target.device = "h200";
  const auto decisions = check_plan(p, m, target);
  EXPECT_TRUE(std::any_of(decisions.begin(), decisions.end(),
                          [](const PlanDecision& d) { return d.what == "tokens"; }));
  const ModelSpec applied = apply_plan(m, p);
  EXPECT_EQ(applied.hstu->sequence.features[0].dtype, p.tables[0].dtype);
  EXPECT_EQ(applied.batch_size, p.global_batch);
  auto refused = [&](Plan bad, const std::string& what) {
    try {
      (void)check_plan(bad, m, target);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Plan host = p;
  host.tables[0].placement = Placement::host;
  refused(host, "HSTU tables live in HBM");
  Plan renamed = p;
  renamed.tables[1].name = "actions";
  refused(renamed, "is not the model's table 1 ('action')");
  Plan fp16 = p;
  fp16.dense_math = DenseMath::fp16;
  refused(fp16, "HSTU models train in fp32, tf32 or bf16");
  refused(make_plan(m, device("h200"), 2, options()), "the plan is for 2 GPUs and this run has 1");
  // Tables that no single device holds: refused with the bytes they need and the GPUs that would
  // hold them.
  try {
    (void)make_plan(model("hstu-large-8k"), device("h200"), 1, options());
    ADD_FAILURE() << "hstu-large-8k planned on one H200";
  } catch (const InfeasibleError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit on 1 x"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(--gpus 17)"), std::string::npos) << e.what();
  }
}

// On several GPUs the tables are split by rows (or replicated where that is cheaper than
// exchanging their rows), the dense layers data-parallel: a model that no one GPU holds fits on
// as many as its message said, each device holding its share of the rows, and the exchange and
// the all-reduce are in the step.
TEST(HstuPlanner, SeveralGpusShareTheTables) {
  const ModelSpec m = model("hstu-large-8k");
  const DeviceSpec h200 = device("h200");
  const Plan p = make_plan(m, h200, 17, options());
  EXPECT_EQ(p.gpus, 17);
  EXPECT_EQ(p.global_batch, p.per_device_batch * 17);
  EXPECT_TRUE(fits(p.prediction, h200));
  EXPECT_GT(p.prediction.time_s.at("embedding_exchange"), 0);
  EXPECT_TRUE(p.prediction.time_s.count("dense_allreduce_exposed"));
  EXPECT_EQ(p.prediction.device_memory_bytes.size(), 17u);
  double weights = 0;  // of every table, on the fullest device
  int row_split = 0;
  for (std::size_t t = 0; t < p.tables.size(); ++t) {
    const TablePlan& tp = p.tables[t];
    const std::size_t F = m.hstu->sequence.features.size();  // features first, then contexts
    const TableSpec& ts = t < F ? m.hstu->sequence.features[t] : m.tables[t - F];
    if (tp.sharding == Sharding::row) {
      ++row_split;
      ASSERT_EQ(tp.shards.size(), 17u) << tp.name;
      weights += std::ceil(static_cast<double>(ts.rows) / 17) * ts.dim * 2;
    } else {
      ASSERT_EQ(tp.sharding, Sharding::replicated) << tp.name;
      weights += static_cast<double>(ts.rows) * ts.dim * 2;
    }
  }
  EXPECT_GE(row_split, 1);
  EXPECT_NEAR(p.prediction.memory_bytes.at("embedding_weights"), weights, 0.001 * weights);
  // The plan file round trip gives the same prediction, and a layout the model check refuses is
  // refused by name.
  const Plan back = plan_from_json(plan_to_json(p), "test");
  EXPECT_DOUBLE_EQ(evaluate_plan(back, m, h200, calibration_for(h200, kConfigs)).step_s,
                   p.prediction.step_s);
  Plan gap = p;
  for (TablePlan& tp : gap.tables)
    if (tp.sharding == Sharding::row) {
      tp.shards[1].row_begin += 1;
      break;
    }
  try {
    (void)evaluate_plan(gap, m, h200, calibration_for(h200, kConfigs));
    ADD_FAILURE() << "a gap between row shards was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cover rows [0,"), std::string::npos) << e.what();
  }
  // Sharding costs a GPU some of its rate: the feed model on 8 GPUs runs fewer examples/s per GPU
  // than the same per-GPU batch on one, and more in all.
  const ModelSpec feed = model("hstu-feed-1k");
  const Plan eight = make_plan(feed, h200, 8, options());
  Plan one = make_plan(feed, h200, 1, options());
  one.per_device_batch = one.global_batch = eight.per_device_batch;
  one.token_capacity = eight.token_capacity;
  const Prediction alone = evaluate_plan(one, feed, h200, calibration_for(h200, kConfigs));
  EXPECT_LT(eight.prediction.examples_per_s_per_gpu, alone.examples_per_s_per_gpu);
  EXPECT_GT(eight.prediction.examples_per_s, alone.examples_per_s);
}

}  // namespace
}  // namespace parity
