// The training loop. Data come one batch ahead from a background thread; the host reads the loss
// only when it reports progress, so on a GPU backend the steps between reports run without a host
// synchronisation.
//
// train() settles the configuration and picks the data sources (the only place that knows what
// kind of data it is), then a Trainer runs: resume, the step loop, and between steps evaluation
// and checkpoints. Both read their data through BatchSource.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/host_memory.h"
#include "faults.h"
#include "hstu_trainer.h"
#include "parity/checkpoint.h"
#include "parity/dist.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/health.h"
#include "parity/metrics.h"
#include "parity/plan.h"
#include "parity/train.h"
#include "prefetch.h"
#include "ranks.h"
#include "run_record.h"
#include "sources.h"

namespace parity {
namespace fs = std::filesystem;
namespace {

using train_detail::FaultInTraining;
using train_detail::FaultKind;

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double seconds_since(Clock::time_point t) {
  return seconds(Clock::now() - t);
}

// The first steps warm caches and the loader: the profile and the after-warm-up rate start after
// them (the rate's clock at the end of step start + kWarmupSteps, the device drained once there).
constexpr std::int64_t kWarmupSteps = 2;

// The configuration with its defaults filled in (batch, steps, held-out files) and checked.
TrainConfig settle(const TrainConfig& in) {
  TrainConfig cfg = in;
  const bool custom = static_cast<bool>(cfg.train_data);
  if (custom != static_cast<bool>(cfg.eval_data))
    throw InputError(
        "data of your own needs both sources, TrainConfig::train_data and eval_data (the built-in "
        "data bring their own held-out split)");
  if (custom && (!cfg.shard_dir.empty() || !cfg.train_files.empty() || !cfg.eval_files.empty()))
    throw InputError(
        "give either batch sources of your own (train_data, eval_data) or a shard dataset or "
        "files, not both");
  cfg.batch = cfg.batch > 0 ? cfg.batch : cfg.model.batch_size;
  if (cfg.batch <= 0)
    throw InputError(fmt::format("batch size must be positive, got {}", cfg.batch));
  if (cfg.steps < 0) throw InputError(fmt::format("--steps must be >= 0, got {}", cfg.steps));
  if (!(cfg.spike_factor == 0 || cfg.spike_factor > 1))  // NaN fails too
    throw InputError(fmt::format(
        "--spike-factor {}: expected 0 (no spike watch) or a factor above 1 (a loss that many "
        "times the recent mean is a spike)",
        cfg.spike_factor));
  if (cfg.eval_examples <= 0) throw InputError("eval examples must be positive");
  const bool files = !custom && cfg.shard_dir.empty() && !cfg.train_files.empty();
  const bool synthetic = !custom && cfg.shard_dir.empty() && cfg.train_files.empty();
  if (synthetic && cfg.steps == 0) cfg.steps = 1000;
  if (files && cfg.eval_files.empty()) {
    if (cfg.train_files.size() < 2)
      throw InputError(
          "training on files needs held-out data: give eval files (--eval-data) or at least two "
          "data files (the last one is held out)");
    cfg.eval_files.push_back(cfg.train_files.back());
    cfg.train_files.pop_back();
  }
  if (cfg.resume && cfg.checkpoint_dir.empty())
    throw InputError("--resume needs a checkpoint directory (--checkpoint DIR)");
  // The host holds three batches at once (the loader's next one, the one staged or trained, and
  // the evaluation's), each of a size known now: more than the machine has is refused here, with
  // the figures, rather than killed by the out-of-memory killer after the set-up.
  if (const auto avail = host_memory_available()) {
    const ModelSpec& m = cfg.model;
    const double per_example = 4.0 * (m.dense_features + 2) + 8.0 * m.num_tables() +
                               8.0 * static_cast<double>(m.lookups_per_example());
    const double need = 3 * per_example * static_cast<double>(cfg.batch);
    if (need > static_cast<double>(*avail))
      throw InputError(fmt::format(
          "a batch of {} examples of model '{}' is {:.3g} GB on the host ({} lookups and {} dense "
          "features an example), and training holds three: {:.3g} GB, more than the {:.3g} GB "
          "this machine has available; use a smaller --batch",
          cfg.batch, m.name, per_example * static_cast<double>(cfg.batch) / 1e9,
          m.lookups_per_example(), m.dense_features, need / 1e9,
          static_cast<double>(*avail) / 1e9));
  }
  if (cfg.keep_checkpoints < 1)
    throw InputError(fmt::format(
        "checkpoints kept must be at least 1 (the newest good one), got {}", cfg.keep_checkpoints));
  if (cfg.inject_fault && cfg.inject_fault->step < 1)
    throw InputError(
        fmt::format("--inject-fault: step {}, expected 1 or more", cfg.inject_fault->step));
  if ((cfg.comm == nullptr) != (cfg.shard_plan == nullptr))
    throw InputError("a sharded run needs both its plan and its communicator");
  if (cfg.comm != nullptr) {
    if (cfg.model.kind != ModelKind::dlrm)
      throw InputError("a run over several processes trains DLRM models so far (HSTU: one GPU)");
    if (cfg.batch < cfg.comm->size())
      throw InputError(fmt::format("a batch of {} examples cannot be split over {} ranks",
                                   cfg.batch, cfg.comm->size()));
  }
  return cfg;
}

// This rank's slice [first, first + count) of a batch of n examples over the run's ranks.
std::pair<std::int64_t, std::int64_t> rank_slice(const TrainConfig& cfg, std::int64_t n) {
  if (cfg.comm == nullptr) return {0, n};
  const std::int64_t W = cfg.comm->size(), r = cfg.comm->rank();
  const std::int64_t first = n * r / W;
  return {first, n * (r + 1) / W - first};
}

// Wall-clock accounting of the step loop. Time spent outside training steps (Model::prepare,
// evaluation, checkpoints) is taken out of every rate; the steady rate starts after the warm-up.
struct StepClock {
  Clock::time_point start = Clock::now(), window = start, last_report = start;
  std::optional<Clock::time_point> steady;
  double paused_s = 0, steady_paused_s = 0;
  std::int64_t examples = 0, steady_examples = 0, window_steps = 0, window_examples = 0;

