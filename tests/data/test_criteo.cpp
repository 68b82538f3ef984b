// CriteoReader on small files written to a temporary directory: the values it produces, the
// CSR layout, batches spanning files, and one test per kind of bad line in both modes (the
// message must name the file, the line and the field, since that is what a user acts on).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"

namespace parity {
namespace {

namespace fs = std::filesystem;

ModelSpec criteo_model(std::int64_t rows = 1000) {
  ModelSpec m;
  m.name = "criteo";
  m.dense_features = 13;
  for (int t = 0; t < 26; ++t) {
    TableSpec s;
    s.name = std::string(1, 'C');  // appended, not "C" + ...: GCC 12 warns falsely (-Wrestrict)
    s.name += std::to_string(t + 1);
    s.rows = rows + t;  // distinct, mostly not powers of two
    s.dim = 16;
    s.pooling_size = 1;
    m.tables.push_back(s);
  }
  return m;
}

// A line from a label, 13 integer fields and 26 categorical fields (as text).
std::string make_line(const std::string& label, const std::vector<std::string>& ints,
                      const std::vector<std::string>& cats) {
  std::string s = label;
  for (const auto& v : ints) s += "\t" + v;
  for (const auto& v : cats) s += "\t" + v;
  return s;
}

std::vector<std::string> ints(const std::string& v) {
  return std::vector<std::string>(13, v);
}
std::vector<std::string> cats(const std::string& v) {
  return std::vector<std::string>(26, v);
}

std::string good_line(int i) {
  std::vector<std::string> in(13), ca(26);
  for (int k = 0; k < 13; ++k) in[k] = std::to_string((i * 7 + k) % 50);
  for (int t = 0; t < 26; ++t) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x",
                  static_cast<unsigned>((i * 2654435761u + t) & 0xffffffffu));
    ca[t] = buf;
  }
  return make_line(i % 3 == 0 ? "1" : "0", in, ca);
}

class Criteo : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("parity_criteo_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::vector<std::string>& lines,
                 const std::string& eol = "\n") {
    const fs::path p = dir_ / name;
    std::ofstream f(p, std::ios::binary);
    for (const auto& l : lines) f << l << eol;
    return p;
  }

  // The InputError message of reading one file with the given lines in stop mode.
  std::string stop_error(const std::vector<std::string>& lines) {
    const fs::path p = write("bad.tsv", lines);
    CriteoReader reader({p}, criteo_model());
    Batch b;
    try {
      while (reader.next(4, b)) {
      }
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(Criteo, ParsesValues) {
  std::vector<std::string> in = ints("");
  in[0] = "0";
  in[1] = "1";
  in[2] = "-5";  // negative -> 0
  in[3] = "1000";
  std::vector<std::string> ca = cats("");
  ca[0] = "68fd1e64";
  ca[1] = "68FD1E64";  // same value, other case, other table
  ca[2] = "0";
  ca[3] = "a";
  std::vector<std::string> ca2 = ca;
  ca2[1] = "68fd1e64";
  const fs::path p = write("a.tsv", {make_line("1", in, ca), make_line("0", ints(""), cats("")),
                                     make_line("0", ints("3"), ca2)});
  const ModelSpec m = criteo_model();
  CriteoReader reader({p}, m);
  Batch b;
  ASSERT_TRUE(reader.next(10, b));
  ASSERT_EQ(b.size, 3);
  EXPECT_EQ(b.num_dense, 13);
  EXPECT_EQ(b.num_tables, 26);
  EXPECT_TRUE(b.teacher_prob.empty());
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 0}));
  ASSERT_EQ(b.dense.size(), 3u * 13);
  EXPECT_FLOAT_EQ(b.dense[0], 0.0f);
  EXPECT_FLOAT_EQ(b.dense[1], static_cast<float>(std::log1p(1.0)));
  EXPECT_FLOAT_EQ(b.dense[2], 0.0f);
  EXPECT_FLOAT_EQ(b.dense[3], static_cast<float>(std::log1p(1000.0)));
  for (int k = 4; k < 13; ++k) EXPECT_EQ(b.dense[k], 0.0f);       // empty
  for (int k = 0; k < 13; ++k) EXPECT_EQ(b.dense[13 + k], 0.0f);  // all empty
  for (int k = 0; k < 13; ++k)
    EXPECT_FLOAT_EQ(b.dense[26 + k], static_cast<float>(std::log1p(3.0)));

  // CSR: one id per bag, table-major.
  ASSERT_EQ(b.offsets.size(), 26u * 3 + 1);
  for (std::size_t i = 0; i < b.offsets.size(); ++i)
    EXPECT_EQ(b.offsets[i], static_cast<std::int64_t>(i));
  auto id = [&](int t, int ex) { return b.ids[t * 3 + ex]; };
  for (int t = 0; t < 26; ++t) {
    for (int ex = 0; ex < 3; ++ex) {
      EXPECT_GE(id(t, ex), 0);
      EXPECT_LT(id(t, ex), m.tables[t].rows);
    }
  }
  for (int t = 4; t < 26; ++t) EXPECT_EQ(id(t, 0), 0);  // missing -> row 0
  for (int t = 0; t < 26; ++t) EXPECT_EQ(id(t, 1), 0);
  EXPECT_EQ(id(0, 0), id(0, 2));  // same value, same table -> same row
  EXPECT_EQ(id(1, 0), id(1, 2));  // hex is case-insensitive
  EXPECT_FALSE(reader.next(10, b));
  EXPECT_EQ(b.size, 0);
  EXPECT_EQ(b.offsets, std::vector<std::int64_t>{0});
  EXPECT_EQ(reader.lines_read(), 3);
  EXPECT_EQ(reader.bad_lines(), 0);
}

