// Table-batched embedding-bag forward: every bag of every table of a launch group (a storage type
// and a lane shape: launch_groups) in one launch per run of tables with the same bags per group.
//
// Why it is built this way: the forward is a gather; its floor is reading each looked-up row once
// (plus ids, offsets and the output), so the kernel exists to keep HBM busy:
// - one group of G lanes per bag (G from the largest dim, see embedding_common.cuh), so a dim-128
//   fp32 row is one 16-byte load per lane of a 32-lane group: full 512-byte rows per instruction;
// - the group loads up to G ids at once (coalesced) and broadcasts them with shuffles, then issues
//   kUnroll row loads before the first add, so several rows are in flight per lane;
// - per-table dims, offsets, pooling and alignment are read per bag from a small table of
//   metadata (L1-resident: the group's tables, each naming its table in the input), so all tables
//   of a type go in one launch and the grid is T * B / (bags per block) blocks, table-major like
//   the CSR;
// - rows that are not 16-byte aligned (dims not a multiple of V, odd offsets) and outputs with an
//   unaligned ld or out_col take a scalar path for that table only;
// - accumulation in fp32 whatever the weight type; mean divides once at the end; an empty bag
//   writes zeros; ids outside [0, rows) are skipped and recorded (EmbeddingTables reports them).
#include <cstdint>
#include <type_traits>

#include "backend/gpu/embedding.h"
#include "backend/gpu/embedding_common.cuh"
#include "backend/gpu/launch.h"

namespace parity::gpu {

namespace {

using detail::InputErrorRecord;
using detail::kBlock;
using detail::TableMeta;

// The first element of a row: `row` is its index (kHost false) or its element offset from the
// table's start (true), whose address may be in host memory.
template <bool kHost, class W, class R>
__device__ __forceinline__ const W* row_at(const W* table, R row, int dim) {
  if constexpr (kHost) {
    return reinterpret_cast<const W*>(reinterpret_cast<std::uintptr_t>(table) +
                                      static_cast<std::uintptr_t>(row) * sizeof(W));
  } else {
    return table + static_cast<std::int64_t>(row) * dim;
  }
}

// A valid id's row as row_at takes it: its index (kHost false), or its element offset from the
// table's start, in the table's cache or, where the id is not cached, in host memory
// (host_delta: the host rows' offset from the cache).
template <bool kHost>
__device__ __forceinline__ std::conditional_t<kHost, std::int64_t, int> forward_row(
    const TableMeta& m, std::int64_t id, int dim, std::int64_t host_delta) {
  if constexpr (kHost) {
    if (m.slot == nullptr) return id * dim;
    const std::uint32_t s = m.slot[id];
    return s != TableLayout::kNotCached ? static_cast<std::int64_t>(s) * dim
                                        : host_delta + id * dim;
  } else {
    return static_cast<int>(id);
  }
}

template <int kVecs, int V>
__device__ __forceinline__ void zero_acc(float (&acc)[kVecs][V]) {
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[v][e] = 0.0f;
  }
}

// Stores one bag's sum of `count` ids to its output row (mean pooling divides by the count; an
// empty bag stores zeros) and clears the sum for the next bag.
template <int kVecs, int V, class O>
__device__ __forceinline__ void store_bag(O* __restrict__ dst, float (&acc)[kVecs][V], int pooling,
                                          std::int64_t count, bool vec, int glane, int group,
                                          int dim) {
  if (pooling == 1 && count > 0) {
    const float c = static_cast<float>(count);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc[v][e] = acc[v][e] / c;
    }
  }
  detail::store_row<kVecs, V>(
      dst, acc, vec, glane, group, dim,
      [](O* p, const float(&x)[V], int) { store_vec_rn<V>(p, x); },
      [](O* p, float x, int) { *p = from_float_rn<O>(x); });
  zero_acc(acc);
}

