#include "run_record.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <system_error>
#include <utility>

#include "parity/checkpoint.h"
#include "parity/error.h"

namespace parity::train_detail {
namespace {

// 2: checksums in the metadata (checkpoint.h) and the recipe's numerics.
constexpr const char* kFormat = "parity-checkpoint-2";
constexpr const char* kFormatNoChecksums = "parity-checkpoint-1";

// Exact decimal forms, so that a value read back compares equal to the one written.
std::string exact(double v) {
  return fmt::format("{}", v);
}

// The initial accumulator only where set, so that the records of runs without one read as before.
std::string optimizer_text(const OptimizerSpec& o) {
  std::string text =
      fmt::format("{} lr {} eps {} beta1 {} beta2 {} weight_decay {}", optimizer_name(o.kind),
                  exact(o.lr), exact(o.eps), exact(o.beta1), exact(o.beta2), exact(o.weight_decay));
  if (o.initial_accumulator != 0.0)
    text += fmt::format(" initial_accumulator {}", exact(o.initial_accumulator));
  return text;
}

}  // namespace

RunRecord run_record(const ModelSpec& model, std::int64_t batch, std::uint64_t seed,
                     DenseMath dense_math, std::string data) {
  RunRecord r{model.name,
              batch,
              seed,
              std::string(optimizer_name(model.embedding_optimizer.kind)),
              std::string(optimizer_name(model.dense_optimizer.kind)),
              std::string(dense_math_name(dense_math)),
              std::move(data),
              {}};
  std::string dtypes;
  for (const TableSpec& t : model.tables)
    dtypes += fmt::format("{}{}:{}", dtypes.empty() ? "" : ",", t.name, dtype_name(t.dtype));
  r.recipe = {
      {"embedding_optimizer", r.embedding_optimizer},
      {"dense_optimizer", r.dense_optimizer},
      {"dense_math", r.dense_math},
      {"recipe.embedding_optimizer", optimizer_text(model.embedding_optimizer)},
      {"recipe.dense_optimizer", optimizer_text(model.dense_optimizer)},
      {"recipe.table_dtypes", dtypes},
      {"recipe.lr_warmup", model.lr_factor(0) < 1.0
                               ? fmt::format("{} steps from {} of the rates", model.lr_warmup_steps,
                                             exact(model.lr_factor(0)))
                               : std::string("none")}};
  return r;
}

std::map<std::string, std::string> checkpoint_metadata(const RunRecord& run, std::int64_t step) {
  std::map<std::string, std::string> m = {{"format", kFormat},
                                          {"model", run.model},
                                          {"step", fmt::format("{}", step)},
                                          {"batch", fmt::format("{}", run.batch)},
                                          {"seed", fmt::format("{}", run.seed)},
                                          {"examples_seen", fmt::format("{}", step * run.batch)},
                                          {"data", run.data}};
  for (const auto& [key, value] : run.recipe) m[key] = value;
  return m;
}

std::int64_t resumable_step(const std::filesystem::path& path, const RunRecord& run) {
  const std::map<std::string, std::string> metadata = read_checkpoint_metadata(path);
  const std::string file = path.string();
  auto meta = [&](const std::string& key) {
    const auto it = metadata.find(key);
    if (it == metadata.end())
      throw InputError(fmt::format("checkpoint '{}': metadata '{}' is missing", file, key));
    return it->second;
  };
  if (meta("format") != kFormat && meta("format") != kFormatNoChecksums)
    throw InputError(
        fmt::format("checkpoint '{}': format '{}', expected '{}'", file, meta("format"), kFormat));
  if (meta("model") != run.model)
    throw InputError(
        fmt::format("checkpoint '{}' is of model '{}', not '{}'", file, meta("model"), run.model));
  if (meta("batch") != fmt::format("{}", run.batch) || meta("seed") != fmt::format("{}", run.seed))
    throw InputError(fmt::format(
        "checkpoint '{}' was trained with batch {} and seed {}; resume with the same --batch and "
        "--seed (the data order depends on both)",
        file, meta("batch"), meta("seed")));
  // The recipe must be the one the checkpoint was trained with (a plan made again may differ);
  // checkpoints that predate a key do not constrain it.
  for (const auto& [key, now] : run.recipe) {
    const auto it = metadata.find(key);
    if (it != metadata.end() && it->second != now)
      throw InputError(fmt::format(
          "checkpoint '{}' was trained with {} '{}', this run has '{}'; resume with the same "
          "plan (--plan), --batch and model file (learning rates follow the batch)",
          file, key, it->second, now));
  }
  const std::string text = meta("step");
  std::int64_t step = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  // The data are positioned at step x batch examples: that product must be a count.
  if (ec != std::errc() || end != text.data() + text.size() || step < 0 ||
      step > std::numeric_limits<std::int64_t>::max() / std::max<std::int64_t>(run.batch, 1))
    throw InputError(
        fmt::format("checkpoint '{}': metadata 'step' is '{}', not a step count", file, text));
  const std::string name = path.filename().string();
  if (name.starts_with("step-") && name != fmt::format("step-{}.safetensors", step) &&
      name != fmt::format("step-{}", step))
    throw InputError(
        fmt::format("checkpoint '{}' holds step {} by its metadata, not the step its "
                    "name says",
                    file, step));
  return step;
}

}  // namespace parity::train_detail
