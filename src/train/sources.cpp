// The batch sources of a training run (sources.h).
#include "sources.h"

#include <fmt/core.h>

#include <algorithm>

#include "parity/error.h"

namespace parity::train_detail {

Sources make_sources(const TrainConfig& cfg) {
  const ModelSpec& spec = cfg.model;
  Sources s;
  if (cfg.train_data) {
    s.train = cfg.train_data();
    s.eval = cfg.eval_data();
    if (!s.train || !s.eval)
      throw InputError(
          "TrainConfig::train_data or eval_data made no batch source (a null pointer)");
  } else if (!cfg.shard_dir.empty()) {
    s.train = make_shard_source(cfg.shard_dir, spec, Split::train, /*wrap=*/cfg.steps > 0);
    s.eval = make_shard_source(cfg.shard_dir, spec, Split::eval, /*wrap=*/false);
  } else if (!cfg.train_files.empty()) {
    const CriteoOptions options{cfg.on_bad_line, 10};
    s.train = make_criteo_source(cfg.train_files, spec, options);
    s.eval = make_criteo_source(cfg.eval_files, spec, options);
  } else {
    s.train = make_synthetic_source(spec, cfg.seed, Split::train);
    s.eval = make_synthetic_source(spec, cfg.seed, Split::eval);
  }
  return s;
}

void check_eval_data(BatchSource& eval, std::int64_t batch, std::int64_t eval_examples) {
  eval.seek(0);
  Batch b;
  std::int64_t seen = 0;
  while (seen < eval_examples && eval.next(std::min(batch, eval_examples - seen), b) && b.size > 0)
    seen += b.size;
  if (seen == 0)
    throw InputError(
        fmt::format("the evaluation data ({}) gave no example to evaluate on", eval.describe()));
}

}  // namespace parity::train_detail
