// Host side of the embedding op: table layouts on the device, the backward's workspace, input
// error reports, and the byte counts the benchmarks divide by time.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>

#include "backend/gpu/embedding.h"
#include "backend/gpu/embedding_common.cuh"
#include "backend/gpu/scan.cuh"

namespace parity::gpu {

namespace detail {

GroupShape group_shape(int max_dim, int vec_width, int warp_size) {
  const int vectors = (max_dim + vec_width - 1) / vec_width;
  GroupShape s;
  if (vectors <= warp_size) {
    s.group = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(vectors, 1))));
    s.vecs = 1;
    return s;
  }
  s.group = warp_size;
  const int per_lane = (vectors + warp_size - 1) / warp_size;
  s.vecs = static_cast<int>(std::bit_ceil(static_cast<unsigned>(per_lane)));
  if (s.vecs > kMaxVecsPerLane) {
    throw Error(
        fmt::format("embedding: dim {} is larger than the {} this kernel handles with warp size {}",
                    max_dim, kMaxVecsPerLane * warp_size * vec_width, warp_size));
  }
  return s;
}

int forward_bags_per_group(double ids_per_bag, int vecs, int vec_width) {
  constexpr double kRowsInFlight = 8;  // the forward kernels' row loads in flight per lane
  const int most = forward_max_bags(vecs, vec_width);
  if (!(ids_per_bag > 0)) return 1;
  int r = 1;
  while (r * 2 <= most && r * 2 * ids_per_bag <= kRowsInFlight / vecs) r *= 2;
  return r;
}

// Checks shared by forward and backward: shapes, dtypes and the CSR's host-known sizes.
void check_embedding_call(const char* op, const EmbeddingTables& tables,
                          const TableWeights& weights, const DeviceSparseInput& in, CAMat m,
                          const char* m_name) {
  if (in.num_tables != tables.num_tables()) {
    throw InputError(fmt::format("{}: the sparse input has {} tables, the layout has {}", op,
                                 in.num_tables, tables.num_tables()));
  }
  if (in.batch < 0 || in.nnz < 0) throw InputError(fmt::format("{}: negative batch or nnz", op));
  if (in.offsets == nullptr) throw InputError(fmt::format("{}: offsets is null", op));
  if (in.ids == nullptr && in.nnz > 0) throw InputError(fmt::format("{}: ids is null", op));
  if (in.batch * in.num_tables >= (std::int64_t{1} << 31) || in.nnz >= (std::int64_t{1} << 31)) {
    throw InputError(
        fmt::format("{}: {} bags and {} ids; this kernel handles fewer than 2^31 of each", op,
                    in.batch * in.num_tables, in.nnz));
  }
  for (const TableGroup& g : tables.groups()) {
    if (weights.of(g.dtype) == nullptr && in.nnz > 0)
      throw InputError(fmt::format("{}: table {} is {}, and the {} weight buffer is null", op,
                                   g.tables[0], dtype_name(g.dtype), dtype_name(g.dtype)));
  }
  if (m.dtype != DType::f32 && m.dtype != DType::bf16) {
    throw InputError(
        fmt::format("{}: {} is {}, expected fp32 or bf16", op, m_name, dtype_name(m.dtype)));
  }
  if (m.rows != in.batch) {
    throw InputError(
        fmt::format("{}: {} has {} rows, the batch is {}", op, m_name, m.rows, in.batch));
  }
  if (m.ld < m.cols || m.cols < tables.min_out_cols()) {
    throw InputError(fmt::format("{}: {} is [{}, {}] with ld {}; the tables need {} columns", op,
                                 m_name, m.rows, m.cols, m.ld, tables.min_out_cols()));
  }
  if (m.data == nullptr && m.rows > 0) throw InputError(fmt::format("{}: {} is null", op, m_name));
}

GroupShape backward_group_shape(int max_dim, int vec_width, int warp_size, int vectors_per_lane) {
  const int vectors = (max_dim + vec_width - 1) / vec_width;
  GroupShape s;
  s.vecs = vectors_per_lane > 0 ? vectors_per_lane
                                : 16 / vec_width;  // default: 4 (fp32), 2 (fp16, bf16)
  if (s.vecs != 1 && s.vecs != 2 && s.vecs != 4) {
    throw InputError(
        fmt::format("embedding backward: vectors_per_lane is {}, expected 0, 1, 2 or 4", s.vecs));
  }
  while (vectors > warp_size * s.vecs && s.vecs < kMaxVecsPerLane) s.vecs *= 2;
  if (vectors > warp_size * s.vecs) {
    throw Error(fmt::format(
        "embedding backward: dim {} is larger than the {} this kernel handles with warp size {}",
        max_dim, s.vecs * warp_size * vec_width, warp_size));
  }
  const int lanes = (vectors + s.vecs - 1) / s.vecs;
  s.group = static_cast<int>(std::bit_ceil(static_cast<unsigned>(std::max(lanes, 1))));
  return s;
}

}  // namespace detail

