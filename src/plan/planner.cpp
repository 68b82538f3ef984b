// The co-design planner. For a model, a device and a GPU count it chooses the recipe
// that maximises predicted examples/s under the memory budget:
//   - dense math: the fastest precision the model allows that the device has;
//   - table optimizer and precision: the model's own, or the cheaper variants its recipe
//     allows (rowwise Adagrad, fp16/bf16 tables): allowed changes only ever cut bytes;
//   - global batch: from recipe.max_global_batch down to the reference batch_size, and
//     below it only when the reference batch does not fit;
//   - sharding (several GPUs): replicated where that is cheaper than exchanging outputs,
//     split by columns or rows where one table would dominate a device, otherwise whole
//     tables, balanced by predicted cost (longest first onto the least loaded device);
//   - placement: HBM; the coldest tables move to host memory with an HBM cache only when
//     the device is full.
// Every change to the model's numerics is listed with its reason, computed by planning
// again without it. Deterministic: no hash-order iteration, ties broken by index.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "parity/error.h"
#include "parity/plan.h"
#include "shard_work.h"

namespace parity {
namespace {

std::string gb(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}
std::string pct(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.0f%%", 100 * (x - 1));
  return buf;
}

struct Choice {
  std::int64_t global_batch = 0;
  DenseMath math = DenseMath::fp32;
  OptimizerKind optimizer = OptimizerKind::sgd;
  std::vector<DType> dtypes;  // per table
};

// How tables are split and spread over several GPUs. The variants do not depend on the
// device's memory size: memory only decides which tables the fit step moves to the host,
// coldest first. So a device with more HBM is offered the same candidates, each needing
// no more host placement than before, and the best predicted throughput can only rise.
struct ShardingVariant {
  double split_share = 1.0;     // split a table whose cost exceeds this share of a device's
  double split_bytes = 0;       // split every table larger than this (0: by cost alone)
  bool balance_bytes = false;   // spread pieces by bytes instead of by cost
};

// Searched when there are several GPUs. Splitting at a fraction of the fair share gives the
// balancing finer pieces; splitting every large table spreads memory; balancing by bytes
// keeps the devices' memory even.
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const ShardingVariant kVariants[] = {
    {1.0, 0, false}, {0.5, 0, false}, {1.0, 8 * kGiB, false}, {0.5, 8 * kGiB, false},
    {1.0, 8 * kGiB, true}, {0.25, 2 * kGiB, false},
};

struct Built {
  ShardingVariant variant;
  Plan plan;
  bool feasible = false;
  std::string why;          // when not feasible
  double shortfall = 0;     // bytes over budget on the worst device (or host)
};

class Planner {
 public:
  Planner(const ModelSpec& m, const DeviceSpec& dev, int gpus, const PlannerOptions& opt)
      : m_(m), dev_(dev), W_(gpus), opt_(opt), cal_(calibration_for(dev, opt.configs_dir)) {}

  const Calibration& calibration() const { return cal_; }

  DenseMath best_math() const {
    // Fastest achievable rate; ties prefer bf16, fp16, tf32, fp32 (range first).
    DenseMath best = DenseMath::fp32;
    double best_rate = -1;
    for (DenseMath c : {DenseMath::bf16, DenseMath::fp16, DenseMath::tf32, DenseMath::fp32}) {
      if (std::find(m_.allowed_dense_math.begin(), m_.allowed_dense_math.end(), c) ==
          m_.allowed_dense_math.end())
        continue;
      if (c == DenseMath::tf32 && !dev_.has_tf32()) continue;
      const double rate = dev_.dense_flops(c) * cal_.gemm_efficiency(c);
      if (rate > best_rate * (1 + 1e-9)) {
        best = c;
        best_rate = rate;
      }
    }
    return best;
  }

  Choice preferred() const {
    Choice c;
    c.math = best_math();
    c.optimizer = m_.embedding_optimizer.kind;
    if (c.optimizer == OptimizerKind::adagrad && m_.allow_rowwise_adagrad)
      c.optimizer = OptimizerKind::rowwise_adagrad;
    const auto& allowed = m_.allowed_table_dtypes;
    auto allows = [&](DType d) { return std::find(allowed.begin(), allowed.end(), d) != allowed.end(); };
    for (const auto& t : m_.tables) {
      DType d = t.dtype;
      if (dtype_size(d) > 2) {  // fp16 keeps more mantissa than bf16 at the same cost
        if (allows(DType::f16)) d = DType::f16;
        else if (allows(DType::bf16)) d = DType::bf16;
      }
      c.dtypes.push_back(d);
    }
    return c;
  }

