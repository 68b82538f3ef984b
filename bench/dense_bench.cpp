// The dense ops of a training step at the speed of the device: each op's achieved FLOP/s and
// bytes/s beside the roofline measured in the same run and the performance model's prediction
// (parity::dense_op_costs, include/parity/plan.h).
//
// What it measures, for a model YAML (default configs/models/mlperf-dlrmv2.yaml), a batch
// (default the model's batch_size) and a dense math (bf16, tf32 or fp32):
// - the ceilings: a device-to-device copy of 2 GiB (bytes read + written) and a product of
//   --product-size^3 (default 8192) through GpuBackend::linear_forward in the dense math;
// - every dense op of the step as the engine runs it (dense_step.cpp: the engine's shapes,
//   storage types and cross-backward modes, through GpuBackend's public interface), named as
//   the step profile names them ("bottom.0 forward", "cross.1 backward", "dot forward", "loss"):
//   its median time, the FLOPs, bytes and predicted time the performance model gives it, its
//   roofline time max(FLOPs / product rate, bytes / copy rate), measured / roofline and
//   measured / predicted;
// - each elementwise pass alone through its op header (dense_passes.cpp): the bytes it must
//   move over its time, against the copy rate.
// - with --gemm-catalog FILE (parity calibrate's kernel catalog), the step's ops again through a
//   backend whose products take the catalog ranking's choices, in --ab-rounds alternating rounds
//   of (library heuristic, catalog) on fresh backends, each op's fastest round of each kept: the
//   ops side by side, and the sums over the ops with matrix products.
// Method: the median of --reps calls (device events around each) after --warmup calls (at least
// one per input set); every op's inputs are random and non-zero (the counter-based GPU fill) and
// rotate among sets that together exceed the L2 cache three times (at least 2 sets).
// --results FILE writes every number as JSON; --dump FILE writes the shapes for the PyTorch peer
// (bench/dense_torch.py). bench/dense-ops.sh runs both (bench/README.md says how).
// Exit codes: 0 done, 2 bad arguments or input files, 77 no GPU here, 1 a failure on the GPU.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu/fill.h"
#include "dense_bench.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/plan.h"
#include "parity/select.h"

namespace fs = std::filesystem;
namespace pb = parity::bench;
using parity::DenseMath;
using parity::DType;

namespace {

constexpr const char* kUsage =
    "usage: dense_bench [--model YAML|NAME] [--batch N] [--math bf16|tf32|fp32]\n"
    "                   [--device KEY|YAML] [--configs DIR] [--reps N] [--warmup N]\n"
    "                   [--product-size N] [--no-passes] [--results FILE] [--dump FILE]\n"
    "                   [--check-on-cpu] [--gemm-catalog FILE] [--ab-rounds N]\n"
    "                   [--product-checks [--library-checks]]\n"
    "Times every dense op of a training step (and each elementwise pass alone) on this GPU beside\n"
    "the measured copy and product rates and the performance model's prediction for --device\n"
    "(default h200). Defaults: configs/models/mlperf-dlrmv2.yaml at its batch_size, bf16, 30 reps\n"
    "after 5 warm-up calls, 8192^3 product. Exit 77 where no GPU is present.\n"
    "--check-on-cpu runs each op of the step once on the CPU backend (default batch 16) in the\n"
    "storage types the GPU would use: a check of the benchmark itself, no measurement.\n"
    "--gemm-catalog FILE also times the step's ops with the catalog's kernel choices, alternating\n"
    "--ab-rounds (default 2) rounds with the library heuristic's, each op's fastest kept.\n"
    "--product-checks checks every forward product of the step (parity train --product-checks)\n"
    "and predicts the ops with the checks; a check that fails stops the benchmark.\n"
    "--library-checks runs every checked product through the library and the row pass, where\n"
    "bf16 products would run in one kernel (GpuBackend::use_fused_checks), to compare the two;\n"
    "the predictions stay the default path's.\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo,
                       std::int64_t hi) {
  std::int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    throw UsageError(fmt::format("{}: '{}' is not an integer in [{}, {}]", flag, v, lo, hi));
  return x;
}