  void pause(Clock::duration d) {
    paused_s += seconds(d);
    if (steady) steady_paused_s += seconds(d);
    window += d;  // the progress rate counts training time only
    last_report += d;
  }
};

class Trainer {
 public:
  // replay: a fault's replay (train() makes it): trains to cfg.steps, and neither evaluates,
  // writes checkpoints nor watches for spikes. resume_at (with cfg.resume): the newest checkpoint
  // to resume from (-1: the directory's newest).
  Trainer(const TrainConfig& cfg, train_detail::Sources data, TrainObserver* observer,
          bool replay = false, std::int64_t resume_at = -1)
      : cfg_(cfg),
        replay_(replay),
        resume_at_(resume_at),
        observer_(observer),
        // The ranks of a sharded run write one directory together: rank 0 holds it for them.
        lock_(cfg.checkpoint_dir.empty() || (cfg.comm != nullptr && cfg.comm->rank() != 0)
                  ? nullptr
                  : std::make_unique<CheckpointDirLock>(cfg.checkpoint_dir)),
        train_data_(std::move(data.train)),
        eval_data_(std::move(data.eval)),
        backend_(make_train_backend(cfg)),
        model_(cfg.model, *backend_, rank_slice(cfg, cfg.batch).second + 1, cfg.seed,
               cfg.shard_plan, cfg.comm, cfg.dense_bucket_bytes),
        record_(train_detail::run_record(cfg.model, cfg.batch, cfg.seed, cfg.dense_math,
                                         train_data_->kind())),
        total_(cfg.steps > 0 ? cfg.steps : -1) {
    if (cfg.product_checks) backend_->set_product_checks(true);
    if (cfg.inject_table_fault)
      train_detail::check_table_fault(*cfg.inject_table_fault, model_.checkpoint_layout());
  }

