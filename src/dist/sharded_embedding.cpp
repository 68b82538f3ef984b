// The sharded embedding tables of one rank (sharded_embedding.h says how and why).
#include "dist/sharded_embedding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "parity/dtype.h"
#include "parity/engine.h"

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
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
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
  std::span<const std::byte> b_;
  std::size_t at_ = 0;
};

// The DLRM constructor's checks: the plan is for this many ranks and covers the model's tables.
std::vector<TableSpec> checked_tables(const ModelSpec& m, const Plan& plan,
                                      const Communicator& comm) {
  if (plan.gpus != comm.size())
    throw InputError(
        fmt::format("the plan is for {} GPUs and this run has {} ranks", plan.gpus, comm.size()));
  (void)apply_plan(m, plan);  // the tables match the model; shards are well formed
  return m.tables;
}

}  // namespace

bool ShardedEmbedding::every_table_whole(const Plan& plan, const Communicator& comm) {
  return comm.size() == 1 && std::all_of(plan.tables.begin(), plan.tables.end(),
                                         [](const TablePlan& tp) { return tp.shards.size() == 1; });
}

ShardedEmbedding::ShardedEmbedding(const ModelSpec& m, const Plan& plan, Communicator& comm,
                                   Backend& backend)
    : ShardedEmbedding(checked_tables(m, plan, comm), plan.tables, plan.embedding_optimizer, comm,
                       backend) {}

