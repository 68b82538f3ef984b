// Training on batch sources of one's own (TrainConfig::train_data, eval_data): they train like
// the built-in ones, and a bad id in one surfaces as an error on every backend before a
// checkpoint is written after it.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/checkpoint.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/train.h"
#include "train_test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::Events;

using test::tiny;

// The synthetic data written as a user would write a source: examples by position.
class PlantedTeacherBatches : public BatchSource {
 public:
  PlantedTeacherBatches(const ModelSpec& model, std::uint64_t seed, Split split)
      : data_(model, seed), split_(split) {}
  bool next(std::int64_t max_examples, Batch& out) override {
    data_.make(split_, position_, max_examples, out);
    position_ += max_examples;
    return true;
  }
  void seek(std::int64_t example) override { position_ = example; }
  std::string describe() const override { return "the test's planted-teacher batches"; }

 private:
  SyntheticData data_;
  Split split_;
  std::int64_t position_ = 0;
};

TrainConfig small_run(std::uint64_t seed) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.batch = 64;
  cfg.steps = 20;
  cfg.eval_examples = 512;
  cfg.eval_every = 10;
  cfg.seed = seed;
  cfg.report_interval_s = 0;  // a progress event (and its loss) after every step
  return cfg;
}

// Skips the test where the backend is not built or cannot run here.
#define PARITY_REQUIRE_TRAIN_BACKEND(backend)                                            \
  do {                                                                                   \
    if ((backend) != "cpu") {                                                            \
      try {                                                                              \
        (void)make_backend(backend);                                                     \
      } catch (const InputError& e) {                                                    \
        GTEST_SKIP() << "the " << (backend) << " backend is not built: " << e.what();    \
      } catch (const Error& e) {                                                         \
        GTEST_SKIP() << "the " << (backend) << " backend cannot run here: " << e.what(); \
      }                                                                                  \
    }                                                                                    \
  } while (0)

class SyntheticOnEveryBackend : public ::testing::TestWithParam<std::string> {};

// The built-in synthetic data against the same examples from a source of the user's own: on a GPU
// backend the built-in batches are made on the device, the user's on the host, and every loss
// must still be the same bits.
TEST_P(SyntheticOnEveryBackend, CustomSourceTrainsLikeTheBuiltInSyntheticData) {
  const std::string backend = GetParam();
  PARITY_REQUIRE_TRAIN_BACKEND(backend);
  TrainConfig cfg = small_run(7);
  cfg.backend = backend;
  Events builtin;
  const TrainResult a = train(cfg, &builtin);
  const ModelSpec model = cfg.model;
  cfg.train_data = [model] {
    return std::make_unique<PlantedTeacherBatches>(model, 7, Split::train);
  };
  cfg.eval_data = [model] {
    return std::make_unique<PlantedTeacherBatches>(model, 7, Split::eval);
  };
  Events custom;
  const TrainResult b = train(cfg, &custom);
  ASSERT_EQ(builtin.losses().size(), 20u);
  EXPECT_EQ(builtin.losses(), custom.losses());
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.auc, b.auc);
  EXPECT_EQ(a.teacher_auc, b.teacher_auc);
  ASSERT_FALSE(custom.all.empty());
  EXPECT_NE(custom.all.front().message.find("the test's planted-teacher batches"),
            std::string::npos)
      << custom.all.front().message;
  const bool on_device = make_backend(backend)->makes_synthetic_data();
  EXPECT_EQ(
      builtin.all.front().message.find("synthetic data made on the device") != std::string::npos,
      on_device)
      << builtin.all.front().message;
}

// --profile times the making of each batch where the device makes it (beside the step, on the copy
// queue), and nowhere else; timing it changes no result.
TEST_P(SyntheticOnEveryBackend, ProfileTimesTheBatchesMadeOnTheDevice) {
  const std::string backend = GetParam();
  PARITY_REQUIRE_TRAIN_BACKEND(backend);
  TrainConfig cfg = small_run(5);
  cfg.backend = backend;
  const TrainResult plain = train(cfg);
  cfg.profile = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.final_loss, plain.final_loss);
  const bool on_device = make_backend(backend)->makes_synthetic_data();
  const auto made = r.profile_beside_ms_per_step.find("synthetic_input");
  ASSERT_EQ(made != r.profile_beside_ms_per_step.end(), on_device);
  if (on_device) {
    EXPECT_GT(made->second, 0.0);
  }
}

// A run resumed from a checkpoint makes the batches an uninterrupted run makes after that step.
TEST_P(SyntheticOnEveryBackend, ResumedRunContinuesExactly) {
  const std::string backend = GetParam();
  PARITY_REQUIRE_TRAIN_BACKEND(backend);
  const fs::path dir = fs::temp_directory_path() / ("parity-train-synthetic-resume-" + backend);
  fs::remove_all(dir);
  TrainConfig cfg = small_run(5);
  cfg.backend = backend;
  const TrainResult whole = train(cfg);
  cfg.steps = 12;
  cfg.checkpoint_dir = dir;
  train(cfg);
  cfg.steps = 20;
  cfg.resume = true;
  Events resumed;
  const TrainResult tail = train(cfg, &resumed);
  EXPECT_EQ(tail.start_step, 12);
  EXPECT_EQ(resumed.losses().size(), 8u);
  EXPECT_EQ(whole.final_loss, tail.final_loss);
  EXPECT_EQ(whole.auc, tail.auc);
  fs::remove_all(dir);
}

