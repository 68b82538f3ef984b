// End-to-end training on the CPU: learning, exact resume, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "parity/checkpoint.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/train.h"
#include "train_test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::temp_dir;
using test::tensor_bytes;

using test::tiny;

// The learning test: the tiny model on planted-teacher data. The teacher's own AUC on the
// held-out split is the ceiling (about 0.8); a model that learns nothing scores 0.5.
TEST(Train, TinyModelLearnsThePlantedTeacher) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.steps = 800;
  cfg.batch = 512;
  cfg.seed = 1;
  cfg.eval_examples = 16384;
  cfg.eval_every = 100;
  struct Aucs : TrainObserver {
    std::vector<double> v;
    void on_event(const TrainEvent& e) override {
      if (e.kind == TrainEvent::Kind::eval) v.push_back(e.auc);
    }
  } aucs;
  const TrainResult r = train(cfg, &aucs);
  EXPECT_EQ(r.steps, 800);
  ASSERT_EQ(aucs.v.size(), 8u);
  EXPECT_LT(aucs.v.front() + 0.03, aucs.v.back()) << "AUC did not rise";
  // Measured 0.80 against a ceiling of 0.84 (seed 1); an untrained model gives about 0.5.
  EXPECT_GE(r.auc, 0.78) << "teacher ceiling " << r.teacher_auc;
  EXPECT_GE(r.auc, r.teacher_auc - 0.06) << "teacher ceiling " << r.teacher_auc;
  EXPECT_LE(r.auc, r.teacher_auc + 0.01);
  EXPECT_GT(r.examples_per_s, 0);
}

// A larger batch with the recipe's learning-rate rule: the tiny model with Adagrad dense layers
// (rate 0.05, its recipe before 2026-12-07) at 4x its batch, at equal examples seen (800
// reference steps). Scaled linearly with no warm-up its Adagrad steps start too large and it
// lands far below the reference; the square-root rule with a warm-up over the first quarter of
// its steps lands beside it. Measured (seeds 1 and 2, docs/perf/training.md): linear -0.208 /
// -0.102, square root with warm-up -0.011 / -0.000.
TEST(Train, ALargerBatchConvergesWithTheRecipesRule) {
  ModelSpec ref = tiny();
  ref.dense_optimizer = OptimizerSpec{};
  ref.dense_optimizer.kind = OptimizerKind::adagrad;
  ref.dense_optimizer.lr = 0.05;
  TrainConfig a;
  a.model = ref;
  a.batch = ref.batch_size;
  a.steps = 800;
  a.seed = 1;
  a.eval_examples = 65536;
  const double reference = train(a, nullptr).auc;
  auto larger = [&](LrScaling rule, std::int64_t warmup) {
    ModelSpec m = ref;
    m.lr_scaling = rule;
    m.lr_warmup_steps = warmup;
    TrainConfig b = a;
    b.batch = 4 * ref.batch_size;
    b.model = with_batch(m, b.batch);
    b.steps = a.steps / 4;
    return train(b, nullptr).auc;
  };
  const double linear = larger(LrScaling::linear, 0);
  const double root = larger(LrScaling::sqrt, a.steps / 16);
  EXPECT_LT(linear, reference - 0.05) << "reference " << reference;
  EXPECT_NEAR(root, reference, 0.02);
}

// --profile: the steady steps are timed by category, the one-time costs (first batch, the first
// two steps) apart; profiling changes no result.
TEST(Train, ProfileTimesTheStepsAndTheOneTimeCosts) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.batch = 64;
  cfg.eval_examples = 512;
  cfg.seed = 5;
  cfg.steps = 10;
  const TrainResult plain = train(cfg);
  EXPECT_EQ(plain.profiled_steps, 0);
  EXPECT_TRUE(plain.first_steps_s.empty());
  cfg.profile = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.profiled_steps, 8);
  EXPECT_FALSE(r.profile_ms_per_step.empty());
  EXPECT_GT(r.first_batch_s, 0.0);
  ASSERT_EQ(r.first_steps_s.size(), 2u);
  for (double s : r.first_steps_s) EXPECT_GT(s, 0.0);
  EXPECT_EQ(r.final_loss, plain.final_loss);
  EXPECT_EQ(r.auc, plain.auc);
}