  TrainResult run() {
    resume();
    start_ = model_.step();
    if (total_ >= 0 && start_ >= total_)
      throw InputError(fmt::format(
          "the checkpoint {} is at step {} and --steps is {}: nothing is left to train (--steps "
          "counts the resumed steps too: give more than {})",
          result_.last_checkpoint.string(), start_, total_, start_));
    train_data_->seek(start_ * cfg_.batch);
    if (replay_) {
      train_steps();
      check_finite();
      return result_;
    }
    train_detail::check_eval_data(*eval_data_, cfg_.batch, cfg_.eval_examples);
    announce();
    train_steps();
    if (model_.step() == start_)
      throw InputError(fmt::format("the training data ({}) gave no batch: nothing was trained",
                                   train_data_->describe()));
    // The end of training: checkpoint() and evaluate() raise the bad inputs the last steps met.
    check_finite();
    // (unless the last periodic one is of this step: data that end on a checkpoint step)
    if (!cfg_.checkpoint_dir.empty() && last_checkpoint_step_ != model_.step())
      checkpoint(model_.step());
    evaluate(model_.step());
    check_products();  // evaluation's products too
    result_.products_checked = backend_->product_checks().products;
    if (cfg_.inject_fault && backend_->product_checks().fault_pending)
      warn(result_.steps,
           fmt::format("--inject-fault: the fault for product {} of step {} never fired (the run "
                       "ended or resumed past it, or the step has fewer products): nothing was "
                       "tested",
                       cfg_.inject_fault->fault.product, cfg_.inject_fault->step));
    if (cfg_.inject_table_fault && !table_fault_planted_)
      warn(result_.steps, fmt::format("--inject-table-fault: step {} was not trained here (the run "
                                      "ended or resumed past it): nothing was tested",
                                      cfg_.inject_table_fault->step));
    if (const std::string w = train_data_->closing_warning(); !w.empty()) warn(result_.steps, w);
    TrainEvent done = event(TrainEvent::Kind::done, result_.steps);
    done.loss = result_.final_loss;
    done.examples_per_s = result_.examples_per_s;
    done.steady_examples_per_s = result_.steady_examples_per_s;
    done.auc = result_.auc;
    done.teacher_auc = result_.teacher_auc;
    emit(done);
    return result_;
  }

 private:
  TrainEvent event(TrainEvent::Kind kind, std::int64_t step) const {
    TrainEvent e;
    e.kind = kind;
    e.step = step;
    e.total_steps = total_;
    return e;
  }
  void emit(const TrainEvent& e) const {
    if (observer_ != nullptr) observer_->on_event(e);
  }
  void warn(std::int64_t step, std::string message) const {
    TrainEvent e = event(TrainEvent::Kind::warning, step);
    e.message = std::move(message);
    emit(e);
  }

