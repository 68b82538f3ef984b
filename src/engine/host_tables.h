// Tables the plan places in host memory (TableLayout::host): their rows in host-resident memory,
// each one's HBM cache map, the lookups counted per row, and the choice of the rows each cache
// holds.
//
// Why it is built this way: a table too large for HBM is read and updated where it lives, by the
// same embedding kernels, through one indirection per row (slot[r]: its cache row or none), so a
// run with host-placed tables computes exactly what a run with every table in HBM computes (ids,
// sort keys, sums and stochastic rounding are the same; only addresses differ). Which rows are
// worth HBM is learnt from the data: every lookup of a host-placed table is counted on the device,
// and at refresh steps (a geometric schedule: 4, 16, 64, ... steps) each cache moves towards the
// most looked-up rows so far (ties: rows already cached, then lower rows), moving only rows that
// change and only where a row entering has more than twice the lookups of the one it replaces. The
// planner models the same cache as holding the rows with the highest probability (perf.h,
// hot_fraction); the counted hit rate is reported beside its prediction.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/layout.h"
#include "parity/backend.h"
#include "parity/spec.h"

namespace parity::engine {

// The `keep` rows a cache should hold (chosen[r] = 1), of a table whose rows were looked up
// counts[r] times and are cached where slot[r] is not TableLayout::kNotCached: the most looked-up,
// ties going to rows already cached, then to lower rows. Linear in the rows.
std::vector<std::uint8_t> choose_cache_rows(const std::vector<std::uint32_t>& counts,
                                            const std::vector<std::uint32_t>& slot,
                                            std::int64_t keep);

class HostTables {
 public:
  // Allocates host memory and cache maps for the host-placed tables of `layout` (from the spec's
  // TableSpec::host_placed) and binds them in layout.tables[t].host. The caches start with rows
  // [0, cache_rows); the caller initialises the host rows, then calls load().
  HostTables(Backend& backend, const ModelSpec& spec, ModelLayout& layout);
  ~HostTables();
  HostTables(const HostTables&) = delete;
  HostTables& operator=(const HostTables&) = delete;

  bool empty() const { return tables_.empty(); }
  // Counts the lookups of a batch (enqueued before its embedding forward).
  void observe(std::span<const TableLayout> layouts, const SparseInput& in);
  // A training step was enqueued: the caches may now hold values the host rows do not.
  void trained_step() { host_current_ = false; }
  // Whether the caches are re-chosen after `step` steps (1-based: steps trained so far by this
  // model since it started or was set to a step).
  static bool refresh_due(std::int64_t step);
  // Re-chooses every cache's rows from the lookups counted so far, moving only the rows that
  // change, and restarts the hit counts. Synchronises.
  void refresh(std::span<TableLayout> layouts, const TableWeights& weights, float* state);
  // Every cache row written back to host memory (before the host rows are read as the tables'
  // values; synchronises, and does nothing where the host rows are already current), or read
  // from it (after they were written).
  void write_back(std::span<const TableLayout> layouts, const TableWeights& weights, float* state);
  void load(std::span<const TableLayout> layouts, const TableWeights& weights, float* state);

  struct TableStats {
    int table = 0;  // index in the model
    std::int64_t rows = 0, cache_rows = 0;
    std::uint64_t hits = 0, lookups = 0;  // since the last refresh
  };
  std::vector<TableStats> stats();  // synchronises

  // Refreshes made so far and the wall seconds they took (the host waits for them).
  int refreshes() const { return refreshes_; }
  double refresh_seconds() const { return refresh_s_; }

  std::size_t device_bytes() const;  // cache maps and lookup counts
  std::size_t host_bytes() const;    // host-resident rows and state

 private:
  // Host-resident memory from the backend, given back when destroyed.
  class HostBlock {
   public:
    HostBlock() = default;
    HostBlock(Backend& backend, std::size_t bytes)
        : backend_(&backend), p_(bytes > 0 ? backend.allocate_host_resident(bytes) : nullptr) {}
    ~HostBlock() {
      if (p_ != nullptr) backend_->deallocate_host_resident(p_);
    }
    HostBlock(HostBlock&& o) noexcept : backend_(o.backend_), p_(o.p_) { o.p_ = nullptr; }
    HostBlock& operator=(HostBlock&& o) noexcept {
      std::swap(backend_, o.backend_);
      std::swap(p_, o.p_);
      return *this;
    }
    void* get() const { return p_; }

   private:
    Backend* backend_ = nullptr;
    void* p_ = nullptr;
  };
  struct Table {
    int index = 0;  // in the model
    std::int64_t rows = 0, cache_rows = 0;
    HostBlock host_weights, host_state;
    std::size_t weight_bytes = 0, state_bytes = 0;
    Buffer slot;    // [rows] uint32
    Buffer cached;  // [cache_rows] int64
    Buffer moves;   // [cache_rows] int64: the rows a refresh moves
    Buffer counts;  // [rows] uint32
    std::vector<std::uint32_t> slot_host;
    std::vector<std::int64_t> cached_host;
  };
  Backend& backend_;
  std::vector<Table> tables_;
  std::vector<std::uint32_t*> counts_;  // per model table: counts or null
  Buffer stats_;                        // [2 * model tables] uint64
  int num_tables_ = 0;
  OptimizerKind opt_;
  bool host_current_ = true;  // the host rows hold every row's value (nothing trained since)
  int refreshes_ = 0;
  double refresh_s_ = 0;
};

}  // namespace parity::engine
