// The planner for HSTU models: the recipe (batch, recompute, table precision, dense math) that
// maximises predicted examples/s on one device, with the step's time and memory predicted from
// the same ops the engine runs (src/engine/hstu_model.cpp) and the same buffers it allocates.
//
// Why this shape: an HSTU step's activations grow with its tokens, and its tokens with the batch
// and the length distribution, so HBM capacity sets the batch. The engine sizes its per-token
// buffers for the plan's token capacity (perf.h token_capacity: nearly every batch's tokens), so
// the memory prediction is the engine's allocation at that capacity, term by term, and the
// batch is the largest whose memory fits, with recompute chosen when the larger batch it allows
// is faster. Time: the step's ops with their products (gemm_best), memory passes and the
// attention's own cost model (hstu_attention_cost), at the batch's average token count.
#include "hstu_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include "dense_cost.h"
#include "parity/backend.h"
#include "parity/embedding_kernels.h"
#include "parity/error.h"
#include "search.h"

namespace parity::detail {
namespace {

// The model's dims as the engine names them.
struct Dims {
  explicit Dims(const ModelSpec& m)
      : h(*m.hstu),
        d(h.model_dim),
        hv(static_cast<double>(h.heads) * h.value_dim),
        ha(static_cast<double>(h.heads) * h.attention_dim),
        proj(2 * hv + 2 * ha),
        layers(h.layers),
        contexts(m.num_tables()),
        features(static_cast<int>(h.sequence.features.size())),
        targets(h.sequence.targets),
        tasks(static_cast<int>(h.tasks.size())) {
    for (const TableSpec& t : m.tables) ctx_lookups += t.pooling_size;
  }
  const HstuSpec& h;
  double d, hv, ha, proj;
  int layers, contexts, features, targets, tasks;
  double ctx_lookups = 0;
};

// The step's ops in order, each built by the OpBuilder (the engine's products write fp32: its
// activations and gradients are fp32 between ops).
class Ops {
 public:
  Ops(DenseMath math, const DeviceSpec& dev, const Calibration& cal) : build_(math, dev, cal, 4) {}
  OpCost& add(std::string category, std::string op) {
    ops_.push_back({std::move(category), std::move(op)});
    return ops_.back();
  }
  // A product of average sizes, rounded to whole rows; checked row by row where `checked`.
  void product(OpCost& op, double m, double n, double k, bool checked = false) const {
    auto rows = [](double v) { return std::max<std::int64_t>(1, std::llround(v)); };
    if (checked)
      build_.checked_product(op, rows(m), rows(n), rows(k));
    else
      build_.product(op, rows(m), rows(n), rows(k));
  }
  void pass(OpCost& op, double bytes) const { build_.pass(op, bytes); }
  std::vector<OpCost> take() { return std::move(ops_); }

