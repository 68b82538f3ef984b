// parity train: progress on a terminal as a bar, elsewhere as plain lines.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"
#include "core/atomic_file.h"
#include "core/host_memory.h"
#include "parity/dist.h"
#include "parity/error.h"
#include "parity/plan.h"
#include "parity/select.h"
#include "parity/train.h"

namespace parity::cli {
namespace {

std::string si(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.1f}", v);
}

class ConsoleObserver : public TrainObserver {
 public:
  ConsoleObserver() : tty_(::isatty(::fileno(stdout)) != 0) {}

  void on_event(const TrainEvent& e) override {
    using K = TrainEvent::Kind;
    switch (e.kind) {
      case K::start:
        fmt::print("parity train: {}\n", e.message);
        break;
      case K::progress:
        progress(e);
        break;
      case K::eval:
        end_bar();
        fmt::print(
            "eval  step {:>7}  AUC {:.4f}  log loss {:.4f}{}\n", e.step, e.auc, e.eval_log_loss,
            e.teacher_auc > 0 ? fmt::format("  (teacher ceiling AUC {:.4f})", e.teacher_auc) : "");
        if (!e.message.empty()) fmt::print("      {}\n", e.message);
        break;
      case K::checkpoint:
        end_bar();
        fmt::print("checkpoint  step {:>7}  {}\n", e.step, e.message);
        break;
      case K::warning:
        end_bar();
        fmt::print(stderr, "warning: {}\n", e.message);
        break;
      case K::done:
        end_bar();
        fmt::print("done  {} steps  {} examples/s{}  final loss {:.4f}  AUC {:.4f}\n", e.step,
                   si(e.examples_per_s),
                   e.steady_examples_per_s > 0
                       ? fmt::format(" ({} after the first 2 steps)", si(e.steady_examples_per_s))
                       : std::string(),
                   e.loss, e.auc);
        break;
    }
    std::fflush(stdout);
  }

 private:
  void progress(const TrainEvent& e) {
    const std::string stats = fmt::format("{:.1f} steps/s  {} ex/s  loss {:.4f}", e.steps_per_s,
                                          si(e.examples_per_s), e.loss);
    if (tty_) {
      std::string bar;
      if (e.total_steps > 0) {
        constexpr int kWidth = 30;
        const int filled = static_cast<int>(kWidth * e.step / e.total_steps);
        bar = fmt::format("[{}{}] {}/{}", std::string(filled, '#'),
                          std::string(kWidth - filled, '-'), e.step, e.total_steps);
      } else {
        bar = fmt::format("step {}", e.step);
      }
      fmt::print("\r\033[K{}  {}", bar, stats);
      bar_open_ = true;
      return;
    }
    // Plain lines: about every 10% of the run, at least every 10 s, and at the end.
    const auto now = std::chrono::steady_clock::now();
    const bool tenth = e.total_steps > 0 && e.step * 10 / e.total_steps != last_tenth_;
    const bool slow = now - last_line_ > std::chrono::seconds(10);
    if (tenth || slow || e.step == e.total_steps) {
      if (e.total_steps > 0) last_tenth_ = e.step * 10 / e.total_steps;
      last_line_ = now;
      fmt::print("step {:>7}{}  {}\n", e.step,
                 e.total_steps > 0 ? fmt::format("/{}", e.total_steps) : "", stats);
    }
  }
  void end_bar() {
    if (bar_open_) fmt::print("\n");
    bar_open_ = false;
  }

