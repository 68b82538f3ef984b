// The predicted step of a plan. Composition and overlap assumption (docs/planner.md):
//   step = embedding forward + all-to-all forward + dense forward (MLPs, interaction)
//        + loss + dense backward + all-to-all backward + embedding backward (fused update)
//        + host traffic of host-placed tables + dense optimizer
//        + max(0, dense all-reduce - allreduce_overlap * dense backward)
// Embedding work is the slowest device's (the all-to-all waits for it). Only the dense
// all-reduce overlaps with compute (bucketed during the backward, as DDP does); the
// embedding exchange is on the critical path, as in the engine today. The dense terms are the
// sums of the per-op list of dense_op_costs (dense_cost.cpp), the embedding terms embedding_cost
// per shard, with sort keys as wide as the rows the shard's device holds.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "dense_cost.h"
#include "hstu_plan.h"
#include "parity/backend.h"
#include "parity/embedding_kernels.h"
#include "parity/error.h"
#include "parity/plan.h"
#include "search.h"
#include "shard_work.h"

namespace parity {
namespace {

// The dense ops' predicted time by category, forward and backward apart (the all-reduce hides
// behind the backward).
struct DenseTime {
  std::map<std::string, double> forward, backward;
  double total(const std::string& category) const {
    return value(forward, category) + value(backward, category);
  }
  static double value(const std::map<std::string, double>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? 0.0 : it->second;
  }
};

DenseTime dense_time(const std::vector<OpCost>& ops) {
  DenseTime t;
  for (const OpCost& op : ops)
    (op.op.ends_with(" backward") ? t.backward : t.forward)[op.category] += op.seconds;
  return t;
}

const TableSpec& table_of(const ModelSpec& m, const std::string& name, const std::string& where) {
  for (const auto& t : m.tables)
    if (t.name == name) return t;
  throw InputError(fmt::format("{}: table '{}' is not in model '{}'", where, name, m.name));
}

}  // namespace

std::string_view sharding_name(Sharding s) {
  return name_in(kShardingNames, s);
}

Prediction evaluate_plan(const Plan& plan, const ModelSpec& m, const DeviceSpec& dev,
                         const Calibration& cal) {
  if (m.kind == ModelKind::hstu) return detail::evaluate_hstu_plan(plan, m, dev, cal);
  require_dlrm(m, "the planner");
  const std::string where = fmt::format("plan for model '{}'", plan.model);
  if (plan.gpus < 1) throw InputError(where + ": gpus must be >= 1");
  if (plan.per_device_batch < 1) throw InputError(where + ": per_device_batch must be >= 1");
  if (plan.tables.size() != m.tables.size())
    throw InputError(fmt::format("{}: has {} tables, model '{}' has {}", where, plan.tables.size(),
                                 m.name, m.tables.size()));
  if (plan.dense_math == DenseMath::tf32 && !dev.has_tf32())
    throw InputError(
        fmt::format("{}: dense math tf32 on {}, which has no TF32", where, dev.display_name));
  const int W = plan.gpus;
  const double b = static_cast<double>(plan.per_device_batch);
  const double G = b * W;
  Prediction p;
  p.memory_budget_bytes = dev.hbm_bytes.value;

  // ---- dense part (replicated: the same on every device) ----
  const ProductTimes product_times = planned_product_times(plan, m);
  const std::vector<OpCost> dense_ops =
      dense_op_costs(m, plan.per_device_batch, plan.dense_math, dev, cal, plan.product_checks,
                     product_times.empty() ? nullptr : &product_times);
  const DenseTime dt = dense_time(dense_ops);
  const detail::DenseMemory dm =
      detail::dense_memory(m, plan.dense_math, plan.product_checks, fused_checked_products(dev));
  const double P = static_cast<double>(m.dense_parameters());
  const int k = optimizer_state_per_element(m.dense_optimizer.kind);
  const bool low = plan.dense_math == DenseMath::bf16 || plan.dense_math == DenseMath::fp16;
  const double opt_bytes = P * (4 * 3 + 8.0 * k) + (low ? P * 2 : 0);
  const double t_opt = memory_pass_time(opt_bytes, dev, cal);
  const double t_allreduce = collective_time(Collective::all_reduce, P * 4, W, dev, cal);
  const double dense_backward =
      DenseTime::value(dt.backward, "mlp") + DenseTime::value(dt.backward, "interaction");
  const double exposed_allreduce =
      std::max(0.0, t_allreduce - cal.allreduce_overlap * dense_backward);

  // ---- embeddings, per device ----
  std::vector<double> fwd(W, 0), bwd(W, 0), host(W, 0), a2a_send(W, 0), rs_bytes(W, 0);
  std::vector<double> weights_mem(W, 0), state_mem(W, 0), io_mem(W, 0);
  std::vector<double> cache_maps_mem(W, 0), lookups_on(W, 0), bags_on(W, 0), max_dim_on(W, 0);
  // Per device: whether it runs a backward at all, and whether any of its rows is heavy (the
  // backward's fixed costs, once a device).
  std::vector<char> any_rows(W, 0), any_heavy(W, 0);
  std::vector<double> host_mem(W, 0), emb_bytes(W, 0);
  double replicated_s = 0, replicated_allreduce_bytes = 0;
  std::size_t memo_table = static_cast<std::size_t>(-1);
  // The engine stores x0 (the pooled outputs) and its gradient like the activations: bf16 under a
  // 16-bit dense math with DCNv2, fp32 for the dot interaction's kernels.
  const DType emb_io =
      low && m.interaction.kind == InteractionKind::dcnv2 ? DType::bf16 : DType::f32;
  // The rows each device holds: its embedding kernels sort keys over all of them.
  std::vector<double> device_rows(W, 0);
  for (std::size_t i = 0; i < plan.tables.size(); ++i) {
    const TablePlan& tp = plan.tables[i];
    if (tp.sharding == Sharding::replicated) {
      for (double& r : device_rows) r += static_cast<double>(table_of(m, tp.name, where).rows);
      continue;
    }
    for (const ShardPlan& s : tp.shards)
      if (s.device >= 0 && s.device < W)
        device_rows[s.device] += static_cast<double>(s.row_end - s.row_begin);
  }
  EmbeddingShardWork memo;
  EmbeddingCost memo_cost;
  for (std::size_t i = 0; i < plan.tables.size(); ++i) {
    const TablePlan& tp = plan.tables[i];
    const TableSpec& ts = table_of(m, tp.name, where);
    const std::string tw = fmt::format("{}: table '{}'", where, tp.name);
    if (tp.shards.empty()) throw InputError(tw + ": has no shards");
    if (tp.dtype != DType::f32 && tp.dtype != DType::f16 && tp.dtype != DType::bf16)
      throw InputError(tw + ": dtype must be fp32, fp16 or bf16");
    const double sw = static_cast<double>(dtype_size(tp.dtype));
    const double L = ts.pooling_size;
    auto add_shard = [&](int d, std::int64_t rows, int dim, double bags, double lookups,
                         bool exchanged) {
      if (d < 0 || d >= W)
        throw InputError(fmt::format("{}: shard on device {}, expected 0..{}", tw, d, W - 1));
      const EmbeddingShardWork w = detail::shard_work(tp, ts, rows, dim, bags, lookups,
                                                      embedding_key_bits(device_rows[d]), emb_io);
      // Row shards of one table share (rows, lookups): compute their cost once.
      const bool same = i == memo_table && rows == memo.rows && dim == memo.dim &&
                        bags == memo.bags && lookups == memo.lookups && w.key_bits == memo.key_bits;
      if (!same) {
        memo_cost = embedding_cost(w, dev, cal);
        memo_table = i;
        memo = w;
      }
      const EmbeddingCost& c = memo_cost;
      fwd[d] += c.forward_s;
      bwd[d] += c.backward_s;
      any_rows[d] = 1;
      any_heavy[d] |= c.heavy_ids > kEmbeddingHeavyRow ? 1 : 0;  // at least one heavy row
      host[d] += c.host_s;
      emb_bytes[d] += c.forward_bytes + c.backward_bytes;
      const double state_row = optimizer_state_bytes_per_row(tp.optimizer, dim);
      const double row_bytes = dim * sw + state_row;
      if (tp.placement == Placement::hbm) {
        weights_mem[d] += rows * dim * sw;
        state_mem[d] += rows * state_row;
      } else {
        const double cached = std::min<double>(static_cast<double>(tp.cache_rows), rows);
        // The engine's cache (src/engine/host_tables.h): the cached rows with their state; per
        // cache row its table row and a refresh's move (int64 each); per table row its cache
        // slot and its lookup count (uint32 each). The host holds every row, its state and a
        // copy of the slots.
        weights_mem[d] += std::max(cached, 1.0) * dim * sw;
        state_mem[d] += std::max(cached, 1.0) * state_row;
        cache_maps_mem[d] += cached * 16 + rows * 8;
        host_mem[d] += rows * (row_bytes + 4);
      }
      lookups_on[d] += lookups;
      bags_on[d] += bags;
      max_dim_on[d] = std::max<double>(max_dim_on[d], dim);
      if (exchanged) {
        a2a_send[d] += bags * dim * 4;
        io_mem[d] += 2 * bags * dim * 4;  // outputs out, gradients in
      }
    };
    auto whole = [&](const ShardPlan& s) {
      if (s.row_begin != 0 || s.row_end != ts.rows || s.col_begin != 0 || s.col_end != ts.dim)
        throw InputError(
            fmt::format("{}: a {}-sharded table's shard must hold rows [0, {}) and columns [0, {})",
                        tw, sharding_name(tp.sharding), ts.rows, ts.dim));
    };
    switch (tp.sharding) {
      case Sharding::table: {
        if (tp.shards.size() != 1)
          throw InputError(tw + ": table sharding needs exactly one shard");
        whole(tp.shards[0]);
        add_shard(tp.shards[0].device, ts.rows, ts.dim, G, G * L, true);
        break;
      }
      case Sharding::column: {
        int cols = 0;
        for (const auto& s : tp.shards) {
          if (s.col_end <= s.col_begin) throw InputError(tw + ": a column shard is empty");
          if (s.row_begin != 0 || s.row_end != ts.rows || s.col_end > ts.dim)
            throw InputError(fmt::format(
                "{}: a column shard must hold every row and columns within [0, {})", tw, ts.dim));
          cols += s.col_end - s.col_begin;
          add_shard(s.device, ts.rows, s.col_end - s.col_begin, G, G * L, true);
        }
        if (cols != ts.dim)
          throw InputError(
              fmt::format("{}: column shards cover {} of {} columns", tw, cols, ts.dim));
        break;
      }
      case Sharding::row: {
        std::int64_t rows = 0;
        for (const auto& s : tp.shards) {
          const std::int64_t r = s.row_end - s.row_begin;
          if (r <= 0) throw InputError(tw + ": a row shard is empty");
          if (s.col_begin != 0 || s.col_end != ts.dim || s.row_end > ts.rows)
            throw InputError(fmt::format(
                "{}: a row shard must hold every column and rows within [0, {})", tw, ts.rows));
          rows += r;
          add_shard(s.device, r, ts.dim, G, G * L * static_cast<double>(r) / ts.rows, false);
          rs_bytes[s.device] += G * ts.dim * 4;
          io_mem[s.device] += 2 * G * ts.dim * 4;
        }
        if (rows != ts.rows)
          throw InputError(fmt::format("{}: row shards cover {} of {} rows", tw, rows, ts.rows));
        break;
      }
      case Sharding::replicated: {
        if (tp.shards.size() != static_cast<std::size_t>(W))
          throw InputError(
              fmt::format("{}: a replicated table needs one shard per GPU ({})", tw, W));
        for (const auto& s : tp.shards) whole(s);
        for (int d = 0; d < W; ++d) add_shard(d, ts.rows, ts.dim, b, b * L, false);
        // Every replica's gradient is all-reduced and every row updated.
        replicated_allreduce_bytes += static_cast<double>(ts.rows) * ts.dim * 4;
        replicated_s += memory_pass_time(
            static_cast<double>(ts.rows) *
                (ts.dim * (2 * sw + 4) + 2 * optimizer_state_bytes_per_row(tp.optimizer, ts.dim)),
            dev, cal);
        break;
      }
    }
  }
  if (replicated_allreduce_bytes > 0)
    replicated_s +=
        collective_time(Collective::all_reduce, replicated_allreduce_bytes, W, dev, cal);

  for (int d = 0; d < W; ++d)
    if (any_rows[d]) bwd[d] += embedding_backward_fixed_seconds(any_heavy[d] != 0, cal);
  const double emb_fwd = *std::max_element(fwd.begin(), fwd.end());
  const double emb_bwd = *std::max_element(bwd.begin(), bwd.end());
  const double emb_host = *std::max_element(host.begin(), host.end());
  const double send = *std::max_element(a2a_send.begin(), a2a_send.end());
  const double rs = *std::max_element(rs_bytes.begin(), rs_bytes.end());
  const double a2a = W > 1 ? 2 * (collective_time(Collective::all_to_all, send, W, dev, cal) +
                                  collective_time(Collective::reduce_scatter, rs, W, dev, cal))
                           : 0;

  p.time_s["embedding_forward"] = emb_fwd;
  p.time_s["embedding_backward"] = emb_bwd + replicated_s;
  if (emb_host > 0) p.time_s["embedding_host_traffic"] = emb_host;
  for (const char* category : {"mlp", "interaction", "loss"})
    p.time_s[category] = dt.total(category);
  p.time_s["dense_optimizer"] = t_opt;
  if (W > 1) {
    p.time_s["embedding_exchange"] = a2a;
    p.time_s["dense_allreduce_exposed"] = exposed_allreduce;
  }
  p.step_s = 0;
  for (const auto& [name, t] : p.time_s) p.step_s += t;
  // The floor: every op at its roofline, with no launch or fixed cost: the dense ops' bytes over
  // the achieved copy bandwidth or their FLOPs over the achieved dense peak, whichever is longer,
  // the fullest device's embedding bytes and the optimizer's over the copy bandwidth.
  const double copy_bw = dev.hbm_bandwidth.value * cal.hbm_efficiency;
  const double dense_peak = dev.dense_flops(plan.dense_math) * cal.gemm_efficiency(plan.dense_math);
  p.floor_s = (*std::max_element(emb_bytes.begin(), emb_bytes.end()) + opt_bytes) / copy_bw;
  for (const OpCost& op : dense_ops)
    p.floor_s += std::max(op.bytes / copy_bw, op.flops / dense_peak);
  p.examples_per_s = G / p.step_s;
  p.examples_per_s_per_gpu = p.examples_per_s / W;

  // ---- memory: the fullest device ----
  // Saved activations in their storage type (detail::dense_memory), fp32 gradient scratch.
  const double dense_mem = P * 4 * (2 + k) + (low ? P * 2 : 0);
  const double act_mem = b * (dm.saved_bytes_per_example + dm.grad_bytes_per_example);
  // Received pooled outputs and their gradients (on one GPU the pooled outputs are x0's columns,
  // in the activations).
  const double pooled_mem = W > 1 ? 2 * b * m.embedding_output_dim() * 4 : 0.0;
  const double scratch_mem = dm.scratch_bytes(b);
  double worst = -1;
  for (int d = 0; d < W; ++d) {
    std::map<std::string, double> mem;
    mem["embedding_weights"] = weights_mem[d];
    mem["embedding_optimizer_state"] = state_mem[d];
    mem["dense_parameters_and_state"] = dense_mem;
    mem["activations"] = act_mem;
    if (W > 1) mem["embedding_io"] = io_mem[d] + pooled_mem;  // one GPU exchanges nothing
    mem["backend_scratch"] = scratch_mem;
    // The embedding backward's workspace (src/backend/gpu/embedding.h), sized for a quarter more
    // ids than the batch has: per id its sort keys and bags (double-buffered) and its segment
    // start; the heavy rows' chunk sums (one row of the widest dim, padded to 8, per chunk of
    // kChunk ids and per heavy row of more than kHeavyRow), and their merged sums (one per kMerge
    // chunks and per heavy row), with their indices (three per heavy row, two per chunk and per
    // merged sum).
    {
      constexpr double kIdsGrowth = 1.25, kChunk = 64, kHeavyRow = 64, kMerge = 64;
      const double n = kIdsGrowth * lookups_on[d];
      const double partial_row = std::ceil(max_dim_on[d] / 8) * 8 * 4;
      const double heavy = n / (kHeavyRow + 1), chunks = n / kChunk + heavy;
      const double merges = chunks / kMerge + heavy;
      mem["embedding_workspace"] =
          n * (4 * 4 + 4) + (chunks + merges) * (partial_row + 8) + heavy * 12;
    }
    // The input slots (src/engine/input_stager.h): two batches of dense features, labels, ids and
    // offsets, and the synthetic generator's workspace (two doubles per bag).
    mem["input_slots"] =
        2 * (b * m.dense_features * 4 + b * 4 + lookups_on[d] * 8 + (bags_on[d] + 1) * 8) +
        16 * bags_on[d];
    if (cache_maps_mem[d] > 0) mem["embedding_cache_maps"] = cache_maps_mem[d];
    mem["workspace"] = cal.workspace_bytes;
    mem["reserved"] = cal.reserved_bytes;
    double total = 0;
    for (const auto& [name, v] : mem) total += v;
    p.device_memory_bytes.push_back(total);
    if (total > worst) {
      worst = total;
      p.memory_bytes = mem;
      p.peak_device = d;
    }
  }
  p.peak_memory_bytes = worst;
  p.host_memory_bytes = *std::max_element(host_mem.begin(), host_mem.end());
  detail::check_finite_prediction(p, where, dev, cal);
  return p;
}

namespace detail {

void check_finite_prediction(const Prediction& p, const std::string& where, const DeviceSpec& dev,
                             const Calibration& cal) {
  std::vector<std::pair<std::string, double>> numbers{{"step_s", p.step_s},
                                                      {"peak_memory_bytes", p.peak_memory_bytes}};
  for (const auto& [name, v] : p.time_s) numbers.emplace_back("time_s." + name, v);
  for (const auto& [name, v] : numbers)
    if (!std::isfinite(v) || v < 0)
      throw InputError(fmt::format(
          "{} on {}: the predicted {} is {}; a rate in the device spec '{}' or the calibration "
          "'{}' is near zero or not a number (check its units)",
          where, dev.display_name, name, v, dev.source_file, cal.source));
}

}  // namespace detail

}  // namespace parity
