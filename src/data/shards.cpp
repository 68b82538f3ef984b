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
// - Files are read with pread (the page cache holds a hot dataset), not mapped: a mapped file that
//   another process truncates kills the reader with SIGBUS, where a short read is an error that
//   names the file. Every file is checked when opened (magic, version, shape, size, offsets),
//   again (identity and size) each time a batch reads it, and every label, dense feature and id
//   of a batch as it is copied (labels 0 or 1, features finite, ids below their table's rows), so
//   a truncated, foreign, rewritten or corrupt file is an InputError naming the file and the
//   field, never an out-of-bounds access on the device.
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
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/atomic_file.h"
#include "parity/data.h"
#include "parity/error.h"
#include "shard_io.h"

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
using shard_io::align8;
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
  return shard_io::split_name(s == Split::train);
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
  require_dlrm(model, "the shard writer");
  if (per_file_ <= 0) throw InputError("examples per shard file must be positive");
  shard_io::create_dataset_dir(dir_);
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
  shard_io::write_meta(dir_, std::move(meta), files_[static_cast<int>(Split::train)],
                       files_[static_cast<int>(Split::eval)]);
}

// ------------------------------------------------------------------ reader --

namespace {

using shard_io::Fd;
using shard_io::MetaField;

// A part file as it was checked when the reader opened it.
struct Part : shard_io::PartFile {
  Header h{};
  Sections sec{};
};

}  // namespace

struct ShardReader::File : Part {};

bool is_shard_dataset(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) && std::filesystem::exists(p / "meta.json", ec);
}

ShardReader::ShardReader(const std::filesystem::path& dir, const ModelSpec& model, Split split)
    : dir_(dir), cursor_(std::make_unique<shard_io::SplitCursor>()) {
  require_dlrm(model, "the shard reader");
  const nlohmann::json j = shard_io::read_meta(dir);
  const MetaField meta(j, (dir / "meta.json").string(), "");
  if (const std::string format = meta.has("format") ? meta["format"].text() : ""; format != kFormat)
    meta["format"].fail(fmt::format("expected '{}', got '{}'", kFormat, format));
  const std::int64_t dense = meta["dense_features"].integer();
  if (dense != model.dense_features)
    meta["dense_features"].fail(fmt::format("the data has {}, model '{}' expects {}", dense,
                                            model.name, model.dense_features));
  const MetaField tables = meta["tables"];
  if (tables.size() != model.tables.size())
    tables.fail(fmt::format("the data has {} tables, model '{}' has {}", tables.size(), model.name,
                            model.tables.size()));
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const std::int64_t rows = tables[t]["rows"].integer();
    if (rows <= 0 || rows > model.tables[t].rows)
      tables[t]["rows"].fail(fmt::format(
          "the data's ids go up to {} rows, table '{}' of model '{}' has {} (expected 1 to {})",
          rows, model.tables[t].name, model.name, model.tables[t].rows, model.tables[t].rows));
    rows_.push_back(model.tables[t].rows);
  }
  source_ = meta.has("source") ? meta["source"].text() : std::string();
  const MetaField files = meta["splits"][split_name(split)]["files"];
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string name = shard_io::part_file_name(files[i]);
    const std::int64_t examples = files[i]["examples"].integer();
    if (examples <= 0)
      files[i]["examples"].fail(fmt::format("{} is not a positive count", examples));
    auto file = std::make_unique<File>();
    file->path = dir / name;
    open_file(*file, examples, model);
    cursor_->add_file(file->h.examples);
    files_.push_back(std::move(file));
  }
}

ShardReader::~ShardReader() = default;

