// parity plan: the co-designed recipe for a model on a device, a direct port compared
// with it, or one line per catalog device.
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "common.h"
#include "core/atomic_file.h"
#include "parity/error.h"
#include "parity/plan.h"

namespace parity::cli {
namespace {

std::string rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.0f}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

struct Summary {
  std::map<std::string, int> dtypes, sharding;
  int host = 0;
};

Summary summarize(const Plan& p) {
  Summary s;
  for (const auto& t : p.tables) {
    ++s.dtypes[std::string(dtype_name(t.dtype))];
    ++s.sharding[std::string(sharding_name(t.sharding))];
    s.host += t.placement == Placement::host;
  }
  return s;
}

std::string join_counts(const std::map<std::string, int>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + fmt::format("{} x{}", k, v);
  return out;
}

void print_plan(const Plan& p, const DeviceSpec& dev, bool verbose) {
  const auto& pr = p.prediction;
  const Summary s = summarize(p);
  fmt::print("plan: {} on {} x {}\n", p.model, p.gpus, dev.display_name);
  fmt::print("  batch {} per device (global {}), dense math {}{}, embedding optimizer {}\n",
             p.per_device_batch, p.global_batch, dense_math_name(p.dense_math),
             p.product_checks ? " with checksummed products" : "",
             optimizer_name(p.embedding_optimizer));
  if (p.token_capacity > 0)
    fmt::print("  tokens: buffers for {} a step, activation recompute {}\n", p.token_capacity,
               p.recompute ? "on" : "off");
  fmt::print("  tables: {} ({}), sharding {}, {} in HBM, {} in host memory\n", p.tables.size(),
             join_counts(s.dtypes), join_counts(s.sharding), p.tables.size() - s.host, s.host);
  fmt::print("  predicted: {:.2f} ms/step, {} examples/s ({} per GPU)\n", pr.step_s * 1e3,
             rate(pr.examples_per_s), rate(pr.examples_per_s_per_gpu));
  if (pr.floor_s > 0)
    fmt::print(
        "  floor: {:.4f} ms/step with every op at its roofline (the prediction is {:.2f}x)\n",
        pr.floor_s * 1e3, pr.step_s / pr.floor_s);
  fmt::print("\n  step time by category        ms    share\n");
  std::vector<std::pair<std::string, double>> times(pr.time_s.begin(), pr.time_s.end());
  std::stable_sort(times.begin(), times.end(),
                   [](auto& a, auto& b) { return a.second > b.second; });
  for (const auto& [k, v] : times)
    fmt::print("    {:<26}{:>7.3f}  {:>5.1f}%\n", k, v * 1e3, 100 * v / pr.step_s);
  fmt::print("\n  memory on device {} (fullest)    GB\n", pr.peak_device);
  std::vector<std::pair<std::string, double>> mem(pr.memory_bytes.begin(), pr.memory_bytes.end());
  std::stable_sort(mem.begin(), mem.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (const auto& [k, v] : mem) fmt::print("    {:<28}{:>7.2f}\n", k, v / 1e9);
  fmt::print("    {:<28}{:>7.2f} of {:.2f} ({:.0f}%)\n", "total", pr.peak_memory_bytes / 1e9,
             pr.memory_budget_bytes / 1e9, 100 * pr.peak_memory_bytes / pr.memory_budget_bytes);
  if (pr.host_memory_bytes > 0)
    fmt::print("    {:<28}{:>7.2f} of {:.2f} per GPU\n", "host memory (tables)",
               pr.host_memory_bytes / 1e9, dev.host_memory_bytes.value / 1e9);
  fmt::print("\n  recipe changes (each alters the model's numerics or placement):\n");
  if (p.changes.empty()) fmt::print("    none: the model's own recipe\n");
  for (const auto& c : p.changes)
    fmt::print("    - {}: {} -> {}\n      because {}\n", c.what, c.from, c.to, c.reason);
  if (verbose) {
    fmt::print("\n  tables\n    {:<22}{:>6}{:>11}{:>6}{:>14}  shards (device: rows / cols)\n",
               "name", "dtype", "sharding", "place", "cache rows");
    for (const auto& t : p.tables) {
      std::string shards;
      for (std::size_t i = 0; i < t.shards.size() && i < 4; ++i)
        shards += fmt::format("{}{}: {}-{} / {}-{}", i ? ", " : "", t.shards[i].device,
                              t.shards[i].row_begin, t.shards[i].row_end, t.shards[i].col_begin,
                              t.shards[i].col_end);
      if (t.shards.size() > 4) shards += fmt::format(", ... ({} shards)", t.shards.size());
      fmt::print("    {:<22}{:>6}{:>11}{:>6}{:>14}  {}\n", t.name, dtype_name(t.dtype),
                 sharding_name(t.sharding), placement_name(t.placement),
                 t.placement == Placement::host ? fmt::format("{}", t.cache_rows) : "-", shards);
    }
    if (p.gemm_catalog.empty()) {
      fmt::print("\n  GEMM kernels (first-ranked tile of the analytical model)\n");
    } else {
      fmt::print("\n  GEMM kernels (ranked by the kernel catalog {}, {} {})\n", p.gemm_catalog.file,
                 p.gemm_catalog.library, p.gemm_catalog.library_version);
    }
    for (const auto& k : p.kernels)
      fmt::print(
          "    {:<32} {:>7} x {:>5} x {:>5}  {}  {:.1f} us\n", k.op, k.m, k.n, k.k,
          k.ranked.empty() ? fmt::format("tile {}x{}", k.tile_m, k.tile_n) : k.ranked.front(),
          k.predicted_s * 1e6);
  }
  fmt::print("\n  calibration: {}\n", p.calibration);
}

void print_port(const Plan& source, const Plan& port, const Plan& co, const DeviceSpec& src,
                const DeviceSpec& dst) {
  const Summary a = summarize(port), b = summarize(co);
  const bool port_fits = fits(port.prediction, dst);
  fmt::print("{} on {} x {}: direct port of the {} recipe vs co-designed\n\n", co.model, co.gpus,
             dst.display_name, src.display_name);
  fmt::print("  {:<26}{:<42}{}\n", "", fmt::format("port from {}", src.name), "co-designed");
  auto row = [](const std::string& k, const std::string& x, const std::string& y) {
    fmt::print("  {:<26}{:<42}{}{}\n", k, x, y, x == y ? "" : "   *");
  };
  row("batch per device", fmt::format("{}", port.per_device_batch),
      fmt::format("{}", co.per_device_batch));
  row("dense math", std::string(dense_math_name(port.dense_math)),
      std::string(dense_math_name(co.dense_math)));
  row("embedding optimizer", std::string(optimizer_name(port.embedding_optimizer)),
      std::string(optimizer_name(co.embedding_optimizer)));
  row("table precision", join_counts(a.dtypes), join_counts(b.dtypes));
  row("sharding", join_counts(a.sharding), join_counts(b.sharding));
  row("tables in host memory", fmt::format("{}", a.host), fmt::format("{}", b.host));
  row("peak memory / HBM",
      fmt::format("{:.1f} / {:.1f} GB{}", port.prediction.peak_memory_bytes / 1e9,
                  port.prediction.memory_budget_bytes / 1e9, port_fits ? "" : " DOES NOT FIT"),
      fmt::format("{:.1f} / {:.1f} GB", co.prediction.peak_memory_bytes / 1e9,
                  co.prediction.memory_budget_bytes / 1e9));
  row("step time", fmt::format("{:.2f} ms", port.prediction.step_s * 1e3),
      fmt::format("{:.2f} ms", co.prediction.step_s * 1e3));
  row("examples/s per GPU", rate(port.prediction.examples_per_s_per_gpu),
      rate(co.prediction.examples_per_s_per_gpu));
  fmt::print("\n  the {} recipe on {} itself: {:.2f} ms/step, {} examples/s per GPU\n", src.name,
             src.name, source.prediction.step_s * 1e3,
             rate(source.prediction.examples_per_s_per_gpu));
  if (port_fits)
    fmt::print("  predicted gain of co-design over the direct port: {:.2f}x\n",
               co.prediction.examples_per_s / port.prediction.examples_per_s);
  else
    fmt::print("  the direct port does not fit: it needs {:.1f} GB more on device {}\n",
               (port.prediction.peak_memory_bytes - port.prediction.memory_budget_bytes) / 1e9,
               port.prediction.peak_device);
  const bool same = port.per_device_batch == co.per_device_batch &&
                    port.dense_math == co.dense_math &&
                    port.embedding_optimizer == co.embedding_optimizer && a.dtypes == b.dtypes &&
                    a.sharding == b.sharding && a.host == b.host;
  if (same)
    fmt::print(
        "  the {} recipe is also the best the planner finds for {}: nothing it chose was\n"
        "  limited by {}'s memory or precisions, so porting it costs nothing here\n",
        src.name, dst.name, src.name);
  fmt::print("\n  why (rows marked * differ):\n");
  for (const auto& c : port.changes)
    fmt::print("    - port: {} {} -> {}: {}\n", c.what, c.from, c.to, c.reason);
  if (port.per_device_batch != co.per_device_batch)
    fmt::print("    - batch: {} per device on {} vs {} on {}: {}\n", port.per_device_batch,
               src.name, co.per_device_batch, dst.name,
               co.prediction.memory_budget_bytes > port.prediction.memory_budget_bytes
                   ? "the larger HBM holds the larger batch"
                   : "the smaller HBM holds a smaller batch");
  if (port.dense_math != co.dense_math)
    fmt::print("    - dense math {} instead of {}: {} at {:.0f} TFLOP/s peak vs {:.0f}\n",
               dense_math_name(co.dense_math), dense_math_name(port.dense_math), dst.name,
               dst.dense_flops(co.dense_math) / 1e12, dst.dense_flops(port.dense_math) / 1e12);
  if (a.host != b.host)
    fmt::print("    - tables in host memory: {} on the port, {} co-designed: {}\n", a.host, b.host,
               b.host < a.host ? "the device's HBM holds them" : "they do not fit in HBM");
  for (const auto& c : co.changes)
    fmt::print("    - co-designed recipe vs the model's: {} {} -> {}: {}\n", c.what, c.from, c.to,
               c.reason);
}

// Writes the plan atomically (a full disk leaves the old file, never a torn one), refusing to
// write over one of the files it was made from.
void write_plan(const std::string& out, const Plan& plan, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& in : inputs)
    if (!in.empty() && fs::exists(out, ec) && fs::equivalent(out, in, ec))
      throw InputError(fmt::format(
          "--out '{}' is the file the plan was made from ('{}'): give the plan its own file, "
          "e.g. plan.json",
          out, in));
  if (fs::is_directory(out, ec))
    throw InputError(fmt::format("--out '{}' is a directory; give a file name", out));
  const std::string text = plan_to_json(plan);
  try {
    AtomicFile f(out, "plan");
    f.write(text.data(), text.size());
    f.commit();
  } catch (const Error& e) {
    throw InputError(e.what());
  }
}

std::string gpus_text(int n) {
  return fmt::format("{} GPU{}", n, n == 1 ? "" : "s");
}

// One plan per GPU count at the model's global batch range (fewer, fuller GPUs, or more): what
// each count predicts, which fit, and where the rate per GPU is highest.
void print_gpu_counts(const ModelSpec& model, const DeviceSpec& dev, std::vector<int> counts,
                      const PlannerOptions& opt) {
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  fmt::print("{} on {} by GPU count\n\n", model.name, dev.display_name);
  fmt::print("  {:>6}{:>14}{:>11}{:>8}{:>11}{:>13}{:>14}{:>10}\n", "GPUs", "global batch",
             "batch/GPU", "host", "ms/step", "examples/s", "ex/s per GPU", "per GPU");
  struct Row {
    int gpus;
    Plan plan;
  };
  // A count whose plan had to drop below the recipe's batches does not run the same job.
  const std::int64_t floor = model.min_global_batch > 0
                                 ? std::min(model.min_global_batch, model.batch_size)
                                 : model.batch_size;
  std::vector<Row> fit;
  for (const int w : counts) {
    try {
      Plan p = make_plan(model, dev, w, opt);
      if (p.global_batch < std::max<std::int64_t>(w, (floor / w) * w)) {
        fmt::print(
            "  {:>6}  fits only below the recipe's batches (global batch {}, the recipe's "
            "smallest {})\n",
            w, p.global_batch, floor);
        continue;
      }
      fit.push_back({w, std::move(p)});
    } catch (const InfeasibleError&) {
      fmt::print("  {:>6}  does not fit (parity plan --gpus {} says why)\n", w, w);
      continue;
    }
    const Plan& p = fit.back().plan;
    const double first = fit.front().plan.prediction.examples_per_s_per_gpu;
    fmt::print("  {:>6}{:>14}{:>11}{:>8}{:>11.2f}{:>13}{:>14}{:>9.2f}x\n", w, p.global_batch,
               p.per_device_batch, summarize(p).host, p.prediction.step_s * 1e3,
               rate(p.prediction.examples_per_s), rate(p.prediction.examples_per_s_per_gpu),
               p.prediction.examples_per_s_per_gpu / first);
  }
  if (fit.empty())
    throw InfeasibleError(fmt::format("model '{}' fits none of the GPU counts asked for on {}",
                                      model.name, dev.display_name));
  const auto per_gpu = std::max_element(fit.begin(), fit.end(), [](const Row& a, const Row& b) {
    return a.plan.prediction.examples_per_s_per_gpu < b.plan.prediction.examples_per_s_per_gpu;
  });
  const auto fastest = std::max_element(fit.begin(), fit.end(), [](const Row& a, const Row& b) {
    return a.plan.prediction.examples_per_s < b.plan.prediction.examples_per_s;
  });
  fmt::print("\n  fewest GPUs that fit at the recipe's batches: {}\n", fit.front().gpus);
  fmt::print("  most examples/s per GPU: {} ({} per GPU)\n", gpus_text(per_gpu->gpus),
             rate(per_gpu->plan.prediction.examples_per_s_per_gpu));
  fmt::print("  most examples/s: {} ({})\n", gpus_text(fastest->gpus),
             rate(fastest->plan.prediction.examples_per_s));
  fmt::print(
      "  (per GPU: the rate per GPU against the fewest that fit; parity plan --gpus N\n"
      "   gives the whole plan for one count)\n");
}

}  // namespace

