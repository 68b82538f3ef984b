// Binary shards: a dataset prepared once and read back at memory speed.
//
// Why it is built this way:
// - A training step of the full MLPerf model eats 14M ids (65,536 examples x 214 lookups) in
//   about 20 ms. Generating them (the synthetic teacher) or parsing them (Criteo TSV) costs
//   about a core-second per batch, so the step would wait on the host. Like every production
//   recommender pipeline, parity prepares the data once and reads it back at memory speed.
// - A part file is column-major per table, so a batch of examples [e, e + B) is, for each table,
//   one contiguous run of ids and one run of offsets: reading is T memcpys and a rebase, and the
//   batch comes out in the table-major CSR every backend wants.
// - Files are mapped read-only (the page cache holds a hot dataset). Every file is checked when
//   opened (magic, version, shape, size, offsets) and every id of a batch against its table's
//   rows as it is widened, so a truncated, foreign or corrupt file is an InputError naming the
//   file and the field, never an out-of-bounds access on the device.
// - Written atomically: each part file and meta.json are written to a temporary name, synced
//   and renamed; meta.json comes last, so a directory without it is not a dataset.
//
// Part file (little-endian; every section starts at a multiple of 8 bytes, zero padding between):
//   header (64 bytes): magic "PRTYSHD1", u32 version (1), u32 id_bytes (4 or 8), i64 examples n,
//                      i32 dense features F, i32 tables T, i64 ids in the file, u32 has_teacher,
//                      u32 reserved, 16 bytes reserved (zero)
//   labels   f32 [n]
//   teacher  f32 [n]             only when has_teacher (the planted teacher's probability)
//   dense    f32 [n, F]
//   offsets  i64 [T, n + 1]      absolute positions in the ids block; table t's ids of example e
//                                are ids[offsets[t][e] .. offsets[t][e + 1])
//   ids      u32 or u64 [ids in the file]
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/atomic_file.h"
#include "parity/data.h"
#include "parity/error.h"

