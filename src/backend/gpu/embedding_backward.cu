// Embedding-bag backward fused with the optimizer update, for all tables in one pass (one sort;
// the update kernels once per launch group: storage type and lane shape).
//
// Why it is built this way:
// - The optimizer must see each distinct row's whole gradient once (adagrad is not linear in g),
//   and the sum must not depend on scheduling. So the occurrences are keyed by linearised
//   (table, row) and stably radix-sorted with their bag index as the value: equal keys become
//   contiguous segments, in batch order. A scan marks segment starts (no host round trip: the
//   segment count stays on the device and the update kernels run persistent grids over it).
//   Tables are keyed by launch group first (storage type and lane shape, launch_groups), so each
//   group's rows are one run of segments; the scan also records where each run begins, and each
//   group's update kernels walk only its own run, with lanes sized for its dims.
// - One group of lanes per distinct row (8 lanes of four 16-byte vectors for a dim-128 fp32 row:
//   backward_group_shape, chosen so that a warp has several rows in flight; the update is bound
//   by rows in flight, not arithmetic) sums its occurrences' output gradients in segment order,
//   reads the row and its optimizer state once, applies the step and writes them once: the
//   weights and state move exactly once per distinct row, the minimum.
// - Hot rows (Zipf heads, tiny tables) can have tens of thousands of occurrences; one group would
//   take milliseconds on them. Segments longer than kHeavyRow are cut into chunks of kChunk
//   occurrences, summed by many groups into partial rows; those are summed kMerge at a time, again
//   by many groups (the hottest rows have tens of thousands of chunks), and a block per hot row
//   sums the merged sums in a fixed split (each group a fixed range, then the groups in order)
//   before the update. Every
//   sum has a fixed order: the result is deterministic, bit for bit, whatever the scheduling.
//   Atomics only hand out slots in the heavy-row lists, which never changes a value.
// - fp16/bf16 weights: the step is computed in fp32 and stored with stochastic rounding, random
//   bits from (seed, step, table, row, column) through random.h, so runs are reproducible.
// - The indices of later segments are loaded before the current segment's rows (software
//   pipelining), in two stages: the segment range three segments ahead, the key and bags of the
//   one two ahead from the range loaded an iteration earlier. Otherwise the chain segment start ->
//   key -> row is three dependent round trips per row (and loading both links in one iteration
//   still waits on the first). The keys kernel and the scans read with coalesced, several-deep
//   loads.
// - The rows kernel is bound by instruction issue as much as by memory. When every table of the
//   launch fills a group exactly (every DLRM table of dim 128) a specialization with a
//   compile-time group and no column bounds or per-row alignment tests (kFit) issues about half
//   the instructions and fits more blocks per multiprocessor (docs/perf/embedding.md has the
//   measurements).
#include <algorithm>

#include "backend/gpu/embedding.h"
#include "backend/gpu/embedding_common.cuh"
#include "backend/gpu/launch.h"
#include "backend/gpu/scan.cuh"
#include "parity/divide.h"