  // Continues from the newest good checkpoint in the checkpoint directory, if asked to. A damaged
  // one (a checksum differs, the file is short, a value is not finite) is set aside as
  // PATH.corrupt, with a warning, and the next older one is tried; one of another run (model,
  // batch, seed, recipe) stops the run. The ranks of a sharded run agree on each checkpoint: one
  // damaged for any rank is set aside for all.
  void resume() {
    if (!cfg_.resume) {
      // A new run beside another run's checkpoints would prune its own (the older steps) and keep
      // theirs, and a later --resume would continue theirs: refused before any step.
      const auto there = cfg_.checkpoint_dir.empty() ? std::vector<std::int64_t>{}
                                                     : list_checkpoints(cfg_.checkpoint_dir);
      if (!there.empty())
        throw InputError(fmt::format(
            "checkpoint directory '{}' holds checkpoints already (steps {}): give --resume to "
            "continue from the newest, or another --checkpoint directory for a new run",
            cfg_.checkpoint_dir.string(), fmt::join(there, ", ")));
      return;
    }
    auto steps = list_checkpoints(cfg_.checkpoint_dir);
    if (resume_at_ >= 0) std::erase_if(steps, [&](std::int64_t c) { return c > resume_at_; });
    if (cfg_.comm != nullptr)
      train_detail::same_checkpoints_on_every_rank(*cfg_.comm, steps, cfg_.checkpoint_dir);
    if (steps.empty()) {
      warn(0, fmt::format("no checkpoint in '{}': starting from step 0",
                          cfg_.checkpoint_dir.string()));
      return;
    }
    std::vector<std::string> set_aside;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const auto path = find_checkpoint(cfg_.checkpoint_dir, *it);
      std::int64_t step = -1;
      std::string corrupt;
      std::exception_ptr failed;
      try {
        step = train_detail::resumable_step(path, record_);
        load_checkpoint(path, model_.checkpoint_layout(), *backend_, TensorValues::finite);
      } catch (const CheckpointCorrupt& e) {
        corrupt = e.what();
      } catch (...) {
        failed = std::current_exception();
      }
      const auto [any_failed, any_corrupt] =
          train_detail::agree_on_resume(cfg_.comm, failed != nullptr, !corrupt.empty());
      if (any_failed) {
        if (failed) std::rethrow_exception(failed);
        throw InputError(
            fmt::format("another rank could not resume from '{}' (its message says "
                        "why)",
                        path.string()));
      }
      if (!any_corrupt) {
        model_.tensors_written();
        model_.set_step(step);
        result_.start_step = step;
        result_.last_checkpoint = path;
        return;
      }
      // One rank moves it aside (the ranks share the directory); the others wait for it.
      const bool mover = cfg_.comm == nullptr || cfg_.comm->rank() == 0;
      fs::path aside = fs::path(path.string() + ".corrupt");
      std::exception_ptr move_failed;
      try {
        if (mover) aside = set_aside_checkpoint(path);
      } catch (...) {
        move_failed = std::current_exception();
      }
      if (train_detail::agree_on_resume(cfg_.comm, move_failed != nullptr, false).first) {
        if (move_failed) std::rethrow_exception(move_failed);
        throw Error(
            fmt::format("rank 0 could not set aside '{}' (its message says why)", path.string()));
      }
      warn(0, fmt::format("{}; set aside as '{}', trying the one before it",
                          corrupt.empty()
                              ? "another rank found checkpoint '" + path.string() + "' damaged"
                              : corrupt,
                          aside.string()));
      set_aside.push_back(aside.string());
    }
    throw InputError(fmt::format(
        "every checkpoint in '{}' is damaged (set aside: {}); nothing to resume from: remove "
        "--resume to start again from step 0",
        cfg_.checkpoint_dir.string(), fmt::join(set_aside, ", ")));
  }
  // The examples evaluation will read, read once before the first step: a missing, empty or
  // corrupt held-out file fails now, not after the training work is spent.
  // Stops the run once the finite-value guard has recorded a bad step (read where the host waits
  // anyway: progress reports, evaluations, checkpoints, the end).
  // In a run over several ranks the ranks agree on the first bad step (a collective: called where
  // every rank calls it, at the same step).
  void check_finite() {
    check_products();
    std::int64_t bad = model_.first_nonfinite_step();
    if (sharded()) bad = train_detail::earliest_on_any_rank(*cfg_.comm, bad);
    if (bad < 0) return;
    throw FaultInTraining(
        FaultKind::nonfinite, bad, NAN,
        fmt::format("training diverged: the loss or the dense parameters of step {} are NaN or "
                    "infinite (found at step {}); nothing after step {} was saved",
                    bad, model_.step(), bad - 1),
        last_good(),
        ". A learning rate too high for this model and batch, or NaN or infinite values in the "
        "data, are the usual causes",
        backend_->name() != "cpu");
  }
  // Stops the run once a checksummed product has failed its check: the device computed a wrong
  // product (or a fault was injected). train() marks a GPU suspect in the health ledger.
  // In a run over several ranks every rank stops, and the ranks whose products failed say which.
  void check_products() {
    if (!cfg_.product_checks) return;
    train_detail::throw_if_products_failed(backend_->product_checks(), cfg_.comm, model_.step(),
                                           last_good(), backend_->name() != "cpu");
  }
  // TrainConfig::inject_table_fault: flips the element's bit before its step, after the steps
  // before it have updated the table.
  void plant_table_fault() {
    backend_->synchronize();
    if (train_detail::plant_table_fault(*cfg_.inject_table_fault, model_.checkpoint_layout(),
                                        *backend_) > 0)
      model_.tensors_written();
    table_fault_planted_ = true;
  }
  bool sharded() const { return cfg_.comm != nullptr && cfg_.comm->size() > 1; }
  // The last step's mean loss over the global batch: each rank's mean weighted by its slice (a
  // collective in a run over several ranks).
  double global_loss() {
    const double loss = model_.last_loss();
    if (!sharded()) return loss;
    const double n = static_cast<double>(rank_slice(cfg_, cfg_.batch).second);
    double v[2] = {loss * n, n};
    cfg_.comm->all_reduce_sum(std::span<double>(v, 2));
    return v[0] / v[1];
  }
  // With TrainConfig::spike_factor: stops the run at a loss spike (the step's loss against the
  // mean of the steps before it).
  void watch_for_spike(std::int64_t step) {
    constexpr std::size_t kWindow = 100, kFirst = 10;
    const auto loss = static_cast<float>(global_loss());  // synchronises (spike_factor)
    if (!std::isfinite(loss)) return;                     // the finite-value guard's to report
    if (recent_losses_.size() >= kFirst) {
      double mean = 0;
      for (const float l : recent_losses_) mean += l;
      mean /= static_cast<double>(recent_losses_.size());
      if (loss > cfg_.spike_factor * mean)
        throw FaultInTraining(
            FaultKind::loss_spike, step, loss,
            fmt::format("loss spike at step {}: loss {:.9g}, {:.3g} times the mean {:.6g} of the "
                        "{} steps before it (--spike-factor {})",
                        step, loss, loss / mean, mean, recent_losses_.size(), cfg_.spike_factor),
            last_good(),
            fmt::format(". Look at the batch of step {} (examples {} to {} of the training data) "
                        "and at the learning rate; --spike-factor 0 stops looking for spikes",
                        step, (step - 1) * cfg_.batch, step * cfg_.batch - 1),
            backend_->name() != "cpu");
    }
    recent_losses_.push_back(loss);
    if (recent_losses_.size() > kWindow) recent_losses_.erase(recent_losses_.begin());
  }
  std::string last_good() const {
    return result_.last_checkpoint.empty() ? std::string()
                                           : fmt::format(" (the last good checkpoint is '{}')",
                                                         result_.last_checkpoint.string());
  }

