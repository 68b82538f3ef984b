// Shared file and meta.json reading of the shard formats (shard_io.h).
#include "shard_io.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/atomic_file.h"
#include "core/input_file.h"
#include "parity/error.h"

namespace parity::shard_io {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd open_regular(const std::filesystem::path& path) {
  require_regular_file(path, "shard file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw InputError(
        fmt::format("cannot read shard file '{}': {}", path.string(), std::strerror(errno)));
  return Fd(fd);
}

Fd PartFile::open_and_stat() {
  Fd fd = open_regular(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw InputError(fmt::format("cannot stat '{}': {}", path.string(), std::strerror(errno)));
  bytes = static_cast<std::size_t>(st.st_size);
  device = st.st_dev;
  inode = st.st_ino;
  return fd;
}

void PartFile::read_at(const Fd& fd, std::uint64_t offset, void* dst, std::size_t n) const {
  auto* c = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd.get(), c, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw InputError(fmt::format(
          "'{}': cannot read {} bytes at offset {}: {} (it was {} bytes when training opened "
          "it: was it truncated or rewritten while being read?)",
          path.string(), n, offset, r < 0 ? std::strerror(errno) : "end of file", bytes));
    c += r;
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::size_t>(r);
  }
}

Fd PartFile::reopen() const {
  Fd fd = open_regular(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_dev != device || st.st_ino != inode ||
      static_cast<std::size_t>(st.st_size) != bytes)
    throw InputError(fmt::format(
        "'{}' changed since training opened it ({} bytes, was {}): the dataset was rewritten "
        "or truncated while being read",
        path.string(), static_cast<std::int64_t>(st.st_size), bytes));
  return fd;
}

MetaField MetaField::operator[](const std::string& key) const {
  if (!j_.is_object()) fail(fmt::format("expected an object with '{}', got {}", key, kind()));
  if (!j_.contains(key))
    throw InputError(fmt::format("'{}': field '{}' is missing", file_, sub(key)));
  return MetaField(j_.at(key), file_, sub(key));
}

std::size_t MetaField::size() const {
  if (!j_.is_array()) fail(fmt::format("expected a list, got {}", kind()));
  return j_.size();
}

MetaField MetaField::operator[](std::size_t i) const {
  return MetaField(j_.at(i), file_, fmt::format("{}[{}]", path_, i));
}

std::int64_t MetaField::integer() const {
  if (!j_.is_number_integer()) fail(fmt::format("expected an integer, got {}", kind()));
  return j_.get<std::int64_t>();
}

std::string MetaField::text() const {
  if (!j_.is_string()) fail(fmt::format("expected a string, got {}", kind()));
  return j_.get<std::string>();
}

void MetaField::fail(const std::string& message) const {
  throw InputError(fmt::format("'{}': field '{}': {}", file_, path_, message));
}

nlohmann::json read_meta(const std::filesystem::path& dir) {
  const auto meta_path = dir / "meta.json";
  std::error_code ec;
  if (!std::filesystem::exists(meta_path, ec))
    throw InputError(fmt::format("cannot read '{}': not a parity shard dataset (no meta.json)",
                                 meta_path.string()));
  nlohmann::json j = nlohmann::json::parse(
      read_input_file(meta_path, "dataset description", std::size_t{64} << 20), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw InputError(
        fmt::format("'{}': not valid JSON, or not a JSON object (parity data synth "
                    "and parity data convert write it; was it edited?)",
                    meta_path.string()));
  return j;
}

std::string part_file_name(const MetaField& entry) {
  const std::string name = entry["file"].text();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    entry["file"].fail(fmt::format("'{}' is not a file name in the dataset's directory", name));
  return name;
}

void SplitCursor::add_file(std::int64_t examples) {
  sizes_.push_back(examples);
  total_ += examples;
}

void SplitCursor::seek(std::int64_t example, bool wrap) {
  if (example < 0)
    throw InputError(fmt::format("seeking a shard dataset to a negative example {}", example));
  file_ = 0;
  pos_ = 0;
  epoch_ = 0;
  if (total_ == 0) return;
  if (!wrap && example >= total_) {  // one pass, already consumed: nothing left
    file_ = sizes_.size();
    return;
  }
  if (example > 0 && example % total_ == 0) {
    // At the end of a pass, as reading up to here leaves the cursor: the next take starts the
    // next epoch and counts it.
    epoch_ = example / total_ - 1;
    file_ = sizes_.size();
    return;
  }
  epoch_ = example / total_;
  example %= total_;
  while (example >= sizes_[file_]) example -= sizes_[file_++];
  pos_ = example;
}

std::vector<SplitCursor::Piece> SplitCursor::take(std::int64_t batch_size, bool wrap) {
  if (batch_size <= 0) throw InputError("batch size must be positive");
  std::vector<Piece> pieces;
  std::int64_t need = batch_size;
  while (need > 0) {
    if (file_ >= sizes_.size()) {
      if (!wrap || total_ == 0) break;
      file_ = 0;
      pos_ = 0;
      ++epoch_;
    }
    const std::int64_t take = std::min(need, sizes_[file_] - pos_);
    pieces.push_back({file_, pos_, take});
    need -= take;
    pos_ += take;
    if (pos_ == sizes_[file_]) {
      ++file_;
      pos_ = 0;
    }
  }
  return pieces;
}

void write_meta(const std::filesystem::path& dir, nlohmann::json meta, const PartList& train,
                const PartList& eval) {
  for (const bool is_train : {true, false}) {
    auto files = nlohmann::json::array();
    std::int64_t total = 0;
    for (const auto& [name, n] : is_train ? train : eval) {
      files.push_back({{"file", name}, {"examples", n}});
      total += n;
    }
    meta["splits"][split_name(is_train)] = {{"examples", total}, {"files", files}};
  }
  const std::string text = fmt::format("{}\n", meta.dump(2));
  AtomicFile f(dir / "meta.json", "dataset description");
  f.write(text.data(), text.size());
  f.commit();
}

void create_dataset_dir(const std::filesystem::path& dir) {
  if (std::filesystem::exists(dir / "meta.json"))
    throw InputError(fmt::format("'{}' already holds a dataset (meta.json); choose a new directory",
                                 dir.string()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw InputError(
        fmt::format("cannot create the dataset directory '{}': {}", dir.string(), ec.message()));
}

}  // namespace parity::shard_io