namespace parity {
namespace {

constexpr char kMagic[8] = {'P', 'R', 'T', 'Y', 'S', 'H', 'D', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kFormat = "parity-shards-1";

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t id_bytes;
  std::int64_t examples;
  std::int32_t dense_features;
  std::int32_t tables;
  std::int64_t ids;
  std::uint32_t has_teacher;
  std::uint32_t reserved;
  std::uint8_t reserved2[16];
};
static_assert(sizeof(Header) == 64, "the shard header is 64 bytes");

// Where each section starts (bytes from the file's start): every section at a multiple of 8, so
// the offsets and 8-byte ids are aligned in the mapped file. The header fields must have been
// bounded first (open_file does), so that nothing here overflows.
struct Sections {
  std::uint64_t labels, teacher, dense, offsets, ids, end;
};
constexpr std::uint64_t align8(std::uint64_t x) {
  return (x + 7) / 8 * 8;
}
Sections sections_of(const Header& h) {
  const auto n = static_cast<std::uint64_t>(h.examples);
  Sections s{};
  std::uint64_t at = sizeof(Header);
  s.labels = at;
  at = align8(at + 4 * n);
  s.teacher = at;
  if (h.has_teacher) at = align8(at + 4 * n);
  s.dense = at;
  at = align8(at + 4 * n * static_cast<std::uint64_t>(h.dense_features));
  s.offsets = at;
  at += 8 * (n + 1) * static_cast<std::uint64_t>(h.tables);
  s.ids = at;
  s.end = at + static_cast<std::uint64_t>(h.ids) * h.id_bytes;
  return s;
}

std::string split_name(Split s) {
  return s == Split::train ? "train" : "eval";
}

}  // namespace

// ------------------------------------------------------------------ writer --

struct ShardWriter::Pending {
  std::int64_t n = 0;
  std::vector<float> labels, teacher, dense;
  std::vector<std::vector<std::int64_t>> ids;   // per table, concatenated over examples
  std::vector<std::vector<std::int64_t>> lens;  // per table, ids per example
};

ShardWriter::ShardWriter(std::filesystem::path dir, const ModelSpec& model, std::string source,
                         std::int64_t examples_per_file)
    : dir_(std::move(dir)),
      model_(model),
      source_(std::move(source)),
      per_file_(examples_per_file) {
  if (per_file_ <= 0) throw InputError("examples per shard file must be positive");
  if (std::filesystem::exists(dir_ / "meta.json"))
    throw InputError(fmt::format("'{}' already holds a dataset (meta.json); choose a new directory",
                                 dir_.string()));
  std::filesystem::create_directories(dir_);
  id_bytes_ = 4;
  for (const auto& t : model_.tables)
    if (t.rows > 0xffffffffLL) id_bytes_ = 8;
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::write(Split split, const Batch& b) {
  if (b.num_dense != model_.dense_features || b.num_tables != model_.num_tables() ||
      b.labels.size() != static_cast<std::size_t>(b.size) ||
      b.offsets.size() !=
          static_cast<std::size_t>(b.num_tables) * static_cast<std::size_t>(b.size) + 1 ||
      b.dense.size() != static_cast<std::size_t>(b.size) * static_cast<std::size_t>(b.num_dense))
    throw Error("ShardWriter: the batch does not have the model's shape (or lacks labels)");
  auto& pending = pending_[static_cast<int>(split)];
  const int T = b.num_tables;
  std::int64_t e = 0;
  while (e < b.size) {
    if (!pending) pending = std::make_unique<Pending>();  // flush() below starts a new file
    Pending& p = *pending;
    if (p.ids.empty()) {
      p.ids.resize(static_cast<std::size_t>(T));
      p.lens.resize(static_cast<std::size_t>(T));
    }
    const std::int64_t take = std::min(b.size - e, per_file_ - p.n);
    p.labels.insert(p.labels.end(), b.labels.begin() + e, b.labels.begin() + e + take);
    if (!b.teacher_prob.empty())
      p.teacher.insert(p.teacher.end(), b.teacher_prob.begin() + e,
                       b.teacher_prob.begin() + e + take);
    p.dense.insert(p.dense.end(), b.dense.begin() + e * b.num_dense,
                   b.dense.begin() + (e + take) * b.num_dense);
    for (int t = 0; t < T; ++t) {
      const std::int64_t first = b.offsets[static_cast<std::size_t>(t * b.size + e)];
      const std::int64_t last = b.offsets[static_cast<std::size_t>(t * b.size + e + take)];
      auto& ids = p.ids[static_cast<std::size_t>(t)];
      ids.insert(ids.end(), b.ids.begin() + first, b.ids.begin() + last);
      auto& lens = p.lens[static_cast<std::size_t>(t)];
      for (std::int64_t k = e; k < e + take; ++k)
        lens.push_back(b.offsets[static_cast<std::size_t>(t * b.size + k + 1)] -
                       b.offsets[static_cast<std::size_t>(t * b.size + k)]);
    }
    p.n += take;
    e += take;
    if (p.n == per_file_) flush(split);
  }
}

void ShardWriter::flush(Split split) {
  auto& pending = pending_[static_cast<int>(split)];
  if (!pending || pending->n == 0) return;
  Pending& p = *pending;
  const int T = model_.num_tables();
  const bool teacher = p.teacher.size() == static_cast<std::size_t>(p.n);
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.id_bytes = static_cast<std::uint32_t>(id_bytes_);
  h.examples = p.n;
  h.dense_features = model_.dense_features;
  h.tables = T;
  h.has_teacher = teacher ? 1 : 0;
  for (const auto& v : p.ids) h.ids += static_cast<std::int64_t>(v.size());

  auto& files = files_[static_cast<int>(split)];
  const std::string name = fmt::format("{}-{:05}.bin", split_name(split), files.size());
  AtomicFile f(dir_ / name, "shard file");
  const Sections sec = sections_of(h);
  std::uint64_t written = 0;
  auto put = [&](std::uint64_t at, const void* data,
                 std::size_t bytes) {  // zero padding up to `at`
    static const char zeros[8] = {};
    if (at < written || at - written > 8) throw Error("ShardWriter: section layout out of order");
    f.write(zeros, static_cast<std::size_t>(at - written));
    f.write(data, bytes);
    written = at + bytes;
  };
  put(0, &h, sizeof h);
  put(sec.labels, p.labels.data(), p.labels.size() * 4);
  if (teacher) put(sec.teacher, p.teacher.data(), p.teacher.size() * 4);
  put(sec.dense, p.dense.data(), p.dense.size() * 4);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(p.n + 1));
  std::int64_t at = 0;
  for (int t = 0; t < T; ++t) {
    const auto& lens = p.lens[static_cast<std::size_t>(t)];
    offsets[0] = at;
    for (std::int64_t k = 0; k < p.n; ++k)
      offsets[static_cast<std::size_t>(k + 1)] =
          offsets[static_cast<std::size_t>(k)] + lens[static_cast<std::size_t>(k)];
    at = offsets.back();
    if (t == 0) put(sec.offsets, nullptr, 0);  // the section's padding
    f.write(offsets.data(), offsets.size() * 8);
    written += offsets.size() * 8;
  }
  put(sec.ids, nullptr, 0);
  for (int t = 0; t < T; ++t) {
    const auto& ids = p.ids[static_cast<std::size_t>(t)];
    if (id_bytes_ == 8) {
      f.write(ids.data(), ids.size() * 8);
    } else {
      std::vector<std::uint32_t> narrow(ids.begin(), ids.end());
      f.write(narrow.data(), narrow.size() * 4);
    }
  }
  f.commit();
  files.push_back({name, p.n});
  pending.reset();
}

void ShardWriter::finish() {
  flush(Split::train);
  flush(Split::eval);
  nlohmann::json meta;
  meta["format"] = kFormat;
  meta["model"] = model_.name;
  meta["dense_features"] = model_.dense_features;
  meta["id_bytes"] = id_bytes_;
  meta["source"] = source_;
  auto tables = nlohmann::json::array();
  for (const auto& t : model_.tables) tables.push_back({{"name", t.name}, {"rows", t.rows}});
  meta["tables"] = tables;
  for (Split s : {Split::train, Split::eval}) {
    auto files = nlohmann::json::array();
    std::int64_t total = 0;
    for (const auto& [name, n] : files_[static_cast<int>(s)]) {
      files.push_back({{"file", name}, {"examples", n}});
      total += n;
    }
    meta["splits"][split_name(s)] = {{"examples", total}, {"files", files}};
  }
  const std::string text = fmt::format("{}\n", meta.dump(2));
  AtomicFile f(dir_ / "meta.json", "dataset description");
  f.write(text.data(), text.size());
  f.commit();
}

// ------------------------------------------------------------------ reader --

struct ShardReader::File {
  std::filesystem::path path;
  void* map = nullptr;
  std::size_t bytes = 0;
  Header h{};
  const float* labels = nullptr;
  const float* teacher = nullptr;
  const float* dense = nullptr;
  const std::int64_t* offsets = nullptr;  // [T, n + 1]
  const void* ids = nullptr;
  ~File() {
    if (map != nullptr) ::munmap(map, bytes);
  }
};

bool is_shard_dataset(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) && std::filesystem::exists(p / "meta.json", ec);
}

