// What both shard formats (DLRM's shards.cpp, HSTU's sequence_shards.cpp) read files and
// meta.json with: a descriptor closed when it goes, part files opened without blocking on a FIFO,
// reads at an offset that name the file on a short read, a file's identity checked again for each
// batch, and meta.json fields that name their path in every error.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace parity::shard_io {

// An open file descriptor, closed when it goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens a part file for reading; a FIFO or a device in its place is refused before it is opened
// (opening a FIFO blocks until a writer comes; a device never ends).
Fd open_regular(const std::filesystem::path& path);

// A part file as its reader checked it when opening it.
struct PartFile {
  std::filesystem::path path;
  std::size_t bytes = 0;
  dev_t device = 0;  // its identity: a file rewritten since is refused
  ino_t inode = 0;

  // Opens the file and records its size and identity.
  Fd open_and_stat();
  // n bytes at offset into dst; a short read (the file shrank) is an InputError naming the file.
  void read_at(const Fd& fd, std::uint64_t offset, void* dst, std::size_t n) const;
  // Opens the file again for a batch: it must still be the file that was checked, at its size.
  Fd reopen() const;
};

// meta.json's fields, each read with its path in the message ("splits.train.files[2].examples").
class MetaField {
 public:
  MetaField(const nlohmann::json& j, std::string file, std::string path)
      : j_(j), file_(std::move(file)), path_(std::move(path)) {}
  MetaField operator[](const std::string& key) const;
  std::size_t size() const;
  MetaField operator[](std::size_t i) const;
  std::int64_t integer() const;
  std::string text() const;
  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  [[noreturn]] void fail(const std::string& message) const;

 private:
  std::string sub(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string kind() const { return j_.dump().substr(0, 40); }
  const nlohmann::json& j_;
  std::string file_, path_;
};

// A dataset's meta.json, parsed (an InputError naming it when it is missing or not a JSON object).
nlohmann::json read_meta(const std::filesystem::path& dir);

// The file name of a split's part file as meta.json lists it, checked to stay in the directory.
std::string part_file_name(const MetaField& entry);

// Where a reader is in a split's part files (their example counts in order): seek and the
// pieces the next batch reads, wrapping into the next epoch where asked.
class SplitCursor {
 public:
  struct Piece {
    std::size_t file;
    std::int64_t first, count;  // examples of that file
  };
  void add_file(std::int64_t examples);
  std::int64_t examples() const { return total_; }
  std::int64_t epoch() const { return epoch_; }
  // Continues from example `example`: with wrap, epochs repeat the split (the position taken
  // modulo its size, the epoch counted); without, a position at or past the end leaves nothing.
  void seek(std::int64_t example, bool wrap);
  // The pieces of the next batch_size examples (fewer at the end of one pass), advancing.
  std::vector<Piece> take(std::int64_t batch_size, bool wrap);

 private:
  std::vector<std::int64_t> sizes_;
  std::int64_t total_ = 0;
  std::size_t file_ = 0;
  std::int64_t pos_ = 0;
  std::int64_t epoch_ = 0;
};

// A split's part files as a writer made them: name and examples, in order.
using PartList = std::vector<std::pair<std::string, std::int64_t>>;

// Writes a dataset's meta.json (atomically, last): `meta` with "splits" added, per split its
// examples and part files.
void write_meta(const std::filesystem::path& dir, nlohmann::json meta, const PartList& train,
                const PartList& eval);

// Makes a new dataset's directory: refused where one is already (its meta.json).
void create_dataset_dir(const std::filesystem::path& dir);

// "train" or "eval": the part files' prefix and meta.json's key.
inline const char* split_name(bool train) {
  return train ? "train" : "eval";
}

constexpr std::uint64_t align8(std::uint64_t x) {
  return (x + 7) / 8 * 8;
}

}  // namespace parity::shard_io
