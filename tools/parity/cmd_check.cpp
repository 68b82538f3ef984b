// parity check: validate model and device specs and summarise them.
#include <fmt/core.h>

#include <filesystem>
#include <memory>
#include <regex>

#include "common.h"
#include "core/input_file.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/spec.h"

namespace parity::cli {
namespace {

bool looks_like_device(const std::string& path) {
  std::string text;
  try {
    text = read_input_file(path, "spec", std::size_t{16} << 20);
  } catch (const InputError&) {
    return false;  // the loader gives the error
  }
  static const std::regex vendor(R"((^|\n)vendor\s*:)");
  return std::regex_search(text, vendor);
}

// A spec file, a zoo model name or a device catalog key ("tiny", "h200").
std::string resolve_spec(const std::string& f) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (f.find('/') != std::string::npos || f.ends_with(".yaml") || fs::exists(f, ec)) return f;
  const fs::path device = configs_dir() / "devices" / (f + ".yaml");
  const fs::path model = resolve_model(f);
  if (!fs::exists(model, ec) && fs::exists(device, ec)) return device.string();
  return model.string();
}

}  // namespace

void add_check_command(CLI::App& app) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Validate model and device specs (YAML) and print a one-line summary of each.\n"
      "Errors name the file, line and field.\n\n"
      "Examples:\n  parity check configs/models/*.yaml configs/devices/*.yaml\n"
      "  parity check tiny h200");
  cmd->add_option("files", *files, "Spec files, zoo model names or device catalog keys")
      ->required();
  cmd->callback([files] {
    int bad = 0;
    for (const auto& f : *files) {
      const std::string path = resolve_spec(f);
      try {
        if (looks_like_device(path)) {
          const DeviceSpec d = load_device_spec(path);
          fmt::print(
              "ok  {:<28} device {:<20} {:.0f} GB HBM at {:.2f} TB/s, bf16 {:.0f} TFLOP/s, "
              "tf32 {}\n",
              path, d.display_name, d.hbm_bytes.value / 1e9, d.hbm_bandwidth.value / 1e12,
              d.bf16_flops.value / 1e12,
              d.tf32_native() ? fmt::format("{:.0f} TFLOP/s", d.tf32_flops->value / 1e12)
              : d.has_tf32()  ? fmt::format("{:.0f} TFLOP/s emulated ({})",
                                            d.dense_flops(DenseMath::tf32) / 1e12,
                                            name_in(kTf32EmulationNames, d.tf32_emulation))
                              : std::string("none"));
        } else {
          const ModelSpec m = load_model_spec(path);
          if (m.hstu) {
            const HstuSpec& h = *m.hstu;
            fmt::print(
                "ok  {:<28} model {:<18} hstu, {} layers of d {}, histories up to {} events, {} "
                "sequence + {} contextual features, {:.3g} embedding + {:.3g} dense params\n",
                path, m.name, h.layers, h.model_dim, h.sequence.max_len, h.sequence.features.size(),
                m.tables.size(), static_cast<double>(m.embedding_parameters()),
                static_cast<double>(m.dense_parameters()));
            const SequenceMoments sm = sequence_moments(m);
            const HstuLayerWork w = hstu_layer_work(m);
            fmt::print(
                "    per example {:.0f} tokens on average ({:.0f} at most), {:.3g} attention "
                "pairs; per layer {:.3g} GFLOP forward ({:.0f}% attention), {:.3g} backward; "
                "activations {:.0f} B/token/layer ({:.0f} with recompute)\n",
                sm.tokens, sm.tokens_max, sm.pairs,
                (w.projection_flops_forward + w.attention_flops_forward) / 1e9,
                100.0 * w.attention_flops_forward /
                    (w.projection_flops_forward + w.attention_flops_forward),
                (w.projection_flops_backward + w.attention_flops_backward) / 1e9,
                w.activation_bytes_per_token, w.activation_bytes_per_token_recompute);
          } else {
            fmt::print(
                "ok  {:<28} model {:<18} {} tables, {:.3g} embedding + {:.3g} dense params, "
                "{} lookups/example, {}\n",
                path, m.name, m.num_tables(), static_cast<double>(m.embedding_parameters()),
                static_cast<double>(m.dense_parameters()), m.lookups_per_example(),
                interaction_name(m.interaction.kind));
          }
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
