// The sharded embedding tables of one rank (sharded_embedding.h says how and why).
#include "dist/sharded_embedding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace parity {
namespace {

template <class T>
void put(std::vector<std::byte>& buf, const T* p, std::size_t n) {
  const auto* b = reinterpret_cast<const std::byte*>(p);
  buf.insert(buf.end(), b, b + n * sizeof(T));
}
template <class T>
void put(std::vector<std::byte>& buf, T v) {
  put(buf, &v, 1);
}

// Reads values of T from a received block, in order.
class Reader {
 public:
  explicit Reader(const std::vector<std::byte>& b) : b_(b) {}
  template <class T>
  T get() {
    T v;
    read(&v, 1);
    return v;
  }
  template <class T>
  void read(T* out, std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (at_ + bytes > b_.size())
      throw Error("ShardedEmbedding: a received block is shorter than its contents say");
    std::memcpy(out, b_.data() + at_, bytes);
    at_ += bytes;
  }

 private:
  const std::vector<std::byte>& b_;
  std::size_t at_ = 0;
};

}  // namespace

ShardedEmbedding::ShardedEmbedding(const ModelSpec& m, const Plan& plan, Communicator& comm,
                                   Backend& backend)
    : m_(m), comm_(comm), backend_(backend), optimizer_(plan.embedding_optimizer) {
  if (plan.gpus != comm.size())
    throw InputError(
        fmt::format("the plan is for {} GPUs and this run has {} ranks", plan.gpus, comm.size()));
  (void)apply_plan(m, plan);  // the tables match the model; shards are well formed
  std::int64_t col = 0;
  for (int t = 0; t < m.num_tables(); ++t) {
    const TablePlan& tp = plan.tables[static_cast<std::size_t>(t)];
    if (tp.dtype != DType::f32 || tp.placement != Placement::hbm)
      throw InputError(fmt::format(
          "plan table '{}': the sharded tables are fp32 and in device memory so far", tp.name));
    out_col_.push_back(col);
    const TableSpec& ts = m.tables[static_cast<std::size_t>(t)];
    col += ts.dim;
    // Each shard of the shape its table's sharding names (apply_plan checked the covering): a
    // row shard every column, a column shard every row, a table or replicated shard the whole
    // table. Mean bags are divided where rows are split, and only there.
    for (const ShardPlan& s : tp.shards) {
      const bool all_rows = s.row_begin == 0 && s.row_end == ts.rows;
      const bool all_cols = s.col_begin == 0 && s.col_end == ts.dim;
      const bool ok = tp.sharding == Sharding::row      ? all_cols
                      : tp.sharding == Sharding::column ? all_rows
                                                        : all_rows && all_cols;
      if (!ok)
        throw InputError(fmt::format(
            "plan table '{}': a {}-sharded table's shard holding rows [{}, {}) and columns [{}, "
            "{}) is not of that sharding's shape",
            tp.name, sharding_name(tp.sharding), s.row_begin, s.row_end, s.col_begin, s.col_end));
    }
    for (std::size_t j = 0; j < tp.shards.size(); ++j) {
      const ShardPlan& s = tp.shards[j];
      const bool replicated = tp.sharding == Sharding::replicated;
      if (!replicated) routes_.push_back({t, static_cast<int>(j), s});
      if (s.device != comm.rank()) continue;
      Shard sh;
      sh.table = t;
      sh.index = static_cast<int>(j);
      sh.where = s;
      sh.replicated = replicated;
      const std::int64_t rows = s.row_end - s.row_begin;
      const int cols = s.col_end - s.col_begin;
      sh.weights.assign(static_cast<std::size_t>(rows * cols), 0.0f);
      sh.state.assign(static_cast<std::size_t>(rows * cache_state_per_row(optimizer_, cols)), 0.0f);
      mine_.push_back(std::move(sh));
    }
  }
}

