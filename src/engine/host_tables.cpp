#include "engine/host_tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <numeric>

#include "parity/error.h"

namespace parity::engine {
namespace {

constexpr std::uint32_t kNone = TableLayout::kNotCached;

std::size_t state_elements(OptimizerKind k, std::int64_t rows, int dim) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cache_state_per_row(k, dim));
}

}  // namespace

// Linear in the rows: a histogram of the counts finds the threshold count, and only rows above
// the histogram's range are sorted; the threshold bucket's ties are taken in two passes (cached
// rows first, then the others, each in row order) rather than gathered and partitioned, which for
// a 150M-row table with few rows looked up (nearly every row a tie at count 0) took seconds.
std::vector<std::uint8_t> choose_cache_rows(const std::vector<std::uint32_t>& counts,
                                            const std::vector<std::uint32_t>& slot,
                                            std::int64_t keep) {
  const std::size_t rows = counts.size();
  std::vector<std::uint8_t> chosen(rows, 0);
  constexpr std::uint32_t kTop = 1u << 16;  // counts at or above it share the last bucket
  std::vector<std::uint64_t> hist(kTop + 1, 0);
  for (const std::uint32_t c : counts) ++hist[std::min(c, kTop)];
  auto need = static_cast<std::uint64_t>(std::max<std::int64_t>(keep, 0));
  std::uint32_t t = kTop;  // the threshold bucket: every row above it is chosen
  for (;; --t) {
    if (hist[t] >= need || t == 0) break;
    need -= hist[t];
  }
  std::uint64_t cached_ties = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint32_t b = std::min(counts[r], kTop);
    if (b > t)
      chosen[r] = 1;
    else if (b == t && slot[r] != kNone)
      ++cached_ties;
  }
  if (t == kTop) {  // the top bucket holds distinct counts: ordered by count, then as below
    std::vector<std::uint32_t> ties;
    for (std::size_t r = 0; r < rows; ++r)
      if (counts[r] >= kTop) ties.push_back(static_cast<std::uint32_t>(r));
    std::sort(ties.begin(), ties.end(), [&](std::uint32_t a, std::uint32_t b) {
      if (counts[a] != counts[b]) return counts[a] > counts[b];
      const bool ca = slot[a] != kNone, cb = slot[b] != kNone;
      if (ca != cb) return ca;
      return a < b;
    });
    for (std::size_t i = 0; i < ties.size() && i < need; ++i) chosen[ties[i]] = 1;
    return chosen;
  }
  std::uint64_t take_cached = std::min(need, cached_ties), take_other = need - take_cached;
  for (std::size_t r = 0; r < rows && (take_cached > 0 || take_other > 0); ++r) {
    if (std::min(counts[r], kTop) != t) continue;
    std::uint64_t& take = slot[r] != kNone ? take_cached : take_other;
    if (take == 0) continue;
    chosen[r] = 1;
    --take;
  }
  return chosen;
}

