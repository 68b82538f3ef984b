// Whether a larger batch still converges under a recipe's learning-rate rule: a model trained at
// its reference batch for `steps` steps, then at `factor` times the batch for steps / factor
// steps (equal examples seen) with the learning rates scaled by each rule (with_batch: linear,
// square root, with and without warm-up), on the CPU; the held-out AUC of each run and its
// difference from the reference's, per seed. Results in docs/perf/training.md.
//   build/batch_rules [model] [steps] [factor] [seeds] [eval_examples]
// Default: tiny, 3200 steps, 4x, seeds 1,2,3, 65,536 held-out examples.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/train.h"

namespace {

std::int64_t positive(const char* text, const char* what) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1)
    throw parity::InputError(
        fmt::format("batch_rules: {} must be a positive integer, got '{}'", what, text));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using parity::LrScaling;
  try {
    const std::string name = argc > 1 ? argv[1] : "tiny";
    const std::int64_t steps = argc > 2 ? positive(argv[2], "steps") : 3200;
    const std::int64_t factor = argc > 3 ? positive(argv[3], "factor") : 4;
    std::vector<std::uint64_t> seeds;
    std::stringstream list(argc > 4 ? argv[4] : "1,2,3");
    for (std::string s; std::getline(list, s, ',');)
      seeds.push_back(static_cast<std::uint64_t>(positive(s.c_str(), "a seed")));
    const std::int64_t eval = argc > 5 ? positive(argv[5], "eval_examples") : 65536;
    if (steps % factor != 0 || steps / factor < 8)
      throw parity::InputError(fmt::format(
          "batch_rules: steps ({}) must be a multiple of factor ({}) and at least 8 times it (the "
          "warm-ups are an eighth and a quarter of the larger batch's steps)",
          steps, factor));
    const parity::ModelSpec model =
        parity::load_model_spec(fs::path(PARITY_SOURCE_DIR) / "configs/models" / (name + ".yaml"));
    struct Rule {
      const char* name;
      LrScaling scaling;
      std::int64_t warmup;
    };
    const std::int64_t large_steps = steps / factor;
    const std::vector<Rule> rules = {{"linear", LrScaling::linear, 0},
                                     {"linear, warm-up 1/4", LrScaling::linear, large_steps / 4},
                                     {"sqrt", LrScaling::sqrt, 0},
                                     {"sqrt, warm-up 1/8", LrScaling::sqrt, large_steps / 8},
                                     {"sqrt, warm-up 1/4", LrScaling::sqrt, large_steps / 4}};
    fmt::print("{}: batch {} x {} steps against batch {} x {} steps, {} held-out examples\n", name,
               model.batch_size, steps, model.batch_size * factor, large_steps, eval);
    fmt::print("{:>5} {:>10} {:<22} {:>8} {:>9}\n", "seed", "reference", "rule", "AUC", "diff");
    for (const std::uint64_t seed : seeds) {
      parity::TrainConfig ref;
      ref.model = model;
      ref.batch = model.batch_size;
      ref.steps = steps;
      ref.seed = seed;
      ref.eval_examples = eval;
      const double base = parity::train(ref, nullptr).auc;
      for (const Rule& r : rules) {
        parity::ModelSpec m = model;
        m.lr_scaling = r.scaling;
        m.lr_warmup_steps = r.warmup;
        parity::TrainConfig cfg = ref;
        cfg.batch = model.batch_size * factor;
        cfg.model = parity::with_batch(m, cfg.batch);
        cfg.steps = large_steps;
        const double auc = parity::train(cfg, nullptr).auc;
        fmt::print("{:>5} {:>10.4f} {:<22} {:>8.4f} {:>+9.4f}\n", seed, base, r.name, auc,
                   auc - base);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  return 0;
}