namespace parity::gpu {

namespace {

using detail::InputErrorRecord;
using detail::kBlock;
using detail::kChunk;
using detail::kHeavyRow;
using detail::kMerge;
using detail::TableMeta;

// A heavy row's merged sums: none where its block's groups sum its chunk sums directly (at most
// four each), else one per kMerge chunks.
__device__ __forceinline__ int merged_sums(int chunks, int group) {
  return chunks > 4 * (kBlock / group) ? (chunks + kMerge - 1) / kMerge : 0;
}

struct BackwardArgs {
  const TableMeta* meta;
  int num_tables;
  int group;
  const std::uint32_t* keys;       // [nnz] sorted linearised (table, row)
  const std::uint32_t* bags;       // [nnz] bag of each sorted occurrence
  const std::uint32_t* seg_start;  // [U + 1]
  int* counters;  // [0] U, [1] heavy rows, [2] heavy chunks, [3] merged sums, then group bounds
  int bound;      // counters[bound] .. counters[bound + 1]: this launch's segments
  int totals;     // counters[totals], [totals + 1]: [1] and [2] summed over launches
  std::uint32_t key_begin, key_end;  // this launch's keys (one launch group)
  const std::int64_t* offsets;
  std::int64_t batch;
  DivideBy batch_div;      // bag -> table (bags < 2^31)
  std::uint32_t skip_key;  // key of skipped (bad) occurrences
  const void* dout;
  std::int64_t ld;
  void* weights;
  float* state;
  int opt;  // OptimizerKind
  float lr;
  float eps;
  float wd;
  std::uint64_t sr_key;  // rng::key(seed, step): the stream of this update's rounding bits
  int sr;
  int* heavy_rows;
  int* heavy_base;
  int* chunk_seg;
  int* chunk_idx;
  float* partial;
  std::int64_t partial_ld;
  std::int64_t max_heavy;
  std::int64_t max_chunks;
  int* heavy_merge_base;  // [max heavy] first merged-sum slot of each heavy row
  int* merge_heavy;       // [max merges] (heavy row, index) of each merged-sum slot
  int* merge_idx;
  float* merged;  // [max merges, partial_ld] sums of kMerge chunk sums
  std::int64_t max_merges;
  int sums_ld;  // the heavy kernel's shared partial rows: the columns this launch's lanes cover
};

constexpr int kSgd = static_cast<int>(OptimizerKind::sgd);
constexpr int kAdagrad = static_cast<int>(OptimizerKind::adagrad);
constexpr int kRowwise = static_cast<int>(OptimizerKind::rowwise_adagrad);

// Lanes of one group.
struct Lanes {
  int glane;
  int gfirst;
  LaneMask mask;
};
__device__ __forceinline__ Lanes group_lanes(int group) {
  const int lane = lane_id();
  const int glane = lane & (group - 1);
  return Lanes{glane, lane - glane, group_mask(lane - glane, group)};
}

// ------------------------------------------------------------------- keys --

// One warp per kWarpSize consecutive bags: their occurrences are one contiguous range of the CSR,
// written with coalesced stores; each lane finds its occurrence's bag by a binary search over
// the warp's offsets held in registers (32-bit, relative to the warp's first offset), and takes
// the bag's table, key base and row count from the lane that owns the bag.
__global__ __launch_bounds__(kBlock) void embedding_keys_kernel(
    const TableMeta* __restrict__ meta, const std::int64_t* __restrict__ ids,
    const std::int64_t* __restrict__ offsets, std::int64_t batch, std::int64_t nnz,
    std::int64_t num_bags, std::uint32_t skip_key, std::uint32_t* __restrict__ keys,
    std::uint32_t* __restrict__ bags, InputErrorRecord* errors) {
  const int lane = lane_id();
  const std::int64_t warp =
      (static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x) / kWarpSize;
  const std::int64_t bag0 = warp * kWarpSize;
  if (bag0 >= num_bags) return;
  const std::int64_t my_bag = bag0 + lane;
  const std::int64_t last_bag = bag0 + kWarpSize < num_bags ? bag0 + kWarpSize : num_bags;
  std::int64_t start = offsets[bag0];
  start = start < 0 ? 0 : (start > nnz ? nnz : start);
  std::int64_t end = offsets[last_bag];
  end = end < start ? start : (end > nnz ? nnz : end);
  // Per lane (its bag): offset relative to start, table, key base, rows.
  constexpr int kNever = 0x7fffffff;
  int rel = kNever;
  std::uint32_t my_t = 0, my_key_base = 0, my_rows = 0;
  if (my_bag < num_bags) {
    const std::int64_t o = offsets[my_bag];
    const std::int64_t o_next = offsets[my_bag + 1];
    my_t = static_cast<std::uint32_t>(my_bag) / static_cast<std::uint32_t>(batch);
    if (o < 0 || o_next < o || o_next > nnz) {
      detail::record_input_error(errors, 2, static_cast<int>(my_t),
                                 my_bag - static_cast<std::int64_t>(my_t) * batch,
                                 o_next < o ? o_next : o);
    }
    const std::int64_t r = o - start;
    rel = r < 0 ? 0 : (r > end - start ? static_cast<int>(end - start) : static_cast<int>(r));
    my_key_base = meta[my_t].key_base;
    my_rows = static_cast<std::uint32_t>(meta[my_t].rows);
  }
  const int span = static_cast<int>(end - start);  // < 2^31: checked on the host (nnz < 2^31)
  constexpr int kUnroll = 4;                       // id loads in flight per lane
  for (int j0 = 0; j0 < span; j0 += kUnroll * kWarpSize) {
    std::int64_t id[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = j0 + k * kWarpSize + lane;
      id[k] = j < span ? ids[start + j] : 0;
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = j0 + k * kWarpSize + lane;
      int pos = 0;
#pragma unroll
      for (int step = kWarpSize / 2; step >= 1; step >>= 1) {
        const int v = shfl(kFullMask, rel, pos + step);
        if (v <= j) pos += step;
      }
      const std::uint32_t t = shfl(kFullMask, my_t, pos);
      const std::uint32_t key_base = shfl(kFullMask, my_key_base, pos);
      const std::uint32_t rows = shfl(kFullMask, my_rows, pos);
      if (j < span) {
        const std::int64_t bag = bag0 + pos;
        std::uint32_t key = skip_key;
        if (id[k] >= 0 && id[k] < static_cast<std::int64_t>(rows)) {
          key = key_base + static_cast<std::uint32_t>(id[k]);
        } else {
          detail::record_input_error(errors, 1, static_cast<int>(t),
                                     bag - static_cast<std::int64_t>(t) * batch, id[k]);
        }
        keys[start + j] = key;
        bags[start + j] = static_cast<std::uint32_t>(bag);
      }
    }
  }
}

// --------------------------------------------------------------- segments --

struct SegmentFlag {
  const std::uint32_t* keys;
  __device__ std::uint32_t operator()(std::int64_t i) const {
    return i == 0 || keys[i] != keys[i - 1] ? 1u : 0u;
  }
};
// Stores the segment starts, and bounds[g] = the first segment whose key is at least
// first_key[g] (g < groups; bounds[groups] for the skip key): the first segment of each storage
// type's run, and the end of the last.
struct SegmentStore {
  std::uint32_t* seg_start;
  std::int64_t n;
  const std::uint32_t* keys;
  int* bounds;
  int groups;
  std::uint32_t first_key[EmbeddingTables::kMaxGroups + 1];
  __device__ void operator()(std::int64_t i, std::uint32_t prefix, std::uint32_t v) const {
    if (v) {
      seg_start[prefix] = static_cast<std::uint32_t>(i);
      const std::uint32_t k = keys[i];
      for (int g = 0; g <= groups; ++g) {
        if (k >= first_key[g] && (i == 0 || keys[i - 1] < first_key[g]))
          bounds[g] = static_cast<int>(prefix);
      }
    }
    if (i == n - 1) {
      seg_start[prefix + v] = static_cast<std::uint32_t>(n);
      for (int g = 0; g <= groups; ++g)
        if (keys[i] < first_key[g]) bounds[g] = static_cast<int>(prefix + v);
    }
  }
};

// -------------------------------------------------------- per-row helpers --

// Where a segment's row lives; false when the segment is to be skipped (bad ids, stale entries).
struct RowRef {
  TableMeta m;
  int t;
  int row;
  bool vec;
};

// kFit > 0: every table of the launch has dim == kFit * kVecs * V and every weight, gradient and
// state row is aligned for 16-byte vectors (checked on the host: rows_fit). The group is then a
// compile-time kFit and a lane's columns are all inside the row, so the helpers below drop the
// column bounds, the per-row alignment tests and the scalar paths. This is the DLRM case (every
// table of dim 128). kFit = 0: any dims, run-time group.
template <int kFit>
__device__ __forceinline__ int group_of(const BackwardArgs& a) {
  return kFit > 0 ? kFit : a.group;
}
template <int kFit>
__device__ __forceinline__ bool in_row(int col, int dim) {
  return kFit > 0 || col < dim;
}

template <class W, class Gd, int kFit = 0>
__device__ __forceinline__ bool resolve_row(const BackwardArgs& a, std::uint32_t key,
                                            std::uint32_t bag0, RowRef& r) {
  constexpr int V = VecWidth<W>::value;
  if (key == a.skip_key || key < a.key_begin || key >= a.key_end) return false;
  const std::uint32_t t = a.batch_div(bag0);
  if (t >= static_cast<std::uint32_t>(a.num_tables)) return false;
  r.t = static_cast<int>(t);
  r.m = a.meta[t];
  const std::uint32_t row = key - r.m.key_base;
  if (row >= static_cast<std::uint64_t>(r.m.rows)) return false;
  r.row = static_cast<int>(row);
  if (r.m.slot != nullptr) {
    // A host-placed table: the offsets are moved so that the helpers' weight_offset + row * dim
    // (state likewise) land on the row's cache row, or on its host row.
    const std::int64_t state_per_row = a.opt == kAdagrad ? r.m.dim : 1;
    const std::uint32_t s = r.m.slot[row];
    if (s != TableLayout::kNotCached) {
      const std::int64_t shift = static_cast<std::int64_t>(s) - static_cast<std::int64_t>(row);
      r.m.weight_offset += shift * r.m.dim;
      r.m.state_offset += shift * state_per_row;
    } else {
      r.m.weight_offset = r.m.host_weight_offset;
      r.m.state_offset = r.m.host_state_offset;
    }
  }
  constexpr unsigned kGradAlign = V * sizeof(Gd) < 16 ? V * sizeof(Gd) : 16;
  const W* w = static_cast<const W*>(a.weights) + r.m.weight_offset;
  const Gd* g = static_cast<const Gd*>(a.dout) + r.m.out_col;
  r.vec = kFit > 0 ||
          (r.m.dim % V == 0 && detail::aligned_to(w, 16) && detail::aligned_to(g, kGradAlign) &&
           (a.ld * static_cast<std::int64_t>(sizeof(Gd))) % kGradAlign == 0 &&
           (a.opt != kAdagrad || detail::aligned_to(a.state + r.m.state_offset, 16)));
  return true;
}

template <int kVecs, int V>
__device__ __forceinline__ void zero(float (&g)[kVecs][V]) {
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int e = 0; e < V; ++e) g[v][e] = 0.0f;
  }
}