HostTables::HostTables(Backend& backend, const ModelSpec& spec, ModelLayout& layout)
    : backend_(backend),
      num_tables_(static_cast<int>(spec.tables.size())),
      opt_(layout.emb_opt.kind) {
  counts_.assign(spec.tables.size(), nullptr);
  for (std::size_t t = 0; t < spec.tables.size(); ++t) {
    const TableSpec& ts = spec.tables[t];
    if (!ts.host_placed) continue;
    if (ts.rows >= static_cast<std::int64_t>(kNone))
      throw InputError(fmt::format("table '{}': {} rows; a host-placed table has fewer than {}",
                                   ts.name, ts.rows, kNone));
    if (ts.cache_rows < 0 || ts.cache_rows > ts.rows)
      throw InputError(fmt::format("table '{}': cache_rows {} is outside [0, {}]", ts.name,
                                   ts.cache_rows, ts.rows));
    Table h;
    h.index = static_cast<int>(t);
    h.rows = ts.rows;
    h.cache_rows = ts.cache_rows;
    h.weight_bytes =
        static_cast<std::size_t>(ts.rows) * static_cast<std::size_t>(ts.dim) * dtype_size(ts.dtype);
    const std::size_t se = state_elements(layout.emb_opt.kind, ts.rows, ts.dim);
    h.state_bytes = se * sizeof(float);
    try {
      h.host_weights = HostBlock(backend, h.weight_bytes);
      h.host_state = HostBlock(backend, h.state_bytes);
    } catch (const Error& e) {
      throw Error(fmt::format("table '{}' is placed in host memory and needs {:.2f} GB there: {}",
                              ts.name, (h.weight_bytes + h.state_bytes) / 1e9, e.what()));
    }
    auto* host_state = static_cast<float*>(h.host_state.get());
    if (se > 0)
      backend.fill(host_state, static_cast<std::int64_t>(se),
                   initial_optimizer_state(layout.emb_opt));
    const auto rows = static_cast<std::size_t>(ts.rows);
    const auto cached = static_cast<std::size_t>(ts.cache_rows);
    h.slot = Buffer(backend, rows * sizeof(std::uint32_t));
    h.counts = Buffer(backend, rows * sizeof(std::uint32_t));
    h.cached = Buffer(backend, cached * sizeof(std::int64_t));
    h.moves = Buffer(backend, cached * sizeof(std::int64_t));
    h.slot_host.assign(rows, kNone);
    h.cached_host.resize(cached);
    for (std::size_t i = 0; i < cached; ++i) {
      h.slot_host[i] = static_cast<std::uint32_t>(i);
      h.cached_host[i] = static_cast<std::int64_t>(i);
    }
    backend.copy_to_device(h.slot.get(), h.slot_host.data(), h.slot.bytes());
    backend.copy_to_device(h.cached.get(), h.cached_host.data(), h.cached.bytes());
    // Zero bits: the fill writes +0.0f, whose pattern is the integer 0.
    backend.fill(h.counts.as<float>(), ts.rows, 0.0f);
    counts_[t] = h.counts.as<std::uint32_t>();
    TableLayout& l = layout.tables[t];
    l.host.weights = h.host_weights.get();
    l.host.state = host_state;
    l.host.slot = h.slot.as<std::uint32_t>();
    l.host.cached = h.cached.as<std::int64_t>();
    l.host.cache_rows = h.cache_rows;
    tables_.push_back(std::move(h));
  }
  if (!tables_.empty()) {
    stats_ = Buffer(backend, 2 * spec.tables.size() * sizeof(std::uint64_t));
    backend.fill(stats_.as<float>(), 4 * num_tables_, 0.0f);
  }
}

HostTables::~HostTables() {
  if (!tables_.empty()) backend_.synchronize();  // no kernel may still read the host rows
}

void HostTables::observe(std::span<const TableLayout> layouts, const SparseInput& in) {
  backend_.embedding_cache_observe(layouts, in, counts_, stats_.as<std::uint64_t>());
}

bool HostTables::refresh_due(std::int64_t step) {
  return step >= 4 && std::has_single_bit(static_cast<std::uint64_t>(step)) &&
         std::countr_zero(static_cast<std::uint64_t>(step)) % 2 == 0;
}