ShardedEmbedding::ShardedEmbedding(std::vector<TableSpec> tables, std::vector<TablePlan> plans,
                                   OptimizerKind optimizer, Communicator& comm, Backend& backend)
    : tables_(std::move(tables)),
      comm_(comm),
      backend_(backend),
      coll_(comm, backend),
      optimizer_(optimizer) {
  if (plans.size() != tables_.size())
    throw Error(fmt::format("ShardedEmbedding: {} table plans for {} tables", plans.size(),
                            tables_.size()));
  const int T = static_cast<int>(tables_.size());
  owner_width_.assign(static_cast<std::size_t>(comm.size()), 0);
  compactable_.assign(static_cast<std::size_t>(comm.size()), 1);
  std::int64_t col = 0;
  for (int t = 0; t < T; ++t) {
    table_routes_.push_back(static_cast<std::int64_t>(routes_.size()));
    const TablePlan& tp = plans[static_cast<std::size_t>(t)];
    if (tp.placement != Placement::hbm)
      throw InputError(
          fmt::format("plan table '{}': the sharded tables are in device memory so far", tp.name));
    if (!is_table_dtype(tp.dtype))
      throw InputError(fmt::format("plan table '{}' is {}; tables are fp32, fp16 or bf16", tp.name,
                                   dtype_name(tp.dtype)));
    out_col_.push_back(col);
    const TableSpec& ts = tables_[static_cast<std::size_t>(t)];
    if (tp.name != ts.name)
      throw InputError(
          fmt::format("plan table {} is '{}', the model's is '{}'", t, tp.name, ts.name));
    col += ts.dim;
    // Each shard of the shape its table's sharding names (apply_plan checked the covering): a
    // row shard every column, a column shard every row, a table or replicated shard the whole
    // table. Mean bags are divided where rows are split, and only there.
    for (const ShardPlan& s : tp.shards) {
      if (s.device < 0 || s.device >= comm.size())
        throw InputError(
            fmt::format("plan table '{}': a shard on device {}, and this run has {} "
                        "ranks",
                        tp.name, s.device, comm.size()));
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
    const bool replicated = tp.sharding == Sharding::replicated;
    if (replicated && std::none_of(tp.shards.begin(), tp.shards.end(),
                                   [&](const ShardPlan& s) { return s.device == comm.rank(); }))
      throw InputError(fmt::format(
          "plan table '{}': replicated, and rank {} holds no replica (every rank looks its own "
          "bags up in a replicated table)",
          tp.name, comm.rank()));
    bool first_of_table = true, split = false;
    for (std::size_t j = 0; j < tp.shards.size(); ++j) {
      const ShardPlan& s = tp.shards[j];
      if (!replicated) {
        const bool row_split = s.row_end - s.row_begin != ts.rows;
        split |= row_split;
        auto& width = owner_width_[static_cast<std::size_t>(s.device)];
        routes_.push_back({t, static_cast<int>(j), s, width, row_split && !first_of_table});
        width += cols_of(s);
        first_of_table = false;
      }
      if (s.device != comm.rank() ||
          (replicated && !replicas_.empty() && replicas_.back().table == t))
        continue;  // another rank's, or a second replica here (one serves)
      Shard sh;
      sh.table = t;
      sh.index = static_cast<int>(j);
      sh.where = s;
      sh.replicated = replicated;
      sh.dtype = tp.dtype;
      const std::int64_t rows = s.row_end - s.row_begin;
      // Each piece at a 16-byte boundary of its type's buffer (the kernels' vector accesses).
      std::int64_t& n = weight_elements_[buffer_of(tp.dtype)];
      const auto per16 = static_cast<std::int64_t>(16 / dtype_size(tp.dtype));
      sh.weight_offset = n;
      sh.state_offset = state_floats_;
      n = (n + rows * cols_of(s) + per16 - 1) / per16 * per16;
      state_floats_ += rows * cache_state_per_row(optimizer_, static_cast<int>(cols_of(s)));
      (replicated ? replicas_ : owned_).push_back(sh);
    }
    if (split && ts.pooling == Pooling::mean) {
      mean_split_.push_back(t);
      for (const ShardPlan& s : tp.shards) compactable_[static_cast<std::size_t>(s.device)] = 0;
    }
  }
  table_routes_.push_back(static_cast<std::int64_t>(routes_.size()));
  for (const DType t : {DType::f32, DType::f16, DType::bf16})
    if (weight_elements_[buffer_of(t)] > 0)
      weights_[buffer_of(t)] =
          Buffer(backend, static_cast<std::size_t>(weight_elements_[buffer_of(t)]) * dtype_size(t));
  state_ = Buffer(backend, static_cast<std::size_t>(state_floats_) * sizeof(float));
  for (const Shard& s : owned_) {
    TableLayout l = layout_of(s);
    l.out_col = owned_width_;
    owned_width_ += l.dim;
    owned_layouts_.push_back(l);
  }
  for (const Shard& s : replicas_) {
    TableLayout l = layout_of(s);
    l.out_col = out_col_[static_cast<std::size_t>(s.table)];
    replica_out_layouts_.push_back(l);
    l.out_col = replica_width_;
    replica_width_ += l.dim;
    replica_block_layouts_.push_back(l);
  }
}

void ShardedEmbedding::fill(const std::function<float(int, std::int64_t, int)>& init,
                            float initial_state) {
  // Computed on the host a block of rows at a time and copied in.
  constexpr std::int64_t kBlockFloats = std::int64_t{1} << 22;
  std::vector<float> block;
  std::vector<std::uint16_t> narrow;  // a 16-bit piece's values, rounded once to nearest even
  auto fill_shard = [&](const Shard& s) {
    const std::int64_t cols = cols_of(s.where);
    if (cols == 0) return;
    const std::int64_t step = std::max<std::int64_t>(1, kBlockFloats / cols);
    for (std::int64_t r0 = s.where.row_begin; r0 < s.where.row_end; r0 += step) {
      const std::int64_t r1 = std::min(s.where.row_end, r0 + step);
      block.resize(static_cast<std::size_t>((r1 - r0) * cols));
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          block[static_cast<std::size_t>((r - r0) * cols + c)] =
              init(s.table, r, static_cast<int>(s.where.col_begin + c));
      const std::int64_t at = s.weight_offset + (r0 - s.where.row_begin) * cols;
      if (s.dtype == DType::f32) {
        backend_.copy_to_device(weights_[0].as<float>() + at, block.data(),
                                block.size() * sizeof(float));
        continue;
      }
      narrow.resize(block.size());
      for (std::size_t i = 0; i < block.size(); ++i)
        narrow[i] = s.dtype == DType::f16 ? half_bits(block[i]) : bf16_bits(block[i]);
      backend_.copy_to_device(weights_[buffer_of(s.dtype)].as<std::uint16_t>() + at, narrow.data(),
                              narrow.size() * sizeof(std::uint16_t));
    }
  };
  for (const Shard& s : owned_) fill_shard(s);
  for (const Shard& s : replicas_) fill_shard(s);
  if (state_floats_ > 0) backend_.fill(state_.as<float>(), state_floats_, initial_state);
  backend_.synchronize();
}

TableLayout ShardedEmbedding::layout_of(const Shard& s) const {
  TableLayout l;
  l.rows = s.where.row_end - s.where.row_begin;
  l.dim = static_cast<int>(cols_of(s.where));
  const TableSpec& ts = tables_[static_cast<std::size_t>(s.table)];
  // A row shard's owner returns partial sums; a mean bag is divided by its whole size on the
  // requester.
  const bool row_split = l.rows != ts.rows && !s.replicated;
  l.pooling = row_split ? Pooling::sum : ts.pooling;
  l.ids_per_bag = ts.pooling_size;
  l.weight_offset = s.weight_offset;
  l.state_offset = s.state_offset;
  l.dtype = s.dtype;
  // A 16-bit piece rounds each element as the whole table's element (StochasticRounding).
  l.round_table = s.table;
  l.round_row = s.where.row_begin;
  l.round_col = s.where.col_begin;
  return l;
}

void* ShardedEmbedding::grow(Buffer& b, std::size_t bytes) {
  if (bytes > b.bytes()) {
    b = Buffer();  // freed first: the peak is the new size, not both
    b = Buffer(backend_, bytes + bytes / 4);
  }
  return b.get();
}

const std::int64_t* ShardedEmbedding::identity(std::int64_t n) {
  if (n > index_rows_) {
    const std::int64_t rows = n + n / 4;
    std::vector<std::int64_t> v(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) v[static_cast<std::size_t>(i)] = i;
    grow(index_, v.size() * sizeof(std::int64_t));
    backend_.copy_to_device(index_.get(), v.data(), v.size() * sizeof(std::int64_t));
    index_rows_ = rows;
  }
  return index_.as<const std::int64_t>();
}

SparseInput ShardedEmbedding::upload(const std::vector<std::int64_t>& offsets,
                                     const std::vector<std::int64_t>& ids, std::int64_t batch,
                                     int tables, Buffer& d_offsets, Buffer& d_ids) {
  grow(d_offsets, offsets.size() * sizeof(std::int64_t));
  backend_.copy_to_device(d_offsets.get(), offsets.data(), offsets.size() * sizeof(std::int64_t));
  grow(d_ids, std::max<std::size_t>(1, ids.size()) * sizeof(std::int64_t));
  if (!ids.empty())
    backend_.copy_to_device(d_ids.get(), ids.data(), ids.size() * sizeof(std::int64_t));
  return SparseInput{batch, tables, d_ids.as<const std::int64_t>(),
                     d_offsets.as<const std::int64_t>(), static_cast<std::int64_t>(ids.size())};
}

void ShardedEmbedding::agree_on_size(std::int64_t out_bytes, std::int64_t in_bytes) {
  if (comm_.takes_device_memory()) return;  // NCCL counts in size_t
  double over = std::max(out_bytes, in_bytes) >= std::int64_t{1} << 31 ? 1.0 : 0.0;
  comm_.all_reduce_sum(std::span<double>(&over, 1));
  if (over > 0)
    throw Error(fmt::format(
        "ShardedEmbedding: an exchange of {} ranks reaches 2^31 bytes on {} of them (this rank "
        "sends {} and receives {}): use a smaller batch per rank",
        comm_.size(), static_cast<int>(over), out_bytes, in_bytes));
}

void ShardedEmbedding::exchange(std::span<const std::int64_t> send_bytes) {
  const auto P = static_cast<std::size_t>(comm_.size());
  std::vector<std::int64_t> recv_bytes(P), eight(P, 8);
  comm_.all_to_all_v(std::as_bytes(send_bytes), eight,
                     std::as_writable_bytes(std::span<std::int64_t>(recv_bytes)), eight);
  std::int64_t total_out = 0, total_in = 0;
  for (std::size_t q = 0; q < P; ++q) {
    total_out += send_bytes[q];
    total_in += recv_bytes[q];
  }
  agree_on_size(total_out, total_in);
  host_recv_.resize(static_cast<std::size_t>(total_in));
  comm_.all_to_all_v(
      std::span<const std::byte>(host_send_.data(), static_cast<std::size_t>(total_out)),
      send_bytes, host_recv_, recv_bytes);
  host_from_.assign(P + 1, 0);
  for (std::size_t q = 0; q < P; ++q)
    host_from_[q + 1] = host_from_[q] + static_cast<std::size_t>(recv_bytes[q]);
}

void ShardedEmbedding::route_ids(std::int64_t b) {
  const int T = static_cast<int>(tables_.size());
  std::vector<std::vector<std::byte>>& blocks = blocks_;
  blocks.resize(routes_.size());
  for (auto& block : blocks) block.clear();  // their capacity kept from step to step
  std::exception_ptr error;                  // the first table's error, raised after the loop
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < T; ++t) {
    try {
      route_table(t, b, blocks);
    } catch (...) {
#pragma omp critical(parity_route_ids)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void ShardedEmbedding::route_table(int t, std::int64_t b,
                                   std::vector<std::vector<std::byte>>& blocks) const {
  const auto r0 = static_cast<std::size_t>(table_routes_[static_cast<std::size_t>(t)]);
  const auto r1 = static_cast<std::size_t>(table_routes_[static_cast<std::size_t>(t) + 1]);
  if (r0 == r1) return;
  const std::int64_t* off = local_offsets_.data() + t * b;
  const std::int64_t lo = off[0], hi = off[b];
  const TableSpec& ts = tables_[static_cast<std::size_t>(t)];
  if (routes_[r0].where.row_end - routes_[r0].where.row_begin == ts.rows) {
    // Table or column shards: every id of every bag, to each of the table's owners.
    std::vector<std::byte>& first = blocks[r0];
    put(first, b);
    for (std::int64_t i = 0; i < b; ++i) put(first, off[i + 1] - off[i]);
    put(first, local_ids_.data() + lo, static_cast<std::size_t>(hi - lo));
    for (std::size_t r = r0 + 1; r < r1; ++r) blocks[r] = first;
    return;
  }
  // Row shards: each id to the shard whose rows hold it, relative to the shard's first row. Two
  // passes over the ids: which shard and how many each, then the blocks written in place.
  const std::size_t R = r1 - r0;
  thread_local std::vector<std::size_t> by_row;  // the routes, by first row
  thread_local std::vector<std::int64_t> starts;
  thread_local std::vector<std::uint32_t> which;  // per id: its route - r0
  thread_local std::vector<std::int64_t> total;   // per route: its ids
  by_row.resize(R);
  for (std::size_t j = 0; j < R; ++j) by_row[j] = r0 + j;
  std::sort(by_row.begin(), by_row.end(), [&](std::size_t x, std::size_t y) {
    return routes_[x].where.row_begin < routes_[y].where.row_begin;
  });
  starts.clear();
  for (const std::size_t r : by_row) starts.push_back(routes_[r].where.row_begin);
  which.resize(static_cast<std::size_t>(hi - lo));
  total.assign(R, 0);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t k = off[i]; k < off[i + 1]; ++k) {
      const std::int64_t id = local_ids_[static_cast<std::size_t>(k)];
      const auto at = std::upper_bound(starts.begin(), starts.end(), id) - starts.begin();
      const std::size_t r = by_row[static_cast<std::size_t>(std::max<std::ptrdiff_t>(at, 1) - 1)];
      if (at == 0 || id >= routes_[r].where.row_end)  // the shards cover the table's rows
        throw InputError(
            fmt::format("table '{}': id {} in bag {} of this rank's batch is outside its {} rows",
                        ts.name, id, i, ts.rows));
      which[static_cast<std::size_t>(k - lo)] = static_cast<std::uint32_t>(r - r0);
      ++total[r - r0];
    }
  // Each block: the bag count, each bag's size, the ids (std::int64_t each).
  constexpr std::size_t kW = sizeof(std::int64_t);
  for (std::size_t j = 0; j < R; ++j) {
    std::vector<std::byte>& block = blocks[r0 + j];
    block.assign((1 + static_cast<std::size_t>(b) + static_cast<std::size_t>(total[j])) * kW,
                 std::byte{0});
    std::memcpy(block.data(), &b, kW);
  }
  thread_local std::vector<std::size_t> cursor;  // per route: its next id's byte offset
  cursor.resize(R);
  for (std::size_t j = 0; j < R; ++j) cursor[j] = (1 + static_cast<std::size_t>(b)) * kW;
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t k = off[i]; k < off[i + 1]; ++k) {
      const std::size_t j = which[static_cast<std::size_t>(k - lo)];
      std::byte* block = blocks[r0 + j].data();
      const std::int64_t rel =
          local_ids_[static_cast<std::size_t>(k)] - routes_[r0 + j].where.row_begin;
      std::memcpy(block + cursor[j], &rel, kW);
      cursor[j] += kW;
      std::int64_t n = 0;
      std::memcpy(&n, block + (1 + static_cast<std::size_t>(i)) * kW, kW);
      ++n;
      std::memcpy(block + (1 + static_cast<std::size_t>(i)) * kW, &n, kW);
    }
}