ShardReader::ShardReader(const std::filesystem::path& dir, const ModelSpec& model, Split split)
    : dir_(dir), split_(split) {
  const auto meta_path = dir / "meta.json";
  const std::string meta_name = meta_path.string();
  auto where = [&](const std::string& field) {
    return fmt::format("'{}': field '{}'", meta_name, field);
  };
  // nlohmann's get<int>() of a number like 1e300 is undefined behaviour (a float converted out of
  // range), so integer fields are read only where they are integers.
  auto integer = [&](const nlohmann::json& j, const std::string& field) {
    if (!j.is_number_integer())
      throw InputError(fmt::format("{}: expected an integer, got {}", where(field),
                                   j.is_number() ? j.dump() : std::string(j.type_name())));
    return j.get<std::int64_t>();
  };
  std::ifstream in(meta_path);
  if (!in)
    throw InputError(
        fmt::format("cannot read '{}': not a parity shard dataset (no meta.json)", meta_name));
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}': not valid JSON: {}", meta_name, e.what()));
  }
  try {
    if (meta.value("format", std::string()) != kFormat)
      throw InputError(fmt::format("{}: expected '{}', got {}", where("format"), kFormat,
                                   meta.value("format", std::string("nothing"))));
    const std::int64_t dense = integer(meta.at("dense_features"), "dense_features");
    if (dense != model.dense_features)
      throw InputError(fmt::format("{}: the data has {}, model '{}' expects {}",
                                   where("dense_features"), dense, model.name,
                                   model.dense_features));
    const auto& tables = meta.at("tables");
    if (!tables.is_array() || tables.size() != model.tables.size())
      throw InputError(fmt::format("{}: the data has {} tables, model '{}' has {}", where("tables"),
                                   tables.size(), model.name, model.tables.size()));
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const auto rows = integer(tables[t].at("rows"), fmt::format("tables[{}].rows", t));
      if (rows > model.tables[t].rows)
        throw InputError(
            fmt::format("{}: the data's ids go up to {} rows, table '{}' of model '{}' has {}",
                        where(fmt::format("tables[{}].rows", t)), rows, model.tables[t].name,
                        model.name, model.tables[t].rows));
      rows_.push_back(model.tables[t].rows);
    }
    source_ = meta.value("source", std::string());
    const auto& files = meta.at("splits").at(split_name(split)).at("files");
    std::size_t i = 0;
    for (const auto& f : files) {
      auto file = std::make_unique<File>();
      file->path = dir / f.at("file").get<std::string>();
      const std::string field = fmt::format("splits.{}.files[{}].examples", split_name(split), i++);
      open_file(*file, integer(f.at("examples"), field), model);
      examples_ += file->h.examples;
      files_.push_back(std::move(file));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}': {}", meta_name, e.what()));
  }
}