void ShardReader::open_file(File& f, std::int64_t expected_examples, const ModelSpec& model) {
  const std::string name = fmt::format("'{}'", f.path.string());
  const Fd fd = f.open_and_stat();
  if (f.bytes < sizeof(Header))
    throw InputError(
        fmt::format("{}: {} bytes, shorter than the 64-byte header (truncated?)", name, f.bytes));
  f.read_at(fd, 0, &f.h, sizeof(Header));
  const Header& h = f.h;
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    throw InputError(fmt::format("{}: not a parity shard file (bad magic)", name));
  if (h.version != kVersion)
    throw InputError(
        fmt::format("{}: header field 'version' is {}, expected {}", name, h.version, kVersion));
  if (h.id_bytes != 4 && h.id_bytes != 8)
    throw InputError(
        fmt::format("{}: header field 'id_bytes' is {}, expected 4 or 8", name, h.id_bytes));
  if (h.examples <= 0)
    throw InputError(fmt::format("{}: header field 'examples' is {}, expected a positive count",
                                 name, h.examples));
  if (h.examples != expected_examples)
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
  f.sec = sections_of(h);
  if (f.sec.end != f.bytes)
    throw InputError(fmt::format("{}: {} bytes, the header implies {} (truncated or corrupt)", name,
                                 f.bytes, f.sec.end));
  // Offsets: each table's run starts where the previous ended, never decreases and ends within
  // the ids block, checked for every example once here (read in chunks), so reading a batch
  // needs no checks.
  const auto n = static_cast<std::size_t>(h.examples);
  std::vector<std::int64_t> chunk(std::min<std::size_t>(n + 1, std::size_t{1} << 20));
  std::int64_t at = 0;
  for (int t = 0; t < h.tables; ++t) {
    std::int64_t prev = at;
    bool ok = true;
    for (std::size_t e = 0; e < n + 1 && ok;) {
      const std::size_t m = std::min(chunk.size(), n + 1 - e);
      f.read_at(fd, f.sec.offsets + 8 * (static_cast<std::uint64_t>(t) * (n + 1) + e), chunk.data(),
                m * 8);
      if (e == 0) ok = chunk[0] == at;
      for (std::size_t k = 0; k < m && ok; ++k) {
        ok = chunk[k] >= prev;
        prev = chunk[k];
      }
      e += m;
    }
    if (!ok || prev > h.ids)
      throw InputError(
          fmt::format("{}: offsets of table {} are inconsistent (corrupt file)", name, t));
    at = prev;
  }
  if (at != h.ids)
    throw InputError(
        fmt::format("{}: the offsets cover {} ids, the header says {}", name, at, h.ids));
}

std::int64_t ShardReader::examples() const {
  return cursor_->examples();
}

std::int64_t ShardReader::epoch() const {
  return cursor_->epoch();
}

void ShardReader::seek(std::int64_t example, bool wrap) {
  cursor_->seek(example, wrap);
}

