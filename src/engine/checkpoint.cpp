// safetensors writer and reader. Tensors are streamed through a bounded host
// buffer so that a checkpoint of a 100 GB table set needs no 100 GB of host memory,
// and every read is bounds-checked against the file so that a truncated or corrupt
// checkpoint gives a message, not a crash.
#include "parity/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/input_file.h"
#include "engine/nonfinite.h"
#include "parity/error.h"

namespace parity {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kChunk = std::size_t{64} << 20;           // host staging buffer
constexpr std::uint64_t kMaxHeader = std::uint64_t{100} << 20;  // safetensors' own limit
const std::string kTensorCrcPrefix = "crc32c.";
const std::string kHeaderCrcKey = "header_crc32c";
const std::string kNoCrc = crc32c_text(0);

std::string sys_error() {
  return std::strerror(errno);
}

}  // namespace

void save_safetensors(const fs::path& file, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata, Backend& backend,
                      TensorValues values) {
  // The header is written first with placeholder checksums of the final width, the data streamed
  // (its checksums formed on the way), then the header written again over the first one.
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name))
      throw Error(fmt::format("save_safetensors: duplicate tensor '{}'", t.name));
    header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {off, off + t.bytes()}}};
    header["__metadata__"][kTensorCrcPrefix + t.name] = kNoCrc;
    off += t.bytes();
  }
  header["__metadata__"][kHeaderCrcKey] = kNoCrc;
  auto text = [&] {
    std::string h = header.dump();
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes
    return h;
  };
  const std::string placeholder = text();

  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(
        fmt::format("cannot create checkpoint directory '{}': {}", dir.string(), ec.message()));
  AtomicFile out(file, "checkpoint");
  std::uint8_t len[8];
  const std::uint64_t hs = placeholder.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(hs >> (8 * i));
  out.write(len, 8);
  out.write(placeholder.data(), placeholder.size());
  std::vector<char> stage(std::min<std::size_t>(kChunk, std::max<std::uint64_t>(off, 1)));
  for (const auto& t : tensors) {
    const std::size_t total = t.bytes();
    std::uint32_t crc = 0;
    for (std::size_t done = 0; done < total;) {
      const std::size_t n = std::min(stage.size(), total - done);
      backend.copy_to_host(stage.data(), static_cast<const char*>(t.data) + done, n);
      if (values == TensorValues::finite) {
        const std::int64_t bad = first_nonfinite(stage.data(), n, t.dtype);
        if (bad >= 0)
          throw NumericalError(fmt::format(
              "checkpoint '{}' not written: tensor '{}' holds a non-finite value (element {}); "
              "the model's weights are no longer numbers",
              file.string(), t.name, static_cast<std::int64_t>(done / dtype_size(t.dtype)) + bad));
      }
      crc = crc32c(stage.data(), n, crc);
      out.write(stage.data(), n);
      done += n;
    }
    header["__metadata__"][kTensorCrcPrefix + t.name] = crc32c_text(crc);
  }
  const std::string unsigned_header = text();
  header["__metadata__"][kHeaderCrcKey] =
      crc32c_text(crc32c(unsigned_header.data(), unsigned_header.size()));
  const std::string h = text();
  if (h.size() != placeholder.size())
    throw Error("save_safetensors: the header changed size when its checksums were filled in");
  out.write_at(8, h.data(), h.size());
  out.commit();
}

