// Shared helpers of the parity subcommands.
#pragma once

#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

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

// A seed: a decimal whole number in [0, 2^64 - 1] ("-1" and "2^64" are refused, not wrapped).
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return fmt::format("'{}' is not a whole number from 0 to 18446744073709551615", s);
        return std::string();
      },
      "SEED");
}

void add_train_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_ledger_command(CLI::App& app);
void add_doctor_command(CLI::App& app);

}  // namespace parity::cli
