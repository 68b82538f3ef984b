// Faults found in training are replayed from the newest checkpoint on the same device: a fault
// that comes again is the data's or the model's (the run stops and says so), one that does not is
// the device's (training goes on from the checkpoint, and ends exactly where a run without the
// fault ends). TrainConfig::replay_faults and spike_factor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

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
  return test::small_run(dir, 40);
}

// The planted-teacher data with every label of batch `bad` inverted: a batch that raises the loss
// the same way whenever it is trained.
class InvertedBatch : public BatchSource {
 public:
  InvertedBatch(const ModelSpec& model, std::int64_t batch, std::int64_t bad)
      : data_(model, 3), batch_(batch), bad_(bad) {}
  bool next(std::int64_t max_examples, Batch& out) override {
    data_.make(Split::train, position_, max_examples, out);
    if (position_ / batch_ == bad_)
      for (float& y : out.labels) y = 1.0f - y;
    position_ += max_examples;
    return true;
  }
  void seek(std::int64_t example) override { position_ = example; }
  std::string describe() const override { return "planted-teacher batches, one inverted"; }

 private:
  SyntheticData data_;
  std::int64_t batch_, bad_, position_ = 0;
};

// The planted-teacher batches of `model` (seed 3) with batch `bad` (of `batch` examples) changed
// by `spoil`: one bad batch, the same whenever it is trained.
std::unique_ptr<BatchSource> spoiled_source(const ModelSpec& model, std::int64_t batch,
                                            std::int64_t bad, std::function<void(Batch&)> spoil) {
  struct Spoiled : BatchSource {
    std::unique_ptr<BatchSource> in;
    std::int64_t batch = 0, bad = 0, pos = 0;
    std::function<void(Batch&)> spoil;
    bool next(std::int64_t n, Batch& out) override {
      in->next(n, out);
      if (pos / batch == bad) spoil(out);
      pos += n;
      return true;
    }
    void seek(std::int64_t e) override {
      pos = e;
      in->seek(e);
    }
    std::string describe() const override { return "synthetic batches, one spoiled"; }
  };
  auto s = std::make_unique<Spoiled>();
  s->in = make_synthetic_source(model, 3, Split::train);
  s->batch = batch;
  s->bad = bad;
  s->spoil = std::move(spoil);
  return s;
}

// A short hstu-tiny run on the cpu (batch 32, 30 steps) with a checkpoint every 10 steps into
// `dir`.
TrainConfig hstu_run(const fs::path& dir) {
  TrainConfig cfg;
  cfg.model = load_model_spec(PARITY_SOURCE_DIR "/configs/models/hstu-tiny.yaml");
  cfg.steps = 30;
  cfg.batch = 32;
  cfg.backend = "cpu";
  cfg.eval_examples = 256;
  cfg.checkpoint_every = 10;
  cfg.checkpoint_dir = dir;
  return cfg;
}

// A run that recovered from one transient fault (the device blamed) ends as the run without it:
// the same steps, loss, AUC and last checkpoint's tensors.
void expect_recovered_as_clean(const TrainResult& r, const TrainResult& clean, const fs::path& dir,
                               const fs::path& clean_dir, std::int64_t steps) {
  ASSERT_EQ(r.faults_recovered.size(), 1u);
  const std::string& v = r.faults_recovered[0];
  EXPECT_NE(v.find("silent data corruption"), std::string::npos) << v;
  EXPECT_NE(v.find("wrongly once (a hardware fault)"), std::string::npos) << v;
  EXPECT_EQ(r.steps, steps);
  EXPECT_EQ(r.final_loss, clean.final_loss);
  EXPECT_EQ(r.auc, clean.auc);
  EXPECT_EQ(tensor_bytes(checkpoint_path(dir, steps)),
            tensor_bytes(checkpoint_path(clean_dir, steps)));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const NumericalError& e) {
    return e.what();
  }
  return "(no error)";
}

