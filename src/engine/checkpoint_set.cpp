// Sharded checkpoints: sets of per-rank safetensors files with an index (checkpoint.h says what a
// set is), and one loader for sets and single files. The loader sees every checkpoint as pieces in
// global coordinates; each stored piece a rank needs is streamed once, whole, through a bounded
// buffer, so its checksum is always verified (a rank reads more than it keeps only while a table
// is resharded to smaller pieces), and its intersection with each of the rank's pieces is copied
// out. Ranks that meet an error agree on it before any of them goes on, so that no rank waits in
// a collective for one that left.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "engine/nonfinite.h"
#include "parity/checkpoint.h"
#include "parity/dist.h"

namespace parity {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kChunk = std::size_t{64} << 20;  // host staging buffer
constexpr std::uintmax_t kMaxIndex = std::uintmax_t{1} << 30;
constexpr const char* kSetFormat = "parity-checkpoint-set-1";
constexpr const char* kIndexName = "index.json";

std::string rank_file(int rank, int world) {
  return fmt::format("rank-{:05}-of-{:05}.safetensors", rank, world);
}

std::int64_t rows_of(const std::vector<std::int64_t>& shape) {
  return shape.empty() ? 1 : shape[0];
}
std::int64_t cols_of(const std::vector<std::int64_t>& shape) {
  std::int64_t c = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) c *= shape[i];
  return c;
}

// A piece as a checkpoint stores it: a tensor of one file standing for rows x cols of a whole
// tensor. state_columns.of == 0: a whole row's state (or not a state).
struct StoredPiece {
  fs::path file;
  std::string tensor;
  std::int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  CheckpointPiece::StateColumns state_columns;
  DType dtype = DType::f32;  // the whole tensor's, as the index says
};
struct StoredTensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<StoredPiece> pieces;
};
struct Stored {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StoredTensor> tensors;
  std::map<fs::path, std::string> header_crc;  // a set's files: the checksum the index names
};

// The columns of a row's state a piece stands for, as a fraction of the row: [lo, hi) / of.
struct Fraction {
  std::int64_t lo, hi, of;
};
Fraction state_fraction(const CheckpointPiece::StateColumns& s) {
  return s.of > 0 ? Fraction{s.begin, s.end, s.of} : Fraction{0, 1, 1};
}
bool same_fraction(const Fraction& a, const Fraction& b) {
  return a.lo * b.of == b.lo * a.of && a.hi * b.of == b.hi * a.of;
}
// The share of a's columns that b's columns hold.
double overlap(const Fraction& a, const Fraction& b) {
  const std::int64_t lo = std::max(a.lo * b.of, b.lo * a.of),
                     hi = std::min(a.hi * b.of, b.hi * a.of);
  return hi > lo ? static_cast<double>(hi - lo) / static_cast<double>((a.hi - a.lo) * b.of) : 0.0;
}

Stored read_single(const fs::path& file) {
  const SafetensorsHeader h = read_safetensors_header(file);
  Stored s;
  s.metadata = h.metadata;
  for (const auto& [name, e] : h.tensors) {
    StoredTensor t{e.dtype, e.shape, {}};
    t.pieces.push_back({file, name, 0, rows_of(e.shape), 0, cols_of(e.shape), {}, e.dtype});
    s.tensors.emplace(name, std::move(t));
  }
  return s;
}