__device__ __forceinline__ int col_of(bool vec, int glane, int v, int e, int group, int V) {
  return vec ? detail::vec_col(glane, v, e, group, V) : detail::scalar_col(glane, v, e, group, V);
}

// g += Σ over sorted occurrences [p_begin, p_end) of dout(b, out_col + ·) (÷ bag size for mean),
// in occurrence order. Every lane of the group calls it with the same arguments.
// first_bag: bags[p_begin + glane] when glane < p_end - p_begin (loaded early by the caller).
// kInFlight: the 32-bit words of gradient rows a lane loads before adding them (the rows kernel
// keeps 16, as its weights and state share the registers; the chunks kernel, holding no row,
// takes more).
template <class Gd, int kVecs, int V, int kFit = 0, int kInFlight = 16>
__device__ __forceinline__ void accumulate(const BackwardArgs& a, const RowRef& r,
                                           std::uint32_t p_begin, std::uint32_t p_end,
                                           std::uint32_t first_bag, const Lanes& L,
                                           float (&g)[kVecs][V]) {
  constexpr int kWords = RawWords<V, Gd>::value;
  constexpr int kUnroll = (kInFlight / kWords) / kVecs > 0 ? (kInFlight / kWords) / kVecs : 1;
  const int group = group_of<kFit>(a);
  const int dim = r.m.dim;
  const Gd* __restrict__ dout = static_cast<const Gd*>(a.dout) + r.m.out_col;
  const std::int64_t table_bag0 = static_cast<std::int64_t>(r.t) * a.batch;
  const bool mean = r.m.pooling == 1;  // the same for every lane of the group
  for (std::uint32_t p0 = p_begin; p0 < p_end; p0 += group) {
    const int count =
        static_cast<int>(p_end - p0 < static_cast<std::uint32_t>(group) ? p_end - p0 : group);
    int my_b = -1;  // the example (bag within the table's batch; batch < 2^31), -1 when none or bad
    float my_scale = 1.0f;
    if (L.glane < count) {
      const std::int64_t bag = p0 == p_begin ? first_bag : a.bags[p0 + L.glane];
      const std::int64_t b = bag - table_bag0;
      if (b >= 0 && b < a.batch) {
        my_b = static_cast<int>(b);
        if (mean) {
          const std::int64_t n = a.offsets[bag + 1] - a.offsets[bag];
          my_scale = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
        }
      }
    }
    for (int k = 0; k < count; k += kUnroll) {
      int b[kUnroll];
      float scale[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int src = L.gfirst + (k + u < count ? k + u : count - 1);
        b[u] = shfl(L.mask, my_b, src);
        scale[u] = mean ? shfl(L.mask, my_scale, src) : 1.0f;
        if (k + u >= count) b[u] = -1;
      }
      if (kFit > 0 || r.vec) {
        std::uint32_t x[kUnroll][kVecs][kWords];  // raw gradient rows in flight
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            const int c = detail::vec_col(L.glane, v, 0, group, V);
            if (b[u] >= 0 && in_row<kFit>(c, dim)) {
              load_raw<V, Gd>(dout + b[u] * a.ld + c, x[u][v]);
            } else {
#pragma unroll
              for (int i = 0; i < kWords; ++i) x[u][v][i] = 0u;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) raw_fma<V, Gd>(x[u][v], scale[u], g[v]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (b[u] < 0) continue;
          const Gd* __restrict__ src = dout + b[u] * a.ld;
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const int c = detail::scalar_col(L.glane, v, e, group, V);
              if (c < dim) g[v][e] = fmaf(to_float(src[c]), scale[u], g[v][e]);
            }
          }
        }
      }
    }
  }
}

// A row's weights and optimizer state in registers, as floats.
template <int kVecs, int V>
struct RowValues {
  float w[kVecs][V];
  float s[kVecs][V];  // adagrad: per element
  float s_row;        // rowwise_adagrad
};

// The optimizer: a compile-time kind (kOpt >= 0) or the run-time one (kOpt = kAnyOpt).
constexpr int kAnyOpt = -1;
template <int kOpt>
__device__ __forceinline__ int opt_of(const BackwardArgs& a) {
  return kOpt >= 0 ? kOpt : a.opt;
}