// A flipped high bit in a product (a transient device fault, found by the product checks): the
// replay runs clean, so the device is blamed, and the run goes on from the checkpoint before the
// fault to end bit for bit where a run without it ends.
TEST(TrainReplay, TransientProductFaultIsTheDevicesAndTheRunEndsAsWithoutIt) {
  const fs::path clean_dir = temp_dir("replay-clean"), dir = temp_dir("replay-transient");
  TrainConfig cfg = small_run(clean_dir);
  cfg.product_checks = true;
  const TrainResult clean = train(cfg);

  cfg.checkpoint_dir = dir;
  cfg.inject_fault = TrainConfig::FaultAtStep{25, {3, 5, 30}};
  Events events;
  const TrainResult r = train(cfg, &events);
  ASSERT_EQ(r.faults_recovered.size(), 1u) << events.warning_text();
  expect_recovered_as_clean(r, clean, dir, clean_dir, 40);
  const std::string& v = r.faults_recovered[0];
  // Found where the host next reads the checks: step 25 or later, by step 30's checkpoint.
  EXPECT_NE(v.find("the replay of steps 21 to "), std::string::npos) << v;
  EXPECT_NE(v.find("no device to mark"), std::string::npos) << v;  // the cpu backend
  EXPECT_NE(events.warning_text().find("training continues from checkpoint"), std::string::npos)
      << events.warning_text();
  fs::remove_all(clean_dir);
  fs::remove_all(dir);
}

// NaN in the data: the replay diverges at the same step again, so the data or the model is
// blamed, and no checkpoint is written or removed by the replay.
TEST(TrainReplay, NanThatComesAgainIsTheDatas) {
  const fs::path dir = temp_dir("replay-nan");
  TrainConfig cfg = small_run(dir);
  const ModelSpec model = cfg.model;
  cfg.train_data = [&] {  // one NaN feature in batch 24 (step 25)
    return spoiled_source(model, 64, 24,
                          [](Batch& b) { b.dense[0] = std::numeric_limits<float>::quiet_NaN(); });
  };
  cfg.eval_data = [&] { return make_synthetic_source(model, 3, Split::eval); };
  Events events;
  const std::string m = error_of([&] { train(cfg, &events); });
  EXPECT_NE(m.find("step 25 are NaN or infinite"), std::string::npos) << m;
  EXPECT_NE(m.find("the replay of steps 21 to 25"), std::string::npos) << m;
  EXPECT_NE(m.find("the data or the model is the cause, not the device"), std::string::npos) << m;
  EXPECT_NE(events.warning_text().find("replaying steps 21 to 25"), std::string::npos)
      << events.warning_text();
  EXPECT_EQ(list_checkpoints(dir), (std::vector<std::int64_t>{10, 20}));

  // Without replays, or without a checkpoint to replay from, the run stops as before and says why.
  fs::remove_all(dir);
  cfg.replay_faults = false;
  EXPECT_NE(error_of([&] { train(cfg); }).find("not replayed: replays are off"), std::string::npos);
  fs::remove_all(dir);
  cfg.replay_faults = true;
  cfg.checkpoint_every = 30;
  EXPECT_NE(error_of([&] {
              train(cfg);
            }).find("not replayed: no checkpoint before step 25 to replay from"),
            std::string::npos);
  fs::remove_all(dir);
}

// A batch whose labels are inverted raises the loss the same way on every replay: a spike of the
// data. The same spike's loss is compared bit for bit.
TEST(TrainReplay, LossSpikeThatComesAgainIsTheDatas) {
  const fs::path dir = temp_dir("replay-spike");
  TrainConfig cfg = small_run(dir);
  const ModelSpec model = cfg.model;
  cfg.spike_factor = 1.3;
  cfg.train_data = [&] { return std::make_unique<InvertedBatch>(model, 64, 31); };
  cfg.eval_data = [&] { return make_synthetic_source(model, 3, Split::eval); };
  const std::string m = error_of([&] { train(cfg); });
  EXPECT_NE(m.find("loss spike at step 32"), std::string::npos) << m;
  EXPECT_NE(m.find("the replay of steps 31 to 32"), std::string::npos) << m;
  EXPECT_NE(m.find("gave the same result again"), std::string::npos) << m;
  EXPECT_NE(m.find("examples 1984 to 2047"), std::string::npos) << m;
  fs::remove_all(dir);

  // The same data without the spike watch trains to the end.
  cfg.spike_factor = 0;
  EXPECT_EQ(train(cfg).steps, 40);
  fs::remove_all(dir);

  cfg.spike_factor = 0.5;
  try {
    train(cfg);
    FAIL() << "a spike factor below 1 was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--spike-factor 0.5"), std::string::npos) << e.what();
  }
}

