// Table-batched embedding bags on the GPU: the forward (pooling) of every table of a step in one
// launch, and the backward fused with the optimizer update. Host entry points only; the kernels
// live in embedding_forward.cu and embedding_backward.cu.
//
// The math is Backend::embedding_forward / embedding_backward_update (include/parity/backend.h)
// and the data layout is the CPU backend's exactly: TableLayout offsets into one weight buffer
// (elements), one table-major CSR SparseInput (int64 ids, offsets of length T*B + 1), output rows
// with a leading dimension and out_col relative to the output view. Tables of each storage type
// (fp32, fp16, bf16) live in a buffer of that type (TableWeights), each at its element offset.
// One call handles every table: the forward launches once per storage type present, the backward
// sorts every occurrence once and launches its update kernels once per storage type (the keys of
// each type's tables form one range, so its rows are one contiguous run of segments).
//
// What the GPU adds to the CPU contract:
// - the caller passes nnz = offsets[T*B] (the host knows it when it builds the batch), so that no
//   call reads it back from the device;
// - bad ids (outside [0, rows)) and decreasing offsets cannot throw inside a kernel: the kernels
//   skip them and record the first one; EmbeddingTables::raise_input_errors() synchronises and
//   throws the InputError the CPU backend would have thrown (call it where a check is wanted);
// - fp16/bf16 weights are updated with stochastic rounding, seeded by (seed, step, table, row,
//   column), so a run is reproducible bit for bit;
// - the update is deterministic: duplicate ids are combined in batch order after a stable sort,
//   and heavy rows are split over many warps with a fixed-order two-level sum (no float atomics).
//
// Typical use (all pointers are device pointers):
//   EmbeddingTables tables(layouts);                  // uploads the layouts once
//   EmbeddingWorkspace ws(tables, max_batch, max_nnz); // all scratch, allocated once
//   embedding_forward(stream, tables, weights, input, {out, DType::f32, B, cols, ld});
//   embedding_backward_update(stream, tables, weights, state, input, {dout, ...}, opt, upd, ws);
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/gpu/port.h"
#include "backend/gpu/radix_sort.h"
#include "backend/gpu/runtime.h"
#include "parity/backend.h"
#include "parity/dtype.h"

namespace parity::gpu {

namespace detail {
// One table as the kernels read it (device memory, uploaded once).
struct TableMeta {
  std::int64_t weight_offset;
  std::int64_t state_offset;
  std::int64_t out_col;
  std::int64_t rows;
  std::uint32_t key_base;  // first linearised key of the table (keyed by launch group, then in
                           // input order: see EmbeddingTables)
  int dim;
  int pooling;  // 0 sum, 1 mean
  int input;    // the table's index in the sparse input (and in the error reports)
  // Host placement (TableLayout::host; slot null otherwise): row r is cache row slot[r] at
  // weight_offset (state at state_offset), or host row r at host_weight_offset (state at
  // host_state_offset): element offsets from the type's weight buffer and from the state buffer
  // to the host-resident rows (EmbeddingTables::bind sets them for the buffers of a call).
  const std::uint32_t* slot;
  std::int64_t host_weight_offset;
  std::int64_t host_state_offset;
  // Stochastic rounding's table, first row and first column (TableLayout::round_*; round_table
  // resolved: never negative).
  std::int64_t round_table, round_row, round_col;
};
// The first bad input a kernel met (code 0: none).
struct InputErrorRecord {
  int code;  // 1 id out of range, 2 offsets decrease or leave [0, nnz]
  int table;
  std::int64_t bag;
  std::int64_t id;
};
}  // namespace detail

// The tables of one launch: one storage type and one lane shape (launch_groups); their indices in
// the input, and their metadata in that order (what a forward launch over them reads;
// TableMeta::input maps back to the input).
struct TableGroup {
  DType dtype = DType::f32;
  std::vector<int> tables;  // input indices, in input order within each run
  int max_dim = 0;
  // The forward's launches: tables[first, first + count) sum bags_per_group bags per group of
  // lanes (from TableLayout::ids_per_bag).
  struct Run {
    int first = 0, count = 0, bags_per_group = 1;
  };
  std::vector<Run> runs;
  bool host_placed = false;                  // some table of the group is (TableLayout::host)
  std::uint32_t key_begin = 0, key_end = 0;  // the group's keys: [key_begin, key_end)
  DeviceBuffer<detail::TableMeta> meta;      // [tables.size()]
};

// How the tables are split into launches: by storage type, then by lane shape, so that a table
// of dim 64 is not read with the lanes of a dim-256 one (each kernel's group of lanes is chosen
// per launch). A table's shape is its backward lane shape, whether its rows fill it exactly (the
// fitted kernels) and its forward vectors per lane; with more than kMaxGroups such classes, by
// vectors per lane only, then by type only. Each group lists its tables in input order.
std::vector<std::vector<int>> launch_groups(std::span<const TableLayout> tables, int warp_size);

// The layouts of a step's tables (of any storage types), uploaded to the device once.
class EmbeddingTables {
 public:
  // Launch groups at most (launch_groups): storage types times lane shapes.
  static constexpr int kMaxGroups = 12;
  explicit EmbeddingTables(std::span<const TableLayout> tables);

