// The training loop. Data come one batch ahead from a background thread; the
// host reads the loss only when it reports progress, so on a GPU backend the
// steps between reports run without a host synchronisation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "parity/checkpoint.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/metrics.h"
#include "parity/train.h"
#include "prefetch.h"

namespace parity {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr const char* kFormat = "parity-checkpoint-1";

struct EvalResult {
  double auc = 0, log_loss = 0, teacher_auc = 0;
};

EvalResult evaluate(Model& model, const TrainConfig& cfg, std::int64_t batch,
                    const SyntheticData* synth, ShardReader* shards) {
  std::vector<float> probs, labels, teacher;
  Batch b;
  std::vector<float> p(static_cast<std::size_t>(batch));
  auto consume = [&](const Batch& bb) {
    model.predict(bb, p.data());
    probs.insert(probs.end(), p.begin(), p.begin() + bb.size);
    labels.insert(labels.end(), bb.labels.begin(), bb.labels.end());
    teacher.insert(teacher.end(), bb.teacher_prob.begin(), bb.teacher_prob.end());
  };
  if (shards != nullptr) {
    shards->seek(0);
    std::int64_t seen = 0;
    while (seen < cfg.eval_examples && shards->next(std::min(batch, cfg.eval_examples - seen), b)) {
      consume(b);
      seen += b.size;
    }
  } else if (synth != nullptr) {
    for (std::int64_t first = 0; first < cfg.eval_examples; first += batch) {
      synth->make(Split::eval, first, std::min(batch, cfg.eval_examples - first), b);
      consume(b);
    }
  } else {
    CriteoReader reader(cfg.eval_files, cfg.model, CriteoOptions{cfg.on_bad_line, 10});
    std::int64_t seen = 0;
    while (seen < cfg.eval_examples && reader.next(std::min(batch, cfg.eval_examples - seen), b)) {
      consume(b);
      seen += b.size;
    }
  }
  EvalResult r;
  r.auc = roc_auc(probs, labels);
  r.log_loss = log_loss(probs, labels);
  if (teacher.size() == labels.size() && !teacher.empty()) r.teacher_auc = roc_auc(teacher, labels);
  return r;
}

}  // namespace