// Returns false for --help.
bool parse(int argc, char** argv, pb::Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return false;
    if (a == "--no-passes") {
      o.passes = false;
      continue;
    }
    if (a == "--check-on-cpu") {
      o.check_on_cpu = true;
      continue;
    }
    if (a == "--product-checks") {
      o.product_checks = true;
      continue;
    }
    if (a == "--library-checks") {
      o.library_checks = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    if (a == "--model")
      o.model = v;
    else if (a == "--batch")
      o.batch = parse_int(a, v, 1, std::int64_t{1} << 24);
    else if (a == "--device")
      o.device = v;
    else if (a == "--configs")
      o.configs = v;
    else if (a == "--reps")
      o.reps = static_cast<int>(parse_int(a, v, 1, 4000));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(parse_int(a, v, 0, 1000));
    else if (a == "--product-size")
      o.product_size = parse_int(a, v, 64, 32768);
    else if (a == "--results")
      o.results = v;
    else if (a == "--gemm-catalog")
      o.gemm_catalog = v;
    else if (a == "--ab-rounds")
      o.ab_rounds = static_cast<int>(parse_int(a, v, 1, 10));
    else if (a == "--dump")
      o.dump = v;
    else if (a == "--math") {
      if (v == "bf16")
        o.math = DenseMath::bf16;
      else if (v == "tf32")
        o.math = DenseMath::tf32;
      else if (v == "fp32")
        o.math = DenseMath::fp32;
      else
        throw UsageError(
            fmt::format("--math: '{}' is not bf16, tf32 or fp32 (the GPU backend's "
                        "dense maths)",
                        v));
    } else {
      throw UsageError(fmt::format("unknown argument '{}'", a));
    }
  }
  if (o.library_checks && !o.product_checks)
    throw UsageError("--library-checks chooses how --product-checks run: give both");
  return true;
}

// What the host knows before any GPU work: the model, the device spec, its calibration and the
// performance model's dense ops.
struct Host {
  fs::path configs, model_file;
  parity::ModelSpec model;
  parity::DeviceSpec device;
  parity::Calibration calibration;
  std::int64_t batch = 0;
  std::vector<parity::OpCost> predicted;
  std::shared_ptr<const parity::GemmCatalog> catalog;  // --gemm-catalog
  double catalog_hbm_bytes_per_s = 0;                  // the ranking's memory floor
  // The step's products ranked as the planner ranks them (the decisions `parity train` runs).
  std::vector<parity::GemmDecision> decisions;
};

fs::path configs_dir(const pb::Options& o) {
  if (!o.configs.empty()) return o.configs;
  if (const char* env = std::getenv("PARITY_CONFIGS")) return env;
  std::error_code ec;
  if (fs::is_directory("configs/models", ec)) return "configs";  // run from the repository root
  return fs::path(PARITY_SOURCE_DIR) / "configs";
}

Host load(const pb::Options& o) {
  Host h;
  h.configs = configs_dir(o);
  std::error_code ec;
  if (o.model.empty()) {
    h.model_file = h.configs / "models" / "mlperf-dlrmv2.yaml";
  } else if (o.model.find('/') != std::string::npos || o.model.ends_with(".yaml") ||
             fs::exists(o.model, ec)) {
    h.model_file = o.model;
  } else {
    h.model_file = h.configs / "models" / fmt::format("{}.yaml", o.model);
  }
  h.model = parity::load_model_spec(h.model_file);
  const std::int64_t batch =
      o.check_on_cpu ? std::min<std::int64_t>(16, h.model.batch_size) : h.model.batch_size;
  h.batch = o.batch > 0 ? o.batch : batch;
  h.device = parity::find_device(o.device, h.configs / "devices");
  h.calibration = parity::calibration_for(h.device, h.configs);
  // The products timed as a plan times them: at the predicted time of the configuration the
  // device's kernel catalog (or --gemm-catalog's) ranks first, where one ranks them.
  parity::Plan p;
  p.per_device_batch = h.batch;
  p.dense_math = o.math;
  const auto ranking =
      o.gemm_catalog.empty()
          ? parity::gemm_catalog_for(h.device, h.configs)
          : std::make_shared<const parity::GemmCatalog>(parity::load_gemm_catalog(o.gemm_catalog));
  p.kernels = parity::plan_kernel_choices(p, h.model, h.device, h.calibration, ranking.get());
  const parity::ProductTimes times = parity::planned_product_times(p, h.model);
  h.predicted = parity::dense_op_costs(h.model, h.batch, o.math, h.device, h.calibration,
                                       o.product_checks, times.empty() ? nullptr : &times);
  if (!o.gemm_catalog.empty()) {
    h.catalog = ranking;
    h.catalog_hbm_bytes_per_s = h.device.hbm_bandwidth.value * h.calibration.hbm_efficiency;
    for (const auto& kc : p.kernels) {
      parity::GemmDecision d{kc.op, kc.problem, {}};
      for (const std::string& key : kc.ranked) {
        parity::GemmKernel k;
        if (parity::find_catalog_kernel(*h.catalog, kc.problem, key, k)) d.ranked.push_back(k);
      }
      if (!d.ranked.empty()) h.decisions.push_back(std::move(d));
    }
  }
  return h;
}