// Whether the pieces of a tensor lie within it and cover it once: the pieces of a state kept per
// column range cover each row's columns once, the others every element once (no two overlap, and
// their areas add up to the tensor's).
void check_cover(const std::string& where, const std::string& name, const StoredTensor& t) {
  const std::int64_t R = rows_of(t.shape), C = cols_of(t.shape);
  if (t.pieces.empty())
    throw CheckpointCorrupt(fmt::format("{}: tensor '{}' has no pieces", where, name));
  double covered = 0;  // elements, a state piece counted by its share of its rows' columns
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    const StoredPiece& p = t.pieces[i];
    if (p.row_begin < 0 || p.row_begin >= p.row_end || p.row_end > R || p.col_begin < 0 ||
        p.col_begin >= p.col_end || p.col_end > C)
      throw CheckpointCorrupt(fmt::format(
          "{}: tensor '{}' [{}, {}] has a piece of rows [{}, {}) and columns [{}, {}) outside it",
          where, name, R, C, p.row_begin, p.row_end, p.col_begin, p.col_end));
    const Fraction f = state_fraction(p.state_columns);
    if (f.lo < 0 || f.lo >= f.hi || f.hi > f.of)
      throw CheckpointCorrupt(
          fmt::format("{}: tensor '{}' has a piece of state columns [{}, {}) of {}", where, name,
                      f.lo, f.hi, f.of));
    covered += static_cast<double>(p.row_end - p.row_begin) *
               static_cast<double>(p.col_end - p.col_begin) * static_cast<double>(f.hi - f.lo) /
               static_cast<double>(f.of);
    for (std::size_t j = 0; j < i; ++j) {
      const StoredPiece& q = t.pieces[j];
      if (p.file == q.file && p.tensor == q.tensor)
        throw CheckpointCorrupt(
            fmt::format("{}: tensor '{}' names the piece '{}' twice", where, name, p.tensor));
      const Fraction g = state_fraction(q.state_columns);
      const bool rows = std::max(p.row_begin, q.row_begin) < std::min(p.row_end, q.row_end);
      const bool cols = std::max(p.col_begin, q.col_begin) < std::min(p.col_end, q.col_end);
      const bool state = f.lo * g.of < g.hi * f.of && g.lo * f.of < f.hi * g.of;
      if (rows && cols && state)
        throw CheckpointCorrupt(
            fmt::format("{}: tensor '{}' has two pieces that overlap (rows [{}, {}) and [{}, {}))",
                        where, name, p.row_begin, p.row_end, q.row_begin, q.row_end));
    }
  }
  const double want = static_cast<double>(R) * static_cast<double>(C);
  if (std::abs(covered - want) > 1e-9 * std::max(1.0, want))
    throw CheckpointCorrupt(fmt::format(
        "{}: the pieces of tensor '{}' [{}, {}] hold {} of its {} elements: the set is incomplete",
        where, name, R, C, covered, want));
}

std::map<std::string, std::string> metadata_of(const nlohmann::json& j, const std::string& where) {
  std::map<std::string, std::string> m;
  if (!j.is_object()) throw CheckpointCorrupt(where + ": metadata is not an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it->is_string())
      throw CheckpointCorrupt(fmt::format("{}: metadata '{}' is not a string", where, it.key()));
    m[it.key()] = it->get<std::string>();
  }
  return m;
}

