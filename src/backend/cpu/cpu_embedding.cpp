// Embedding-bag forward, gradient and fused optimizer update for the CPU reference.
//
// Why it is built this way:
// - Forward: one thread per block of examples; each bag is summed in double in CSR order and
//   stored once, so integer-valued tables pool exactly and the thread count changes nothing.
// - Backward: duplicate ids must be combined before the optimizer sees them (adagrad is not
//   linear in g) and the combination must not depend on scheduling. So the occurrences of each
//   table are sorted by (id, occurrence index), which is a stable sort by id, and cut into
//   segments of equal id; each segment is summed in double in CSR order, then one optimizer step
//   is applied per distinct row. This is the sort-and-segment scheme GPU kernels use (radix sort
//   of linearised indices, then one segment per row), so a GPU kernel can mirror it step by step.
// - The gradient alone (embedding_gradient) and the fused update share row_gradient(), so the
//   tests that check gradients check exactly what the update consumes.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_ops.h"
#include "parity/random.h"

namespace parity::cpu {

using backend_checks::fail_input;
using detail::fail;

void validate_sparse_input(const char* op, std::span<const TableLayout> tables,
                           const SparseInput& in, std::int64_t out_rows, std::int64_t out_cols) {
  if (in.batch < 0) fail(op, "batch is {}, expected >= 0", in.batch);
  if (in.num_tables != static_cast<std::int64_t>(tables.size())) {
    fail(op, "the sparse input has {} tables, the layout has {}", in.num_tables, tables.size());
  }
  if (out_rows != in.batch) fail(op, "the output has {} rows, the batch is {}", out_rows, in.batch);
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const TableLayout& tl = tables[t];
    if (tl.dim <= 0) fail(op, "table {} has dim {}, expected > 0", t, tl.dim);
    if (tl.rows < 0) fail(op, "table {} has {} rows, expected >= 0", t, tl.rows);
    if (tl.weight_offset < 0 || tl.state_offset < 0) {
      fail(op, "table {} has a negative weight or state offset", t);
    }
    if (tl.out_col < 0 || tl.out_col + tl.dim > out_cols) {
      fail(op, "table {} needs columns [{}, {}) of the output, which has {} columns", t, tl.out_col,
           tl.out_col + tl.dim, out_cols);
    }
  }
  const std::int64_t bags = in.batch * in.num_tables;
  if (in.offsets == nullptr) fail(op, "offsets is null");
  if (in.offsets[0] != 0) fail_input(op, "offsets[0] is {}, expected 0", in.offsets[0]);
  if (in.ids == nullptr && in.offsets[bags] > 0) fail(op, "ids is null");
  if (in.nnz >= 0 && in.nnz != in.offsets[bags]) {
    fail_input(op, "nnz is {}, but the offsets end at {}", in.nnz, in.offsets[bags]);
  }
  for (int t = 0; t < in.num_tables; ++t) {
    const std::int64_t rows = tables[t].rows;
    for (std::int64_t b = 0; b < in.batch; ++b) {
      const std::int64_t lo = in.offsets[t * in.batch + b];
      const std::int64_t hi = in.offsets[t * in.batch + b + 1];
      if (hi < lo) {
        fail_input(op, "table {}, bag {}: offsets decrease from {} to {}", t, b, lo, hi);
      }
      for (std::int64_t j = lo; j < hi; ++j) {
        const std::int64_t id = in.ids[j];
        if (id < 0 || id >= rows) {
          fail_input(op, "table {}, bag {}: id {} is outside [0, {})", t, b, id, rows);
        }
      }
    }
  }
}

