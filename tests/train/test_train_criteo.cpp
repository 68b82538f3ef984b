// Training on Criteo TSV files: a pass over the files, held-out evaluation, and how
// malformed lines are reported.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "parity/checkpoint.h"
#include "parity/error.h"
#include "parity/train.h"
#include "train_test_util.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

ModelSpec criteo_model() {
  ModelSpec m = load_model_spec(fs::path(PARITY_SOURCE_DIR) / "configs/models/criteo-small.yaml");
  for (auto& t : m.tables) t.rows = 1000;  // keep the test's memory small
  return m;
}

// Lines whose label depends on categorical feature 0 and integer feature 0, so that a
// model can learn something; every line is well formed.
void write_tsv(const fs::path& file, int lines, unsigned seed) {
  std::ofstream out(file);
  unsigned x = seed;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (int i = 0; i < lines; ++i) {
    const unsigned c0 = (next() >> 8) % 40;
    const int i0 = static_cast<int>((next() >> 8) % 20);
    const bool label = ((c0 % 3 == 0) != (i0 > 14)) != ((next() >> 8) % 10 == 0);
    out << (label ? 1 : 0);
    for (int k = 0; k < 13; ++k)
      out << '\t' << (k == 0 ? i0 : static_cast<int>((next() >> 8) % 100));
    for (int k = 0; k < 26; ++k) {
      out << '\t';
      if (k == 0)
        out << std::hex << (0x1000 + c0) << std::dec;
      else if ((next() >> 8) % 7 != 0)
        out << std::hex << ((next() >> 8) % 5000) << std::dec;
    }
    out << '\n';
  }
}

class CriteoTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("parity-criteo-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_tsv(dir_ / "day_0.tsv", 6000, 1);
    write_tsv(dir_ / "day_1.tsv", 2000, 2);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CriteoTraining, OnePassLearnsAndEvaluatesOnTheHeldOutFile) {
  TrainConfig cfg;
  cfg.model = criteo_model();
  cfg.batch = 128;
  cfg.train_files = {dir_ / "day_0.tsv", dir_ / "day_1.tsv"};  // the last file is held out
  const TrainResult r = train(cfg);
  EXPECT_EQ(r.steps, (6000 + 127) / 128);
  EXPECT_GT(r.auc, 0.7);  // the planted rule is learnable from features 0
  EXPECT_EQ(r.teacher_auc, 0.0);
}

TEST_F(CriteoTraining, MalformedLineStopsWithFileAndLineOrIsSkipped) {
  {
    std::ofstream out(dir_ / "day_0.tsv", std::ios::app);
    out << "1\t2\tnot-a-number\n";
  }
  TrainConfig cfg;
  cfg.model = criteo_model();
  cfg.batch = 256;
  cfg.train_files = {dir_ / "day_0.tsv"};
  cfg.eval_files = {dir_ / "day_1.tsv"};
  try {
    train(cfg);
    FAIL() << "a malformed line passed in stop mode";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("day_0.tsv:6001"), std::string::npos) << e.what();
  }
  cfg.on_bad_line = OnBadLine::skip;
  test::Events warnings;
  const TrainResult r = train(cfg, &warnings);
  EXPECT_GT(r.steps, 0);
  EXPECT_NE(warnings.warning_text().find("1 malformed lines skipped"), std::string::npos)
      << warnings.warning_text();
  EXPECT_NE(warnings.warning_text().find("day_0.tsv:6001"), std::string::npos)
      << warnings.warning_text();
}

// A malformed line among the held-out examples stops the run before its first step (evaluation
// comes only after the training work), and so does a held-out file with no example at all.
TEST_F(CriteoTraining, BadHeldOutDataStopsBeforeTheFirstStep) {
  {
    std::ofstream out(dir_ / "day_1.tsv", std::ios::app);
    out << "1\t2\tnot-a-number\n";
  }
  TrainConfig cfg;
  cfg.model = criteo_model();
  cfg.batch = 256;
  cfg.train_files = {dir_ / "day_0.tsv"};
  cfg.eval_files = {dir_ / "day_1.tsv"};
  test::Events events;
  try {
    train(cfg, &events);
    FAIL() << "bad held-out data passed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("day_1.tsv:2001"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(events.all.empty()) << "training started";
  std::ofstream(dir_ / "day_1.tsv", std::ios::trunc).flush();
  try {
    train(cfg);
    FAIL() << "an empty held-out file passed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gave no example"), std::string::npos) << e.what();
  }
}

// A resumed run skips what the earlier steps read, a malformed line among it too (skip mode), and
// ends with the weights of an uninterrupted run.
TEST_F(CriteoTraining, ResumeSkipsWhatEarlierStepsReadAndGivesIdenticalWeights) {
  {
    std::ifstream in(dir_ / "day_0.tsv");
    std::ofstream out(dir_ / "day_0_bad.tsv");
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      if (i == 300) out << "1\t2\tnot-a-number\n";
      out << line << '\n';
    }
  }
  const fs::path straight = test::temp_dir("criteo-straight"),
                 halves = test::temp_dir("criteo-halves");
  TrainConfig cfg;
  cfg.model = criteo_model();
  cfg.batch = 128;
  cfg.eval_examples = 1024;
  cfg.on_bad_line = OnBadLine::skip;
  cfg.train_files = {dir_ / "day_0_bad.tsv"};
  cfg.eval_files = {dir_ / "day_1.tsv"};
  cfg.steps = 20;
  cfg.checkpoint_dir = straight;
  const TrainResult a = train(cfg);
  cfg.checkpoint_dir = halves;
  cfg.steps = 10;
  train(cfg);
  cfg.steps = 20;
  cfg.resume = true;
  test::Events warnings;
  const TrainResult b = train(cfg, &warnings);
  EXPECT_EQ(b.start_step, 10);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_NE(warnings.warning_text().find("1 malformed lines skipped"), std::string::npos)
      << warnings.warning_text();
  const auto x = test::tensor_bytes(checkpoint_path(straight, 20));
  const auto y = test::tensor_bytes(checkpoint_path(halves, 20));
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(x[i] == y[i]) << "tensor " << i;
  fs::remove_all(straight);
  fs::remove_all(halves);
}

TEST_F(CriteoTraining, ModelThatDoesNotFitTheFormatIsRejected) {
  TrainConfig cfg;
  cfg.model = load_model_spec(fs::path(PARITY_SOURCE_DIR) / "configs/models/tiny.yaml");
  cfg.train_files = {dir_ / "day_0.tsv", dir_ / "day_1.tsv"};
  EXPECT_THROW(train(cfg), InputError);
}

}  // namespace
}  // namespace parity