Stored read_set(const fs::path& dir) {
  const fs::path index = dir / kIndexName;
  const std::string where = fmt::format("checkpoint set '{}'", dir.string());
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(index, ec);
  if (ec)
    throw CheckpointCorrupt(fmt::format("{}: no readable {} ({}): the set is incomplete", where,
                                        kIndexName, ec.message()));
  if (size > kMaxIndex)
    throw CheckpointCorrupt(
        fmt::format("{}: {} is {} bytes, more than an index can be", where, kIndexName, size));
  std::ifstream in(index, std::ios::binary);
  std::string text(static_cast<std::size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size)))
    throw CheckpointCorrupt(fmt::format("{}: cannot read {}", where, kIndexName));
  nlohmann::ordered_json outer;
  try {
    outer = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointCorrupt(fmt::format("{}: {} is not JSON: {}", where, kIndexName, e.what()));
  }
  try {
    const auto& j = outer.at("index");
    const std::string stored = outer.at("crc32c").get<std::string>();
    const std::string body = j.dump(1);
    const std::string actual = crc32c_text(crc32c(body.data(), body.size()));
    if (actual != stored)
      throw CheckpointCorrupt(fmt::format("{}: {} has checksum {}, it says {}: it is damaged",
                                          where, kIndexName, actual, stored));
    if (j.at("format").get<std::string>() != kSetFormat)
      throw InputError(fmt::format("{}: format '{}', expected '{}'", where,
                                   j.at("format").get<std::string>(), kSetFormat));
    Stored s;
    s.metadata = metadata_of(j.at("metadata"), where);
    std::vector<fs::path> files;
    for (const auto& f : j.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw CheckpointCorrupt(
            fmt::format("{}: file name '{}' is not a name in the set", where, name));
      files.push_back(dir / name);
      s.header_crc[files.back()] = f.at("header_crc32c").get<std::string>();
    }
    std::set<std::pair<fs::path, std::string>> named;
    for (const auto& t : j.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      const auto dt = parse_dtype(t.at("dtype").get<std::string>());
      if (!dt)
        throw CheckpointCorrupt(fmt::format("{}: tensor '{}' has an unknown dtype", where, name));
      StoredTensor st{*dt, t.at("shape").get<std::vector<std::int64_t>>(), {}};
      for (const auto& p : t.at("pieces")) {
        const auto file = p.at("file").get<std::size_t>();
        if (file >= files.size())
          throw CheckpointCorrupt(
              fmt::format("{}: tensor '{}' names file {} of {}", where, name, file, files.size()));
        StoredPiece sp;
        sp.file = files[file];
        sp.tensor = p.at("tensor").get<std::string>();
        sp.dtype = st.dtype;
        const auto rows = p.at("rows").get<std::vector<std::int64_t>>();
        const auto cols = p.at("cols").get<std::vector<std::int64_t>>();
        if (rows.size() != 2 || cols.size() != 2)
          throw CheckpointCorrupt(
              fmt::format("{}: tensor '{}': rows and cols are [begin, end]", where, name));
        sp.row_begin = rows[0];
        sp.row_end = rows[1];
        sp.col_begin = cols[0];
        sp.col_end = cols[1];
        if (p.contains("state_columns")) {
          const auto sc = p.at("state_columns").get<std::vector<std::int64_t>>();
          if (sc.size() != 3)
            throw CheckpointCorrupt(
                fmt::format("{}: tensor '{}': state_columns is [begin, end, of]", where, name));
          sp.state_columns = {sc[0], sc[1], sc[2]};
        }
        st.pieces.push_back(std::move(sp));
      }
      for (const StoredPiece& sp : st.pieces)
        if (!named.insert({sp.file, sp.tensor}).second)
          throw CheckpointCorrupt(fmt::format("{}: the piece '{}' of '{}' is named twice", where,
                                              sp.tensor, sp.file.filename().string()));
      check_cover(where, name, st);
      if (!s.tensors.emplace(name, std::move(st)).second)
        throw CheckpointCorrupt(fmt::format("{}: tensor '{}' is listed twice", where, name));
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointCorrupt(
        fmt::format("{}: {} is not a set's index: {}", where, kIndexName, e.what()));
  }
}

Stored read_stored(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? read_set(path) : read_single(path);
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw Error(fmt::format("cannot sync the checkpoint directory '{}': {}", dir.string(), why));
  }
  ::close(fd);
}

// Every rank learns whether any rank failed, and why: a rank that did rethrows its own error, the
// others throw one that carries the failed ranks' messages (a rank's own message could otherwise
// be lost when the first rank to report ends the run). Numerical errors stay numerical (the
// trainer reports divergence).
void agree(Communicator& comm, const std::exception_ptr& err, bool numerical,
           const std::string& doing) {
  constexpr std::size_t kText = 480;  // bytes of each rank's message carried
  std::string mine;
  if (err) {
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      mine = e.what();
    } catch (...) {
      mine = "an unknown error";
    }
  }
  // Per rank: a flag (1 failed, 2 numerical) and the start of its message.
  std::vector<std::byte> block(kText + 1),
      all(block.size() * static_cast<std::size_t>(comm.size()));
  block[0] = std::byte{static_cast<unsigned char>(err ? (numerical ? 2 : 1) : 0)};
  std::memcpy(block.data() + 1, mine.data(), std::min(mine.size(), kText));
  comm.all_gather(block, all);
  std::vector<std::string> failed;
  bool any_numerical = false;
  for (int q = 0; q < comm.size(); ++q) {
    const std::byte* b = all.data() + static_cast<std::size_t>(q) * block.size();
    const auto flag = static_cast<unsigned char>(b[0]);
    if (flag == 0) continue;
    any_numerical |= flag == 2;
    const auto* text = reinterpret_cast<const char*>(b + 1);
    failed.push_back(fmt::format("rank {}: {}", q, std::string(text, strnlen(text, kText))));
  }
  if (failed.empty()) return;
  if (err) std::rethrow_exception(err);
  const std::string text = fmt::format("{}: {}", doing, fmt::join(failed, "; "));
  if (any_numerical) throw NumericalError(text);
  throw Error(text);
}