void ShardedEmbedding::fill(const std::function<float(int, std::int64_t, int)>& init) {
  for (Shard& s : mine_) {
    const int cols = s.where.col_end - s.where.col_begin;
    for (std::int64_t r = s.where.row_begin; r < s.where.row_end; ++r)
      for (int c = 0; c < cols; ++c)
        s.weights[static_cast<std::size_t>((r - s.where.row_begin) * cols + c)] =
            init(s.table, r, s.where.col_begin + c);
    std::fill(s.state.begin(), s.state.end(), 0.0f);
  }
}

TableLayout ShardedEmbedding::layout_of(const Shard& s) const {
  TableLayout l;
  l.rows = s.where.row_end - s.where.row_begin;
  l.dim = s.where.col_end - s.where.col_begin;
  const TableSpec& ts = m_.tables[static_cast<std::size_t>(s.table)];
  // A row shard's owner returns partial sums; a mean bag is divided by its whole size on the
  // requester.
  const bool row_split = l.rows != ts.rows && !s.replicated;
  l.pooling = row_split ? Pooling::sum : ts.pooling;
  l.ids_per_bag = ts.pooling_size;
  return l;
}

void ShardedEmbedding::exchange(const std::vector<std::vector<std::byte>>& out,
                                std::vector<std::vector<std::byte>>& in) {
  const auto P = static_cast<std::size_t>(comm_.size());
  std::vector<std::int64_t> send_sizes(P), recv_sizes(P), eight(P, 8);
  for (std::size_t q = 0; q < P; ++q) send_sizes[q] = static_cast<std::int64_t>(out[q].size());
  comm_.all_to_all_v(std::as_bytes(std::span<const std::int64_t>(send_sizes)), eight,
                     std::as_writable_bytes(std::span<std::int64_t>(recv_sizes)), eight);
  // One exchange carries blocks below 2^31 bytes (MPI's int counts); every rank learns whether
  // any rank's would not, so that all refuse together instead of some waiting for the rest.
  std::int64_t total_out = 0, total_in = 0;
  for (std::size_t q = 0; q < P; ++q) {
    total_out += send_sizes[q];
    total_in += recv_sizes[q];
  }
  double over = std::max(total_out, total_in) >= std::int64_t{1} << 31 ? 1.0 : 0.0;
  comm_.all_reduce_sum(std::span<double>(&over, 1));
  if (over > 0)
    throw Error(fmt::format(
        "ShardedEmbedding: an exchange of {} ranks reaches 2^31 bytes on {} of them (this rank "
        "sends {} and receives {}): use a smaller batch per rank",
        P, static_cast<int>(over), total_out, total_in));
  std::vector<std::byte> send, recv;
  for (const auto& b : out) send.insert(send.end(), b.begin(), b.end());
  std::int64_t total = 0;
  for (const std::int64_t n : recv_sizes) total += n;
  recv.resize(static_cast<std::size_t>(total));
  comm_.all_to_all_v(send, send_sizes, recv, recv_sizes);
  in.assign(P, {});
  std::size_t at = 0;
  for (std::size_t q = 0; q < P; ++q) {
    in[q].assign(
        recv.begin() + static_cast<std::ptrdiff_t>(at),
        recv.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(recv_sizes[q])));
    at += static_cast<std::size_t>(recv_sizes[q]);
  }
}