 private:
  OpBuilder build_;
  std::vector<OpCost> ops_;
};

std::string layer_op(int l, const char* what) {
  return fmt::format("layer.{} {}", l, what);
}

// The engine's buffers and the GPU backend's scratch for a plan, by the categories of
// HstuModel::allocated_bytes_by_category and the backend's internal memory.
std::map<std::string, double> hstu_memory(const ModelSpec& m, const SequenceMoments& sm,
                                          DenseMath math, bool recompute, double b, double T,
                                          const std::vector<DType>& table_dtypes,
                                          const std::vector<double>& table_rows,
                                          OptimizerKind emb_opt, const Calibration& cal,
                                          bool product_checks) {
  const Dims x(m);
  const double d = x.d, hv = x.hv, ha = x.ha, proj = x.proj, L = x.layers;
  const double C = x.contexts, BT = b * x.targets, tasks = x.tasks, F = x.features;
  std::map<std::string, double> mem;
  // Tables (the rows this device holds), in the engine's weight buffers, and their optimizer
  // state.
  const auto tables = hstu_tables(m);
  double weights = 0, state = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const double rows = table_rows[t], dim = tables[t]->dim;
    weights += rows * dim * static_cast<double>(dtype_size(table_dtypes[t]));
    state += rows * optimizer_state_bytes_per_row(emb_opt, tables[t]->dim);
  }
  mem["embedding_weights"] = weights;
  mem["embedding_optimizer_state"] = state;
  const double P = hstu_dense_parameters(m);
  mem["dense_parameters_and_state"] =
      P * 4 * (2 + optimizer_state_per_element(m.dense_optimizer.kind));
  // The row blocks list: per example those of the longest sequence.
  const double blocks = std::ceil(sm.tokens_max / kSequenceBlockRows);
  mem["input_slots"] =
      T * (16 * F + 8) + b * (x.ctx_lookups * 8 + 16 * C + 8 + 8 * blocks) + BT * (8 + 4 * tasks);
  const double kept = recompute ? 1 : L;  // layers of the recomputed buffers
  mem["activations"] = T * 4 * ((L + 1) * d + L * (proj + hv + 4) + kept * (d + proj + hv)) +
                       b * C * d * 4 + BT * (8 * d + 8 + 4 * tasks);
  mem["gradients"] = T * 4 * (3 * d + proj + 2 * hv) + BT * (4 * tasks + 4 * d) + b * C * d * 4;
  // The GPU backend's scratch slots (gpu_backend.cpp), each grown to kScratchGrowth times its
  // largest request: dz (the products' fp32 gradient, widest output), under bf16 its copy and the
  // bf16 copies of fp32 operands (a16: a product's input or the attention's q, k, v, dout; b16:
  // a weight gradient's input), and the layer norm backward's product.
  const bool bf16 = math == DenseMath::bf16;
  const double widest = std::max(proj, d);
  double scratch = T * widest * 4 + T * d * 4;
  if (bf16) {
    const double a16 = T * std::max({pad8(d), pad8(hv), 2 * pad8(ha) + 2 * pad8(hv)}) * 2;
    const double b16 = std::max(T * std::max(pad8(d), pad8(hv)) * 2, proj * pad8(d) * 2);
    scratch += T * widest * 2 + a16 + b16;
  }
  if (product_checks) {
    // The checks' slots (GpuBackend's forward_product): the deepest product's column sums and,
    // under bf16, the widest forward product in fp32 over its width plus two checksum columns
    // (the weights' copy with its checksum rows fits the b16 slot counted above).
    scratch += (3 * std::max(d, hv) + 1) * 8;
    if (bf16) scratch += T * pad8(std::max({proj, d, static_cast<double>(x.tasks)}) + 2) * 4;
  }
  mem["backend_scratch"] = kScratchGrowth * scratch;
  // The embedding backward's workspaces, one per table set (features, contexts), sized for a
  // quarter more ids than the largest batch has (as evaluate.cpp counts DLRM's).
  {
    const double ids_per_token = (sm.history * F + x.targets) / sm.tokens;
    double ws = 0;
    for (const double lookups : {T * ids_per_token, b * x.ctx_lookups}) {
      if (lookups <= 0) continue;
      constexpr double kIdsGrowth = 1.25, kChunk = 64, kHeavyRow = 64, kMerge = 64;
      const double n = kIdsGrowth * lookups;
      const double partial_row = pad8(d) * 4;
      const double heavy = n / (kHeavyRow + 1), chunks = n / kChunk + heavy;
      const double merges = chunks / kMerge + heavy;
      ws += n * (4 * 4 + 4) + (chunks + merges) * (partial_row + 8) + heavy * 12;
    }
    mem["embedding_workspace"] = ws;
  }
  mem["workspace"] = cal.workspace_bytes;
  mem["reserved"] = cal.reserved_bytes;
  return mem;
}

double total(const std::map<std::string, double>& m) {
  double s = 0;
  for (const auto& [k, v] : m) s += v;
  return s;
}

// Lookups one device makes per table and step: a feature's, one per history event (and per target
// for the first feature); a context's, its pooling size per example.
std::vector<double> own_lookups(const ModelSpec& m, const SequenceMoments& sm, double b) {
  const auto tables = hstu_tables(m);
  const auto features = m.hstu->sequence.features.size();
  std::vector<double> own(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t)
    own[t] = t < features ? b * (sm.history + (t == 0 ? m.hstu->sequence.targets : 0))
                          : b * tables[t]->pooling_size;
  return own;
}

// The memory of one device of a plan holding `rows` of each table: the engine's buffers
// (hstu_memory) and, on several GPUs, the exchange's: its ids, the rows it receives and their
// gradients, and the ids, rows and gradients of the lookups it serves.
std::map<std::string, double> hstu_device_memory(const Plan& plan, const ModelSpec& m,
                                                 const SequenceMoments& sm,
                                                 const std::vector<double>& rows,
                                                 const Calibration& cal) {
  const double b = static_cast<double>(plan.per_device_batch);
  const double capacity =
      plan.token_capacity > 0 ? static_cast<double>(plan.token_capacity) : b * sm.tokens_max;
  std::vector<DType> dtypes;
  for (const TablePlan& tp : plan.tables) dtypes.push_back(tp.dtype);
  std::map<std::string, double> mem =
      hstu_memory(m, sm, plan.dense_math, plan.recompute, b, capacity, dtypes, rows,
                  plan.embedding_optimizer, cal, plan.product_checks);
  if (plan.gpus > 1) {
    const auto tables = hstu_tables(m);
    const std::vector<double> own = own_lookups(m, sm, b);
    double io = 0;
    for (std::size_t t = 0; t < tables.size(); ++t) {
      if (plan.tables[t].sharding == Sharding::replicated) continue;  // looked up where it is
      const double per_id = 8 + 2 * tables[t]->dim * 4.0;
      const double served = plan.gpus * own[t] * rows[t] / static_cast<double>(tables[t]->rows);
      io += (own[t] + served) * per_id;
    }
    mem["embedding_io"] = io;
  }
  return mem;
}

// Rows of each table on each device, from the plan's shards: on one GPU every table is one shard;
// on several, every table is split by rows over the devices (a shard per device that holds rows,
// every column), or whole on one device.
std::vector<std::vector<double>> check_hstu_shape(const Plan& plan, const ModelSpec& m,
                                                  const std::string& where) {
  const auto tables = hstu_tables(m);
  const int W = plan.gpus;
  if (W < 1) throw InputError(fmt::format("{}: gpus must be >= 1, got {}", where, W));
  if (plan.per_device_batch < 1) throw InputError(where + ": per_device_batch must be >= 1");
  if (plan.global_batch != plan.per_device_batch * W)
    throw InputError(fmt::format("{}: global_batch {} is not per_device_batch {} x {} GPUs", where,
                                 plan.global_batch, plan.per_device_batch, W));
  if (plan.tables.size() != tables.size())
    throw InputError(
        fmt::format("{}: has {} tables, model '{}' has {} (its sequence features, "
                    "then its contextual tables)",
                    where, plan.tables.size(), m.name, tables.size()));
  std::vector<std::vector<double>> rows_on(tables.size(),
                                           std::vector<double>(static_cast<std::size_t>(W), 0));
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const TablePlan& tp = plan.tables[t];
    const std::int64_t R = tables[t]->rows;
    const int D = tables[t]->dim;
    const std::string tw = fmt::format("{}: table {} ('{}')", where, t, tp.name);
    if (tp.name != tables[t]->name)
      throw InputError(
          fmt::format("{} is not the model's table {} ('{}')", tw, t, tables[t]->name));
    if (tp.dtype != DType::f32 && tp.dtype != DType::f16 && tp.dtype != DType::bf16)
      throw InputError(tw + ": dtype must be fp32, fp16 or bf16");
    if (tp.placement != Placement::hbm)
      throw InputError(tw +
                       ": HSTU tables live in HBM (the engine does not run host-placed "
                       "ones yet)");
    const bool whole = tp.sharding == Sharding::table && tp.shards.size() == 1 &&
                       tp.shards[0].row_begin == 0 && tp.shards[0].row_end == R &&
                       tp.shards[0].col_begin == 0 && tp.shards[0].col_end == D &&
                       tp.shards[0].device >= 0 && tp.shards[0].device < W;
    if (W == 1 && !(whole && tp.shards[0].device == 0))
      throw InputError(
          fmt::format("{}: on one GPU a table is one shard holding rows [0, {}) and "
                      "columns [0, {}) on device 0",
                      tw, R, D));
    if (whole) {
      rows_on[t][static_cast<std::size_t>(tp.shards[0].device)] = static_cast<double>(R);
      continue;
    }
    if (tp.sharding == Sharding::replicated) {
      std::vector<bool> seen(static_cast<std::size_t>(W), false);
      for (const ShardPlan& sh : tp.shards) {
        if (sh.row_begin != 0 || sh.row_end != R || sh.col_begin != 0 || sh.col_end != D ||
            sh.device < 0 || sh.device >= W || seen[static_cast<std::size_t>(sh.device)])
          throw InputError(fmt::format(
              "{}: replicated, so each of its shards is the whole table on a device of its own",
              tw));
        seen[static_cast<std::size_t>(sh.device)] = true;
      }
      if (tp.shards.size() != static_cast<std::size_t>(W))
        throw InputError(
            fmt::format("{}: replicated on {} of the plan's {} GPUs", tw, tp.shards.size(), W));
      for (double& r : rows_on[t]) r = static_cast<double>(R);
      continue;
    }
    if (tp.sharding != Sharding::row || tp.shards.empty())
      throw InputError(fmt::format(
          "{}: on {} GPUs a table is split by rows (sharding row, shards of every column), "
          "whole on one device (sharding table, one shard) or on every device (replicated)",
          tw, W));
    std::vector<ShardPlan> shards = tp.shards;
    std::sort(shards.begin(), shards.end(),
              [](const ShardPlan& a, const ShardPlan& b) { return a.row_begin < b.row_begin; });
    std::int64_t next = 0;
    for (const ShardPlan& s : shards) {
      if (s.col_begin != 0 || s.col_end != D || s.row_begin != next || s.row_end <= s.row_begin ||
          s.device < 0 || s.device >= W)
        throw InputError(fmt::format(
            "{}: row shards must hold every column ([0, {})), lie on devices 0..{} and cover "
            "rows [0, {}) once in contiguous ranges; the shard from row {} does not",
            tw, D, W - 1, R, s.row_begin));
      rows_on[t][static_cast<std::size_t>(s.device)] += static_cast<double>(s.row_end - next);
      next = s.row_end;
    }
    if (next != R)
      throw InputError(fmt::format("{}: row shards cover rows [0, {}) of [0, {})", tw, next, R));
  }
  if (plan.dense_math == DenseMath::fp16)
    throw InputError(where + ": dense math fp16; HSTU models train in fp32, tf32 or bf16");
  return rows_on;
}

