// The co-design planner. For a model, a device and a GPU count it chooses the recipe
// that maximises predicted examples/s under the memory budget:
//   - dense math: the fastest precision the model allows that the device has;
//   - table optimizer and precision: the model's own, or the cheaper variants its recipe
//     allows (rowwise Adagrad, fp16/bf16 tables): allowed changes only ever cut bytes;
//   - global batch: the fastest from recipe.max_global_batch down to recipe.min_global_batch
//     (default: the reference batch_size), and below that only when none of those fits;
//   - sharding (several GPUs): replicated where that is cheaper than exchanging outputs,
//     split by columns or rows where one table would dominate a device, otherwise whole
//     tables, balanced by predicted cost (longest first onto the least loaded device)
//     (sharding.cpp); those rules decide by each catalog device's costs in turn, and every
//     distinct layout is evaluated on this device, so that the candidates are the same on
//     every device and no device's plan is beaten by another device's plan run on it;
//   - placement: HBM; the coldest tables move to host memory with an HBM cache only when
//     the device is full (placement.cpp).
// Every change to the model's numerics is listed with its reason, computed by planning
// again without it. Deterministic: no hash-order iteration, ties broken by index.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "hstu_plan.h"
#include "parity/error.h"
#include "parity/plan.h"
#include "search.h"

namespace parity {
namespace {

using detail::gb;

std::string pct(double x) {
  return fmt::format("{:+.0f}%", 100 * (x - 1));
}

struct Choice {
  std::int64_t global_batch = 0;
  DenseMath math = DenseMath::fp32;
  OptimizerKind optimizer = OptimizerKind::sgd;
  std::vector<DType> dtypes;  // per table
};

struct Built {
  detail::ShardingVariant variant;
  Plan plan;
  bool feasible = false;
  std::string why;       // when not feasible
  double shortfall = 0;  // bytes over budget on the worst device (or host)
};

class Planner {
 public:
  Planner(const ModelSpec& m, const DeviceSpec& dev, int gpus, const PlannerOptions& opt)
      : m_(m),
        dev_(dev),
        W_(gpus),
        opt_(opt),
        cal_(calibration_for(dev, opt.configs_dir)),
        catalog_(gemm_catalog_for(dev, opt.configs_dir, opt.gemm_catalog)) {
    // The costs the sharding rules decide by: this device's, then every other device's of the
    // catalog (several GPUs only; a configs directory without a device catalog gives its own).
    // A catalog (or a device's calibration) that does not load only narrows the candidates: the
    // user asked about this device, not about those files.
    views_.push_back({dev_, cal_});
    std::error_code ec;
    if (W_ > 1 && std::filesystem::is_directory(opt.configs_dir / "devices", ec)) {
      std::vector<DeviceSpec> catalog;
      try {
        catalog = load_device_catalog(opt.configs_dir / "devices");
      } catch (const InputError&) {
      }
      for (DeviceSpec& d : catalog) {
        const auto same_name = [](std::string_view a, std::string_view b) {
          return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
            return std::tolower(static_cast<unsigned char>(x)) ==
                   std::tolower(static_cast<unsigned char>(y));
          });
        };
        if (same_name(d.name, dev_.name)) continue;
        try {
          Calibration c = calibration_for(d, opt.configs_dir);
          views_.push_back({std::move(d), std::move(c)});
        } catch (const InputError&) {
        }
      }
    }
  }

  const Calibration& calibration() const { return cal_; }

