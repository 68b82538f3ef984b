// Binary shards of HSTU models: histories, targets and labels prepared once, read at memory speed.
//
// Why it is built this way:
// - The same reasons and the same rules as the DLRM shards (shards.cpp): data made or parsed once
//   and read back with pread; every file checked when opened (magic, version, shape, size, the
//   offsets) and again (identity and size) for each batch; every label, probability, id, history
//   length and timestamp of a batch checked as it is read, so that a truncated, foreign or
//   corrupt file is an InputError naming the file, the example and the field; files written to a
//   temporary name, synced and renamed, meta.json last.
// - An example is a jagged history of events, so the file keeps one offsets array over the
//   histories and, per event feature, one run of ids over all of the file's events: the events of
//   examples [e, e + B) are one contiguous run per feature, and a batch is a few reads per piece.
// - Histories are written as the model takes them (1 to max_len events, timestamps never going
//   back, targets not before the history's last event); data that breaks this is refused by the
//   writer as by the reader, never truncated silently.
//
// Part file (little-endian; every section starts at a multiple of 8 bytes, zero padding between):
//   header (64 bytes): magic "PRTYSEQ1", u32 version (1), u32 id_bytes (4 or 8), i64 examples n,
//                      i32 targets, i32 tasks, i32 event features F, i32 context tables C,
//                      i64 events E, i64 context ids, u32 probabilities (1: the teacher's and
//                      the order-blind teacher's probabilities follow the labels), u32 reserved
//   labels        f32 [n, targets, tasks]
//   teacher       f32 [n, targets, tasks]  only with probabilities
//   unordered     f32 [n, targets, tasks]  only with probabilities
//   history       i64 [n + 1]              example e's events are [history[e], history[e + 1])
//   times         i64 [E]                  seconds
//   events        ids [F, E]               feature f of event j at f * E + j
//   target ids    ids [n, targets]
//   target times  i64 [n, targets]
//   context offsets i64 [C, n + 1]         absolute positions in the context ids, table-major
//   context ids   ids [context ids]
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

constexpr char kMagic[8] = {'P', 'R', 'T', 'Y', 'S', 'E', 'Q', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kFormat = "parity-sequence-shards-1";

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t id_bytes;
  std::int64_t examples;
  std::int32_t targets;
  std::int32_t tasks;
  std::int32_t features;
  std::int32_t contexts;
  std::int64_t events;
  std::int64_t context_ids;
  std::uint32_t probabilities;
  std::uint32_t reserved;
};
static_assert(sizeof(Header) == 64, "the sequence shard header is 64 bytes");

struct Sections {
  std::uint64_t labels, teacher, unordered, history, times, events, target_ids, target_times,
      context_offsets, context_ids, end;
};
using shard_io::align8;
// Where each section starts. The header's counts must have been bounded first (open_file does).
Sections sections_of(const Header& h) {
  const auto n = static_cast<std::uint64_t>(h.examples);
  const auto scores =
      n * static_cast<std::uint64_t>(h.targets) * static_cast<std::uint64_t>(h.tasks);
  const auto e = static_cast<std::uint64_t>(h.events);
  const std::uint64_t w = h.id_bytes;
  Sections s{};
  std::uint64_t at = sizeof(Header);
  s.labels = at;
  at = align8(at + 4 * scores);
  s.teacher = at;
  if (h.probabilities) at = align8(at + 4 * scores);
  s.unordered = at;
  if (h.probabilities) at = align8(at + 4 * scores);
  s.history = at;
  at += 8 * (n + 1);
  s.times = at;
  at += 8 * e;
  s.events = at;
  at = align8(at + w * e * static_cast<std::uint64_t>(h.features));
  s.target_ids = at;
  at = align8(at + w * n * static_cast<std::uint64_t>(h.targets));
  s.target_times = at;
  at += 8 * n * static_cast<std::uint64_t>(h.targets);
  s.context_offsets = at;
  at += 8 * (n + 1) * static_cast<std::uint64_t>(h.contexts);
  s.context_ids = at;
  s.end = at + w * static_cast<std::uint64_t>(h.context_ids);
  return s;
}

std::string split_name(Split s) {
  return shard_io::split_name(s == Split::train);
}

