// train() on HSTU models: it trains and evaluates per task, on synthetic sequences or a sequence
// shard dataset, and a run stopped and resumed from its checkpoint ends bit for bit where an
// uninterrupted run ends.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/spec.h"
#include "parity/train.h"

namespace parity {
namespace {

std::vector<char> bytes_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Events : TrainObserver {
  std::vector<std::string> eval_messages;
  void on_event(const TrainEvent& e) override {
    if (e.kind == TrainEvent::Kind::eval) eval_messages.push_back(e.message);
  }
};

TrainConfig config(const std::filesystem::path& dir, std::int64_t steps) {
  TrainConfig cfg;
  cfg.model = load_model_spec(PARITY_SOURCE_DIR "/configs/models/hstu-tiny.yaml");
  cfg.steps = steps;
  cfg.batch = 32;
  cfg.backend = "cpu";
  cfg.eval_examples = 256;
  cfg.checkpoint_dir = dir;
  return cfg;
}

TEST(HstuTraining, ResumedRunEndsWhereAnUninterruptedOneEnds) {
  const auto root = std::filesystem::temp_directory_path() / "parity-hstu-resume";
  std::filesystem::remove_all(root);
  Events events;
  const TrainResult whole = train(config(root / "whole", 12), &events);
  ASSERT_EQ(events.eval_messages.size(), 1u);
  EXPECT_NE(events.eval_messages[0].find("AUC per task: click "), std::string::npos)
      << events.eval_messages[0];
  train(config(root / "parts", 6));
  TrainConfig rest = config(root / "parts", 12);
  rest.resume = true;
  const TrainResult resumed = train(rest);
  EXPECT_EQ(resumed.start_step, 6);
  EXPECT_EQ(resumed.steps, 12);
  EXPECT_EQ(resumed.final_loss, whole.final_loss);
  EXPECT_EQ(resumed.auc, whole.auc);
  EXPECT_EQ(bytes_of(root / "parts" / "step-12.safetensors"),
            bytes_of(root / "whole" / "step-12.safetensors"));

  TrainConfig other = config(root / "parts", 20);
  other.resume = true;
  other.seed = 2;
  EXPECT_THROW(train(other), InputError);
  std::filesystem::remove_all(root);
}

// --profile: device timing marks per category and per op, after two warm-up steps.
TEST(HstuTraining, ProfilesTheStep) {
  TrainConfig cfg = config({}, 6);
  cfg.profile = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.profiled_steps, 4);
  for (const char* category : {"input", "embedding_forward", "norms", "projections", "attention",
                               "head", "embedding_backward", "dense_optimizer"}) {
    ASSERT_TRUE(r.profile_ms_per_step.count(category)) << category;
    EXPECT_GT(r.profile_ms_per_step.at(category), 0.0) << category;
  }
  EXPECT_TRUE(r.profile_ops_ms_per_step.count("attention: layer.1 attention backward"));
}

TEST(HstuTraining, RefusesCriteoFilesAndAMissingDataset) {
  TrainConfig cfg = config({}, 2);
  cfg.train_files = {"day_0.tsv"};
  try {
    train(cfg);
    ADD_FAILURE() << "an HSTU model trained on Criteo files";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not on Criteo TSV files"), std::string::npos) << e.what();
  }
  cfg.train_files.clear();
  cfg.shard_dir = "somewhere";
  EXPECT_THROW(train(cfg), InputError);
}

// A sequence shard dataset written from the synthetic sequences trains bit for bit as the
// synthetic sequences do (the same batches in the same order, the same held-out examples), and a
// run resumed from its checkpoint ends where an uninterrupted one ends.
TEST(HstuTraining, TrainsOnSequenceShardsAsOnTheSyntheticSequences) {
  const auto root = std::filesystem::temp_directory_path() / "parity-hstu-shards";
  std::filesystem::remove_all(root);
  const ModelSpec m = load_model_spec(PARITY_SOURCE_DIR "/configs/models/hstu-tiny.yaml");
  {
    const SyntheticSequences synth(m, 1);
    SequenceShardWriter w(root / "data", m, "test", 100);  // 12 steps of 32 cross 4 files
    Batch b;
    synth.make(Split::train, 0, 400, b);
    w.write(Split::train, b);
    synth.make(Split::eval, 0, 256, b);
    w.write(Split::eval, b);
    w.finish();
  }
  const TrainResult synthetic = train(config(root / "synthetic", 12));
  TrainConfig from_shards = config(root / "whole", 12);
  from_shards.shard_dir = root / "data";
  const TrainResult whole = train(from_shards);
  EXPECT_EQ(whole.final_loss, synthetic.final_loss);
  EXPECT_EQ(whole.auc, synthetic.auc);
  EXPECT_EQ(whole.teacher_auc, synthetic.teacher_auc);
  TrainConfig part = config(root / "parts", 6);
  part.shard_dir = root / "data";
  train(part);
  part.steps = 12;
  part.resume = true;
  const TrainResult resumed = train(part);
  EXPECT_EQ(resumed.start_step, 6);
  EXPECT_EQ(resumed.final_loss, whole.final_loss);
  EXPECT_EQ(bytes_of(root / "parts" / "step-12.safetensors"),
            bytes_of(root / "whole" / "step-12.safetensors"));
  // A bad held-out example stops the run before its first step, not at its first evaluation.
  {
    std::fstream eval(root / "data" / "eval-00000.bin",
                      std::ios::binary | std::ios::in | std::ios::out);
    const float two = 2.0f;
    eval.seekp(64);  // the first label, after the 64-byte header
    eval.write(reinterpret_cast<const char*>(&two), 4);
  }
  TrainConfig bad = config(root / "bad", 12);
  bad.shard_dir = root / "data";
  try {
    train(bad);
    ADD_FAILURE() << "trained on a dataset with a label of 2";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("eval-00000.bin"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(root / "bad" / "step-12.safetensors"));
  std::filesystem::remove_all(root);
}

// The workload model's tokens and attention pairs per example are what the synthetic data hold,
// for a heavy-tailed and a uniform length distribution, within four standard errors of the
// sample's means (feed: 0.9% and 1.7% at 40,000 examples; video: about 1% and 2% at 2,000).
TEST(HstuTraining, WorkloadModelMatchesTheData) {
  struct Case {
    const char* name;
    std::int64_t examples;
    double tokens_tol, pairs_tol;
  };
  for (const Case& k :
       {Case{"hstu-feed-1k", 40000, 0.04, 0.07}, Case{"hstu-video-4k", 2000, 0.05, 0.09}}) {
    const char* name = k.name;
    const ModelSpec spec =
        load_model_spec(std::string(PARITY_SOURCE_DIR "/configs/models/") + name + ".yaml");
    const SequenceMoments want = sequence_moments(spec);
    Batch b;
    SyntheticSequences(spec, 1).make(Split::train, 0, k.examples, b);
    const double c = spec.num_tables(), t = spec.hstu->sequence.targets;
    double tokens = 0.0, pairs = 0.0;
    for (std::int64_t e = 0; e < b.size; ++e) {
      const double h = c + static_cast<double>(b.history_offsets[e + 1] - b.history_offsets[e]);
      tokens += h + t;
      pairs += h * (h + 1.0) / 2.0 + t * (h + 1.0);
    }
    tokens /= static_cast<double>(b.size);
    pairs /= static_cast<double>(b.size);
    EXPECT_NEAR(tokens / want.tokens, 1.0, k.tokens_tol) << name;
    EXPECT_NEAR(pairs / want.pairs, 1.0, k.pairs_tol) << name;
  }
}

}  // namespace
}  // namespace parity