void ShardedEmbedding::choose_bags(std::int64_t b) {
  const auto P = static_cast<std::size_t>(comm_.size());
  compact_.assign(P, 0);
  kept_.resize(P);
  sent_.assign(P, b);
  kept_at_.assign(P, 0);
  expand_at_.assign(P, 0);
  std::vector<std::int64_t>& index = csr_sizes_;  // each compacted owner's kept bags, expansion
  index.clear();
  std::vector<char> any;
  constexpr std::size_t kW = sizeof(std::int64_t);
  for (std::size_t q = 0; q < P; ++q) {
    kept_[q].clear();
    if (!compactable_[q] || b == 0) continue;
    any.assign(static_cast<std::size_t>(b), 0);
    bool routed = false;
    for (std::size_t r = 0; r < routes_.size(); ++r) {
      if (static_cast<std::size_t>(routes_[r].where.device) != q) continue;
      routed = true;
      const std::byte* sizes = blocks_[r].data() + kW;  // after the bag count
      for (std::int64_t i = 0; i < b; ++i) {
        std::int64_t n = 0;
        std::memcpy(&n, sizes + static_cast<std::size_t>(i) * kW, kW);
        any[static_cast<std::size_t>(i)] |= static_cast<char>(n > 0);
      }
    }
    if (!routed) continue;
    for (std::int64_t i = 0; i < b; ++i)
      if (any[static_cast<std::size_t>(i)]) kept_[q].push_back(i);
    const auto u = static_cast<std::int64_t>(kept_[q].size());
    if (u == b) continue;  // every bag travels
    compact_[q] = 1;
    sent_[q] = u + 1;
    bags_left_out_ += b - u;
    kept_at_[q] = static_cast<std::int64_t>(index.size());
    index.insert(index.end(), kept_[q].begin(), kept_[q].end());
    index.push_back(0);  // the empty bag's gradient row: any row (its bag has no ids)
    expand_at_[q] = static_cast<std::int64_t>(index.size());
    std::int64_t j = 0;
    for (std::int64_t i = 0; i < b; ++i)
      index.push_back(j < u && kept_[q][static_cast<std::size_t>(j)] == i ? j++ : u);
  }
  if (!index.empty()) {
    grow(route_index_, index.size() * sizeof(std::int64_t));
    backend_.copy_to_device(route_index_.get(), index.data(), index.size() * sizeof(std::int64_t));
  }
}