bool ShardReader::next(std::int64_t batch_size, Batch& out, bool wrap) {
  struct Piece {
    const File* f;
    std::int64_t first, count;
  };
  std::vector<Piece> pieces;
  std::int64_t n = 0;
  for (const auto& p : cursor_->take(batch_size, wrap)) {
    pieces.push_back({files_[p.file].get(), p.first, p.count});
    n += p.count;
  }
  if (n == 0) return false;
  std::vector<Fd> fds;
  for (const Piece& p : pieces) fds.push_back(p.f->reopen());
  const int T = static_cast<int>(rows_.size());
  const int F = files_.front()->h.dense_features;
  out.size = n;
  out.num_dense = F;
  out.num_tables = T;
  out.labels.resize(static_cast<std::size_t>(n));
  out.dense.resize(static_cast<std::size_t>(n * F));
  const bool teacher = std::all_of(pieces.begin(), pieces.end(),
                                   [](const Piece& p) { return p.f->h.has_teacher != 0; });
  out.teacher_prob.resize(teacher ? static_cast<std::size_t>(n) : 0);
  out.offsets.resize(static_cast<std::size_t>(T) * static_cast<std::size_t>(n) + 1);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const Part& f = *p.f;
    const auto count = static_cast<std::size_t>(p.count);
    const auto first = static_cast<std::uint64_t>(p.first);
    float* labels = out.labels.data() + at;
    float* dense = out.dense.data() + at * F;
    f.read_at(fds[i], f.sec.labels + 4 * first, labels, count * 4);
    if (teacher)
      f.read_at(fds[i], f.sec.teacher + 4 * first, out.teacher_prob.data() + at, count * 4);
    f.read_at(fds[i], f.sec.dense + 4 * first * static_cast<std::uint64_t>(F), dense,
              count * static_cast<std::size_t>(F) * 4);
    for (std::size_t e = 0; e < count; ++e) {
      if (labels[e] != 0.0f && labels[e] != 1.0f)
        throw InputError(fmt::format("'{}': example {}: label {} is not 0 or 1", f.path.string(),
                                     first + e, labels[e]));
      for (int k = 0; k < F; ++k)
        if (!std::isfinite(dense[e * static_cast<std::size_t>(F) + static_cast<std::size_t>(k)]))
          throw InputError(fmt::format("'{}': example {}: dense feature {} is {} (not finite)",
                                       f.path.string(), first + e, k,
                                       dense[e * static_cast<std::size_t>(F) + k]));
    }
    at += p.count;
  }
  // Offsets (table-major) and where each table's ids go in the batch; firsts[t][i] is piece i's
  // first id of table t in its file. Each (table, piece)'s offsets are read in parallel straight
  // into their place in the batch (and the one after its last example beside them), then rebased
  // once each table's first id in the batch is known.
  std::vector<std::int64_t> table_start(static_cast<std::size_t>(T) + 1, 0);
  std::vector<std::vector<std::int64_t>> firsts(static_cast<std::size_t>(T),
                                                std::vector<std::int64_t>(pieces.size()));
  std::vector<std::int64_t> lasts(static_cast<std::size_t>(T) * pieces.size());
  std::vector<std::int64_t> piece_at(pieces.size() + 1, 0);  // first example of each piece
  for (std::size_t i = 0; i < pieces.size(); ++i) piece_at[i + 1] = piece_at[i] + pieces[i].count;
  const auto jobs = static_cast<std::int64_t>(T) * static_cast<std::int64_t>(pieces.size());
  std::string offsets_error;
#pragma omp parallel for schedule(static) if (jobs > 1)
  for (std::int64_t job = 0; job < jobs; ++job) {
    const auto t = static_cast<std::size_t>(job / static_cast<std::int64_t>(pieces.size()));
    const auto i = static_cast<std::size_t>(job % static_cast<std::int64_t>(pieces.size()));
    const Piece& p = pieces[i];
    const Part& f = *p.f;
    const std::uint64_t at_first =
        f.sec.offsets +
        8 * (static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(f.h.examples + 1) +
             static_cast<std::uint64_t>(p.first));
    std::int64_t* dst = out.offsets.data() + t * static_cast<std::size_t>(n) +
                        static_cast<std::size_t>(piece_at[i]);
    try {  // nothing may leave a parallel region by an exception
      f.read_at(fds[i], at_first, dst, static_cast<std::size_t>(p.count) * 8);
      f.read_at(fds[i], at_first + 8 * static_cast<std::uint64_t>(p.count),
                &lasts[t * pieces.size() + i], 8);
    } catch (const InputError& e) {
#pragma omp critical
      if (offsets_error.empty()) offsets_error = e.what();
    }
  }
  if (!offsets_error.empty()) throw InputError(offsets_error);
  std::vector<std::int64_t> bases(static_cast<std::size_t>(jobs));
  for (int t = 0; t < T; ++t) {
    std::int64_t ids = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const auto ti = static_cast<std::size_t>(t);
      const std::int64_t first =
          out.offsets[ti * static_cast<std::size_t>(n) + static_cast<std::size_t>(piece_at[i])];
      bases[ti * pieces.size() + i] = table_start[ti] + ids - first;
      firsts[ti][i] = first;
      ids += lasts[ti * pieces.size() + i] - first;
    }
    table_start[static_cast<std::size_t>(t) + 1] = table_start[static_cast<std::size_t>(t)] + ids;
  }
