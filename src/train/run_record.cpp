#include "run_record.h"

#include <fmt/core.h>

#include <exception>
#include <utility>

#include "parity/checkpoint.h"
#include "parity/error.h"

namespace parity::train_detail {
namespace {

constexpr const char* kFormat = "parity-checkpoint-1";

}  // namespace

std::map<std::string, std::string> checkpoint_metadata(const RunRecord& run, std::int64_t step) {
  return {{"format", kFormat},
          {"model", run.model},
          {"step", fmt::format("{}", step)},
          {"batch", fmt::format("{}", run.batch)},
          {"seed", fmt::format("{}", run.seed)},
          {"examples_seen", fmt::format("{}", step * run.batch)},
          {"embedding_optimizer", run.embedding_optimizer},
          {"dense_math", run.dense_math},
          {"dense_optimizer", run.dense_optimizer},
          {"data", run.data}};
}

std::int64_t resumable_step(const std::filesystem::path& path, const RunRecord& run) {
  const SafetensorsHeader h = read_safetensors_header(path);
  const std::string file = path.string();
  auto meta = [&](const std::string& key) {
    const auto it = h.metadata.find(key);
    if (it == h.metadata.end())
      throw InputError(fmt::format("checkpoint '{}': metadata '{}' is missing", file, key));
    return it->second;
  };
  if (meta("format") != kFormat)
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
  for (const auto& [key, now] :
       {std::pair<std::string, std::string>{"embedding_optimizer", run.embedding_optimizer},
        {"dense_math", run.dense_math}}) {
    const auto it = h.metadata.find(key);
    if (it != h.metadata.end() && it->second != now)
      throw InputError(fmt::format(
          "checkpoint '{}' was trained with {} {}, this run has {}; resume with the same plan "
          "(--plan) or recipe",
          file, key, it->second, now));
  }
  const std::string step = meta("step");
  try {
    return std::stoll(step);
  } catch (const std::exception&) {
    throw InputError(fmt::format("checkpoint '{}': metadata 'step' is not a number", file));
  }
}

}  // namespace parity::train_detail