bool ShardedEmbedding::keep_received(std::size_t q, std::int64_t n, std::vector<char>& keep) const {
  const auto P = static_cast<std::size_t>(comm_.size());
  keep.assign(static_cast<std::size_t>(n), 1);
  if (!compactable_[static_cast<std::size_t>(comm_.rank())] || n == 0 || owned_.empty())
    return false;
  std::fill(keep.begin(), keep.end(), 0);
  for (std::size_t k = 0; k < owned_.size(); ++k) {
    const std::vector<std::int64_t>& sizes = recv_sizes_[k * P + q];
    for (std::size_t i = 0; i < sizes.size(); ++i) keep[i] |= static_cast<char>(sizes[i] > 0);
  }
  if (std::all_of(keep.begin(), keep.end(), [](char c) { return c != 0; })) return false;
  return true;
}

void ShardedEmbedding::forward(const SparseInput& in, AMat out) {
  if (out.is_f32()) return forward_f32(in, out.f32());
  const Mat rows(static_cast<float*>(grow(
                     rows_f32_, static_cast<std::size_t>(out.rows * out.cols) * sizeof(float))),
                 out.rows, out.cols);
  forward_f32(in, rows);
  if (out.rows > 0) backend_.gather_rows(rows, identity(out.rows), out);
}