// Stores a lane's fp32 values of one row (weights or adagrad state), streaming.
template <int kVecs, int V, int kFit = 0>
__device__ __forceinline__ void store_row_f32(float* __restrict__ dst,
                                              const float (&vals)[kVecs][V], bool vec, int glane,
                                              int group, int dim) {
  detail::store_row<kVecs, V, kFit>(
      dst, vals, vec, glane, group, dim,
      [](float* p, const float(&x)[V], int) { store_vec<V, true>(p, x); },
      [](float* p, float x, int) { *p = x; });
}
// Stores the lane's partial sums of a row (heavy rows), element by element in either layout.
template <int kVecs, int V>
__device__ __forceinline__ void store_partial(float* __restrict__ dst,
                                              const float (&vals)[kVecs][V], bool vec, int glane,
                                              int group, int dim) {
  detail::store_row<kVecs, V>(
      dst, vals, vec, glane, group, dim,
      [](float* p, const float(&x)[V], int) {
#pragma unroll
        for (int e = 0; e < V; ++e) p[e] = x[e];
      },
      [](float* p, float x, int) { *p = x; });
}

// Loads the row's weights and state (issued before the gradient loads, so they overlap).
template <class W, int kVecs, int V, int kOpt, int kFit = 0>
__device__ __forceinline__ void load_row(const BackwardArgs& a, const RowRef& r, const Lanes& L,
                                         RowValues<kVecs, V>& rv) {
  const int group = group_of<kFit>(a);
  const int dim = r.m.dim;
  const W* __restrict__ w =
      static_cast<const W*>(a.weights) + r.m.weight_offset + static_cast<std::int64_t>(r.row) * dim;
  const float* __restrict__ s = a.state + r.m.state_offset + static_cast<std::int64_t>(r.row) * dim;
  const int opt = opt_of<kOpt>(a);
  const bool adagrad = opt == kAdagrad;
  if (kFit > 0 || r.vec) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int c = detail::vec_col(L.glane, v, 0, group, V);
      if (in_row<kFit>(c, dim)) {
        load_vec<V, W, true>(w + c, rv.w[v]);  // streaming: keep L2 for the gradients
        if (adagrad) load_vec<V, float, true>(s + c, rv.s[v]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) rv.w[v][e] = rv.s[v][e] = 0.0f;
      }
    }
  } else {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int c = detail::scalar_col(L.glane, v, e, group, V);
        rv.w[v][e] = c < dim ? to_float(w[c]) : 0.0f;
        rv.s[v][e] = adagrad && c < dim ? s[c] : 0.0f;
      }
    }
  }
  rv.s_row = opt == kRowwise ? a.state[r.m.state_offset + r.row] : 0.0f;
}

// One optimizer step on the row with gradient g, then the stores (every lane of the group calls
// it).
template <class W, int kVecs, int V, int kOpt, int kFit = 0>
__device__ __forceinline__ void update_row(const BackwardArgs& a, const RowRef& r, const Lanes& L,
                                           float (&g)[kVecs][V], RowValues<kVecs, V>& rv) {
  const int group = group_of<kFit>(a);
  const int dim = r.m.dim;
  W* __restrict__ w =
      static_cast<W*>(a.weights) + r.m.weight_offset + static_cast<std::int64_t>(r.row) * dim;
  auto& wv = rv.w;
  const int opt = opt_of<kOpt>(a);
  if (a.wd != 0.0f) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) g[v][e] = fmaf(a.wd, wv[v][e], g[v][e]);
    }
  }

  if (opt == kSgd) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) wv[v][e] -= a.lr * g[v][e];
    }
  } else if (opt == kRowwise) {
    float squares = 0.0f;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (kFit > 0 || col_of(r.vec, L.glane, v, e, group, V) < dim)
          squares = fmaf(g[v][e], g[v][e], squares);
      }
    }
    for (int o = group / 2; o >= 1; o >>= 1) squares += shfl_xor(L.mask, squares, o);
    squares = shfl(L.mask, squares, L.gfirst);  // one value for the whole group
    const float sum = rv.s_row + squares / static_cast<float>(dim);
    if (L.glane == 0) a.state[r.m.state_offset + r.row] = sum;
    const float step = a.lr / (sqrtf(sum) + a.eps);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) wv[v][e] -= step * g[v][e];
    }
  } else {  // adagrad: state per element
    float* __restrict__ s = a.state + r.m.state_offset + static_cast<std::int64_t>(r.row) * dim;
    auto& sv = rv.s;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        sv[v][e] = fmaf(g[v][e], g[v][e], sv[v][e]);
        wv[v][e] -= a.lr * g[v][e] / (sqrtf(sv[v][e]) + a.eps);
      }
    }
    store_row_f32<kVecs, V, kFit>(s, sv, r.vec, L.glane, group, dim);
  }

  // Store the row: fp32 as is; fp16/bf16 stochastically rounded (or to nearest).
  if constexpr (std::is_same_v<W, float>) {
    store_row_f32<kVecs, V, kFit>(w, wv, r.vec, L.glane, group, dim);
  } else {
    // Keyed as the whole table's element where this table is a piece of it (TableMeta::round_*),
    // read here rather than kept from the row's metadata: no registers held through the update.
    const TableMeta& round = a.meta[r.t];
    const std::uint64_t row_key =
        rng::row_key(a.sr_key, static_cast<std::uint64_t>(round.round_table),
                     static_cast<std::uint64_t>(r.row + round.round_row));
    const std::int64_t c0 = round.round_col;
    // A vector group's random bits: one 32-bit hash per 2 columns (c is even here; c + c0 too but
    // for a piece that starts at an odd column, whose elements draw their 16 bits one by one).
    auto put = [&](W* p, const float(&x)[V], int c) {
      std::uint16_t h[V];
      if (a.sr && (c0 & 1) == 0) {
#pragma unroll
        for (int e = 0; e < V; e += 2) {
          const std::uint32_t bits =
              rng::bits32(row_key, static_cast<std::uint64_t>(c0 + c + e) >> 1);
          h[e] = from_float_sr<W>(x[e], bits & 0xffffu).bits;
          h[e + 1] = from_float_sr<W>(x[e + 1], bits >> 16).bits;
        }
      } else if (a.sr) {
#pragma unroll
        for (int e = 0; e < V; ++e)
          h[e] =
              from_float_sr<W>(x[e], rng::bits16(row_key, static_cast<std::uint64_t>(c0 + c + e)))
                  .bits;
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) h[e] = from_float_rn<W>(x[e]).bits;
      }
      store_vec16<V, W, true>(p, h);
    };
    auto put_one = [&](W* p, float x, int c) {
      *p = a.sr ? from_float_sr<W>(x, rng::bits16(row_key, static_cast<std::uint64_t>(c0 + c)))
                : from_float_rn<W>(x);
    };
    detail::store_row<kVecs, V, kFit>(w, wv, r.vec, L.glane, group, dim, put, put_one);
  }
}