// The tables' layout on several GPUs: a table is replicated where all-reducing its gradient and
// updating every row costs less than exchanging its lookups' rows (as the DLRM sharding decides,
// sharding.cpp), else split by rows over the devices in equal contiguous ranges (whole on one
// device when it has fewer rows than devices). One GPU: every table one shard.
void shard_hstu_tables(Plan& p, const ModelSpec& m, const SequenceMoments& sm,
                       const DeviceSpec& dev, const Calibration& cal) {
  const auto tables = hstu_tables(m);
  const int W = p.gpus;
  const std::vector<double> own = own_lookups(m, sm, static_cast<double>(p.per_device_batch));
  auto marginal = [&](Collective kind, double bytes) {
    return collective_time(kind, bytes, W, dev, cal) - collective_time(kind, 1.0, W, dev, cal);
  };
  for (std::size_t t = 0; t < tables.size(); ++t) {
    TablePlan& tp = p.tables[t];
    const std::int64_t R = tables[t]->rows;
    const int D = tables[t]->dim;
    tp.shards.clear();
    if (W > 1) {
      const double rows = static_cast<double>(R);
      const double state = optimizer_state_bytes_per_row(tp.optimizer, D);
      const double sw = static_cast<double>(dtype_size(tp.dtype));
      const double replicate = marginal(Collective::all_reduce, rows * D * 4) +
                               memory_pass_time(rows * (D * (2 * sw + 4) + 2 * state), dev, cal) -
                               cal.kernel_launch_s;
      const double exchange = 2 * marginal(Collective::all_to_all, own[t] * D * 4.0);
      if (replicate < exchange) {
        tp.sharding = Sharding::replicated;
        for (int d = 0; d < W; ++d) tp.shards.push_back({d, 0, R, 0, D});
        continue;
      }
    }
    if (W == 1 || R < W) {
      tp.sharding = Sharding::table;
      tp.shards = {{static_cast<int>(t % static_cast<std::size_t>(W)), 0, R, 0, D}};
      continue;
    }
    tp.sharding = Sharding::row;
    for (int d = 0; d < W; ++d) tp.shards.push_back({d, R * d / W, R * (d + 1) / W, 0, D});
  }
}

}  // namespace