// kHost: some table of the launch is host-placed (TableMeta::slot). Its rows are then found
// through the cache map, and the group passes 64-bit element offsets from the table's start
// (in its cache, or to its host rows) instead of row indices.
template <class W, class O, int kVecs, bool kHost>
__global__
PARITY_LAUNCH_BOUNDS(kBlock, (detail::min_blocks<W, kVecs>())) void embedding_forward_kernel(
    const TableMeta* __restrict__ meta, const W* __restrict__ weights,
    const std::int64_t* __restrict__ ids, const std::int64_t* __restrict__ offsets,
    std::int64_t batch, std::int64_t nnz, std::int64_t num_bags, O* __restrict__ out,
    std::int64_t ld, int group, InputErrorRecord* errors) {
  constexpr int V = VecWidth<W>::value;
  constexpr int kWords = RawWords<V, W>::value;  // 4: one 16-byte load per vector
  constexpr int kUnroll = 8 / kVecs;             // row loads in flight per lane: kUnroll * kVecs
  const int lane = lane_id();
  const int glane = lane & (group - 1);
  const int gfirst = lane - glane;
  const LaneMask gmask = group_mask(gfirst, group);
  const std::int64_t bag = static_cast<std::int64_t>(blockIdx.x) * (kBlock / group) +
                           static_cast<std::int64_t>(threadIdx.x) / group;
  if (bag >= num_bags) return;  // the whole group leaves together

  const int local = static_cast<int>(bag / batch);
  const std::int64_t b = bag - static_cast<std::int64_t>(local) * batch;
  const TableMeta m = meta[local];
  const int t = m.input;  // in the sparse input
  const int dim = m.dim;
  const std::int64_t in_bag = static_cast<std::int64_t>(t) * batch + b;
  std::int64_t lo = offsets[in_bag];
  std::int64_t hi = offsets[in_bag + 1];
  if (lo < 0 || hi < lo || hi > nnz) {
    if (glane == 0) detail::record_input_error(errors, 2, t, b, hi < lo ? hi : lo);
    lo = hi = 0;
  }
  const W* __restrict__ table = weights + m.weight_offset;
  O* __restrict__ dst = out + b * ld + m.out_col;
  constexpr unsigned kOutAlign = V * sizeof(O) < 16 ? V * sizeof(O) : 16;
  const bool vec = dim % V == 0 && detail::aligned_to(table, 16) &&
                   detail::aligned_to(dst, kOutAlign) &&
                   (!kHost || m.slot == nullptr || (m.host_weight_offset * sizeof(W)) % 16 == 0);

  float acc[kVecs][V];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[v][e] = 0.0f;
  }

  using RowT = std::conditional_t<kHost, std::int64_t, int>;
  constexpr RowT kSkip = kHost ? static_cast<RowT>(INT64_MIN) : static_cast<RowT>(INT32_MIN);
  // A host-placed table's host rows, as an element offset from `table` (both are flat addresses).
  const std::int64_t host_delta = kHost ? m.host_weight_offset - m.weight_offset : 0;
  for (std::int64_t j0 = lo; j0 < hi; j0 += group) {
    const int count = static_cast<int>(hi - j0 < group ? hi - j0 : group);
    RowT my_row = kSkip;  // kHost: the row's element offset from `table` (may be negative)
    if (glane < count) {
      const std::int64_t id = ids[j0 + glane];
      if (id >= 0 && id < m.rows) {
        my_row = forward_row<kHost>(m, id, dim, host_delta);
      } else {
        detail::record_input_error(errors, 1, t, b, id);
      }
    }
    for (int k = 0; k < count; k += kUnroll) {
      RowT row[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int src = k + u < count ? k + u : count - 1;
        row[u] = shfl(gmask, my_row, gfirst + src);
        if (k + u >= count) row[u] = kSkip;
      }
      if (vec) {
        std::uint32_t x[kUnroll][kVecs][kWords];  // raw rows in flight
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
            const int c = (glane + v * group) * V;
            if (row[u] != kSkip && c < dim) {
              load_raw<V, W>(row_at<kHost>(table, row[u], dim) + c, x[u][v]);
            } else {
#pragma unroll
              for (int i = 0; i < kWords; ++i) x[u][v][i] = 0u;  // +0.0 in every type
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int v = 0; v < kVecs; ++v) raw_add<V, W>(x[u][v], acc[v]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (row[u] == kSkip) continue;
          const W* __restrict__ src = row_at<kHost>(table, row[u], dim);
#pragma unroll
          for (int v = 0; v < kVecs; ++v) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const int c = detail::scalar_col(glane, v, e, group, V);
              if (c < dim) acc[v][e] += to_float(src[c]);
            }
          }
        }
      }
    }
  }

  store_bag<kVecs, V>(dst, acc, m.pooling, hi - lo, vec, glane, group, dim);
}

