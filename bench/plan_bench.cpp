// How long the planner takes: make_plan for a model, device and GPU count, repeated, with
// the median and the fastest run, and a check that every run gives the same plan.
//   build/plan_bench [model] [device] [gpus] [runs]
// Default: prod-many-features (1000 tables) on 128 x h200, 10 runs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "parity/plan.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path configs = fs::path(PARITY_SOURCE_DIR) / "configs";
  const std::string model = argc > 1 ? argv[1] : "prod-many-features";
  const std::string device = argc > 2 ? argv[2] : "h200";
  const int gpus = argc > 3 ? std::atoi(argv[3]) : 128;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 10;
  if (runs < 1) {
    fmt::print(stderr, "plan_bench: runs must be a positive integer, got '{}'\n", argv[4]);
    return 2;
  }
  try {
    const parity::ModelSpec m = parity::load_model_spec(configs / "models" / (model + ".yaml"));
    const parity::DeviceSpec d = parity::find_device(device, configs / "devices");
    parity::PlannerOptions opt;
    opt.configs_dir = configs;
    std::vector<double> ms;
    std::string first;
    bool same = true;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const parity::Plan p = parity::make_plan(m, d, gpus, opt);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      const std::string json = parity::plan_to_json(p);
      if (r == 0) first = json;
      same &= json == first;
    }
    std::sort(ms.begin(), ms.end());
    fmt::print(
        "plan_bench: {} ({} tables) on {} x {}: median {:.1f} ms, fastest {:.1f} ms over {} runs; "
        "identical plans: {}\n",
        model, m.num_tables(), gpus, device, ms[ms.size() / 2], ms.front(), runs,
        same ? "yes" : "NO");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "plan_bench: {}\n", e.what());
    return 2;
  }
}