TEST_F(Criteo, SameValueInDifferentTablesUsuallyDiffers) {
  const fs::path p = write("a.tsv", {make_line("0", ints("1"), cats("deadbeef"))});
  CriteoReader reader({p}, criteo_model(1'000'000));
  Batch b;
  ASSERT_TRUE(reader.next(1, b));
  int equal_neighbours = 0;
  for (int t = 1; t < 26; ++t) equal_neighbours += b.ids[t] == b.ids[t - 1];
  EXPECT_EQ(equal_neighbours, 0);
}

TEST_F(Criteo, CategoricalHashIsFrozen) {
  // Golden rows: row = mix64(t << 32 | v) mod rows_t. Trained embeddings depend on it.
  std::vector<std::string> ca = cats("");
  ca[0] = "68fd1e64";
  ca[7] = "DEADBEEF";
  CriteoReader reader({write("a.tsv", {make_line("0", ints(""), ca)})}, criteo_model(1000));
  Batch b;
  ASSERT_TRUE(reader.next(1, b));
  EXPECT_EQ(b.ids[0], 113);  // table 0, 1000 rows
  EXPECT_EQ(b.ids[7], 879);  // table 7, 1007 rows
}

TEST_F(Criteo, CrLfLinesAreAccepted) {
  const fs::path p = write("crlf.tsv", {good_line(0), good_line(1)}, "\r\n");
  CriteoReader reader({p}, criteo_model());
  Batch b;
  ASSERT_TRUE(reader.next(8, b));
  EXPECT_EQ(b.size, 2);
  EXPECT_EQ(reader.bad_lines(), 0);
}

TEST_F(Criteo, BatchesSpanFiles) {
  std::vector<std::string> first, second;
  for (int i = 0; i < 5; ++i) first.push_back(good_line(i));
  for (int i = 5; i < 12; ++i) second.push_back(good_line(i));
  const fs::path a = write("a.tsv", first), b = write("b.tsv", second);
  const fs::path all = write("all.tsv", [&] {
    auto v = first;
    v.insert(v.end(), second.begin(), second.end());
    return v;
  }());
  const ModelSpec m = criteo_model();
  CriteoReader split({a, b}, m), whole({all}, m);
  Batch x, y;
  std::vector<std::int64_t> sizes;
  while (split.next(4, x)) {
    ASSERT_TRUE(whole.next(4, y));
    sizes.push_back(x.size);
    EXPECT_EQ(x.size, y.size);
    EXPECT_EQ(x.labels, y.labels);
    EXPECT_EQ(x.dense, y.dense);
    EXPECT_EQ(x.ids, y.ids);
    EXPECT_EQ(x.offsets, y.offsets);
  }
  EXPECT_FALSE(whole.next(4, y));
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 4, 4}));
  EXPECT_EQ(split.lines_read(), 12);
}