#pragma omp parallel for schedule(static) if (jobs > 1)
  for (std::int64_t job = 0; job < jobs; ++job) {
    const auto t = static_cast<std::size_t>(job / static_cast<std::int64_t>(pieces.size()));
    const auto i = static_cast<std::size_t>(job % static_cast<std::int64_t>(pieces.size()));
    std::int64_t* dst = out.offsets.data() + t * static_cast<std::size_t>(n) +
                        static_cast<std::size_t>(piece_at[i]);
    const std::int64_t base = bases[static_cast<std::size_t>(job)];
    for (std::int64_t k = 0; k < pieces[i].count; ++k) dst[k] += base;  // checked monotone at open
  }
  out.offsets.back() = table_start.back();
  out.ids.resize(static_cast<std::size_t>(table_start.back()));
  // Ids: read, widened and range-checked in parallel, in runs of at most kRun ids (one table of
  // the MLPerf model holds 6.5M of a batch's 14M ids, so whole tables would leave threads idle).
  struct Run {
    int table;
    std::size_t piece;
    std::int64_t src, count, dst;
  };
  constexpr std::int64_t kRun = std::int64_t{1} << 18;
  std::vector<Run> runs;
  // Each piece's ids of table t: the span of its examples' batch offsets.
  for (int t = 0; t < T; ++t) {
    std::int64_t e = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const std::int64_t* bo =
          out.offsets.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(n);
      const std::int64_t begin = bo[e];
      const std::int64_t end = bo[e + pieces[i].count];
      const std::int64_t first = firsts[static_cast<std::size_t>(t)][i];
      for (std::int64_t k = 0; k < end - begin; k += kRun)
        runs.push_back({t, i, first + k, std::min(kRun, end - begin - k), begin + k});
      e += pieces[i].count;
    }
  }
  std::int64_t bad_table = -1;
  std::string read_error;
  const auto nruns = static_cast<std::int64_t>(runs.size());
  std::int64_t longest = 0;
  for (const Run& r : runs) longest = std::max(longest, r.count);
#pragma omp parallel if (nruns > 1)
  {
    // Uninitialised, and no longer than the longest run: a batch of one-hot tables has short runs,
    // and zeroing a whole kRun buffer per thread per batch cost more than reading them.
    const auto buffer =
        std::make_unique_for_overwrite<std::uint64_t[]>(static_cast<std::size_t>(longest));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < nruns; ++i) {
      const Run& run = runs[static_cast<std::size_t>(i)];
      const Part& f = *pieces[run.piece].f;
      const std::size_t w = f.h.id_bytes;
      try {  // nothing may leave a parallel region by an exception
        f.read_at(fds[run.piece], f.sec.ids + w * static_cast<std::uint64_t>(run.src), buffer.get(),
                  static_cast<std::size_t>(run.count) * w);
      } catch (const InputError& e) {
#pragma omp critical
        if (read_error.empty()) read_error = e.what();
        continue;
      }
      std::int64_t* dst = out.ids.data() + run.dst;
      const auto rows = static_cast<std::uint64_t>(rows_[static_cast<std::size_t>(run.table)]);
      std::uint64_t worst = 0;
      if (w == 4) {
        const auto* src = reinterpret_cast<const std::uint32_t*>(buffer.get());
        for (std::int64_t k = 0; k < run.count; ++k) {
          dst[k] = src[k];
          worst = std::max<std::uint64_t>(worst, src[k]);
        }
      } else {
        for (std::int64_t k = 0; k < run.count; ++k) {
          dst[k] = static_cast<std::int64_t>(buffer[static_cast<std::size_t>(k)]);
          worst = std::max(worst, buffer[static_cast<std::size_t>(k)]);
        }
      }
      if (worst >= rows) {
#pragma omp critical
        bad_table = run.table;
      }
    }
  }
  if (!read_error.empty()) throw InputError(read_error);
  if (bad_table >= 0)
    throw InputError(fmt::format(
        "'{}': an id of table {} is >= its {} rows (corrupt file or another model's data)",
        dir_.string(), bad_table, rows_[static_cast<std::size_t>(bad_table)]));
  return true;
}

}  // namespace parity