TrainResult train(const TrainConfig& cfg_in, TrainObserver* observer) {
  TrainConfig cfg = cfg_in;
  auto emit = [&](TrainEvent e) {
    if (observer != nullptr) observer->on_event(e);
  };
  const ModelSpec& spec = cfg.model;
  const bool sharded = !cfg.shard_dir.empty();
  const bool synthetic = !sharded && cfg.train_files.empty();
  const std::int64_t batch = cfg.batch > 0 ? cfg.batch : spec.batch_size;
  if (batch <= 0) throw InputError("batch size must be positive, got " + std::to_string(batch));
  if (cfg.steps < 0) throw InputError("--steps must be >= 0, got " + std::to_string(cfg.steps));
  if (cfg.eval_examples <= 0) throw InputError("eval examples must be positive");
  if (synthetic && cfg.steps == 0) cfg.steps = 1000;
  if (!synthetic && !sharded && cfg.eval_files.empty()) {
    if (cfg.train_files.size() < 2)
      throw InputError("training on files needs held-out data: give eval files (--eval-data) or "
                       "at least two data files (the last one is held out)");
    cfg.eval_files.push_back(cfg.train_files.back());
    cfg.train_files.pop_back();
  }
  if (cfg.resume && cfg.checkpoint_dir.empty())
    throw InputError("--resume needs a checkpoint directory (--checkpoint DIR)");

  auto backend = make_backend(cfg.backend, cfg.dense_math);
  Model model(spec, *backend, batch, cfg.seed);
  std::optional<SyntheticData> synth;
  if (synthetic) synth.emplace(spec, cfg.seed);
  std::unique_ptr<ShardReader> shard_train, shard_eval;
  if (sharded) {
    shard_train = std::make_unique<ShardReader>(cfg.shard_dir, spec, Split::train);
    shard_eval = std::make_unique<ShardReader>(cfg.shard_dir, spec, Split::eval);
    if (shard_train->examples() == 0)
      throw InputError("'" + cfg.shard_dir.string() + "' holds no training examples");
    if (shard_eval->examples() == 0)
      throw InputError("'" + cfg.shard_dir.string() + "' holds no held-out (eval) examples; write some with "
                       "parity data synth --eval-examples N");
  }

  TrainResult result;
  auto metadata = [&](std::int64_t step) {
    return std::map<std::string, std::string>{
        {"format", kFormat},
        {"model", spec.name},
        {"step", std::to_string(step)},
        {"batch", std::to_string(batch)},
        {"seed", std::to_string(cfg.seed)},
        {"examples_seen", std::to_string(step * batch)},
        {"embedding_optimizer", std::string(optimizer_name(spec.embedding_optimizer.kind))},
        {"dense_math", std::string(dense_math_name(cfg.dense_math))},
        {"dense_optimizer", std::string(optimizer_name(spec.dense_optimizer.kind))},
        {"data", sharded ? "shards" : synthetic ? "synthetic" : "criteo"}};
  };

  // ---- resume ----
  if (cfg.resume) {
    const auto steps = list_checkpoints(cfg.checkpoint_dir);
    if (steps.empty()) {
      TrainEvent w;
      w.kind = TrainEvent::Kind::warning;
      w.message = "no checkpoint in '" + cfg.checkpoint_dir.string() + "': starting from step 0";
      emit(w);
    } else {
      const auto path = checkpoint_path(cfg.checkpoint_dir, steps.back());
      const SafetensorsHeader h = read_safetensors_header(path);
      auto meta = [&](const std::string& k) {
        auto it = h.metadata.find(k);
        if (it == h.metadata.end())
          throw InputError("checkpoint '" + path.string() + "': metadata '" + k + "' is missing");
        return it->second;
      };
      if (meta("format") != kFormat)
        throw InputError("checkpoint '" + path.string() + "': format '" + meta("format") +
                         "', expected '" + kFormat + "'");
      if (meta("model") != spec.name)
        throw InputError("checkpoint '" + path.string() + "' is of model '" + meta("model") +
                         "', not '" + spec.name + "'");
      if (meta("batch") != std::to_string(batch) || meta("seed") != std::to_string(cfg.seed))
        throw InputError("checkpoint '" + path.string() + "' was trained with batch " +
                         meta("batch") + " and seed " + meta("seed") +
                         "; resume with the same --batch and --seed (the data order depends on both)");
      // The recipe must be the one the checkpoint was trained with (a plan made again may differ).
      for (const auto& [key, now] : {std::pair<std::string, std::string>{"embedding_optimizer",
                                                                         optimizer_name(spec.embedding_optimizer.kind)},
                                     {"dense_math", std::string(dense_math_name(cfg.dense_math))}}) {
        const auto it = h.metadata.find(key);
        if (it != h.metadata.end() && it->second != now)
          throw InputError("checkpoint '" + path.string() + "' was trained with " + key + " " + it->second +
                           ", this run has " + now + "; resume with the same plan (--plan) or recipe");
      }
      load_safetensors(path, model.tensors(), *backend);
      std::int64_t step = 0;
      try {
        step = std::stoll(meta("step"));
      } catch (const std::exception&) {
        throw InputError("checkpoint '" + path.string() + "': metadata 'step' is not a number");
      }
      model.set_step(step);
      result.start_step = step;
      result.last_checkpoint = path;
    }
  }
  const std::int64_t start = model.step();
  const std::int64_t total = cfg.steps > 0 ? cfg.steps : -1;

  // ---- data ----
  std::unique_ptr<CriteoReader> reader;
  if (sharded) shard_train->seek(start * batch, /*wrap=*/total >= 0);
  if (!synthetic && !sharded) {
    reader = std::make_unique<CriteoReader>(cfg.train_files, spec,
                                            CriteoOptions{cfg.on_bad_line, 10});
    Batch skip;  // resume: skip what earlier steps consumed
    for (std::int64_t s = 0; s < start; ++s)
      if (!reader->next(batch, skip)) break;
  }
  std::int64_t next_index = start;
  std::atomic<bool> data_repeats{false};  // set by the loader thread when the shards start their second pass
  Prefetcher loader([&](Batch& b) {
    if (total >= 0 && next_index >= total) return false;
    if (synthetic) {
      synth->batch(Split::train, next_index++, batch, b);
      return true;
    }
    if (sharded) {  // with a step count, epochs follow each other; without, one pass
      ++next_index;
      const std::int64_t epoch = shard_train->epoch();
      const bool more = shard_train->next(batch, b, /*wrap=*/total >= 0);
      if (shard_train->epoch() == 1 && epoch == 0) data_repeats.store(true);  // said once, at the first repeat
      return more;
    }
    ++next_index;
    return reader->next(batch, b);
  });

  {
    TrainEvent e;
    e.kind = TrainEvent::Kind::start;
    e.step = start;
    e.total_steps = total;
    e.message = "model " + spec.name + " (" + std::to_string(model.dense_parameter_count()) +
                " dense + " + std::to_string(model.embedding_parameter_count()) +
                " embedding parameters), batch " + std::to_string(batch) + ", backend " +
                backend->name() +
                (backend->name() == "cpu" ? "" : " (dense math " + std::string(dense_math_name(cfg.dense_math)) + ")") +
                ", " + std::to_string(model.allocated_bytes() / 1000000) + " MB of model buffers, " +
                (sharded ? "shards " + cfg.shard_dir.string() + " (" + std::to_string(shard_train->examples()) + " examples)"
                         : synthetic ? "synthetic data" : "Criteo data") +
                (start > 0 ? ", resumed at step " + std::to_string(start) : "");
    emit(e);
  }

  auto save = [&](std::int64_t step) {
    const auto path = checkpoint_path(cfg.checkpoint_dir, step);
    save_safetensors(path, model.tensors(), metadata(step), *backend);
    prune_checkpoints(cfg.checkpoint_dir, cfg.keep_checkpoints);
    result.last_checkpoint = path;
    TrainEvent e;
    e.kind = TrainEvent::Kind::checkpoint;
    e.step = step;
    e.total_steps = total;
    e.message = path.string();
    emit(e);
  };
  auto run_eval = [&](std::int64_t step) {
    const EvalResult r = evaluate(model, cfg, batch, synth ? &*synth : nullptr, shard_eval.get());
    result.auc = r.auc;
    result.eval_log_loss = r.log_loss;
    result.teacher_auc = r.teacher_auc;
    TrainEvent e;
    e.kind = TrainEvent::Kind::eval;
    e.step = step;
    e.total_steps = total;
    e.auc = r.auc;
    e.eval_log_loss = r.log_loss;
    e.teacher_auc = r.teacher_auc;
    emit(e);
  };

  // ---- steps ----
  // The pipeline: batch k+1 is staged (copied to pinned memory, its device copy started on the
  // copy queue) right after step k is enqueued, while the device runs step k; evaluation and
  // checkpoints happen between the two, when no batch is staged.
  Batch b;
  double paused_seconds = 0, smoothed = NAN;  // paused: evaluation and checkpoints
  std::int64_t examples = 0, window_steps = 0, window_examples = 0;
  const auto loop_start = Clock::now();
  auto window_start = loop_start, last_report = loop_start;
  // The first steps warm caches and the loader: the profile and the after-warm-up rate
  // start after them (the rate's clock at the end of step start + kWarmupSteps, the device drained
  // once there) and exclude evaluation and checkpoints.
  constexpr std::int64_t kWarmupSteps = 2;
  std::optional<Clock::time_point> steady_start;
  double steady_paused = 0;
  std::int64_t steady_examples = 0;
  bool have = loader.next(b);
  if (have) model.stage(b);
  auto mark = Clock::now();  // --profile: the one-time costs, measured with the device drained
  if (cfg.profile) {
    backend->synchronize();
    result.first_batch_s = seconds_since(loop_start);
    mark = Clock::now();
  }
  if (have) {
    // Workspaces, scratch and library plans made on the first batch's shapes before the first
    // step (set-up, like building the model: not counted as training time).
    const auto p0 = Clock::now();
    model.prepare();  // enqueues nothing: no synchronisation (the first batch's copy stays in step 1)
    const auto pause = Clock::now() - p0;
    result.prepare_s = std::chrono::duration<double>(pause).count();
    paused_seconds += result.prepare_s;
    window_start += pause;  // the progress rate counts training time only
    last_report += pause;
    mark = Clock::now();
  }
  while (have) {
    const std::int64_t n = b.size;
    if (steady_start) steady_examples += n;
    if (cfg.profile && model.step() == start + kWarmupSteps) model.set_profiling(true);  // after warm-up
    model.train_staged();
    examples += n;
    window_examples += n;
    ++window_steps;
    const std::int64_t step = model.step();
    if (cfg.profile && step <= start + kWarmupSteps) {
      backend->synchronize();
      result.first_steps_s.push_back(seconds_since(mark));
      mark = Clock::now();
    }
    if (step == start + kWarmupSteps && !steady_start) {
      backend->synchronize();
      steady_start = Clock::now();
    }
    const bool last = total >= 0 && step >= total;
    const bool eval_now = cfg.eval_every > 0 && step % cfg.eval_every == 0 && !last;
    const bool ckpt_now = !cfg.checkpoint_dir.empty() && cfg.checkpoint_every > 0 &&
                          step % cfg.checkpoint_every == 0 && !last;
    if (eval_now || ckpt_now) {
      const auto p0 = Clock::now();
      backend->synchronize();
      if (eval_now) run_eval(step);  // predict() keeps evaluation out of the step profile
      if (ckpt_now) save(step);
      const auto pause = Clock::now() - p0;
      paused_seconds += std::chrono::duration<double>(pause).count();
      if (steady_start) steady_paused += std::chrono::duration<double>(pause).count();
      window_start += pause;  // the progress rate counts training time only
      last_report += pause;
    }
    have = loader.next(b);
    if (have) model.stage(b);
    if (data_repeats.exchange(false)) {
      TrainEvent w;
      w.kind = TrainEvent::Kind::warning;
      w.step = step;
      w.message = "the training data ran out (at about step " + std::to_string(step) +
                  "); epoch 2 and later ones repeat it (recommendation models often overfit on a second pass: "
                  "watch the held-out AUC)";
      emit(w);
    }
    if (last || seconds_since(last_report) >= cfg.report_interval_s) {
      const double loss = model.last_loss();  // synchronises: only when reporting
      smoothed = std::isnan(smoothed) ? loss : 0.8 * smoothed + 0.2 * loss;
      const double dt = seconds_since(window_start);
      TrainEvent e;
      e.kind = TrainEvent::Kind::progress;
      e.step = step;
      e.total_steps = total;
      e.loss = smoothed;
      e.steps_per_s = dt > 0 ? window_steps / dt : 0;
      e.examples_per_s = dt > 0 ? window_examples / dt : 0;
      emit(e);
      window_steps = window_examples = 0;
      window_start = last_report = Clock::now();
    }
  }
  model.set_profiling(false);
  result.profiled_steps = model.profiled_steps();
  for (const auto& [category, ms] : model.profile_ms())
    if (result.profiled_steps > 0) result.profile_ms_per_step[category] = ms / static_cast<double>(result.profiled_steps);
  for (const auto& [op, ms] : model.profile_ops_ms())
    if (result.profiled_steps > 0) result.profile_ops_ms_per_step[op] = ms / static_cast<double>(result.profiled_steps);
  backend->synchronize();
  const double train_seconds = seconds_since(loop_start) - paused_seconds;
  result.steps = model.step();
  result.final_loss = model.step() > start ? model.last_loss() : NAN;
  result.examples_per_s = train_seconds > 0 ? examples / train_seconds : 0;
  if (steady_start && steady_examples > 0) {
    const double t = std::chrono::duration<double>(Clock::now() - *steady_start).count() - steady_paused;
    result.steady_examples_per_s = t > 0 ? steady_examples / t : 0;
  }
  if (!cfg.checkpoint_dir.empty() && model.step() > start) save(model.step());
  run_eval(model.step());
  if (reader && reader->bad_lines() > 0) {
    TrainEvent e;
    e.kind = TrainEvent::Kind::warning;
    e.message = std::to_string(reader->bad_lines()) + " malformed lines skipped";
    for (const auto& w : reader->warnings()) e.message += "\n  " + w;
    emit(e);
  }
  TrainEvent done;
  done.kind = TrainEvent::Kind::done;
  done.step = result.steps;
  done.total_steps = total;
  done.loss = result.final_loss;
  done.examples_per_s = result.examples_per_s;
  done.steady_examples_per_s = result.steady_examples_per_s;
  done.auc = result.auc;
  done.teacher_auc = result.teacher_auc;
  emit(done);
  return result;
}

}  // namespace parity