namespace {

std::int64_t max_dim(std::span<const TableLayout> tables) {
  std::int64_t m = 1;
  for (const TableLayout& tl : tables) m = std::max<std::int64_t>(m, tl.dim);
  return m;
}

// Every table's weights are in a buffer of a storage type (checked before any parallel loop: an
// exception thrown inside one would end the process).
void check_weights(const char* op, std::span<const TableLayout> tables,
                   const TableWeights& weights) {
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const DType dt = tables[t].dtype;
    if (!is_table_dtype(dt))
      fail(op, "table {} is stored as {}; tables are fp32, fp16 or bf16", t, dtype_name(dt));
    const std::int64_t here = tables[t].host_placed() ? tables[t].host.cache_rows : tables[t].rows;
    if (weights.of(dt) == nullptr && here > 0)
      fail(op, "table {} is {}, and the {} weight buffer is null", t, dtype_name(dt),
           dtype_name(dt));
  }
}

// One table's rows in its storage type: T for fp32 tables (the double instantiation reads its
// fp32 buffer as double), 16-bit patterns for fp16 and bf16. set() rounds an updated element:
// to T, or to fp32 (nearest) and then stochastically with the bits of (row_key, column) as the
// GPU kernels do (StochasticRounding). A host-placed table's row r is in its cache row slot[r]
// or in host memory (TableLayout::host); at() resolves it once per row.
template <class T>
class TableRows {
 public:
  TableRows(const TableWeights& w, const TableLayout& tl) : tl_(tl) {
    // Host rows are fp32 (or 16-bit) as stored, never the double oracle's wide rows.
    if (tl.host_placed() && !std::is_same_v<T, float>)
      fail("embedding", "a host-placed table is read by the float ops only");
    auto* base = static_cast<std::byte*>(w.of(tl.dtype));
    cache_ = base == nullptr ? nullptr : base + tl.weight_offset * elem_bytes();
  }
  // Row r: its first element, and its optimizer state in `state` (rowwise: one element).
  struct Row {
    std::byte* w;
    std::int64_t state;  // element index into `state_base`
    T* state_base;
  };
  Row at(std::int64_t r, T* state) const {
    const std::int64_t per = tl_.dim * elem_bytes();
    const std::int64_t state_per = state_stride_;
    if (!tl_.host_placed()) return {cache_ + r * per, tl_.state_offset + r * state_per, state};
    const std::uint32_t s = tl_.host.slot[r];
    if (s != TableLayout::kNotCached)
      return {cache_ + static_cast<std::int64_t>(s) * per,
              tl_.state_offset + static_cast<std::int64_t>(s) * state_per, state};
    return {static_cast<std::byte*>(tl_.host.weights) + r * per, r * state_per,
            reinterpret_cast<T*>(tl_.host.state)};
  }
  void set_state_stride(std::int64_t s) { state_stride_ = s; }
  double get(const Row& row, int d) const {
    if (tl_.dtype == DType::f32) return static_cast<double>(reinterpret_cast<const T*>(row.w)[d]);
    const std::uint16_t h = reinterpret_cast<const std::uint16_t*>(row.w)[d];
    return tl_.dtype == DType::f16 ? half_to_float(h) : bf16_to_float(h);
  }
  void set(const Row& row, int d, double v, std::uint64_t row_key) const {
    if (tl_.dtype == DType::f32) {
      reinterpret_cast<T*>(row.w)[d] = static_cast<T>(v);
      return;
    }
    const float f = static_cast<float>(v);
    const std::uint32_t r = rng::bits16(row_key, static_cast<std::uint64_t>(d + tl_.round_col));
    reinterpret_cast<std::uint16_t*>(row.w)[d] =
        tl_.dtype == DType::f16 ? half_bits_sr(f, r) : bf16_bits_sr(f, r);
  }

 private:
  std::int64_t elem_bytes() const {
    return tl_.dtype == DType::f32 ? static_cast<std::int64_t>(sizeof(T)) : 2;
  }
  const TableLayout& tl_;
  std::byte* cache_;
  std::int64_t state_stride_ = 0;
};

// The occurrences of the batch grouped into segments of equal (table, id).
struct Segments {
  std::vector<std::int64_t> order;    // [nnz] occurrence indices; CSR order within a segment
  std::vector<std::int64_t> example;  // [nnz] example (bag within its table) of occurrence j
  std::vector<std::int64_t> start;    // [U + 1] segment u is order[start[u] .. start[u + 1])
  std::vector<int> table;             // [U]
};