void add_plan_command(CLI::App& app) {
  struct Args {
    std::string model = "mlperf-dlrmv2", device, port_from, out;
    int gpus = 0;  // 0: the model's own (gpus: in its YAML), else 1
    std::vector<int> gpu_counts;
    bool verbose = false, product_checks = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Work out the training recipe for a model on a device: batch, table precision,\n"
      "placement and sharding, dense math precision; predict step time, memory and\n"
      "examples/s, and explain every change to the model's recipe.\n\n"
      "Examples:\n"
      "  parity plan --model mlperf-dlrmv2 --device h200 --gpus 1\n"
      "  parity plan --model mlperf-dlrmv2 --device mi350x --port-from b200 --gpus 8\n"
      "  parity plan --model prod-many-features --gpus 32          # every catalog device\n"
      "  parity plan --model seed-c-trillion --device mi350x --gpu-counts 8,16,32\n"
      "  parity plan --model tiny --device h200 --out plan.json && parity train --plan plan.json");
  cmd->add_option("--model", args->model, "Model YAML file or zoo name")->capture_default_str();
  cmd->add_option("--device", args->device, "Device catalog key (configs/devices) or YAML file");
  cmd->add_option("--gpus", args->gpus, "Number of GPUs [default: the model's gpus: field, else 1]")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--gpu-counts", args->gpu_counts,
                  "Plan for each of these GPU counts (e.g. 8,16,32) and compare them")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--port-from", args->port_from,
                  "Compare with the recipe planned for this device, run unchanged on --device");
  cmd->add_option("--out", args->out, "Write the plan as JSON (input of parity train --plan)");
  cmd->add_flag("--verbose,-v", args->verbose, "Per-table placement and the GEMM kernel choices");
  cmd->add_flag("--product-checks", args->product_checks,
                "Plan for a run with checksummed dense products (parity train --product-checks): "
                "their time and memory predicted, never tf32");
  cmd->callback([args] {
    const ModelSpec model = load_model_spec(resolve_model(args->model));
    const int gpus = args->gpus > 0 ? args->gpus : std::max(model.gpus, 1);
    const auto devices_dir = configs_dir() / "devices";
    PlannerOptions opt;
    opt.configs_dir = configs_dir();
    opt.product_checks = args->product_checks;
    if (args->device.empty()) {
      if (!args->port_from.empty()) throw InputError("--port-from needs --device");
      if (!args->out.empty()) throw InputError("--out needs --device");
      if (!args->gpu_counts.empty()) throw InputError("--gpu-counts needs --device");
      fmt::print("{} on {} GPUs of each catalog device\n\n", model.name, gpus);
      fmt::print("  {:<24}{:>10}{:>7}{:>17}{:>9}{:>8}{:>11}{:>13}\n", "device", "batch/GPU", "math",
                 "table opt", "tables", "host", "mem GB", "ex/s per GPU");
      for (const auto& dev : load_device_catalog(devices_dir)) {
        try {
          const Plan p = make_plan(model, dev, gpus, opt);
          const Summary s = summarize(p);
          fmt::print(
              "  {:<24}{:>10}{:>7}{:>17}{:>9}{:>8}{:>11.1f}{:>13}\n",
              dev.display_name.substr(0, 23), p.per_device_batch, dense_math_name(p.dense_math),
              optimizer_name(p.embedding_optimizer), join_counts(s.dtypes).substr(0, 8), s.host,
              p.prediction.peak_memory_bytes / 1e9, rate(p.prediction.examples_per_s_per_gpu));
        } catch (const InfeasibleError&) {
          fmt::print("  {:<24}  does not fit on {} GPUs (parity plan --device {} says why)\n",
                     dev.display_name.substr(0, 23), gpus, dev.name);
        }
      }
      return;
    }
    const DeviceSpec dev = find_device(args->device, devices_dir);
    if (!args->gpu_counts.empty()) {
      if (!args->port_from.empty() || !args->out.empty() || args->gpus > 0)
        throw InputError("--gpu-counts compares counts: without --gpus, --port-from or --out");
      print_gpu_counts(model, dev, args->gpu_counts, opt);
      return;
    }
    const Plan plan = make_plan(model, dev, gpus, opt);
    if (!args->port_from.empty()) {
      const DeviceSpec src = find_device(args->port_from, devices_dir);
      const Plan source = make_plan(model, src, gpus, opt);
      print_port(source, port_plan(source, model, dev, opt), plan, src, dev);
    } else {
      print_plan(plan, dev, args->verbose);
    }
    if (!args->out.empty()) {
      write_plan(args->out, plan, {model.source_file, dev.source_file});
      fmt::print("\nwrote {}\n", args->out);
    }
  });
}

}  // namespace parity::cli