// Short bags: a group sums kBags consecutive bags of one table together, one accumulator each,
// reading kUnroll rows at a time (kUnroll / kBags from each bag, in order), so that tables of one
// or two ids a bag still have several rows in flight per lane. Each bag's sum is in id order, as
// in the kernel above. Every lane reads the bags' bounds and ids itself (the same addresses
// across the group: one transaction each). Bad bounds make a bag empty (and are reported).
template <class W, class O, int kVecs, int kBags, bool kHost>
__global__ PARITY_LAUNCH_BOUNDS(kBlock, 2) void embedding_forward_short_kernel(
    const TableMeta* __restrict__ meta, const W* __restrict__ weights,
    const std::int64_t* __restrict__ ids, const std::int64_t* __restrict__ offsets,
    std::int64_t batch, std::int64_t nnz, std::int64_t num_slots, O* __restrict__ out,
    std::int64_t ld, int group, InputErrorRecord* errors) {
  constexpr int V = VecWidth<W>::value;
  constexpr int kWords = RawWords<V, W>::value;
  constexpr int kUnroll = 8 / kVecs;
  static_assert(kBags >= 2 && kBags <= detail::forward_max_bags(kVecs, V),
                "kBags divides the rows in flight");
  constexpr int kPer = kUnroll / kBags;  // rows of each bag per step
  const int lane = lane_id();
  const int glane = lane & (group - 1);
  const std::int64_t slot = static_cast<std::int64_t>(blockIdx.x) * (kBlock / group) +
                            static_cast<std::int64_t>(threadIdx.x) / group;
  if (slot >= num_slots) return;  // the whole group leaves together

  const std::int64_t per_table = (batch + kBags - 1) / kBags;
  const int local = static_cast<int>(slot / per_table);
  const std::int64_t b0 = (slot - static_cast<std::int64_t>(local) * per_table) * kBags;
  const int nb = static_cast<int>(batch - b0 < kBags ? batch - b0 : kBags);
  const TableMeta m = meta[local];
  const int t = m.input;
  const int dim = m.dim;
  const std::int64_t in0 = static_cast<std::int64_t>(t) * batch + b0;
  const W* __restrict__ table = weights + m.weight_offset;
  O* __restrict__ dst0 = out + b0 * ld + m.out_col;
  constexpr unsigned kOutAlign = V * sizeof(O) < 16 ? V * sizeof(O) : 16;
  const bool vec = dim % V == 0 && detail::aligned_to(table, 16) &&
                   detail::aligned_to(dst0, kOutAlign) && (ld * sizeof(O)) % kOutAlign == 0 &&
                   (!kHost || m.slot == nullptr || (m.host_weight_offset * sizeof(W)) % 16 == 0);

  // Bag k's ids are [lo[k], lo[k] + n[k]) (ids < 2^31: checked on the host).
  int lo[kBags], n[kBags];
  int longest = 0;
  {
    std::int64_t prev = offsets[in0];
#pragma unroll
    for (int k = 0; k < kBags; ++k) {
      lo[k] = 0;
      n[k] = 0;
      if (k < nb) {
        const std::int64_t next = offsets[in0 + k + 1];
        if (prev >= 0 && next >= prev && next <= nnz) {
          lo[k] = static_cast<int>(prev);
          n[k] = static_cast<int>(next - prev);
        } else if (glane == 0) {
          detail::record_input_error(errors, 2, t, b0 + k, next < prev ? next : prev);
        }
        prev = next;
      }
      longest = n[k] > longest ? n[k] : longest;
    }
  }

  float acc[kBags][kVecs][V];
#pragma unroll
  for (int k = 0; k < kBags; ++k) zero_acc(acc[k]);
  using RowT = std::conditional_t<kHost, std::int64_t, int>;
  constexpr RowT kSkip = kHost ? static_cast<RowT>(INT64_MIN) : static_cast<RowT>(INT32_MIN);
  const std::int64_t host_delta = kHost ? m.host_weight_offset - m.weight_offset : 0;
  for (int i0 = 0; i0 < longest; i0 += kPer) {
    RowT row[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = u % kBags, e = i0 + u / kBags;
      row[u] = kSkip;
      if (e < n[k]) {
        const std::int64_t id = ids[lo[k] + e];
        if (id >= 0 && id < m.rows) {
          row[u] = forward_row<kHost>(m, id, dim, host_delta);
        } else if (glane == 0) {
          detail::record_input_error(errors, 1, t, b0 + k, id);
        }
      }
    }
    if (vec) {
      std::uint32_t x[kUnroll][kVecs][kWords];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          const int c = (glane + v * group) * V;
          if (row[u] != kSkip && c < dim) {
            load_raw<V, W>(row_at<kHost>(table, row[u], dim) + c, x[u][v]);
          } else {
#pragma unroll
            for (int i = 0; i < kWords; ++i) x[u][v][i] = 0u;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int v = 0; v < kVecs; ++v) raw_add<V, W>(x[u][v], acc[u % kBags][v]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (row[u] == kSkip) continue;
        const W* __restrict__ src = row_at<kHost>(table, row[u], dim);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const int c = detail::scalar_col(glane, v, e, group, V);
            if (c < dim) acc[u % kBags][v][e] += to_float(src[c]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kBags; ++k) {
    if (k < nb) store_bag<kVecs, V>(dst0 + k * ld, acc[k], m.pooling, n[k], vec, glane, group, dim);
  }
}

template <class W, class O, int kVecs, bool kHost>
void launch_run(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                const TableGroup::Run& run, const void* weights, const DeviceSparseInput& in,
                const AMat& out, int group) {
  const std::int64_t per_block = detail::kBlock / group;
  const TableMeta* meta = g.meta.data() + run.first;
  const auto go = [&](auto kernel, int bags) {
    const std::int64_t slots = ceil_div(in.batch, static_cast<std::int64_t>(bags)) * run.count;
    launch("embedding_forward", kernel, {ceil_div(slots, per_block), detail::kBlock, 0}, stream,
           meta, static_cast<const W*>(weights), in.ids, in.offsets, in.batch, in.nnz, slots,
           static_cast<O*>(out.data), out.ld, group, tables.device_errors());
  };
  constexpr int kMost = detail::forward_max_bags(kVecs, VecWidth<W>::value);
  switch (run.bags_per_group) {
    case 2:
      if constexpr (kMost >= 2) return go(embedding_forward_short_kernel<W, O, kVecs, 2, kHost>, 2);
      break;
    case 4:
      if constexpr (kMost >= 4) return go(embedding_forward_short_kernel<W, O, kVecs, 4, kHost>, 4);
      break;
    case 8:
      if constexpr (kMost >= 8) return go(embedding_forward_short_kernel<W, O, kVecs, 8, kHost>, 8);
      break;
    default:
      break;
  }
  go(embedding_forward_kernel<W, O, kVecs, kHost>, 1);
}

template <class W, class O, int kVecs>
void launch_forward(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                    const void* weights, const DeviceSparseInput& in, const AMat& out, int group) {
  for (const TableGroup::Run& run : g.runs) {
    if (g.host_placed) {
      launch_run<W, O, kVecs, true>(stream, tables, g, run, weights, in, out, group);
    } else {
      launch_run<W, O, kVecs, false>(stream, tables, g, run, weights, in, out, group);
    }
  }
}

template <class W, class O>
void dispatch_vecs(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                   const void* weights, const DeviceSparseInput& in, const AMat& out) {
  const detail::GroupShape shape =
      detail::group_shape(g.max_dim, VecWidth<W>::value, device_info().warp_size);
  switch (shape.vecs) {
    case 1:
      return launch_forward<W, O, 1>(stream, tables, g, weights, in, out, shape.group);
    case 2:
      return launch_forward<W, O, 2>(stream, tables, g, weights, in, out, shape.group);
    default:
      return launch_forward<W, O, 4>(stream, tables, g, weights, in, out, shape.group);
  }
}

template <class W>
void dispatch_out(Stream_t stream, const EmbeddingTables& tables, const TableGroup& g,
                  const void* weights, const DeviceSparseInput& in, const AMat& out) {
  if (out.dtype == DType::bf16) return dispatch_vecs<W, Bf16>(stream, tables, g, weights, in, out);
  return dispatch_vecs<W, float>(stream, tables, g, weights, in, out);
}

}  // namespace

void embedding_forward(Stream_t stream, const EmbeddingTables& tables, const TableWeights& weights,
                       const DeviceSparseInput& in, AMat out) {
  detail::check_embedding_call("embedding_forward", tables, weights, in, out, "out");
  if (in.batch == 0) return;
  for (const TableGroup& g : tables.groups()) {
    const void* w = weights.of(g.dtype);
    switch (g.dtype) {
      case DType::f16:
        dispatch_out<F16>(stream, tables, g, w, in, out);
        break;
      case DType::bf16:
        dispatch_out<Bf16>(stream, tables, g, w, in, out);
        break;
      default:
        dispatch_out<float>(stream, tables, g, w, in, out);
        break;
    }
  }
}

}  // namespace parity::gpu