template <class F>
void agreed(Communicator& comm, const std::string& doing, F&& work) {
  std::exception_ptr err;
  bool numerical = false;
  try {
    work();
  } catch (const NumericalError&) {
    err = std::current_exception();
    numerical = true;
  } catch (...) {
    err = std::current_exception();
  }
  agree(comm, err, numerical, doing);
}

std::string piece_tensor_name(const CheckpointPiece& p, const CheckpointTensor& t) {
  const bool whole = p.row_begin == 0 && p.row_end == rows_of(t.shape) && p.col_begin == 0 &&
                     p.col_end == cols_of(t.shape) && p.state_columns.of == 0;
  if (whole) return p.name;
  std::string n = fmt::format("{}@rows:{}-{}@cols:{}-{}", p.name, p.row_begin, p.row_end,
                              p.col_begin, p.col_end);
  if (p.state_columns.of > 0)
    n += fmt::format("@state:{}-{}/{}", p.state_columns.begin, p.state_columns.end,
                     p.state_columns.of);
  return n;
}

const CheckpointTensor& tensor_of(const CheckpointLayout& layout, const std::string& name) {
  for (const CheckpointTensor& t : layout.tensors)
    if (t.name == name) return t;
  throw Error(
      fmt::format("checkpoint layout: piece of '{}', which is not among its tensors", name));
}

}  // namespace

CheckpointLayout whole_tensor_layout(const std::vector<TensorRef>& tensors) {
  CheckpointLayout l;
  for (const TensorRef& t : tensors) {
    l.tensors.push_back({t.name, t.dtype, t.shape});
    CheckpointPiece p;
    p.name = t.name;
    p.local = t;
    p.row_end = rows_of(t.shape);
    p.col_end = cols_of(t.shape);
    l.pieces.push_back(std::move(p));
  }
  return l;
}

