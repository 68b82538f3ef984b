// parity calibrate: measure on this machine's GPU what the performance model needs of it.
#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common.h"
#include "parity/backend.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/select.h"
#include "parity/spec.h"

namespace parity::cli {
namespace {

struct CalibrateArgs {
  std::string device;
  std::string types = "bf16,fp16,tf32,fp32,fp8";
  std::string out;
  std::string samples;
  std::string prune;
};

GemmType parse_gemm_type(const std::string& s) {
  for (GemmType t : {GemmType::f32, GemmType::tf32, GemmType::bf16, GemmType::f16, GemmType::e4m3})
    if (s == gemm_type_name(t) || (t == GemmType::e4m3 && s == "fp8")) return t;
  throw InputError(fmt::format("--types: '{}' is not one of fp32, tf32, bf16, fp16, fp8", s));
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure on this machine's GPU the kernel catalog the kernel selection ranks: every\n"
      "configuration of the BLAS library for the forward, input-gradient and weight-gradient\n"
      "products of each operand type, timed on six shapes to which its fixed, per-tile and\n"
      "per-k-step costs are fitted (docs/perf/kernel-selection.md). Takes a few minutes; needs a "
      "GPU build (--prune needs none).\n\n"
      "Example:\n  parity calibrate --device h200 --out configs/calibration/h200-gemm.json");
  cmd->add_option("--device", args->device,
                  "Device catalog key (configs/devices) or YAML file of the GPU measured")
      ->required();
  cmd->add_option("--types", args->types, "Operand types, comma-separated")->capture_default_str();
  cmd->add_option("--out", args->out,
                  "Catalog file to write (default configs/calibration/DEVICE-gemm.json)");
  cmd->add_option("--prune", args->prune,
                  "Measure nothing: read this catalog, keep the configurations the ranking can "
                  "prefer (as calibration does after measuring) and write it to --out (default: "
                  "the same file). Needs no GPU")
      ->check(CLI::ExistingFile);
  cmd->add_option("--samples", args->samples,
                  "Also write every configuration timed, kept or not, with its runs (shape, waves, "
                  "k steps, seconds) and fitted costs, one JSON object a line");
  cmd->callback([args] {
    const DeviceSpec dev = find_device(args->device, configs_dir() / "devices");
    // The device's achieved memory rate: the ranking's floor, in pruning as in measuring.
    const double hbm = dev.hbm_bandwidth.value * calibration_for(dev, configs_dir()).hbm_efficiency;
    if (!args->prune.empty()) {
      GemmCatalog c = load_gemm_catalog(args->prune);
      std::size_t before = 0, after = 0;
      for (const auto& g : c.groups) before += g.kernels.size();
      prune_gemm_catalog(c, hbm);
      for (const auto& g : c.groups) after += g.kernels.size();
      c.measured += fmt::format("; pruned by parity calibrate --prune on {}", today());
      const std::string out = args->out.empty() ? args->prune : args->out;
      save_gemm_catalog(c, out);
      fmt::print("wrote {}: {} of {} configurations kept\n", out, after, before);
      return;
    }
    std::vector<GemmType> types;
    std::size_t b = 0;
    while (b <= args->types.size()) {
      const std::size_t e = args->types.find(',', b);
      types.push_back(parse_gemm_type(args->types.substr(b, e == std::string::npos ? e : e - b)));
      if (e == std::string::npos) break;
      b = e + 1;
    }
    const std::string gpu = detect_gpu();
    if (gpu.empty())
      throw InputError(
          "no GPU is usable here (or this build has no GPU backend): parity calibrate measures "
          "the GPU it runs on");
    fmt::print("parity calibrate: {} (spec {}), operand types {}\n", gpu, dev.name, args->types);
    std::ofstream samples;
    if (!args->samples.empty()) {
      samples.open(args->samples);
      if (!samples) throw InputError(fmt::format("--samples: cannot write '{}'", args->samples));
    }
    const auto started = std::chrono::steady_clock::now();
    GemmCatalog c = measure_gemm_catalog_here(
        types, dev.name, hbm,
        [](const std::string& line) {
          fmt::print("  {}\n", line);
          std::fflush(stdout);
        },
        [&](const MeasuredKernel& m) {
          if (!samples.is_open()) return;
          // What the catalog holds of the configuration, and its runs.
          const CatalogKernel& k = m.kernel;
          nlohmann::json line = {{"kind", m.kind.describe()},
                                 {"key", k.kernel.key()},
                                 {"tile", {k.kernel.tile_m, k.kernel.tile_n}},
                                 {"k_step", k.kernel.tile_k},
                                 {"cluster", {k.kernel.cluster_m, k.kernel.cluster_n}},
                                 {"max_split_k", k.max_split_k},
                                 {"min_align", {k.min_align_a, k.min_align_b, k.min_align_d}},
                                 {"slots", k.slots},
                                 {"fixed_s", k.fixed_s},
                                 {"tile_s", k.tile_s},
                                 {"kstep_s", k.kstep_s},
                                 {"stream_tile_s", k.stream_tile_s},
                                 {"stream_kstep_s", k.stream_kstep_s},
                                 {"rms", m.rms_relative_error},
                                 {"kept", m.kept},
                                 {"runs", nlohmann::json::array()}};
          for (std::size_t i = 0; i < m.samples.size(); ++i)
            line["runs"].push_back({m.shapes[i].m, m.shapes[i].n, m.shapes[i].k, m.samples[i].waves,
                                    m.samples[i].steps, m.samples[i].seconds});
          line["stream_runs"] = nlohmann::json::array();
          for (std::size_t i = 0; i < m.stream_samples.size(); ++i)
            line["stream_runs"].push_back({m.stream_shapes[i].m, m.stream_shapes[i].n,
                                           m.stream_shapes[i].k, m.stream_samples[i].waves,
                                           m.stream_samples[i].steps, m.stream_samples[i].seconds});
          samples << line.dump() << "\n";
        });
    if (samples.is_open()) {
      samples.close();
      if (!samples) throw InputError(fmt::format("--samples: writing '{}' failed", args->samples));
    }
    c.measured = fmt::format("{} on {} by parity calibrate --device {} --types {}", today(), gpu,
                             args->device, args->types);
    const std::string out =
        args->out.empty() ? (configs_dir() / "calibration" / (dev.name + "-gemm.json")).string()
                          : args->out;
    save_gemm_catalog(c, out);
    std::size_t kept = 0;
    for (const auto& g : c.groups) kept += g.kernels.size();
    fmt::print("wrote {}: {} kinds of product, {} configurations, {} {}, in {:.0f} s\n", out,
               c.groups.size(), kept, c.library, c.library_version,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  });
}

}  // namespace parity::cli