TEST_F(Criteo, ShortLastBatchIsCompacted) {
  std::vector<std::string> lines;
  for (int i = 0; i < 7; ++i) lines.push_back(good_line(i));
  const ModelSpec m = criteo_model();
  CriteoReader big({write("a.tsv", lines)}, m), parts({write("b.tsv", lines)}, m);
  Batch all, part;
  ASSERT_TRUE(big.next(7, all));
  ASSERT_TRUE(parts.next(5, part));
  ASSERT_TRUE(parts.next(5, part));
  ASSERT_EQ(part.size, 2);
  ASSERT_EQ(part.ids.size(), 2u * 26);
  for (int t = 0; t < 26; ++t) {
    for (int ex = 0; ex < 2; ++ex) EXPECT_EQ(part.ids[t * 2 + ex], all.ids[t * 7 + 5 + ex]);
  }
}

TEST_F(Criteo, WrongFieldCount) {
  std::string msg = stop_error({good_line(0), good_line(1) + "\t0"});
  EXPECT_NE(msg.find("bad.tsv:2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("41 tab-separated fields, expected 40"), std::string::npos) << msg;
  msg = stop_error({"1\t2\t3"});
  EXPECT_NE(msg.find("bad.tsv:1: 3 tab-separated fields"), std::string::npos) << msg;
  msg = stop_error({good_line(0), ""});
  EXPECT_NE(msg.find("bad.tsv:2: 1 tab-separated field,"), std::string::npos) << msg;
}

TEST_F(Criteo, BadLabel) {
  for (const std::string label : {"2", "", "-1", "1.0", "yes"}) {
    const std::string msg =
        stop_error({good_line(0), good_line(1), make_line(label, ints("1"), cats("a"))});
    EXPECT_NE(msg.find("bad.tsv:3: bad label"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(field 1 'label'), expected 0 or 1"), std::string::npos) << msg;
  }
}

TEST_F(Criteo, BadInteger) {
  for (const std::string v : {"1.5", "abc", "12x", " 3", "+4", "0x10"}) {
    std::vector<std::string> in = ints("1");
    in[4] = v;  // I5, field 6
    const std::string msg = stop_error({make_line("0", in, cats("a"))});
    EXPECT_NE(msg.find("bad.tsv:1: bad integer feature '" + v + "' (field 6 'I5')"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("expected a decimal integer or an empty field"), std::string::npos) << msg;
  }
  std::vector<std::string> in = ints("1");
  in[12] = "99999999999999999999999";
  const std::string msg = stop_error({make_line("0", in, cats("a"))});
  EXPECT_NE(msg.find("out of range (field 14 'I13')"), std::string::npos) << msg;
}

TEST_F(Criteo, BadCategorical) {
  for (const std::string v : {"xyz", "123456789", "-1", "0x12", "12 ", "g"}) {
    std::vector<std::string> ca = cats("a");
    ca[25] = v;  // C26, field 40
    const std::string msg = stop_error({make_line("1", ints(""), ca)});
    EXPECT_NE(msg.find("bad.tsv:1: bad categorical feature"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(field 40 'C26'), expected 1 to 8 hexadecimal digits"), std::string::npos)
        << msg;
  }
}

TEST_F(Criteo, SkipModeCountsAndContinues) {
  std::vector<std::string> lines;
  for (int i = 0; i < 20; ++i) {
    lines.push_back(good_line(i));
    if (i % 4 == 1) lines.push_back("garbage");  // 5 bad lines
  }
  const fs::path p = write("mixed.tsv", lines);
  CriteoReader reader({p}, criteo_model(), CriteoOptions{OnBadLine::skip, 3});
  Batch b;
  std::int64_t examples = 0;
  while (reader.next(6, b)) examples += b.size;
  EXPECT_EQ(examples, 20);
  EXPECT_EQ(reader.bad_lines(), 5);
  EXPECT_EQ(reader.lines_read(), 25);
  ASSERT_EQ(reader.warnings().size(), 3u);
  EXPECT_NE(reader.warnings()[0].find("mixed.tsv:3: 1 tab-separated field"), std::string::npos)
      << reader.warnings()[0];
  EXPECT_NE(reader.warnings()[1].find("mixed.tsv:8:"), std::string::npos) << reader.warnings()[1];
}

TEST_F(Criteo, StopModeThrowsOnFirstBadLineOfSecondFile) {
  const fs::path a = write("a.tsv", {good_line(0)});
  const fs::path b = write("b.tsv", {good_line(1), make_line("1", ints("x"), cats(""))});
  CriteoReader reader({a, b}, criteo_model());
  Batch x;
  try {
    reader.next(10, x);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("b.tsv:2: bad integer feature 'x' (field 2 'I1')"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(reader.lines_read(), 3);
  EXPECT_EQ(reader.bad_lines(), 1);
}

TEST_F(Criteo, SkipModeWithNoReports) {
  const fs::path p = write("a.tsv", {"junk", good_line(0), "more junk"});
  CriteoReader reader({p}, criteo_model(), CriteoOptions{OnBadLine::skip, 0});
  Batch b;
  ASSERT_TRUE(reader.next(10, b));
  EXPECT_EQ(b.size, 1);
  EXPECT_EQ(reader.bad_lines(), 2);
  EXPECT_TRUE(reader.warnings().empty());
}

TEST_F(Criteo, UnreadableFile) {
  const fs::path missing = dir_ / "missing.tsv";
  try {
    CriteoReader reader({missing}, criteo_model());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.tsv"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CriteoReader({dir_}, criteo_model()), InputError);
  EXPECT_THROW(CriteoReader({}, criteo_model()), InputError);
}

// Files that are not plain TSV are named for what they are, before any line is read: compressed,
// binary, a FIFO (which would block), a device (which would never end); CR-only line endings are
// pointed out where the field count fails.
TEST_F(Criteo, NotPlainTsvIsNamedForWhatItIs) {
  auto error_of = [&](const fs::path& p) {
    try {
      CriteoReader reader({p}, criteo_model());
      Batch b;
      while (reader.next(4, b)) {
      }
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const fs::path gz = dir_ / "day_0.gz";
  std::ofstream(gz, std::ios::binary) << "\x1f\x8b\x08\x00rest of a gzip stream";
  EXPECT_NE(error_of(gz).find("gzip-compressed; decompress it first"), std::string::npos)
      << error_of(gz);
  const fs::path bin = dir_ / "data.bin";
  {
    std::ofstream f(bin, std::ios::binary);
    f << "1\t2";
    f.put('\0');
  }
  EXPECT_NE(error_of(bin).find("NUL bytes"), std::string::npos) << error_of(bin);
  const fs::path fifo = dir_ / "pipe.tsv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(error_of(fifo).find("a FIFO"), std::string::npos) << error_of(fifo);
  EXPECT_NE(error_of("/dev/zero").find("a character device"), std::string::npos);
  EXPECT_NE(error_of(dir_).find("a directory"), std::string::npos);
  const fs::path cr = write("cr.tsv", {good_line(0), good_line(1)}, "\r");
  EXPECT_NE(error_of(cr).find("CR (old Mac) line endings"), std::string::npos) << error_of(cr);
}

TEST_F(Criteo, ModelValidation) {
  const fs::path p = write("a.tsv", {good_line(0)});
  auto message = [&](const ModelSpec& m) -> std::string {
    try {
      CriteoReader reader({p}, m);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  ModelSpec m = criteo_model();
  m.dense_features = 12;
  EXPECT_NE(message(m).find("needs 13 dense features, the model has 12"), std::string::npos)
      << message(m);
  m = criteo_model();
  m.tables.pop_back();
  EXPECT_NE(message(m).find("needs 26 embedding tables, the model has 25"), std::string::npos)
      << message(m);
  m = criteo_model();
  m.tables[7].pooling_size = 3;
  EXPECT_NE(message(m).find("table 'C8' (#7): the Criteo reader needs pooling_size 1"),
            std::string::npos)
      << message(m);
  m = criteo_model();
  m.tables[0].rows = 0;
  EXPECT_NE(message(m).find("rows must be > 0"), std::string::npos) << message(m);
}

TEST_F(Criteo, BadBatchSize) {
  CriteoReader reader({write("a.tsv", {good_line(0)})}, criteo_model());
  Batch b;
  EXPECT_THROW(reader.next(0, b), Error);
}

}  // namespace
}  // namespace parity
