// Sequence shards (HSTU models): what is written reads back as the synthetic sequences make it
// (across part files, in batches that do not divide them, over epochs, after a seek), and every
// kind of bad dataset or batch is an InputError naming the file, the example or the field.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"
#include "parity/spec.h"

namespace parity {
namespace {

namespace fs = std::filesystem;

ModelSpec hstu_tiny() {
  return load_model_spec(PARITY_SOURCE_DIR "/configs/models/hstu-tiny.yaml");
}

class SequenceShards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("parity-seq-shards-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // 1000 training and 300 held-out examples in files of 333.
  void write(const ModelSpec& m) {
    const SyntheticSequences synth(m, 11);
    SequenceShardWriter w(dir_, m, "test", 333);
    Batch b;
    for (std::int64_t first = 0; first < 1000; first += 250) {
      synth.make(Split::train, first, 250, b);
      w.write(Split::train, b);
    }
    synth.make(Split::eval, 0, 300, b);
    w.write(Split::eval, b);
    w.finish();
  }
  std::string error_of(const ModelSpec& m) const {
    try {
      SequenceShardReader r(dir_, m, Split::train);
      Batch b;
      while (r.next(128, b)) {
      }
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

void expect_same(const Batch& a, const Batch& b) {
  ASSERT_EQ(a.size, b.size);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(a.tasks, b.tasks);
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.num_tables, b.num_tables);
  EXPECT_EQ(a.history_offsets, b.history_offsets);
  EXPECT_EQ(a.event_ids, b.event_ids);
  EXPECT_EQ(a.event_times, b.event_times);
  EXPECT_EQ(a.target_ids, b.target_ids);
  EXPECT_EQ(a.target_times, b.target_times);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.teacher_prob, b.teacher_prob);
  EXPECT_EQ(a.unordered_prob, b.unordered_prob);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.ids, b.ids);
}

TEST_F(SequenceShards, ReadBackAsTheGeneratorMakesThem) {
  const ModelSpec m = hstu_tiny();
  write(m);
  const SyntheticSequences synth(m, 11);
  for (const std::int64_t batch : {1, 77, 250, 1000}) {
    SequenceShardReader r(dir_, m, Split::train);
    EXPECT_EQ(r.examples(), 1000);
    Batch got, want;
    std::int64_t first = 0;
    while (r.next(batch, got)) {
      synth.make(Split::train, first, got.size, want);
      expect_same(got, want);
      first += got.size;
    }
    EXPECT_EQ(first, 1000) << batch;
  }
  SequenceShardReader eval(dir_, m, Split::eval);
  Batch got, want;
  ASSERT_TRUE(eval.next(300, got));
  synth.make(Split::eval, 0, 300, want);
  expect_same(got, want);
}

TEST_F(SequenceShards, WrapsIntoTheNextEpochAndSeeks) {
  const ModelSpec m = hstu_tiny();
  write(m);
  const SyntheticSequences synth(m, 11);
  SequenceShardReader r(dir_, m, Split::train);
  r.seek(2990);  // epoch 2, example 990
  EXPECT_EQ(r.epoch(), 2);
  Batch got, a, b;
  ASSERT_TRUE(r.next(20, got, /*wrap=*/true));
  EXPECT_EQ(r.epoch(), 3);
  // Examples 990..999 then 0..9: the same as reading them one range at a time.
  SequenceShardReader one(dir_, m, Split::train);
  one.seek(990, false);
  ASSERT_TRUE(one.next(10, a));
  synth.make(Split::train, 0, 10, b);
  EXPECT_EQ(std::vector<float>(got.labels.begin(), got.labels.begin() + 10 * 4), a.labels);
  EXPECT_EQ(std::vector<float>(got.labels.begin() + 10 * 4, got.labels.end()), b.labels);
  one.seek(1000, false);
  EXPECT_FALSE(one.next(10, a));
}

TEST_F(SequenceShards, ModelMismatchNamesTheField) {
  const ModelSpec m = hstu_tiny();
  write(m);
  ModelSpec other = m;
  other.hstu->tasks = {"click", "share"};
  EXPECT_NE(error_of(other).find("'tasks[1]'"), std::string::npos) << error_of(other);
  other = m;
  other.hstu->sequence.max_len = 16;
  EXPECT_NE(error_of(other).find("'max_len'"), std::string::npos) << error_of(other);
  other = m;
  other.hstu->sequence.features[0].rows = 10;
  EXPECT_NE(error_of(other).find("'features[0].rows'"), std::string::npos) << error_of(other);
  ModelSpec dlrm;
  dlrm.name = "dlrm";
  EXPECT_THROW(SequenceShardReader(dir_, dlrm, Split::train), InputError);
  // A DLRM dataset is not read as sequences.
  std::ofstream(dir_ / "meta.json") << R"({"format": "parity-shards-1"})";
  EXPECT_NE(error_of(m).find("expected 'parity-sequence-shards-1'"), std::string::npos)
      << error_of(m);
}

TEST_F(SequenceShards, CorruptFilesAreInputErrorsNamingTheFile) {
  const ModelSpec m = hstu_tiny();
  write(m);
  const fs::path part = dir_ / "train-00001.bin";
  std::vector<char> bytes;
  {
    std::ifstream in(part, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto put = [&](const std::vector<char>& b) {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  // The header's counts, to find the sections (sequence_shards.cpp has the layout).
  std::int64_t n = 0, events = 0;
  std::memcpy(&n, bytes.data() + 16, 8);
  std::memcpy(&events, bytes.data() + 40, 8);
  ASSERT_EQ(n, 333);
  const auto align8 = [](std::size_t x) { return (x + 7) / 8 * 8; };
  const std::size_t scores = 333 * 2 * 2;
  const std::size_t labels = 64,
                    history = align8(align8(align8(64 + 4 * scores) + 4 * scores) + 4 * scores);
  const std::size_t times = history + 8 * 334;

  put(std::vector<char>(bytes.begin(), bytes.end() - 5));
  EXPECT_NE(error_of(m).find("train-00001.bin"), std::string::npos) << error_of(m);
  EXPECT_NE(error_of(m).find("truncated"), std::string::npos) << error_of(m);

  auto bad = bytes;
  bad[0] = 'X';
  put(bad);
  EXPECT_NE(error_of(m).find("bad magic"), std::string::npos) << error_of(m);

  // A history longer than the model takes: example 0's end moved 40 events on.
  bad = bytes;
  std::int64_t end = 0;
  std::memcpy(&end, bad.data() + history + 8, 8);
  end += 40;
  std::memcpy(bad.data() + history + 8, &end, 8);
  put(bad);
  EXPECT_NE(error_of(m).find("example 0 has a history of"), std::string::npos) << error_of(m);

  // Timestamps going back within the first example of two events or more.
  bad = bytes;
  std::int64_t offsets[21];
  std::memcpy(offsets, bad.data() + history, sizeof offsets);
  int two = 0;
  while (two < 20 && offsets[two + 1] - offsets[two] < 2) ++two;
  ASSERT_LT(two, 20);
  const std::int64_t late = std::int64_t{1} << 50;
  std::memcpy(bad.data() + times + 8 * static_cast<std::size_t>(offsets[two]), &late, 8);
  put(bad);
  EXPECT_NE(error_of(m).find(fmt::format("example {}: event 1 at time", two)), std::string::npos)
      << error_of(m);

  // An item id outside its table (the first event's item: feature 0 of event 0).
  bad = bytes;
  const std::uint32_t huge = 4000000000u;
  std::memcpy(bad.data() + times + 8 * static_cast<std::size_t>(events), &huge, 4);
  put(bad);
  EXPECT_NE(error_of(m).find("example 0: event 0: id 4000000000 of feature 'item'"),
            std::string::npos)
      << error_of(m);

  // A label that is not 0 or 1.
  bad = bytes;
  const float label = 2.0f;
  std::memcpy(bad.data() + labels + 4 * 5, &label, 4);
  put(bad);
  EXPECT_NE(error_of(m).find("example 1: label 2 is not 0 or 1"), std::string::npos) << error_of(m);

  fs::remove(part);
  EXPECT_NE(error_of(m).find("cannot read"), std::string::npos) << error_of(m);
}

TEST_F(SequenceShards, TheWriterRefusesWhatTheModelCannotTake) {
  const ModelSpec m = hstu_tiny();
  const SyntheticSequences synth(m, 3);
  Batch b;
  synth.make(Split::train, 0, 8, b);
  SequenceShardWriter w(dir_, m, "test");
  Batch bad = b;
  int e = 0;  // the first example of two events or more
  while (e < 8 && bad.history_offsets[e + 1] - bad.history_offsets[e] < 2) ++e;
  ASSERT_LT(e, 8);
  bad.event_times[bad.history_offsets[e] + 1] = bad.event_times[bad.history_offsets[e]] - 1;
  try {
    w.write(Split::train, bad);
    ADD_FAILURE() << "timestamps going back were written";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find(fmt::format("example {} of the batch", e)),
              std::string::npos)
        << err.what();
  }
  bad = b;
  bad.target_ids[0] = 1000;  // the item table has 1000 rows
  EXPECT_THROW(w.write(Split::train, bad), InputError);
  bad = b;
  bad.labels.pop_back();
  EXPECT_THROW(w.write(Split::train, bad), Error);
  // Nothing of the refused batches was kept: the good one alone is written.
  w.write(Split::train, b);
  w.finish();
  SequenceShardReader r(dir_, m, Split::train);
  EXPECT_EQ(r.examples(), 8);
  EXPECT_THROW(SequenceShardWriter(dir_, m, "again"), InputError);  // a dataset is there
}

}  // namespace
}  // namespace parity