  bool synthetic_on_device() const {
    // A sharded model routes its ids on the host: its batches come from host memory.
    return train_data_->generated().data != nullptr && backend_->makes_synthetic_data() &&
           model_.sharded_embedding() == nullptr;
  }

  void announce() const {
    TrainEvent e = event(TrainEvent::Kind::start, start_);
    const std::string math =
        backend_->name() == "cpu"
            ? std::string()
            : fmt::format(" (dense math {})", dense_math_name(cfg_.dense_math));
    e.message = fmt::format(
        "model {} ({} dense + {} embedding parameters), batch {}, backend {}{}, {} MB of model "
        "buffers, {}{}",
        cfg_.model.name, model_.dense_parameter_count(), model_.embedding_parameter_count(),
        cfg_.batch, backend_->name(), math, model_.allocated_bytes() / 1000000,
        train_data_->describe() + (synthetic_on_device() ? " made on the device" : ""),
        start_ > 0 ? fmt::format(", resumed at step {}", start_) : std::string());
    emit(e);
  }

  // The pipeline: batch k+1 is staged (copied to pinned memory, its device copy started on the
  // copy queue) right after step k is enqueued, while the device runs step k; evaluation and
  // checkpoints happen between the two, when no batch is staged.
  // Synthetic data made on the device (no loader thread, no host batch, no copy), the same
  // batches bit for bit, or batches the loader thread reads from the source.
  void train_steps() {
    std::int64_t epoch = train_data_->epoch();  // read before the loader thread owns the source
    const std::int64_t limit = total_ >= 0 ? std::max<std::int64_t>(0, total_ - start_) : -1;
    const BatchSource::Generated gen = train_data_->generated();
    std::optional<Prefetcher> loader;
    // A sharded run's rank reads only its slice of each batch where the source can skip.
    if (!synthetic_on_device())
      loader.emplace(*train_data_, cfg_.batch, limit, cfg_.comm ? cfg_.comm->rank() : 0,
                     cfg_.comm ? cfg_.comm->size() : 1);
    auto note_epoch = [&](std::int64_t step) {  // warned once, at the first repeat
      if (!loader) return;
      if (epoch == 0 && loader->epoch() > 0)
        warn(step, fmt::format("the training data ran out (at about step {}); epoch 2 and later "
                               "ones repeat it (recommendation models often overfit on a second "
                               "pass: watch the held-out AUC)",
                               step));
      epoch = loader->epoch();
    };
    Batch b;
    std::int64_t made = 0;  // batches made on the device
    // Stages the next batch; its size, 0 once the data (or the step count) ends.
    auto stage_next = [&]() -> std::int64_t {
      if (!loader) {
        if (limit >= 0 && made >= limit) return 0;
        model_.stage_synthetic(*gen.data, gen.split, (start_ + made) * cfg_.batch, cfg_.batch);
        ++made;
        return cfg_.batch;
      }
      std::int64_t whole = 0;
      if (!loader->next(b, &whole)) return 0;
      // A batch with fewer examples than ranks (the end of a file) leaves a rank nothing to
      // train on: every rank sees its size and drops it.
      while (cfg_.comm != nullptr && whole < cfg_.comm->size())
        if (!loader->next(b, &whole)) return 0;
      if (cfg_.comm != nullptr && !loader->slices()) {  // this rank's slice of the global batch
        const auto [first, count] = rank_slice(cfg_, b.size);
        model_.stage(slice_of(b, first, count), whole);
      } else {
        model_.stage(b, cfg_.comm != nullptr ? whole : 0);
      }
      return whole;
    };
    clock_ = StepClock{};
    std::int64_t staged = stage_next();
    bool have = staged > 0;
    if (have) note_epoch(start_);
    auto mark = Clock::now();  // --profile: the one-time costs, measured with the device drained
    if (cfg_.profile) {
      backend_->synchronize();
      result_.first_batch_s = seconds_since(clock_.start);
      mark = Clock::now();
    }
    if (have) {
      // Workspaces, scratch and library plans made on the first batch's shapes before the first
      // step (set-up, like building the model: not counted as training time). It enqueues
      // nothing (a sharded model's collectives aside): no synchronisation (the first batch's
      // copy stays in step 1).
      const auto p0 = Clock::now();
      model_.prepare();
      const auto pause = Clock::now() - p0;
      result_.prepare_s = seconds(pause);
      clock_.pause(pause);
      mark = Clock::now();
    }
    while (have) {
      const std::int64_t n = staged;
      if (clock_.steady) clock_.steady_examples += n;
      if (cfg_.profile && model_.step() == start_ + kWarmupSteps) model_.set_profiling(true);
      if (cfg_.inject_fault && model_.step() + 1 == cfg_.inject_fault->step)
        backend_->inject_product_fault(cfg_.inject_fault->fault);
      if (cfg_.inject_table_fault && model_.step() + 1 == cfg_.inject_table_fault->step)
        plant_table_fault();
      model_.train_staged();
      clock_.examples += n;
      clock_.window_examples += n;
      ++clock_.window_steps;
      const std::int64_t step = model_.step();
      if (cfg_.loss_window > 0) add_to_loss_window(step);
      if (cfg_.spike_factor > 0 && !replay_) watch_for_spike(step);
      if (cfg_.profile && step <= start_ + kWarmupSteps) {
        backend_->synchronize();
        result_.first_steps_s.push_back(seconds_since(mark));
        mark = Clock::now();
      }
      if (step == start_ + kWarmupSteps && !clock_.steady) {
        backend_->synchronize();
        clock_.steady = Clock::now();
      }
      const bool last = total_ >= 0 && step >= total_;
      if (!last) between_steps(step);
      staged = stage_next();
      have = staged > 0;
      if (have) note_epoch(step);
      if (last || seconds_since(clock_.last_report) >= cfg_.report_interval_s) report(step);
    }
    record_rates();
  }

