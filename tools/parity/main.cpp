// parity: co-designed training of recommendation models.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "parity/error.h"

namespace parity::cli {

std::filesystem::path configs_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("PARITY_CONFIGS")) return env;
  std::error_code ec;
  if (fs::is_directory("configs/models", ec)) return "configs";
  return fs::path(PARITY_SOURCE_DIR) / "configs";
}

std::filesystem::path resolve_model(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".yaml") ||
      fs::exists(name_or_path, ec))
    return name_or_path;
  return configs_dir() / "models" / fmt::format("{}.yaml", name_or_path);
}

}  // namespace parity::cli

namespace {

// OpenMP's default wait policy spins between parallel regions. parity runs two OpenMP teams (the
// data loader's thread and the training thread), and machines are often shared: spinning threads
// then take the cores the working ones need, and every small parallel region waits for a
// scheduler slice (docs/architecture.md, "Threads on the host", has the measurement). The
// runtime reads the policy when the program loads, so parity sets it and starts itself again,
// once, unless the user chose a policy; only for the subcommands that run OpenMP (train, data).
void prefer_passive_openmp(int argc, char** argv) {
  if (argc < 2 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "data") != 0)) return;
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("PARITY_NO_REEXEC") != nullptr)
    return;
  if (::setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: go on with the default policy
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp(argc, argv);
  CLI::App app{
      "parity trains recommendation models (DLRM with DCNv2 or dot interaction) with a recipe\n"
      "co-designed for each device.\n\n"
      "Example:\n  parity train                       # the tiny model on synthetic data\n"
      "  parity train --model mlperf-dlrmv2 --steps 100 --batch 4096",
      "parity"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "parity 0.1.0");
  parity::cli::add_train_command(app);
  parity::cli::add_plan_command(app);
  parity::cli::add_check_command(app);
  parity::cli::add_data_command(app);
  parity::cli::add_calibrate_command(app);
  parity::cli::add_bench_command(app);
  parity::cli::add_ledger_command(app);
  parity::cli::add_doctor_command(app);
  // A first word that is no command: said plainly (CLI11 would say only that one is required, and
  // `parity doctr --help` would print the main help and succeed).
  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      fmt::print(stderr,
                 "parity: error: '{}' is not a command; the commands are {} (parity --help)\n",
                 argv[1], fmt::join(names, ", "));
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const parity::InputError& e) {
    fmt::print(stderr, "parity: error: {}\n", e.what());
    return 2;
  } catch (const parity::NumericalError& e) {
    fmt::print(stderr, "parity: stopped: {}\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "parity: failed: {}\n", e.what());
    return 1;
  }
  return 0;
}
