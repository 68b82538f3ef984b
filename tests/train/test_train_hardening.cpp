// Training that must stop cleanly, and checkpoints that must survive it: a diverging run stops
// with the step and keeps its good checkpoints; a damaged checkpoint is found and passed over; a
// resume under another recipe, past its steps or into a directory another run holds is refused
// before any step; data that give nothing are an error, not a silent success.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "parity/checkpoint.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/train.h"
#include "train_test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;
using test::Events;
using test::temp_dir;
using test::tensor_bytes;

using test::tiny;

TrainConfig small_run(const fs::path& dir) {
  return test::small_run(dir, 30);
}

// The planted-teacher data, with a NaN dense feature in every example from batch `poison_from`
// on (a custom source is not checked by a reader, so the engine's guard is what sees it).
class PoisonedBatches : public BatchSource {
 public:
  PoisonedBatches(const ModelSpec& model, std::int64_t batch, std::int64_t poison_from)
      : data_(model, 3), batch_(batch), poison_from_(poison_from) {}
  bool next(std::int64_t max_examples, Batch& out) override {
    data_.make(Split::train, position_, max_examples, out);
    if (position_ / batch_ >= poison_from_)
      for (std::int64_t e = 0; e < out.size; ++e)
        out.dense[static_cast<std::size_t>(e * out.num_dense)] =
            std::numeric_limits<float>::quiet_NaN();
    position_ += max_examples;
    return true;
  }
  void seek(std::int64_t example) override { position_ = example; }
  std::string describe() const override { return "planted-teacher batches with NaN features"; }

 private:
  SyntheticData data_;
  std::int64_t batch_, poison_from_, position_ = 0;
};

// A source with nothing in it.
class NoBatches : public BatchSource {
 public:
  bool next(std::int64_t, Batch&) override { return false; }
  void seek(std::int64_t) override {}
  std::string describe() const override { return "an empty test source"; }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainHardening, NanInTheDataStopsTheRunAndKeepsTheGoodCheckpoints) {
  const fs::path dir = temp_dir("hard-nan-data");
  TrainConfig cfg = small_run(dir);
  cfg.steps = 40;
  cfg.keep_checkpoints = 2;
  const ModelSpec model = cfg.model;
  cfg.train_data = [&] { return std::make_unique<PoisonedBatches>(model, 64, 25); };
  cfg.eval_data = [&] { return make_synthetic_source(model, 3, Split::eval); };
  Events events;
  try {
    train(cfg, &events);
    FAIL() << "a run with NaN inputs ended normally";
  } catch (const NumericalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 26 are NaN or infinite"), std::string::npos) << m;  // batch 25: step 26
    EXPECT_NE(m.find("step-20.safetensors"), std::string::npos) << m;
  }
  EXPECT_EQ(list_checkpoints(dir), (std::vector<std::int64_t>{10, 20}));
  // The newest good checkpoint resumes (its values are finite and its checksums hold).
  cfg.train_data = [&] { return make_synthetic_source(model, 3, Split::train); };
  cfg.resume = true;
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.start_step, 20);
  EXPECT_TRUE(std::isfinite(r.final_loss));
  fs::remove_all(dir);
}

TEST(TrainHardening, HugeLearningRatesStopTheRunInsteadOfHanging) {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adagrad}) {
    const fs::path dir = temp_dir("hard-lr");
    TrainConfig cfg = small_run(dir);
    cfg.model.dense_optimizer.kind = OptimizerKind::sgd;
    cfg.model.dense_optimizer.lr = 1e30;
    cfg.model.embedding_optimizer.kind = kind;
    cfg.model.embedding_optimizer.lr = 1e30;
    cfg.checkpoint_every = 0;
    const std::string m = error_of([&] { train(cfg); });
    EXPECT_NE(m.find("diverged"), std::string::npos) << m;
    EXPECT_TRUE(list_checkpoints(dir).empty()) << "a checkpoint of NaN weights was written";
    fs::remove_all(dir);
  }
}