  bool tty_;
  bool bar_open_ = false;
  std::int64_t last_tenth_ = 0;
  std::chrono::steady_clock::time_point last_line_ = std::chrono::steady_clock::now();
};

// The step by op category (device timing marks) beside the plan's prediction for it.
void print_profile(const TrainResult& r, const Plan* plan, const ModelSpec& model,
                   std::int64_t batch) {
  if (r.profiled_steps == 0) {
    fmt::print(
        "profile: no step was profiled (the first two steps are warm-up; train more steps)\n");
    return;
  }
  fmt::print("\nstep profile: device timing marks, mean of {} steps (ms per step){}\n",
             r.profiled_steps, plan != nullptr ? ", beside the plan's prediction" : "");
  std::map<std::string, double> predicted;
  if (plan != nullptr) predicted = plan->prediction.time_s;
  std::set<std::string> names;
  for (const auto& [k, v] : r.profile_ms_per_step) names.insert(k);
  for (const auto& [k, v] : predicted) names.insert(k);
  double measured_total = 0, predicted_total = 0;
  fmt::print("  {:<26} {:>10} {:>10}\n", "category", "measured", plan != nullptr ? "plan" : "");
  for (const auto& name : names) {
    const auto m = r.profile_ms_per_step.find(name);
    const auto p = predicted.find(name);
    const std::string ms =
        m != r.profile_ms_per_step.end() ? fmt::format("{:.3f}", m->second) : "-";
    const std::string ps =
        p != predicted.end() ? fmt::format("{:.3f}", p->second * 1e3) : (plan ? "-" : "");
    if (m != r.profile_ms_per_step.end()) measured_total += m->second;
    if (p != predicted.end()) predicted_total += p->second * 1e3;
    fmt::print("  {:<26} {:>10} {:>10}\n", name, ms, ps);
  }
  fmt::print("  {:<26} {:>10.3f} {:>10}\n", "sum of categories", measured_total,
             plan != nullptr ? fmt::format("{:.3f}", predicted_total) : "");
  // Work beside the step's own: the batch made on the device shares the device with the step
  // before, slowing whichever sections it overlaps; the plan does not count it.
  for (const auto& [name, ms] : r.profile_beside_ms_per_step)
    fmt::print("  {:<26} {:>10.3f} {:>10}  (beside the step: making the next batch)\n", name, ms,
               plan != nullptr ? "-" : "");
  // The plan's dense ops (HSTU: every op but the embeddings), as the planner predicts them at the
  // plan's batch per device.
  std::map<std::string, double> predicted_ops;
  if (plan != nullptr) {
    const DeviceSpec dev = find_device(plan->device, configs_dir() / "devices");
    const Calibration cal = calibration_for(dev, configs_dir());
    const ProductTimes times = planned_product_times(*plan, model);
    const std::vector<OpCost> ops =
        model.kind == ModelKind::hstu
            ? hstu_op_costs(model, static_cast<double>(plan->per_device_batch), plan->dense_math,
                            plan->recompute, dev, cal, plan->product_checks)
            : dense_op_costs(model, plan->per_device_batch, plan->dense_math, dev, cal,
                             plan->product_checks, times.empty() ? nullptr : &times);
    for (const OpCost& op : ops) predicted_ops[op.category + ": " + op.op] += op.seconds * 1e3;
  }
  fmt::print("  by op (device, plan, and the host's time from the op's mark to the next):\n");
  for (const auto& [op, ms] : r.profile_ops_ms_per_step) {
    const auto p = predicted_ops.find(op);
    const auto h = r.profile_host_ops_ms_per_step.find(op);
    fmt::print(
        "    {:<40} {:>10.3f} {:>10} {:>10}\n", op, ms,
        p != predicted_ops.end() ? fmt::format("{:.3f}", p->second) : "",
        h != r.profile_host_ops_ms_per_step.end() ? fmt::format("host {:.3f}", h->second) : "");
  }
  // The profiled steps are the steady ones: their wall time is the steady rate's.
  const double rate = r.steady_examples_per_s > 0 ? r.steady_examples_per_s : r.examples_per_s;
  if (rate > 0)
    fmt::print("  {:<26} {:>10.3f} {:>10}\n", "wall time per step",
               1e3 * static_cast<double>(batch) / rate,
               plan != nullptr ? fmt::format("{:.3f}", plan->prediction.step_s * 1e3) : "");
  // The model's buffers and the backend's own memory beside the plan's memory by category: where
  // the names agree the two are the same memory; the plan's workspace and reserved (the library's
  // workspace, the runtime's reserve) are not measured here.
  fmt::print("\nmodel buffers and the backend's scratch and workspaces in backend memory (GB){}\n",
             plan != nullptr ? ", beside the plan's memory prediction" : "");
  // The backend's own memory joins the model's under the plan's names: its scratch slots, held
  // copies and loss partials as backend_scratch, its embedding workspace as it is.
  std::map<std::string, std::size_t> measured = r.model_memory_bytes;
  for (const auto& [k, v] : r.backend_memory_bytes)
    measured[k == "embedding_workspace" ? k : std::string("backend_scratch")] += v;
  std::set<std::string> mem_names;
  for (const auto& [k, v] : measured) mem_names.insert(k);
  if (plan != nullptr)
    for (const auto& [k, v] : plan->prediction.memory_bytes) mem_names.insert(k);
  double model_total = 0;
  for (const auto& name : mem_names) {
    const auto m = measured.find(name);
    std::string ps;
    if (plan != nullptr) {
      const auto p = plan->prediction.memory_bytes.find(name);
      ps = p != plan->prediction.memory_bytes.end() ? fmt::format("{:.3f}", p->second / 1e9) : "-";
    }
    if (m != measured.end()) model_total += static_cast<double>(m->second);
    fmt::print(
        "  {:<26} {:>10} {:>10}\n", name,
        m != measured.end() ? fmt::format("{:.3f}", static_cast<double>(m->second) / 1e9) : "-",
        ps);
  }
  fmt::print(
      "  {:<26} {:>10.3f} {:>10}\n", "total", model_total / 1e9,
      plan != nullptr ? fmt::format("{:.3f}", plan->prediction.peak_memory_bytes / 1e9) : "");
  if (!r.cache.empty()) {
    fmt::print(
        "\nhost-placed tables: {:.3f} GB of host memory{}; cache hits since each cache was "
        "last re-chosen\n",
        static_cast<double>(r.host_resident_bytes) / 1e9,
        plan != nullptr ? fmt::format(" (plan {:.3f} GB)", plan->prediction.host_memory_bytes / 1e9)
                        : "");
    fmt::print("  {:<20} {:>12} {:>12} {:>12} {:>10} {:>10}\n", "table", "rows", "cached",
               "lookups", "hit rate", "predicted");
    for (const auto& c : r.cache) {
      std::string predicted;
      for (const TableSpec& t : model.tables)
        if (t.name == c.table)
          predicted = fmt::format("{:.3f}", hot_fraction(t.rows, t.distribution, t.zipf_alpha,
                                                         static_cast<double>(c.cache_rows)));
      fmt::print(
          "  {:<20} {:>12} {:>12} {:>12} {:>10} {:>10}\n", c.table, c.rows, c.cache_rows, c.lookups,
          c.lookups > 0
              ? fmt::format("{:.3f}", static_cast<double>(c.hits) / static_cast<double>(c.lookups))
              : "-",
          predicted);
    }
    fmt::print(
        "  {} cache refreshes took {:.3f} s of the run (in its wall time, not in the "
        "categories)\n",
        r.cache_refreshes, r.cache_refresh_s);
  }
  std::string first;
  for (std::size_t i = 0; i < r.first_steps_s.size(); ++i)
    first += fmt::format(", step {} {:.1f} ms", i + 1, 1e3 * r.first_steps_s[i]);
  fmt::print(
      "  one-time costs (not in the rates after warm-up): first batch staged {:.1f} ms, step's "
      "workspaces and "
      "plans prepared {:.1f} ms{}\n",
      1e3 * r.first_batch_s, 1e3 * r.prepare_s, first);
}

struct TrainArgs {
  std::string model = "tiny";
  std::int64_t steps = 0, batch = 0, eval_examples = 32768, eval_every = 250;
  std::int64_t checkpoint_every = 0, keep_checkpoints = 2;
  std::uint64_t seed = 1;
  double memory_limit_gb = 0;
  std::string health_ledger;
  bool allow_quarantined = false;
  bool product_checks = false, no_replay = false;
  double spike_factor = 0;
  std::string inject_fault;
  std::string inject_table_fault;
  std::int64_t loss_window = 100;
  std::string loss_log;
  std::string checkpoint, backend = "auto", on_bad_line = "stop", plan, dense_math, gemm_catalog;
  // auto: the plan's choices where its catalog is this GPU's, else the BLAS library's own.
  std::string gemm_selection = "auto";
  // The collectives' engine: auto (none for one process; NCCL under a GPU backend where built,
  // else MPI), mpi or nccl (those two for one process too).
  std::string collectives = "auto";
  double bucket_mb = static_cast<double>(Model::kDenseBucket) / (1 << 20);
  bool resume = false, profile = false, no_plan = false;
  std::vector<std::string> data, eval_data;
};

// The ranks this process is one of (mpirun, Slurm, torchrun-style variables; one process when
// none), read once at the start of parity train. Only rank 0 prints the run's progress.
ProcessGroupInfo g_group;

// What this run can execute: one device (the catalog key of `gpu`, the detected GPU's name or
// empty for the cpu backend), the host memory available now, and whether a GPU backend runs it.
ExecutionTarget execution_target(const std::string& gpu) {
  ExecutionTarget t;
  t.gpus = g_group.world;
  t.gpu_backend = !gpu.empty();
  if (t.gpu_backend) {
    if (const auto dev = match_device(gpu, configs_dir() / "devices")) t.device = dev->name;
  }
  if (const auto avail = host_memory_available()) t.host_memory_bytes = static_cast<double>(*avail);
  return t;
}

// The plan's kernel catalog file: as the plan names it, else the file of that name in
// configs/calibration (a plan made in another checkout).
std::filesystem::path plan_catalog_file(const std::string& named) {
  std::error_code ec;
  if (std::filesystem::exists(named, ec)) return named;
  const auto here = configs_dir() / "calibration" / std::filesystem::path(named).filename();
  if (std::filesystem::exists(here, ec)) return here;
  throw InputError(
      fmt::format("the plan's field gemm_catalog.file names {}, which does not exist "
                  "(nor {}): make the plan here again, or pass "
                  "--gemm-selection heuristic",
                  named, here.string()));
}

// The plan's kernel choices as the GPU backend takes them: its catalog, each product's
// configurations looked up in it (a key the catalog does not hold is a bad plan).
struct PlanKernels {
  std::shared_ptr<const GemmCatalog> catalog;
  std::vector<GemmDecision> decisions;
};

PlanKernels load_plan_kernels(const Plan& plan, const TrainArgs& args) {
  const std::string where = args.plan.empty() ? std::string("the plan") : "plan " + args.plan;
  PlanKernels out;
  out.catalog = std::make_shared<const GemmCatalog>(
      load_gemm_catalog(plan_catalog_file(plan.gemm_catalog.file)));
  const GemmCatalog& catalog = *out.catalog;
  if (catalog.device != plan.device)
    throw InputError(
        fmt::format("{}: field 'gemm_catalog.file' names {}, a kernel catalog of {}; "
                    "the plan is for {}",
                    where, catalog.source_file, catalog.device, plan.device));
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    const KernelChoice& kc = plan.kernels[i];
    if (kc.ranked.empty()) continue;
    GemmDecision d{kc.op, kc.problem, {}};
    for (std::size_t j = 0; j < kc.ranked.size(); ++j) {
      GemmKernel k;
      if (!find_catalog_kernel(catalog, kc.problem, kc.ranked[j], k))
        throw InputError(fmt::format(
            "{}: field 'kernels[{}].ranked[{}]': '{}' is not a configuration of the kernel "
            "catalog {} for {} products (make the plan again with this catalog)",
            where, i, j, kc.ranked[j], catalog.source_file, kc.problem.describe()));
      d.ranked.push_back(k);
    }
    out.decisions.push_back(std::move(d));
  }
  return out;
}