fs::path save_checkpoint_set(const fs::path& dir, std::int64_t step, const CheckpointLayout& layout,
                             const std::map<std::string, std::string>& metadata, Communicator& comm,
                             Backend& backend, TensorValues values) {
  const int W = comm.size(), me = comm.rank();
  const fs::path final_path = checkpoint_set_path(dir, step);
  const fs::path tmp = dir / fmt::format(".step-{}.partial", step);
  const std::string doing = fmt::format("writing the checkpoint set '{}'", final_path.string());
  agreed(comm, doing, [&] {
    if (me != 0) return;
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a set a crash left half written
    fs::create_directories(tmp, ec);
    if (ec) throw Error(fmt::format("cannot create '{}': {}", tmp.string(), ec.message()));
  });

  // This rank's file: its pieces, each under a name that says where it lies.
  nlohmann::ordered_json mine = nlohmann::ordered_json::array();
  std::string header_crc;
  agreed(comm, doing, [&] {
    std::vector<TensorRef> refs;
    for (const CheckpointPiece& p : layout.pieces) {
      if (!p.write) continue;
      const CheckpointTensor& t = tensor_of(layout, p.name);
      TensorRef r = p.local;
      r.name = piece_tensor_name(p, t);
      if (r.dtype != t.dtype ||
          r.elements() != (p.row_end - p.row_begin) * (p.col_end - p.col_begin))
        throw Error(
            fmt::format("checkpoint layout: the piece '{}' holds {} {} elements, not its "
                        "rows x columns",
                        r.name, r.elements(), dtype_name(r.dtype)));
      refs.push_back(r);
      nlohmann::ordered_json d = {{"tensor", r.name},
                                  {"name", p.name},
                                  {"rows", {p.row_begin, p.row_end}},
                                  {"cols", {p.col_begin, p.col_end}}};
      if (p.state_columns.of > 0)
        d["state_columns"] = {p.state_columns.begin, p.state_columns.end, p.state_columns.of};
      mine.push_back(std::move(d));
    }
    std::map<std::string, std::string> meta = metadata;
    meta["set.rank"] = fmt::format("{}", me);
    meta["set.world"] = fmt::format("{}", W);
    meta["set.step"] = fmt::format("{}", step);
    const fs::path file = tmp / rank_file(me, W);
    save_safetensors(file, refs, meta, backend, values);
    header_crc = read_safetensors_header(file).metadata.at("header_crc32c");
  });

  // Rank 0 gathers every rank's pieces and writes the index; the rename makes the set whole.
  const std::string blob =
      nlohmann::ordered_json{{"header_crc32c", header_crc}, {"pieces", mine}}.dump();
  std::int64_t len = static_cast<std::int64_t>(blob.size());
  std::vector<std::int64_t> lens(static_cast<std::size_t>(W));
  comm.all_gather(std::as_bytes(std::span<const std::int64_t>(&len, 1)),
                  std::as_writable_bytes(std::span<std::int64_t>(lens)));
  const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
  std::vector<std::byte> send(static_cast<std::size_t>(longest)),
      recv(static_cast<std::size_t>(longest * W));
  std::memcpy(send.data(), blob.data(), blob.size());
  comm.all_gather(send, recv);
  agreed(comm, doing, [&] {
    if (me != 0) return;
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    std::map<std::string, nlohmann::ordered_json> pieces;
    for (int q = 0; q < W; ++q) {
      const auto* at = reinterpret_cast<const char*>(recv.data()) + q * longest;
      const auto j = nlohmann::ordered_json::parse(
          std::string(at, static_cast<std::size_t>(lens[static_cast<std::size_t>(q)])));
      // Each rank's file must be here as that rank wrote it: ranks that do not share the
      // directory would otherwise commit a set of rank 0's file alone.
      const fs::path file = tmp / rank_file(q, W);
      std::error_code ec;
      const bool here = fs::is_regular_file(file, ec);
      if (!here || read_safetensors_header(file).metadata.at("header_crc32c") !=
                       j.at("header_crc32c").get<std::string>())
        throw Error(fmt::format(
            "rank {}'s file is not in '{}' as rank {} wrote it: the ranks of a run must share the "
            "checkpoint directory (one host, or a shared file system)",
            q, tmp.string(), q));
      files.push_back({{"name", rank_file(q, W)}, {"header_crc32c", j.at("header_crc32c")}});
      for (const auto& p : j.at("pieces")) {
        nlohmann::ordered_json d = {{"file", q},
                                    {"tensor", p.at("tensor")},
                                    {"rows", p.at("rows")},
                                    {"cols", p.at("cols")}};
        if (p.contains("state_columns")) d["state_columns"] = p.at("state_columns");
        pieces[p.at("name").get<std::string>()].push_back(std::move(d));
      }
    }
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const CheckpointTensor& t : layout.tensors) {
      const auto it = pieces.find(t.name);
      if (it == pieces.end())
        throw Error(fmt::format("checkpoint layout: no rank writes tensor '{}'", t.name));
      tensors.push_back({{"name", t.name},
                         {"dtype", std::string(dtype_name(t.dtype))},
                         {"shape", t.shape},
                         {"pieces", it->second}});
    }
    const nlohmann::ordered_json index = {{"format", kSetFormat}, {"step", step},
                                          {"world", W},           {"metadata", metadata},
                                          {"files", files},       {"tensors", tensors}};
    const std::string body = index.dump(1);
    const std::string text =
        nlohmann::ordered_json{{"crc32c", crc32c_text(crc32c(body.data(), body.size()))},
                               {"index", index}}
            .dump(1) +
        "\n";
    AtomicFile out(tmp / kIndexName, "checkpoint index");
    out.write(text.data(), text.size());
    out.commit();
    // The index was checked as the reader will check it before the set is made visible.
    (void)read_set(tmp);
    std::error_code ec;
    if (fs::exists(final_path, ec)) {
      // A set of this step already: the two directories swap in one atomic rename, and the old
      // one, now at the temporary name, is removed.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0)
        throw Error(fmt::format("cannot put '{}' in place of '{}': {}", tmp.string(),
                                final_path.string(), std::strerror(errno)));
      sync_directory(dir);
      fs::remove_all(tmp, ec);
      return;
    }
    fs::rename(tmp, final_path, ec);
    if (ec)
      throw Error(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), final_path.string(),
                              ec.message()));
    sync_directory(dir);
  });
  return final_path;
}