// Tables in host memory (TableSpec::host_placed, cached in part): a run checkpointed at step 12
// and resumed ends exactly where the same run with every table in backend memory ends (the
// checkpoint holds the true rows, not the cache's stale host copies).
TEST_P(SyntheticOnEveryBackend, HostTablesCheckpointAndResumeExactly) {
  const std::string backend = GetParam();
  PARITY_REQUIRE_TRAIN_BACKEND(backend);
  const fs::path dir = fs::temp_directory_path() / ("parity-train-host-tables-" + backend);
  fs::remove_all(dir);
  TrainConfig cfg = small_run(3);
  cfg.backend = backend;
  const TrainResult in_memory = train(cfg);
  for (std::size_t t = 0; t < cfg.model.tables.size(); t += 2) {
    cfg.model.tables[t].host_placed = true;
    cfg.model.tables[t].cache_rows = cfg.model.tables[t].rows / 3;
  }
  cfg.steps = 12;
  cfg.checkpoint_dir = dir;
  train(cfg);
  cfg.steps = 20;
  cfg.resume = true;
  const TrainResult tail = train(cfg);
  EXPECT_EQ(tail.start_step, 12);
  EXPECT_EQ(in_memory.final_loss, tail.final_loss);
  EXPECT_EQ(in_memory.auc, tail.auc);
  EXPECT_FALSE(tail.cache.empty());
  EXPECT_GT(tail.host_resident_bytes, 0u);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, SyntheticOnEveryBackend, ::testing::Values("cpu", "cuda", "hip"),
                         [](const auto& info) { return info.param; });

TEST(TrainSources, CustomSourcesAreGivenBothAndAlone) {
  TrainConfig cfg = small_run(1);
  const ModelSpec model = cfg.model;
  cfg.train_data = [model] {
    return std::make_unique<PlantedTeacherBatches>(model, 1, Split::train);
  };
  EXPECT_THROW(train(cfg), InputError);  // no evaluation source
  cfg.eval_data = cfg.train_data;
  cfg.shard_dir = "some/dataset";
  EXPECT_THROW(train(cfg), InputError);  // and a shard dataset
  cfg.shard_dir.clear();
  cfg.eval_data = [] { return std::unique_ptr<BatchSource>(); };
  EXPECT_THROW(train(cfg), InputError);  // a factory that makes nothing
}

// Batches of a source whose batch number `bad` has id 1000000 in bag 3 of table 1 (2000 rows).
class OneBadBatch : public BatchSource {
 public:
  OneBadBatch(const ModelSpec& model, std::int64_t bad)
      : good_(make_synthetic_source(model, 3, Split::train)), bad_(bad) {}
  bool next(std::int64_t max_examples, Batch& out) override {
    if (!good_->next(max_examples, out)) return false;
    if (read_++ == bad_) out.ids[static_cast<std::size_t>(out.offsets[out.size + 3])] = 1000000;
    return true;
  }
  void seek(std::int64_t example) override {
    good_->seek(example);
    read_ = 0;
  }
  std::string describe() const override { return "synthetic data with one bad id"; }

 private:
  std::unique_ptr<BatchSource> good_;
  std::int64_t bad_, read_ = 0;
};

class BadIds : public ::testing::TestWithParam<std::string> {};

// The cpu backend throws at the step that meets the bad id (step 6); a GPU backend skips the id,
// records it, and the trainer raises it at the next evaluation and checkpoint (step 8), before
// either is made. Both leave the checkpoint of step 4 and none after it.
TEST_P(BadIds, SurfaceBeforeTheNextCheckpoint) {
  const std::string backend = GetParam();
  if (backend != "cpu") {  // a GPU backend: built (make_backend knows), and a GPU present
    try {
      (void)make_backend(backend);
    } catch (const InputError& e) {
      GTEST_SKIP() << "the " << backend << " backend is not built: " << e.what();
    } catch (const Error& e) {
      GTEST_SKIP() << "the " << backend << " backend cannot run here: " << e.what();
    }
  }
  const fs::path dir = fs::temp_directory_path() / ("parity-train-bad-ids-" + backend);
  fs::remove_all(dir);
  TrainConfig cfg = small_run(3);
  cfg.backend = backend;
  cfg.steps = 12;
  cfg.eval_every = 4;
  cfg.checkpoint_every = 4;
  cfg.checkpoint_dir = dir;
  const ModelSpec model = cfg.model;
  cfg.train_data = [model] { return std::make_unique<OneBadBatch>(model, 5); };
  cfg.eval_data = [model] { return make_synthetic_source(model, 3, Split::eval); };
  Events events;
  std::string message;
  bool input_error = false;
  try {
    train(cfg, &events);
    ADD_FAILURE() << "trained through an id outside its table";
  } catch (const Error& e) {
    message = e.what();
    input_error = dynamic_cast<const InputError*>(&e) != nullptr;
  }
  EXPECT_NE(message.find("table 1, bag 3: id 1000000 is outside [0, 2000)"), std::string::npos)
      << message;
  EXPECT_TRUE(input_error) << message;  // bad data, on every backend
  EXPECT_EQ(list_checkpoints(dir), std::vector<std::int64_t>{4});
  EXPECT_EQ(events.steps_of(TrainEvent::Kind::eval), std::vector<std::int64_t>{4});
  const std::vector<std::int64_t> progress = events.steps_of(TrainEvent::Kind::progress);
  ASSERT_FALSE(progress.empty());
  if (backend == "cpu") {
    EXPECT_EQ(progress.back(), 5);  // step 6 threw
  } else {
    EXPECT_EQ(progress.back(), 7);  // steps 6 to 8 ran; the boundary after step 8 raised
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, BadIds, ::testing::Values("cpu", "cuda", "hip"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace parity
