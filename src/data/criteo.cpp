// Criteo TSV reader (the Criteo 1TB click logs / Kaggle display-advertising format).
//
// Why it is built this way:
// - Real logs are big and dirty, so a bad line is never a crash: it is described precisely
//   ("FILE:LINE: what (field N 'name'), expected what") and either stops the run (the default:
//   silently dropping data is worse than stopping) or is counted and skipped.
// - Parsing does not use exceptions for control flow or allocate per field: a line is split
//   into string_views and each field is parsed with std::from_chars. A failure is first
//   recorded as a small struct and only formatted into a message when it is reported.
// - Ids are written straight into the table-major CSR with a stride of the requested batch
//   size, and compacted once at the end when the last batch is short.
// - Categorical values are hashed with a fixed function of (table index, value) so the same
//   file gives the same rows on every machine and every version: row = mix64(t << 32 | v) mod
//   rows_t, with mix64 the splitmix64 finaliser of random.h. Changing it invalidates trained
//   embeddings, so it is frozen.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/input_file.h"
#include "data/model_names.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/random.h"

namespace parity {
namespace {

constexpr int kNumDense = 13;
constexpr int kNumTables = 26;
constexpr int kNumFields = 1 + kNumDense + kNumTables;  // 40

std::string field_name(int field) {  // field is 0-based
  if (field == 0) return "label";
  if (field <= kNumDense) return fmt::format("I{}", field);
  return fmt::format("C{}", field - kNumDense);
}

// What went wrong on a line, formatted only when reported.
enum class Problem : std::uint8_t { none, field_count, label, integer, integer_range, categorical };

struct LineError {
  Problem problem = Problem::none;
  int field = 0;           // 0-based field index
  std::string_view value;  // the offending field
  int field_count = 0;
  bool carriage_return = false;  // a field-count error on a line that holds '\r'
};

// The value as it may appear in a message: printable, at most 40 characters.
std::string quoted(std::string_view v) {
  std::string s;
  const std::size_t n = std::min<std::size_t>(v.size(), 40);
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char ch = static_cast<unsigned char>(v[i]);
    if (ch == '\t') {
      s += "\\t";
    } else if (ch < 0x20 || ch == 0x7f) {
      s += '?';
    } else {
      s += static_cast<char>(ch);
    }
  }
  if (v.size() > n) s += "...";
  return fmt::format("'{}'", s);
}

std::string describe(const LineError& e) {
  const std::string at = fmt::format(" (field {} '{}')", e.field + 1, field_name(e.field));
  switch (e.problem) {
    case Problem::field_count:
      return fmt::format(
          "{} tab-separated field{}, expected 40 (label, 13 integer features, 26 categorical "
          "features){}",
          e.field_count, e.field_count == 1 ? "" : "s",
          e.carriage_return ? "; the line holds carriage returns: the file has CR (old Mac) line "
                              "endings? convert them with tr '\\r' '\\n'"
                            : "");
    case Problem::label:
      return fmt::format("bad label {}{}, expected 0 or 1", quoted(e.value), at);
    case Problem::integer:
      return fmt::format("bad integer feature {}{}, expected a decimal integer or an empty field",
                         quoted(e.value), at);
    case Problem::integer_range:
      return fmt::format(
          "integer feature {} out of range{}, expected an integer within the signed 64-bit range "
          "or an empty field",
          quoted(e.value), at);
    case Problem::categorical:
      return fmt::format(
          "bad categorical feature {}{}, expected 1 to 8 hexadecimal digits or an empty field",
          quoted(e.value), at);
    case Problem::none:
      break;
  }
  return "no error";
}

// "PATH: cannot open for reading (reason)".
InputError open_error(const std::filesystem::path& f, int saved_errno) {
  if (saved_errno == 0) return InputError(fmt::format("{}: cannot open for reading", f.string()));
  return InputError(
      fmt::format("{}: cannot open for reading ({})", f.string(), std::strerror(saved_errno)));
}

// Row of categorical value v in table t: fixed forever (see the top of the file).
std::int64_t categorical_row(int t, std::uint32_t v, std::int64_t rows) {
  const std::uint64_t h = rng::mix64((static_cast<std::uint64_t>(t) << 32) | v);
  return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(rows));
}

}  // namespace