pb::Ceilings measure_ceilings(parity::GpuBackend& be, const pb::Options& o) {
  pb::Ceilings c;
  {
    const std::size_t bytes = std::size_t{2} << 30;
    parity::Buffer a(be, bytes), b(be, bytes);
    parity::gpu::Stream s;
    parity::gpu::fill_uniform(s.get(), a.get(), DType::f32, static_cast<std::int64_t>(bytes / 4),
                              -1.0f, 1.0f, 1, 0);
    c.copy_ms = pb::time_on_stream(s, o.warmup, o.reps, [&](int i) {
      if (i % 2 == 0) {
        parity::gpu::copy_async(b.get(), a.get(), bytes, s.get());
      } else {
        parity::gpu::copy_async(a.get(), b.get(), bytes, s.get());
      }
    });
    c.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / (c.copy_ms * 1e-3);
  }
  {
    // x and y stored as the activations; w an fp32 weight held constant, so that its bf16 copy
    // is made once: the product alone is timed.
    const std::int64_t n = o.product_size;
    const DType act = be.activation_dtype();
    pb::InputSets in;
    const int x = in.add(pb::matrix(act, n, n)), w = in.add(pb::matrix(DType::f32, n, n, true));
    const int y = in.add(pb::matrix(act, n, n));
    parity::gpu::Stream fill;
    in.allocate(be, &fill);
    c.product_ms = pb::time_op(be, o, in, pb::Copies::before, [&](int k) {
      be.linear_forward(in.view(k, x), in.f32(k, w), nullptr, parity::Activation::none,
                        in.view(k, y));
    });
    c.product_flops_per_s = 2.0 * static_cast<double>(n) * n * n / (c.product_ms * 1e-3);
  }
  return c;
}

// The step's ops with the library heuristic's kernels and with the catalog's, each op's fastest
// round of each.
struct AbResult {
  int rounds = 0;
  std::vector<pb::OpResult> heuristic, catalog;
  parity::GemmSelectionCounts counts;  // the catalog backend's products, last round
};

struct Run {
  pb::Ceilings ceilings;
  std::vector<pb::OpResult> ops;
  std::vector<pb::PassResult> passes;
  AbResult ab;
};

// Sums over the ops: measured, roofline and predicted milliseconds.
struct Sum {
  double ms = 0, roofline_ms = 0, predicted_ms = 0;
  int unpredicted = 0;
};

std::map<std::string, Sum> sums(const Run& r) {
  std::map<std::string, Sum> out;
  for (const pb::OpResult& op : r.ops) {
    for (const std::string& key : {std::string("all"), op.category}) {
      Sum& s = out[key];
      s.ms += op.ms;
      s.roofline_ms += pb::roofline_ms(op, r.ceilings);
      if (op.predicted_ms >= 0)
        s.predicted_ms += op.predicted_ms;
      else
        ++s.unpredicted;
    }
  }
  return out;
}

void print_sums(const Run& r) {
  for (const auto& [key, s] : sums(r)) {
    const std::string label = key == "all" ? "all dense ops" : fmt::format("  {}", key);
    fmt::print(
        "{:<20} {:9.3f} ms; roofline {:9.3f} ms (x{:.2f}); predicted {:9.3f} ms (x{:.2f}){}\n",
        label, s.ms, s.roofline_ms, s.ms / s.roofline_ms, s.predicted_ms, s.ms / s.predicted_ms,
        s.unpredicted ? fmt::format(" ({} ops without a prediction)", s.unpredicted) : "");
  }
}

void write_json(const std::string& file, const nlohmann::json& j) {
  if (file.empty()) return;
  const std::string tmp = file + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(1) << "\n";
    if (!f) throw parity::Error(fmt::format("dense_bench: cannot write {}", tmp));
  }
  fs::rename(tmp, file);
}