void ShardedEmbedding::backward_update(CAMat dout, const OptimizerParams& opt,
                                       const StochasticRounding& rounding) {
  if (dout.is_f32()) return backward_update_f32(dout.f32(), opt, rounding);
  const Mat rows(static_cast<float*>(grow(
                     rows_f32_, static_cast<std::size_t>(dout.rows * dout.cols) * sizeof(float))),
                 dout.rows, dout.cols);
  if (dout.rows > 0) backend_.gather_rows(dout, identity(dout.rows), rows);
  backward_update_f32(rows, opt, rounding);
}

void ShardedEmbedding::forward_f32(const SparseInput& in, Mat out) {
  const int T = static_cast<int>(tables_.size());
  const auto P = static_cast<std::size_t>(comm_.size());
  const std::int64_t width = out_col_.back() + tables_.back().dim;
  if (in.num_tables != T || out.rows != in.batch || out.cols != width)
    throw Error(fmt::format(
        "ShardedEmbedding::forward: {} tables of {} bags into [{}, {}]; the model has {} tables "
        "and {} output columns",
        in.num_tables, in.batch, out.rows, out.cols, T, width));
  const std::int64_t b = in.batch;
  batch_ = b;
  local_offsets_.assign(in.offsets, in.offsets + T * b + 1);
  local_ids_.assign(in.ids, in.ids + local_offsets_.back());
  auto bag = [&](int t, std::int64_t i) {
    const std::int64_t k = t * b + i;
    return std::pair{local_offsets_[static_cast<std::size_t>(k)],
                     local_offsets_[static_cast<std::size_t>(k + 1)]};
  };
  auto table_ids = [&](int t) {  // every id of table t's bags
    return std::pair{local_offsets_[static_cast<std::size_t>(t * b)],
                     local_offsets_[static_cast<std::size_t>(t * b + b)]};
  };
  // ---- the ids to each shard's owner (per route: the bag count, each bag's size, the ids), and
  // the replicated tables' bags to every rank (for the update) ----
  mark("embedding_exchange");
  std::vector<std::int64_t>& sizes = csr_sizes_;  // kept from step to step
  std::vector<std::int64_t>& ids = csr_ids_;
  route_ids(b);
  choose_bags(b);
  std::vector<std::byte> rep;  // the replicated tables' bags, to every rank
  if (!replicas_.empty()) {
    put(rep, b);
    for (const Shard& s : replicas_) {
      sizes.clear();
      for (std::int64_t i = 0; i < b; ++i) {
        const auto [lo, hi] = bag(s.table, i);
        sizes.push_back(hi - lo);
      }
      put(rep, sizes.data(), sizes.size());
      const auto [lo, hi] = table_ids(s.table);
      put(rep, local_ids_.data() + lo, static_cast<std::size_t>(hi - lo));
    }
  }
  {
    // One send buffer: each rank's block holds its routes' blocks in route order, then `rep`.
    std::vector<std::int64_t> send_bytes(P, static_cast<std::int64_t>(rep.size()));
    std::vector<std::size_t> at(routes_.size());
    for (std::size_t k = 0; k < routes_.size(); ++k)
      send_bytes[static_cast<std::size_t>(routes_[k].where.device)] +=
          static_cast<std::int64_t>(blocks_[k].size());
    std::vector<std::size_t> next(P + 1, 0);
    for (std::size_t q = 0; q < P; ++q)
      next[q + 1] = next[q] + static_cast<std::size_t>(send_bytes[q]);
    host_send_.resize(next[P]);
    for (std::size_t k = 0; k < routes_.size(); ++k) {
      std::size_t& n = next[static_cast<std::size_t>(routes_[k].where.device)];
      at[k] = n;
      n += blocks_[k].size();
    }
    for (std::size_t q = 0; q < P; ++q)
      if (!rep.empty()) std::memcpy(host_send_.data() + next[q], rep.data(), rep.size());
#pragma omp parallel for schedule(dynamic)
    for (std::size_t k = 0; k < routes_.size(); ++k)
      if (!blocks_[k].empty())
        std::memcpy(host_send_.data() + at[k], blocks_[k].data(), blocks_[k].size());
    exchange(send_bytes);
  }
  // ---- the owned shards' bags of every rank, table-major, rank order within a shard ----
  mark("embedding_forward");
  std::vector<Reader> readers;
  for (std::size_t q = 0; q < P; ++q)
    readers.emplace_back(std::span<const std::byte>(host_recv_.data() + host_from_[q],
                                                    host_from_[q + 1] - host_from_[q]));
  // Every owned shard's block from every rank first, then the bags this rank looks up (those
  // the requester sends back rows for: keep_received), with the empty bag where some are left out.
  std::vector<std::int64_t> from(P, 0);
  recv_sizes_.resize(owned_.size() * P);
  recv_ids_.resize(owned_.size() * P);
  for (std::size_t k = 0; k < owned_.size(); ++k)
    for (std::size_t q = 0; q < P; ++q) {
      const auto n = readers[q].get<std::int64_t>();
      if (k > 0 && n != from[q])
        throw Error(
            fmt::format("ShardedEmbedding: rank {} sent {} bags for one shard and {} for another",
                        q, from[q], n));
      from[q] = n;
      std::vector<std::int64_t>& z = recv_sizes_[k * P + q];
      z.resize(static_cast<std::size_t>(n));
      readers[q].read(z.data(), z.size());
      std::int64_t total = 0;
      for (const std::int64_t c : z) total += c;
      std::vector<std::int64_t>& v = recv_ids_[k * P + q];
      v.resize(static_cast<std::size_t>(total));
      readers[q].read(v.data(), v.size());
    }
  std::vector<std::vector<char>> keep(P);
  std::vector<char> padded(P, 0);
  bags_from_.assign(P, 0);
  for (std::size_t q = 0; q < P; ++q) {
    padded[q] = static_cast<char>(keep_received(q, from[q], keep[q]));
    for (const char c : keep[q]) bags_from_[q] += c;
    bags_from_[q] += padded[q];
  }
  std::vector<std::int64_t>& offsets = csr_offsets_;
  offsets.assign(1, 0);
  ids.clear();
  for (std::size_t k = 0; k < owned_.size(); ++k)
    for (std::size_t q = 0; q < P; ++q) {
      const std::vector<std::int64_t>& z = recv_sizes_[k * P + q];
      for (std::size_t i = 0; i < z.size(); ++i)
        if (keep[q][i]) offsets.push_back(offsets.back() + z[i]);
      if (padded[q]) offsets.push_back(offsets.back());
      const std::vector<std::int64_t>& v = recv_ids_[k * P + q];
      ids.insert(ids.end(), v.begin(), v.end());
    }
  std::int64_t G = 0;
  for (const std::int64_t n : bags_from_) G += n;
  const auto K = static_cast<int>(owned_.size());
  owned_in_ = upload(offsets, ids, G, K, owned_offsets_, owned_ids_);
  // ---- the replicas' bags of every rank, each rank's padded with empty bags to the widest
  // batch, so that the gathered gradients stack as [ranks x widest, replica columns] ----
  if (!replicas_.empty()) {
    std::vector<std::int64_t> rank_bags(P);
    std::vector<std::vector<std::int64_t>> rep_sizes(P * replicas_.size());
    std::vector<std::vector<std::int64_t>> rep_ids(P * replicas_.size());
    for (std::size_t q = 0; q < P; ++q) {
      rank_bags[q] = readers[q].get<std::int64_t>();
      for (std::size_t k = 0; k < replicas_.size(); ++k) {
        auto& z = rep_sizes[k * P + q];
        z.resize(static_cast<std::size_t>(rank_bags[q]));
        readers[q].read(z.data(), z.size());
        std::int64_t total = 0;
        for (const std::int64_t n : z) total += n;
        auto& v = rep_ids[k * P + q];
        v.resize(static_cast<std::size_t>(total));
        readers[q].read(v.data(), v.size());
      }
    }
    widest_ = *std::max_element(rank_bags.begin(), rank_bags.end());
    offsets.assign(1, 0);
    ids.clear();
    for (std::size_t k = 0; k < replicas_.size(); ++k)
      for (std::size_t q = 0; q < P; ++q) {
        for (const std::int64_t z : rep_sizes[k * P + q]) offsets.push_back(offsets.back() + z);
        offsets.insert(offsets.end(), static_cast<std::size_t>(widest_ - rank_bags[q]),
                       offsets.back());
        ids.insert(ids.end(), rep_ids[k * P + q].begin(), rep_ids[k * P + q].end());
      }
    replica_in_ = upload(offsets, ids, static_cast<std::int64_t>(P) * widest_,
                         static_cast<int>(replicas_.size()), replica_offsets_, replica_ids_);
  }
  // ---- every owned shard looks up every rank's bags at once; rank q's rows are consecutive ----
  const TableWeights weights{weights_[0].get(), weights_[1].get(), weights_[2].get()};
  auto* rows = static_cast<float*>(grow(send_, static_cast<std::size_t>(G * owned_width_) * 4));
  if (K > 0 && G > 0)
    backend_.embedding_forward(owned_layouts_, weights, owned_in_, Mat(rows, G, owned_width_));
  std::int64_t recv_floats = 0;
  std::vector<std::int64_t> send_bytes(P), recv_bytes(P);
  for (std::size_t q = 0; q < P; ++q) {
    send_bytes[q] = bags_from_[q] * owned_width_ * 4;
    recv_bytes[q] = sent_[q] * owner_width_[q] * 4;
    recv_floats += sent_[q] * owner_width_[q];
  }
  auto* got = static_cast<float*>(grow(recv_, static_cast<std::size_t>(recv_floats) * 4));
  mark("embedding_exchange");
  agree_on_size(G * owned_width_ * 4, recv_floats * 4);
  coll_.all_to_all_v(rows, send_bytes, got, recv_bytes);
  mark("embedding_forward");
  // ---- the pooled rows into this rank's output: columns placed, row partials added (from a
  // compacted owner: the left-out bags take its empty bag's zero row, and only the kept bags'
  // partials are added) ----
  std::vector<std::int64_t> block(P);  // where each owner's block starts in `got`
  for (std::size_t q = 1; q < P; ++q) block[q] = block[q - 1] + sent_[q - 1] * owner_width_[q - 1];
  const std::int64_t* route_index = route_index_.as<const std::int64_t>();
  if (b > 0)
    for (const Route& r : routes_) {
      const auto q = static_cast<std::size_t>(r.where.device);
      const CMat part(got + block[q] + r.col, sent_[q], cols_of(r.where), owner_width_[q]);
      const Mat dst = out.cols_slice(
          out_col_[static_cast<std::size_t>(r.table)] + r.where.col_begin, cols_of(r.where));
      if (!compact_[q]) {
        if (r.add)
          backend_.add_into(part, dst);
        else
          backend_.gather_rows(part, identity(b), dst);
      } else if (!r.add) {
        backend_.gather_rows(part, route_index + expand_at_[q], dst);
      } else if (sent_[q] > 1) {
        backend_.scatter_add_rows(CMat(part.data, sent_[q] - 1, part.cols, part.ld),
                                  route_index + kept_at_[q], dst);
      }
    }
  // Mean bags of row-split tables: the summed partials over the whole bag's size (the same
  // factors scale the gradients in the backward).
  if (!mean_split_.empty() && b > 0) {
    std::vector<float> inv;
    for (const int t : mean_split_)
      for (std::int64_t i = 0; i < b; ++i) {
        const auto [lo, hi] = bag(t, i);
        inv.push_back(hi > lo ? 1.0f / static_cast<float>(hi - lo) : 1.0f);
      }
    grow(inv_sizes_, inv.size() * sizeof(float));
    backend_.copy_to_device(inv_sizes_.get(), inv.data(), inv.size() * sizeof(float));
    for (std::size_t k = 0; k < mean_split_.size(); ++k) {
      const int t = mean_split_[k];
      backend_.scale_rows(inv_sizes_.as<const float>() + static_cast<std::int64_t>(k) * b, 1.0f,
                          out.cols_slice(out_col_[static_cast<std::size_t>(t)],
                                         tables_[static_cast<std::size_t>(t)].dim));
    }
  }
  // Replicated tables: this rank's bags, looked up here.
  if (!replicas_.empty() && b > 0) {
    offsets.assign(1, 0);
    ids.clear();
    for (const Shard& s : replicas_) {
      for (std::int64_t i = 0; i < b; ++i) {
        const auto [lo, hi] = bag(s.table, i);
        offsets.push_back(offsets.back() + hi - lo);
      }
      const auto [lo, hi] = table_ids(s.table);
      ids.insert(ids.end(), local_ids_.begin() + lo, local_ids_.begin() + hi);
    }
    const SparseInput local =
        upload(offsets, ids, b, static_cast<int>(replicas_.size()), local_offsets_d_, local_ids_d_);
    backend_.embedding_forward(replica_out_layouts_, weights, local, out);
  }
}

