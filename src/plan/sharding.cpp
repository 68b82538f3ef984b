// The sharding search over several GPUs for one recipe: which tables are replicated, which
// are split by columns or rows, and where the pieces go (docs/planner.md, "The search").
#include <algorithm>
#include <cmath>

#include "search.h"
#include "shard_work.h"

namespace parity::detail {
namespace {

class Sharder {
 public:
  Sharder(const ModelSpec& m, const DeviceSpec& dev, const Calibration& cal, int gpus)
      : m_(m),
        dev_(dev),
        cal_(cal),
        W_(gpus),
        key_bits_(embedding_key_bits(static_cast<double>(m.embedding_rows()))) {}

  void shard(Plan& p, const ShardingVariant& variant) const;

 private:
  // Predicted forward and backward of a shard in HBM (table-wise cost).
  double tw_cost(const TablePlan& tp, const TableSpec& ts, double bags, std::int64_t rows, int dim,
                 double lookups) const {
    TablePlan in_hbm = tp;
    in_hbm.placement = Placement::hbm;
    const EmbeddingCost c = embedding_cost(
        detail::shard_work(in_hbm, ts, rows, dim, bags, lookups, key_bits_), dev_, cal_);
    return c.forward_s + c.backward_s;
  }

  const ModelSpec& m_;
  const DeviceSpec& dev_;
  const Calibration& cal_;
  int W_;
  int key_bits_;  // of the sort keys, as if one device held every table
};

void Sharder::shard(Plan& p, const ShardingVariant& variant) const {
  const double G = static_cast<double>(p.global_batch);
  const double b = static_cast<double>(p.per_device_batch);
  const int T = m_.num_tables();
  // Provisional table-wise layout, for the fixed memory and the per-device target.
  for (int t = 0; t < T; ++t) {
    auto& tp = p.tables[static_cast<std::size_t>(t)];
    const auto& ts = m_.tables[static_cast<std::size_t>(t)];
    tp.sharding = Sharding::table;
    tp.shards = {{t % W_, 0, ts.rows, 0, ts.dim}};
  }
  std::vector<double> cost(static_cast<std::size_t>(T));
  double total = 0;
  for (int t = 0; t < T; ++t) {
    const auto& ts = m_.tables[static_cast<std::size_t>(t)];
    cost[static_cast<std::size_t>(t)] =
        tw_cost(p.tables[static_cast<std::size_t>(t)], ts, G, ts.rows, ts.dim, G * ts.pooling_size);
    total += cost[static_cast<std::size_t>(t)];
  }
  const double target = total / W_;

  struct Piece {
    int table;
    ShardPlan shard;
    double cost, bytes;
  };
  std::vector<Piece> pieces;
  for (int t = 0; t < T; ++t) {
    auto& tp = p.tables[static_cast<std::size_t>(t)];
    const auto& ts = m_.tables[static_cast<std::size_t>(t)];
    const double bytes = table_bytes(tp, ts);
    const double c = cost[static_cast<std::size_t>(t)];
    // Replicated: every device looks up its own examples, then the table's gradient is
    // all-reduced and every row updated. Worth it for small tables, where that costs less
    // than the table's share of the exchange and of a device's load. Marginal costs: the
    // replicated tables share one all-reduce, every table shares one all-to-all (which all
    // ranks run at once, so a table adds 1/W of its time), so fixed latencies drop out.
    auto marginal = [&](Collective kind, double bytes) {
      return collective_time(kind, bytes, W_, dev_, cal_) -
             collective_time(kind, 1.0, W_, dev_, cal_);
    };
    const double dp = tw_cost(tp, ts, b, ts.rows, ts.dim, b * ts.pooling_size) +
                      marginal(Collective::all_reduce, ts.rows * ts.dim * 4.0) +
                      memory_pass_time(static_cast<double>(ts.rows) * ts.dim * 12, dev_, cal_) -
                      cal_.kernel_launch_s;
    const double exchange = 2 * marginal(Collective::all_to_all, G * ts.dim * 4.0);
    if (dp < (c + exchange) / W_) {
      tp.sharding = Sharding::replicated;
      tp.shards.clear();
      for (int d = 0; d < W_; ++d) tp.shards.push_back({d, 0, ts.rows, 0, ts.dim});
      continue;
    }
    // Split a table that alone would load a device more than the variant's share, or into
    // pieces no larger than the variant's size limit.
    const double split =
        std::max(c / (variant.split_share * target),
                 variant.split_bytes > 0 ? std::ceil(bytes / variant.split_bytes) : 0.0);
    if (split <= 1.0) {
      tp.sharding = Sharding::table;
      pieces.push_back({t, {0, 0, ts.rows, 0, ts.dim}, c, bytes});
      continue;
    }
    // Column-wise into k pieces when the dim splits into multiples of 4 columns: the fewest
    // pieces that reach the split, else as many as the dim allows. Each piece's pooled outputs
    // go through the all-to-all with the others; a row-wise table instead reduce-scatters a
    // partial output of the whole batch from every device, which at many GPUs costs far more.
    int k = 0, most = 0;
    for (int cand = 2; cand <= W_; ++cand)
      if (ts.dim % cand == 0 && (ts.dim / cand) % 4 == 0) {
        most = cand;
        if (cand >= split) {
          k = cand;
          break;
        }
      }
    const bool fits_in_columns =
        variant.split_bytes <= 0 || bytes / std::max(most, 1) <= variant.split_bytes;
    if (k == 0 && most > 1 && fits_in_columns) k = most;
    if (k > 1) {
      tp.sharding = Sharding::column;
      const int w = ts.dim / k;
      for (int j = 0; j < k; ++j)
        pieces.push_back({t,
                          {0, 0, ts.rows, j * w, (j + 1) * w},
                          tw_cost(tp, ts, G, ts.rows, w, G * ts.pooling_size),
                          bytes / k});
      continue;
    }
    // Row-wise over every device, in equal contiguous ranges.
    tp.sharding = Sharding::row;
    tp.shards.clear();
    for (int d = 0; d < W_; ++d) {
      const std::int64_t r0 = ts.rows * d / W_, r1 = ts.rows * (d + 1) / W_;
      if (r1 > r0) tp.shards.push_back({d, r0, r1, 0, ts.dim});
    }
  }
  // Row-sharded tables load every device alike; then place the rest longest first onto
  // the least loaded device that has room.
  std::vector<double> load(static_cast<std::size_t>(W_), 0), mem(static_cast<std::size_t>(W_), 0);
  for (int t = 0; t < T; ++t) {
    const auto& tp = p.tables[static_cast<std::size_t>(t)];
    if (tp.sharding != Sharding::row && tp.sharding != Sharding::replicated) continue;
    const auto& ts = m_.tables[static_cast<std::size_t>(t)];
    const double share = tp.sharding == Sharding::row ? 1.0 / W_ : 1.0;
    for (int d = 0; d < W_; ++d) {
      load[static_cast<std::size_t>(d)] += cost[static_cast<std::size_t>(t)] * share;
      mem[static_cast<std::size_t>(d)] += table_bytes(tp, ts) * share;
    }
  }
  auto key = [&](const Piece& pc) { return variant.balance_bytes ? pc.bytes : pc.cost; };
  std::vector<double>& level = variant.balance_bytes ? mem : load;
  std::stable_sort(pieces.begin(), pieces.end(),
                   [&](const Piece& a, const Piece& b) { return key(a) > key(b); });
  for (auto& pc : pieces) {
    const int best = static_cast<int>(std::min_element(level.begin(), level.end()) - level.begin());
    pc.shard.device = best;
    load[static_cast<std::size_t>(best)] += pc.cost;
    mem[static_cast<std::size_t>(best)] += pc.bytes;
    auto& tp = p.tables[static_cast<std::size_t>(pc.table)];
    if (tp.sharding == Sharding::table) tp.shards = {pc.shard};
  }
  for (int t = 0; t < T; ++t) {
    auto& tp = p.tables[static_cast<std::size_t>(t)];
    if (tp.sharding != Sharding::column) continue;
    tp.shards.clear();
    for (const auto& pc : pieces)
      if (pc.table == t) tp.shards.push_back(pc.shard);
    std::sort(tp.shards.begin(), tp.shards.end(),
              [](const ShardPlan& a, const ShardPlan& b) { return a.col_begin < b.col_begin; });
  }
}

}  // namespace

void shard_tables(Plan& p, const ShardingVariant& variant, const ModelSpec& m,
                  const DeviceSpec& dev, const Calibration& cal) {
  Sharder(m, dev, cal, p.gpus).shard(p, variant);
}

}  // namespace parity::detail