// ---------------------------------------------------------------- kernels --

// Blocks of 128 threads for the rows kernel: at ~100-128 registers a thread, more warps fit a
// multiprocessor than with 256-thread blocks (register allocation is per block).
constexpr int kRowsBlock = 128;
template <class W, int kVecs, int kOpt, int kFit>
constexpr int rows_min_blocks() {
  if (kFit > 0 && kOpt != kAdagrad && kVecs * VecWidth<W>::value == 16) return 5;
  // 128 threads x this many blocks share the 64K registers of a multiprocessor; sized from the
  // floats a lane holds per row (weights, gradient, adagrad state) so that no shape spills.
  constexpr int floats = kVecs * VecWidth<W>::value;
  constexpr int blocks = floats <= 4 ? 6 : floats <= 8 ? 5 : floats <= 16 ? 4 : 2;
  return kOpt == kAdagrad && blocks > 2 ? blocks - 1 : blocks;
}

// The indices of one segment: its occurrence range, key, first bag, and this lane's first bag.
// They form a chain of two loads (the range, then the key and bags at its start), fetched in two
// stages a loop iteration apart (SegmentBounds first) so that no iteration waits on either link.
struct SegmentBounds {
  std::uint32_t start;
  std::uint32_t end;  // start == end: no segment
};
struct SegmentIndex {
  std::uint32_t start;
  std::uint32_t end;  // start == end: no segment
  std::uint32_t key;
  std::uint32_t bag0;
  std::uint32_t my_bag;
};

__device__ __forceinline__ SegmentBounds load_bounds(const BackwardArgs& a, std::int64_t u,
                                                     std::int64_t segments) {
  SegmentBounds b{0, 0};
  if (u < segments) {
    b.start = a.seg_start[u];
    b.end = a.seg_start[u + 1];
  }
  return b;
}

__device__ __forceinline__ SegmentIndex load_segment(const BackwardArgs& a, SegmentBounds b,
                                                     const Lanes& L) {
  SegmentIndex s{b.start, b.end, 0, 0, 0};
  if (b.start < b.end) {
    s.key = a.keys[b.start];
    s.bag0 = a.bags[b.start];
    if (b.start + L.glane < b.end) s.my_bag = a.bags[b.start + L.glane];
  }
  return s;
}

// One group per distinct row (grid-stride over the device's segment count): rows with at most
// kHeavyRow occurrences are summed and updated here; longer ones are queued as chunks.
// Each row is a chain (indices, then weights and gradients, then the update), so indices are
// loaded ahead (two stages, see the top), and a group of 8 lanes (dim-128 fp32) owns a row so that
// a warp has four rows in flight. Weight rows and state are read and written with cache-streaming
// hints (they pass through once; the output gradients, read once per occurrence, should stay in
// L2). With kFit the kernel waits mostly on the weight and gradient loads: it is limited by the
// rows in flight, which registers bound (bench/lab/row_probe.cu measures the bare
// read-modify-write of the same rows). An L2 prefetch of the rows two segments ahead and
// asynchronous copies of the next rows into shared memory were both slower than this plain
// version (docs/perf/embedding.md has the measurements).
template <class W, class Gd, int kVecs, int kOpt, int kFit>
__global__ PARITY_LAUNCH_BOUNDS(
    kRowsBlock,
    (rows_min_blocks<W, kVecs, kOpt, kFit>())) void embedding_backward_rows_kernel(BackwardArgs a) {
  constexpr int V = VecWidth<W>::value;
  const int group = group_of<kFit>(a);
  const Lanes L = group_lanes(group);
  const std::int64_t groups_per_block = kRowsBlock / group;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * groups_per_block;
  const std::int64_t segments = a.counters[a.bound + 1];  // this launch group's run ends here
  const std::int64_t u0 = a.counters[a.bound] +
                          static_cast<std::int64_t>(blockIdx.x) * groups_per_block +
                          threadIdx.x / group;
  if (u0 >= segments) return;
  SegmentIndex cur = load_segment(a, load_bounds(a, u0, segments), L);
  SegmentIndex ahead1 = load_segment(a, load_bounds(a, u0 + stride, segments), L);
  SegmentBounds bounds2 = load_bounds(a, u0 + 2 * stride, segments);
  for (std::int64_t u = u0; u < segments; u += stride) {
    const SegmentBounds bounds3 = load_bounds(a, u + 3 * stride, segments);
    const SegmentIndex ahead2 = load_segment(a, bounds2, L);  // its bounds arrived an iteration ago
    RowRef r;
    if (resolve_row<W, Gd, kFit>(a, cur.key, cur.bag0, r)) {
      const std::uint32_t len = cur.end - cur.start;
      if (len > static_cast<std::uint32_t>(kHeavyRow)) {
        const int chunks = static_cast<int>((len + kChunk - 1) / kChunk);
        const int merges = merged_sums(chunks, group);
        int h = 0, base = 0, mbase = 0;
        if (L.glane == 0) {
          h = atomicAdd(&a.counters[1], 1);
          base = atomicAdd(&a.counters[2], chunks);
          mbase = atomicAdd(&a.counters[3], merges);
          if (h < a.max_heavy) {
            a.heavy_rows[h] = static_cast<int>(u);
            a.heavy_base[h] = base;
            a.heavy_merge_base[h] = mbase;
          }
        }
        h = shfl(L.mask, h, L.gfirst);
        base = shfl(L.mask, base, L.gfirst);
        mbase = shfl(L.mask, mbase, L.gfirst);
        for (int c = L.glane; c < chunks; c += group) {
          if (base + c < a.max_chunks) {
            a.chunk_seg[base + c] = static_cast<int>(u);
            a.chunk_idx[base + c] = c;
          }
        }
        for (int j = L.glane; j < merges; j += group) {
          if (mbase + j < a.max_merges) {
            a.merge_heavy[mbase + j] = h;
            a.merge_idx[mbase + j] = j;
          }
        }
      } else {
        RowValues<kVecs, V> rv;
        load_row<W, kVecs, V, kOpt, kFit>(a, r, L, rv);
        float g[kVecs][V];
        zero(g);
        accumulate<Gd, kVecs, V, kFit>(a, r, cur.start, cur.end, cur.my_bag, L, g);
        update_row<W, kVecs, V, kOpt, kFit>(a, r, L, g, rv);
      }
    }
    cur = ahead1;
    ahead1 = ahead2;
    bounds2 = bounds3;
  }
}