std::vector<const TableSpec*> hstu_tables(const ModelSpec& m) {
  std::vector<const TableSpec*> out;
  for (const TableSpec& t : m.hstu->sequence.features) out.push_back(&t);
  for (const TableSpec& t : m.tables) out.push_back(&t);
  return out;
}

double hstu_dense_parameters(const ModelSpec& m) {
  const Dims x(m);
  const double per_layer =
      2 * x.d + x.proj * x.d + x.proj + x.d * x.hv + x.d +
      static_cast<double>(x.h.heads) * (x.h.position_buckets + x.h.time_buckets);
  return x.layers * per_layer + 2 * x.d + x.tasks * x.d + x.tasks;
}

}  // namespace parity::detail

namespace parity {

std::vector<OpCost> hstu_op_costs(const ModelSpec& m, double examples, DenseMath math,
                                  bool recompute, const DeviceSpec& dev, const Calibration& cal,
                                  bool product_checks) {
  using namespace detail;
  const Dims x(m);
  const SequenceMoments sm = sequence_moments(m);
  const double T = examples * sm.tokens, BT = examples * x.targets;
  const double d = x.d, hv = x.hv, ha = x.ha, proj = x.proj;
  const bool bf16 = math == DenseMath::bf16;
  // Under bf16 every fp32 operand of a product or of the attention is rounded into scratch once
  // per call (read 4 bytes, write 2).
  const double convert = bf16 ? 6.0 : 0.0;
  const HstuAttentionCost att = hstu_attention_cost(m, examples, math, dev, cal);
  Ops ops(math, dev, cal);
  // The forward products go through linear_forward: checked where the checks are on.
  auto forward = [&](OpCost& op, double rows, double cols, double k) {
    ops.product(op, rows, cols, k, product_checks);
  };
  auto layer_norm_forward = [&](OpCost& op, double rows, double cols) {
    ops.pass(op, rows * (cols * 8 + 8));  // x in, y out, mean and rstd out
  };
  auto recompute_ops = [&](int l) {
    OpCost& op = ops.add("recompute", layer_op(l, "recompute"));
    layer_norm_forward(op, T, d);
    ops.pass(op, T * proj * 8);       // SiLU
    ops.pass(op, T * (hv * 12 + 8));  // norm-multiply
  };
  for (int l = 0; l < x.layers; ++l) {
    layer_norm_forward(ops.add("norms", layer_op(l, "norm forward")), T, d);
    {
      OpCost& op = ops.add("projections", layer_op(l, "projection forward"));
      ops.pass(op, (T * d + proj * d) * convert);
      forward(op, T, proj, d);
    }
    ops.pass(ops.add("projections", layer_op(l, "silu forward")), T * proj * 8);
    {
      OpCost& op = ops.add("attention", layer_op(l, "attention forward"));
      if (att.tensor_cores) ops.pass(op, T * (2 * ha + hv) * convert);
      op.flops += att.forward_flops;
      op.seconds += att.forward_s;
    }
    ops.pass(ops.add("norms", layer_op(l, "norm_mul forward")), T * (hv * 12 + 8));
    {
      OpCost& op = ops.add("projections", layer_op(l, "output forward"));
      ops.pass(op, (T * hv + d * hv) * convert);
      forward(op, T, d, hv);
    }
    ops.pass(ops.add("projections", layer_op(l, "residual forward")), T * d * 12);
  }
  {
    OpCost& op = ops.add("head", "head");
    ops.pass(op, BT * d * 8);  // the targets' rows gathered
    layer_norm_forward(op, BT, d);
    forward(op, BT, x.tasks, d);
  }
  {
    OpCost& op = ops.add("head", "head");
    ops.pass(op, BT * x.tasks * 12);  // the loss
    ops.product(op, BT, d, x.tasks);
    ops.product(op, x.tasks, d, BT);
    ops.pass(op, BT * d * 20);  // layer norm backward
    ops.pass(op, T * d * 4);    // the gradient of the last layer cleared
    ops.pass(op, BT * d * 12);  // and the targets' rows added into it
  }
  for (int l = x.layers - 1; l >= 0; --l) {
    if (recompute) recompute_ops(l);
    {
      OpCost& op = ops.add("projections", layer_op(l, "output backward"));
      ops.pass(op, T * d * 4 + (T * d + T * hv + d * hv) * convert);  // dbias; bf16 copies
      ops.product(op, T, hv, d);
      ops.product(op, d, hv, T);
    }
    ops.pass(ops.add("norms", layer_op(l, "norm_mul backward")), T * (hv * 20 + 8));
    {
      OpCost& op = ops.add("attention", layer_op(l, "attention backward"));
      if (att.tensor_cores) ops.pass(op, T * (2 * ha + 2 * hv) * convert);
      op.flops += att.backward_flops;
      op.seconds += att.backward_s;
    }
    {
      ops.pass(ops.add("projections", layer_op(l, "silu backward")), T * proj * 12);
      OpCost& op = ops.add("projections", layer_op(l, "projection backward"));
      ops.pass(op, T * proj * 4 + (T * proj + T * d + proj * d) * convert);
      ops.product(op, T, d, proj);
      ops.product(op, proj, d, T);
    }
    {
      OpCost& op = ops.add("norms", layer_op(l, "norm backward"));
      // x and dy read, dx and the dgamma product written; the product and dy read again by the
      // column sums of dgamma and dbeta.
      ops.pass(op, T * d * 24 + T * 8);
      ops.pass(op, T * d * 12);  // the residual's gradient
    }
  }
  return ops.take();
}

}  // namespace parity