// ------------------------------------------------------------------ tables --

std::vector<std::vector<int>> launch_groups(std::span<const TableLayout> tables, int warp_size) {
  // A table's class at three levels of detail: its backward lane shape and whether its rows fill
  // it exactly (the fitted kernels), then the vectors per lane alone, then nothing (the type).
  const auto class_of = [&](const TableLayout& t, int level) {
    const int v = 16 / static_cast<int>(dtype_size(t.dtype));
    const detail::GroupShape b = detail::backward_group_shape(t.dim, v, warp_size);
    const detail::GroupShape f = detail::group_shape(t.dim, v, warp_size);
    const bool fits = t.dim == b.group * b.vecs * v;
    switch (level) {
      case 0:
        return std::array<int, 4>{b.group, b.vecs, f.vecs, fits ? 1 : 0};
      case 1:
        return std::array<int, 4>{0, b.vecs, f.vecs, 0};
      default:
        return std::array<int, 4>{0, 0, 0, 0};
    }
  };
  std::vector<std::vector<int>> groups;
  for (int level = 0; level < 3; ++level) {
    groups.clear();
    for (const DType dt : {DType::f32, DType::f16, DType::bf16}) {
      std::vector<std::array<int, 4>> keys;
      const std::size_t first = groups.size();
      for (std::size_t t = 0; t < tables.size(); ++t) {
        if (tables[t].dtype != dt) continue;
        const auto key = class_of(tables[t], level);
        const auto it = std::find(keys.begin(), keys.end(), key);
        if (it == keys.end()) {
          keys.push_back(key);
          groups.emplace_back();
        }
        groups[first +
               static_cast<std::size_t>(std::find(keys.begin(), keys.end(), key) - keys.begin())]
            .push_back(static_cast<int>(t));
      }
    }
    if (groups.size() <= static_cast<std::size_t>(EmbeddingTables::kMaxGroups)) break;
  }
  return groups;
}