Segments segment_occurrences(const SparseInput& in) {
  const std::int64_t batch = in.batch;
  const std::int64_t bags = batch * in.num_tables;
  const std::int64_t nnz = in.offsets[bags];
  Segments s;
  s.example.resize(static_cast<std::size_t>(nnz));
  s.order.resize(static_cast<std::size_t>(nnz));

#pragma omp parallel for schedule(static) if (nnz >= detail::kParallelElements)
  for (std::int64_t bag = 0; bag < bags; ++bag) {
    for (std::int64_t j = in.offsets[bag]; j < in.offsets[bag + 1]; ++j) s.example[j] = bag % batch;
  }

  // Sorting (id, occurrence) pairs is a stable sort by id: the order is fixed by the input alone.
#pragma omp parallel for schedule(dynamic) if (nnz >= detail::kParallelElements)
  for (int t = 0; t < in.num_tables; ++t) {
    const std::int64_t lo = in.offsets[t * batch];
    const std::int64_t hi = in.offsets[(t + 1) * batch];
    std::vector<std::pair<std::int64_t, std::int64_t>> keys;  // [hi - lo] (id, occurrence)
    keys.reserve(static_cast<std::size_t>(hi - lo));
    for (std::int64_t j = lo; j < hi; ++j) keys.emplace_back(in.ids[j], j);
    std::sort(keys.begin(), keys.end());
    for (std::int64_t p = lo; p < hi; ++p) s.order[p] = keys[p - lo].second;
  }

  for (int t = 0; t < in.num_tables; ++t) {
    const std::int64_t lo = in.offsets[t * batch];
    const std::int64_t hi = in.offsets[(t + 1) * batch];
    for (std::int64_t p = lo; p < hi; ++p) {
      if (p == lo || in.ids[s.order[p]] != in.ids[s.order[p - 1]]) {
        s.start.push_back(p);
        s.table.push_back(t);
      }
    }
  }
  s.start.push_back(nnz);
  return s;
}

// g [dim] = the gradient of the row of segment u (see EmbeddingGradient), in double.
template <class T>
void row_gradient(const Segments& s, std::size_t u, std::span<const TableLayout> tables,
                  const SparseInput& in, MatView<const T> dout, double* g) {
  const int t = s.table[u];
  const TableLayout& tl = tables[t];
  const int dim = tl.dim;
  std::fill(g, g + dim, 0.0);
  for (std::int64_t p = s.start[u]; p < s.start[u + 1]; ++p) {
    const std::int64_t j = s.order[p];
    const std::int64_t b = s.example[j];
    const T* src = dout.row(b) + tl.out_col;  // [dim]
    if (tl.pooling == Pooling::mean) {
      const std::int64_t bag = t * in.batch + b;
      const double count = static_cast<double>(in.offsets[bag + 1] - in.offsets[bag]);
      for (int d = 0; d < dim; ++d) g[d] += static_cast<double>(src[d]) / count;
    } else {
      for (int d = 0; d < dim; ++d) g[d] += static_cast<double>(src[d]);
    }
  }
}

}  // namespace

template <class T>
void embedding_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                       const SparseInput& in, MatView<T> out) {
  constexpr const char* op = "embedding_forward";
  detail::check_view(op, "out", out);
  validate_sparse_input(op, tables, in, out.rows, out.cols);
  check_weights(op, tables, weights);
  const std::int64_t batch = in.batch;
  const std::int64_t dim_max = max_dim(tables);
  std::int64_t width = 0;
  for (const TableLayout& tl : tables) width += tl.dim;

#pragma omp parallel if (batch * width >= detail::kParallelElements)
  {
    std::vector<double> acc(static_cast<std::size_t>(dim_max));  // [dim]
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < batch; ++b) {
      for (int t = 0; t < in.num_tables; ++t) {
        const TableLayout& tl = tables[t];
        const TableRows<T> w(weights, tl);
        const int dim = tl.dim;
        const std::int64_t lo = in.offsets[t * batch + b];
        const std::int64_t hi = in.offsets[t * batch + b + 1];
        std::fill(acc.begin(), acc.begin() + dim, 0.0);
        for (std::int64_t j = lo; j < hi; ++j) {
          const auto row = w.at(in.ids[j], nullptr);
          for (int d = 0; d < dim; ++d) acc[d] += w.get(row, d);
        }
        T* dst = out.row(b) + tl.out_col;  // [dim]
        if (tl.pooling == Pooling::mean && hi > lo) {
          const double count = static_cast<double>(hi - lo);
          for (int d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[d] / count);
        } else {
          for (int d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[d]);
        }
      }
    }
  }
}