void write_results(const pb::Options& o, const Host& h, const Run& r) {
  nlohmann::json ops = nlohmann::json::array(), passes = nlohmann::json::array();
  for (const pb::OpResult& op : r.ops) {
    ops.push_back(
        {{"name", op.name},
         {"category", op.category},
         {"ms", op.ms},
         {"flops", op.flops},
         {"bytes", op.bytes},
         {"predicted_ms", op.predicted_ms >= 0 ? nlohmann::json(op.predicted_ms) : nullptr},
         {"roofline_ms", pb::roofline_ms(op, r.ceilings)},
         {"sets", op.sets}});
  }
  for (const pb::PassResult& p : r.passes)
    passes.push_back({{"name", p.name}, {"ms", p.ms}, {"bytes", p.bytes}, {"sets", p.sets}});
  nlohmann::json ab = nullptr;
  if (r.ab.rounds > 0) {
    nlohmann::json abops = nlohmann::json::array();
    for (std::size_t i = 0; i < r.ab.heuristic.size() && i < r.ab.catalog.size(); ++i)
      abops.push_back({{"name", r.ab.heuristic[i].name},
                       {"flops", r.ab.heuristic[i].flops},
                       {"heuristic_ms", r.ab.heuristic[i].ms},
                       {"catalog_ms", r.ab.catalog[i].ms}});
    ab = {{"catalog", o.gemm_catalog},
          {"rounds", r.ab.rounds},
          {"planned_choices", r.ab.counts.planned},
          {"ranked_choices", r.ab.counts.ranked},
          {"heuristic_choices", r.ab.counts.heuristic},
          {"ops", abops}};
  }
  nlohmann::json totals = nlohmann::json::object();
  for (const auto& [key, s] : sums(r))
    totals[key] = {{"ms", s.ms}, {"roofline_ms", s.roofline_ms}, {"predicted_ms", s.predicted_ms}};
  write_json(o.results, {{"device", parity::gpu::device_info().name},
                         {"device_spec", h.device.name},
                         {"calibration", h.calibration.source},
                         {"model", h.model.name},
                         {"model_file", h.model_file.string()},
                         {"batch", h.batch},
                         {"math", parity::dense_math_name(o.math)},
                         {"product_checks", o.product_checks},
                         {"reps", o.reps},
                         {"warmup", o.warmup},
                         {"copy_bytes_per_s", r.ceilings.copy_bytes_per_s},
                         {"copy_ms", r.ceilings.copy_ms},
                         {"product_size", o.product_size},
                         {"product_flops_per_s", r.ceilings.product_flops_per_s},
                         {"product_ms", r.ceilings.product_ms},
                         {"ops", ops},
                         {"passes", passes},
                         {"totals", totals},
                         {"gemm_catalog_ab", ab}});
}

void write_dump(const pb::Options& o, const Host& h, const pb::StepShapes& sh, const Run& r) {
  auto layers = [](const std::vector<pb::Layer>& v) {
    nlohmann::json out = nlohmann::json::array();
    for (const pb::Layer& l : v)
      out.push_back({{"name", l.name},
                     {"in", l.in},
                     {"out", l.out},
                     {"relu", l.act == parity::Activation::relu}});
    return out;
  };
  nlohmann::json ops = nlohmann::json::array();
  for (const pb::OpResult& op : r.ops) ops.push_back({{"name", op.name}, {"sets", op.sets}});
  write_json(o.dump, {{"model", h.model.name},
                      {"batch", sh.batch},
                      {"math", parity::dense_math_name(o.math)},
                      {"features", sh.features},
                      {"bottom", layers(sh.bottom)},
                      {"top", layers(sh.top)},
                      {"interaction", sh.dcn ? "dcnv2" : "dot"},
                      {"n", sh.n},
                      {"d", sh.d},
                      {"rank", sh.rank},
                      {"cross_layers", sh.cross_layers},
                      {"tables", sh.tables},
                      {"inter_out", sh.inter_out},
                      {"activation_dtype", parity::dtype_name(sh.act)},
                      {"x0_dtype", parity::dtype_name(sh.x0)},
                      {"grad_dtype", parity::dtype_name(sh.grad)},
                      {"reps", o.reps},
                      {"warmup", o.warmup},
                      {"product_size", o.product_size},
                      {"ops", ops}});
}