void ShardedEmbedding::forward(const SparseInput& in, Mat out) {
  const int T = m_.num_tables();
  const auto P = static_cast<std::size_t>(comm_.size());
  if (in.num_tables != T || out.rows != in.batch ||
      out.cols != out_col_.back() + m_.tables.back().dim)
    throw Error(fmt::format(
        "ShardedEmbedding::forward: {} tables of {} bags into [{}, {}]; the "
        "model has {} tables and {} output columns",
        in.num_tables, in.batch, out.rows, out.cols, T, out_col_.back() + m_.tables.back().dim));
  const std::int64_t b = in.batch;
  batch_ = b;
  local_offsets_.assign(in.offsets, in.offsets + T * b + 1);
  local_ids_.assign(in.ids, in.ids + local_offsets_.back());
  auto bag = [&](int t, std::int64_t i) {
    const std::int64_t k = t * b + i;
    return std::pair{local_offsets_[static_cast<std::size_t>(k)],
                     local_offsets_[static_cast<std::size_t>(k + 1)]};
  };
  // ---- the ids to each shard's owner: per route, the bag count, each bag's size, the ids ----
  mark("embedding_exchange");
  std::vector<std::vector<std::byte>> ids_out(P), ids_in;
  for (const Route& r : routes_) {
    auto& buf = ids_out[static_cast<std::size_t>(r.where.device)];
    put(buf, b);
    std::vector<std::int64_t> sizes, ids;
    for (std::int64_t i = 0; i < b; ++i) {
      const auto [lo, hi] = bag(r.table, i);
      std::int64_t n = 0;
      for (std::int64_t k = lo; k < hi; ++k) {
        const std::int64_t id = local_ids_[static_cast<std::size_t>(k)];
        if (id < r.where.row_begin || id >= r.where.row_end) continue;
        ids.push_back(id - r.where.row_begin);
        ++n;
      }
      sizes.push_back(n);
    }
    put(buf, sizes.data(), sizes.size());
    put(buf, ids.data(), ids.size());
  }
  exchange(ids_out, ids_in);
  // ---- each owned shard looks up every rank's bags at once, in rank order ----
  mark("embedding_forward");
  std::vector<Reader> readers;
  for (const auto& blk : ids_in) readers.emplace_back(blk);
  std::vector<std::vector<std::byte>> rows_out(P), rows_in;
  for (Shard& s : mine_) {
    if (s.replicated) continue;
    s.offsets.assign(1, 0);
    s.ids.clear();
    s.bags_from.assign(P, 0);
    for (std::size_t q = 0; q < P; ++q) {
      const auto n = readers[q].get<std::int64_t>();
      s.bags_from[q] = n;
      std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
      readers[q].read(sizes.data(), sizes.size());
      std::int64_t total = 0;
      for (const std::int64_t z : sizes) {
        total += z;
        s.offsets.push_back(s.offsets.back() + z);
      }
      const std::size_t at = s.ids.size();
      s.ids.resize(at + static_cast<std::size_t>(total));
      readers[q].read(s.ids.data() + at, static_cast<std::size_t>(total));
    }
    const std::int64_t G = static_cast<std::int64_t>(s.offsets.size()) - 1;
    const int cols = s.where.col_end - s.where.col_begin;
    std::vector<float> pooled(static_cast<std::size_t>(G * cols));
    const TableLayout l = layout_of(s);
    const SparseInput sin{G, 1, s.ids.data(), s.offsets.data(),
                          static_cast<std::int64_t>(s.ids.size())};
    backend_.embedding_forward(std::span<const TableLayout>(&l, 1),
                               TableWeights::all(DType::f32, s.weights.data()), sin,
                               Mat(pooled.data(), G, cols));
    std::int64_t first = 0;
    for (std::size_t q = 0; q < P; ++q) {
      put(rows_out[q], pooled.data() + first * cols,
          static_cast<std::size_t>(s.bags_from[q] * cols));
      first += s.bags_from[q];
    }
  }
  mark("embedding_exchange");
  exchange(rows_out, rows_in);
  mark("embedding_forward");
  // ---- the pooled rows back into this rank's output: columns placed, row partials added ----
  for (int t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < b; ++i)
      std::fill_n(out.data + i * out.ld + out_col_[static_cast<std::size_t>(t)],
                  m_.tables[static_cast<std::size_t>(t)].dim, 0.0f);
  readers.clear();
  for (const auto& blk : rows_in) readers.emplace_back(blk);
  std::vector<float> part;
  for (const Route& r : routes_) {
    const int cols = r.where.col_end - r.where.col_begin;
    part.resize(static_cast<std::size_t>(b * cols));
    readers[static_cast<std::size_t>(r.where.device)].read(part.data(), part.size());
    const std::int64_t c0 = out_col_[static_cast<std::size_t>(r.table)] + r.where.col_begin;
    for (std::int64_t i = 0; i < b; ++i)
      for (int c = 0; c < cols; ++c)
        out.data[i * out.ld + c0 + c] += part[static_cast<std::size_t>(i * cols + c)];
  }
  // Mean bags of row-split tables: the summed partials over the whole bag's size.
  for (int t = 0; t < T; ++t) {
    const TableSpec& ts = m_.tables[static_cast<std::size_t>(t)];
    bool split = false;
    for (const Route& r : routes_)
      split |= r.table == t && r.where.row_end - r.where.row_begin != ts.rows;
    if (!split || ts.pooling != Pooling::mean) continue;
    for (std::int64_t i = 0; i < b; ++i) {
      const auto [lo, hi] = bag(t, i);
      if (hi == lo) continue;
      const float inv = 1.0f / static_cast<float>(hi - lo);
      for (int c = 0; c < ts.dim; ++c)
        out.data[i * out.ld + out_col_[static_cast<std::size_t>(t)] + c] *= inv;
    }
  }
  // Replicated tables: this rank's bags, looked up here.
  for (Shard& s : mine_) {
    if (!s.replicated) continue;
    TableLayout l = layout_of(s);
    l.out_col = out_col_[static_cast<std::size_t>(s.table)];
    const std::int64_t k0 = s.table * b;
    std::vector<std::int64_t> offsets(local_offsets_.begin() + k0,
                                      local_offsets_.begin() + k0 + b + 1);
    const std::int64_t base = offsets.front();
    for (std::int64_t& o : offsets) o -= base;
    const SparseInput sin{b, 1, local_ids_.data() + base, offsets.data(), offsets.back()};
    backend_.embedding_forward(std::span<const TableLayout>(&l, 1),
                               TableWeights::all(DType::f32, s.weights.data()), sin, out);
  }
}