template <class T>
void embedding_sum_forward(std::span<const TableLayout> tables, const TableWeights& weights,
                           const SparseInput& in, MatView<T> out) {
  constexpr const char* op = "embedding_sum_forward";
  detail::check_view(op, "out", out);
  for (std::size_t t = 0; t < tables.size(); ++t)
    if (tables[t].dim != out.cols)
      fail(op, "table {} has dim {}, and the summed output has {} columns", t, tables[t].dim,
           out.cols);
  // out_col is not used: every table adds into the same columns.
  std::vector<TableLayout> at_zero(tables.begin(), tables.end());
  for (TableLayout& tl : at_zero) tl.out_col = 0;
  validate_sparse_input(op, at_zero, in, out.rows, out.cols);
  check_weights(op, at_zero, weights);
  const std::int64_t batch = in.batch;
  const int dim = static_cast<int>(out.cols);
#pragma omp parallel if (batch * dim * in.num_tables >= detail::kParallelElements)
  {
    std::vector<double> acc(static_cast<std::size_t>(dim));  // [dim]
    std::vector<double> bag(static_cast<std::size_t>(dim));  // [dim]
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < batch; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < in.num_tables; ++t) {
        const TableLayout& tl = at_zero[t];
        const TableRows<T> w(weights, tl);
        const std::int64_t lo = in.offsets[t * batch + b];
        const std::int64_t hi = in.offsets[t * batch + b + 1];
        std::fill(bag.begin(), bag.end(), 0.0);
        for (std::int64_t j = lo; j < hi; ++j) {
          const auto row = w.at(in.ids[j], nullptr);
          for (int d = 0; d < dim; ++d) bag[d] += w.get(row, d);
        }
        const double count =
            tl.pooling == Pooling::mean && hi > lo ? static_cast<double>(hi - lo) : 1.0;
        for (int d = 0; d < dim; ++d) acc[d] += bag[d] / count;
      }
      T* dst = out.row(b);  // [dim]
      for (int d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[d]);
    }
  }
}

template <class T>
EmbeddingGradient embedding_gradient(std::span<const TableLayout> tables, const SparseInput& in,
                                     MatView<const T> dout) {
  constexpr const char* op = "embedding_gradient";
  detail::check_view(op, "dout", dout);
  validate_sparse_input(op, tables, in, dout.rows, dout.cols);
  const Segments s = segment_occurrences(in);
  const std::size_t segments = s.table.size();

  EmbeddingGradient g;
  g.table = s.table;
  g.row.resize(segments);
  g.offset.resize(segments + 1);
  g.offset[0] = 0;
  for (std::size_t u = 0; u < segments; ++u) {
    g.row[u] = in.ids[s.order[s.start[u]]];
    g.offset[u + 1] = g.offset[u] + tables[s.table[u]].dim;
  }
  g.grad.resize(static_cast<std::size_t>(g.offset[segments]));
#pragma omp parallel for schedule(static) if (g.offset[segments] >= detail::kParallelElements)
  for (std::size_t u = 0; u < segments; ++u) {
    row_gradient(s, u, tables, in, dout, g.grad.data() + g.offset[u]);
  }
  return g;
}

