// What the fuzz targets share: the rule for what a reader may throw, a check that ends the
// process on a broken promise, and a temporary directory for the readers that take a path.
#pragma once

#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "parity/data.h"
#include "parity/error.h"

namespace parity::fuzz {

// A reader refusing bad input with parity::Error (InputError included) is correct behaviour. Any
// other exception escaping is a finding: reported and aborted, so that libFuzzer keeps the input.
template <class F>
void run_reader(F&& read) {
  try {
    read();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s escaped the reader: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

// A promise of the reader's interface broken on an input it accepted: a finding.
inline void check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz: the reader accepted an input that breaks: %s\n", what);
    std::abort();
  }
}

inline void remove_temp_dir();

// A directory of this process's own under $TMPDIR (or /tmp), made on first use and removed at
// exit: libFuzzer may run several processes side by side (-jobs, -fork).
inline const std::filesystem::path& temp_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/parity-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    return std::filesystem::path(pattern);
  }();
  // Registered after dir is made, so it runs before dir is destroyed.
  static const bool removed_at_exit = std::atexit(remove_temp_dir) == 0;
  (void)removed_at_exit;
  return dir;
}

inline void remove_temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(temp_dir(), ec);
}

// Empties temp_dir(), so that one input's files do not leak into the next.
inline void clear_temp_dir() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(temp_dir(), ec))
    std::filesystem::remove_all(entry.path(), ec);
}

// Writes bytes to temp_dir()/name, replacing the file, and returns its path.
inline std::filesystem::path write_file(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = temp_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A dataset given as a small archive (the shard targets' input): meta.json's text, then for each
// part file a line "@@file NAME" and the file's bytes, up to the next such line. Written into
// temp_dir(); a name that is not a plain file name is skipped (a dataset's meta.json may name any
// path, but the archive writes only into its own directory).
inline void write_archive(std::string_view in) {
  constexpr std::string_view kMarker = "\n@@file ";
  const auto plain = [](std::string_view name) {
    if (name.empty() || name.size() > 64 || name.front() == '.' || name == "meta.json")
      return false;
    for (const char c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
        return false;
    return true;
  };
  std::size_t at = in.find(kMarker);
  write_file("meta.json", in.substr(0, at));
  while (at != std::string_view::npos) {
    const std::size_t name_at = at + kMarker.size();
    const std::size_t name_end = in.find('\n', name_at);
    if (name_end == std::string_view::npos) break;
    at = in.find(kMarker, name_end);
    const std::string_view name = in.substr(name_at, name_end - name_at);
    const std::string_view bytes =
        in.substr(name_end + 1, at == std::string_view::npos ? at : at - (name_end + 1));
    if (plain(name)) write_file(std::string(name), bytes);
  }
}

// Reads a split of the dataset in temp_dir() through with a shard reader (ShardReader or
// SequenceShardReader), in batches that cross file ends, then again after seeks with and without
// wrapping; each batch goes to check_batch(batch, most examples).
template <class Reader, class Model, class CheckBatch>
void read_dataset_split(const Model& model, Split split, CheckBatch check_batch) {
  run_reader([&] {
    Reader reader(temp_dir(), model, split);
    Batch b;
    constexpr std::int64_t kBatch = 5;  // not a divisor of the seeds' part sizes
    std::int64_t seen = 0;
    while (reader.next(kBatch, b)) {
      check_batch(b, kBatch);
      seen += b.size;
    }
    check(seen == reader.examples(), "one pass reads every example once");
    if (reader.examples() == 0) return;
    reader.seek(reader.examples() + 3);  // wraps into the second epoch
    for (int i = 0; i < 3 && reader.next(kBatch + 2, b, true); ++i) check_batch(b, kBatch + 2);
    reader.seek(reader.examples(), false);
    check(!reader.next(kBatch, b), "nothing is left after the end");
  });
}

}  // namespace parity::fuzz