namespace parity::detail {

Prediction evaluate_hstu_plan(const Plan& plan, const ModelSpec& m, const DeviceSpec& dev,
                              const Calibration& cal) {
  const std::string where = fmt::format("plan for model '{}'", plan.model);
  const std::vector<std::vector<double>> rows_on = check_hstu_shape(plan, m, where);
  if (plan.dense_math == DenseMath::tf32 && !dev.has_tf32())
    throw InputError(
        fmt::format("{}: dense math tf32 on {}, which has no TF32", where, dev.display_name));
  const Dims x(m);
  const SequenceMoments sm = sequence_moments(m);
  const int W = plan.gpus;
  const auto Wn = static_cast<std::size_t>(W);
  const double b = static_cast<double>(plan.per_device_batch);
  const double T = b * sm.tokens;
  Prediction p;
  p.memory_budget_bytes = dev.hbm_bytes.value;
  const std::vector<OpCost> ops =
      hstu_op_costs(m, b, plan.dense_math, plan.recompute, dev, cal, plan.product_checks);
  for (const OpCost& op : ops) p.time_s[op.category] += op.seconds;

  // ---- embeddings: the features' unpooled lookups (a bag per token), the contexts' pooled ----
  // On one GPU a device looks up its own batch. On several, every device sends its ids to the
  // devices holding their rows; each serves the lookups that fall in its rows (their share of
  // every device's, the ids taken as spread over the rows alike) and returns each looked-up row
  // on its own (one id a bag), which the requester adds into its tokens; the backward sends the
  // rows' gradients the same way back.
  const auto tables = hstu_tables(m);
  const std::vector<double> own = own_lookups(m, sm, b);
  std::vector<double> fwd(Wn, 0), bwd(Wn, 0), emb_bytes(Wn, 0);
  for (std::size_t d = 0; d < Wn; ++d) {
    double feature_rows = 0, context_rows = 0;
    for (std::size_t t = 0; t < tables.size(); ++t)
      (t < static_cast<std::size_t>(x.features) ? feature_rows : context_rows) += rows_on[t][d];
    // The sequence features' tables and the contexts' are two backwards, each with its fixed cost.
    bool runs[2] = {false, false}, heavy[2] = {false, false};
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const TableSpec& ts = *tables[t];
      const double r = rows_on[t][d];
      if (r <= 0) continue;
      const bool feature = t < static_cast<std::size_t>(x.features);
      const bool local = W == 1 || plan.tables[t].sharding == Sharding::replicated;
      const double served = local ? own[t] : W * own[t] * r / static_cast<double>(ts.rows);
      EmbeddingShardWork w;
      w.rows = static_cast<std::int64_t>(r);
      w.dim = ts.dim;
      w.bags = local ? (feature ? T : b) : served;
      w.lookups = served;
      w.weight_dtype = plan.tables[t].dtype;
      w.optimizer = plan.embedding_optimizer;
      w.distribution = ts.distribution;
      w.zipf_alpha = ts.zipf_alpha;
      w.key_bits = embedding_key_bits(feature ? feature_rows : context_rows);
      const EmbeddingCost c = embedding_cost(w, dev, cal);
      fwd[d] += c.forward_s;
      bwd[d] += c.backward_s;
      emb_bytes[d] += c.forward_bytes + c.backward_bytes;
      runs[feature ? 0 : 1] = true;
      heavy[feature ? 0 : 1] |= c.heavy_ids > kEmbeddingHeavyRow;  // at least one heavy row
    }
    for (int k = 0; k < 2; ++k)
      if (runs[k]) bwd[d] += embedding_backward_fixed_seconds(heavy[k], cal);
  }
  double emb_fwd = *std::max_element(fwd.begin(), fwd.end());
  double emb_bwd = *std::max_element(bwd.begin(), bwd.end());
  if (x.contexts > 0) {  // the contexts' rows added into their tokens, and gathered back
    emb_fwd += memory_pass_time(b * x.contexts * x.d * 12, dev, cal);
    emb_bwd += memory_pass_time(b * x.contexts * x.d * 8, dev, cal);
  }
  double own_ids = 0, own_rows = 0;  // bytes a device sends: its ids, its lookups' rows
  double replicated_grads = 0, replicated_update = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    if (W > 1 && plan.tables[t].sharding == Sharding::replicated) {
      // Every replica's gradient all-reduced, then every row updated.
      const double rows = static_cast<double>(tables[t]->rows), D = tables[t]->dim;
      replicated_grads += rows * D * 4;
      replicated_update +=
          rows * (D * (2 * static_cast<double>(dtype_size(plan.tables[t].dtype)) + 4) +
                  2 * optimizer_state_bytes_per_row(plan.embedding_optimizer, tables[t]->dim));
      continue;
    }
    own_ids += own[t] * 8;
    own_rows += own[t] * tables[t]->dim * 4.0;
  }
  if (replicated_grads > 0)
    emb_bwd += collective_time(Collective::all_reduce, replicated_grads, W, dev, cal) +
               memory_pass_time(replicated_update, dev, cal);
  if (W > 1 && own_rows > 0) {
    // The received rows added into their tokens (read the row and the token, write the token),
    // and in the backward the tokens' gradients gathered into rows to send.
    emb_fwd += memory_pass_time(own_rows * 3, dev, cal);
    emb_bwd += memory_pass_time(own_rows * 2, dev, cal);
    p.time_s["embedding_exchange"] =
        collective_time(Collective::all_to_all, own_ids, W, dev, cal) +
        2 * collective_time(Collective::all_to_all, own_rows, W, dev, cal);
  }
  p.time_s["embedding_forward"] = emb_fwd;
  p.time_s["embedding_backward"] = emb_bwd;
  // ---- the dense optimizer over every dense parameter (Adam: parameters, gradients, state) ----
  const double P = hstu_dense_parameters(m);
  const int k = optimizer_state_per_element(m.dense_optimizer.kind);
  const double opt_bytes = P * (4 * 3 + 8.0 * k);
  p.time_s["dense_optimizer"] = memory_pass_time(opt_bytes, dev, cal);
  if (W > 1) {
    // Data-parallel dense layers: their gradients all-reduced in buckets during the backward,
    // which hides up to allreduce_overlap of the backward's time (as for DLRM, evaluate.cpp).
    double backward = 0;
    for (const OpCost& op : ops)
      if (op.op.find("backward") != std::string::npos || op.category == "recompute")
        backward += op.seconds;
    const double allreduce = collective_time(Collective::all_reduce, P * 4, W, dev, cal);
    p.time_s["dense_allreduce_exposed"] =
        std::max(0.0, allreduce - cal.allreduce_overlap * backward);
  }
  // ---- the batch's layout copied in from pinned staging memory: per token each feature's id
  // and bag offset and the time; per example the contextual ids, their offsets and rows, the
  // sequence offset, and per target its row and labels ----
  const double input_bytes = T * (16 * x.features + 8) +
                             b * (x.ctx_lookups * 8 + 16 * x.contexts + 8) +
                             b * x.targets * (8 + 4 * x.tasks);
  p.time_s["input"] = input_bytes / (dev.host_link_bandwidth.value * cal.host_link_efficiency) +
                      10 * cal.kernel_launch_s;  // one copy per array
  p.step_s = 0;
  for (const auto& [name, t] : p.time_s) p.step_s += t;
  const double copy_bw = dev.hbm_bandwidth.value * cal.hbm_efficiency;
  const double peak = dev.dense_flops(plan.dense_math) * cal.gemm_efficiency(plan.dense_math);
  p.floor_s = (*std::max_element(emb_bytes.begin(), emb_bytes.end()) + opt_bytes) / copy_bw;
  for (const OpCost& op : ops) p.floor_s += std::max(op.bytes / copy_bw, op.flops / peak);
  p.examples_per_s = b * W / p.step_s;
  p.examples_per_s_per_gpu = b / p.step_s;

  // ---- memory: every device, the fullest reported ----
  double worst = -1;
  for (std::size_t d = 0; d < Wn; ++d) {
    std::vector<double> rows(tables.size());
    for (std::size_t t = 0; t < tables.size(); ++t) rows[t] = rows_on[t][d];
    std::map<std::string, double> mem = hstu_device_memory(plan, m, sm, rows, cal);
    const double sum = total(mem);
    p.device_memory_bytes.push_back(sum);
    if (sum > worst) {
      worst = sum;
      p.peak_device = static_cast<int>(d);
      p.memory_bytes = std::move(mem);
    }
  }
  p.peak_memory_bytes = worst;
  check_finite_prediction(p, where, dev, cal);
  return p;
}