EmbeddingTables::EmbeddingTables(std::span<const TableLayout> tables)
    : layouts_(tables.begin(), tables.end()) {
  if (layouts_.empty()) throw InputError("EmbeddingTables: no tables");
  for (std::size_t t = 0; t < layouts_.size(); ++t) {
    const TableLayout& tl = layouts_[t];
    if (tl.dim <= 0)
      throw InputError(
          fmt::format("EmbeddingTables: table {} has dim {}, expected > 0", t, tl.dim));
    if (tl.rows < 0 || tl.rows >= (std::int64_t{1} << 31)) {
      throw InputError(
          fmt::format("EmbeddingTables: table {} has {} rows, expected [0, 2^31)", t, tl.rows));
    }
    if (tl.weight_offset < 0 || tl.state_offset < 0 || tl.out_col < 0) {
      throw InputError(
          fmt::format("EmbeddingTables: table {} has a negative offset or output column", t));
    }
    if (!is_table_dtype(tl.dtype)) {
      throw InputError(fmt::format("EmbeddingTables: table {} is {}, expected fp32, fp16 or bf16",
                                   t, dtype_name(tl.dtype)));
    }
    max_dim_ = std::max(max_dim_, tl.dim);
    min_out_cols_ = std::max(min_out_cols_, tl.out_col + tl.dim);
  }
  // Launch groups: the tables of one storage type and one lane shape (see launch_groups), keys
  // by group, then in input order: each group's keys are one range.
  std::vector<detail::TableMeta> meta(layouts_.size());
  std::uint64_t key_base = 0;
  const int warp = device_info().warp_size;
  for (std::vector<int> members : launch_groups(layouts_, warp)) {
    TableGroup g;
    g.dtype = layouts_[static_cast<std::size_t>(members.front())].dtype;
    g.key_begin = static_cast<std::uint32_t>(key_base);
    // The forward's runs: tables of one bags-per-group count together, the most bags first.
    for (const int t : members)
      g.max_dim = std::max(g.max_dim, layouts_[static_cast<std::size_t>(t)].dim);
    const int v = 16 / static_cast<int>(dtype_size(g.dtype));
    const int vecs = detail::group_shape(g.max_dim, v, warp).vecs;
    const auto bags = [&](int t) {
      return detail::forward_bags_per_group(layouts_[static_cast<std::size_t>(t)].ids_per_bag, vecs,
                                            v);
    };
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return bags(a) > bags(b); });
    for (std::size_t i = 0; i < members.size(); ++i) {
      const int r = bags(members[i]);
      if (g.runs.empty() || g.runs.back().bags_per_group != r)
        g.runs.push_back({static_cast<int>(i), 0, r});
      ++g.runs.back().count;
    }
    for (const int t : members) {
      const TableLayout& tl = layouts_[static_cast<std::size_t>(t)];
      detail::TableMeta& m = meta[static_cast<std::size_t>(t)];
      m.weight_offset = tl.weight_offset;
      m.state_offset = tl.state_offset;
      m.out_col = tl.out_col;
      m.rows = tl.rows;
      m.key_base = static_cast<std::uint32_t>(key_base);
      m.dim = tl.dim;
      m.pooling = tl.pooling == Pooling::mean ? 1 : 0;
      m.input = t;
      m.round_table = tl.round_table >= 0 ? tl.round_table : t;
      m.round_row = tl.round_row;
      m.round_col = tl.round_col;
      m.slot = tl.host.slot;
      if (tl.host_placed()) {
        g.host_placed = true;
        any_host_ = true;
        if (tl.host.slot == nullptr)
          throw InputError(
              fmt::format("EmbeddingTables: table {} is host-placed without a cache "
                          "map (TableLayout::host.slot)",
                          t));
      }
      key_base += static_cast<std::uint64_t>(tl.rows);
      if (key_base >= 0xffffffffull) {
        throw InputError(fmt::format(
            "EmbeddingTables: the tables have {}+ rows together; one set holds at most 2^32 - 2 "
            "(split the tables into several sets)",
            key_base));
      }
      g.tables.push_back(t);
    }
    g.key_end = static_cast<std::uint32_t>(key_base);
    std::vector<detail::TableMeta> gm;
    for (const int t : g.tables) gm.push_back(meta[static_cast<std::size_t>(t)]);
    g.meta = DeviceBuffer<detail::TableMeta>(gm.size(), "embedding table layouts");
    g.meta.upload_sync(gm.data(), gm.size());
    groups_.push_back(std::move(g));
  }
  total_rows_ = static_cast<std::int64_t>(key_base);
  key_bits_ = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(total_rows_)));
  meta_ = DeviceBuffer<detail::TableMeta>(meta.size(), "embedding table layouts");
  meta_.upload_sync(meta.data(), meta.size());
  host_meta_ = meta;
  errors_ = DeviceBuffer<detail::InputErrorRecord>(1, "embedding input error record");
  const detail::InputErrorRecord none{0, 0, 0, 0};
  errors_.upload_sync(&none, 1);
}

void EmbeddingTables::bind(const TableWeights& weights, const float* state) {
  if (!any_host_) return;
  if (state == nullptr) state = bound_state_;  // a forward: the state binding stays
  if (bound_once_ && bound_.f32 == weights.f32 && bound_.f16 == weights.f16 &&
      bound_.bf16 == weights.bf16 && bound_state_ == state)
    return;
  const auto flat = [](const void* p) {
    return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
  };
  for (std::size_t t = 0; t < layouts_.size(); ++t) {
    const TableLayout& tl = layouts_[t];
    if (!tl.host_placed()) continue;
    const void* base = weights.of(tl.dtype);
    if (base == nullptr)
      throw InputError(
          fmt::format("EmbeddingTables: host-placed table {} has no {} weight buffer "
                      "(its cache lives there)",
                      t, dtype_name(tl.dtype)));
    detail::TableMeta& m = host_meta_[t];
    m.host_weight_offset =
        (flat(tl.host.weights) - flat(base)) / static_cast<std::int64_t>(dtype_size(tl.dtype));
    m.host_state_offset =
        tl.host.state != nullptr && state != nullptr
            ? (flat(tl.host.state) - flat(state)) / static_cast<std::int64_t>(sizeof(float))
            : 0;
  }
  meta_.upload_sync(host_meta_.data(), host_meta_.size());
  for (TableGroup& g : groups_) {
    std::vector<detail::TableMeta> gm;
    for (const int t : g.tables) gm.push_back(host_meta_[static_cast<std::size_t>(t)]);
    g.meta.upload_sync(gm.data(), gm.size());
  }
  bound_ = weights;
  bound_state_ = state;
  bound_once_ = true;
}