SafetensorsHeader read_safetensors_header(const fs::path& file) {
  const std::string where = fmt::format("checkpoint '{}'", file.string());
  require_regular_file(file, "checkpoint");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read {}: {}", where, sys_error()));
  std::error_code ec;
  const std::uint64_t file_size = fs::file_size(file, ec);
  if (ec) throw InputError(fmt::format("cannot read {}: {}", where, ec.message()));
  std::uint8_t len[8];
  if (!in.read(reinterpret_cast<char*>(len), 8))
    throw CheckpointCorrupt(
        fmt::format("{}: file is {} bytes, too short for a safetensors header", where, file_size));
  std::uint64_t hs = 0;
  for (int i = 0; i < 8; ++i) hs |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (hs > kMaxHeader || hs + 8 > file_size)
    throw CheckpointCorrupt(fmt::format(
        "{}: header size {} does not fit the file ({} bytes); the file is truncated or not "
        "safetensors",
        where, hs, file_size));
  std::string h(hs, '\0');
  if (!in.read(h.data(), static_cast<std::streamsize>(hs)))
    throw CheckpointCorrupt(fmt::format("{}: cannot read the {}-byte header", where, hs));
  nlohmann::json j = nlohmann::json::parse(h, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw CheckpointCorrupt(
        fmt::format("{}: header is not a JSON object; the file is corrupt", where));

  // The header checksum, where the writer left one: the header with its own value zeroed.
  if (const auto* m = j.contains("__metadata__") ? &j["__metadata__"] : nullptr;
      m != nullptr && m->is_object() && m->contains(kHeaderCrcKey)) {
    const auto& v = (*m)[kHeaderCrcKey];
    const std::string stored = v.is_string() ? v.get<std::string>() : std::string();
    const std::string field = fmt::format("\"{}\":\"{}\"", kHeaderCrcKey, stored);
    const std::size_t at = h.find(field);
    if (stored.size() != kNoCrc.size() || at == std::string::npos)
      throw CheckpointCorrupt(fmt::format("{}: metadata '{}' is not a checksum the header holds",
                                          where, kHeaderCrcKey));
    std::string zeroed = h;
    zeroed.replace(at + field.size() - 1 - stored.size(), stored.size(), kNoCrc);
    const std::string actual = crc32c_text(crc32c(zeroed.data(), zeroed.size()));
    if (actual != stored)
      throw CheckpointCorrupt(
          fmt::format("{}: the header's checksum is {}, it holds {}: the header is damaged", where,
                      actual, stored));
  }

  SafetensorsHeader out;
  out.data_offset = 8 + hs;
  const std::uint64_t data_size = file_size - out.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        throw CheckpointCorrupt(fmt::format("{}: __metadata__ is not an object", where));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          throw CheckpointCorrupt(fmt::format("{}: metadata '{}' is not a string", where, m.key()));
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tw = fmt::format("{}: tensor '{}'", where, it.key());
    const auto& v = *it;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw CheckpointCorrupt(
          fmt::format("{}: expected {{dtype, shape, data_offsets: [begin, end]}}", tw));
    SafetensorsEntry e;
    const auto dt = parse_safetensors_dtype(v["dtype"].get<std::string>());
    if (!dt)
      throw CheckpointCorrupt(
          fmt::format("{}: unknown dtype '{}'", tw, v["dtype"].get<std::string>()));
    e.dtype = *dt;
    std::uint64_t elems = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        throw CheckpointCorrupt(fmt::format("{}: shape must hold non-negative integers", tw));
      e.shape.push_back(d.get<std::int64_t>());
      overflow = overflow ||
                 __builtin_mul_overflow(elems, static_cast<std::uint64_t>(e.shape.back()), &elems);
    }
    if (overflow || elems > data_size)
      throw CheckpointCorrupt(
          fmt::format("{}: shape [{}] holds more elements than the file's {}-byte data section", tw,
                      fmt::join(e.shape, ", "), data_size));
    for (const auto& d : v["data_offsets"])
      if (!d.is_number_unsigned())
        throw CheckpointCorrupt(fmt::format("{}: data_offsets must be non-negative integers", tw));
    e.begin = v["data_offsets"][0].get<std::uint64_t>();
    e.end = v["data_offsets"][1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      throw CheckpointCorrupt(fmt::format(
          "{}: byte range [{}, {}) lies outside the {}-byte data section; the file is truncated "
          "or corrupt",
          tw, e.begin, e.end, data_size));
    if (e.end - e.begin != elems * dtype_size(e.dtype))
      throw CheckpointCorrupt(
          fmt::format("{}: byte range of {} bytes does not match its shape and dtype ({} bytes)",
                      tw, e.end - e.begin, elems * dtype_size(e.dtype)));
    out.tensors.emplace(it.key(), std::move(e));
  }
  return out;
}