// Trains cfg (cfg.steps = N) straight into `straight`, and N/2 then resumed to N into `halves`:
// the final checkpoints must hold the same bits (weights and optimizer state).
void expect_resume_is_exact(TrainConfig cfg, const fs::path& straight, const fs::path& halves) {
  const std::int64_t n = cfg.steps;
  cfg.checkpoint_dir = straight;
  train(cfg);
  cfg.checkpoint_dir = halves;
  cfg.steps = n / 2;
  train(cfg);
  cfg.steps = n;
  cfg.resume = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.start_step, n / 2);
  EXPECT_EQ(r.steps, n);
  const auto a = tensor_bytes(checkpoint_path(straight, n));
  const auto b = tensor_bytes(checkpoint_path(halves, n));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << "tensor " << i;
}

// Train N steps straight, or N/2, stop, resume for N/2: bit-identical weights and state.
TEST(Train, ResumeGivesIdenticalWeights) {
  const fs::path straight = temp_dir("straight"), halves = temp_dir("halves");
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.batch = 64;
  cfg.eval_examples = 512;
  cfg.seed = 11;
  cfg.steps = 40;
  expect_resume_is_exact(cfg, straight, halves);
  fs::remove_all(straight);
  fs::remove_all(halves);
}

// A run stopped in the middle of its learning-rate warm-up (a larger batch than the model's)
// continues the warm-up exactly when resumed; resuming it under another warm-up is refused by
// name.
TEST(Train, ResumeInTheWarmUpIsExactAndAnotherWarmUpIsRefused) {
  const fs::path straight = temp_dir("warm-straight"), halves = temp_dir("warm-halves");
  ModelSpec m = tiny();
  m.batch_size = 32;
  m.lr_scaling = LrScaling::sqrt;
  m.lr_warmup_steps = 30;
  TrainConfig cfg;
  cfg.batch = 128;
  cfg.model = with_batch(m, cfg.batch);
  cfg.eval_examples = 512;
  cfg.seed = 12;
  cfg.steps = 40;
  ASSERT_LT(cfg.model.lr_factor(20), 1.0);  // step 20, where the halves resume, is in the warm-up
  expect_resume_is_exact(cfg, straight, halves);
  m.lr_warmup_steps = 10;
  cfg.model = with_batch(m, cfg.batch);
  cfg.checkpoint_dir = halves;
  cfg.steps = 50;
  cfg.resume = true;
  try {
    train(cfg);
    ADD_FAILURE() << "a changed warm-up resumed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("recipe.lr_warmup '30 steps from 0.5 of the rates'"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(straight);
  fs::remove_all(halves);
}

// fp16 and bf16 tables are checkpointed in their own type (safetensors F16 and BF16) and a run
// resumed from one continues the same stochastic rounding: the result is bit-identical.
TEST(Train, ResumeWithNarrowTablesIsExact) {
  const fs::path straight = temp_dir("narrow-straight"), halves = temp_dir("narrow-halves");
  TrainConfig cfg;
  cfg.model = tiny();
  for (std::size_t t = 0; t < cfg.model.tables.size(); ++t)
    cfg.model.tables[t].dtype = t % 3 == 0 ? DType::f16 : t % 3 == 1 ? DType::bf16 : DType::f32;
  cfg.batch = 64;
  cfg.eval_examples = 512;
  cfg.seed = 13;
  cfg.steps = 30;
  expect_resume_is_exact(cfg, straight, halves);
  // The header names each table's own type.
  std::ifstream in(checkpoint_path(straight, 30), std::ios::binary);
  std::uint64_t hs = 0;
  in.read(reinterpret_cast<char*>(&hs), 8);
  std::string h(hs, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hs));
  const std::string t0 = cfg.model.tables[0].name, t1 = cfg.model.tables[1].name;
  EXPECT_NE(h.find(fmt::format("\"embedding.{}.weight\":{{\"dtype\":\"F16\"", t0)),
            std::string::npos)
      << h.substr(0, 400);
  EXPECT_NE(h.find(fmt::format("\"embedding.{}.weight\":{{\"dtype\":\"BF16\"", t1)),
            std::string::npos);
  fs::remove_all(straight);
  fs::remove_all(halves);
}