namespace {

class HstuPlanner {
 public:
  HstuPlanner(const ModelSpec& m, const DeviceSpec& dev, int gpus, const PlannerOptions& opt)
      : m_(m),
        dev_(dev),
        W_(gpus),
        checks_(opt.product_checks),
        cal_(calibration_for(dev, opt.configs_dir)),
        sm_(sequence_moments(m)) {}

  // The dense maths the model allows and the device has, bf16 first (HSTU does not train in
  // fp16): the search takes the fastest by predicted examples/s, since the attention's kernels,
  // not only the products' peak, differ between them.
  std::vector<DenseMath> maths() const {
    std::vector<DenseMath> out;
    const auto& allowed = m_.allowed_dense_math;
    for (DenseMath c : {DenseMath::bf16, DenseMath::tf32, DenseMath::fp32}) {
      if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) continue;
      if (!dense_math_runs(c, dev_, checks_)) continue;
      out.push_back(c);
    }
    return out;
  }

  std::vector<DType> lowered_dtypes() const {
    const auto& allowed = m_.allowed_table_dtypes;
    auto allows = [&](DType d) {
      return std::find(allowed.begin(), allowed.end(), d) != allowed.end();
    };
    std::vector<DType> out;
    for (const TableSpec* t : hstu_tables(m_)) {
      DType d = t->dtype;
      if (dtype_size(d) > 2)
        d = allows(DType::f16) ? DType::f16 : allows(DType::bf16) ? DType::bf16 : d;
      out.push_back(d);
    }
    return out;
  }
  std::vector<DType> own_dtypes() const {
    std::vector<DType> out;
    for (const TableSpec* t : hstu_tables(m_)) out.push_back(t->dtype);
    return out;
  }

  Plan skeleton(const std::vector<DType>& dtypes, DenseMath math, bool recompute,
                std::int64_t b) const {
    Plan p;
    p.model = m_.name;
    p.model_file = plan_model_file(m_);
    p.device = dev_.name;
    p.gpus = W_;
    p.per_device_batch = b;
    p.global_batch = b * W_;
    p.dense_math = math;
    p.recompute = recompute;
    p.product_checks = checks_;
    p.token_capacity = static_cast<std::int64_t>(token_capacity(sm_, static_cast<double>(b)));
    p.embedding_optimizer = m_.embedding_optimizer.kind;
    p.calibration = cal_.source;
    const auto tables = hstu_tables(m_);
    for (std::size_t t = 0; t < tables.size(); ++t) {
      TablePlan tp;
      tp.name = tables[t]->name;
      tp.dtype = dtypes[t];
      tp.optimizer = p.embedding_optimizer;
      p.tables.push_back(std::move(tp));
    }
    shard_hstu_tables(p, m_, sm_, dev_, cal_);
    return p;
  }