// The kernel choices a GPU run takes from its plan, if any: asked (plan: a plan that cannot say
// why, a bad one stops the run), or by default (auto) where the plan ranked its products with a
// catalog of this GPU, a DLRM plan (an HSTU plan names the catalog alone, and its products
// ranked when they first run are not measured against the library's), a plan whose choices do
// not load here printed and left to the library.
std::optional<PlanKernels> plan_kernels_for(const Plan& plan, const TrainArgs& args,
                                            const std::string& device) {
  if (args.gemm_selection == "heuristic") return std::nullopt;
  const bool here = !plan.gemm_catalog.empty() && !device.empty() && device == plan.device;
  if (args.gemm_selection == "auto") {
    const bool ranked = std::any_of(plan.kernels.begin(), plan.kernels.end(),
                                    [](const KernelChoice& k) { return !k.ranked.empty(); });
    if (!here || !ranked) return std::nullopt;
    try {
      return load_plan_kernels(plan, args);
    } catch (const InputError& e) {
      fmt::print(
          "parity train: the plan's kernel choices do not run here ({}); every product takes "
          "the BLAS library's own choice (--gemm-selection plan stops instead)\n",
          e.what());
      return std::nullopt;
    }
  }
  if (!here) {
    fmt::print(
        "parity train: --gemm-selection plan: {}; every product takes the BLAS library's "
        "own choice\n",
        plan.gemm_catalog.empty()
            ? fmt::format("the plan has no kernel catalog ({} has none measured)", plan.device)
            : fmt::format("the plan's choices are for {} and this GPU is {}", plan.device,
                          device.empty() ? std::string("not in the catalog") : device));
    return std::nullopt;
  }
  return load_plan_kernels(plan, args);
}