// A planted fault with the product checks off: the finite-value guard or the spike watch finds
// what it did, and the clean replay blames the device.
TEST(TrainReplay, PlantedFaultWithoutChecksIsFoundAndTheDeviceBlamed) {
  const fs::path dir = temp_dir("replay-planted");
  TrainConfig cfg = small_run(dir);
  cfg.spike_factor = 3;
  cfg.inject_fault = TrainConfig::FaultAtStep{15, {0, 0, 30}};
  const TrainResult r = train(cfg);
  ASSERT_EQ(r.faults_recovered.size(), 1u);
  EXPECT_NE(r.faults_recovered[0].find("differed"), std::string::npos) << r.faults_recovered[0];
  EXPECT_EQ(r.steps, 40);
  fs::remove_all(dir);
}

// A flipped exponent bit in an embedding row (t6: 50 rows, read by every batch): the product
// checks cannot see it, the spike watch or the finite-value guard finds what it does, the clean
// replay blames the device, and the run ends where a run without the fault ends.
TEST(TrainReplay, TableFaultIsFoundAndTheRunEndsAsWithoutIt) {
  const fs::path clean_dir = temp_dir("replay-table-clean"), dir = temp_dir("replay-table");
  TrainConfig cfg = small_run(clean_dir);
  cfg.spike_factor = 3;
  const TrainResult clean = train(cfg);

  cfg.checkpoint_dir = dir;
  cfg.inject_table_fault = TrainConfig::TableFaultAtStep{15, "t6", 7, 3, 30};
  Events events;
  const TrainResult r = train(cfg, &events);
  ASSERT_EQ(r.faults_recovered.size(), 1u) << events.warning_text();
  const std::string& v = r.faults_recovered[0];
  EXPECT_NE(v.find("the replay of steps 11 to "), std::string::npos) << v;
  EXPECT_NE(v.find("differed"), std::string::npos) << v;
  EXPECT_EQ(r.steps, 40);
  EXPECT_EQ(r.final_loss, clean.final_loss);
  EXPECT_EQ(r.auc, clean.auc);
  EXPECT_EQ(tensor_bytes(checkpoint_path(dir, 40)), tensor_bytes(checkpoint_path(clean_dir, 40)));
  fs::remove_all(dir);

  // A flip of the lowest mantissa bit changes the run by a rounding: nothing is found, and the
  // run differs from the clean one (the flip was planted).
  cfg.inject_table_fault = TrainConfig::TableFaultAtStep{15, "t6", 7, 3, 0};
  const TrainResult quiet = train(cfg);
  EXPECT_TRUE(quiet.faults_recovered.empty());
  EXPECT_NE(tensor_bytes(checkpoint_path(dir, 40)), tensor_bytes(checkpoint_path(clean_dir, 40)));
  fs::remove_all(dir);

  // A fault the model cannot hold is refused before anything trains, by name.
  const auto refused = [&](TrainConfig::TableFaultAtStep f) {
    cfg.inject_table_fault = std::move(f);
    try {
      train(cfg);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(refused({15, "t6", 50, 0, 30})
                .find("element (50, 0) is outside table 't6' of 50 rows "
                      "and 16 columns"),
            std::string::npos);
  EXPECT_NE(refused({15, "t6", 0, 0, 32})
                .find("bit 32, expected 0 to 31 (table 't6' is stored as "
                      "fp32)"),
            std::string::npos);
  EXPECT_NE(refused({0, "t6", 0, 0, 3}).find("step 0, expected 1 or more"), std::string::npos);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 10)));
  fs::remove_all(clean_dir);
  fs::remove_all(dir);
}