void require_hstu(const ModelSpec& m, const char* who) {
  if (m.kind != ModelKind::hstu || !m.hstu)
    throw InputError(fmt::format("{} takes HSTU models; model '{}' is a {} model", who, m.name,
                                 model_kind_name(m.kind)));
}

// What is wrong with example e of a batch the model would take, or empty: its history's length,
// its timestamps, its ids, its labels and probabilities.
std::string example_problem(const Batch& b, const ModelSpec& model, std::int64_t e) {
  const SequenceSpec& seq = model.hstu->sequence;
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  const std::int64_t first = b.history_offsets[at(e)], last = b.history_offsets[at(e + 1)];
  const std::int64_t len = last - first;
  if (len < 1 || len > seq.max_len)
    return fmt::format("a history of {} events (the model takes 1 to {})", len, seq.max_len);
  const std::int64_t events = b.events();
  for (std::int64_t j = first; j < last; ++j) {
    if (j > first && b.event_times[at(j)] < b.event_times[at(j - 1)])
      return fmt::format("event {} at time {} comes before event {} at {} (timestamps go back)",
                         j - first, b.event_times[at(j)], j - first - 1, b.event_times[at(j - 1)]);
    for (int f = 0; f < b.features; ++f) {
      const std::int64_t id = b.event_ids[at(f * events + j)];
      const std::int64_t rows = seq.features[static_cast<std::size_t>(f)].rows;
      if (id < 0 || id >= rows)
        return fmt::format("event {}: id {} of feature '{}' is outside its {} rows", j - first, id,
                           seq.features[static_cast<std::size_t>(f)].name, rows);
    }
  }
  const std::int64_t items = seq.features.front().rows;
  for (int t = 0; t < b.targets; ++t) {
    const std::int64_t id = b.target_ids[at(e * b.targets + t)];
    if (id < 0 || id >= items)
      return fmt::format("target {}: item {} is outside the {} rows of '{}'", t, id, items,
                         seq.features.front().name);
    const std::int64_t time = b.target_times[at(e * b.targets + t)];
    if (time < b.event_times[at(last - 1)])
      return fmt::format("target {} at time {} comes before the history's last event at {}", t,
                         time, b.event_times[at(last - 1)]);
  }
  for (int c = 0; c < b.num_tables; ++c) {
    const std::int64_t rows = model.tables[static_cast<std::size_t>(c)].rows;
    for (std::int64_t k = b.offsets[at(c * b.size + e)]; k < b.offsets[at(c * b.size + e + 1)]; ++k)
      if (b.ids[at(k)] < 0 || b.ids[at(k)] >= rows)
        return fmt::format("id {} of context table '{}' is outside its {} rows", b.ids[at(k)],
                           model.tables[static_cast<std::size_t>(c)].name, rows);
  }
  const std::int64_t scores = static_cast<std::int64_t>(b.targets) * b.tasks;
  for (std::int64_t k = e * scores; k < (e + 1) * scores; ++k) {
    if (b.labels[at(k)] != 0.0f && b.labels[at(k)] != 1.0f)
      return fmt::format("label {} is not 0 or 1", b.labels[at(k)]);
    for (const auto* p : {&b.teacher_prob, &b.unordered_prob})
      if (!p->empty() && !((*p)[at(k)] >= 0.0f && (*p)[at(k)] <= 1.0f))
        return fmt::format("a teacher's probability {} is not in [0, 1]", (*p)[at(k)]);
  }
  return {};
}