void ShardedEmbedding::backward_update(CMat dout, const OptimizerParams& opt) {
  const auto P = static_cast<std::size_t>(comm_.size());
  const std::int64_t b = batch_;
  if (dout.rows != b)
    throw Error(
        fmt::format("ShardedEmbedding::backward_update: {} rows of gradient for the last "
                    "forward's {} bags",
                    dout.rows, b));
  auto bag_size = [&](int t, std::int64_t i) {
    const std::int64_t k = t * b + i;
    return local_offsets_[static_cast<std::size_t>(k + 1)] -
           local_offsets_[static_cast<std::size_t>(k)];
  };
  // ---- each route's gradient columns to its owner (a row shard: the whole row, a mean bag's
  // divided by its whole size) ----
  mark("embedding_exchange");
  std::vector<std::vector<std::byte>> grads_out(P), grads_in;
  std::vector<float> g;
  for (const Route& r : routes_) {
    const TableSpec& ts = m_.tables[static_cast<std::size_t>(r.table)];
    const int cols = r.where.col_end - r.where.col_begin;
    const bool mean_split =
        ts.pooling == Pooling::mean && r.where.row_end - r.where.row_begin != ts.rows;
    g.resize(static_cast<std::size_t>(b * cols));
    const std::int64_t c0 = out_col_[static_cast<std::size_t>(r.table)] + r.where.col_begin;
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int64_t n = bag_size(r.table, i);
      const float scale = mean_split && n > 0 ? 1.0f / static_cast<float>(n) : 1.0f;
      for (int c = 0; c < cols; ++c)
        g[static_cast<std::size_t>(i * cols + c)] = dout.data[i * dout.ld + c0 + c] * scale;
    }
    put(grads_out[static_cast<std::size_t>(r.where.device)], g.data(), g.size());
  }
  // Replicated tables: this rank's bags and their gradients to every rank.
  std::vector<std::byte> replicated;
  for (const Shard& s : mine_) {
    if (!s.replicated) continue;
    const int D = m_.tables[static_cast<std::size_t>(s.table)].dim;
    put(replicated, b);
    for (std::int64_t i = 0; i < b; ++i) put(replicated, bag_size(s.table, i));
    const std::int64_t lo = local_offsets_[static_cast<std::size_t>(s.table * b)];
    const std::int64_t hi = local_offsets_[static_cast<std::size_t>(s.table * b + b)];
    put(replicated, local_ids_.data() + lo, static_cast<std::size_t>(hi - lo));
    for (std::int64_t i = 0; i < b; ++i)
      put(replicated, dout.data + i * dout.ld + out_col_[static_cast<std::size_t>(s.table)],
          static_cast<std::size_t>(D));
  }
  for (auto& buf : grads_out) buf.insert(buf.end(), replicated.begin(), replicated.end());
  exchange(grads_out, grads_in);
  mark("embedding_backward");
  std::vector<Reader> readers;
  for (const auto& blk : grads_in) readers.emplace_back(blk);
  const StochasticRounding rounding{};  // fp32 tables: no rounding
  for (Shard& s : mine_) {
    if (s.replicated) continue;
    const int cols = s.where.col_end - s.where.col_begin;
    const std::int64_t G = static_cast<std::int64_t>(s.offsets.size()) - 1;
    std::vector<float> grads(static_cast<std::size_t>(G * cols));
    std::int64_t first = 0;
    for (std::size_t q = 0; q < P; ++q) {
      readers[q].read(grads.data() + first * cols, static_cast<std::size_t>(s.bags_from[q] * cols));
      first += s.bags_from[q];
    }
    const TableLayout l = layout_of(s);
    const SparseInput sin{G, 1, s.ids.data(), s.offsets.data(),
                          static_cast<std::int64_t>(s.ids.size())};
    backend_.embedding_backward_update(
        std::span<const TableLayout>(&l, 1), TableWeights::all(DType::f32, s.weights.data()),
        s.state.data(), sin, CMat(grads.data(), G, cols), opt, rounding);
  }
  // Replicated: every rank's bags in rank order, the same fused update on every replica.
  for (Shard& s : mine_) {
    if (!s.replicated) continue;
    const int D = s.where.col_end - s.where.col_begin;
    std::vector<std::int64_t> offsets{0}, ids;
    std::vector<float> grads;
    for (std::size_t q = 0; q < P; ++q) {
      const auto n = readers[q].get<std::int64_t>();
      std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
      readers[q].read(sizes.data(), sizes.size());
      std::int64_t total = 0;
      for (const std::int64_t z : sizes) {
        total += z;
        offsets.push_back(offsets.back() + z);
      }
      const std::size_t at = ids.size();
      ids.resize(at + static_cast<std::size_t>(total));
      readers[q].read(ids.data() + at, static_cast<std::size_t>(total));
      const std::size_t gat = grads.size();
      grads.resize(gat + static_cast<std::size_t>(n * D));
      readers[q].read(grads.data() + gat, static_cast<std::size_t>(n * D));
    }
    const std::int64_t G = static_cast<std::int64_t>(offsets.size()) - 1;
    const TableLayout l = layout_of(s);
    const SparseInput sin{G, 1, ids.data(), offsets.data(), static_cast<std::int64_t>(ids.size())};
    backend_.embedding_backward_update(
        std::span<const TableLayout>(&l, 1), TableWeights::all(DType::f32, s.weights.data()),
        s.state.data(), sin, CMat(grads.data(), G, D), opt, rounding);
  }
}

std::vector<ShardedEmbedding::View> ShardedEmbedding::shards() {
  std::vector<View> out;
  for (Shard& s : mine_)
    out.push_back({s.table, s.where, s.replicated, !s.replicated || s.index == 0, s.weights.data(),
                   s.state.empty() ? nullptr : s.state.data()});
  return out;
}

std::size_t ShardedEmbedding::weight_bytes() const {
  std::size_t n = 0;
  for (const Shard& s : mine_) n += s.weights.size() * sizeof(float);
  return n;
}
std::size_t ShardedEmbedding::state_bytes() const {
  std::size_t n = 0;
  for (const Shard& s : mine_) n += s.state.size() * sizeof(float);
  return n;
}

std::optional<float> ShardedEmbedding::weight(int t, std::int64_t row, int col) const {
  for (const Shard& s : mine_)
    if (s.table == t && row >= s.where.row_begin && row < s.where.row_end &&
        col >= s.where.col_begin && col < s.where.col_end) {
      const int cols = s.where.col_end - s.where.col_begin;
      return s.weights[static_cast<std::size_t>((row - s.where.row_begin) * cols + col -
                                                s.where.col_begin)];
    }
  return std::nullopt;
}

}  // namespace parity
