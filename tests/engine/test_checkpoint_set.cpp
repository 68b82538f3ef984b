// Checkpoint sets (parity/checkpoint.h): pieces written one way load another way exactly, a
// rowwise state kept per column range becomes the whole row's state, and a damaged, incomplete or
// foreign set is refused by name. One process writes here (the self communicator) and may hold
// several pieces of a tensor; the mpirun tests write sets from several ranks.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parity/checkpoint.h"
#include "parity/dist.h"
#include "parity/error.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

constexpr float kPoison = 12345.0f;

::testing::AssertionResult says(const std::string& text, const char* start, const char* part) {
  if (text.rfind(start, 0) == 0 && text.find(part) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << text << "' is not '" << start << "...' with '" << part << "'";
}

// Tensors of a model-to-be, their values random, and pieces of them in host buffers.
class CheckpointSet : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("parity-ckptset-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    auto fill = [&](std::vector<float>& v, std::size_t n) {
      v.resize(n);
      for (float& f : v) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        f = static_cast<float>(static_cast<double>(x >> 40) / double(1 << 24)) - 0.5f;
      }
    };
    fill(table_, 10 * 12);
    fill(state_left_, 10);
    fill(state_right_, 10);
    fill(dense_, 7);
    for (float& s : state_left_) s = std::abs(s);
    for (float& s : state_right_) s = std::abs(s);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<CheckpointTensor> tensors() const {
    return {
        {"table", DType::f32, {10, 12}}, {"state", DType::f32, {10}}, {"dense", DType::f32, {7}}};
  }
  // A piece of `name` over rows x cols, its buffer filled from `whole` ([*, of_cols]) or poisoned.
  CheckpointPiece piece(const std::string& name, std::int64_t r0, std::int64_t r1, std::int64_t c0,
                        std::int64_t c1, const std::vector<float>* whole, std::int64_t of_cols) {
    auto& buf = buffers_.emplace_back(static_cast<std::size_t>((r1 - r0) * (c1 - c0)), kPoison);
    if (whole != nullptr)
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c)
          buf[static_cast<std::size_t>((r - r0) * (c1 - c0) + c - c0)] =
              (*whole)[static_cast<std::size_t>(r * of_cols + c)];
    CheckpointPiece p;
    p.name = name;
    p.local = TensorRef{name, DType::f32, {r1 - r0, c1 - c0}, buf.data()};
    p.row_begin = r0;
    p.row_end = r1;
    p.col_begin = c0;
    p.col_end = c1;
    return p;
  }
  // The table split three ways (rows, then columns of the rest), the state kept per column half,
  // the dense tensor whole: written by one rank.
  CheckpointLayout written() {
    CheckpointLayout l{tensors(), {}};
    l.pieces.push_back(piece("table", 0, 4, 0, 12, &table_, 12));
    l.pieces.push_back(piece("table", 4, 10, 0, 5, &table_, 12));
    l.pieces.push_back(piece("table", 4, 10, 5, 12, &table_, 12));
    CheckpointPiece left = piece("state", 0, 10, 0, 1, &state_left_, 1);
    left.state_columns = {0, 6, 12};
    CheckpointPiece right = piece("state", 0, 10, 0, 1, &state_right_, 1);
    right.state_columns = {6, 12, 12};
    l.pieces.push_back(left);
    l.pieces.push_back(right);
    l.pieces.push_back(piece("dense", 0, 7, 0, 1, &dense_, 1));
    return l;
  }
  fs::path write_set(std::int64_t step) {
    auto comm = make_self_communicator();
    return save_checkpoint_set(dir_, step, written(), {{"note", "test"}}, *comm, *cpu_);
  }
  static std::vector<float> values(const CheckpointPiece& p) {
    const auto* f = static_cast<const float*>(p.local.data);
    return {f, f + p.local.elements()};
  }

  fs::path dir_;
  std::unique_ptr<Backend> cpu_ = make_backend("cpu");
  std::vector<float> table_, state_left_, state_right_, dense_;
  std::list<std::vector<float>> buffers_;
};

