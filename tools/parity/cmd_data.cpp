// parity data: prepare a binary shard dataset once, so training reads it at memory speed.
//   parity data synth    the planted-teacher synthetic data (train and eval splits; for an HSTU
//                        model its synthetic sequences)
//   parity data convert  Criteo TSV files
//   parity data info     what a dataset holds
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "common.h"
#include "parity/data.h"
#include "parity/error.h"
#include "parity/perf.h"
#include "parity/spec.h"

namespace parity::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The options every dataset writer shares: the model, the part-file size, the output directory.
void add_writer_options(CLI::App* cmd, std::string& model, std::int64_t& per_file,
                        std::string& out) {
  cmd->add_option("--model", model, "Model YAML file or zoo name")->capture_default_str();
  cmd->add_option("--examples-per-file", per_file, "Examples per part file")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--out", out, "Directory to create")->required();
}

// The dataset's size against the free space where it goes, before anything is written: a typo in
// --examples must not fill the disk.
void require_space(const std::filesystem::path& out, const ModelSpec& model,
                   std::int64_t examples) {
  namespace fs = std::filesystem;
  bool wide = false;
  for (const auto& t : model.tables) wide = wide || t.rows > 0xffffffffLL;
  double per_example = 0;
  if (model.kind == ModelKind::hstu) {
    // Per example: labels and two probabilities per target and task, a history offset, per event
    // its time and feature ids (the length model's mean), per target an item and a time, the
    // contexts' offsets and ids.
    const SequenceSpec& seq = model.hstu->sequence;
    for (const auto& t : seq.features) wide = wide || t.rows > 0xffffffffLL;
    const double id = wide ? 8.0 : 4.0;
    double context_ids = 0;
    for (const auto& t : model.tables) context_ids += static_cast<double>(t.pooling_size);
    per_example = 12.0 * seq.targets * static_cast<double>(model.hstu->tasks.size()) + 8.0 +
                  sequence_moments(model).history * (8.0 + id * seq.features.size()) +
                  seq.targets * (id + 8.0) + 8.0 * model.num_tables() + id * context_ids;
  } else {
    // Per example: label, teacher, dense features, one offset per table, the ids.
    per_example = 8.0 + 4.0 * model.dense_features + 8.0 * model.num_tables() +
                  (wide ? 8.0 : 4.0) * static_cast<double>(model.lookups_per_example());
  }
  const double need = per_example * static_cast<double>(examples);
  fs::path probe = fs::absolute(out);
  std::error_code ec;
  while (!fs::exists(probe, ec) && probe.has_parent_path() && probe != probe.parent_path())
    probe = probe.parent_path();
  const fs::space_info space = fs::space(probe, ec);
  if (ec) return;  // no figure to compare with: the writer's own errors remain
  if (need > static_cast<double>(space.available))
    throw InputError(fmt::format(
        "the dataset would be about {:.3g} GB ({} examples of {:.0f} bytes), and '{}' has {:.3g} "
        "GB free: write fewer examples or choose another --out",
        need / 1e9, examples, per_example, probe.string(),
        static_cast<double>(space.available) / 1e9));
}