  // The fullest device's memory at b examples per device (a row-split table's rounded-up share
  // on every device, a whole table counted as if on each).
  double memory(const std::vector<DType>& dtypes, DenseMath math, bool recompute,
                std::int64_t b) const {
    const Plan p = skeleton(dtypes, math, recompute, b);
    std::vector<double> rows;
    const auto tables = hstu_tables(m_);
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const auto R = static_cast<double>(tables[t]->rows);
      rows.push_back(p.tables[t].sharding == Sharding::row ? std::ceil(R / W_) : R);
    }
    return total(hstu_device_memory(p, m_, sm_, rows, cal_));
  }

  // The largest batch per device in [1, top / gpus] whose memory fits (0: none).
  std::int64_t largest_fitting(const std::vector<DType>& dtypes, DenseMath math,
                               bool recompute) const {
    const std::int64_t top =
        std::max<std::int64_t>(1, std::max(m_.max_global_batch, m_.batch_size) / W_);
    const double budget = dev_.hbm_bytes.value;
    if (memory(dtypes, math, recompute, 1) > budget) return 0;
    std::int64_t lo = 1, hi = top;  // lo fits; memory grows with the batch
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (memory(dtypes, math, recompute, mid) <= budget)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  // The fastest plan for fixed tables and math: each recompute setting at its largest fitting
  // batch; nullopt when not even one example fits.
  std::optional<Plan> best(const std::vector<DType>& dtypes, DenseMath math,
                           std::optional<bool> only_recompute = std::nullopt) const {
    std::optional<Plan> out;
    for (const bool rc : {false, true}) {
      if (only_recompute && *only_recompute != rc) continue;
      const std::int64_t b = largest_fitting(dtypes, math, rc);
      if (b == 0) continue;
      Plan p = skeleton(dtypes, math, rc, b);
      p.prediction = evaluate_hstu_plan(p, m_, dev_, cal_);
      if (!out || p.prediction.examples_per_s > out->prediction.examples_per_s * (1 + 1e-12))
        out = std::move(p);
    }
    return out;
  }

  const Calibration& calibration() const { return cal_; }
  const SequenceMoments& moments() const { return sm_; }

 private:
  const ModelSpec& m_;
  const DeviceSpec& dev_;
  int W_;
  bool checks_;  // PlannerOptions::product_checks
  Calibration cal_;
  SequenceMoments sm_;
};

std::string without(const std::optional<Plan>& w, const Plan& chosen) {
  if (!w) return "without it the model does not fit";
  return fmt::format("without it batch {} at {} examples/s, with it batch {} at {} ({:+.0f}%)",
                     w->global_batch, si_rate(w->prediction.examples_per_s), chosen.global_batch,
                     si_rate(chosen.prediction.examples_per_s),
                     100 * (chosen.prediction.examples_per_s / w->prediction.examples_per_s - 1));
}

}  // namespace