  // Evaluation and checkpoints when they are due after `step` (before the last step's).
  void between_steps(std::int64_t step) {
    const bool eval_now = cfg_.eval_every > 0 && step % cfg_.eval_every == 0;
    const bool ckpt_now = !cfg_.checkpoint_dir.empty() && cfg_.checkpoint_every > 0 &&
                          step % cfg_.checkpoint_every == 0;
    if (!eval_now && !ckpt_now) return;
    const auto p0 = Clock::now();
    backend_->synchronize();
    check_finite();
    if (eval_now) evaluate(step);  // predict() keeps evaluation out of the step profile
    if (ckpt_now) checkpoint(step);
    clock_.pause(Clock::now() - p0);
  }

  void add_to_loss_window(std::int64_t step) {
    const std::int64_t w = cfg_.loss_window;
    window_loss_ += model_.last_loss();  // synchronises (TrainConfig::loss_window)
    if (step % w != 0) return;
    if (step - w >= start_) result_.loss_windows.push_back({step, window_loss_ / w});
    window_loss_ = 0;
  }

  void report(std::int64_t step) {
    const double loss = model_.last_loss();  // synchronises: only when reporting
    // Reports come by the clock, not at the same step on every rank: a run over several ranks
    // checks at its checkpoints, evaluations and end, where the ranks meet.
    if (!sharded()) check_finite();
    smoothed_loss_ = std::isnan(smoothed_loss_) ? loss : 0.8 * smoothed_loss_ + 0.2 * loss;
    const double dt = seconds_since(clock_.window);
    TrainEvent e = event(TrainEvent::Kind::progress, step);
    e.loss = smoothed_loss_;
    e.steps_per_s = dt > 0 ? clock_.window_steps / dt : 0;
    e.examples_per_s = dt > 0 ? clock_.window_examples / dt : 0;
    emit(e);
    clock_.window_steps = clock_.window_examples = 0;
    clock_.window = clock_.last_report = Clock::now();
  }