void add_synth(CLI::App& data) {
  struct Args {
    std::string model = "tiny", out;
    std::int64_t examples = 0, eval_examples = 65536, per_file = 262144;
    std::uint64_t seed = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = data.add_subcommand("synth",
                                      "Write the model's synthetic planted-teacher data (the "
                                      "batches parity train makes on the fly\n"
                                      "for the same --seed) as a shard dataset.\n\n"
                                      "Example:\n  parity data synth --model mlperf-dlrmv2 "
                                      "--examples 8388608 --out data/mlperf-synth");
  add_writer_options(cmd, args->model, args->per_file, args->out);
  cmd->add_option("--examples", args->examples, "Training examples to write")
      ->required()
      ->check(positive_integer());
  cmd->add_option("--eval-examples", args->eval_examples, "Held-out examples to write")
      ->check(nonnegative_integer())
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the synthetic data (as parity train --seed)")
      ->check(seed_value())
      ->capture_default_str();
  cmd->callback([args] {
    const ModelSpec model = load_model_spec(resolve_model(args->model));
    require_space(args->out, model, args->examples + args->eval_examples);
    const std::string source = fmt::format("synthetic, model {}, seed {}", model.name, args->seed);
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t chunk =
        std::max<std::int64_t>(1, std::min<std::int64_t>(65536, args->per_file));
    // The examples [first, first + count) of each split, as training makes them for --seed.
    const auto write_all = [&](const auto& synth, auto& writer) {
      Batch b;
      for (Split split : {Split::train, Split::eval}) {
        const std::int64_t total = split == Split::train ? args->examples : args->eval_examples;
        for (std::int64_t first = 0; first < total; first += chunk) {
          synth.make(split, first, std::min(chunk, total - first), b);
          writer.write(split, b);
        }
      }
      writer.finish();
    };
    if (model.kind == ModelKind::hstu) {
      SequenceShardWriter writer(args->out, model, source, args->per_file);
      write_all(SyntheticSequences(model, args->seed), writer);
    } else {
      ShardWriter writer(args->out, model, source, args->per_file);
      write_all(SyntheticData(model, args->seed), writer);
    }
    fmt::print("parity data synth: {} training + {} held-out examples of {} in {} ({:.1f} s)\n",
               args->examples, args->eval_examples, model.name, args->out, seconds_since(t0));
  });
}

void add_convert(CLI::App& data) {
  struct Args {
    std::string model = "criteo-small", out, on_bad_line = "stop";
    std::vector<std::string> train, eval;
    std::int64_t per_file = 262144;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = data.add_subcommand(
      "convert",
      "Convert Criteo TSV files into a shard dataset (ids hashed into the model's tables).\n\n"
      "Example:\n  parity data convert --model criteo-small --data day_0.tsv --eval-data "
      "day_23.tsv --out data/criteo");
  add_writer_options(cmd, args->model, args->per_file, args->out);
  cmd->add_option("--data", args->train, "Criteo TSV files of the training split")->required();
  cmd->add_option("--eval-data", args->eval, "Criteo TSV files of the held-out split")->required();
  cmd->add_option("--on-bad-line", args->on_bad_line,
                  "What to do with a malformed line: stop or skip")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  cmd->callback([args] {
    const ModelSpec model = load_model_spec(resolve_model(args->model));
    ShardWriter writer(args->out, model, fmt::format("criteo tsv, model {}", model.name),
                       args->per_file);
    const CriteoOptions options{args->on_bad_line == "skip" ? OnBadLine::skip : OnBadLine::stop,
                                10};
    std::int64_t counts[2] = {0, 0}, bad = 0;
    for (Split split : {Split::train, Split::eval}) {
      const auto& names = split == Split::train ? args->train : args->eval;
      CriteoReader reader({names.begin(), names.end()}, model, options);
      Batch b;
      while (reader.next(65536, b)) {
        writer.write(split, b);
        counts[static_cast<int>(split)] += b.size;
      }
      bad += reader.bad_lines();
      for (const auto& w : reader.warnings()) fmt::print(stderr, "warning: {}\n", w);
    }
    writer.finish();
    fmt::print("parity data convert: {} training + {} held-out examples in {}{}\n", counts[0],
               counts[1], args->out,
               bad > 0 ? fmt::format(" ({} malformed lines skipped)", bad) : "");
  });
}

void add_info(CLI::App& data) {
  struct Args {
    std::string model, dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      data.add_subcommand("info", "Check a shard dataset against a model and say what it holds");
  cmd->add_option("dir", args->dir, "Dataset directory")->required();
  cmd->add_option("--model", args->model, "Model YAML file or zoo name")->required();
  cmd->callback([args] {
    const ModelSpec model = load_model_spec(resolve_model(args->model));
    // Every example read as training reads it (labels, features, ids; histories and times), so
    // that a dataset this calls fine is one that training accepts.
    const auto check = [&](auto& train, auto& eval) {
      Batch b;
      for (auto* r : {&train, &eval})
        while (r->next(65536, b)) {
        }
      fmt::print(
          "{}: {} training and {} held-out examples for model {} ({}); every example read "
          "and checked\n",
          args->dir, train.examples(), eval.examples(), model.name, train.source());
    };
    if (model.kind == ModelKind::hstu) {
      SequenceShardReader train(args->dir, model, Split::train);
      SequenceShardReader eval(args->dir, model, Split::eval);
      check(train, eval);
    } else {
      ShardReader train(args->dir, model, Split::train);
      ShardReader eval(args->dir, model, Split::eval);
      check(train, eval);
    }
  });
}

}  // namespace

void add_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand(
      "data", "Prepare datasets: binary shards that training reads at memory speed");
  data->require_subcommand(1);
  add_synth(*data);
  add_convert(*data);
  add_info(*data);
}

}  // namespace parity::cli