// One group per chunk of a heavy row: partial[slot] = sum of the chunk's occurrences.
template <class W, class Gd, int kVecs>
__global__ PARITY_LAUNCH_BOUNDS(kBlock, 2) void embedding_backward_chunks_kernel(BackwardArgs a) {
  constexpr int V = VecWidth<W>::value;
  const int group = a.group;
  const Lanes L = group_lanes(group);
  const std::int64_t groups_per_block = kBlock / group;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * groups_per_block;
  const std::int64_t chunks = a.counters[2] < a.max_chunks ? a.counters[2] : a.max_chunks;
  for (std::int64_t k =
           static_cast<std::int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / group;
       k < chunks; k += stride) {
    const int u = a.chunk_seg[k];
    const int c = a.chunk_idx[k];
    const std::uint32_t start = a.seg_start[u];
    const std::uint32_t end = a.seg_start[u + 1];
    RowRef r;
    if (!resolve_row<W, Gd>(a, a.keys[start], a.bags[start], r)) continue;
    const std::uint32_t p0 = start + static_cast<std::uint32_t>(c) * kChunk;
    const std::uint32_t p1 = end - p0 < static_cast<std::uint32_t>(kChunk) ? end : p0 + kChunk;
    float g[kVecs][V];
    zero(g);
    const std::uint32_t first = p0 + L.glane < p1 ? a.bags[p0 + L.glane] : 0u;
    accumulate<Gd, kVecs, V, 0, (kVecs * V >= 32 ? 16 : 32)>(a, r, p0, p1, first, L, g);
    store_partial<kVecs, V>(a.partial + k * a.partial_ld, g, r.vec, L.glane, group, r.m.dim);
  }
}

// g += a partial row of a heavy row (a chunk's sum, or a group's), in either layout.
template <int kVecs, int V>
__device__ __forceinline__ void add_partial(const float* __restrict__ src, const RowRef& r,
                                            const Lanes& L, int group, float (&g)[kVecs][V]) {
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int col = col_of(r.vec, L.glane, v, e, group, V);
      if (col < r.m.dim) g[v][e] += src[col];
    }
  }
}

// One group per merged-sum slot: merged[slot] = the sum, in order, of chunk sums
// [kMerge j, kMerge (j + 1)) of its heavy row.
template <class W, class Gd, int kVecs>
__global__ PARITY_LAUNCH_BOUNDS(kBlock, 2) void embedding_backward_merge_kernel(BackwardArgs a) {
  constexpr int V = VecWidth<W>::value;
  const int group = a.group;
  const Lanes L = group_lanes(group);
  const std::int64_t groups_per_block = kBlock / group;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * groups_per_block;
  const std::int64_t slots = a.counters[3] < a.max_merges ? a.counters[3] : a.max_merges;
  for (std::int64_t k =
           static_cast<std::int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / group;
       k < slots; k += stride) {
    const int h = a.merge_heavy[k];
    if (h >= a.max_heavy) continue;
    const int u = a.heavy_rows[h];
    const std::int64_t base = a.heavy_base[h];
    const std::uint32_t start = a.seg_start[u];
    const std::uint32_t end = a.seg_start[u + 1];
    RowRef r;
    if (!resolve_row<W, Gd>(a, a.keys[start], a.bags[start], r)) continue;
    const std::int64_t n = (end - start + kChunk - 1) / kChunk;
    const std::int64_t lo = static_cast<std::int64_t>(a.merge_idx[k]) * kMerge;
    const std::int64_t hi = lo + kMerge < n ? lo + kMerge : n;
    float g[kVecs][V];
    zero(g);
    for (std::int64_t q = lo; q < hi; ++q)
      add_partial(a.partial + (base + q) * a.partial_ld, r, L, group, g);
    store_partial<kVecs, V>(a.merged + k * a.partial_ld, g, r.vec, L.glane, group, r.m.dim);
  }
}

// One block per heavy row: group i sums a fixed range of the row's merged sums in order, then
// group 0 sums the groups' results in order and applies the update.
template <class W, class Gd, int kVecs>
__global__ PARITY_LAUNCH_BOUNDS(kBlock, 1) void embedding_backward_heavy_kernel(BackwardArgs a) {
  constexpr int V = VecWidth<W>::value;
  extern __shared__ float sums[];  // [groups per block][sums_ld]
  const int group = a.group;
  const Lanes L = group_lanes(group);
  const int groups_per_block = kBlock / group;
  const int gi = static_cast<int>(threadIdx.x) / group;
  const std::int64_t heavy = a.counters[1] < a.max_heavy ? a.counters[1] : a.max_heavy;
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the rows kernel has counted this launch's
    a.counters[a.totals] += a.counters[1];
    a.counters[a.totals + 1] += a.counters[2];
  }
  for (std::int64_t h = blockIdx.x; h < heavy; h += gridDim.x) {
    const int u = a.heavy_rows[h];
    const std::int64_t base = a.heavy_merge_base[h];
    const std::uint32_t start = a.seg_start[u];
    const std::uint32_t end = a.seg_start[u + 1];
    RowRef r;
    if (!resolve_row<W, Gd>(a, a.keys[start], a.bags[start], r))
      continue;  // uniform over the block
    const int chunks = static_cast<int>((end - start + kChunk - 1) / kChunk);
    const int merges = merged_sums(chunks, group);
    // The row's merged sums, or (few chunks) its chunk sums themselves.
    const float* __restrict__ sums_of_row =
        merges > 0 ? a.merged + base * a.partial_ld : a.partial + a.heavy_base[h] * a.partial_ld;
    const std::int64_t n = merges > 0 ? merges : chunks;
    // Only groups with sums to add take part: a row of a few chunks is summed by a few groups, and
    // group 0 then adds a few partial rows, not one per group of the block (256 for a narrow
    // table). The order of the sums is the same as with every group taking part.
    const int active = static_cast<int>(n < groups_per_block ? n : groups_per_block);
    float g[kVecs][V];
    if (gi < active) {
      const std::int64_t lo = gi * n / active;
      const std::int64_t hi = (gi + 1) * n / active;
      zero(g);
      for (std::int64_t q = lo; q < hi; ++q)
        add_partial(sums_of_row + q * a.partial_ld, r, L, group, g);
      store_partial<kVecs, V>(sums + static_cast<std::int64_t>(gi) * a.sums_ld, g, r.vec, L.glane,
                              group, r.m.dim);
    }
    __syncthreads();
    if (gi == 0) {
      RowValues<kVecs, V> rv;
      load_row<W, kVecs, V, kAnyOpt>(a, r, L, rv);
      zero(g);
      for (int i = 0; i < active; ++i)
        add_partial(sums + static_cast<std::int64_t>(i) * a.sums_ld, r, L, group, g);
      update_row<W, kVecs, V, kAnyOpt>(a, r, L, g, rv);
    }
    __syncthreads();
  }
}