TEST_F(CheckpointSet, PiecesLoadUnderAnotherShardingExactly) {
  const fs::path set = write_set(5);
  EXPECT_EQ(set, checkpoint_set_path(dir_, 5));
  EXPECT_EQ(read_checkpoint_metadata(set).at("note"), "test");
  // Columns split elsewhere, over every row; the state as one process keeps it; a row range of
  // the dense tensor with a replica that is not written.
  CheckpointLayout into{tensors(), {}};
  into.pieces.push_back(piece("table", 0, 10, 0, 3, nullptr, 0));
  into.pieces.push_back(piece("table", 0, 10, 3, 12, nullptr, 0));
  into.pieces.push_back(piece("state", 0, 10, 0, 1, nullptr, 0));
  into.pieces.push_back(piece("dense", 2, 7, 0, 1, nullptr, 0));
  into.pieces.back().write = false;
  load_checkpoint(set, into, *cpu_, TensorValues::finite);
  for (int k = 0; k < 2; ++k) {
    const CheckpointPiece& p = into.pieces[static_cast<std::size_t>(k)];
    const std::vector<float> got = values(p);
    for (std::int64_t r = 0; r < 10; ++r)
      for (std::int64_t c = p.col_begin; c < p.col_end; ++c)
        ASSERT_EQ(got[static_cast<std::size_t>(r * (p.col_end - p.col_begin) + c - p.col_begin)],
                  table_[static_cast<std::size_t>(r * 12 + c)])
            << "table (" << r << ", " << c << ")";
  }
  // The whole row's state: the column-weighted mean of the halves' states.
  const std::vector<float> state = values(into.pieces[2]);
  for (std::size_t r = 0; r < 10; ++r)
    EXPECT_EQ(state[r], static_cast<float>(0.5 * state_left_[r] + 0.5 * state_right_[r])) << r;
  const std::vector<float> dense = values(into.pieces[3]);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(dense[i], dense_[i + 2]);
}

TEST_F(CheckpointSet, AStateOfTheSameColumnsLoadsAsWritten) {
  const fs::path set = write_set(5);
  CheckpointLayout into{tensors(), {}};
  into.pieces.push_back(piece("state", 3, 10, 0, 1, nullptr, 0));
  into.pieces.back().state_columns = {6, 12, 12};
  // Column shards of another split: within the left half, its state; across both halves, their
  // states weighted by the columns each shares (2 of 6 left, 4 right).
  into.pieces.push_back(piece("state", 0, 10, 0, 1, nullptr, 0));
  into.pieces.back().state_columns = {0, 4, 12};
  into.pieces.push_back(piece("state", 0, 10, 0, 1, nullptr, 0));
  into.pieces.back().state_columns = {4, 10, 12};
  load_checkpoint(set, into, *cpu_);
  const std::vector<float> same = values(into.pieces[0]), inside = values(into.pieces[1]),
                           across = values(into.pieces[2]);
  for (std::size_t r = 3; r < 10; ++r) EXPECT_EQ(same[r - 3], state_right_[r]) << r;
  for (std::size_t r = 0; r < 10; ++r) {
    EXPECT_EQ(inside[r], state_left_[r]) << r;
    EXPECT_EQ(across[r],
              static_cast<float>(2.0 / 6.0 * state_left_[r] + 4.0 / 6.0 * state_right_[r]))
        << r;
  }
}

TEST_F(CheckpointSet, ASetLoadsIntoOneProcessAndBack) {
  const fs::path set = write_set(5);
  // One process: whole tensors, written as a single file, read back into the three-way split.
  std::vector<float> t(120, kPoison), s(10, kPoison), d(7, kPoison);
  const std::vector<TensorRef> whole = {{"table", DType::f32, {10, 12}, t.data()},
                                        {"state", DType::f32, {10}, s.data()},
                                        {"dense", DType::f32, {7}, d.data()}};
  load_checkpoint(set, whole_tensor_layout(whole), *cpu_);
  EXPECT_EQ(t, table_);
  EXPECT_EQ(d, dense_);
  const fs::path file = checkpoint_path(dir_, 6);
  save_safetensors(file, whole, {}, *cpu_);
  CheckpointLayout back = written();
  for (CheckpointPiece& p : back.pieces)
    std::fill_n(static_cast<float*>(p.local.data), p.local.elements(), kPoison);
  load_checkpoint(file, back, *cpu_);
  EXPECT_EQ(values(back.pieces[1]), values(written().pieces[1]));
  EXPECT_EQ(values(back.pieces[2]), values(written().pieces[2]));
  // Each half of a state split by columns starts from the whole row's state.
  EXPECT_EQ(values(back.pieces[3]), s);
  EXPECT_EQ(values(back.pieces[4]), s);
  EXPECT_EQ((std::vector<std::int64_t>{5, 6}), list_checkpoints(dir_));
  EXPECT_EQ(find_checkpoint(dir_, 5), set);
  EXPECT_EQ(find_checkpoint(dir_, 6), file);
}

