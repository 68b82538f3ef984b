#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "micro_model.h"
#include "parity/checkpoint.h"
#include "parity/error.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("parity-ckpt-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The message of the E that f throws ("(no E)" where it throws none).
template <class E = InputError>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error of the expected type)";
}

TEST_F(Checkpoint, RoundTripIsExactAndReadableAsSafetensors) {
  auto backend = make_backend("cpu");
  const ModelSpec spec = testing::micro_model(InteractionKind::dcnv2, OptimizerKind::adagrad,
                                              OptimizerKind::adam, 0.1);
  Model a(spec, *backend, 8, 1), b(spec, *backend, 8, 2);
  // Train a step first: optimizer state starts at zero in both models, so without it a loader
  // that skipped the state would pass.
  SyntheticData data(spec, 1);
  Batch batch;
  data.batch(Split::train, 0, 8, batch);
  a.train_step(batch);
  for (const auto& t : a.tensors()) {
    if (t.name.rfind("optimizer.", 0) != 0) continue;
    const auto* v = static_cast<const float*>(t.data);
    EXPECT_TRUE(std::any_of(v, v + t.elements(), [](float x) { return x != 0.0f; })) << t.name;
  }
  const fs::path file = checkpoint_path(dir_, 3);
  save_safetensors(file, a.tensors(), {{"step", "3"}}, *backend);
  EXPECT_FALSE(fs::exists(file.string() + ".tmp"));

  // The file follows the safetensors layout: u64 header size, JSON, 8-byte aligned data.
  std::ifstream in(file, std::ios::binary);
  std::uint64_t hs = 0;
  in.read(reinterpret_cast<char*>(&hs), 8);
  EXPECT_EQ((8 + hs) % 8, 0u);
  std::string h(hs, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hs));
  const auto j = nlohmann::json::parse(h);
  EXPECT_EQ(j["__metadata__"]["step"], "3");
  EXPECT_EQ(j["embedding.t1.weight"]["dtype"], "F32");
  EXPECT_EQ(j["embedding.t1.weight"]["shape"], nlohmann::json::array({13, 4}));

  const auto meta = load_safetensors(file, b.tensors(), *backend);
  EXPECT_EQ(meta.at("step"), "3");
  auto ta = a.tensors(), tb = b.tensors();
  for (std::size_t i = 0; i < ta.size(); ++i)
    EXPECT_EQ(std::memcmp(ta[i].data, tb[i].data, ta[i].bytes()), 0) << ta[i].name;
}

TEST_F(Checkpoint, ListAndPrune) {
  auto backend = make_backend("cpu");
  Model m(testing::micro_model(InteractionKind::dot), *backend, 8, 1);
  for (int s : {10, 2, 30}) save_safetensors(checkpoint_path(dir_, s), m.tensors(), {}, *backend);
  std::ofstream(dir_ / "step-40.safetensors.tmp") << "torn";
  std::ofstream(dir_ / "notes.txt") << "x";
  EXPECT_EQ(list_checkpoints(dir_), (std::vector<std::int64_t>{2, 10, 30}));
  prune_checkpoints(dir_, 2);
  EXPECT_EQ(list_checkpoints(dir_), (std::vector<std::int64_t>{10, 30}));
  EXPECT_TRUE(list_checkpoints(dir_ / "absent").empty());
}