// Trains `model` with the recipe of `plan` (its batch, table precisions, optimizer and dense
// math) after the plan check: every decision executed, or the run refused before anything is
// allocated; apply_plan scales the learning rates when --batch overrides the plan's batch. Prints
// what runs under `title`. gpu: the detected GPU's name (empty for the cpu backend).
void train_as_planned(TrainConfig& cfg, const ModelSpec& model, const Plan& plan,
                      const TrainArgs& args, const std::string& gpu, const std::string& title) {
  ExecutionTarget target = execution_target(gpu);
  std::optional<PlanKernels> kernels;
  if (!gpu.empty()) kernels = plan_kernels_for(plan, args, target.device);
  target.plan_kernels = kernels.has_value();
  const std::vector<PlanDecision> decisions = check_plan(plan, model, target, args.batch);
  cfg.model = apply_plan(model, plan, args.batch);
  cfg.batch = plan.global_batch;
  cfg.dense_math = plan.dense_math;
  cfg.token_capacity = plan.token_capacity;
  cfg.recompute = plan.recompute;
  cfg.product_checks = plan.product_checks;
  // --batch: the plan's token capacity was for its own batch.
  if (plan.token_capacity > 0 && args.batch > 0 && args.batch != plan.global_batch)
    cfg.token_capacity = static_cast<std::int64_t>(
        token_capacity(sequence_moments(model), static_cast<double>(args.batch)));
  if (g_group.rank == 0) {
    fmt::print("parity train: {}; executing:\n", title);
    for (const PlanDecision& d : decisions) fmt::print("  {:<14} {}\n", d.what, d.executed);
  }
  if (kernels) {
    const DeviceSpec dev = find_device(plan.device, configs_dir() / "devices");
    cfg.gemm_hbm_bytes_per_s =
        dev.hbm_bandwidth.value * calibration_for(dev, configs_dir()).hbm_efficiency;
    cfg.gemm_library_version = plan.gemm_catalog.library_version;
    cfg.gemm_decisions = std::move(kernels->decisions);
    cfg.gemm_catalog = std::move(kernels->catalog);
  }
}

// The model and its recipe: a plan given with --plan; on a GPU without one, the plan made for the
// detected device (co-design) unless --no-plan; else the model's own recipe. Returns the plan
// trained with, if any.
std::shared_ptr<Plan> choose_recipe(const TrainArgs& args, bool model_given, TrainConfig& cfg) {
  if (!args.plan.empty()) {
    if (!args.dense_math.empty())
      throw InputError("--dense-math and --plan: the plan sets the dense math (its dense_math)");
    auto plan = std::make_shared<Plan>(load_plan(args.plan));
    const std::string model =
        model_given || plan->model_file.empty() ? args.model : plan->model_file;
    const ModelSpec spec = load_model_spec(resolve_model(model));
    if (args.product_checks && !plan->product_checks) {
      // The plan's predictions did not count the checks: counted now, so that the step profile
      // compares the run with what it is.
      plan->product_checks = true;
      const DeviceSpec dev = find_device(plan->device, configs_dir() / "devices");
      plan->prediction = evaluate_plan(*plan, spec, dev, calibration_for(dev, configs_dir()));
      if (g_group.rank == 0)
        fmt::print(
            "parity train: --product-checks: plan {} was made without them; its predictions are "
            "evaluated again with the checks (parity plan --product-checks makes such a plan)\n",
            args.plan);
    }
    train_as_planned(cfg, spec, *plan, args, args.backend == "cpu" ? std::string() : detect_gpu(),
                     fmt::format("plan {} (predicted {:.2f} ms/step)", args.plan,
                                 plan->prediction.step_s * 1e3));
    return plan;
  }
  cfg.model = load_model_spec(resolve_model(args.model));
  if (!args.dense_math.empty()) {
    if (cfg.model.kind != ModelKind::hstu && !args.no_plan && args.backend != "cpu")
      throw InputError(
          "--dense-math sets the dense math of the model's own recipe: add --no-plan (or give "
          "--plan, whose dense math is the plan's)");
    cfg.dense_math = DenseMath::fp32;
    for (const auto& [name, m] : kDenseMathNames)
      if (name == args.dense_math) cfg.dense_math = m;
    const auto& allowed = cfg.model.allowed_dense_math;
    if (std::find(allowed.begin(), allowed.end(), cfg.dense_math) == allowed.end()) {
      std::string names;
      for (const DenseMath m : allowed)
        names += (names.empty() ? "" : ", ") + std::string(dense_math_name(m));
      throw InputError(
          fmt::format("--dense-math {}: model '{}' ({}) allows {} (its recipe's dense_math)",
                      args.dense_math, cfg.model.name, resolve_model(args.model).string(), names));
    }
  }
  // An HSTU model's --dense-math picks the math of its own recipe, unplanned.
  if (cfg.model.kind == ModelKind::hstu && !args.dense_math.empty()) return nullptr;
  const std::string gpu = args.backend == "cpu" || args.no_plan ? std::string() : detect_gpu();
  if (gpu.empty()) return nullptr;
  const auto devices_dir = configs_dir() / "devices";
  const auto dev = match_device(gpu, devices_dir);
  if (!dev) {
    fmt::print(
        "parity train: the detected GPU '{}' is not in the device catalog ({}): training the "
        "model's own recipe; add a device file there to get a co-designed plan\n",
        gpu, devices_dir.string());
    return nullptr;
  }
  PlannerOptions opt;
  opt.configs_dir = configs_dir();
  opt.product_checks = args.product_checks;
  std::shared_ptr<Plan> plan;
  try {
    plan = std::make_shared<Plan>(make_plan(cfg.model, *dev, 1, opt));
  } catch (const InfeasibleError& e) {
    fmt::print(
        "parity train: the planner finds no recipe for {} on one {}: training the model's own "
        "recipe (it may not fit either). The planner says: {}\n",
        cfg.model.name, dev->display_name, e.what());
    return nullptr;
  }
  const ModelSpec model = cfg.model;
  try {
    train_as_planned(
        cfg, model, *plan, args, gpu,
        fmt::format("planned for the detected {} as {} ({}), predicted {:.2f} ms/step "
                    "(--no-plan trains the model's own recipe)",
                    gpu, dev->display_name, dev->source_file, plan->prediction.step_s * 1e3));
  } catch (const PlanNotExecutable& e) {
    cfg.model = model;
    fmt::print(
        "parity train: the plan made for the detected {} cannot run here ({}): training the "
        "model's own recipe (it may not fit)\n",
        dev->display_name, e.what());
    return nullptr;
  }
  return plan;
}