std::map<std::string, std::string> read_checkpoint_metadata(const fs::path& path) {
  return read_stored(path).metadata;
}

std::map<std::string, std::string> load_checkpoint(const fs::path& path,
                                                   const CheckpointLayout& layout, Backend& backend,
                                                   TensorValues values, bool allow_extra) {
  const Stored stored = read_stored(path);
  const std::string where = fmt::format("checkpoint '{}'", path.string());
  auto shape_str = [](const std::vector<std::int64_t>& s) {
    return fmt::format("[{}]", fmt::join(s, ", "));
  };
  // The model's tensors and the checkpoint's agree before anything is loaded.
  for (const CheckpointTensor& t : layout.tensors) {
    const auto it = stored.tensors.find(t.name);
    if (it == stored.tensors.end())
      throw InputError(fmt::format("{}: tensor '{}' is missing; the checkpoint is of another model",
                                   where, t.name));
    if (it->second.dtype != t.dtype || it->second.shape != t.shape)
      throw InputError(fmt::format("{}: tensor '{}' is {}{}, the model expects {}{}", where, t.name,
                                   dtype_name(it->second.dtype), shape_str(it->second.shape),
                                   dtype_name(t.dtype), shape_str(t.shape)));
  }
  for (const auto& entry : stored.tensors) {
    if (allow_extra) break;
    const std::string& name = entry.first;
    if (std::none_of(layout.tensors.begin(), layout.tensors.end(),
                     [&](const CheckpointTensor& t) { return t.name == name; }))
      throw InputError(fmt::format(
          "{}: tensor '{}' is not part of this model; the checkpoint is of another model or "
          "optimizer",
          where, name));
  }

  // Each of this rank's pieces, and the stored pieces it is filled from. A rowwise state whose
  // columns no stored piece shares is the column-weighted mean of the stored states (summed in
  // double, then rounded once).
  struct Target {
    const CheckpointPiece* piece = nullptr;
    std::int64_t cols = 0;
    bool weighted = false;
    std::vector<double> sum;  // weighted: per row
    // Elements copied; weighted: rows, each counted by the share of its columns read (the stored
    // pieces do not overlap, so a full count means every row's columns were read once).
    double filled = 0;
  };
  std::vector<Target> targets;
  std::map<std::pair<fs::path, std::string>, std::vector<std::size_t>> readers;
  std::map<std::pair<fs::path, std::string>, const StoredPiece*> by_key;
  for (const CheckpointPiece& p : layout.pieces) {
    const CheckpointTensor& t = tensor_of(layout, p.name);
    const std::int64_t rows = p.row_end - p.row_begin, cols = p.col_end - p.col_begin;
    if (p.row_begin < 0 || rows <= 0 || p.row_end > rows_of(t.shape) || p.col_begin < 0 ||
        cols <= 0 || p.col_end > cols_of(t.shape) || p.local.dtype != t.dtype ||
        p.local.elements() != rows * cols)
      throw Error(
          fmt::format("checkpoint layout: a piece of '{}' of rows [{}, {}) and columns "
                      "[{}, {}) does not fit the tensor or its own buffer",
                      p.name, p.row_begin, p.row_end, p.col_begin, p.col_end));
    Target tg;
    tg.piece = &p;
    tg.cols = cols;
    const StoredTensor& st = stored.tensors.at(p.name);
    const Fraction want = state_fraction(p.state_columns);
    auto meets = [&](const StoredPiece& s) {
      return std::max(s.row_begin, p.row_begin) < std::min(s.row_end, p.row_end) &&
             std::max(s.col_begin, p.col_begin) < std::min(s.col_end, p.col_end);
    };
    std::int64_t same_rows = 0;
    for (const StoredPiece& s : st.pieces)
      if (meets(s) && same_fraction(state_fraction(s.state_columns), want))
        same_rows += std::min(s.row_end, p.row_end) - std::max(s.row_begin, p.row_begin);
    // A state kept per column range on either side, whose columns differ.
    const bool kept_by_columns =
        p.state_columns.of > 0 ||
        std::any_of(st.pieces.begin(), st.pieces.end(),
                    [](const StoredPiece& s) { return s.state_columns.of > 0; });
    tg.weighted = kept_by_columns && same_rows < rows;
    if (tg.weighted && (t.dtype != DType::f32 || cols != 1))
      throw CheckpointCorrupt(fmt::format(
          "{}: '{}' is kept by column ranges, as only a rowwise state (fp32, one column) is", where,
          p.name));
    if (tg.weighted) tg.sum.assign(static_cast<std::size_t>(rows), 0.0);
    const std::size_t k = targets.size();
    targets.push_back(std::move(tg));
    for (const StoredPiece& s : st.pieces) {
      if (!meets(s)) continue;
      const Fraction sf = state_fraction(s.state_columns);
      if (targets[k].weighted ? overlap(want, sf) == 0 : !same_fraction(sf, want)) continue;
      readers[{s.file, s.tensor}].push_back(k);
      by_key[{s.file, s.tensor}] = &s;
    }
  }

  // Stream each stored piece once, file by file.
  std::vector<char> stage;
  fs::path open_file;
  std::ifstream in;
  SafetensorsHeader header;
  std::string file_where;
  for (const auto& [key, users] : readers) {
    const StoredPiece& s = *by_key.at(key);
    if (key.first != open_file) {
      open_file = key.first;
      file_where = fmt::format("checkpoint '{}'", open_file.string());
      std::error_code ec;
      if (!fs::is_regular_file(open_file, ec))
        throw CheckpointCorrupt(fmt::format("{}: the file is missing from its set", file_where));
      header = read_safetensors_header(open_file);
      if (const auto want = stored.header_crc.find(open_file); want != stored.header_crc.end()) {
        const auto it = header.metadata.find("header_crc32c");
        if (it == header.metadata.end() || it->second != want->second)
          throw CheckpointCorrupt(fmt::format(
              "{}: its header checksum is not the one its set's index names: the file is of "
              "another set",
              file_where));
      }
      in = std::ifstream(open_file, std::ios::binary);
      if (!in) throw InputError(fmt::format("cannot read {}", file_where));
    }
    const auto entry = header.tensors.find(s.tensor);
    if (entry == header.tensors.end())
      throw CheckpointCorrupt(
          fmt::format("{}: tensor '{}' named by its set's index is missing", file_where, s.tensor));
    const SafetensorsEntry& e = entry->second;
    const DType dt = e.dtype;
    if (dt != s.dtype)
      throw CheckpointCorrupt(fmt::format("{}: tensor '{}' is {}, its set's index says {}",
                                          file_where, s.tensor, dtype_name(dt),
                                          dtype_name(s.dtype)));
    const std::size_t esz = dtype_size(dt);
    const std::int64_t srows = s.row_end - s.row_begin, scols = s.col_end - s.col_begin;
    if (e.end - e.begin != static_cast<std::uint64_t>(srows * scols) * esz)
      throw CheckpointCorrupt(
          fmt::format("{}: tensor '{}' is {} bytes, not the {} x {} its index says", file_where,
                      s.tensor, e.end - e.begin, srows, scols));
    const std::size_t row_bytes = static_cast<std::size_t>(scols) * esz;
    const std::int64_t chunk_rows = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(kChunk / std::max<std::size_t>(row_bytes, 1)));
    stage.resize(static_cast<std::size_t>(std::min(chunk_rows, srows)) * row_bytes);
    in.seekg(static_cast<std::streamoff>(header.data_offset + e.begin));
    const auto crc_it = header.metadata.find("crc32c." + s.tensor);
    std::uint32_t crc = 0;
    const Fraction sf = state_fraction(s.state_columns);
    for (std::int64_t r0 = 0; r0 < srows; r0 += chunk_rows) {
      const std::int64_t n = std::min(chunk_rows, srows - r0);
      const std::size_t bytes = static_cast<std::size_t>(n) * row_bytes;
      if (!in.read(stage.data(), static_cast<std::streamsize>(bytes)))
        throw CheckpointCorrupt(fmt::format("{}: short read in tensor '{}'", file_where, s.tensor));
      if (values == TensorValues::finite) {
        const std::int64_t bad = first_nonfinite(stage.data(), bytes, dt);
        if (bad >= 0)
          throw CheckpointCorrupt(fmt::format(
              "{}: tensor '{}' holds a non-finite value (element {}); it cannot be trained from",
              file_where, s.tensor, r0 * scols + bad));
      }
      if (crc_it != header.metadata.end()) crc = crc32c(stage.data(), bytes, crc);
      // Global rows [g0, g1) of this chunk.
      const std::int64_t g0 = s.row_begin + r0, g1 = g0 + n;
      for (const std::size_t k : users) {
        Target& tg = targets[k];
        const CheckpointPiece& p = *tg.piece;
        const std::int64_t a = std::max(g0, p.row_begin), b = std::min(g1, p.row_end);
        const std::int64_t c0 = std::max(s.col_begin, p.col_begin),
                           c1 = std::min(s.col_end, p.col_end);
        if (a >= b || c0 >= c1) continue;
        if (tg.weighted) {  // a one-column state of f32, weighted by the columns it shares
          const double w = overlap(state_fraction(p.state_columns), sf);
          for (std::int64_t r = a; r < b; ++r) {
            float v;
            std::memcpy(&v, stage.data() + static_cast<std::size_t>(r - g0) * row_bytes, 4);
            tg.sum[static_cast<std::size_t>(r - p.row_begin)] += w * v;
          }
          tg.filled += static_cast<double>(b - a) * w;
          continue;
        }
        auto* dst = static_cast<char*>(p.local.data);
        const std::size_t seg = static_cast<std::size_t>(c1 - c0) * esz;
        if (c1 - c0 == scols && c1 - c0 == tg.cols) {  // whole rows on both sides: one copy
          backend.copy_to_device(dst + static_cast<std::size_t>((a - p.row_begin) * tg.cols) * esz,
                                 stage.data() + static_cast<std::size_t>(a - g0) * row_bytes,
                                 static_cast<std::size_t>(b - a) * row_bytes);
        } else {
          for (std::int64_t r = a; r < b; ++r)
            backend.copy_to_device(
                dst + static_cast<std::size_t>((r - p.row_begin) * tg.cols + (c0 - p.col_begin)) *
                          esz,
                stage.data() + static_cast<std::size_t>(r - g0) * row_bytes +
                    static_cast<std::size_t>(c0 - s.col_begin) * esz,
                seg);
        }
        tg.filled += (b - a) * (c1 - c0);
      }
    }
    if (crc_it != header.metadata.end() && crc32c_text(crc) != crc_it->second)
      throw CheckpointCorrupt(
          fmt::format("{}: tensor '{}' has checksum {}, the file says {}: its bytes are damaged",
                      file_where, s.tensor, crc32c_text(crc), crc_it->second));
  }

  for (Target& tg : targets) {
    const CheckpointPiece& p = *tg.piece;
    const std::int64_t rows = p.row_end - p.row_begin;
    if (!tg.weighted) {
      if (tg.filled != static_cast<double>(rows * tg.cols))
        throw CheckpointCorrupt(fmt::format(
            "{}: tensor '{}' rows [{}, {}) columns [{}, {}): the checkpoint holds {} of its {} "
            "elements",
            where, p.name, p.row_begin, p.row_end, p.col_begin, p.col_end, tg.filled,
            rows * tg.cols));
      continue;
    }
    if (std::abs(tg.filled - static_cast<double>(rows)) > 1e-9 * static_cast<double>(rows))
      throw CheckpointCorrupt(fmt::format(
          "{}: tensor '{}' rows [{}, {}): the checkpoint's state columns cover {} of its {} rows",
          where, p.name, p.row_begin, p.row_end, tg.filled, rows));
    std::vector<float> v(tg.sum.begin(), tg.sum.end());
    backend.copy_to_device(p.local.data, v.data(), v.size() * sizeof(float));
  }
  return stored.metadata;
}

}  // namespace parity
