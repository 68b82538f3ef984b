// Binary shards: what is written reads back bit for bit (across part-file boundaries, in batches
// that do not divide the files, over epochs, after a seek), and every kind of bad dataset is an
// InputError naming the file and what is wrong, never a crash.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"

namespace parity {
namespace {

namespace fs = std::filesystem;

TableSpec table(const std::string& name, std::int64_t rows, int pooling) {
  TableSpec t;
  t.name = name;
  t.rows = rows;
  t.dim = 8;
  t.pooling_size = pooling;
  return t;
}

ModelSpec model() {
  ModelSpec m;
  m.name = "shards";
  m.dense_features = 5;
  m.batch_size = 64;
  m.tables = {table("a", 1000, 1), table("b", 37, 3), table("c", 123457, 2)};
  return m;
}

class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("parity-shards-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // 1000 training and 300 held-out examples in files of 333.
  void write(const ModelSpec& m, std::int64_t per_file = 333) {
    SyntheticData synth(m, 11);
    ShardWriter w(dir_, m, "test", per_file);
    Batch b;
    for (std::int64_t first = 0; first < 1000; first += 250) {
      synth.make(Split::train, first, 250, b);
      w.write(Split::train, b);
    }
    synth.make(Split::eval, 0, 300, b);
    w.write(Split::eval, b);
    w.finish();
  }
  fs::path dir_;
};

void expect_same(const Batch& a, const Batch& b) {
  ASSERT_EQ(a.size, b.size);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.teacher_prob, b.teacher_prob);
}

TEST_F(Shards, RoundTripAcrossFilesAndBatchSizes) {
  const ModelSpec m = model();
  write(m);
  EXPECT_TRUE(is_shard_dataset(dir_));
  SyntheticData synth(m, 11);
  for (std::int64_t batch : {1, 64, 100, 333, 1000}) {
    ShardReader r(dir_, m, Split::train);
    EXPECT_EQ(r.examples(), 1000);
    Batch got, want;
    std::int64_t first = 0;
    while (r.next(batch, got)) {
      synth.make(Split::train, first, std::min<std::int64_t>(batch, 1000 - first), want);
      expect_same(got, want);
      first += got.size;
    }
    EXPECT_EQ(first, 1000) << "batch " << batch;
  }
  ShardReader eval(dir_, m, Split::eval);
  Batch got, want;
  ASSERT_TRUE(eval.next(300, got));
  synth.make(Split::eval, 0, 300, want);
  expect_same(got, want);
  EXPECT_FALSE(eval.next(1, got));
}

TEST_F(Shards, WrapsIntoTheNextEpochAndSeeks) {
  const ModelSpec m = model();
  write(m);
  SyntheticData synth(m, 11);
  ShardReader r(dir_, m, Split::train);
  r.seek(900);
  Batch got, head, tail;
  ASSERT_TRUE(r.next(150, got, /*wrap=*/true));
  EXPECT_EQ(r.epoch(), 1);
  ASSERT_EQ(got.size, 150);
  // Examples 900..999 then 0..49.
  ShardReader r2(dir_, m, Split::train);
  r2.seek(900);
  ASSERT_TRUE(r2.next(100, tail));
  r2.seek(0);
  ASSERT_TRUE(r2.next(50, head));
  EXPECT_EQ(std::vector<float>(got.labels.begin(), got.labels.begin() + 100), tail.labels);
  EXPECT_EQ(std::vector<float>(got.labels.begin() + 100, got.labels.end()), head.labels);
  // Table 1's ids: the first 100 bags from the tail, the next 50 from the head.
  const auto t1 = [](const Batch& b) {
    return std::vector<std::int64_t>(
        b.ids.begin() + b.offsets[static_cast<std::size_t>(b.size)],
        b.ids.begin() + b.offsets[static_cast<std::size_t>(2 * b.size)]);
  };
  auto want = t1(tail);
  const auto h = t1(head);
  want.insert(want.end(), h.begin(), h.end());
  EXPECT_EQ(t1(got), want);
}

// A rank of a sharded run reads only its slice of each global batch (BatchSource::next_slice):
// for shards (one pass, and epochs that wrap inside a batch) and synthetic data, after a seek,
// every rank's slice is the slice of the batch next() gives, bit for bit, and the sources move
// on alike (the last, short batch of a pass too).
TEST_F(Shards, ARanksSliceIsThatSliceOfTheWholeBatch) {
  const ModelSpec m = model();
  write(m);
  constexpr int kRanks = 3;
  // From example 150 in batches of 300; and from 0 in batches of 250, which end exactly where a
  // pass ends (the epoch moves on at the next batch, not before).
  for (const auto& [start, kBatch] : {std::pair<std::int64_t, std::int64_t>{150, 300}, {0, 250}})
    for (const std::string kind : {"shards", "shards-wrap", "synthetic"})
      for (int r = 0; r < kRanks; ++r) {
        auto make = [&] {
          return kind == "synthetic" ? make_synthetic_source(m, 11, Split::train)
                                     : make_shard_source(dir_, m, Split::train, kind != "shards");
        };
        const auto whole = make(), sliced = make();
        ASSERT_TRUE(sliced->reads_slices());
        whole->seek(start);
        sliced->seek(start);
        std::int64_t batches = 0;
        for (int step = 0; step < 6; ++step) {
          Batch w, s;
          const bool more = whole->next(kBatch, w);
          const std::int64_t n = sliced->next_slice(kBatch, r, kRanks, s);
          ASSERT_EQ(n, more ? w.size : 0) << kind << " rank " << r << " step " << step;
          if (!more) break;
          ++batches;
          const std::int64_t first = n * r / kRanks, count = n * (r + 1) / kRanks - first;
          SCOPED_TRACE(kind + " rank " + std::to_string(r) + " step " + std::to_string(step));
          expect_same(s, slice_of(w, first, count));
          EXPECT_EQ(sliced->epoch(), whole->epoch());
        }
        // One pass from 150: 300, 300, 250 examples; from 0: four of 250; wrapped and synthetic:
        // all six.
        EXPECT_EQ(batches, kind != "shards" ? 6 : start == 150 ? 3 : 4) << kind;
      }
}

TEST_F(Shards, SeekPastTheEndOfOnePassLeavesNothing) {
  const ModelSpec m = model();
  write(m);
  ShardReader r(dir_, m, Split::train);
  Batch b;
  r.seek(1000, /*wrap=*/false);
  EXPECT_FALSE(r.next(10, b));
  r.seek(2500, /*wrap=*/true);  // epoch 2, example 500
  EXPECT_EQ(r.epoch(), 2);
  ASSERT_TRUE(r.next(10, b, true));
  SyntheticData synth(m, 11);
  Batch want;
  synth.make(Split::train, 500, 10, want);
  EXPECT_EQ(b.labels, want.labels);
  EXPECT_EQ(b.ids, want.ids);
}

TEST_F(Shards, RefusesToOverwriteADataset) {
  const ModelSpec m = model();
  write(m);
  EXPECT_THROW(ShardWriter(dir_, m, "again"), InputError);
}

std::string error_of(const fs::path& dir, const ModelSpec& m) {
  try {
    ShardReader r(dir, m, Split::train);
    Batch b;
    while (r.next(128, b)) {
    }
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(Shards, ModelMismatchNamesTheField) {
  const ModelSpec m = model();
  write(m);
  ModelSpec other = m;
  other.dense_features = 6;
  EXPECT_NE(error_of(dir_, other).find("field 'dense_features'"), std::string::npos)
      << error_of(dir_, other);
  other = m;
  other.tables.pop_back();
  EXPECT_NE(error_of(dir_, other).find("field 'tables'"), std::string::npos);
  other = m;
  other.tables[2].rows = 1000;  // the data's ids go up to 123457
  EXPECT_NE(error_of(dir_, other).find("tables[2].rows"), std::string::npos)
      << error_of(dir_, other);
}

TEST_F(Shards, CorruptFilesAreInputErrors) {
  const ModelSpec m = model();
  write(m);
  const fs::path part = dir_ / "train-00001.bin";
  const auto size = fs::file_size(part);
  std::vector<char> bytes(size);
  {
    std::ifstream in(part, std::ios::binary);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
  }
  auto put = [&](const std::vector<char>& b) {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  // Truncated.
  put(std::vector<char>(bytes.begin(), bytes.end() - 7));
  EXPECT_NE(error_of(dir_, m).find("train-00001.bin"), std::string::npos);
  EXPECT_NE(error_of(dir_, m).find("truncated"), std::string::npos) << error_of(dir_, m);
  // Bad magic.
  auto bad = bytes;
  bad[0] = 'X';
  put(bad);
  EXPECT_NE(error_of(dir_, m).find("bad magic"), std::string::npos);
  // An id out of its table's range (the last id of the file belongs to table c: rows 123457).
  bad = bytes;
  const std::uint32_t huge = 4000000000u;
  std::memcpy(bad.data() + bad.size() - 4, &huge, 4);
  put(bad);
  EXPECT_NE(error_of(dir_, m).find("is >= its 123457 rows"), std::string::npos)
      << error_of(dir_, m);
  // An offset in the middle of a table pointing far outside the ids (the ends are intact).
  bad = bytes;
  {
    // Offsets start after the header, labels, teacher and dense sections (each padded to 8 bytes).
    auto align8 = [](std::size_t x) { return (x + 7) / 8 * 8; };
    const std::size_t n = 333;
    const std::size_t at = align8(align8(align8(64 + 4 * n) + 4 * n) + 4 * n * 5);
    const std::int64_t far = std::int64_t{1} << 40;
    std::memcpy(bad.data() + at + 8 * 100, &far, 8);
  }
  put(bad);
  EXPECT_NE(error_of(dir_, m).find("offsets of table 0 are inconsistent"), std::string::npos)
      << error_of(dir_, m);
  // Missing part file.
  fs::remove(part);
  EXPECT_NE(error_of(dir_, m).find("cannot read"), std::string::npos);
  // Not a dataset.
  fs::remove(dir_ / "meta.json");
  EXPECT_FALSE(is_shard_dataset(dir_));
  EXPECT_NE(error_of(dir_, m).find("no meta.json"), std::string::npos);
}

TEST_F(Shards, BadMetaJsonIsAnInputError) {
  const ModelSpec m = model();
  write(m);
  {
    std::ofstream out(dir_ / "meta.json", std::ios::trunc);
    out << "{\"format\": \"parity-shards-1\", \"dense";
  }
  EXPECT_NE(error_of(dir_, m).find("not valid JSON"), std::string::npos) << error_of(dir_, m);
  {
    std::ofstream out(dir_ / "meta.json", std::ios::trunc);
    out << "{\"format\": \"something-else\"}";
  }
  EXPECT_NE(error_of(dir_, m).find("field 'format'"), std::string::npos) << error_of(dir_, m);
  // An integer field given as a number out of int's range (read as one, undefined behaviour).
  {
    std::ofstream out(dir_ / "meta.json", std::ios::trunc);
    out << "{\"format\": \"parity-shards-1\", \"dense_features\": 1e300}";
  }
  EXPECT_NE(error_of(dir_, m).find("field 'dense_features': expected an integer, got 1e+300"),
            std::string::npos)
      << error_of(dir_, m);
}

// A FIFO, a device or a directory where a file should be is refused at once: opening a FIFO would
// block until a writer came, a device would never end.
TEST_F(Shards, NonRegularFilesAreRefusedWithoutBlocking) {
  const ModelSpec m = model();
  write(m);
  const fs::path part = dir_ / "train-00001.bin";
  fs::remove(part);
  ASSERT_EQ(::mkfifo(part.c_str(), 0644), 0);
  std::string msg = error_of(dir_, m);
  EXPECT_NE(msg.find("train-00001.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a FIFO"), std::string::npos) << msg;
  fs::remove(part);
  fs::create_directory(part);
  EXPECT_NE(error_of(dir_, m).find("a directory"), std::string::npos) << error_of(dir_, m);
  fs::remove(part);
  fs::create_symlink("/dev/zero", part);
  EXPECT_NE(error_of(dir_, m).find("a character device"), std::string::npos) << error_of(dir_, m);
  fs::remove(part);
  fs::remove(dir_ / "meta.json");
  ASSERT_EQ(::mkfifo((dir_ / "meta.json").c_str(), 0644), 0);
  EXPECT_NE(error_of(dir_, m).find("a FIFO"), std::string::npos) << error_of(dir_, m);
}

// A part file truncated or rewritten while a reader has it open: the next batch that reads it is an
// InputError naming the file (a mapped file would have ended the process with SIGBUS).
TEST_F(Shards, AFileTruncatedWhileReadingIsAnErrorNotACrash) {
  const ModelSpec m = model();
  write(m);
  for (const bool rewrite : {false, true}) {
    ShardReader r(dir_, m, Split::train);
    Batch b;
    ASSERT_TRUE(r.next(100, b));
    const fs::path part = dir_ / "train-00001.bin";
    const auto size = fs::file_size(part);
    if (rewrite) {
      fs::copy_file(part, dir_ / "copy.bin");
      fs::rename(dir_ / "copy.bin", part);  // same bytes, another file
    } else {
      fs::resize_file(part, size / 2);
    }
    std::string msg = "no error";
    try {
      while (r.next(100, b)) {
      }
    } catch (const InputError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("train-00001.bin' changed since training opened it"), std::string::npos)
        << msg;
    fs::remove_all(dir_);
    write(m);
  }
}

// Labels are 0 or 1 and dense features finite in every batch read; meta.json's fields are named
// by their path.
TEST_F(Shards, BadValuesAndFieldsNameTheExampleOrThePath) {
  const ModelSpec m = model();
  write(m);
  const fs::path part = dir_ / "train-00000.bin";
  std::vector<char> bytes(fs::file_size(part));
  {
    std::ifstream in(part, std::ios::binary);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto put = [&](const std::vector<char>& b) {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  auto bad = bytes;
  const float two = 2.0f, nan = std::nanf("");
  std::memcpy(bad.data() + 64 + 4 * 7, &two, 4);  // label of example 7
  put(bad);
  EXPECT_NE(error_of(dir_, m).find("example 7: label 2 is not 0 or 1"), std::string::npos)
      << error_of(dir_, m);
  bad = bytes;
  const std::size_t dense = ((64 + 4 * 333 + 7) / 8 * 8 + 4 * 333 + 7) / 8 * 8;  // after teacher
  std::memcpy(bad.data() + dense + 4 * (5 * 9 + 2), &nan, 4);  // example 9, feature 2
  put(bad);
  EXPECT_NE(error_of(dir_, m).find("example 9: dense feature 2 is nan"), std::string::npos)
      << error_of(dir_, m);
  put(bytes);
  std::string meta;
  {
    std::ifstream in(dir_ / "meta.json");
    meta.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t at = meta.find("\"examples\": 333");
  ASSERT_NE(at, std::string::npos);
  std::string edited = meta;
  edited.replace(at, 15, "\"examples\": -1");
  std::ofstream(dir_ / "meta.json", std::ios::trunc) << edited;
  EXPECT_NE(error_of(dir_, m).find("field 'splits.train.files[0].examples': -1 is not a positive"),
            std::string::npos)
      << error_of(dir_, m);
  edited = meta;
  edited.replace(at, 15, "\"examples\": \"x\"");
  std::ofstream(dir_ / "meta.json", std::ios::trunc) << edited;
  EXPECT_NE(error_of(dir_, m).find("splits.train.files[0].examples': expected an integer"),
            std::string::npos)
      << error_of(dir_, m);
}

}  // namespace
}  // namespace parity