// A shard dataset of the synthetic data trains exactly as the batches made on the fly (same seed),
// and a resumed run over shards (crossing an epoch) is bit-identical to a straight one.
TEST(Train, ShardsTrainLikeSyntheticAndResumeExactly) {
  const fs::path data = temp_dir("shards-data"), synth_run = temp_dir("shards-synth"),
                 shard_run = temp_dir("shards-run"), halves = temp_dir("shards-halves");
  const ModelSpec model = tiny();
  {
    const SyntheticData synth(model, 11);
    ShardWriter w(data, model, "test", 300);  // part files that batches of 64 straddle
    Batch b;
    synth.make(Split::train, 0, 1000, b);
    w.write(Split::train, b);
    synth.make(Split::eval, 0, 512, b);
    w.write(Split::eval, b);
    w.finish();
  }
  TrainConfig cfg;
  cfg.model = model;
  cfg.batch = 64;
  cfg.eval_examples = 512;
  cfg.seed = 11;
  cfg.steps = 15;  // 960 examples: within the first epoch
  cfg.checkpoint_dir = synth_run;
  train(cfg);
  cfg.shard_dir = data;
  cfg.checkpoint_dir = shard_run;
  train(cfg);
  {
    const auto a = tensor_bytes(checkpoint_path(synth_run, 15));
    const auto b = tensor_bytes(checkpoint_path(shard_run, 15));
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << "tensor " << i;
  }
  // 40 steps (2560 examples, into the third epoch) straight, and 20 + 20 resumed. The straight
  // run warns once, when the data start repeating. (A new run takes an empty directory.)
  fs::remove_all(shard_run);
  cfg.steps = 40;
  test::Events events;
  train(cfg, &events);
  const std::vector<std::string> warnings = events.warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("the training data ran out (at about step 15); epoch 2"),
            std::string::npos)
      << warnings[0];
  cfg.checkpoint_dir = halves;
  cfg.steps = 20;
  train(cfg);
  cfg.steps = 40;
  cfg.resume = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.start_step, 20);
  const auto a = tensor_bytes(checkpoint_path(shard_run, 40));
  const auto b = tensor_bytes(checkpoint_path(halves, 40));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << "tensor " << i;
  for (const auto& d : {data, synth_run, shard_run, halves}) fs::remove_all(d);
}

TEST(Train, ResumeRejectsAnotherModelOrBatch) {
  const fs::path dir = temp_dir("mismatch");
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.batch = 32;
  cfg.steps = 2;
  cfg.eval_examples = 64;
  cfg.checkpoint_dir = dir;
  train(cfg);
  cfg.resume = true;
  cfg.steps = 4;
  cfg.batch = 16;
  try {
    train(cfg);
    FAIL() << "resumed with another batch size";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--batch"), std::string::npos) << e.what();
  }
  cfg.batch = 32;
  cfg.model.name = "renamed";
  try {
    train(cfg);
    FAIL() << "resumed another model";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model 'tiny'"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Train, BadConfigurationsAreInputErrors) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.steps = 1;
  cfg.resume = true;  // without a checkpoint directory
  EXPECT_THROW(train(cfg), InputError);
  cfg.resume = false;
  cfg.backend = "tpu";
  EXPECT_THROW(train(cfg), InputError);
  cfg.backend = "cpu";
  cfg.train_files = {"only-one.tsv"};  // no held-out data
  EXPECT_THROW(train(cfg), InputError);
}

}  // namespace
}  // namespace parity