// The same for an HSTU model: its projections' and head's products checked, a flip planted in one,
// the replay clean, and the run ending where a run without the fault ends.
TEST(TrainReplay, HstuTransientProductFaultIsTheDevicesAndTheRunEndsAsWithoutIt) {
  const fs::path clean_dir = temp_dir("replay-hstu-clean"), dir = temp_dir("replay-hstu");
  TrainConfig cfg = hstu_run(clean_dir);
  cfg.product_checks = true;
  const TrainResult clean = train(cfg);
  EXPECT_GT(clean.products_checked, 0);
  EXPECT_TRUE(clean.faults_recovered.empty());

  cfg.checkpoint_dir = dir;
  cfg.inject_fault = TrainConfig::FaultAtStep{15, {2, 7, 30}};
  Events events;
  const TrainResult r = train(cfg, &events);
  ASSERT_EQ(r.faults_recovered.size(), 1u) << events.warning_text();
  expect_recovered_as_clean(r, clean, dir, clean_dir, 30);
  // Found at the checkpoint of step 20, or at a progress report before it where the flip made the
  // loss NaN.
  EXPECT_NE(r.faults_recovered[0].find("the replay of steps 11 to "), std::string::npos)
      << r.faults_recovered[0];
  fs::remove_all(clean_dir);
  fs::remove_all(dir);
}

// A flipped exponent bit in an HSTU model's table (action: 4 rows, in every history) is planted,
// but nothing finds it: the layer norm that reads each token's summed embedding scales the huge
// element back, the loss stays finite and moves little. What no check sees is said plainly.
TEST(TrainReplay, HstuTableFaultIsPlantedAndTheNormAbsorbsIt) {
  const fs::path clean_dir = temp_dir("replay-hstu-table-clean"),
                 dir = temp_dir("replay-hstu-table");
  TrainConfig cfg = hstu_run(clean_dir);
  const TrainResult clean = train(cfg);

  cfg.checkpoint_dir = dir;
  cfg.inject_table_fault = TrainConfig::TableFaultAtStep{15, "action", 2, 5, 30};
  Events events;
  const TrainResult r = train(cfg, &events);
  EXPECT_TRUE(r.faults_recovered.empty()) << events.warning_text();
  EXPECT_EQ(r.steps, 30);
  EXPECT_TRUE(std::isfinite(r.final_loss));
  EXPECT_NE(r.final_loss, clean.final_loss);
  EXPECT_NE(tensor_bytes(checkpoint_path(dir, 30)), tensor_bytes(checkpoint_path(clean_dir, 30)));

  // A step past the run's end plants nothing, and the run says so.
  fs::remove_all(dir);
  cfg.inject_table_fault = TrainConfig::TableFaultAtStep{31, "action", 2, 5, 30};
  Events late;
  EXPECT_EQ(train(cfg, &late).final_loss, clean.final_loss);
  EXPECT_NE(late.warning_text().find("--inject-table-fault: step 31 was not trained here"),
            std::string::npos)
      << late.warning_text();
  fs::remove_all(clean_dir);
  fs::remove_all(dir);
}

// A NaN label in an HSTU model's batch of step 15: the loss is NaN from there on, found at the
// checkpoint of step 20, and the replay from step 10 diverges again: the data or the model.
TEST(TrainReplay, HstuNanThatComesAgainIsTheDatas) {
  const fs::path dir = temp_dir("replay-hstu-nan");
  TrainConfig cfg = hstu_run(dir);
  const ModelSpec model = cfg.model;
  cfg.train_data = [&] {  // one NaN label in batch 14 (step 15)
    return spoiled_source(model, 32, 14,
                          [](Batch& b) { b.labels[0] = std::numeric_limits<float>::quiet_NaN(); });
  };
  cfg.eval_data = [&] { return make_synthetic_source(model, 3, Split::eval); };
  const std::string e = error_of([&] { train(cfg); });
  // Found at a progress report (by the clock: step 15 at the earliest) or at the checkpoint of
  // step 20 at the latest.
  const std::string at = "the loss of step ";
  const std::size_t p = e.find(at);
  ASSERT_NE(p, std::string::npos) << e;
  const int found = std::stoi(e.substr(p + at.size()));
  EXPECT_GE(found, 15) << e;
  EXPECT_LE(found, 20) << e;
  EXPECT_NE(e.find("is NaN or infinite"), std::string::npos) << e;
  EXPECT_NE(e.find("the replay of steps 11 to " + std::to_string(found)), std::string::npos) << e;
  EXPECT_NE(e.find("the data or the model is the cause, not the device"), std::string::npos) << e;
  EXPECT_EQ(list_checkpoints(dir), (std::vector<std::int64_t>{10}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace parity