  DenseMath best_math() const {
    // Fastest achievable rate; ties prefer bf16, fp16, tf32, fp32 (range first).
    DenseMath best = DenseMath::fp32;
    double best_rate = -1;
    for (DenseMath c : {DenseMath::bf16, DenseMath::fp16, DenseMath::tf32, DenseMath::fp32}) {
      if (std::find(m_.allowed_dense_math.begin(), m_.allowed_dense_math.end(), c) ==
          m_.allowed_dense_math.end())
        continue;
      if (!detail::dense_math_runs(c, dev_, opt_.product_checks)) continue;
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
    auto allows = [&](DType d) {
      return std::find(allowed.begin(), allowed.end(), d) != allowed.end();
    };
    for (const auto& t : m_.tables) {
      DType d = t.dtype;
      if (dtype_size(d) > 2) {  // fp16 keeps more mantissa than bf16 at the same cost
        if (allows(DType::f16))
          d = DType::f16;
        else if (allows(DType::bf16))
          d = DType::bf16;
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
    if (m_.min_global_batch > 0 && m_.min_global_batch < ref)
      out.push_back(round_to_gpus(m_.min_global_batch));  // the recipe's floor, searched too
    std::sort(out.begin(), out.end(), std::greater<>());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // Best feasible plan over the batch candidates for fixed numerics: the fastest among the
  // batches from recipe.min_global_batch (default: the reference) up to recipe.max_global_batch;
  // below that range only when none of those fits (then the largest that fits). nullopt when
  // nothing fits (last_failure_ then holds the smallest batch's failure).
  std::optional<Built> best_over_batches(Choice c) {
    std::optional<Built> best;
    const std::int64_t floor_batch = round_to_gpus(
        m_.min_global_batch > 0 ? std::min(m_.min_global_batch, m_.batch_size) : m_.batch_size);
    const std::size_t variants = W_ > 1 ? std::size(detail::kShardingVariants) : 1;
    for (std::int64_t g : batch_candidates()) {
      if (g < floor_batch && best) break;
      c.global_batch = g;
      std::vector<std::vector<TablePlan>> tried;  // the layouts evaluated at this batch
      for (std::size_t v = 0; v < variants; ++v)
        for (const View& view : views_) {
          std::optional<Built> b = build(c, detail::kShardingVariants[v], view, &tried);
          if (!b) continue;  // a layout evaluated already
          if (!b->feasible) {
            // What does not fit is told of this device's own layout.
            if (&view == &views_.front()) last_failure_ = *b;
            continue;
          }
          if (!best || b->plan.prediction.examples_per_s >
                           best->plan.prediction.examples_per_s * (1 + 1e-12))
            best = std::move(*b);
        }
      if (g < floor_batch && best) break;
    }
    return best;
  }

  // The costs the sharding rules decide a layout by.
  struct View {
    DeviceSpec dev;
    Calibration cal;
  };

  // The plan of choice c with the variant's layout decided by `view`'s costs, fitted to this
  // device's memory and evaluated here; nullopt when `tried` (the layouts evaluated already)
  // holds the same layout.
  std::optional<Built> build(const Choice& c, const detail::ShardingVariant& variant,
                             const View& view, std::vector<std::vector<TablePlan>>* tried) {
    Built out;
    out.variant = variant;
    Plan& p = out.plan;
    p.model = m_.name;
    p.model_file = detail::plan_model_file(m_);
    p.device = dev_.name;
    p.gpus = W_;
    p.global_batch = c.global_batch;
    p.per_device_batch = c.global_batch / W_;
    p.dense_math = c.math;
    p.product_checks = opt_.product_checks;
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
      detail::shard_tables(p, variant, m_, view.dev, view.cal);
    }
    if (tried != nullptr) {
      const auto same = [&](const std::vector<TablePlan>& t) {
        for (std::size_t i = 0; i < t.size(); ++i)
          if (t[i].sharding != p.tables[i].sharding || !(t[i].shards == p.tables[i].shards))
            return false;
        return true;
      };
      if (std::any_of(tried->begin(), tried->end(), same)) return std::nullopt;
      tried->push_back(p.tables);
    }
    const detail::Fit fit = detail::fit_memory(p, m_, dev_, cal_);
    out.feasible = fit.feasible;
    out.why = fit.why;
    out.shortfall = fit.shortfall;
    if (out.feasible) {
      choose_kernels(p);
      p.prediction = evaluate_plan(p, m_, dev_, cal_);
    }
    return out;
  }

  Built last_failure_;

 private:
  // The plan's kernel choices, ranked with the device's catalog where it has one, before the plan
  // is evaluated: its products are timed as the configurations they run (planned_product_times).
  // Made once a batch and dense math, the only inputs the choices depend on.
  void choose_kernels(Plan& p) {
    const auto key = std::make_pair(p.per_device_batch, p.dense_math);
    auto it = kernels_.find(key);
    if (it == kernels_.end())
      it = kernels_.emplace(key, plan_kernel_choices(p, m_, dev_, cal_, catalog_.get())).first;
    p.kernels = it->second;
    p.gemm_catalog = {};
    if (catalog_ != nullptr)
      p.gemm_catalog = {catalog_->source_file, catalog_->library, catalog_->library_version};
  }

  std::int64_t round_to_gpus(std::int64_t g) const {
    return std::max<std::int64_t>(W_, (g / W_) * W_);
  }

  const ModelSpec& m_;
  const DeviceSpec& dev_;
  int W_;
  PlannerOptions opt_;
  Calibration cal_;
  std::shared_ptr<const GemmCatalog> catalog_;  // the device's kernel catalog, if measured
  std::vector<View> views_;                     // this device's costs first
  std::map<std::pair<std::int64_t, DenseMath>, std::vector<KernelChoice>>
      kernels_;  // by batch, math
};

// Why a change was made, from the best plan without it.
std::string describe_without(const std::optional<Built>& without, const Plan& chosen) {
  if (!without) return "without it the model does not fit";
  const Plan& w = without->plan;
  int host_without = 0, host_with = 0;
  for (const auto& t : w.tables) host_without += t.placement == Placement::host;
  for (const auto& t : chosen.tables) host_with += t.placement == Placement::host;
  std::string s = fmt::format("without it {} examples/s, with it {} ({})",
                              detail::si_rate(w.prediction.examples_per_s),
                              detail::si_rate(chosen.prediction.examples_per_s),
                              pct(chosen.prediction.examples_per_s / w.prediction.examples_per_s));
  if (host_without > host_with)
    s += fmt::format("; without it {} more tables would live in host memory",
                     host_without - host_with);
  if (w.global_batch < chosen.global_batch)
    s += fmt::format("; without it the batch would drop to {}", w.global_batch);
  return s;
}

}  // namespace

Plan make_plan(const ModelSpec& m, const DeviceSpec& dev, int gpus, const PlannerOptions& opt) {
  if (gpus < 1) throw InputError(fmt::format("--gpus must be at least 1, got {}", gpus));
  if (m.kind == ModelKind::hstu) return detail::make_hstu_plan(m, dev, gpus, opt);
  require_dlrm(m, "the planner");
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
    std::string msg = fmt::format(
        "model '{}' does not fit on {} x {}: {} ({} over) at the smallest batch tried, {}. Tables "
        "with their "
        "optimizer state: {}. To fit:",
        m.name, gpus, dev.display_name, f.why, gb(f.shortfall), f.plan.global_batch, gb(tables));
    msg += fmt::format("\n  - more GPUs: about {} x {} hold the tables in HBM",
                       std::max(need, gpus + 1), dev.name);
    const auto& allowed = m.allowed_table_dtypes;
    if (std::find(allowed.begin(), allowed.end(), DType::f16) == allowed.end() &&
        std::find(allowed.begin(), allowed.end(), DType::bf16) == allowed.end())
      msg += "\n  - lower table precision: allowing fp16 in recipe.table_dtypes halves the weights";
    if (m.embedding_optimizer.kind == OptimizerKind::adagrad && !m.allow_rowwise_adagrad)
      msg +=
          "\n  - rowwise Adagrad: recipe.allow_rowwise_adagrad cuts the optimizer state to one "
          "float per row";
    msg += fmt::format(
        "\n  - host placement: {} of host memory per GPU is assumed (configs/devices/{}.yaml)",
        gb(dev.host_memory_bytes.value), dev.name);
    throw InfeasibleError(msg);
  }
  Plan plan = best->plan;

  // ---- recipe changes, each with its reason (plan again without it) ----
  const std::string on = fmt::format(" on {} x {}", gpus, dev.display_name);
  if (plan.embedding_optimizer != m.embedding_optimizer.kind) {
    Choice c = pref;
    c.optimizer = m.embedding_optimizer.kind;
    const auto without = planner.best_over_batches(c);
    const double state = static_cast<double>(m.embedding_rows()) * 4;
    plan.changes.push_back(
        {"embedding optimizer", std::string(optimizer_name(m.embedding_optimizer.kind)),
         std::string(optimizer_name(plan.embedding_optimizer)),
         fmt::format("one fp32 state per row ({}) instead of one per element ({}); {}; allowed "
                     "by recipe.allow_rowwise_adagrad",
                     gb(state), gb(static_cast<double>(m.embedding_parameters()) * 4),
                     describe_without(without, plan))});
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
      plan.changes.push_back(
          {"table precision",
           fmt::format("fp32 ({} tables: {}{})", lowered, names, lowered > 4 ? ", ..." : ""),
           std::string(dtype_name(plan.tables[0].dtype)),
           fmt::format("half the bytes per lookup and per update; {}; stochastic rounding in the "
                       "update; allowed by recipe.table_dtypes",
                       describe_without(without, plan))});
    }
  }
  if (plan.dense_math != DenseMath::fp32) {
    std::string reason =
        fmt::format("fastest dense math the model allows{} ({} TFLOP/s peak vs {} in fp32)", on,
                    static_cast<int>(dev.dense_flops(plan.dense_math) / 1e12),
                    static_cast<int>(dev.fp32_flops.value / 1e12));
    if (!dev.has_tf32())
      reason += "; " + dev.display_name + " has no TF32";
    else if (!dev.tf32_native() && plan.dense_math == DenseMath::tf32)
      reason += "; " + dev.display_name +
                " has no TF32 units: its library emulates TF32 with three bf16 products";
    if (plan.dense_math != DenseMath::tf32) reason += "; master weights and optimizer stay fp32";
    plan.changes.push_back(
        {"dense math", "fp32", std::string(dense_math_name(plan.dense_math)), reason});
  }
  if (plan.global_batch != m.batch_size) {
    const std::string lr = detail::lr_change(m, plan.global_batch);
    const bool allowed_smaller = plan.global_batch < m.batch_size && m.min_global_batch > 0 &&
                                 plan.global_batch >= m.min_global_batch;
    const std::string reason =
        allowed_smaller
            ? fmt::format(
                  "recipe.min_global_batch allows down to {} and the smaller batch is faster{} "
                  "(its activations leave HBM to tables); {}",
                  m.min_global_batch, on, lr)
        : plan.global_batch < m.batch_size
            ? fmt::format("no batch the recipe allows fits{}; {}", on, lr)
            : fmt::format(
                  "recipe.max_global_batch allows up to {} and the larger batch amortises per-step "
                  "costs; {}",
                  m.max_global_batch, lr);
    plan.changes.push_back({"global batch", fmt::format("{}", m.batch_size),
                            fmt::format("{}", plan.global_batch), reason});
  }
  {
    int host = 0;
    for (const auto& t : plan.tables) host += t.placement == Placement::host;
    if (host > 0)
      plan.changes.push_back(
          {"placement", "hbm", fmt::format("{} tables in host memory", host),
           "the tables do not all fit in HBM" + on +
               "; the coldest (fewest lookups per byte) live in host memory with "
               "an HBM cache of their hottest rows"});
  }
  {
    // Rowwise Adagrad keeps one state per row from the mean of the row's squared gradient; over a
    // column shard that mean is of the shard's columns, so the update differs from one process's.
    int split = 0;
    std::string names;
    if (plan.embedding_optimizer == OptimizerKind::rowwise_adagrad)
      for (const auto& t : plan.tables)
        if (t.sharding == Sharding::column) {
          if (split < 4) names += (split ? ", " : "") + t.name;
          ++split;
        }
    if (split > 0)
      plan.changes.push_back(
          {"rowwise Adagrad state", "one per row",
           fmt::format("one per row of each column shard ({} tables: {}{})", split, names,
                       split > 4 ? ", ..." : ""),
           "a table split by columns keeps each shard's row state from its own columns (the mean "
           "of their squared gradients), as TorchRec's column-wise sharding does: not the "
           "numerics of one process"});
  }
  return plan;
}