Plan make_hstu_plan(const ModelSpec& m, const DeviceSpec& dev, int gpus,
                    const PlannerOptions& opt) {
  if (gpus < 1) throw InputError(fmt::format("--gpus must be at least 1, got {}", gpus));
  HstuPlanner planner(m, dev, gpus, opt);
  const std::vector<DType> dtypes = planner.lowered_dtypes();
  std::optional<Plan> chosen;
  for (const DenseMath c : planner.maths()) {
    std::optional<Plan> p = planner.best(dtypes, c);
    if (p &&
        (!chosen || p->prediction.examples_per_s > chosen->prediction.examples_per_s * (1 + 1e-12)))
      chosen = std::move(p);
  }
  const DenseMath math = chosen ? chosen->dense_math : DenseMath::fp32;
  if (!chosen) {
    const auto tables = hstu_tables(m);
    double bytes = 0;
    for (std::size_t t = 0; t < tables.size(); ++t)
      bytes += static_cast<double>(tables[t]->rows) *
               (tables[t]->dim * static_cast<double>(dtype_size(dtypes[t])) +
                optimizer_state_bytes_per_row(m.embedding_optimizer.kind, tables[t]->dim));
    // Each GPU holds a 1/gpus share of the tables; the rest of one example's memory does not
    // shrink with more GPUs.
    const double one = planner.memory(dtypes, math, true, 1);
    const double fixed = one - bytes / gpus;
    const int need = fixed < 0.9 * dev.hbm_bytes.value
                         ? static_cast<int>(std::ceil(bytes / (0.9 * dev.hbm_bytes.value - fixed)))
                         : 0;
    throw InfeasibleError(fmt::format(
        "model '{}' does not fit on {} x {}: one example a GPU needs {} (its tables with their "
        "optimizer state {} in all, in {}, split by rows over the GPUs) against {} of HBM. To "
        "fit: {}",
        m.name, gpus, dev.display_name, gb(one), gb(bytes),
        dtype_name(dtypes.empty() ? DType::f32 : dtypes[0]), gb(dev.hbm_bytes.value),
        need > gpus ? fmt::format("about {} x {} hold the tables (--gpus {}), or smaller tables",
                                  need, dev.name, need)
                    : std::string("smaller tables or a shorter history")));
  }
  Plan plan = std::move(*chosen);
  const std::string on = fmt::format(" on {} x {}", gpus, dev.display_name);
  if (dtypes != planner.own_dtypes()) {
    int lowered = 0;
    std::string names;
    for (std::size_t t = 0; t < plan.tables.size(); ++t)
      if (plan.tables[t].dtype != hstu_tables(m)[t]->dtype) {
        names += (lowered++ ? ", " : "") + plan.tables[t].name;
      }
    plan.changes.push_back(
        {"table precision", fmt::format("fp32 ({} tables: {})", lowered, names),
         std::string(dtype_name(dtypes[0])),
         fmt::format("half the bytes per lookup and per update, and HBM left for activations; {}; "
                     "stochastic rounding in the update; allowed by recipe.table_dtypes",
                     without(planner.best(planner.own_dtypes(), math), plan))});
  }
  const auto& allowed = m.allowed_dense_math;
  if (plan.dense_math != DenseMath::fp32 &&
      std::find(allowed.begin(), allowed.end(), DenseMath::fp32) != allowed.end()) {
    const HstuAttentionCost att = hstu_attention_cost(m, static_cast<double>(plan.per_device_batch),
                                                      plan.dense_math, dev, planner.calibration());
    plan.changes.push_back(
        {"dense math", "fp32", std::string(dense_math_name(plan.dense_math)),
         fmt::format("the fastest dense math the model allows{} ({} TFLOP/s peak vs {} in fp32); "
                     "the attention runs {}; {}; master weights and optimizer stay fp32",
                     on, static_cast<int>(dev.dense_flops(plan.dense_math) / 1e12),
                     static_cast<int>(dev.fp32_flops.value / 1e12),
                     att.tensor_cores
                         ? "on tensor cores (bf16 operands, fp32 sums)"
                         : "the scalar fp32 kernels (" +
                               hstu_attention_scalar_reason(m, plan.dense_math, dev) + ")",
                     without(planner.best(dtypes, DenseMath::fp32), plan))});
  }
  const SequenceMoments& sm = planner.moments();
  if (plan.recompute) {
    plan.changes.push_back(
        {"activation recompute", "off", "on",
         fmt::format("the normed inputs, U/V/Q/K and the norm-multiply outputs are formed again in "
                     "the backward, so a larger batch fits{}; {}",
                     on, without(planner.best(dtypes, math, false), plan))});
  }
  if (plan.global_batch != m.batch_size) {
    const std::int64_t top = std::max(m.max_global_batch, m.batch_size);
    const std::string bound =
        plan.global_batch + gpus > top
            ? fmt::format("recipe.max_global_batch allows up to {} and it fits{}", top, on)
            : fmt::format("the largest batch whose memory fits{} ({} of {} predicted)", on,
                          gb(plan.prediction.peak_memory_bytes), gb(dev.hbm_bytes.value));
    plan.changes.push_back(
        {"global batch", fmt::format("{}", m.batch_size), fmt::format("{}", plan.global_batch),
         fmt::format("{}: {:.0f} tokens per step on average (token capacity {} a GPU: {:.0f} per "
                     "example, {:.0f} at most); {}",
                     bound, static_cast<double>(plan.global_batch) * sm.tokens, plan.token_capacity,
                     sm.tokens, sm.tokens_max, lr_change(m, plan.global_batch))});
  }
  // The products' token counts change every step: the backend ranks each with the catalog when
  // it first runs (no per-product choices in the plan).
  if (const auto catalog = gemm_catalog_for(dev, opt.configs_dir, opt.gemm_catalog))
    plan.gemm_catalog = {catalog->source_file, catalog->library, catalog->library_version};
  return plan;
}

ModelSpec apply_hstu_plan(const ModelSpec& model, const Plan& plan, std::int64_t batch) {
  if (plan.model != model.name)
    throw InputError(fmt::format("plan is for model '{}', not '{}'", plan.model, model.name));
  check_hstu_shape(plan, model, fmt::format("plan for model '{}'", plan.model));
  ModelSpec m = model;
  const int features = static_cast<int>(m.hstu->sequence.features.size());
  for (std::size_t t = 0; t < plan.tables.size(); ++t) {
    TableSpec& ts = static_cast<int>(t) < features
                        ? m.hstu->sequence.features[t]
                        : m.tables[t - static_cast<std::size_t>(features)];
    ts.dtype = plan.tables[t].dtype;
  }
  m.embedding_optimizer.kind = plan.embedding_optimizer;
  scale_to_batch(m, model, batch > 0 ? batch : plan.global_batch);
  return m;
}

void add_hstu_decisions(const Plan& plan, std::vector<PlanDecision>& out) {
  out.push_back(
      {"tokens", plan.token_capacity > 0
                     ? fmt::format("buffers for {} tokens a step (a larger batch grows them)",
                                   plan.token_capacity)
                     : std::string("buffers for the longest possible batch (no token_capacity)")});
  out.push_back({"recompute", plan.recompute ? "on: normed inputs, U/V/Q/K and norm-multiply "
                                               "outputs formed again in the backward"
                                             : "off"});
  std::map<std::string, int> by_dtype;
  for (const TablePlan& tp : plan.tables) ++by_dtype[std::string(dtype_name(tp.dtype))];
  std::string dtypes;
  for (const auto& [name, n] : by_dtype)
    dtypes += fmt::format("{}{} x{}", dtypes.empty() ? "" : ", ", name, n);
  out.push_back({"tables", fmt::format("{} stored natively ({}), all in HBM, updated by {}",
                                       plan.tables.size(), dtypes,
                                       optimizer_name(plan.embedding_optimizer))});
}

}  // namespace parity::detail