// --data and --eval-data: one shard dataset directory, or Criteo TSV files (none: synthetic).
void choose_data(const TrainArgs& args, TrainConfig& cfg) {
  for (const auto& f : args.data) {
    std::error_code ec;
    if (!std::filesystem::exists(f, ec))
      throw InputError(fmt::format("--data '{}': no such file or directory", f));
    if (args.data.size() > 1 && is_shard_dataset(f))
      throw InputError(fmt::format(
          "--data '{}' is a shard dataset: give one dataset directory alone (--data takes one "
          "dataset, or Criteo TSV files)",
          f));
  }
  for (const auto& f : args.eval_data) {
    std::error_code ec;
    if (!std::filesystem::exists(f, ec))
      throw InputError(fmt::format("--eval-data '{}': no such file", f));
  }
  if (args.data.size() == 1 && is_shard_dataset(args.data.front())) {
    cfg.shard_dir = args.data.front();
    if (!args.eval_data.empty())
      throw InputError(
          "--eval-data is for Criteo TSV files; a shard dataset holds its own eval split");
    return;
  }
  for (const auto& f : args.data) {
    if (std::filesystem::is_directory(f))
      throw InputError(fmt::format(
          "--data '{}' is a directory without meta.json: not a parity shard dataset (make one "
          "with parity data synth)",
          f));
    cfg.train_files.emplace_back(f);
  }
  for (const auto& f : args.eval_data) cfg.eval_files.emplace_back(f);
  if (!cfg.eval_files.empty() && cfg.train_files.empty())
    throw InputError(
        "--eval-data needs --data (synthetic runs evaluate on their own held-out split)");
}

// --loss-log: a header naming the window, then "step mean" lines; written atomically.
void write_loss_log(const std::string& file, std::int64_t window, const TrainResult& r) {
  std::string text =
      fmt::format("# mean training loss over windows of {} steps: last step, mean\n", window);
  for (const auto& [step, mean] : r.loss_windows) text += fmt::format("{} {:.9g}\n", step, mean);
  AtomicFile f(file, "--loss-log");
  f.write(text.data(), text.size());
  f.commit();
}

void train_with(TrainArgs& args, bool model_given, TrainConfig& cfg, Communicator* comm);

// Whether the run's backend is a GPU's (--backend, or auto on a machine with a usable GPU).
bool gpu_backend_chosen(const std::string& backend) {
  return backend != "cpu" && (backend != "auto" || !detect_gpu().empty());
}

// The communicator of a run started as several ranks, or of one process asked for one.
// `bootstrap`: the MPI engine that gives the NCCL engine its id under mpirun or Slurm.
std::unique_ptr<Communicator> make_run_communicator(const TrainArgs& args,
                                                    std::unique_ptr<Communicator>& bootstrap) {
  const bool gpu = gpu_backend_chosen(args.backend);
  std::string engine = args.collectives;
  if (engine == "auto") {
    if (g_group.world == 1) return nullptr;
    // NCCL takes one GPU a rank: ranks that share one go through the host (MPI).
    engine = gpu && nccl_available() && detect_gpu_count() >= g_group.local_world ? "nccl" : "mpi";
  }
  if (engine == "nccl") {
    if (!gpu)
      throw InputError(
          "--collectives nccl: the NCCL engine runs on GPUs, and this run's backend is the cpu "
          "(--backend gpu, or --collectives mpi)");
    if (!nccl_available())
      throw InputError(
          "--collectives nccl: this build has no NCCL engine (nccl.h and libnccl were not found "
          "beside the CUDA toolkit at configure time); --collectives mpi stages through the host");
    if (g_group.launcher == Launcher::mpirun || g_group.launcher == Launcher::slurm)
      bootstrap = make_mpi_communicator(&g_group);
    try {
      return make_nccl_communicator(g_group, bootstrap.get());
    } catch (const std::exception& e) {
      if (!bootstrap) throw;
      // The other ranks may wait inside NCCL's set-up: end them all, saying why.
      fmt::print(stderr,
                 "parity: error on rank {} of {}: {} (ranks sharing a GPU: --collectives mpi)\n",
                 g_group.rank, g_group.world, e.what());
      bootstrap->abort(2);
      throw;
    }
  }
  if (g_group.launcher == Launcher::torchrun)
    throw InputError(fmt::format(
        "a torchrun-style launch ({}) starts no MPI runtime, and the MPI engine needs one: start "
        "the ranks with mpirun (or srun), or train on GPUs, whose NCCL engine meets at "
        "MASTER_ADDR:MASTER_PORT",
        g_group.source));
  return make_mpi_communicator(&g_group);
}