  int num_tables() const { return static_cast<int>(layouts_.size()); }
  std::span<const TableLayout> layouts() const { return layouts_; }
  int max_dim() const { return max_dim_; }
  // The launch groups: by storage type in the order fp32, fp16, bf16, then by lane shape (keys
  // follow the same order).
  const std::vector<TableGroup>& groups() const { return groups_; }
  std::int64_t total_rows() const { return total_rows_; }
  // Sort keys are in [0, total_rows] (total_rows marks a skipped occurrence): this many bits.
  int key_bits() const { return key_bits_; }
  // Columns the pooled output must have at least: max over tables of out_col + dim.
  std::int64_t min_out_cols() const { return min_out_cols_; }
  const detail::TableMeta* device_meta() const { return meta_.data(); }
  // The buffers of a call: host-placed tables' host rows are addressed from them, so their
  // offsets are set again (synchronously, once per new pair of buffers; a null state keeps the
  // state bound before, as a forward needs none).
  void bind(const TableWeights& weights, const float* state);
  detail::InputErrorRecord* device_errors() const { return errors_.data(); }

  // Synchronises the stream; if a kernel met a bad input since the last check, clears the record
  // and throws InputError naming the table, the bag and the id. Cheap only in the sense of one
  // small copy: it waits for the stream, so do not call it on every step of a fast loop.
  void raise_input_errors(Stream_t stream) const;