// The batch's arrays have the shape its counts say, for this model.
void require_shape(const Batch& b, const ModelSpec& model, const char* who) {
  const SequenceSpec& seq = model.hstu->sequence;
  const auto n = static_cast<std::size_t>(b.size);
  const auto scores = n * static_cast<std::size_t>(b.targets) * static_cast<std::size_t>(b.tasks);
  const bool ok =
      b.size >= 0 && b.targets == seq.targets &&
      b.tasks == static_cast<int>(model.hstu->tasks.size()) &&
      b.features == static_cast<int>(seq.features.size()) && b.num_tables == model.num_tables() &&
      b.history_offsets.size() == n + 1 && b.history_offsets.front() == 0 &&
      b.event_ids.size() == static_cast<std::size_t>(b.features) * b.event_times.size() &&
      b.event_times.size() == static_cast<std::size_t>(b.events()) &&
      b.target_ids.size() == n * static_cast<std::size_t>(b.targets) &&
      b.target_times.size() == b.target_ids.size() && b.labels.size() == scores &&
      (b.teacher_prob.empty() || b.teacher_prob.size() == scores) &&
      b.unordered_prob.size() == b.teacher_prob.size() &&
      b.offsets.size() == static_cast<std::size_t>(b.num_tables) * n + 1 &&
      b.offsets.back() == static_cast<std::int64_t>(b.ids.size());
  if (!ok)
    throw Error(fmt::format("{}: the batch does not have the shape of model '{}''s sequences", who,
                            model.name));
  for (std::size_t e = 0; e < n; ++e)
    if (b.history_offsets[e + 1] < b.history_offsets[e])
      throw Error(fmt::format("{}: the batch's history offsets go back", who));
  for (std::size_t k = 0; k + 1 < b.offsets.size(); ++k)
    if (b.offsets[k + 1] < b.offsets[k] || b.offsets[0] != 0)
      throw Error(fmt::format("{}: the batch's context offsets go back", who));
}

// Writes ids as id_bytes-wide integers.
void write_ids(AtomicFile& f, const std::int64_t* ids, std::size_t n, int id_bytes) {
  if (id_bytes == 8) {
    f.write(ids, n * 8);
    return;
  }
  std::vector<std::uint32_t> narrow(ids, ids + n);
  f.write(narrow.data(), n * 4);
}

}  // namespace

// ------------------------------------------------------------------ writer --

struct SequenceShardWriter::Pending {
  std::int64_t n = 0;
  std::vector<float> labels, teacher, unordered;
  std::vector<std::int64_t> lengths, times, target_ids, target_times;
  std::vector<std::vector<std::int64_t>> events;        // per feature, over the file's events
  std::vector<std::vector<std::int64_t>> context_ids;   // per table
  std::vector<std::vector<std::int64_t>> context_lens;  // per table, ids per example
};

SequenceShardWriter::SequenceShardWriter(std::filesystem::path dir, const ModelSpec& model,
                                         std::string source, std::int64_t examples_per_file)
    : dir_(std::move(dir)),
      model_(model),
      source_(std::move(source)),
      per_file_(examples_per_file) {
  require_hstu(model, "the sequence shard writer");
  if (per_file_ <= 0) throw InputError("examples per shard file must be positive");
  shard_io::create_dataset_dir(dir_);
  for (const auto& t : model_.hstu->sequence.features)
    if (t.rows > 0xffffffffLL) id_bytes_ = 8;
  for (const auto& t : model_.tables)
    if (t.rows > 0xffffffffLL) id_bytes_ = 8;
}

SequenceShardWriter::~SequenceShardWriter() = default;