template <class T>
void embedding_backward_update(std::span<const TableLayout> tables, const TableWeights& weights,
                               T* state, const SparseInput& in, MatView<const T> dout,
                               const OptimizerParams& opt, const StochasticRounding& rounding) {
  constexpr const char* op = "embedding_backward_update";
  detail::check_view(op, "dout", dout);
  validate_sparse_input(op, tables, in, dout.rows, dout.cols);
  const OptimizerKind kind = opt.kind;
  if (kind == OptimizerKind::adam) {
    fail(op, "adam is not an embedding optimizer (use sgd, adagrad or rowwise_adagrad)");
  }
  const std::int64_t nnz = in.offsets[in.batch * in.num_tables];
  if (nnz == 0) return;
  check_weights(op, tables, weights);
  if (kind != OptimizerKind::sgd && state == nullptr) {
    fail(op, "{} needs optimizer state, and state is null",
         kind == OptimizerKind::adagrad ? "adagrad" : "rowwise_adagrad");
  }

  const Segments s = segment_occurrences(in);
  const std::int64_t segments = static_cast<std::int64_t>(s.table.size());
  const double lr = opt.lr;
  const double eps = opt.eps;
  const double wd = opt.weight_decay;
  const std::int64_t dim_max = max_dim(tables);
  const std::uint64_t step_key = rng::key(rounding.seed, rounding.step);

#pragma omp parallel if (nnz * dim_max >= detail::kParallelElements)
  {
    std::vector<double> g(static_cast<std::size_t>(dim_max));  // [dim]
    std::vector<double> w(static_cast<std::size_t>(dim_max));  // [dim] the row, then its update
#pragma omp for schedule(static)
    for (std::int64_t u = 0; u < segments; ++u) {
      const int t = s.table[u];
      const TableLayout& tl = tables[t];
      TableRows<T> rows(weights, tl);
      const int dim = tl.dim;
      rows.set_state_stride(kind == OptimizerKind::adagrad ? dim : 1);
      const std::int64_t row = in.ids[s.order[s.start[u]]];
      const auto at = rows.at(row, state);
      row_gradient(s, static_cast<std::size_t>(u), tables, in, dout, g.data());
      for (int d = 0; d < dim; ++d) w[d] = rows.get(at, d);
      if (wd != 0.0) {
        for (int d = 0; d < dim; ++d) g[d] += wd * w[d];
      }
      switch (kind) {
        case OptimizerKind::sgd:
          for (int d = 0; d < dim; ++d) w[d] -= lr * g[d];
          break;
        case OptimizerKind::adagrad: {
          T* st = at.state_base + at.state;  // [dim]
          for (int d = 0; d < dim; ++d) {
            const double sum = static_cast<double>(st[d]) + g[d] * g[d];
            st[d] = static_cast<T>(sum);
            w[d] -= lr * g[d] / (std::sqrt(sum) + eps);
          }
          break;
        }
        case OptimizerKind::rowwise_adagrad: {
          double squares = 0.0;
          for (int d = 0; d < dim; ++d) squares += g[d] * g[d];
          T* st = at.state_base + at.state;  // [1]
          const double sum = static_cast<double>(*st) + squares / dim;
          *st = static_cast<T>(sum);
          const double denom = std::sqrt(sum) + eps;
          for (int d = 0; d < dim; ++d) w[d] -= lr * g[d] / denom;
          break;
        }
        case OptimizerKind::adam:
          break;  // rejected above
      }
      const std::uint64_t row_key = rng::row_key(
          step_key, static_cast<std::uint64_t>(tl.round_table >= 0 ? tl.round_table : t),
          static_cast<std::uint64_t>(row + tl.round_row));
      for (int d = 0; d < dim; ++d) rows.set(at, d, w[d], row_key);
    }
  }
}