 private:
  std::vector<TableLayout> layouts_;
  std::vector<TableGroup> groups_;
  int max_dim_ = 0;
  std::int64_t total_rows_ = 0;
  int key_bits_ = 0;
  std::int64_t min_out_cols_ = 0;
  DeviceBuffer<detail::TableMeta> meta_;
  mutable DeviceBuffer<detail::InputErrorRecord> errors_;
  std::vector<detail::TableMeta> host_meta_;  // meta_ as uploaded
  bool any_host_ = false;
  TableWeights bound_{};
  const float* bound_state_ = nullptr;
  bool bound_once_ = false;
};

// A batch's embedding input in device memory (the CSR of parity::SparseInput) and its nnz.
struct DeviceSparseInput {
  std::int64_t batch = 0;
  int num_tables = 0;
  const std::int64_t* ids = nullptr;      // [nnz]
  const std::int64_t* offsets = nullptr;  // [num_tables * batch + 1]
  std::int64_t nnz = 0;                   // offsets[num_tables * batch], known on the host
};

// out(b, out_col_t + d) = pool over bag (t, b) of w_t[weight_offset_t + id * dim_t + d], w_t the
// buffer of table t's storage type (sum or mean; an empty bag gives zeros). Accumulates in fp32;
// out is f32 or bf16 (rounded to nearest even). Other columns of out are not touched.
void embedding_forward(Stream_t stream, const EmbeddingTables& tables, const TableWeights& weights,
                       const DeviceSparseInput& in, AMat out);

// Host-placed table `t` of the input (TableLayout::host), its lookups in one batch: stats[0] +=
// those that hit its cache, stats[1] += all in range; counts[r] += lookups of row r (saturating),
// where counts is not null. Backend::embedding_cache_observe.
void embedding_cache_observe(Stream_t stream, const TableLayout& table, int t,
                             const DeviceSparseInput& in, std::uint32_t* counts,
                             std::uint64_t* stats);
// Cache row i <-> host row cached[i] of a host-placed table, weights and `state_per_row` floats
// of state (cache state at state + state_offset). Backend::embedding_cache_copy.
void embedding_cache_copy(Stream_t stream, const TableLayout& table, void* weights, float* state,
                          std::int64_t state_per_row, bool to_cache);

// Events around the backward's stages (benchmarks): keys, sort, segments, rows, heavy rows.
struct BackwardProfile {
  static constexpr int kStages = 5;
  static constexpr const char* kNames[kStages] = {"keys", "sort", "segments", "rows", "heavy rows"};
  static constexpr int kMaxGroups = EmbeddingTables::kMaxGroups;
  Event events[4];  // before keys, sort, segments, and the first launch group's rows
  // After each launch group's rows kernel and after its heavy-row kernels.
  Event rows_done[kMaxGroups], heavy_done[kMaxGroups];
  int groups = 0;
  // Milliseconds of each stage, rows and heavy rows summed over the launch groups (synchronises).
  void stage_ms(float (&ms)[kStages]) const {
    for (int i = 0; i < 3; ++i) ms[i] = Event::elapsed_ms(events[i], events[i + 1]);
    ms[3] = ms[4] = 0;
    for (int g = 0; g < groups; ++g) {
      ms[3] += Event::elapsed_ms(g == 0 ? events[3] : heavy_done[g - 1], rows_done[g]);
      ms[4] += Event::elapsed_ms(rows_done[g], heavy_done[g]);
    }
  }
};

// How the backward runs.
struct UpdateOptions {
  std::uint64_t seed = 0;  // stochastic rounding stream: (seed, step, table, row, column)
  std::uint64_t step = 0;
  bool stochastic_rounding = true;  // for f16/bf16 weights; false rounds to nearest even
  // Tuning (benchmarks): 16-byte vectors each lane of a row's group holds in the update kernel
  // (1, 2 or 4); 0 picks the default. More vectors per lane means fewer lanes per row and more
  // rows in flight per warp, at the cost of registers.
  int vectors_per_lane = 0;
  BackwardProfile* profile = nullptr;  // when set, events are recorded between the stages
};

// All scratch memory of the backward, for batches of up to max_batch examples and max_nnz ids.
class EmbeddingWorkspace {
 public:
  EmbeddingWorkspace(const EmbeddingTables& tables, std::int64_t max_batch, std::int64_t max_nnz,
                     SortMethod sort = SortMethod::automatic);
  std::int64_t max_batch() const { return max_batch_; }
  std::int64_t max_nnz() const { return max_nnz_; }
  SortMethod sort_method() const { return sorter_.method(); }
  // Device bytes of every buffer of the workspace, the sorter's included.
  std::size_t bytes() const {
    std::size_t n = sorter_.bytes() + seg_start_.bytes() + scan_tmp_.bytes() + counters_.bytes() +
                    heavy_rows_.bytes() + heavy_base_.bytes() + chunk_seg_.bytes() +
                    chunk_idx_.bytes() + partial_.bytes() + heavy_merge_base_.bytes() +
                    merge_heavy_.bytes() + merge_idx_.bytes() + merged_.bytes();
    for (int i = 0; i < 2; ++i) n += keys_[i].bytes() + bags_[i].bytes();
    return n;
  }