void HostTables::refresh(std::span<TableLayout> layouts, const TableWeights& weights,
                         float* state) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::uint32_t> counts;
  std::vector<std::int64_t> moves;
  for (Table& h : tables_) {
    if (h.cache_rows == 0) continue;
    const auto rows = static_cast<std::size_t>(h.rows);
    counts.resize(rows);
    backend_.copy_to_host(counts.data(), h.counts.get(), rows * sizeof(std::uint32_t));
    const std::vector<std::uint8_t> chosen = choose_cache_rows(counts, h.slot_host, h.cache_rows);
    std::vector<std::size_t> leaving;
    std::vector<std::uint32_t> entering;
    for (std::size_t i = 0; i < h.cached_host.size(); ++i)
      if (!chosen[static_cast<std::size_t>(h.cached_host[i])]) leaving.push_back(i);
    for (std::size_t r = 0; r < rows; ++r)
      if (chosen[r] && h.slot_host[r] == kNone) entering.push_back(static_cast<std::uint32_t>(r));
    if (leaving.size() != entering.size())
      throw Error(fmt::format("HostTables::refresh: table {}: {} cache rows leave and {} enter",
                              h.index, leaving.size(), entering.size()));
    // A row enters only in place of one with fewer than half its lookups (less one): a move
    // that gains little is not worth its two transfers (on uniform ids most would be noise).
    // The most looked-up entering rows take the places of the least looked-up leaving ones.
    const auto count_of_slot = [&](std::size_t i) {
      return counts[static_cast<std::size_t>(h.cached_host[i])];
    };
    std::sort(leaving.begin(), leaving.end(), [&](std::size_t a, std::size_t b) {
      return count_of_slot(a) != count_of_slot(b) ? count_of_slot(a) < count_of_slot(b) : a < b;
    });
    std::sort(entering.begin(), entering.end(), [&](std::uint32_t a, std::uint32_t b) {
      return counts[a] != counts[b] ? counts[a] > counts[b] : a < b;
    });
    std::size_t worth = 0;
    while (worth < leaving.size() &&
           static_cast<std::uint64_t>(counts[entering[worth]]) >=
               2 * static_cast<std::uint64_t>(count_of_slot(leaving[worth])) + 2)
      ++worth;
    leaving.resize(worth);
    entering.resize(worth);
    if (leaving.empty()) continue;
    TableLayout moving = layouts[static_cast<std::size_t>(h.index)];
    moving.host.cached = h.moves.as<std::int64_t>();
    // The rows leaving go back to host memory first, then the rows entering take their places.
    moves.assign(h.cached_host.size(), -1);
    for (const std::size_t i : leaving) moves[i] = h.cached_host[i];
    backend_.copy_to_device(h.moves.get(), moves.data(), h.moves.bytes());
    backend_.embedding_cache_copy(moving, weights, state, opt_, /*to_cache=*/false);
    moves.assign(h.cached_host.size(), -1);
    for (std::size_t k = 0; k < leaving.size(); ++k) {
      const std::size_t i = leaving[k];
      const std::uint32_t r = entering[k];
      h.slot_host[static_cast<std::size_t>(h.cached_host[i])] = kNone;
      h.cached_host[i] = r;
      h.slot_host[r] = static_cast<std::uint32_t>(i);
      moves[i] = r;
    }
    backend_.copy_to_device(h.moves.get(), moves.data(), h.moves.bytes());
    backend_.embedding_cache_copy(moving, weights, state, opt_, /*to_cache=*/true);
    backend_.copy_to_device(h.cached.get(), h.cached_host.data(), h.cached.bytes());
    backend_.copy_to_device(h.slot.get(), h.slot_host.data(), h.slot.bytes());
  }
  if (!tables_.empty()) backend_.fill(stats_.as<float>(), 4 * num_tables_, 0.0f);
  backend_.synchronize();
  ++refreshes_;
  refresh_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void HostTables::write_back(std::span<const TableLayout> layouts, const TableWeights& weights,
                            float* state) {
  // Twice in a row (a checkpoint loaded into the host rows in between) would overwrite the
  // loaded rows with the caches' old values.
  if (host_current_) return;
  for (const Table& h : tables_)
    if (h.cache_rows > 0)
      backend_.embedding_cache_copy(layouts[static_cast<std::size_t>(h.index)], weights, state,
                                    opt_, /*to_cache=*/false);
  backend_.synchronize();  // the host rows are read directly next
  host_current_ = true;
}

void HostTables::load(std::span<const TableLayout> layouts, const TableWeights& weights,
                      float* state) {
  for (const Table& h : tables_)
    if (h.cache_rows > 0)
      backend_.embedding_cache_copy(layouts[static_cast<std::size_t>(h.index)], weights, state,
                                    opt_, /*to_cache=*/true);
  host_current_ = true;
}

std::vector<HostTables::TableStats> HostTables::stats() {
  std::vector<TableStats> out;
  if (tables_.empty()) return out;
  std::vector<std::uint64_t> s(2 * static_cast<std::size_t>(num_tables_));
  backend_.copy_to_host(s.data(), stats_.get(), stats_.bytes());
  for (const Table& h : tables_) {
    const auto i = static_cast<std::size_t>(h.index);
    out.push_back({h.index, h.rows, h.cache_rows, s[2 * i], s[2 * i + 1]});
  }
  return out;
}

std::size_t HostTables::device_bytes() const {
  std::size_t n = stats_.bytes();
  for (const Table& h : tables_)
    n += h.slot.bytes() + h.counts.bytes() + h.cached.bytes() + h.moves.bytes();
  return n;
}

std::size_t HostTables::host_bytes() const {
  std::size_t n = 0;
  for (const Table& h : tables_) n += h.weight_bytes + h.state_bytes;
  return n;
}

}  // namespace parity::engine