void SequenceShardWriter::write(Split split, const Batch& b) {
  require_shape(b, model_, "SequenceShardWriter");
  for (std::int64_t e = 0; e < b.size; ++e)
    if (const std::string why = example_problem(b, model_, e); !why.empty())
      throw InputError(
          fmt::format("writing {} example {} of the batch: {}", split_name(split), e, why));
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  const std::int64_t scores = static_cast<std::int64_t>(b.targets) * b.tasks;
  const std::int64_t events = b.events();
  auto& pending = pending_[static_cast<int>(split)];
  std::int64_t e = 0;
  while (e < b.size) {
    if (!pending) {
      pending = std::make_unique<Pending>();
      pending->events.resize(static_cast<std::size_t>(b.features));
      pending->context_ids.resize(static_cast<std::size_t>(b.num_tables));
      pending->context_lens.resize(static_cast<std::size_t>(b.num_tables));
    }
    Pending& p = *pending;
    const std::int64_t take = std::min(b.size - e, per_file_ - p.n);
    const auto copy = [&](std::vector<float>& to, const std::vector<float>& from) {
      if (!from.empty())
        to.insert(to.end(), from.begin() + e * scores, from.begin() + (e + take) * scores);
    };
    copy(p.labels, b.labels);
    copy(p.teacher, b.teacher_prob);
    copy(p.unordered, b.unordered_prob);
    const std::int64_t first = b.history_offsets[at(e)], last = b.history_offsets[at(e + take)];
    for (std::int64_t k = e; k < e + take; ++k)
      p.lengths.push_back(b.history_offsets[at(k + 1)] - b.history_offsets[at(k)]);
    p.times.insert(p.times.end(), b.event_times.begin() + first, b.event_times.begin() + last);
    for (int f = 0; f < b.features; ++f)
      p.events[at(f)].insert(p.events[at(f)].end(), b.event_ids.begin() + f * events + first,
                             b.event_ids.begin() + f * events + last);
    p.target_ids.insert(p.target_ids.end(), b.target_ids.begin() + e * b.targets,
                        b.target_ids.begin() + (e + take) * b.targets);
    p.target_times.insert(p.target_times.end(), b.target_times.begin() + e * b.targets,
                          b.target_times.begin() + (e + take) * b.targets);
    for (int c = 0; c < b.num_tables; ++c) {
      const std::int64_t lo = b.offsets[at(c * b.size + e)];
      const std::int64_t hi = b.offsets[at(c * b.size + e + take)];
      p.context_ids[at(c)].insert(p.context_ids[at(c)].end(), b.ids.begin() + lo,
                                  b.ids.begin() + hi);
      for (std::int64_t k = e; k < e + take; ++k)
        p.context_lens[at(c)].push_back(b.offsets[at(c * b.size + k + 1)] -
                                        b.offsets[at(c * b.size + k)]);
    }
    p.n += take;
    e += take;
    if (p.n == per_file_) flush(split);
  }
}

void SequenceShardWriter::flush(Split split) {
  auto& pending = pending_[static_cast<int>(split)];
  if (!pending || pending->n == 0) return;
  Pending& p = *pending;
  const SequenceSpec& seq = model_.hstu->sequence;
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.id_bytes = static_cast<std::uint32_t>(id_bytes_);
  h.examples = p.n;
  h.targets = seq.targets;
  h.tasks = static_cast<std::int32_t>(model_.hstu->tasks.size());
  h.features = static_cast<std::int32_t>(seq.features.size());
  h.contexts = model_.num_tables();
  h.events = static_cast<std::int64_t>(p.times.size());
  for (const auto& v : p.context_ids) h.context_ids += static_cast<std::int64_t>(v.size());
  // Probabilities only where every batch of the file had them.
  h.probabilities = p.teacher.size() == p.labels.size() && p.unordered.size() == p.labels.size();

  auto& files = files_[static_cast<int>(split)];
  const std::string name = fmt::format("{}-{:05}.bin", split_name(split), files.size());
  AtomicFile f(dir_ / name, "shard file");
  const Sections sec = sections_of(h);
  std::uint64_t written = 0;
  // Zero padding up to the section at `at` (a section that follows another directly has none).
  const auto to = [&](std::uint64_t at) {
    static const char zeros[8] = {};
    if (at < written || at - written > 8) throw Error("SequenceShardWriter: sections out of order");
    f.write(zeros, static_cast<std::size_t>(at - written));
    written = at;
  };
  const auto put = [&](std::uint64_t at, const void* data, std::size_t bytes) {
    to(at);
    f.write(data, bytes);
    written += bytes;
  };
  const auto put_ids = [&](const std::vector<std::int64_t>& ids) {
    write_ids(f, ids.data(), ids.size(), id_bytes_);
    written += ids.size() * static_cast<std::size_t>(id_bytes_);
  };
  put(0, &h, sizeof h);
  put(sec.labels, p.labels.data(), p.labels.size() * 4);
  if (h.probabilities) {
    put(sec.teacher, p.teacher.data(), p.teacher.size() * 4);
    put(sec.unordered, p.unordered.data(), p.unordered.size() * 4);
  }
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(p.n) + 1, 0);
  for (std::size_t k = 0; k < p.lengths.size(); ++k) offsets[k + 1] = offsets[k] + p.lengths[k];
  put(sec.history, offsets.data(), offsets.size() * 8);
  put(sec.times, p.times.data(), p.times.size() * 8);
  to(sec.events);
  for (const auto& ids : p.events) put_ids(ids);
  to(sec.target_ids);
  put_ids(p.target_ids);
  put(sec.target_times, p.target_times.data(), p.target_times.size() * 8);
  to(sec.context_offsets);
  std::int64_t base = 0;
  for (const auto& lens : p.context_lens) {
    offsets[0] = base;
    for (std::size_t k = 0; k < lens.size(); ++k) offsets[k + 1] = offsets[k] + lens[k];
    base = offsets.back();
    f.write(offsets.data(), offsets.size() * 8);
    written += offsets.size() * 8;
  }
  to(sec.context_ids);
  for (const auto& ids : p.context_ids) put_ids(ids);
  if (written != sec.end) throw Error("SequenceShardWriter: the file's size is not its layout's");
  f.commit();
  files.push_back({name, p.n});
  pending.reset();
}