// True when every table fills a group of the launch's shape exactly (dim == group * vecs * V) and
// every weight row, gradient row and adagrad state row is aligned for 16-byte vectors: the rows
// kernel can take its kFit specialization (see group_of).
template <class W, class Gd>
bool rows_fit(const EmbeddingTables& tables, const TableGroup& g, const BackwardArgs& a, int vecs) {
  constexpr int V = VecWidth<W>::value;
  constexpr std::size_t kGradAlign = V * sizeof(Gd) < 16 ? V * sizeof(Gd) : 16;
  const auto aligned = [](const void* p, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
  };
  const bool adagrad = a.opt == kAdagrad;
  if (!aligned(a.weights, 16) || !aligned(a.dout, kGradAlign) ||
      (a.ld * sizeof(Gd)) % kGradAlign != 0 || (adagrad && !aligned(a.state, 16))) {
    return false;
  }
  for (const int i : g.tables) {
    const TableLayout& t = tables.layouts()[static_cast<std::size_t>(i)];
    if (t.dim != a.group * vecs * V || (t.weight_offset * sizeof(W)) % 16 != 0 ||
        (t.out_col * sizeof(Gd)) % kGradAlign != 0 ||
        (adagrad && (t.state_offset * sizeof(float)) % 16 != 0)) {
      return false;
    }
    // Host-placed rows are reached from their own base, which must be aligned as well.
    if (t.host_placed() &&
        (reinterpret_cast<std::uintptr_t>(t.host.weights) % 16 != 0 ||
         (adagrad && reinterpret_cast<std::uintptr_t>(t.host.state) % 16 != 0))) {
      return false;
    }
  }
  return true;
}

// The rows kernel, specialized (kFit) for groups of 4, 8 or 16 lanes at the default lane shape
// (16 elements per lane: four 16-byte vectors of fp32, two of fp16/bf16; dims 64, 128, 256) when
// the rows fit.
// Returns the specialization's group, or 0 for the general kernel.
template <class W, class Gd, int kVecs, int kOpt>
int launch_rows(Stream_t stream, const BackwardArgs& a, bool fit) {
  const auto go = [&](auto kernel) {
    launch("embedding_backward_rows", kernel,
           {resident_blocks(kernel, kRowsBlock, 0), kRowsBlock, 0}, stream, a);
  };
  if constexpr (kVecs * VecWidth<W>::value == 16) {
    if (fit) {
      switch (a.group) {
        case 4:
          go(embedding_backward_rows_kernel<W, Gd, kVecs, kOpt, 4>);
          return 4;
        case 8:
          go(embedding_backward_rows_kernel<W, Gd, kVecs, kOpt, 8>);
          return 8;
        case 16:
          go(embedding_backward_rows_kernel<W, Gd, kVecs, kOpt, 16>);
          return 16;
        default:
          break;
      }
    }
  }
  go(embedding_backward_rows_kernel<W, Gd, kVecs, kOpt, 0>);
  return 0;
}

template <class W, class Gd, int kVecs>
int launch_update(Stream_t stream, BackwardArgs& a, bool fit, BackwardProfile* profile) {
  int fit_group = 0;
  switch (a.opt) {
    case kSgd:
      fit_group = launch_rows<W, Gd, kVecs, kSgd>(stream, a, fit);
      break;
    case kAdagrad:
      fit_group = launch_rows<W, Gd, kVecs, kAdagrad>(stream, a, fit);
      break;
    default:
      fit_group = launch_rows<W, Gd, kVecs, kRowwise>(stream, a, fit);
      break;
  }
  if (profile != nullptr && !rehearsing()) profile->rows_done[profile->groups].record(stream);
  auto chunks = embedding_backward_chunks_kernel<W, Gd, kVecs>;
  auto heavy = embedding_backward_heavy_kernel<W, Gd, kVecs>;
  // A partial row per group, as wide as this launch's rows (its lanes cover group x kVecs x V
  // columns), not as the model's widest table: a narrow table's groups are single lanes, 256 a
  // block.
  a.sums_ld = static_cast<int>(
      std::min<std::int64_t>(a.partial_ld, std::int64_t{a.group} * kVecs * VecWidth<W>::value));
  const std::size_t smem = static_cast<std::size_t>(kBlock / a.group) * a.sums_ld * sizeof(float);
  launch("embedding_backward_chunks", chunks, {resident_blocks(chunks, kBlock, 0), kBlock, 0},
         stream, a);
  auto merge = embedding_backward_merge_kernel<W, Gd, kVecs>;
  launch("embedding_backward_merge", merge, {resident_blocks(merge, kBlock, 0), kBlock, 0}, stream,
         a);
  launch("embedding_backward_heavy", heavy, {resident_blocks(heavy, kBlock, smem), kBlock, smem},
         stream, a);
  if (profile != nullptr && !rehearsing()) profile->heavy_done[profile->groups++].record(stream);
  return fit_group;
}

template <class W, class Gd>
int dispatch_vecs(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                  BackwardArgs& a, int vectors_per_lane, BackwardProfile* p) {
  const detail::GroupShape shape = detail::backward_group_shape(
      g.max_dim, VecWidth<W>::value, device_info().warp_size, vectors_per_lane);
  a.group = shape.group;
  const bool fit = rows_fit<W, Gd>(tables, g, a, shape.vecs);
  switch (shape.vecs) {
    case 1:
      return launch_update<W, Gd, 1>(stream, a, fit, p);
    case 2:
      return launch_update<W, Gd, 2>(stream, a, fit, p);
    default:
      return launch_update<W, Gd, 4>(stream, a, fit, p);
  }
}