// The products the checks saw; a failure (on random inputs: a false alarm or a wrong product)
// stops the benchmark.
void report_checks(parity::Backend& be) {
  const parity::Backend::ProductChecks c = be.product_checks();
  fmt::print("product checks: {} forward products checked, {} failed\n", c.products, c.failures);
  if (auto* gpu = dynamic_cast<parity::GpuBackend*>(&be))
    fmt::print("product checks: {} of them in one kernel (product and check fused)\n",
               gpu->fused_checks());
  if (c.failures > 0) throw parity::Error("a checked product failed: " + c.first_failure);
}

// Each op of the step once on the CPU backend, in the storage types the GPU uses under the
// dense math: the benchmark's shapes, views and modes meet the backends' shared checks without a
// GPU (the cpu backend reads and writes bf16 views as the GPU does).
int check_on_cpu(const pb::Options& o, const Host& h) {
  parity::CpuBackend be;
  if (o.product_checks) be.set_product_checks(true);
  const DType act = o.math == DenseMath::bf16 ? DType::bf16 : DType::f32;
  const pb::StepShapes sh(h.model, h.batch, act);
  pb::Options once = o;
  once.reps = 1;
  once.warmup = 0;
  const pb::Ceilings c{1e12, 1e12, 0, 0};  // placeholders: nothing is measured here
  fmt::print(
      "dense_bench --check-on-cpu: {} at batch {}, activations in {} (times are the CPU's)\n",
      h.model.name, h.batch, parity::dtype_name(act));
  pb::print_op_header();
  const auto ops = pb::measure_step(be, once, sh, h.predicted, c, nullptr);
  const auto unpredicted = std::count_if(ops.begin(), ops.end(),
                                         [](const pb::OpResult& r) { return r.predicted_ms < 0; });
  fmt::print("dense_bench --check-on-cpu: {} ops ran; {} without a prediction\n", ops.size(),
             unpredicted);
  if (o.product_checks) report_checks(be);
  return unpredicted == 0 ? 0 : 1;
}

// Each op's fastest time over the rounds so far.
void keep_fastest(std::vector<pb::OpResult>& best, std::vector<pb::OpResult> now) {
  if (best.empty()) {
    best = std::move(now);
    return;
  }
  for (std::size_t i = 0; i < best.size() && i < now.size(); ++i)
    best[i].ms = std::min(best[i].ms, now[i].ms);
}

// The step's ops on fresh backends, alternating the library heuristic's kernels and the
// catalog's, so that drift in the GPU's clocks falls on both alike.
AbResult measure_ab(const pb::Options& o, const Host& h, const pb::StepShapes& sh,
                    const pb::Ceilings& c) {
  AbResult ab;
  ab.rounds = o.ab_rounds;
  const parity::gpu::Stream fill;
  for (int round = 1; round <= o.ab_rounds; ++round) {
    fmt::print("\nround {} of {}: the library heuristic's kernels\n", round, o.ab_rounds);
    pb::print_op_header();
    {
      parity::GpuBackend be(o.math);
      be.use_fused_checks(!o.library_checks);
      if (o.product_checks) be.set_product_checks(true);
      keep_fastest(ab.heuristic, pb::measure_step(be, o, sh, h.predicted, c, &fill));
    }
    fmt::print("\nround {} of {}: the kernel catalog's choices ({})\n", round, o.ab_rounds,
               o.gemm_catalog);
    pb::print_op_header();
    {
      parity::GpuBackend be(o.math);
      be.use_fused_checks(!o.library_checks);
      if (o.product_checks) be.set_product_checks(true);
      be.use_gemm_catalog(h.catalog, h.catalog_hbm_bytes_per_s, h.decisions);
      keep_fastest(ab.catalog, pb::measure_step(be, o, sh, h.predicted, c, &fill));
      ab.counts = be.gemm_selection_counts();
    }
  }
  fmt::print(
      "\nkernel choices, the fastest of {} rounds each ({} products from the plan's decisions, "
      "{} ranked when first run (not in the plan), {} from the heuristic)\n",
      o.ab_rounds, ab.counts.planned, ab.counts.ranked, ab.counts.heuristic);
  fmt::print("{:<20} {:>12} {:>12} {:>9}\n", "op", "heuristic ms", "catalog ms", "speed-up");
  double h_all = 0, c_all = 0, h_mm = 0, c_mm = 0;
  for (std::size_t i = 0; i < ab.heuristic.size() && i < ab.catalog.size(); ++i) {
    const pb::OpResult &x = ab.heuristic[i], &y = ab.catalog[i];
    fmt::print("{:<20} {:12.3f} {:12.3f} {:9.3f}\n", x.name, x.ms, y.ms, x.ms / y.ms);
    h_all += x.ms;
    c_all += y.ms;
    if (x.flops > 0) {
      h_mm += x.ms;
      c_mm += y.ms;
    }
  }
  fmt::print("{:<20} {:12.3f} {:12.3f} {:9.3f}\n", "ops with products", h_mm, c_mm, h_mm / c_mm);
  fmt::print("{:<20} {:12.3f} {:12.3f} {:9.3f}\n", "all dense ops", h_all, c_all, h_all / c_all);
  return ab;
}