void SequenceShardWriter::finish() {
  flush(Split::train);
  flush(Split::eval);
  nlohmann::json meta;
  meta["format"] = kFormat;
  meta["model"] = model_.name;
  meta["id_bytes"] = id_bytes_;
  meta["source"] = source_;
  const SequenceSpec& seq = model_.hstu->sequence;
  meta["max_len"] = seq.max_len;
  meta["targets"] = seq.targets;
  meta["tasks"] = model_.hstu->tasks;
  auto tables = [](const std::vector<TableSpec>& ts) {
    auto out = nlohmann::json::array();
    for (const auto& t : ts) out.push_back({{"name", t.name}, {"rows", t.rows}});
    return out;
  };
  meta["features"] = tables(seq.features);
  meta["tables"] = tables(model_.tables);
  shard_io::write_meta(dir_, std::move(meta), files_[static_cast<int>(Split::train)],
                       files_[static_cast<int>(Split::eval)]);
}

// ------------------------------------------------------------------ reader --

struct SequenceShardReader::File : shard_io::PartFile {
  Header h{};
  Sections sec{};
};

namespace {

using shard_io::Fd;
using shard_io::MetaField;

// Checks meta.json's list of tables (features or contexts) against the model's: as many, and no
// more rows than the model's (the data's ids must index the model's tables).
void check_tables(const MetaField& list, const std::vector<TableSpec>& model_tables,
                  const ModelSpec& model, const char* what) {
  if (list.size() != model_tables.size())
    list.fail(fmt::format("the data has {} {}, model '{}' has {}", list.size(), what, model.name,
                          model_tables.size()));
  for (std::size_t t = 0; t < list.size(); ++t) {
    const std::int64_t rows = list[t]["rows"].integer();
    if (rows <= 0 || rows > model_tables[t].rows)
      list[t]["rows"].fail(fmt::format(
          "the data's ids go up to {} rows, '{}' of model '{}' has {} (expected 1 to {})", rows,
          model_tables[t].name, model.name, model_tables[t].rows, model_tables[t].rows));
  }
}

// Reads n ids of `width` bytes at `offset` into dst as int64.
void read_ids(const shard_io::PartFile& f, const Fd& fd, std::uint64_t offset, int width,
              std::int64_t* dst, std::size_t n) {
  if (width == 8) {
    f.read_at(fd, offset, dst, n * 8);
    return;
  }
  std::vector<std::uint32_t> narrow(n);
  f.read_at(fd, offset, narrow.data(), n * 4);
  std::copy(narrow.begin(), narrow.end(), dst);
}

}  // namespace