Plan port_plan(const Plan& source, const ModelSpec& m, const DeviceSpec& dev,
               const PlannerOptions& opt) {
  if (m.kind != ModelKind::hstu) require_dlrm(m, "the planner");
  Plan p = source;
  p.device = dev.name;
  p.changes.clear();
  if (p.dense_math == DenseMath::tf32 && !dev.has_tf32()) {
    p.dense_math = DenseMath::fp32;
    p.changes.push_back({"dense math", "tf32", "fp32",
                         dev.display_name + " has no TF32: the ported recipe falls back to fp32"});
  } else if (p.dense_math == DenseMath::tf32 && !dev.tf32_native()) {
    p.changes.push_back(
        {"dense math", "tf32", "tf32 (emulated)",
         dev.display_name + " has no TF32 units: its library runs TF32 as three bf16 products"});
  }
  const Calibration cal = calibration_for(dev, opt.configs_dir);
  p.calibration = cal.source;
  const auto catalog = gemm_catalog_for(dev, opt.configs_dir, opt.gemm_catalog);
  p.kernels = plan_kernel_choices(p, m, dev, cal, catalog.get());
  p.gemm_catalog = {};
  if (catalog != nullptr)
    p.gemm_catalog = {catalog->source_file, catalog->library, catalog->library_version};
  p.prediction = evaluate_plan(p, m, dev, cal);  // its products timed as the choices run them
  return p;
}