  // After a backward (synchronises): distinct rows updated, and how many of them took the
  // heavy-row path, in how many chunks (for tests and benchmarks).
  struct Stats {
    std::int64_t unique_rows = 0;
    std::int64_t heavy_rows = 0;
    std::int64_t heavy_chunks = 0;
  };
  Stats last_stats(Stream_t stream) const;
  // The group size of the rows kernel's specialization for rows that fill their lane group
  // exactly (every table dim == the group's width, every row 16-byte aligned) that the last
  // backward took for each launch group (EmbeddingTables::groups), 0 where it took the general
  // kernel (host-side, no synchronisation).
  const std::vector<int>& last_rows_fit_groups() const { return last_fit_groups_; }
  int last_rows_fit_group() const { return last_fit_groups_.empty() ? 0 : last_fit_groups_[0]; }

 private:
  friend void embedding_backward_update(Stream_t, const EmbeddingTables&, const TableWeights&,
                                        float*, const DeviceSparseInput&, CAMat,
                                        const OptimizerParams&, const UpdateOptions&,
                                        EmbeddingWorkspace&);
  std::int64_t max_batch_;
  std::int64_t max_nnz_;
  int max_dim_;
  RadixSorter sorter_;
  DeviceBuffer<std::uint32_t> keys_[2];    // [max_nnz] linearised (table, row)
  DeviceBuffer<std::uint32_t> bags_[2];    // [max_nnz] bag index t * batch + b of each occurrence
  DeviceBuffer<std::uint32_t> seg_start_;  // [max_nnz + 1]
  DeviceBuffer<std::uint32_t> scan_tmp_;
  // [0] segments, [1] heavy rows, [2] heavy chunks, [3] merged sums (of the launch group being
  // updated), then
  // kCounterBounds + g: the first segment of group g (g = groups: the end of the valid ones);
  // kCounterTotals, + 1: heavy rows and chunks summed over the launch groups.
  static constexpr int kCounterBounds = 4;
  static constexpr int kCounterTotals = kCounterBounds + EmbeddingTables::kMaxGroups + 1;
  DeviceBuffer<int> counters_;
  DeviceBuffer<int> heavy_rows_;  // [max heavy] segment of each heavy row
  DeviceBuffer<int> heavy_base_;  // [max heavy] first chunk slot of each heavy row
  DeviceBuffer<int> chunk_seg_;   // [max chunks] (segment, chunk index) of each slot
  DeviceBuffer<int> chunk_idx_;
  DeviceBuffer<float> partial_;         // [max chunks, partial_ld] chunk sums of heavy rows
  DeviceBuffer<int> heavy_merge_base_;  // [max heavy] first merged-sum slot of each heavy row
  DeviceBuffer<int> merge_heavy_;       // [max merges] (heavy row, index) of each slot
  DeviceBuffer<int> merge_idx_;
  DeviceBuffer<float> merged_;  // [max merges, partial_ld] sums of kMerge chunk sums
  std::int64_t max_heavy_ = 0;
  std::int64_t max_chunks_ = 0;
  std::int64_t max_merges_ = 0;
  std::int64_t partial_ld_ = 0;
  std::vector<int> last_fit_groups_;
};

// Backward fused with the optimizer update (sgd, adagrad, rowwise_adagrad; weight decay as L2),
// as Backend::embedding_backward_update defines it: the gradient of each distinct (table, row) is
// the sum of dout(b, out_col_t + ·) over its occurrences (divided by the bag size for mean
// pooling), then one optimizer step per distinct row. dout is f32 or bf16 [batch, >= cols];
// state is fp32 (adagrad: rows*dim per table at state_offset; rowwise: rows; sgd: may be null).
void embedding_backward_update(Stream_t stream, const EmbeddingTables& tables,
                               const TableWeights& weights, float* state,
                               const DeviceSparseInput& in, CAMat dout, const OptimizerParams& opt,
                               const UpdateOptions& update, EmbeddingWorkspace& workspace);

}  // namespace parity::gpu