SequenceShardReader::SequenceShardReader(const std::filesystem::path& dir, const ModelSpec& model,
                                         Split split)
    : model_(model), cursor_(std::make_unique<shard_io::SplitCursor>()) {
  require_hstu(model, "the sequence shard reader");
  const nlohmann::json j = shard_io::read_meta(dir);
  const MetaField meta(j, (dir / "meta.json").string(), "");
  if (const std::string format = meta.has("format") ? meta["format"].text() : ""; format != kFormat)
    meta["format"].fail(
        fmt::format("expected '{}' (a dataset of an HSTU model), got '{}'", kFormat, format));
  const SequenceSpec& seq = model.hstu->sequence;
  if (const std::int64_t max_len = meta["max_len"].integer(); max_len > seq.max_len)
    meta["max_len"].fail(fmt::format(
        "the data's histories go up to {} events, model '{}' takes at most {}: write the data "
        "again for this model",
        max_len, model.name, seq.max_len));
  if (const std::int64_t targets = meta["targets"].integer(); targets != seq.targets)
    meta["targets"].fail(fmt::format("the data has {} targets an example, model '{}' {}", targets,
                                     model.name, seq.targets));
  const MetaField tasks = meta["tasks"];
  if (tasks.size() != model.hstu->tasks.size())
    tasks.fail(fmt::format("the data has {} tasks, model '{}' has {}", tasks.size(), model.name,
                           model.hstu->tasks.size()));
  for (std::size_t k = 0; k < tasks.size(); ++k)
    if (tasks[k].text() != model.hstu->tasks[k])
      tasks[k].fail(fmt::format("the data's task {} is '{}', model '{}' has '{}'", k,
                                tasks[k].text(), model.name, model.hstu->tasks[k]));
  check_tables(meta["features"], seq.features, model, "event features");
  check_tables(meta["tables"], model.tables, model, "context tables");
  source_ = meta.has("source") ? meta["source"].text() : std::string();
  const MetaField files = meta["splits"][split_name(split)]["files"];
  for (std::size_t i = 0; i < files.size(); ++i) {
    auto f = std::make_unique<File>();
    f->path = dir / shard_io::part_file_name(files[i]);
    const std::int64_t expected = files[i]["examples"].integer();
    if (expected <= 0)
      files[i]["examples"].fail(fmt::format("{} is not a positive count", expected));
    const std::string name = fmt::format("'{}'", f->path.string());
    const Fd fd = f->open_and_stat();
    if (f->bytes < sizeof(Header))
      throw InputError(fmt::format("{}: {} bytes, shorter than the 64-byte header (truncated?)",
                                   name, f->bytes));
    f->read_at(fd, 0, &f->h, sizeof(Header));
    const Header& h = f->h;
    if (std::memcmp(h.magic, kMagic, 8) != 0)
      throw InputError(fmt::format("{}: not a parity sequence shard file (bad magic)", name));
    if (h.version != kVersion)
      throw InputError(
          fmt::format("{}: header field 'version' is {}, expected {}", name, h.version, kVersion));
    if (h.id_bytes != 4 && h.id_bytes != 8)
      throw InputError(
          fmt::format("{}: header field 'id_bytes' is {}, expected 4 or 8", name, h.id_bytes));
    if (h.examples != expected)
      throw InputError(fmt::format("{}: header field 'examples' is {}, meta.json says {}", name,
                                   h.examples, expected));
    if (h.targets != seq.targets || h.tasks != static_cast<int>(model.hstu->tasks.size()) ||
        h.features != static_cast<int>(seq.features.size()) || h.contexts != model.num_tables())
      throw InputError(fmt::format(
          "{}: header says {} targets, {} tasks, {} event features and {} context tables; model "
          "'{}' has {}, {}, {} and {}",
          name, h.targets, h.tasks, h.features, h.contexts, model.name, seq.targets,
          model.hstu->tasks.size(), seq.features.size(), model.num_tables()));
    // Every count bounded by the file's size before any product of them (no overflow below).
    const auto bytes = static_cast<std::int64_t>(f->bytes);
    if (h.events < 0 || h.events > bytes / 8 || h.context_ids < 0 ||
        h.context_ids > bytes / static_cast<std::int64_t>(h.id_bytes) || h.examples > bytes / 8 ||
        h.probabilities > 1)
      throw InputError(fmt::format(
          "{}: header fields 'events', 'context_ids', 'examples' or 'probabilities' are out of "
          "range (corrupt file)",
          name));
    f->sec = sections_of(h);
    if (f->sec.end != f->bytes)
      throw InputError(fmt::format("{}: {} bytes, the header implies {} (truncated or corrupt)",
                                   name, f->bytes, f->sec.end));
    // The history offsets start at 0, give every example 1 to max_len events and end at the
    // file's events; the context offsets run on from table to table and end at its ids.
    const auto n = static_cast<std::size_t>(h.examples);
    std::vector<std::int64_t> offsets(n + 1);
    f->read_at(fd, f->sec.history, offsets.data(), offsets.size() * 8);
    if (offsets.front() != 0 || offsets.back() != h.events)
      throw InputError(fmt::format("{}: the history offsets run from {} to {}, expected 0 to {}",
                                   name, offsets.front(), offsets.back(), h.events));
    for (std::size_t e = 0; e < n; ++e)
      if (const std::int64_t len = offsets[e + 1] - offsets[e]; len < 1 || len > seq.max_len)
        throw InputError(
            fmt::format("{}: example {} has a history of {} events (model '{}' takes 1 to {})",
                        name, e, len, model.name, seq.max_len));
    std::int64_t at = 0;
    for (int c = 0; c < h.contexts; ++c) {
      f->read_at(fd, f->sec.context_offsets + 8 * static_cast<std::uint64_t>(c) * (n + 1),
                 offsets.data(), offsets.size() * 8);
      bool ok = offsets.front() == at;
      for (std::size_t e = 0; e < n && ok; ++e) ok = offsets[e + 1] >= offsets[e];
      if (!ok || offsets.back() > h.context_ids)
        throw InputError(fmt::format(
            "{}: the offsets of context table {} are inconsistent (corrupt file)", name, c));
      at = offsets.back();
    }
    if (at != h.context_ids)
      throw InputError(fmt::format("{}: the context offsets cover {} ids, the header says {}", name,
                                   at, h.context_ids));
    cursor_->add_file(h.examples);
    files_.push_back(std::move(f));
  }
}

