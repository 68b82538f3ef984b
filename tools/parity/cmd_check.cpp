// parity check: validate model and device specs and summarise them.
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "common.h"
#include "parity/error.h"
#include "parity/spec.h"

namespace parity::cli {
namespace {

bool looks_like_device(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  static const std::regex vendor(R"((^|\n)vendor\s*:)");
  return std::regex_search(ss.str(), vendor);
}

}  // namespace

void add_check_command(CLI::App& app) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Validate model and device specs (YAML) and print a one-line summary of each.\n"
      "Errors name the file, line and field.\n\n"
      "Examples:\n  parity check configs/models/*.yaml configs/devices/*.yaml\n"
      "  parity check tiny");
  cmd->add_option("files", *files, "Spec files, or zoo model names")->required();
  cmd->callback([files] {
    int bad = 0;
    for (const auto& f : *files) {
      const std::string path = resolve_model(f).string();
      try {
        if (looks_like_device(path)) {
          const DeviceSpec d = load_device_spec(path);
          fmt::print(
              "ok  {:<28} device {:<20} {:.0f} GB HBM at {:.2f} TB/s, bf16 {:.0f} TFLOP/s, "
              "tf32 {}\n",
              path, d.display_name, d.hbm_bytes.value / 1e9, d.hbm_bandwidth.value / 1e12,
              d.bf16_flops.value / 1e12,
              d.has_tf32() ? fmt::format("{:.0f} TFLOP/s", d.tf32_flops->value / 1e12)
                           : std::string("none"));
        } else {
          const ModelSpec m = load_model_spec(path);
          fmt::print(
              "ok  {:<28} model {:<18} {} tables, {:.3g} embedding + {:.3g} dense params, "
              "{} lookups/example, {}\n",
              path, m.name, m.num_tables(), static_cast<double>(m.embedding_parameters()),
              static_cast<double>(m.dense_parameters()), m.lookups_per_example(),
              interaction_name(m.interaction.kind));
        }
      } catch (const InputError& e) {
        fmt::print(stderr, "bad {}\n", e.what());
        ++bad;
      }
    }
    if (bad > 0)
      throw InputError(fmt::format("{} of {} files failed validation", bad, files->size()));
  });
}

}  // namespace parity::cli