void ShardedEmbedding::backward_update_f32(CMat dout, const OptimizerParams& opt,
                                           const StochasticRounding& rounding) {
  const auto P = static_cast<std::size_t>(comm_.size());
  const std::int64_t b = batch_;
  if (dout.rows != b)
    throw Error(
        fmt::format("ShardedEmbedding::backward_update: {} rows of gradient for the last "
                    "forward's {} bags",
                    dout.rows, b));
  const TableWeights weights{weights_[0].get(), weights_[1].get(), weights_[2].get()};
  // ---- each route's gradient columns to its owner: [b, owner's columns] a rank (a row shard
  // gets whole rows; a mean bag's divided by its whole size) ----
  mark("embedding_exchange");
  std::vector<std::int64_t> block(P), send_bytes(P), recv_bytes(P);
  std::int64_t send_floats = 0;
  for (std::size_t q = 0; q < P; ++q) {
    block[q] = send_floats;
    send_floats += sent_[q] * owner_width_[q];
    send_bytes[q] = sent_[q] * owner_width_[q] * 4;
  }
  auto* out = static_cast<float*>(grow(send_, static_cast<std::size_t>(send_floats) * 4));
  if (b > 0)
    for (const Route& r : routes_) {
      const auto q = static_cast<std::size_t>(r.where.device);
      const Mat dst(out + block[q] + r.col, sent_[q], cols_of(r.where), owner_width_[q]);
      backend_.gather_rows(
          dout.cols_slice(out_col_[static_cast<std::size_t>(r.table)] + r.where.col_begin,
                          cols_of(r.where)),
          compact_[q] ? route_index_.as<const std::int64_t>() + kept_at_[q] : identity(b), dst);
      const auto k = std::find(mean_split_.begin(), mean_split_.end(), r.table);
      if (k != mean_split_.end())
        backend_.scale_rows(inv_sizes_.as<const float>() + (k - mean_split_.begin()) * b, 1.0f,
                            dst);
    }
  std::int64_t G = 0;
  for (std::size_t q = 0; q < P; ++q) {
    recv_bytes[q] = bags_from_[q] * owned_width_ * 4;
    G += bags_from_[q];
  }
  auto* grads = static_cast<float*>(grow(recv_, static_cast<std::size_t>(G * owned_width_) * 4));
  agree_on_size(send_floats * 4, G * owned_width_ * 4);
  coll_.all_to_all_v(out, send_bytes, grads, recv_bytes);
  // ---- one fused update of every owned shard over every rank's bags, in rank order ----
  mark("embedding_backward");
  if (!owned_.empty() && G > 0)
    backend_.embedding_backward_update(owned_layouts_, weights, state_.as<float>(), owned_in_,
                                       CMat(grads, G, owned_width_), opt, rounding);
  if (replicas_.empty()) return;
  // ---- replicated: every rank's gradients (padded to the widest batch) to every rank, and the
  // same fused update on every replica ----
  mark("embedding_exchange");
  auto* mine =
      static_cast<float*>(grow(send_, static_cast<std::size_t>(widest_ * replica_width_) * 4));
  for (std::size_t k = 0; k < replicas_.size() && b > 0; ++k) {
    const Shard& s = replicas_[k];
    const int D = tables_[static_cast<std::size_t>(s.table)].dim;
    backend_.gather_rows(dout.cols_slice(out_col_[static_cast<std::size_t>(s.table)], D),
                         identity(b),
                         Mat(mine + replica_block_layouts_[k].out_col, b, D, replica_width_));
  }
  if (widest_ > b) backend_.fill(mine + b * replica_width_, (widest_ - b) * replica_width_, 0.0f);
  const std::int64_t rows = static_cast<std::int64_t>(P) * widest_;
  auto* all = static_cast<float*>(grow(recv_, static_cast<std::size_t>(rows * replica_width_) * 4));
  agree_on_size(widest_ * replica_width_ * 4, rows * replica_width_ * 4);
  coll_.all_gather(mine, static_cast<std::size_t>(widest_ * replica_width_) * 4, all);
  mark("embedding_backward");
  if (rows > 0)
    backend_.embedding_backward_update(replica_block_layouts_, weights, state_.as<float>(),
                                       replica_in_, CMat(all, rows, replica_width_), opt, rounding);
}