void run_train(const TrainArgs& given, bool model_given) {
  TrainArgs args = given;
  TrainConfig cfg;
  // Started as several ranks: the plan says how the tables are sharded over them.
  g_group = detect_process_group();
  if (g_group.world > 1 && args.plan.empty())
    throw InputError(fmt::format(
        "this run is {} ranks ({}; {}): give a plan made for {} GPUs, which says how the "
        "tables are sharded over them (parity plan --gpus {} --out plan.json, then --plan "
        "plan.json)",
        g_group.world, name_in(kLauncherNames, g_group.launcher), g_group.source, g_group.world,
        g_group.world));
  // Each rank on its own GPU (the local rank's), before anything touches one.
  if (g_group.world > 1 && args.backend != "cpu") use_gpu_of_local_rank(g_group.local_rank);
  std::unique_ptr<Communicator> bootstrap;
  std::unique_ptr<Communicator> comm = make_run_communicator(args, bootstrap);
  if (!comm) {
    train_with(args, model_given, cfg, nullptr);
    return;
  }
  // An error on one rank (bad input, a non-finite check that fired here first) ends every rank
  // at once, with the error said, instead of leaving the others inside a collective.
  try {
    train_with(args, model_given, cfg, comm.get());
  } catch (const std::exception& e) {
    if (comm->size() == 1) throw;  // no other rank waits: said as any run's error
    fmt::print(stderr, "parity: error on rank {} of {}: {}\n", g_group.rank, g_group.world,
               e.what());
    comm->abort(2);
  }
}