namespace {

// A table's shards lie within the table and cover it once (a replicated table: once per device):
// no row or column outside it, none twice, none left out.
void check_shards(const TablePlan& tp, const TableSpec& table, int gpus) {
  const std::string where =
      fmt::format("plan table '{}' ({} rows x {} columns)", tp.name, table.rows, table.dim);
  if (tp.shards.empty()) throw InputError(fmt::format("{}: has no shards", where));
  double area = 0;
  for (std::size_t i = 0; i < tp.shards.size(); ++i) {
    const ShardPlan& s = tp.shards[i];
    if (s.row_begin < 0 || s.row_end > table.rows || s.row_begin >= s.row_end || s.col_begin < 0 ||
        s.col_end > table.dim || s.col_begin >= s.col_end)
      throw InputError(
          fmt::format("{}: shard {} holds rows [{}, {}) and columns [{}, {}), "
                      "outside the table",
                      where, i, s.row_begin, s.row_end, s.col_begin, s.col_end));
    if (s.device < 0 || s.device >= gpus)
      throw InputError(fmt::format("{}: shard {} is on device {}, the plan has {} GPUs", where, i,
                                   s.device, gpus));
    area += static_cast<double>(s.row_end - s.row_begin) * (s.col_end - s.col_begin);
  }
  const std::size_t n = tp.shards.size();
  if (tp.sharding == Sharding::replicated) {  // a whole copy on every device
    std::vector<bool> seen(static_cast<std::size_t>(gpus), false);
    for (std::size_t i = 0; i < n; ++i) {
      const ShardPlan& s = tp.shards[i];
      if (s.row_begin != 0 || s.row_end != table.rows || s.col_begin != 0 ||
          s.col_end != table.dim || seen[static_cast<std::size_t>(s.device)])
        throw InputError(fmt::format(
            "{}: replicated, so each of its {} shards is the whole table on a device of its own; "
            "shard {} is not",
            where, gpus, i));
      seen[static_cast<std::size_t>(s.device)] = true;
    }
    if (n != static_cast<std::size_t>(gpus))
      throw InputError(fmt::format("{}: replicated on {} of the plan's {} GPUs", where, n, gpus));
    return;
  }
  if (n <= 4096)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) {
        const ShardPlan &a = tp.shards[i], &b = tp.shards[j];
        if (a.row_begin < b.row_end && b.row_begin < a.row_end && a.col_begin < b.col_end &&
            b.col_begin < a.col_end)
          throw InputError(fmt::format("{}: shards {} and {} overlap", where, i, j));
      }
  if (area != static_cast<double>(table.rows) * table.dim)
    throw InputError(fmt::format("{}: the shards cover {:.0f} of its {} entries", where, area,
                                 table.rows * table.dim));
}

}  // namespace