template <class W>
int dispatch_grad(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                  BackwardArgs& a, DType grad, const UpdateOptions& u) {
  if (grad == DType::bf16)
    return dispatch_vecs<W, Bf16>(stream, tables, g, a, u.vectors_per_lane, u.profile);
  return dispatch_vecs<W, float>(stream, tables, g, a, u.vectors_per_lane, u.profile);
}

}  // namespace

void embedding_backward_update(Stream_t stream, const EmbeddingTables& tables,
                               const TableWeights& weights, float* state,
                               const DeviceSparseInput& in, CAMat dout, const OptimizerParams& opt,
                               const UpdateOptions& update, EmbeddingWorkspace& ws) {
  constexpr const char* op = "embedding_backward_update";
  detail::check_embedding_call(op, tables, weights, in, dout, "dout");
  if (opt.kind == OptimizerKind::adam) {
    throw InputError(
        cat(op, ": adam is not an embedding optimizer (use sgd, adagrad or rowwise_adagrad)"));
  }
  if (opt.kind != OptimizerKind::sgd && state == nullptr && in.nnz > 0) {
    throw InputError(cat(op, ": ",
                         opt.kind == OptimizerKind::adagrad ? "adagrad" : "rowwise_adagrad",
                         " needs optimizer state, and state is null"));
  }
  if (in.batch > ws.max_batch() || in.nnz > ws.max_nnz() || tables.max_dim() > ws.max_dim_) {
    throw InputError(cat(op, ": batch ", in.batch, " with ", in.nnz, " ids (max dim ",
                         tables.max_dim(), ") exceeds the workspace (batch ", ws.max_batch(), ", ",
                         ws.max_nnz(), " ids, dim ", ws.max_dim_, ")"));
  }
  if (!rehearsing()) {
    check(memset_async(ws.counters_.data(), 0, ws.counters_.bytes(), stream),
          "embedding_backward_update: counters");
  }
  ws.last_fit_groups_.clear();
  if (update.profile != nullptr) update.profile->groups = 0;
  if (in.nnz == 0 || in.batch == 0) return;

  auto mark = [&](int i) {
    if (update.profile != nullptr && !rehearsing()) update.profile->events[i].record(stream);
  };
  mark(0);
  const std::int64_t bags = in.batch * in.num_tables;
  const auto skip_key = static_cast<std::uint32_t>(tables.total_rows());
  const std::int64_t warps = ceil_div(bags, device_info().warp_size);
  const std::int64_t warps_per_block = detail::kBlock / device_info().warp_size;
  launch("embedding_keys", embedding_keys_kernel,
         {ceil_div(warps, warps_per_block), detail::kBlock, 0}, stream, tables.device_meta(),
         in.ids, in.offsets, in.batch, in.nnz, bags, skip_key, ws.keys_[0].data(),
         ws.bags_[0].data(), tables.device_errors());

  std::uint32_t* const keys[2] = {ws.keys_[0].data(), ws.keys_[1].data()};
  std::uint32_t* const vals[2] = {ws.bags_[0].data(), ws.bags_[1].data()};
  mark(1);
  const int cur = ws.sorter_.sort_pairs(stream, keys, vals, in.nnz, tables.key_bits());
  mark(2);

  const std::vector<TableGroup>& groups = tables.groups();
  SegmentStore store{};
  store.seg_start = ws.seg_start_.data();
  store.n = in.nnz;
  store.keys = keys[cur];
  store.bounds = ws.counters_.data() + EmbeddingWorkspace::kCounterBounds;
  store.groups = static_cast<int>(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) store.first_key[g] = groups[g].key_begin;
  store.first_key[groups.size()] = skip_key;
  scan::exclusive_scan(stream, "embedding_segments", in.nnz, nullptr, SegmentFlag{keys[cur]}, store,
                       ws.scan_tmp_.data(), reinterpret_cast<std::uint32_t*>(ws.counters_.data()));
  mark(3);

  BackwardArgs a{};
  a.meta = tables.device_meta();
  a.num_tables = tables.num_tables();
  a.keys = keys[cur];
  a.bags = vals[cur];
  a.seg_start = ws.seg_start_.data();
  a.counters = ws.counters_.data();
  a.totals = EmbeddingWorkspace::kCounterTotals;
  a.offsets = in.offsets;
  a.batch = in.batch;
  a.batch_div = DivideBy::of(static_cast<std::uint32_t>(in.batch));
  a.skip_key = skip_key;
  a.dout = dout.data;
  a.ld = dout.ld;
  a.state = state;
  a.opt = static_cast<int>(opt.kind);
  a.lr = opt.lr;
  a.eps = opt.eps;
  a.wd = opt.weight_decay;
  a.sr_key = rng::key(update.seed, update.step);
  a.sr = update.stochastic_rounding ? 1 : 0;
  a.heavy_rows = ws.heavy_rows_.data();
  a.heavy_base = ws.heavy_base_.data();
  a.chunk_seg = ws.chunk_seg_.data();
  a.chunk_idx = ws.chunk_idx_.data();
  a.partial = ws.partial_.data();
  a.partial_ld = ws.partial_ld_;
  a.max_heavy = ws.max_heavy_;
  a.max_chunks = ws.max_chunks_;
  a.heavy_merge_base = ws.heavy_merge_base_.data();
  a.merge_heavy = ws.merge_heavy_.data();
  a.merge_idx = ws.merge_idx_.data();
  a.merged = ws.merged_.data();
  a.max_merges = ws.max_merges_;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const TableGroup& g = groups[gi];
    if (gi > 0 && !rehearsing()) {  // the heavy-row lists start empty for each launch group
      check(memset_async(ws.counters_.data() + 1, 0, 3 * sizeof(int), stream),
            "embedding_backward_update: counters");
    }
    a.weights = weights.of(g.dtype);
    a.bound = EmbeddingWorkspace::kCounterBounds + static_cast<int>(gi);
    a.key_begin = g.key_begin;
    a.key_end = g.key_end;
    int fit = 0;
    switch (g.dtype) {
      case DType::f16:
        fit = dispatch_grad<F16>(stream, tables, g, a, dout.dtype, update);
        break;
      case DType::bf16:
        fit = dispatch_grad<Bf16>(stream, tables, g, a, dout.dtype, update);
        break;
      default:
        fit = dispatch_grad<float>(stream, tables, g, a, dout.dtype, update);
        break;
    }
    ws.last_fit_groups_.push_back(fit);
  }
}

}  // namespace parity::gpu