  // The run's rates, final loss and step profile, once the step loop is over.
  void record_rates() {
    model_.set_profiling(false);
    result_.profiled_steps = model_.profiled_steps();
    const auto per_step = [&](const std::map<std::string, double>& ms,
                              std::map<std::string, double>& out) {
      if (result_.profiled_steps == 0) return;
      for (const auto& [name, total] : ms)
        out[name] = total / static_cast<double>(result_.profiled_steps);
    };
    per_step(model_.profile_ms(), result_.profile_ms_per_step);
    per_step(model_.profile_ops_ms(), result_.profile_ops_ms_per_step);
    per_step(model_.profile_host_ops_ms(), result_.profile_host_ops_ms_per_step);
    per_step(model_.profile_beside_ms(), result_.profile_beside_ms_per_step);
    result_.model_memory_bytes = model_.allocated_bytes_by_category();
    result_.backend_memory_bytes = backend_->internal_memory_bytes();
    result_.gemm_selection = backend_->gemm_selection_counts();
    result_.cache = model_.cache_stats();
    result_.host_resident_bytes = model_.host_resident_bytes();
    result_.cache_refreshes = model_.cache_refreshes();
    result_.cache_refresh_s = model_.cache_refresh_seconds();
    backend_->synchronize();
    const double train_seconds = seconds_since(clock_.start) - clock_.paused_s;
    result_.steps = model_.step();
    result_.final_loss = model_.step() > start_ ? global_loss() : NAN;
    result_.examples_per_s = train_seconds > 0 ? clock_.examples / train_seconds : 0;
    if (clock_.steady && clock_.steady_examples > 0) {
      const double t = seconds_since(*clock_.steady) - clock_.steady_paused_s;
      result_.steady_examples_per_s = t > 0 ? clock_.steady_examples / t : 0;
    }
  }

  // AUC and log loss on the evaluation data (its first eval_examples examples).
  void evaluate(std::int64_t step) {
    backend_->raise_input_errors();  // nothing is reported after a step that met bad input
    std::vector<float> probs, labels, teacher, p(static_cast<std::size_t>(cfg_.batch));
    eval_data_->seek(0);
    Batch b;
    for (std::int64_t seen = 0;
         seen < cfg_.eval_examples &&
         eval_data_->next(std::min(cfg_.batch, cfg_.eval_examples - seen), b);
         seen += b.size) {
      if (cfg_.comm != nullptr) {                  // this rank's slice; every rank's gathered below
        if (b.size < cfg_.comm->size()) continue;  // no slice for some rank: dropped by all
        const auto [first, count] = rank_slice(cfg_, b.size);
        const Batch part = slice_of(b, first, count);
        model_.predict(part, p.data());
        probs.insert(probs.end(), p.begin(), p.begin() + part.size);
        labels.insert(labels.end(), part.labels.begin(), part.labels.end());
        teacher.insert(teacher.end(), part.teacher_prob.begin(), part.teacher_prob.end());
        continue;
      }
      model_.predict(b, p.data());
      probs.insert(probs.end(), p.begin(), p.begin() + b.size);
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
      teacher.insert(teacher.end(), b.teacher_prob.begin(), b.teacher_prob.end());
    }
    if (cfg_.comm != nullptr) {
      probs = train_detail::gather_all(*cfg_.comm, probs);
      labels = train_detail::gather_all(*cfg_.comm, labels);
      teacher = train_detail::gather_all(*cfg_.comm, teacher);
    }
    backend_->raise_input_errors();  // nor after evaluation data that was bad
    if (probs.empty())
      throw InputError(fmt::format("the evaluation data ({}) gave no example to evaluate on",
                                   eval_data_->describe()));
    const auto bad =
        std::count_if(probs.begin(), probs.end(), [](float p) { return !std::isfinite(p); });
    if (bad > 0)
      throw NumericalError(fmt::format(
          "evaluation at step {}: the model predicts NaN for {} of {} held-out examples (its "
          "weights are no longer numbers, or the evaluation data hold NaN or infinite "
          "values){}",
          step, bad, probs.size(), last_good()));
    result_.auc = roc_auc(probs, labels);
    result_.eval_log_loss = log_loss(probs, labels);
    result_.teacher_auc =
        teacher.size() == labels.size() && !teacher.empty() ? roc_auc(teacher, labels) : 0;
    TrainEvent e = event(TrainEvent::Kind::eval, step);
    e.auc = result_.auc;
    e.eval_log_loss = result_.eval_log_loss;
    e.teacher_auc = result_.teacher_auc;
    emit(e);
  }

  void checkpoint(std::int64_t step) {
    backend_->raise_input_errors();  // never a checkpoint after a step that met bad input
    fs::path path = checkpoint_path(cfg_.checkpoint_dir, step);
    const auto metadata = train_detail::checkpoint_metadata(record_, step);
    try {
      // One process holding its tables whole writes one file; sharded ranks write a set, each
      // its shards.
      if (cfg_.comm == nullptr || model_.sharded_embedding() == nullptr)
        save_safetensors(path, model_.tensors(), metadata, *backend_, TensorValues::finite);
      else
        path = save_checkpoint_set(cfg_.checkpoint_dir, step, model_.checkpoint_layout(), metadata,
                                   *cfg_.comm, *backend_, TensorValues::finite);
    } catch (const NumericalError& e) {
      throw NumericalError(
          fmt::format("training diverged by step {}: {}{}", step, e.what(), last_good()));
    }
    if (cfg_.comm == nullptr || cfg_.comm->rank() == 0)
      prune_checkpoints(cfg_.checkpoint_dir, cfg_.keep_checkpoints);
    result_.last_checkpoint = path;
    last_checkpoint_step_ = step;
    TrainEvent e = event(TrainEvent::Kind::checkpoint, step);
    e.message = path.string();
    emit(e);
  }

