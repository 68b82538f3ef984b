// Shared helpers of the parity subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

namespace parity::cli {

// The configs/ folder: $PARITY_CONFIGS, ./configs, or the source tree's.
std::filesystem::path configs_dir();
// A model given as a path to a YAML file or as a zoo name ("tiny" -> configs/models/tiny.yaml).
std::filesystem::path resolve_model(const std::string& name_or_path);

void add_train_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_data_command(CLI::App& app);

}  // namespace parity::cli
