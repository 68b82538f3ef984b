// Shared helpers of the parity subcommands.
#pragma once

#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <filesystem>
#include <string>

namespace parity::cli {

// The configs/ folder: $PARITY_CONFIGS, ./configs, or the source tree's.
std::filesystem::path configs_dir();
// A model given as a path to a YAML file or as a zoo name ("tiny" -> configs/models/tiny.yaml).
std::filesystem::path resolve_model(const std::string& name_or_path);

// Integer options at least `lo`, with a plain message ("--batch: 0 is not a positive integer").
// CLI11's PositiveNumber and NonNegativeNumber print the range of a double instead.
inline CLI::Validator integer_at_least(long long lo, const std::string& what) {
  return CLI::Validator(
      [lo, what](std::string& s) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) return fmt::format("'{}' is not an integer", s);
        if (v < lo) return fmt::format("{} is not {}", s, what);
        return std::string();
      },
      lo > 0 ? "POSITIVE" : "NONNEGATIVE");
}
inline CLI::Validator positive_integer() {
  return integer_at_least(1, "a positive integer");
}
inline CLI::Validator nonnegative_integer() {
  return integer_at_least(0, "a non-negative integer");
}

void add_train_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_data_command(CLI::App& app);

}  // namespace parity::cli
