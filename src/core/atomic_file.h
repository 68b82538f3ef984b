// Writing a file so that a reader sees the old contents or the new, never a torn one: the bytes
// go to PATH.tmp, which is synced and renamed over PATH, and the directory is synced so the
// rename survives a crash. Destroyed without commit(), the temporary is removed. Checkpoints and
// shard datasets are written this way (a crash or a full disk must never lose the file that was
// there).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace parity {

class AtomicFile {
 public:
  // what names the file in errors ("checkpoint", "shard file"). Throws Error when the temporary
  // cannot be created.
  AtomicFile(std::filesystem::path path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  // Writes over bytes already written, at offset from the start (a header completed once the data
  // after it is known).
  void write_at(std::size_t offset, const void* data, std::size_t bytes);
  // Syncs, renames the temporary to the path and syncs the directory.
  void commit();
  const std::filesystem::path& temporary() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& doing);
  std::filesystem::path path_, tmp_;
  std::string what_;
  int fd_ = -1;
};

}  // namespace parity