CriteoReader::CriteoReader(std::vector<std::filesystem::path> files, const ModelSpec& model,
                           CriteoOptions options)
    : files_(std::move(files)), options_(options) {
  require_dlrm(model, "the Criteo reader");
  const std::string where = data_detail::model_where(model);
  require(model.dense_features == kNumDense, where,
          fmt::format("the Criteo reader needs 13 dense features, the model has {}",
                      model.dense_features));
  require(model.num_tables() == kNumTables, where,
          fmt::format("the Criteo reader needs 26 embedding tables, the model has {}",
                      model.num_tables()));
  for (int t = 0; t < kNumTables; ++t) {
    const TableSpec& spec = model.tables[t];
    const std::string twhere = data_detail::table_where(model, t);
    require(spec.pooling_size == 1, twhere,
            fmt::format(
                "the Criteo reader needs pooling_size 1 (one categorical value per table), got {}",
                spec.pooling_size));
    require(spec.rows > 0, twhere, fmt::format("rows must be > 0, got {}", spec.rows));
    table_rows_.push_back(spec.rows);
  }
  if (files_.empty()) throw InputError("CriteoReader: no input files given");
  require(options_.max_reported >= 0, "CriteoReader",
          fmt::format("max_reported must be >= 0, got {}", options_.max_reported));
  // Fail before training starts rather than hours in.
  for (const auto& f : files_) {
    require_regular_file(f, "Criteo TSV file");
    errno = 0;
    std::ifstream probe(f, std::ios::binary);
    if (!probe) throw open_error(f, errno);
    // Compressed or binary files would be reported line by line as field-count errors.
    char head[4096];
    probe.read(head, sizeof head);
    const auto got = static_cast<std::size_t>(probe.gcount());
    const std::string_view start(head, got);
    if (start.starts_with("\x1f\x8b"))
      throw InputError(fmt::format(
          "{}: gzip-compressed; decompress it first (zcat {} > day.tsv): the reader takes plain "
          "TSV",
          f.string(), f.string()));
    if (start.starts_with("\x28\xb5\x2f\xfd"))
      throw InputError(
          fmt::format("{}: zstd-compressed; decompress it first (zstd -d)", f.string()));
    if (start.find('\0') != std::string_view::npos)
      throw InputError(
          fmt::format("{}: holds NUL bytes in its first {} bytes: a binary file, not Criteo TSV",
                      f.string(), got));
  }
}

bool CriteoReader::open_next() {
  if (in_.is_open()) in_.close();
  in_.clear();
  if (file_index_ >= files_.size()) return false;
  const std::filesystem::path& f = files_[file_index_++];
  errno = 0;
  in_.open(f, std::ios::binary);
  if (!in_) throw open_error(f, errno);
  line_no_ = 0;
  return true;
}