void run(const pb::Options& o, const Host& h, Run& r) {
  parity::GpuBackend be(o.math);
  const pb::StepShapes sh(h.model, h.batch, be.activation_dtype());
  const auto& d = parity::gpu::device_info();
  fmt::print(
      "dense_bench on {} ({} SMs, L2 {} MB, {:.1f} GB): {} at batch {}, {} dense math, "
      "activations in {}\n",
      d.name, d.multiprocessor_count, d.l2_cache_bytes >> 20, d.total_memory_bytes / 1e9,
      h.model.name, h.batch, parity::dense_math_name(o.math), parity::dtype_name(sh.act));
  fmt::print("predictions for {} ({}); median of {} calls after {} or more warm-up calls\n",
             h.device.name, h.calibration.source, o.reps, o.warmup);
  const auto runtime = parity::match_device(d.name, h.configs / "devices");
  if (!runtime || runtime->name != h.device.name)
    fmt::print("note: this GPU is {}, the predictions are for {}\n",
               runtime ? runtime->name : d.name, h.device.name);
  r.ceilings = measure_ceilings(be, o);
  const pb::Ceilings& c = r.ceilings;
  fmt::print(
      "ceilings measured now: copy {:.2f} TB/s (2 GiB read + 2 GiB written in {:.3f} ms); "
      "{} product {}^3 {:.1f} TFLOP/s ({:.3f} ms)\n\n",
      c.copy_bytes_per_s / 1e12, c.copy_ms, parity::dense_math_name(o.math), o.product_size,
      c.product_flops_per_s / 1e12, c.product_ms);
  std::fflush(stdout);
  // The ceilings above are the products' own; the step's forward products are checked.
  if (o.product_checks) {
    be.use_fused_checks(!o.library_checks);
    be.set_product_checks(true);
    fmt::print("with checksummed forward products{}, measured and predicted\n",
               o.library_checks ? " (through the library and the row pass)" : "");
  }
  pb::print_op_header();
  const parity::gpu::Stream fill;
  r.ops = pb::measure_step(be, o, sh, h.predicted, c, &fill);
  if (o.product_checks) report_checks(be);
  print_sums(r);
  if (o.passes) r.passes = pb::measure_passes(be, o, sh, h.model, c);
  write_dump(o, h, sh, r);
  if (h.catalog != nullptr) r.ab = measure_ab(o, h, sh, c);
}

}  // namespace

int main(int argc, char** argv) {
  pb::Options o;
  try {
    if (!parse(argc, argv, o)) {
      fmt::print("{}", kUsage);
      return 0;
    }
  } catch (const UsageError& e) {
    fmt::print(stderr, "dense_bench: {}\n{}", e.what(), kUsage);
    return 2;
  }
  Host h;
  try {
    h = load(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dense_bench: {}\n", e.what());
    return 2;
  }
  if (o.check_on_cpu) {
    try {
      return check_on_cpu(o, h);
    } catch (const std::exception& e) {
      fmt::print(stderr, "dense_bench --check-on-cpu: {}\n", e.what());
      return 1;
    }
  }
  if (parity::gpu::device_count() == 0) {
    fmt::print(stderr, "dense_bench: no GPU to measure on: {}\n", parity::gpu::no_device_reason());
    return 77;
  }
  Run r;
  try {
    run(o, h, r);
    write_results(o, h, r);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dense_bench: {}\n", e.what());
    try {
      write_results(o, h, r);  // what was measured before the failure
    } catch (const std::exception&) {
    }
    return 1;
  }
  return 0;
}