std::vector<ShardedEmbedding::View> ShardedEmbedding::shards() {
  std::vector<View> out;
  auto view = [&](const Shard& s) {
    return View{s.table,
                s.where,
                s.replicated,
                !s.replicated || s.index == 0,
                s.dtype,
                static_cast<std::byte*>(weights_[buffer_of(s.dtype)].get()) +
                    s.weight_offset * static_cast<std::int64_t>(dtype_size(s.dtype)),
                state_floats_ == 0 ? nullptr : state_.as<float>() + s.state_offset};
  };
  // In table order.
  std::size_t i = 0, j = 0;
  while (i < owned_.size() || j < replicas_.size())
    if (j == replicas_.size() || (i < owned_.size() && owned_[i].table < replicas_[j].table))
      out.push_back(view(owned_[i++]));
    else
      out.push_back(view(replicas_[j++]));
  return out;
}

std::vector<CheckpointPiece> ShardedEmbedding::checkpoint_pieces() {
  std::vector<CheckpointPiece> out;
  for (const View& v : shards()) {
    const TableSpec& ts = tables_[static_cast<std::size_t>(v.table)];
    const ShardPlan& w = v.where;
    const std::int64_t rows = w.row_end - w.row_begin, cols = w.col_end - w.col_begin;
    CheckpointPiece p;
    p.write = v.writer;
    p.row_begin = w.row_begin;
    p.row_end = w.row_end;
    p.col_begin = w.col_begin;
    p.col_end = w.col_end;
    p.name = fmt::format("embedding.{}.weight", ts.name);
    p.local = TensorRef{p.name, v.dtype, {rows, cols}, v.weights};
    out.push_back(p);
    p.name = fmt::format("optimizer.embedding.{}.state", ts.name);
    switch (v.state == nullptr ? OptimizerKind::sgd : optimizer_) {
      case OptimizerKind::adagrad:
        p.local = TensorRef{p.name, DType::f32, {rows, cols}, v.state};
        out.push_back(p);
        break;
      case OptimizerKind::rowwise_adagrad:
        // One value a row, kept over the shard's columns (checkpoint.h: state_columns).
        p.col_begin = 0;
        p.col_end = 1;
        if (cols != ts.dim) p.state_columns = {w.col_begin, w.col_end, ts.dim};
        p.local = TensorRef{p.name, DType::f32, {rows}, v.state};
        out.push_back(p);
        break;
      default:
        break;
    }
  }
  return out;
}