std::map<std::string, std::string> load_safetensors(const fs::path& file,
                                                    const std::vector<TensorRef>& into,
                                                    Backend& backend, bool allow_extra,
                                                    TensorValues values) {
  return load_checkpoint(file, whole_tensor_layout(into), backend, values, allow_extra);
}

fs::path checkpoint_path(const fs::path& dir, std::int64_t step) {
  return dir / fmt::format("step-{}.safetensors", step);
}

fs::path checkpoint_set_path(const fs::path& dir, std::int64_t step) {
  return dir / fmt::format("step-{}", step);
}

fs::path find_checkpoint(const fs::path& dir, std::int64_t step) {
  std::error_code ec;
  const fs::path set = checkpoint_set_path(dir, step);
  return fs::is_directory(set, ec) ? set : checkpoint_path(dir, step);
}

std::vector<std::int64_t> list_checkpoints(const fs::path& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  // Names as checkpoint_path and checkpoint_set_path write them (no leading zeros), so a listed
  // step names its checkpoint; a set is listed only once renamed into place (complete).
  static const std::regex file_re(R"(step-(0|[1-9]\d{0,17})\.safetensors)");
  static const std::regex set_re(R"(step-(0|[1-9]\d{0,17}))");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if ((entry.is_regular_file(ec) && std::regex_match(name, m, file_re)) ||
        (entry.is_directory(ec) && std::regex_match(name, m, set_re)))
      steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

void prune_checkpoints(const fs::path& dir, int keep) {
  if (keep < 1) throw Error(fmt::format("prune_checkpoints: keep must be >= 1, got {}", keep));
  auto steps = list_checkpoints(dir);
  std::error_code ec;
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    fs::remove(checkpoint_path(dir, steps[i]), ec);
    // A set leaves the listing in one rename before its files go, so a crash never leaves a
    // listed set with some of its files.
    const fs::path set = checkpoint_set_path(dir, steps[i]);
    const fs::path going = dir / fmt::format(".step-{}.deleting", steps[i]);
    if (fs::is_directory(set, ec) && !ec) {
      fs::remove_all(going, ec);
      fs::rename(set, going, ec);
      if (!ec) fs::remove_all(going, ec);
    }
  }
  // What a crash left of sets being written or deleted (no write is under way while a run
  // prunes).
  static const std::regex stale(R"(\.step-\d+\.(partial|deleting))");
  std::vector<fs::path> gone;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (std::regex_match(entry.path().filename().string(), stale)) gone.push_back(entry.path());
  for (const fs::path& p : gone) fs::remove_all(p, ec);
}

CheckpointDirLock::CheckpointDirLock(const fs::path& dir) {
  const std::string where = fmt::format("checkpoint directory '{}'", dir.string());
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(fmt::format("{} is not a directory (give --checkpoint a directory)", where));
  fs::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("cannot create {}: {}", where, ec.message()));
  const fs::path lock = dir / ".parity-lock";
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw InputError(fmt::format("cannot write checkpoints to {}: {}", where, sys_error()));
  auto fail = [&](const std::string& message) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(message);
  };
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) fail(fmt::format("cannot lock {}: {}", where, std::strerror(err)));
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    fail(fmt::format(
        "{} is in use by another run (process {}): two runs writing one directory would mix their "
        "checkpoints; give this run its own --checkpoint directory",
        where, n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : "unknown"));
  }
  const std::string pid = fmt::format("{}", ::getpid());
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    fail(fmt::format("cannot write checkpoints to {}: {}", where, sys_error()));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race)
}

fs::path set_aside_checkpoint(const fs::path& file) {
  fs::path aside = file;
  aside += ".corrupt";
  std::error_code ec;
  if (fs::is_directory(file, ec)) fs::remove_all(aside, ec);  // a set set aside before
  fs::rename(file, aside, ec);
  if (ec)
    throw Error(fmt::format("cannot rename the corrupt checkpoint '{}' to '{}': {}", file.string(),
                            aside.string(), ec.message()));
  return aside;
}

}  // namespace parity