  std::vector<std::int64_t> batch_candidates() const {
    std::vector<std::int64_t> out;
    const std::int64_t ref = m_.batch_size;
    const std::int64_t top = std::max(m_.max_global_batch, ref);
    for (std::int64_t g = top; g > ref; g /= 2) out.push_back(round_to_gpus(g));
    out.push_back(round_to_gpus(ref));
    std::int64_t g = ref;
    for (int i = 0; i < opt_.max_batch_halvings && g / 2 >= W_; ++i) {
      g /= 2;
      out.push_back(round_to_gpus(g));
    }
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // Best feasible plan over the batch candidates for fixed numerics; nullopt when none fits
  // (last_failure_ then holds the smallest batch's failure).
  // Best feasible plan over the batch candidates for fixed numerics: the fastest among the
  // batches from the reference up to recipe.max_global_batch; below the reference only when
  // none of those fits (then the largest that fits). nullopt when nothing fits
  // (last_failure_ then holds the smallest batch's failure).
  std::optional<Built> best_over_batches(Choice c) {
    std::optional<Built> best;
    const std::int64_t ref = round_to_gpus(m_.batch_size);
    const std::size_t variants = W_ > 1 ? std::size(kVariants) : 1;
    for (std::int64_t g : batch_candidates()) {
      if (g < ref && best) break;
      c.global_batch = g;
      for (std::size_t v = 0; v < variants; ++v) {
        Built b = build(c, kVariants[v]);
        if (!b.feasible) {
          last_failure_ = b;
          continue;
        }
        if (!best || b.plan.prediction.examples_per_s > best->plan.prediction.examples_per_s * (1 + 1e-12))
          best = std::move(b);
      }
      if (g < ref && best) break;
    }
    return best;
  }

  Built build(const Choice& c, const ShardingVariant& variant) {
    Built out;
    out.variant = variant;
    Plan& p = out.plan;
    p.model = m_.name;
    p.model_file = m_.source_file;
    p.device = dev_.name;
    p.gpus = W_;
    p.global_batch = c.global_batch;
    p.per_device_batch = c.global_batch / W_;
    p.dense_math = c.math;
    p.embedding_optimizer = c.optimizer;
    p.calibration = cal_.source;
    const int T = m_.num_tables();
    p.tables.resize(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) {
      auto& tp = p.tables[static_cast<std::size_t>(t)];
      tp.name = m_.tables[static_cast<std::size_t>(t)].name;
      tp.dtype = c.dtypes[static_cast<std::size_t>(t)];
      tp.optimizer = c.optimizer;
    }
    if (W_ == 1) {
      for (int t = 0; t < T; ++t) {
        auto& tp = p.tables[static_cast<std::size_t>(t)];
        tp.sharding = Sharding::table;
        tp.shards = {{0, 0, m_.tables[static_cast<std::size_t>(t)].rows, 0,
                      m_.tables[static_cast<std::size_t>(t)].dim}};
      }
    } else {
      shard(p, variant);
    }
    fit(out);
    if (out.feasible) {
      p.kernels.clear();
      // Kernel choices: the ranked-first tile of every dense GEMM of the step.
      p.prediction = evaluate_plan(p, m_, dev_, cal_);
      p.kernels = kernel_choices(p);
    }
    return out;
  }

  Built last_failure_;

 private:
  std::int64_t round_to_gpus(std::int64_t g) const {
    return std::max<std::int64_t>(W_, (g / W_) * W_);
  }

  double table_bytes(const TablePlan& tp, const TableSpec& ts) const {
    return static_cast<double>(ts.rows) *
           (ts.dim * static_cast<double>(dtype_size(tp.dtype)) +
            optimizer_state_bytes_per_row(tp.optimizer, ts.dim));
  }

  double tw_cost(const TablePlan& tp, const TableSpec& ts, double bags, std::int64_t rows,
                 int dim, double lookups) const {
    TablePlan in_hbm = tp;
    in_hbm.placement = Placement::hbm;
    const EmbeddingCost c = embedding_cost(detail::shard_work(in_hbm, ts, rows, dim, bags, lookups), dev_, cal_);
    return c.forward_s + c.backward_s;
  }

  void shard(Plan& p, const ShardingVariant& variant) const {
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
        return collective_time(kind, bytes, W_, dev_, cal_) - collective_time(kind, 1.0, W_, dev_, cal_);
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
      // Split a table that alone would load a device more than the variant's share, or that
      // is larger than its size limit.
      const double split = std::max(c / (variant.split_share * target),
                                    variant.split_bytes > 0 && bytes > variant.split_bytes
                                        ? static_cast<double>(W_) : 0.0);
      if (split <= 1.0) {
        tp.sharding = Sharding::table;
        pieces.push_back({t, {0, 0, ts.rows, 0, ts.dim}, c, bytes});
        continue;
      }
      // Column-wise into k pieces when the dim splits into multiples of 4 columns.
      int k = 0;
      for (int cand = static_cast<int>(std::ceil(split)); cand <= W_; ++cand)
        if (ts.dim % cand == 0 && (ts.dim / cand) % 4 == 0) {
          k = cand;
          break;
        }
      if (k > 1) {
        tp.sharding = Sharding::column;
        const int w = ts.dim / k;
        for (int j = 0; j < k; ++j)
          pieces.push_back({t, {0, 0, ts.rows, j * w, (j + 1) * w},
                            tw_cost(tp, ts, G, ts.rows, w, G * ts.pooling_size), bytes / k});
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

  // Moves the coldest tables of over-full devices to host memory until every device fits,
  // then gives each device's spare HBM to its host-placed tables as cache.
  void fit(Built& out) {
    Plan& p = out.plan;
    const double budget = dev_.hbm_bytes.value;
    const int T = m_.num_tables();
    for (int round = 0; round <= T; ++round) {
      const Prediction pr = evaluate_plan(p, m_, dev_, cal_);
      std::vector<double> over(static_cast<std::size_t>(W_), 0);
      bool any = false;
      for (int d = 0; d < W_; ++d) {
        over[static_cast<std::size_t>(d)] = pr.device_memory_bytes[static_cast<std::size_t>(d)] - budget;
        any |= over[static_cast<std::size_t>(d)] > 0;
      }
      if (!any) break;
      // Candidates on over-full devices, coldest (fewest lookups per byte) first.
      struct Cand {
        int table;
        double heat;
      };
      std::vector<Cand> cands;
      for (int t = 0; t < T; ++t) {
        const auto& tp = p.tables[static_cast<std::size_t>(t)];
        if (tp.placement == Placement::host || tp.sharding == Sharding::replicated) continue;
        bool on_full = false;
        for (const auto& s : tp.shards) on_full |= over[static_cast<std::size_t>(s.device)] > 0;
        if (!on_full) continue;
        const auto& ts = m_.tables[static_cast<std::size_t>(t)];
        cands.push_back({t, ts.pooling_size / std::max(1.0, table_bytes(tp, ts))});
      }
      if (cands.empty()) {
        const auto worst = std::max_element(over.begin(), over.end());
        out.feasible = false;
        out.shortfall = *worst;
        out.why = "device " + std::to_string(worst - over.begin()) + " needs " +
                  gb(pr.device_memory_bytes[static_cast<std::size_t>(worst - over.begin())]) +
                  " of its " + gb(budget) + " even with every movable table in host memory";
        return;
      }
      std::stable_sort(cands.begin(), cands.end(),
                       [](const Cand& a, const Cand& b) { return a.heat < b.heat; });
      // Move enough tables to cover the largest overflow in this round.
      std::vector<double> freed(static_cast<std::size_t>(W_), 0);
      for (const auto& c : cands) {
        auto& tp = p.tables[static_cast<std::size_t>(c.table)];
        const auto& ts = m_.tables[static_cast<std::size_t>(c.table)];
        bool needed = false;
        for (const auto& s : tp.shards)
          needed |= freed[static_cast<std::size_t>(s.device)] < over[static_cast<std::size_t>(s.device)];
        if (!needed) continue;
        tp.placement = Placement::host;
        tp.cache_rows = 0;
        const double per_shard = table_bytes(tp, ts) / static_cast<double>(tp.shards.size());
        for (const auto& s : tp.shards) freed[static_cast<std::size_t>(s.device)] += per_shard;
      }
    }
    // Cache: each device's spare HBM, shared by its host-placed tables by lookups.
    Prediction pr = evaluate_plan(p, m_, dev_, cal_);
    for (int d = 0; d < W_; ++d) {
      if (pr.device_memory_bytes[static_cast<std::size_t>(d)] > budget) {
        out.feasible = false;
        out.shortfall = pr.device_memory_bytes[static_cast<std::size_t>(d)] - budget;
        out.why = "device " + std::to_string(d) + " needs " +
                  gb(pr.device_memory_bytes[static_cast<std::size_t>(d)]) + " of its " + gb(budget);
        return;
      }
    }
    std::vector<double> spare(static_cast<std::size_t>(W_)), demand(static_cast<std::size_t>(W_), 0);
    for (int d = 0; d < W_; ++d)
      spare[static_cast<std::size_t>(d)] = 0.98 * (budget - pr.device_memory_bytes[static_cast<std::size_t>(d)]);
    bool any_host = false;
    for (int t = 0; t < T; ++t) {
      const auto& tp = p.tables[static_cast<std::size_t>(t)];
      if (tp.placement != Placement::host) continue;
      any_host = true;
      for (const auto& s : tp.shards)
        demand[static_cast<std::size_t>(s.device)] += m_.tables[static_cast<std::size_t>(t)].pooling_size;
    }
    if (any_host) {
      for (int t = 0; t < T; ++t) {
        auto& tp = p.tables[static_cast<std::size_t>(t)];
        if (tp.placement != Placement::host) continue;
        const auto& ts = m_.tables[static_cast<std::size_t>(t)];
        double rows = static_cast<double>(ts.rows);
        for (const auto& s : tp.shards) {
          const auto du = static_cast<std::size_t>(s.device);
          const double share = demand[du] > 0 ? spare[du] * ts.pooling_size / demand[du] : 0;
          const int dim = s.col_end - s.col_begin;
          const double row_bytes = dim * static_cast<double>(dtype_size(tp.dtype)) + 8 +
                                   optimizer_state_bytes_per_row(tp.optimizer, dim);
          rows = std::min(rows, std::floor(share / row_bytes));
        }
        tp.cache_rows = static_cast<std::int64_t>(std::max(0.0, std::min(rows, static_cast<double>(ts.rows))));
      }
      pr = evaluate_plan(p, m_, dev_, cal_);
      if (pr.host_memory_bytes > dev_.host_memory_bytes.value) {
        out.feasible = false;
        out.shortfall = pr.host_memory_bytes - dev_.host_memory_bytes.value;
        out.why = "the tables placed in host memory need " + gb(pr.host_memory_bytes) +
                  " per GPU, the host has " + gb(dev_.host_memory_bytes.value) + " per GPU";
        return;
      }
    }
    out.feasible = true;
  }

  std::vector<KernelChoice> kernel_choices(const Plan& p) const {
    std::vector<KernelChoice> out;
    const std::int64_t b = p.per_device_batch;
    auto add = [&](const std::string& op, std::int64_t mm, std::int64_t nn, std::int64_t kk) {
      const GemmEstimate e = gemm_best({mm, nn, kk, p.dense_math}, dev_, cal_);
      out.push_back({op, mm, nn, kk, e.tile.m, e.tile.n, e.seconds});
    };
    int in = m_.dense_features;
    for (std::size_t i = 0; i < m_.bottom_mlp.size(); ++i) {
      add("bottom_mlp." + std::to_string(i) + " forward", b, m_.bottom_mlp[i], in);
      in = m_.bottom_mlp[i];
    }
    if (m_.interaction.kind == InteractionKind::dcnv2) {
      const std::int64_t n = m_.interaction_input_dim(), r = m_.interaction.low_rank;
      add("cross forward u", b, r, n);
      add("cross forward z", b, n, r);
    }
    in = m_.interaction_output_dim();
    for (std::size_t i = 0; i < m_.top_mlp.size(); ++i) {
      add("top_mlp." + std::to_string(i) + " forward", b, m_.top_mlp[i], in);
      in = m_.top_mlp[i];
    }
    return out;
  }

  const ModelSpec& m_;
  const DeviceSpec& dev_;
  int W_;
  PlannerOptions opt_;
  Calibration cal_;
};

std::string si_rate(double v) {
  char buf[64];
  if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0fk", v / 1e3);
  return buf;
}

// Why a change was made, from the best plan without it.
std::string describe_without(const std::optional<Built>& without, const Plan& chosen) {
  if (!without) return "without it the model does not fit";
  const Plan& w = without->plan;
  int host_without = 0, host_with = 0;
  for (const auto& t : w.tables) host_without += t.placement == Placement::host;
  for (const auto& t : chosen.tables) host_with += t.placement == Placement::host;
  std::string s = "without it " + si_rate(w.prediction.examples_per_s) + " examples/s, with it " +
                  si_rate(chosen.prediction.examples_per_s) + " (" +
                  pct(chosen.prediction.examples_per_s / w.prediction.examples_per_s) + ")";
  if (host_without > host_with)
    s += "; without it " + std::to_string(host_without - host_with) +
         " more tables would live in host memory";
  if (w.global_batch < chosen.global_batch)
    s += "; without it the batch would drop to " + std::to_string(w.global_batch);
  return s;
}

}  // namespace

Plan make_plan(const ModelSpec& m, const DeviceSpec& dev, int gpus, const PlannerOptions& opt) {
  if (gpus < 1) throw InputError("--gpus must be at least 1, got " + std::to_string(gpus));
  Planner planner(m, dev, gpus, opt);
  const Choice pref = planner.preferred();
  std::optional<Built> best = planner.best_over_batches(pref);
  if (!best) {
    const Built& f = planner.last_failure_;
    // What would make it fit.
    double tables = 0;
    for (std::size_t t = 0; t < m.tables.size(); ++t)
      tables += static_cast<double>(m.tables[t].rows) *
                (m.tables[t].dim * static_cast<double>(dtype_size(pref.dtypes[t])) +
                 optimizer_state_bytes_per_row(pref.optimizer, m.tables[t].dim));
    const double per_gpu_room = dev.hbm_bytes.value * 0.8;
    const int need = static_cast<int>(std::ceil(tables / per_gpu_room));
    std::string msg = "model '" + m.name + "' does not fit on " + std::to_string(gpus) + " x " +
                      dev.display_name + ": " + f.why + " (" + gb(f.shortfall) +
                      " over) at the smallest batch tried, " +
                      std::to_string(f.plan.global_batch) + ". Tables with their optimizer state: " +
                      gb(tables) + ". To fit:";
    msg += "\n  - more GPUs: about " + std::to_string(std::max(need, gpus + 1)) + " x " + dev.name +
           " hold the tables in HBM";
    const auto& allowed = m.allowed_table_dtypes;
    if (std::find(allowed.begin(), allowed.end(), DType::f16) == allowed.end() &&
        std::find(allowed.begin(), allowed.end(), DType::bf16) == allowed.end())
      msg += "\n  - lower table precision: allowing fp16 in recipe.table_dtypes halves the weights";
    if (m.embedding_optimizer.kind == OptimizerKind::adagrad && !m.allow_rowwise_adagrad)
      msg += "\n  - rowwise Adagrad: recipe.allow_rowwise_adagrad cuts the optimizer state to one "
             "float per row";
    msg += "\n  - host placement: " + gb(dev.host_memory_bytes.value) +
           " of host memory per GPU is assumed (configs/devices/" + dev.name + ".yaml)";
    throw InfeasibleError(msg);
  }
  Plan plan = best->plan;

  // ---- recipe changes, each with its reason (plan again without it) ----
  const std::string on = " on " + std::to_string(gpus) + " x " + dev.display_name;
  if (plan.embedding_optimizer != m.embedding_optimizer.kind) {
    Choice c = pref;
    c.optimizer = m.embedding_optimizer.kind;
    const auto without = planner.best_over_batches(c);
    const double state = static_cast<double>(m.embedding_rows()) * 4;
    plan.changes.push_back({"embedding optimizer", std::string(optimizer_name(m.embedding_optimizer.kind)),
                            std::string(optimizer_name(plan.embedding_optimizer)),
                            "one fp32 state per row (" + gb(state) + ") instead of one per element (" +
                                gb(static_cast<double>(m.embedding_parameters()) * 4) + "); " +
                                describe_without(without, plan) +
                                "; allowed by recipe.allow_rowwise_adagrad"});
  }
  {
    int lowered = 0;
    std::string names;
    for (std::size_t t = 0; t < m.tables.size(); ++t)
      if (plan.tables[t].dtype != m.tables[t].dtype) {
        if (lowered < 4) names += (lowered ? ", " : "") + m.tables[t].name;
        ++lowered;
      }
    if (lowered > 0) {
      Choice c = pref;
      for (std::size_t t = 0; t < m.tables.size(); ++t) c.dtypes[t] = m.tables[t].dtype;
      const auto without = planner.best_over_batches(c);
      plan.changes.push_back({"table precision", "fp32 (" + std::to_string(lowered) + " tables: " + names +
                                                     (lowered > 4 ? ", ..." : "") + ")",
                              std::string(dtype_name(plan.tables[0].dtype)),
                              "half the bytes per lookup and per update; " +
                                  describe_without(without, plan) +
                                  "; stochastic rounding in the update; allowed by recipe.table_dtypes"});
    }
  }
  if (plan.dense_math != DenseMath::fp32) {
    std::string reason = "fastest dense math the model allows" + on + " (" +
                         std::to_string(static_cast<int>(dev.dense_flops(plan.dense_math) / 1e12)) +
                         " TFLOP/s peak vs " + std::to_string(static_cast<int>(dev.fp32_flops.value / 1e12)) +
                         " in fp32)";
    if (!dev.has_tf32()) reason += "; " + dev.display_name + " has no TF32";
    if (plan.dense_math != DenseMath::tf32) reason += "; master weights and optimizer stay fp32";
    plan.changes.push_back({"dense math", "fp32", std::string(dense_math_name(plan.dense_math)), reason});
  }
  if (plan.global_batch != m.batch_size) {
    std::string reason;
    if (plan.global_batch < m.batch_size) {
      reason = "the reference batch does not fit" + on + "; learning rates scaled by " +
               std::to_string(static_cast<double>(plan.global_batch) / m.batch_size);
    } else {
      reason = "recipe.max_global_batch allows up to " + std::to_string(m.max_global_batch) +
               " and the larger batch amortises per-step costs; learning rates scaled by " +
               std::to_string(static_cast<double>(plan.global_batch) / m.batch_size).substr(0, 5);
    }
    plan.changes.push_back({"global batch", std::to_string(m.batch_size),
                            std::to_string(plan.global_batch), reason});
  }
  {
    int host = 0;
    for (const auto& t : plan.tables) host += t.placement == Placement::host;
    if (host > 0)
      plan.changes.push_back({"placement", "hbm", std::to_string(host) + " tables in host memory",
                              "the tables do not all fit in HBM" + on +
                                  "; the coldest (fewest lookups per byte) live in host memory with "
                                  "an HBM cache of their hottest rows"});
  }
  return plan;
}

Plan port_plan(const Plan& source, const ModelSpec& m, const DeviceSpec& dev,
               const PlannerOptions& opt) {
  Plan p = source;
  p.device = dev.name;
  p.changes.clear();
  if (p.dense_math == DenseMath::tf32 && !dev.has_tf32()) {
    p.dense_math = DenseMath::fp32;
    p.changes.push_back({"dense math", "tf32", "fp32",
                         dev.display_name + " has no TF32: the ported recipe falls back to fp32"});
  }
  const Calibration cal = calibration_for(dev, opt.configs_dir);
  p.calibration = cal.source;
  p.prediction = evaluate_plan(p, m, dev, cal);
  p.kernels.clear();
  for (const auto& k : source.kernels) {
    const GemmEstimate e = gemm_best({k.m, k.n, k.k, p.dense_math}, dev, cal);
    p.kernels.push_back({k.op, k.m, k.n, k.k, e.tile.m, e.tile.n, e.seconds});
  }
  return p;
}

ModelSpec apply_plan(const ModelSpec& model, const Plan& plan, std::int64_t batch) {
  if (plan.model != model.name)
    throw InputError("plan is for model '" + plan.model + "', not '" + model.name + "'");
  if (plan.tables.size() != model.tables.size())
    throw InputError("plan has " + std::to_string(plan.tables.size()) + " tables, model '" +
                     model.name + "' has " + std::to_string(model.tables.size()));
  ModelSpec m = model;
  for (std::size_t t = 0; t < m.tables.size(); ++t) {
    if (plan.tables[t].name != m.tables[t].name)
      throw InputError("plan table " + std::to_string(t) + " is '" + plan.tables[t].name +
                       "', the model's is '" + m.tables[t].name + "'");
    m.tables[t].dtype = plan.tables[t].dtype;
  }
  m.embedding_optimizer.kind = plan.embedding_optimizer;
  m.batch_size = batch > 0 ? batch : plan.global_batch;
  const double scale = static_cast<double>(m.batch_size) / static_cast<double>(model.batch_size);
  m.embedding_optimizer.lr *= scale;
  m.dense_optimizer.lr *= scale;
  return m;
}

bool fits(const Prediction& p, const DeviceSpec& device) {
  return p.peak_memory_bytes <= p.memory_budget_bytes && p.host_memory_bytes <= device.host_memory_bytes.value;
}

}  // namespace parity