// The run after the process group is known: the recipe (plan), the data, training, the profile.
void train_with(TrainArgs& args, bool model_given, TrainConfig& cfg, Communicator* comm) {
  const std::shared_ptr<Plan> plan = choose_recipe(args, model_given, cfg);
  if (comm != nullptr && !plan)
    throw InputError(fmt::format(
        "--collectives {}: a run through a communicator trains a plan (--plan, made for {} GPU{})",
        comm->engine(), comm->size(), comm->size() == 1 ? "" : "s"));
  if (comm != nullptr) {
    cfg.shard_plan = plan.get();
    cfg.comm = comm;
    cfg.dense_bucket_bytes = static_cast<std::size_t>(args.bucket_mb * (1 << 20));
  }
  if (!plan && args.gemm_selection == "plan" && args.backend != "cpu")
    fmt::print(
        "parity train: --gemm-selection plan: this run trains without a plan; the products "
        "take the {} own choices\n",
        args.gemm_catalog.empty() ? "BLAS library's" : "kernel catalog's");
  cfg.steps = args.steps;
  if (args.batch > 0) {
    cfg.batch = args.batch;
    if (plan && args.batch != plan->global_batch)  // apply_plan scaled the learning rates
      fmt::print(
          "parity train: --batch {} instead of the plan's {}: learning rates {:.4g} (embedding) "
          "and {:.4g} (dense), scaled from the model's batch by its recipe's {} rule as the plan "
          "does{}\n",
          args.batch, plan->global_batch, cfg.model.embedding_optimizer.lr,
          cfg.model.dense_optimizer.lr, lr_scaling_name(cfg.model.lr_scaling),
          cfg.model.lr_factor(0) < 1.0
              ? fmt::format(", warmed up over {} steps", cfg.model.lr_warmup_steps)
              : std::string());
    else if (!plan && args.batch != cfg.model.batch_size)
      fmt::print(
          "parity train: --batch {} without a plan: the model's learning rates as written (its "
          "batch_size is {}; a plan scales them by the recipe's rule)\n",
          args.batch, cfg.model.batch_size);
  }
  cfg.seed = args.seed;
  cfg.backend = args.backend;
  cfg.checkpoint_dir = args.checkpoint;
  cfg.checkpoint_every = args.checkpoint_every;
  cfg.keep_checkpoints = static_cast<int>(args.keep_checkpoints);
  cfg.resume = args.resume;
  choose_data(args, cfg);
  cfg.on_bad_line = args.on_bad_line == "skip" ? OnBadLine::skip : OnBadLine::stop;
  cfg.eval_examples = args.eval_examples;
  cfg.eval_every = args.eval_every;
  cfg.profile = args.profile;
  cfg.health_ledger = args.health_ledger;
  cfg.allow_quarantined = args.allow_quarantined;
  cfg.product_checks = args.product_checks || (plan && plan->product_checks);
  cfg.replay_faults = !args.no_replay;
  cfg.spike_factor = args.spike_factor;
  if (!args.loss_log.empty()) cfg.loss_window = args.loss_window;
  if (!args.inject_fault.empty()) {
    long long v[4] = {};
    const char* at = args.inject_fault.data();
    const char* end = at + args.inject_fault.size();
    for (int i = 0; i < 4; ++i) {
      const auto [next, ec] = std::from_chars(at, end, v[i]);
      const bool sep_ok = i == 3 ? next == end : (next != end && *next == ':');
      if (ec != std::errc() || !sep_ok || v[i] < 0)
        throw InputError(fmt::format(
            "--inject-fault '{}': expected STEP:PRODUCT:ELEMENT:BIT, four non-negative whole "
            "numbers (e.g. 3:0:17:30)",
            args.inject_fault));
      at = next + 1;
    }
    if (v[3] > 31)
      throw InputError(
          fmt::format("--inject-fault '{}': bit {}, expected 0 to 31", args.inject_fault, v[3]));
    cfg.inject_fault = TrainConfig::FaultAtStep{v[0], {v[1], v[2], static_cast<int>(v[3])}};
  }
  if (!args.inject_table_fault.empty()) {
    // STEP:TABLE:ROW:COL:BIT; the table and the ranges are checked against the model at start.
    const std::string& text = args.inject_table_fault;
    std::vector<std::string_view> parts;
    for (std::size_t at = 0;;) {
      const std::size_t colon = text.find(':', at);
      parts.emplace_back(std::string_view(text).substr(at, colon - at));
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
    long long v[4] = {};
    bool ok = parts.size() == 5 && !parts[1].empty();
    for (int i = 0; ok && i < 4; ++i) {
      const std::string_view p = parts[i == 0 ? 0 : i + 1];
      const auto [next, ec] = std::from_chars(p.data(), p.data() + p.size(), v[i]);
      ok = ec == std::errc() && next == p.data() + p.size() && v[i] >= 0;
    }
    if (!ok)
      throw InputError(fmt::format(
          "--inject-table-fault '{}': expected STEP:TABLE:ROW:COL:BIT, a table's name and four "
          "non-negative whole numbers (e.g. 3:cat_0:17:2:30)",
          text));
    cfg.inject_table_fault = TrainConfig::TableFaultAtStep{
        v[0], std::string(parts[1]), v[1], v[2], static_cast<int>(std::min<long long>(v[3], 64))};
  }
  if (args.memory_limit_gb > 0) {
    if (args.backend == "cpu" || (args.backend == "auto" && detect_gpu().empty()))
      throw InputError(fmt::format(
          "--memory-limit {} GB: the cpu backend has no device memory to limit (it limits a "
          "GPU's)",
          args.memory_limit_gb));
    cfg.memory_limit_bytes = args.memory_limit_gb * 1e9;
    if (plan && plan->prediction.peak_memory_bytes > cfg.memory_limit_bytes)
      throw InputError(fmt::format(
          "--memory-limit {} GB: the plan '{}' predicts a peak of {:.2f} GB; plan for a device "
          "of that memory (a copy of its device file with memory.hbm_bytes {:.4g}), or raise "
          "the limit",
          args.memory_limit_gb, args.plan, plan->prediction.peak_memory_bytes / 1e9,
          cfg.memory_limit_bytes));
    fmt::print(
        "parity train: the GPU's memory limited to {} GB for this run (the rest reserved at "
        "start-up)\n",
        args.memory_limit_gb);
  }
  if (!args.gemm_catalog.empty()) {
    auto catalog = std::make_shared<const GemmCatalog>(load_gemm_catalog(args.gemm_catalog));
    const DeviceSpec dev = find_device(catalog->device, configs_dir() / "devices");
    cfg.gemm_hbm_bytes_per_s =
        dev.hbm_bandwidth.value * calibration_for(dev, configs_dir()).hbm_efficiency;
    fmt::print("parity train: matrix-product kernels from the catalog {} ({} {}, measured {})\n",
               args.gemm_catalog, catalog->library, catalog->library_version, catalog->measured);
    cfg.gemm_catalog = std::move(catalog);
    cfg.gemm_library_version = 0;  // the file's own version is compared with the library's
  }
  // The profile's "plan" column: the plan's prediction for the batch that runs.
  std::shared_ptr<const Plan> profiled = plan;
  if (plan && cfg.profile && args.batch > 0 && args.batch != plan->global_batch) {
    auto at = std::make_shared<Plan>(*plan);
    at->global_batch = args.batch;
    at->per_device_batch = args.batch / std::max(plan->gpus, 1);
    at->token_capacity = cfg.token_capacity;
    const DeviceSpec dev = find_device(plan->device, configs_dir() / "devices");
    at->prediction = evaluate_plan(*at, cfg.model, dev, calibration_for(dev, configs_dir()));
    profiled = at;
  }
  ConsoleObserver console;
  const TrainResult r = train(cfg, g_group.rank == 0 ? &console : nullptr);
  if (g_group.rank != 0) return;  // rank 0 reports the run
  if (cfg.product_checks)
    fmt::print("product checks: {} dense products checked, none failed\n", r.products_checked);
  if (!args.loss_log.empty()) write_loss_log(args.loss_log, cfg.loss_window, r);
  if (const GemmSelectionCounts& g = r.gemm_selection; g.planned + g.ranked + g.heuristic > 0)
    fmt::print(
        "kernel selection: {} distinct matrix products (shape and alignment) ran the plan's "
        "choice, {} the catalog's ranking (not in the plan), {} the library's heuristic\n",
        g.planned, g.ranked, g.heuristic);
  if (cfg.profile)
    print_profile(r, profiled.get(), cfg.model, cfg.batch > 0 ? cfg.batch : cfg.model.batch_size);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a model. With no arguments: the tiny model on synthetic data whose labels come\n"
      "from a planted teacher, evaluated (AUC) on held-out examples.\n\n"
      "Examples:\n"
      "  parity train\n"
      "  parity train --model configs/models/tiny-dot.yaml --steps 2000 --checkpoint runs/a\n"
      "  parity train --checkpoint runs/a --resume --steps 4000\n"
      "  parity train --model criteo-small --data day_0.tsv day_1.tsv --eval-data day_23.tsv");
  CLI::Option* model_opt = cmd->add_option("--model", args->model,
                                           "Model YAML file or zoo name (configs/models/NAME.yaml)")
                               ->capture_default_str();
  cmd->add_option("--plan", args->plan,
                  "Train as a plan from `parity plan --out` says (batch, table precision, "
                  "optimizer; the model is the plan's unless --model is given)");
  cmd->add_option("--steps", args->steps,
                  "Total steps (resumed ones included); default 1000 on synthetic data, one pass "
                  "over --data files")
      ->check(positive_integer());
  cmd->add_option("--batch", args->batch, "Examples per step (default: the model's batch_size)")
      ->check(positive_integer());
  cmd->add_option("--seed", args->seed, "Seed of initialisation and synthetic data")
      ->check(seed_value())
      ->capture_default_str();
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Directory for checkpoints (safetensors, written atomically)");
  cmd->add_option("--checkpoint-every", args->checkpoint_every,
                  "Steps between checkpoints (default: at the end only)")
      ->check(nonnegative_integer());
  cmd->add_option("--keep-checkpoints", args->keep_checkpoints,
                  "Checkpoints kept in --checkpoint, the newest ones (a checkpoint is written "
                  "only when every value is finite, so the newest good one is always kept)")
      ->check(integer_at_least(1, "a positive integer"))
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_flag("--resume", args->resume, "Continue from the newest checkpoint in --checkpoint");
  cmd->add_option("--backend", args->backend,
                  "Backend: auto (the GPU where one is usable, else cpu), cpu, gpu (the GPU "
                  "backend this build has: cuda, or hip)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu", "cuda", "hip"}))
      ->capture_default_str();
  cmd->add_option("--collectives", args->collectives,
                  "The ranks' collectives: auto (NCCL between GPUs where this build has it, else "
                  "MPI; none for one process), mpi (through host memory under a GPU backend), "
                  "or nccl; mpi and nccl make a communicator of one rank too, for one process")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}))
      ->capture_default_str();
  cmd->add_option("--bucket-mb", args->bucket_mb,
                  "Several ranks: the dense gradients are summed in buckets of at least this "
                  "many MiB, each as soon as the backward has made it, while it goes on")
      ->check(CLI::Range(1.0 / (1 << 20), 1e6))
      ->capture_default_str();
  cmd->add_option("--data", args->data,
                  "A shard dataset directory (parity data synth) or Criteo TSV files to train on "
                  "(default: synthetic batches made on the fly)");
  cmd->add_flag(
      "--no-plan", args->no_plan,
      "On a GPU without --plan: train the model's own recipe instead of the plan made for the "
      "detected device");
  cmd->add_option("--dense-math", args->dense_math,
                  "Dense math of a run without a plan (HSTU models, --no-plan, the cpu backend): "
                  "fp32, tf32 or bf16, one the model's recipe allows (bf16: bf16 operands and "
                  "fp32 sums in the products and the attention)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  cmd->add_option("--gemm-catalog", args->gemm_catalog,
                  "Choose every matrix product's kernel from this kernel catalog (parity "
                  "calibrate) by the selection model when it first runs, instead of the BLAS "
                  "library's heuristic (where the plan's choices run: for the products the plan "
                  "does not list)");
  cmd->add_option("--gemm-selection", args->gemm_selection,
                  "Where a GPU run's matrix-product kernels come from: plan (the plan's choices, "
                  "ranked by the device's kernel catalog; products the plan does not list ranked "
                  "the same way when they first run), heuristic (the BLAS library's own, unless "
                  "--gemm-catalog is given) or auto (plan where the plan's catalog is this GPU's, "
                  "else heuristic)")
      ->check(CLI::IsMember({"auto", "plan", "heuristic"}))
      ->capture_default_str();
  cmd->add_flag("--profile", args->profile,
                "Time the step by op category with device events and print it beside the plan's "
                "prediction");
  cmd->add_option("--eval-data", args->eval_data,
                  "Criteo TSV files to evaluate on (default: the last --data file)");
  cmd->add_option("--on-bad-line", args->on_bad_line,
                  "What to do with a malformed data line: stop or skip")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  cmd->add_option("--eval-examples", args->eval_examples, "Held-out examples to evaluate on")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--memory-limit", args->memory_limit_gb,
                  "GB of the GPU's memory this run may use, the rest reserved at start-up: one "
                  "GPU standing in for a smaller one (with a plan made for that memory)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--health-ledger", args->health_ledger,
                  "The fleet's health ledger, where a quarantined GPU is refused (default "
                  "$PARITY_HEALTH_LEDGER, else ~/.local/state/parity/health-ledger.json)");
  cmd->add_flag("--allow-quarantined", args->allow_quarantined,
                "Train on the GPU even where the health ledger has quarantined it");
  cmd->add_flag("--product-checks", args->product_checks,
                "Check every forward dense product with checksums (ABFT) and stop at a product the "
                "device computed wrong, marking the GPU suspect in the health ledger");
  cmd->add_option("--inject-fault", args->inject_fault,
                  "STEP:PRODUCT:ELEMENT:BIT: flip bit BIT (0-31) of element ELEMENT of the "
                  "PRODUCT-th forward product (from 0) of step STEP, once (a transient fault), to "
                  "test the product checks, the finite-value guard and the replay");
  cmd->add_option("--inject-table-fault", args->inject_table_fault,
                  "STEP:TABLE:ROW:COL:BIT: flip bit BIT of element (ROW, COL) of table TABLE's "
                  "stored weights before step STEP, once (a transient fault in an embedding row), "
                  "to test the finite-value guard, the spike watch and the replay");
  cmd->add_flag("--no-replay", args->no_replay,
                "Stop at a fault found in training (a NaN, a failed product check, a loss spike) "
                "without replaying it; by default the steps since the newest checkpoint are "
                "trained again to tell the data or the model from the device, and training goes "
                "on where the device was at fault");
  cmd->add_option("--spike-factor", args->spike_factor,
                  "A step whose loss is more than this many times the mean of the 100 steps "
                  "before it is a loss spike, replayed like a NaN (0: none looked for; the host "
                  "then reads every step's loss)")
      ->capture_default_str();
  cmd->add_option("--loss-log", args->loss_log,
                  "Write the mean training loss of every --loss-window steps to this file (step, "
                  "mean: one window a line), to compare runs by their smoothed curves; the host "
                  "then reads every step's loss, so the run is slower");
  cmd->add_option("--loss-window", args->loss_window, "Steps per --loss-log window")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--eval-every", args->eval_every,
                  "Steps between evaluations (0: at the end only)")
      ->check(nonnegative_integer())
      ->capture_default_str();
  cmd->callback([args, model_opt] { run_train(*args, model_opt->count() > 0); });
}

}  // namespace parity::cli