std::size_t ShardedEmbedding::weight_bytes() const {
  std::size_t n = 0;
  for (const Buffer& b : weights_) n += b.bytes();
  return n;
}
std::size_t ShardedEmbedding::state_bytes() const {
  return static_cast<std::size_t>(state_floats_) * sizeof(float);
}

std::size_t ShardedEmbedding::exchange_bytes() const {
  std::size_t n = 0;
  for (const Buffer* b :
       {&owned_offsets_, &owned_ids_, &replica_offsets_, &replica_ids_, &local_offsets_d_,
        &local_ids_d_, &send_, &recv_, &inv_sizes_, &index_, &route_index_, &rows_f32_})
    n += b->bytes();
  return n;
}

std::optional<float> ShardedEmbedding::weight(int t, std::int64_t row, int col) const {
  for (const auto* group : {&owned_, &replicas_})
    for (const Shard& s : *group)
      if (s.table == t && row >= s.where.row_begin && row < s.where.row_end &&
          col >= s.where.col_begin && col < s.where.col_end) {
        const std::int64_t at = s.weight_offset + (row - s.where.row_begin) * cols_of(s.where) +
                                col - s.where.col_begin;
        const std::byte* base = static_cast<const std::byte*>(weights_[buffer_of(s.dtype)].get());
        if (s.dtype == DType::f32) {
          float v = 0;
          backend_.copy_to_host(&v, base + at * 4, sizeof v);
          return v;
        }
        std::uint16_t h = 0;
        backend_.copy_to_host(&h, base + at * 2, sizeof h);
        return s.dtype == DType::f16 ? half_to_float(h) : bf16_to_float(h);
      }
  return std::nullopt;
}

}  // namespace parity