ModelSpec apply_plan(const ModelSpec& model, const Plan& plan, std::int64_t batch) {
  if (model.kind == ModelKind::hstu) return detail::apply_hstu_plan(model, plan, batch);
  require_dlrm(model, "the planner");
  if (plan.model != model.name)
    throw InputError(fmt::format("plan is for model '{}', not '{}'", plan.model, model.name));
  if (plan.tables.size() != model.tables.size())
    throw InputError(fmt::format("plan has {} tables, model '{}' has {}", plan.tables.size(),
                                 model.name, model.tables.size()));
  ModelSpec m = model;
  for (std::size_t t = 0; t < m.tables.size(); ++t) {
    if (plan.tables[t].name != m.tables[t].name)
      throw InputError(fmt::format("plan table {} is '{}', the model's is '{}'", t,
                                   plan.tables[t].name, m.tables[t].name));
    m.tables[t].dtype = plan.tables[t].dtype;
    check_shards(plan.tables[t], m.tables[t], plan.gpus);
    m.tables[t].host_placed = plan.tables[t].placement == Placement::host;
    m.tables[t].cache_rows = m.tables[t].host_placed ? plan.tables[t].cache_rows : 0;
    if (m.tables[t].cache_rows > m.tables[t].rows)
      throw InputError(fmt::format("plan table {} ('{}'): cache_rows is {}, more than its {} rows",
                                   t, m.tables[t].name, m.tables[t].cache_rows, m.tables[t].rows));
  }
  m.embedding_optimizer.kind = plan.embedding_optimizer;
  detail::scale_to_batch(m, model, batch > 0 ? batch : plan.global_batch);
  return m;
}

bool fits(const Prediction& p, const DeviceSpec& device) {
  return p.peak_memory_bytes <= p.memory_budget_bytes &&
         p.host_memory_bytes <= device.host_memory_bytes.value;
}

}  // namespace parity