  const TrainConfig& cfg_;
  bool replay_;
  std::int64_t resume_at_;
  TrainObserver* observer_;
  std::unique_ptr<CheckpointDirLock> lock_;  // held from before the first step to the end
  std::unique_ptr<BatchSource> train_data_, eval_data_;
  std::unique_ptr<Backend> backend_;
  Model model_;
  train_detail::RunRecord record_;
  std::int64_t total_;      // steps to train to; -1: until the training data ends
  std::int64_t start_ = 0;  // the step resumed from
  std::int64_t last_checkpoint_step_ = -1;
  TrainResult result_;
  StepClock clock_;
  double smoothed_loss_ = NAN;
  double window_loss_ = 0;
  std::vector<float> recent_losses_;  // watch_for_spike's window
  bool table_fault_planted_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_train_backend(const TrainConfig& cfg) {
  std::unique_ptr<Backend> b = make_backend(cfg.backend, cfg.dense_math);
  if (b->name() != "cpu") {  // the fleet's ledger may have quarantined this GPU
    const HealthLedger ledger(cfg.health_ledger.empty() ? default_ledger_path()
                                                        : cfg.health_ledger);
    const std::string note =
        check_device_allowed(ledger, detect_gpu_uuid(), detect_gpu(), cfg.allow_quarantined);
    if (!note.empty()) std::fprintf(stderr, "parity: warning: %s\n", note.c_str());
  }
  if (cfg.memory_limit_bytes > 0) {
    try {
      b->limit_memory(static_cast<std::size_t>(cfg.memory_limit_bytes));
    } catch (const Error& e) {  // a limit this device cannot take is the run's input
      throw InputError(e.what());
    }
  }
  if (cfg.gemm_catalog == nullptr) return b;
  const std::int64_t here = b->blas_library_version();
  if (here == 0) return b;  // no BLAS library: the cpu backend
  const bool from_plan = cfg.gemm_library_version != 0;
  const std::int64_t measured =
      from_plan ? cfg.gemm_library_version : cfg.gemm_catalog->library_version;
  if (here != measured) {
    // A catalog measured with another library names configurations this one may not have, at
    // times it does not take: the library's own choices are the safe ones.
    std::fprintf(stderr,
                 "parity: kernel selection: %s says the kernel choices were measured with BLAS "
                 "library version %lld (field %s) and this machine's is %lld: every product "
                 "takes the library's own choice\n",
                 from_plan ? "the plan" : cfg.gemm_catalog->source_file.c_str(),
                 static_cast<long long>(measured),
                 from_plan ? "gemm_catalog.library_version" : "library_version",
                 static_cast<long long>(here));
    return b;
  }
  b->use_gemm_catalog(cfg.gemm_catalog, cfg.gemm_hbm_bytes_per_s, cfg.gemm_decisions);
  return b;
}

TrainResult train(const TrainConfig& config, TrainObserver* observer) {
  if (config.model.kind == ModelKind::hstu) {
    if (config.spike_factor > 0)
      throw InputError("--spike-factor: loss spikes are watched in DLRM models so far");
    return train_detail::train_hstu(config, observer);
  }
  TrainConfig cfg = settle(config);
  std::vector<std::string> recovered;
  std::int64_t resume_at = -1;
  for (;;) {
    try {
      Trainer trainer(cfg, train_detail::make_sources(cfg), observer, false, resume_at);
      TrainResult r = trainer.run();
      r.faults_recovered = std::move(recovered);
      return r;
    } catch (const FaultInTraining& f) {
      std::int64_t from = -1;
      recovered.push_back(train_detail::after_fault(
          cfg, f, observer, recovered.size(), from, [](const TrainConfig& rc, std::int64_t at) {
            Trainer replay(rc, train_detail::make_sources(rc), nullptr, true, at);
            return replay.run();
          }));
      cfg.resume = true;
      resume_at = from;
      // A planted fault stands for a transient one: it does not recur.
      cfg.inject_fault.reset();
      cfg.inject_table_fault.reset();
    }
  }
}

}  // namespace parity