TEST_F(Checkpoint, BadFilesGiveClearErrorsAndLeaveTheModelUntouched) {
  auto backend = make_backend("cpu");
  const ModelSpec spec = testing::micro_model(InteractionKind::dot);
  Model m(spec, *backend, 8, 1);
  const fs::path good = checkpoint_path(dir_, 1);
  save_safetensors(good, m.tensors(), {}, *backend);
  const auto size = fs::file_size(good);

  // Truncated data section.
  const fs::path trunc = dir_ / "trunc.safetensors";
  fs::copy_file(good, trunc);
  fs::resize_file(trunc, size - 16);
  std::string msg = message_of([&] { load_safetensors(trunc, m.tensors(), *backend); });
  EXPECT_NE(msg.find("trunc.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  // Too short for a header, header size beyond the file, header not JSON.
  const fs::path tiny = dir_ / "tiny.safetensors";
  std::ofstream(tiny) << "abc";
  EXPECT_NE(message_of([&] { read_safetensors_header(tiny); }).find("too short"),
            std::string::npos);
  const fs::path huge = dir_ / "huge.safetensors";
  {
    std::ofstream o(huge, std::ios::binary);
    const std::uint64_t hs = 1000;
    o.write(reinterpret_cast<const char*>(&hs), 8);
    o << "{}";
  }
  EXPECT_NE(message_of([&] { read_safetensors_header(huge); }).find("does not fit"),
            std::string::npos);
  const fs::path garbage = dir_ / "garbage.safetensors";
  {
    std::ofstream o(garbage, std::ios::binary);
    const std::uint64_t hs = 4;
    o.write(reinterpret_cast<const char*>(&hs), 8);
    o << "{{{{";
  }
  EXPECT_NE(message_of([&] { read_safetensors_header(garbage); }).find("not a JSON object"),
            std::string::npos);

  // A checkpoint of another model: shape mismatch names the tensor; nothing is loaded.
  Model other(testing::micro_model(InteractionKind::dcnv2), *backend, 8, 9);
  const auto before = other.tensors();
  std::vector<std::vector<char>> copy;
  for (const auto& t : before)
    copy.emplace_back(static_cast<char*>(t.data), static_cast<char*>(t.data) + t.bytes());
  msg = message_of([&] { load_safetensors(good, other.tensors(), *backend); });
  EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
  for (std::size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(std::memcmp(before[i].data, copy[i].data(), before[i].bytes()), 0);

  // A shape whose element count wraps past 2^64 (and so matched an empty byte range).
  const fs::path wrap = dir_ / "wrap.safetensors";
  {
    std::string h = R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');
    std::ofstream o(wrap, std::ios::binary);
    const std::uint64_t hs = h.size();
    o.write(reinterpret_cast<const char*>(&hs), 8);
    o << h;
  }
  EXPECT_NE(message_of([&] { read_safetensors_header(wrap); }).find("holds more elements"),
            std::string::npos)
      << message_of([&] { read_safetensors_header(wrap); });

  // A directory or a FIFO in a checkpoint's place.
  fs::create_directory(dir_ / "step-9.safetensors");
  EXPECT_NE(message_of([&] {
              read_safetensors_header(dir_ / "step-9.safetensors");
            }).find("it is a directory"),
            std::string::npos);
  ASSERT_EQ(::mkfifo((dir_ / "fifo.safetensors").c_str(), 0644), 0);
  EXPECT_NE(message_of([&] { read_safetensors_header(dir_ / "fifo.safetensors"); }).find("FIFO"),
            std::string::npos);

  // Missing file.
  EXPECT_NE(
      message_of([&] { read_safetensors_header(dir_ / "nope.safetensors"); }).find("cannot read"),
      std::string::npos);
}

// Reads the byte at offset of a file, xors it with mask and writes it back.
void flip(const fs::path& file, std::uint64_t offset, char mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Every tensor and the header carry a CRC-32C; one flipped bit anywhere in them is found on load
// (in a tensor's data, a digit of a shape, a byte of the metadata).
TEST_F(Checkpoint, ChecksumsFindAFlippedBitAnywhere) {
  auto backend = make_backend("cpu");
  Model m(testing::micro_model(InteractionKind::dcnv2), *backend, 8, 1);
  const fs::path good = checkpoint_path(dir_, 1);
  save_safetensors(good, m.tensors(), {{"note", "x"}}, *backend);
  const SafetensorsHeader h = read_safetensors_header(good);
  EXPECT_EQ(h.metadata.at("crc32c.embedding.t1.weight").rfind("crc32c:", 0), 0u);
  EXPECT_NE(h.metadata.at("header_crc32c"), "crc32c:00000000");
  load_safetensors(good, m.tensors(), *backend);  // intact: loads

  for (const auto& [name, e] : h.tensors) {
    const fs::path bad = dir_ / "bad.safetensors";
    fs::copy_file(good, bad, fs::copy_options::overwrite_existing);
    flip(bad, h.data_offset + e.end - 1, 0x01);
    const std::string msg =
        message_of<CheckpointCorrupt>([&] { load_safetensors(bad, m.tensors(), *backend); });
    EXPECT_NE(msg.find("tensor '" + name + "' has checksum"), std::string::npos) << msg;
  }
  // The header: a shape digit that still parses ([13, 4] -> [13, 5] would be caught by the byte
  // ranges; the metadata's value is checked by the checksum alone).
  std::ifstream in(good, std::ios::binary);
  std::string raw(h.data_offset, '\0');
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  const std::size_t at = raw.find("\"note\":\"x\"");
  ASSERT_NE(at, std::string::npos);
  const fs::path bad = dir_ / "bad-header.safetensors";
  fs::copy_file(good, bad);
  flip(bad, at + 8, 'x' ^ 'y');
  const std::string msg = message_of<CheckpointCorrupt>([&] { read_safetensors_header(bad); });
  EXPECT_NE(msg.find("header's checksum"), std::string::npos) << msg;
  // A truncated file is damage too (an older checkpoint may be good).
  fs::resize_file(bad, 20);
  EXPECT_NE(message_of<CheckpointCorrupt>([&] { read_safetensors_header(bad); }),
            "(no error of the expected type)");
}

// With TensorValues::finite a NaN or an infinity is never written: the file at the path stays as
// it was, and no temporary is left; on load, such a value is refused naming the tensor.
TEST_F(Checkpoint, NonFiniteValuesAreNeverWrittenOverAGoodCheckpoint) {
  auto backend = make_backend("cpu");
  Model m(testing::micro_model(InteractionKind::dot), *backend, 8, 1);
  const fs::path file = checkpoint_path(dir_, 5);
  save_safetensors(file, m.tensors(), {}, *backend, TensorValues::finite);
  std::ifstream before_in(file, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(before_in)), {});
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    auto t = m.tensors().back();
    float* v = static_cast<float*>(t.data);
    const float keep = v[t.elements() - 1];
    v[t.elements() - 1] = bad;
    try {
      save_safetensors(file, m.tensors(), {}, *backend, TensorValues::finite);
      FAIL() << "a non-finite value was written";
    } catch (const NumericalError& e) {
      EXPECT_NE(std::string(e.what()).find("tensor '" + t.name + "'"), std::string::npos)
          << e.what();
    }
    std::ifstream after_in(file, std::ios::binary);
    const std::string after((std::istreambuf_iterator<char>(after_in)), {});
    EXPECT_TRUE(before == after) << "the good checkpoint changed";
    EXPECT_FALSE(fs::exists(file.string() + ".tmp"));
    // Written without the check, it is refused on a finite load.
    const fs::path nan_file = dir_ / "nan.safetensors";
    save_safetensors(nan_file, m.tensors(), {}, *backend);
    const std::string msg = message_of<CheckpointCorrupt>(
        [&] { load_safetensors(nan_file, m.tensors(), *backend, false, TensorValues::finite); });
    EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
    v[t.elements() - 1] = keep;
  }
}

TEST_F(Checkpoint, NamesItDoesNotWriteAreNotCheckpointsAndDamagedOnesAreSetAside) {
  auto backend = make_backend("cpu");
  Model m(testing::micro_model(InteractionKind::dot), *backend, 8, 1);
  save_safetensors(checkpoint_path(dir_, 7), m.tensors(), {}, *backend);
  fs::copy_file(checkpoint_path(dir_, 7), dir_ / "step-0200.safetensors");
  EXPECT_EQ(list_checkpoints(dir_), (std::vector<std::int64_t>{7}));
  const fs::path aside = set_aside_checkpoint(checkpoint_path(dir_, 7));
  EXPECT_EQ(aside.filename(), "step-7.safetensors.corrupt");
  EXPECT_TRUE(list_checkpoints(dir_).empty());
  EXPECT_THROW(prune_checkpoints(dir_, 0), Error);
}

TEST_F(Checkpoint, ADirectoryIsHeldByOneRunAtATime) {
  {
    const CheckpointDirLock first(dir_ / "runs");
    try {
      const CheckpointDirLock second(dir_ / "runs");
      FAIL() << "locked twice";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("(process {})", ::getpid())),
                std::string::npos)
          << e.what();
    }
  }
  const CheckpointDirLock again(dir_ / "runs");  // released with its holder
  std::ofstream(dir_ / "file") << "x";
  EXPECT_THROW(CheckpointDirLock(dir_ / "file"), InputError);
}

}  // namespace
}  // namespace parity