TEST_F(CheckpointSet, DamagedIncompleteAndForeignSetsAreRefusedByName) {
  const fs::path set = write_set(5);
  const fs::path rank0 = set / "rank-00000-of-00001.safetensors";
  auto load = [&](const fs::path& path) {
    CheckpointLayout into{tensors(), {}};
    into.pieces.push_back(piece("table", 0, 10, 0, 12, nullptr, 0));
    into.pieces.push_back(piece("state", 0, 10, 0, 1, nullptr, 0));
    into.pieces.push_back(piece("dense", 0, 7, 0, 1, nullptr, 0));
    try {
      load_checkpoint(path, into, *cpu_);
    } catch (const CheckpointCorrupt& e) {
      return std::string("corrupt: ") + e.what();
    } catch (const InputError& e) {
      return std::string("input: ") + e.what();
    }
    return std::string("(loaded)");
  };
  EXPECT_EQ(load(set), "(loaded)");
  // A flipped bit in the data.
  const auto size = fs::file_size(rank0);
  {
    std::fstream f(rank0, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 3));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(static_cast<std::streamoff>(size - 3));
    f.write(&c, 1);
  }
  EXPECT_TRUE(says(load(set), "corrupt: ", "its bytes are damaged"));
  // The file of another set at the same name.
  const fs::path other = write_set(7);
  fs::copy_file(other / "rank-00000-of-00001.safetensors", rank0,
                fs::copy_options::overwrite_existing);
  EXPECT_TRUE(says(load(set), "corrupt: ", "of another set"));
  // A missing file, an index edited by hand.
  fs::remove(rank0);
  EXPECT_TRUE(says(load(set), "corrupt: ", "missing from its set"));
  {
    std::string text;
    std::ifstream in(other / "index.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
    text.replace(text.find("\"rows\""), 6, "\"ROWS\"");
    std::ofstream(other / "index.json") << text;
  }
  EXPECT_TRUE(says(load(other), "corrupt: ", "index.json has checksum"));
  fs::remove(other / "index.json");
  EXPECT_TRUE(says(load(other), "corrupt: ", "the set is incomplete"));
}

TEST_F(CheckpointSet, AnotherModelIsRefusedBeforeAnythingLoads) {
  const fs::path set = write_set(5);
  CheckpointLayout into{
      {{"table", DType::f32, {10, 16}}, {"state", DType::f32, {10}}, {"dense", DType::f32, {7}}},
      {}};
  into.pieces.push_back(piece("dense", 0, 7, 0, 1, nullptr, 0));
  try {
    load_checkpoint(set, into, *cpu_);
    FAIL() << "loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'table' is fp32[10, 12], the model expects "
                                         "fp32[10, 16]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(values(into.pieces[0]), std::vector<float>(7, kPoison));
}

TEST_F(CheckpointSet, ANonFiniteValueWritesNoSetAndAHalfWrittenSetIsNotListed) {
  table_[17] = std::nanf("");
  auto comm = make_self_communicator();
  EXPECT_THROW(save_checkpoint_set(dir_, 9, written(), {}, *comm, *cpu_, TensorValues::finite),
               NumericalError);
  EXPECT_FALSE(fs::exists(checkpoint_set_path(dir_, 9)));
  EXPECT_TRUE(list_checkpoints(dir_).empty());
  // What a crash leaves: a partial directory, never listed, replaced by the next write.
  fs::create_directories(dir_ / ".step-9.partial");
  std::ofstream(dir_ / ".step-9.partial" / "rank-00000-of-00001.safetensors") << "torn";
  EXPECT_TRUE(list_checkpoints(dir_).empty());
  table_[17] = 0.25f;
  save_checkpoint_set(dir_, 9, written(), {}, *comm, *cpu_, TensorValues::finite);
  EXPECT_EQ(std::vector<std::int64_t>{9}, list_checkpoints(dir_));
  EXPECT_FALSE(fs::exists(dir_ / ".step-9.partial"));
  // Pruned like files, with what a crash left of another step's set.
  fs::create_directories(dir_ / ".step-3.partial");
  write_set(10);
  write_set(11);
  prune_checkpoints(dir_, 2);
  EXPECT_EQ((std::vector<std::int64_t>{10, 11}), list_checkpoints(dir_));
  EXPECT_FALSE(fs::exists(checkpoint_set_path(dir_, 9)));
  EXPECT_FALSE(fs::exists(dir_ / ".step-3.partial"));
}

}  // namespace
}  // namespace parity