// A flipped bit in the newest checkpoint's data: resume finds it, sets the file aside and
// continues from the one before, exactly as an uninterrupted run would.
TEST(TrainHardening, DamagedNewestCheckpointIsSetAsideAndTheOlderOneResumes) {
  const fs::path straight = temp_dir("hard-straight"), dir = temp_dir("hard-damaged");
  TrainConfig cfg = small_run(straight);
  train(cfg);
  cfg.checkpoint_dir = dir;
  cfg.steps = 20;
  train(cfg);
  const fs::path newest = checkpoint_path(dir, 20);
  {
    const SafetensorsHeader h = read_safetensors_header(newest);
    const auto& e = h.tensors.begin()->second;
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(h.data_offset + (e.begin + e.end) / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(h.data_offset + (e.begin + e.end) / 2));
    f.write(&c, 1);
  }
  cfg.steps = 30;
  cfg.resume = true;
  Events events;
  const TrainResult r = train(cfg, &events);
  EXPECT_EQ(r.start_step, 10);
  EXPECT_NE(events.warning_text().find("checksum"), std::string::npos) << events.warning_text();
  EXPECT_TRUE(fs::exists(dir / "step-20.safetensors.corrupt"));
  const auto a = tensor_bytes(checkpoint_path(straight, 30));
  const auto b = tensor_bytes(checkpoint_path(dir, 30));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << "tensor " << i;
  // With every checkpoint damaged there is nothing to resume from: an error, not step 0.
  for (const std::int64_t s : list_checkpoints(dir)) {
    std::fstream f(checkpoint_path(dir, s), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  cfg.steps = 40;
  const std::string m = error_of([&] { train(cfg); });
  EXPECT_NE(m.find("every checkpoint"), std::string::npos) << m;
  fs::remove_all(straight);
  fs::remove_all(dir);
}

TEST(TrainHardening, ResumeUnderAnotherRecipeIsRefused) {
  const fs::path dir = temp_dir("hard-recipe");
  TrainConfig cfg = small_run(dir);
  cfg.steps = 2;
  train(cfg);
  cfg.resume = true;
  cfg.steps = 4;
  cfg.model.dense_optimizer.lr *= 2;
  std::string m = error_of([&] { train(cfg); });
  EXPECT_NE(m.find("recipe.dense_optimizer"), std::string::npos) << m;
  cfg.model = tiny();
  cfg.model.tables[0].dtype = DType::bf16;
  m = error_of([&] { train(cfg); });
  EXPECT_NE(m.find("recipe.table_dtypes"), std::string::npos) << m;
  cfg.model = tiny();
  EXPECT_EQ(train(cfg).start_step, 2);  // the same recipe resumes
  fs::remove_all(dir);
}

// A checkpoint renamed to another step is refused rather than resumed at the wrong place in the
// data.
TEST(TrainHardening, ACheckpointWhoseNameContradictsItsStepIsRefused) {
  const fs::path dir = temp_dir("hard-renamed");
  TrainConfig cfg = small_run(dir);
  cfg.steps = 2;
  train(cfg);
  fs::rename(checkpoint_path(dir, 2), checkpoint_path(dir, 3));
  cfg.resume = true;
  cfg.steps = 6;
  const std::string m = error_of([&] { train(cfg); });
  EXPECT_NE(m.find("holds step 2 by its metadata, not the step its name says"), std::string::npos)
      << m;
  fs::remove_all(dir);
}

TEST(TrainHardening, ResumeWithNothingLeftToTrainIsAnError) {
  const fs::path dir = temp_dir("hard-nothing-left");
  TrainConfig cfg = small_run(dir);
  cfg.steps = 10;
  train(cfg);
  cfg.resume = true;
  for (const std::int64_t steps : {5, 10}) {
    cfg.steps = steps;
    const std::string m = error_of([&] { train(cfg); });
    EXPECT_NE(m.find("nothing is left to train"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

TEST(TrainHardening, ACheckpointDirectoryHeldByAnotherRunIsRefusedBeforeTraining) {
  const fs::path dir = temp_dir("hard-lock");
  TrainConfig cfg = small_run(dir);
  {
    const CheckpointDirLock other(dir);
    Events events;
    const std::string m = error_of([&] { train(cfg, &events); });
    EXPECT_NE(m.find("in use by another run (process "), std::string::npos) << m;
    EXPECT_TRUE(events.all.empty()) << "training started";
  }
  cfg.steps = 2;
  EXPECT_EQ(train(cfg).steps, 2);  // free once the holder is gone
  fs::remove_all(dir);
  // A file where the directory should be, and a directory that cannot be written.
  std::ofstream(dir.string()) << "not a directory";
  EXPECT_NE(error_of([&] { train(cfg); }).find("is not a directory"), std::string::npos);
  fs::remove(dir);
}

// A new run into a directory that holds another run's checkpoints would prune its own older ones
// and keep theirs: refused before any step, naming the steps found; --resume continues them.
TEST(TrainHardening, ANewRunBesideAnotherRunsCheckpointsIsRefused) {
  const fs::path dir = temp_dir("hard-beside");
  TrainConfig cfg = small_run(dir);
  train(cfg);
  Events events;
  const std::string m = error_of([&] { train(cfg, &events); });
  EXPECT_NE(m.find("holds checkpoints already (steps 20, 30): give --resume"), std::string::npos)
      << m;
  EXPECT_TRUE(events.all.empty()) << "training started";
  EXPECT_EQ(list_checkpoints(dir), (std::vector<std::int64_t>{20, 30}));
  cfg.resume = true;
  cfg.steps = 40;
  EXPECT_EQ(train(cfg).start_step, 30);
  fs::remove_all(dir);
}

TEST(TrainHardening, DataThatGiveNothingAreErrors) {
  TrainConfig cfg = small_run("");
  const ModelSpec model = cfg.model;
  cfg.steps = 0;
  cfg.train_data = [] { return std::make_unique<NoBatches>(); };
  cfg.eval_data = [&] { return make_synthetic_source(model, 3, Split::eval); };
  EXPECT_NE(error_of([&] { train(cfg); }).find("gave no batch"), std::string::npos);
  cfg.steps = 3;
  cfg.train_data = [&] { return make_synthetic_source(model, 3, Split::train); };
  cfg.eval_data = [] { return std::make_unique<NoBatches>(); };
  EXPECT_NE(error_of([&] { train(cfg); }).find("gave no example"), std::string::npos);
  cfg.keep_checkpoints = 0;
  EXPECT_THROW(train(cfg), InputError);
}

}  // namespace
}  // namespace parity