bool CriteoReader::next(std::int64_t batch_size, Batch& out) {
  if (batch_size <= 0) {
    throw Error(fmt::format("CriteoReader::next: batch_size must be > 0, got {}", batch_size));
  }
  const std::size_t cap = static_cast<std::size_t>(batch_size);
  out.num_dense = kNumDense;
  out.num_tables = kNumTables;
  out.teacher_prob.clear();
  out.dense.resize(cap * kNumDense);
  out.labels.resize(cap);
  out.ids.resize(cap * kNumTables);  // table t of example b at t*batch_size + b until compacted

  std::string line;
  std::array<std::string_view, kNumFields> fields;
  std::int64_t n = 0;
  while (n < batch_size) {
    if (!in_.is_open() || !std::getline(in_, line)) {
      if (in_.is_open() && in_.bad()) {
        throw InputError(
            fmt::format("{}:{}: read error", files_[file_index_ - 1].string(), line_no_ + 1));
      }
      if (!open_next()) break;
      continue;
    }
    ++line_no_;
    ++lines_read_;
    std::string_view rest(line);
    if (!rest.empty() && rest.back() == '\r') rest.remove_suffix(1);

    // Split into fields, counting past 40 for the message.
    LineError err;
    int count = 0;
    for (;;) {
      const std::size_t tab = rest.find('\t');
      const std::string_view f = rest.substr(0, tab);
      if (count < kNumFields) fields[count] = f;
      ++count;
      if (tab == std::string_view::npos) break;
      rest.remove_prefix(tab + 1);
    }
    if (count != kNumFields) {
      err.problem = Problem::field_count;
      err.field_count = count;
      err.carriage_return = line.find('\r') != std::string::npos;
    }

    const std::size_t b = static_cast<std::size_t>(n);
    if (err.problem == Problem::none) {
      const std::string_view label = fields[0];
      if (label == "0" || label == "1") {
        out.labels[b] = label == "1" ? 1.0f : 0.0f;
      } else {
        err = {Problem::label, 0, label, count};
      }
    }
    for (int i = 0; i < kNumDense && err.problem == Problem::none; ++i) {
      const std::string_view f = fields[1 + i];
      double x = 0.0;
      if (!f.empty()) {
        std::int64_t v = 0;
        const auto [ptr, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
        if (ec == std::errc::result_out_of_range && ptr == f.data() + f.size()) {
          err = {Problem::integer_range, 1 + i, f, count};
          break;
        }
        if (ec != std::errc() || ptr != f.data() + f.size()) {
          err = {Problem::integer, 1 + i, f, count};
          break;
        }
        x = std::log1p(static_cast<double>(v > 0 ? v : 0));
      }
      out.dense[b * kNumDense + i] = static_cast<float>(x);
    }
    for (int t = 0; t < kNumTables && err.problem == Problem::none; ++t) {
      const std::string_view f = fields[1 + kNumDense + t];
      std::int64_t row = 0;
      if (!f.empty()) {
        std::uint32_t v = 0;
        const auto [ptr, ec] = std::from_chars(f.data(), f.data() + f.size(), v, 16);
        if (f.size() > 8 || ec != std::errc() || ptr != f.data() + f.size()) {
          err = {Problem::categorical, 1 + kNumDense + t, f, count};
          break;
        }
        row = categorical_row(t, v, table_rows_[t]);
      }
      out.ids[static_cast<std::size_t>(t) * cap + b] = row;
    }

    if (err.problem == Problem::none) {
      ++n;
      continue;
    }
    ++bad_lines_;
    const bool report = options_.on_bad_line == OnBadLine::stop ||
                        static_cast<std::int64_t>(warnings_.size()) < options_.max_reported;
    if (report) {
      std::string message =
          fmt::format("{}:{}: {}", files_[file_index_ - 1].string(), line_no_, describe(err));
      // Stop mode: the examples of this call are dropped with the batch; the run is stopping.
      if (options_.on_bad_line == OnBadLine::stop) throw InputError(message);
      warnings_.push_back(std::move(message));
    }
  }

  // Compact the ids to a stride of n (moving forward is safe: t*n <= t*cap).
  const std::size_t rows = static_cast<std::size_t>(n);
  if (rows < cap) {
    for (std::size_t t = 1; t < kNumTables; ++t) {
      std::copy(out.ids.begin() + t * cap, out.ids.begin() + t * cap + rows,
                out.ids.begin() + t * rows);
    }
  }
  out.size = n;
  out.dense.resize(rows * kNumDense);
  out.labels.resize(rows);
  out.ids.resize(rows * kNumTables);
  out.offsets.resize(rows * kNumTables + 1);
  for (std::size_t i = 0; i < out.offsets.size(); ++i)
    out.offsets[i] = static_cast<std::int64_t>(i);
  return n > 0;
}

}  // namespace parity