ShardReader::~ShardReader() = default;

void ShardReader::open_file(File& f, std::int64_t expected_examples, const ModelSpec& model) {
  const std::string name = fmt::format("'{}'", f.path.string());
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(fmt::format("cannot read {}: {}", name, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw InputError(fmt::format("cannot stat {}: {}", name, std::strerror(errno)));
  }
  f.bytes = static_cast<std::size_t>(st.st_size);
  if (f.bytes < sizeof(Header)) {
    ::close(fd);
    throw InputError(
        fmt::format("{}: {} bytes, shorter than the 64-byte header (truncated?)", name, f.bytes));
  }
  f.map = ::mmap(nullptr, f.bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (f.map == MAP_FAILED) {
    f.map = nullptr;
    throw InputError(fmt::format("cannot map {}: {}", name, std::strerror(errno)));
  }
  std::memcpy(&f.h, f.map, sizeof(Header));
  const Header& h = f.h;
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw InputError(fmt::format("{}: not a parity shard file (bad magic)", name));
  if (h.version != kVersion)
    throw InputError(
        fmt::format("{}: header field 'version' is {}, expected {}", name, h.version, kVersion));
  if (h.id_bytes != 4 && h.id_bytes != 8)
    throw InputError(
        fmt::format("{}: header field 'id_bytes' is {}, expected 4 or 8", name, h.id_bytes));
  if (h.examples != expected_examples || h.examples <= 0)
    throw InputError(fmt::format("{}: header field 'examples' is {}, meta.json says {}", name,
                                 h.examples, expected_examples));
  if (h.dense_features != model.dense_features || h.tables != model.num_tables())
    throw InputError(
        fmt::format("{}: header says {} dense features and {} tables, expected {} and {}", name,
                    h.dense_features, h.tables, model.dense_features, model.num_tables()));
  // Bound every count by the file's size before any product of them (no overflow below).
  const auto bytes = static_cast<std::int64_t>(f.bytes);
  if (h.ids < 0 || h.ids > bytes / static_cast<std::int64_t>(h.id_bytes) ||
      h.examples > bytes / 4 || h.has_teacher > 1)
    throw InputError(fmt::format(
        "{}: header fields 'ids', 'examples' or 'has_teacher' are out of range (corrupt file)",
        name));
  const Sections sec = sections_of(h);
  if (sec.end != f.bytes)
    throw InputError(fmt::format("{}: {} bytes, the header implies {} (truncated or corrupt)", name,
                                 f.bytes, sec.end));
  const auto* base = static_cast<const char*>(f.map);
  const auto n = static_cast<std::size_t>(h.examples);
  f.labels = reinterpret_cast<const float*>(base + sec.labels);
  if (h.has_teacher) f.teacher = reinterpret_cast<const float*>(base + sec.teacher);
  f.dense = reinterpret_cast<const float*>(base + sec.dense);
  f.offsets = reinterpret_cast<const std::int64_t*>(base + sec.offsets);
  f.ids = base + sec.ids;
  // Offsets: each table's run starts where the previous ended, never decreases and ends within
  // the ids block, checked for every example once here, so reading a batch needs no checks.
  std::int64_t at = 0;
  for (int t = 0; t < h.tables; ++t) {
    const std::int64_t* o = f.offsets + static_cast<std::size_t>(t) * (n + 1);
    bool ok = o[0] == at;
    for (std::size_t e = 0; e < n && ok; ++e) ok = o[e + 1] >= o[e];
    if (!ok || o[n] > h.ids)
      throw InputError(
          fmt::format("{}: offsets of table {} are inconsistent (corrupt file)", name, t));
    at = o[n];
  }
  if (at != h.ids)
    throw InputError(
        fmt::format("{}: the offsets cover {} ids, the header says {}", name, at, h.ids));
}

void ShardReader::seek(std::int64_t example, bool wrap) {
  if (example < 0) throw InputError(fmt::format("ShardReader::seek: negative example {}", example));
  file_ = 0;
  pos_ = 0;
  epoch_ = 0;
  if (examples_ == 0) return;
  if (!wrap && example >= examples_) {  // one pass, already consumed: nothing left
    file_ = files_.size();
    return;
  }
  epoch_ = example / examples_;
  example %= examples_;
  while (example >= files_[file_]->h.examples) example -= files_[file_++]->h.examples;
  pos_ = example;
}

bool ShardReader::next(std::int64_t batch_size, Batch& out, bool wrap) {
  if (batch_size <= 0) throw InputError("batch size must be positive");
  struct Piece {
    const File* f;
    std::int64_t first, count;
  };
  std::vector<Piece> pieces;
  std::int64_t need = batch_size;
  while (need > 0) {
    if (file_ >= files_.size()) {
      if (!wrap || examples_ == 0) break;
      file_ = 0;
      pos_ = 0;
      ++epoch_;
    }
    const File& f = *files_[file_];
    const std::int64_t take = std::min(need, f.h.examples - pos_);
    pieces.push_back({&f, pos_, take});
    need -= take;
    pos_ += take;
    if (pos_ == f.h.examples) {
      ++file_;
      pos_ = 0;
    }
  }
  const std::int64_t n = batch_size - need;
  if (n == 0) return false;
  const int T = static_cast<int>(rows_.size());
  const int F = files_.front()->h.dense_features;
  out.size = n;
  out.num_dense = F;
  out.num_tables = T;
  out.labels.resize(static_cast<std::size_t>(n));
  out.dense.resize(static_cast<std::size_t>(n * F));
  const bool teacher = std::all_of(pieces.begin(), pieces.end(),
                                   [](const Piece& p) { return p.f->teacher != nullptr; });
  out.teacher_prob.resize(teacher ? static_cast<std::size_t>(n) : 0);
  out.offsets.resize(static_cast<std::size_t>(T) * static_cast<std::size_t>(n) + 1);
  std::int64_t at = 0;
  for (const Piece& p : pieces) {
    std::memcpy(out.labels.data() + at, p.f->labels + p.first,
                static_cast<std::size_t>(p.count) * 4);
    if (teacher)
      std::memcpy(out.teacher_prob.data() + at, p.f->teacher + p.first,
                  static_cast<std::size_t>(p.count) * 4);
    std::memcpy(out.dense.data() + at * F, p.f->dense + p.first * F,
                static_cast<std::size_t>(p.count * F) * 4);
    at += p.count;
  }
  // Offsets (table-major) and where each table's ids go in the batch.
  std::vector<std::int64_t> table_start(static_cast<std::size_t>(T) + 1, 0);
  for (int t = 0; t < T; ++t) {
    std::int64_t ids = 0, e = 0;
    for (const Piece& p : pieces) {
      const std::int64_t* o = p.f->offsets + static_cast<std::size_t>(t) *
                                                 static_cast<std::size_t>(p.f->h.examples + 1);
      const std::int64_t base = table_start[static_cast<std::size_t>(t)] + ids - o[p.first];
      std::int64_t* dst =
          out.offsets.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n) + e;
      for (std::int64_t k = 0; k < p.count; ++k)
        dst[k] = base + o[p.first + k];  // checked monotone at open
      ids += o[p.first + p.count] - o[p.first];
      e += p.count;
    }
    table_start[static_cast<std::size_t>(t) + 1] = table_start[static_cast<std::size_t>(t)] + ids;
  }
  out.offsets.back() = table_start.back();
  out.ids.resize(static_cast<std::size_t>(table_start.back()));
  // Ids: widened and range-checked in parallel, in runs of at most kRun ids (one table of the
  // MLPerf model holds 6.5M of a batch's 14M ids, so whole tables would leave threads idle).
  struct Run {
    int table;
    const File* f;
    std::int64_t src, count, dst;
  };
  constexpr std::int64_t kRun = std::int64_t{1} << 18;
  std::vector<Run> runs;
  for (int t = 0; t < T; ++t) {
    std::int64_t dst = table_start[static_cast<std::size_t>(t)];
    for (const Piece& p : pieces) {
      const std::int64_t* o = p.f->offsets + static_cast<std::size_t>(t) *
                                                 static_cast<std::size_t>(p.f->h.examples + 1);
      const std::int64_t first = o[p.first], count = o[p.first + p.count] - first;
      for (std::int64_t k = 0; k < count; k += kRun)
        runs.push_back({t, p.f, first + k, std::min(kRun, count - k), dst + k});
      dst += count;
    }
  }
  std::int64_t bad_table = -1;
  const auto nruns = static_cast<std::int64_t>(runs.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t i = 0; i < nruns; ++i) {
    const Run& run = runs[static_cast<std::size_t>(i)];
    std::int64_t* dst = out.ids.data() + run.dst;
    const auto rows = static_cast<std::uint64_t>(rows_[static_cast<std::size_t>(run.table)]);
    std::uint64_t worst = 0;
    if (run.f->h.id_bytes == 4) {
      const auto* src = static_cast<const std::uint32_t*>(run.f->ids) + run.src;
      for (std::int64_t k = 0; k < run.count; ++k) {
        dst[k] = src[k];
        worst = std::max<std::uint64_t>(worst, src[k]);
      }
    } else {
      const auto* src = static_cast<const std::uint64_t*>(run.f->ids) + run.src;
      for (std::int64_t k = 0; k < run.count; ++k) {
        dst[k] = static_cast<std::int64_t>(src[k]);
        worst = std::max(worst, src[k]);
      }
    }
    if (worst >= rows) {
#pragma omp critical
      bad_table = run.table;
    }
  }
  if (bad_table >= 0)
    throw InputError(fmt::format(
        "'{}': an id of table {} is >= its {} rows (corrupt file or another model's data)",
        dir_.string(), bad_table, rows_[static_cast<std::size_t>(bad_table)]));
  return true;
}

}  // namespace parity