void embedding_cache_observe(std::span<const TableLayout> tables, const SparseInput& in,
                             std::span<std::uint32_t* const> counts, std::uint64_t* stats) {
  constexpr const char* op = "embedding_cache_observe";
  if (in.num_tables != static_cast<std::int64_t>(tables.size()))
    fail(op, "the sparse input has {} tables, the layout has {}", in.num_tables, tables.size());
  if (!counts.empty() && counts.size() != tables.size())
    fail(op, "{} count arrays for {} tables", counts.size(), tables.size());
  for (int t = 0; t < in.num_tables; ++t) {
    const TableLayout& tl = tables[t];
    if (!tl.host_placed()) continue;
    std::uint32_t* c = counts.empty() ? nullptr : counts[t];
    std::uint64_t hits = 0, lookups = 0;
    // Offsets outside [0, nnz] or decreasing are the embedding ops' to report: none read here.
    const std::int64_t nnz = in.offsets[in.batch * in.num_tables];
    const std::int64_t lo = std::clamp<std::int64_t>(in.offsets[t * in.batch], 0, nnz);
    const std::int64_t hi = std::clamp<std::int64_t>(in.offsets[(t + 1) * in.batch], lo, nnz);
    for (std::int64_t j = lo; j < hi; ++j) {
      const std::int64_t id = in.ids[j];
      if (id < 0 || id >= tl.rows) continue;  // the embedding ops report it
      ++lookups;
      hits += tl.host.slot[id] != TableLayout::kNotCached;
      if (c != nullptr && c[id] != 0xffffffffu) ++c[id];
    }
    stats[2 * t] += hits;
    stats[2 * t + 1] += lookups;
  }
}

void embedding_cache_copy(const TableLayout& tl, const TableWeights& weights, float* state,
                          OptimizerKind opt, bool to_cache) {
  constexpr const char* op = "embedding_cache_copy";
  if (!tl.host_placed()) fail(op, "the table is not host-placed (TableLayout::host)");
  const auto row_bytes = static_cast<std::int64_t>(tl.dim * dtype_size(tl.dtype));
  const std::int64_t state_per_row = cache_state_per_row(opt, tl.dim);
  if (state_per_row > 0 && (state == nullptr || tl.host.state == nullptr))
    fail(op, "{} keeps state per row, and the state is null", optimizer_name(opt));
  auto* cache = static_cast<std::byte*>(weights.of(tl.dtype));
  if (cache == nullptr && tl.host.cache_rows > 0) fail(op, "the weight buffer is null");
  if (cache != nullptr) cache += tl.weight_offset * static_cast<std::int64_t>(dtype_size(tl.dtype));
  auto* host = static_cast<std::byte*>(tl.host.weights);
#pragma omp parallel for schedule(static) if (tl.host.cache_rows >= 4096)
  for (std::int64_t i = 0; i < tl.host.cache_rows; ++i) {
    const std::int64_t r = tl.host.cached[i];
    if (r < 0 || r >= tl.rows) continue;
    std::byte* c = cache + i * row_bytes;
    std::byte* h = host + r * row_bytes;
    float* cs = state_per_row > 0 ? state + tl.state_offset + i * state_per_row : nullptr;
    float* hs = state_per_row > 0 ? tl.host.state + r * state_per_row : nullptr;
    if (to_cache) {
      std::copy(h, h + row_bytes, c);
      std::copy(hs, hs + state_per_row, cs);
    } else {
      std::copy(c, c + row_bytes, h);
      std::copy(cs, cs + state_per_row, hs);
    }
  }
}

#define PARITY_INSTANTIATE(T)                                                                   \
  template void embedding_forward<T>(std::span<const TableLayout>, const TableWeights&,         \
                                     const SparseInput&, MatView<T>);                           \
  template void embedding_sum_forward<T>(std::span<const TableLayout>, const TableWeights&,     \
                                         const SparseInput&, MatView<T>);                       \
  template EmbeddingGradient embedding_gradient<T>(std::span<const TableLayout>,                \
                                                   const SparseInput&, MatView<const T>);       \
  template void embedding_backward_update<T>(std::span<const TableLayout>, const TableWeights&, \
                                             T*, const SparseInput&, MatView<const T>,          \
                                             const OptimizerParams&, const StochasticRounding&);
PARITY_INSTANTIATE(float)
PARITY_INSTANTIATE(double)
#undef PARITY_INSTANTIATE

}  // namespace parity::cpu