SequenceShardReader::~SequenceShardReader() = default;

std::int64_t SequenceShardReader::examples() const {
  return cursor_->examples();
}

std::int64_t SequenceShardReader::epoch() const {
  return cursor_->epoch();
}

void SequenceShardReader::seek(std::int64_t example, bool wrap) {
  cursor_->seek(example, wrap);
}

bool SequenceShardReader::next(std::int64_t batch_size, Batch& out, bool wrap) {
  struct Piece {
    const File* f;
    std::int64_t first, count;
    std::int64_t event_first = 0, events = 0;  // in the file
    std::int64_t at = 0, event_at = 0;         // in the batch
  };
  std::vector<Piece> pieces;
  std::int64_t n = 0;
  for (const auto& p : cursor_->take(batch_size, wrap)) {
    pieces.push_back({files_[p.file].get(), p.first, p.count});
    n += p.count;
  }
  if (n == 0) return false;
  const SequenceSpec& seq = model_.hstu->sequence;
  const int targets = seq.targets, tasks = static_cast<int>(model_.hstu->tasks.size());
  const int features = static_cast<int>(seq.features.size()), contexts = model_.num_tables();
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  std::vector<Fd> fds;
  for (const Piece& p : pieces) fds.push_back(p.f->reopen());
  out.size = n;
  out.num_dense = 0;
  out.dense.clear();
  out.num_tables = contexts;
  out.targets = targets;
  out.tasks = tasks;
  out.features = features;
  // The history offsets first: they say how many events each piece brings.
  out.history_offsets.assign(at(n) + 1, 0);
  std::int64_t example_at = 0, event_at = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    Piece& p = pieces[i];
    std::int64_t* dst = out.history_offsets.data() + example_at;
    p.f->read_at(fds[i], p.f->sec.history + 8 * static_cast<std::uint64_t>(p.first), dst,
                 at(p.count + 1) * 8);
    // Checked at open; read again here, so checked again (a file rewritten in place at the same
    // size would otherwise index past the batch's arrays).
    for (std::int64_t k = 0; k < p.count; ++k)
      if (dst[k] < 0 || dst[k + 1] - dst[k] < 1 || dst[k + 1] - dst[k] > seq.max_len ||
          dst[k + 1] > p.f->h.events)
        throw InputError(fmt::format(
            "'{}': the history offsets of example {} changed since the file was opened (it was "
            "rewritten while being read?)",
            p.f->path.string(), p.first + k));
    p.event_first = dst[0];
    p.events = dst[p.count] - dst[0];
    for (std::int64_t k = 0; k <= p.count; ++k) dst[k] += event_at - p.event_first;
    p.at = example_at;
    p.event_at = event_at;
    example_at += p.count;
    event_at += p.events;
  }
  const std::int64_t events = event_at;
  const std::int64_t scores = static_cast<std::int64_t>(targets) * tasks;
  const bool probabilities = std::all_of(pieces.begin(), pieces.end(),
                                         [](const Piece& p) { return p.f->h.probabilities != 0; });
  out.labels.resize(at(n * scores));
  out.teacher_prob.resize(probabilities ? at(n * scores) : 0);
  out.unordered_prob.resize(out.teacher_prob.size());
  out.event_times.resize(at(events));
  out.event_ids.resize(at(features) * at(events));
  out.target_ids.resize(at(n * targets));
  out.target_times.resize(at(n * targets));
  out.offsets.assign(at(contexts) * at(n) + 1, 0);
  // Per context table, each piece's offsets; the ids follow once their count is known.
  std::vector<std::int64_t> id_first(at(contexts) * pieces.size()),
      id_count(at(contexts) * pieces.size());
  std::int64_t ids = 0;
  for (int c = 0; c < contexts; ++c)
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const File& f = *p.f;
      std::vector<std::int64_t> offs(at(p.count) + 1);
      f.read_at(fds[i],
                f.sec.context_offsets + 8 * (static_cast<std::uint64_t>(c) *
                                                 static_cast<std::uint64_t>(f.h.examples + 1) +
                                             static_cast<std::uint64_t>(p.first)),
                offs.data(), offs.size() * 8);
      for (std::int64_t k = 0; k < p.count; ++k)
        out.offsets[at(c * n + p.at + k)] = ids + offs[at(k)] - offs[0];
      id_first[at(c) * pieces.size() + i] = offs[0];
      id_count[at(c) * pieces.size() + i] = offs.back() - offs[0];
      ids += offs.back() - offs[0];
    }
  out.offsets.back() = ids;
  out.ids.resize(at(ids));
  std::int64_t id_at = 0;
  for (int c = 0; c < contexts; ++c)
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const File& f = *pieces[i].f;
      const std::int64_t count = id_count[at(c) * pieces.size() + i];
      read_ids(f, fds[i],
               f.sec.context_ids +
                   f.h.id_bytes * static_cast<std::uint64_t>(id_first[at(c) * pieces.size() + i]),
               static_cast<int>(f.h.id_bytes), out.ids.data() + id_at, at(count));
      id_at += count;
    }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const File& f = *p.f;
    const Fd& fd = fds[i];
    const std::uint64_t w = f.h.id_bytes;
    const auto first = static_cast<std::uint64_t>(p.first);
    const auto s = static_cast<std::uint64_t>(scores);
    f.read_at(fd, f.sec.labels + 4 * first * s, out.labels.data() + p.at * scores,
              at(p.count * scores) * 4);
    if (probabilities) {
      f.read_at(fd, f.sec.teacher + 4 * first * s, out.teacher_prob.data() + p.at * scores,
                at(p.count * scores) * 4);
      f.read_at(fd, f.sec.unordered + 4 * first * s, out.unordered_prob.data() + p.at * scores,
                at(p.count * scores) * 4);
    }
    const auto ev = static_cast<std::uint64_t>(p.event_first);
    f.read_at(fd, f.sec.times + 8 * ev, out.event_times.data() + p.event_at, at(p.events) * 8);
    for (int k = 0; k < features; ++k)
      read_ids(
          f, fd,
          f.sec.events +
              w * (static_cast<std::uint64_t>(k) * static_cast<std::uint64_t>(f.h.events) + ev),
          static_cast<int>(w), out.event_ids.data() + k * events + p.event_at, at(p.events));
    const auto t = static_cast<std::uint64_t>(targets);
    read_ids(f, fd, f.sec.target_ids + w * first * t, static_cast<int>(w),
             out.target_ids.data() + p.at * targets, at(p.count * targets));
    f.read_at(fd, f.sec.target_times + 8 * first * t, out.target_times.data() + p.at * targets,
              at(p.count * targets) * 8);
  }
  // Every example checked as the model takes it; a bad one named by its file and index there.
  for (const Piece& p : pieces)
    for (std::int64_t k = 0; k < p.count; ++k)
      if (const std::string why = example_problem(out, model_, p.at + k); !why.empty())
        throw InputError(fmt::format("'{}': example {}: {}", p.f->path.string(), p.first + k, why));
  return true;
}

}  // namespace parity