void EmbeddingTables::raise_input_errors(Stream_t stream) const {
  detail::InputErrorRecord rec{};
  errors_.download(&rec, 1, stream);
  check(stream_synchronize(stream), "EmbeddingTables::raise_input_errors");
  if (rec.code == 0) return;
  const detail::InputErrorRecord none{0, 0, 0, 0};
  errors_.upload(&none, 1, stream);
  check(stream_synchronize(stream), "EmbeddingTables::raise_input_errors");
  const int t = rec.table;
  const std::int64_t rows = (t >= 0 && t < num_tables()) ? layouts_[t].rows : -1;
  if (rec.code == 1) {
    throw InputError(
        fmt::format("embedding (gpu): table {}, bag {}: id {} is outside [0, {}); the bag's other "
                    "ids were used and this one skipped",
                    t, rec.bag, rec.id, rows));
  }
  throw InputError(fmt::format(
      "embedding (gpu): table {}, bag {}: offsets decrease or leave [0, nnz] (offset {}); "
      "the batch's CSR offsets must be non-decreasing from 0 to nnz",
      t, rec.bag, rec.id));
}

// --------------------------------------------------------------- workspace --

EmbeddingWorkspace::EmbeddingWorkspace(const EmbeddingTables& tables, std::int64_t max_batch,
                                       std::int64_t max_nnz, SortMethod sort)
    : max_batch_(max_batch),
      max_nnz_(std::max<std::int64_t>(max_nnz, 1)),
      max_dim_(tables.max_dim()),
      sorter_(std::max<std::int64_t>(max_nnz, 1), sort) {
  if (max_batch < 0 || max_nnz < 0) throw InputError("EmbeddingWorkspace: negative batch or nnz");
  if (max_batch * tables.num_tables() >= (std::int64_t{1} << 31)) {
    throw InputError(fmt::format("EmbeddingWorkspace: {} bags (batch {} x {} tables) exceed 2^31",
                                 max_batch * tables.num_tables(), max_batch, tables.num_tables()));
  }
  const auto n = static_cast<std::size_t>(max_nnz_);
  for (int i = 0; i < 2; ++i) {
    keys_[i] = DeviceBuffer<std::uint32_t>(n, "embedding backward keys");
    bags_[i] = DeviceBuffer<std::uint32_t>(n, "embedding backward bags");
  }
  seg_start_ = DeviceBuffer<std::uint32_t>(n + 1, "embedding backward segments");
  scan_tmp_ = DeviceBuffer<std::uint32_t>(static_cast<std::size_t>(scan::tiles_for(max_nnz_)),
                                          "embedding backward scan");
  counters_ = DeviceBuffer<int>(kCounterTotals + 2, "embedding backward counters");
  max_heavy_ = max_nnz_ / (detail::kHeavyRow + 1) + 1;
  max_chunks_ = max_nnz_ / detail::kChunk + max_heavy_ + 1;
  partial_ld_ = (max_dim_ + 7) / 8 * 8;
  heavy_rows_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_heavy_), "embedding backward heavy rows");
  heavy_base_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_heavy_), "embedding backward heavy rows");
  chunk_seg_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_chunks_), "embedding backward chunks");
  chunk_idx_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_chunks_), "embedding backward chunks");
  partial_ = DeviceBuffer<float>(static_cast<std::size_t>(max_chunks_ * partial_ld_),
                                 "embedding backward partial sums");
  max_merges_ = max_chunks_ / detail::kMerge + max_heavy_ + 1;
  heavy_merge_base_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_heavy_), "embedding backward heavy rows");
  merge_heavy_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_merges_), "embedding backward merged sums");
  merge_idx_ =
      DeviceBuffer<int>(static_cast<std::size_t>(max_merges_), "embedding backward merged sums");
  merged_ = DeviceBuffer<float>(static_cast<std::size_t>(max_merges_ * partial_ld_),
                                "embedding backward merged sums");
  // Defined contents from the start: a malformed batch can then leave stale entries, never
  // out-of-range ones (keys at 0, bags at 0).
  Stream s;
  for (int i = 0; i < 2; ++i) {
    keys_[i].zero(s.get());
    bags_[i].zero(s.get());
  }
  seg_start_.zero(s.get());
  counters_.zero(s.get());
  s.synchronize();
}

EmbeddingWorkspace::Stats EmbeddingWorkspace::last_stats(Stream_t stream) const {
  int c[kCounterTotals + 2] = {};
  counters_.download(c, kCounterTotals + 2, stream);
  check(stream_synchronize(stream), "EmbeddingWorkspace::last_stats");
  return Stats{c[0], c[kCounterTotals], c[kCounterTotals + 1]};
}

}  // namespace parity::gpu
