// The training loop of HSTU models (train() hands them here): synthetic sequences or a sequence
// shard dataset (or batch sources of the user's own) in, steps,
// evaluation (AUC per task) and checkpoints out, through the same events, checkpoint format and
// resume rules as the DLRM loop. Over several ranks (TrainConfig::comm, with the plan that shards
// the tables) each rank reads its slice of every global batch and of every evaluation batch, the
// predictions are gathered for the AUC, and checkpoints are sets (one file a rank and an index).
//
// Why a loop of its own: the DLRM loop is built around Model (device-made synthetic data,
// host-placed tables, file data), none of which an HSTU model has yet. What the two share (the
// run record, checkpoints, events, a plan's recipe in TrainConfig) is shared code; what differs
// is small.
#include "hstu_trainer.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "faults.h"
#include "parity/checkpoint.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/metrics.h"
#include "parity/plan.h"
#include "ranks.h"
#include "run_record.h"
#include "sources.h"

namespace parity::train_detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The most examples a rank's slice of a batch of n holds.
std::int64_t widest_slice(const TrainConfig& cfg, std::int64_t n) {
  const std::int64_t W = cfg.comm != nullptr ? cfg.comm->size() : 1;
  return (n + W - 1) / W;
}

HstuModel::Options model_options(const TrainConfig& cfg) {
  HstuModel::Options o;
  o.token_capacity = cfg.token_capacity;
  o.recompute = cfg.recompute;
  return o;
}

class HstuTrainer {
 public:
  // replay: a fault's replay (train_hstu() makes it): trains to cfg.steps and neither evaluates
  // nor writes checkpoints. resume_at (with cfg.resume): the newest checkpoint to resume from
  // (-1: the directory's newest).
  HstuTrainer(const TrainConfig& cfg, Sources data, TrainObserver* observer, bool replay = false,
              std::int64_t resume_at = -1)
      : cfg_(cfg),
        observer_(observer),
        replay_(replay),
        resume_at_(resume_at),
        backend_(make_train_backend(cfg)),
        // The ranks of a sharded run write one directory together: rank 0 holds it for them.
        lock_(cfg.checkpoint_dir.empty() || (cfg.comm != nullptr && cfg.comm->rank() != 0)
                  ? nullptr
                  : std::make_unique<CheckpointDirLock>(cfg.checkpoint_dir)),
        train_data_(std::move(data.train)),
        eval_data_(std::move(data.eval)),
        model_(cfg.model, *backend_, widest_slice(cfg, cfg.batch), cfg.seed, model_options(cfg),
               cfg.shard_plan, cfg.comm, cfg.dense_bucket_bytes),
        record_(run_record(cfg.model, cfg.batch, cfg.seed, cfg.dense_math, train_data_->kind())) {
    if (cfg.comm != nullptr && (!train_data_->reads_slices() || !eval_data_->reads_slices()))
      throw InputError(fmt::format(
          "a run over several ranks reads each rank's slice of every batch, and {} reads whole "
          "batches only (BatchSource::reads_slices)",
          train_data_->reads_slices() ? eval_data_->describe() : train_data_->describe()));
    if (cfg.product_checks) backend_->set_product_checks(true);
    if (cfg.inject_table_fault)
      check_table_fault(*cfg.inject_table_fault, model_.checkpoint_layout());
  }

  TrainResult run() {
    resume();
    const std::int64_t start = model_.step();
    if (start >= cfg_.steps)
      throw InputError(fmt::format(
          "the checkpoint {} is at step {} and --steps is {}: nothing is left to train (--steps "
          "counts the resumed steps too: give more than {})",
          result_.last_checkpoint.string(), start, cfg_.steps, start));
    result_.start_step = start;
    if (!replay_) check_eval_data(*eval_data_, cfg_.batch, cfg_.eval_examples);
    TrainEvent s = event(TrainEvent::Kind::start, start);
    s.message = fmt::format(
        "HSTU model '{}' ({} layers, d {}, histories up to {} events, {} targets, {} tasks), {} "
        "dense and {} embedding parameters, batch {} ({}), on the {} backend ({}), "
        "{}{}",
        cfg_.model.name, cfg_.model.hstu->layers, cfg_.model.hstu->model_dim,
        cfg_.model.hstu->sequence.max_len, cfg_.model.hstu->sequence.targets,
        cfg_.model.hstu->tasks.size(), model_.dense_parameter_count(),
        model_.embedding_parameter_count(), cfg_.batch,
        fmt::format("buffers for {} tokens, recompute {}", model_.token_capacity(),
                    cfg_.recompute ? "on" : "off"),
        backend_->name(),
        backend_->name() == "cpu" && cfg_.dense_math != DenseMath::fp32
            ? fmt::format(
                  "{} dense math asked; the cpu reference computes in fp32 with double sums",
                  dense_math_name(cfg_.dense_math))
            : fmt::format("{} dense math", dense_math_name(cfg_.dense_math)),
        train_data_->kind() == "synthetic-sequences"
            ? fmt::format("{} (seed {})", train_data_->describe(), cfg_.seed)
            : train_data_->describe(),
        start > 0 ? fmt::format(", resumed at step {}", start) : "");
    if (cfg_.comm != nullptr)
      s.message += fmt::format("; over {} ranks ({}), each on its slice of every batch{}",
                               cfg_.comm->size(), cfg_.comm->engine(),
                               model_.sharded() ? ", the tables sharded by the plan" : "");
    emit(s);

    // The batch of the next step is made and laid out as tokens on a worker thread while this
    // one trains (the data are a pure function of the step, so the run is the same). Declared
    // before the future, whose destructor waits for the worker.
    Batch b, next;
    HstuModel::Layout layout, next_layout;
    std::future<void> ahead;
    const auto t0 = Clock::now();
    train_data_->seek(start * cfg_.batch);
    next_batch(b);
    lay_out(b, layout);
    auto last_report = t0;
    double paused = 0.0, smoothed = NAN;
    // The steady rate starts after the warm-up steps (the first batch's layout, the libraries'
    // plans and the buffers' first use), as the DLRM loop's does; the profile starts there too.
    constexpr std::int64_t kWarmupSteps = 2;
    std::optional<Clock::time_point> steady;
    double paused_before_steady = 0.0;
    std::int64_t window_start = start;
    bool table_fault_planted = false;
    for (std::int64_t step = start; step < cfg_.steps; ++step) {
      // The profile starts after two warm-up steps, as the DLRM loop's does.
      if (step == start + kWarmupSteps) {
        backend_->synchronize();
        steady = Clock::now();
        paused_before_steady = paused;
        if (cfg_.profile) model_.set_profiling(true);
      }
      if (cfg_.inject_fault && step + 1 == cfg_.inject_fault->step)
        backend_->inject_product_fault(cfg_.inject_fault->fault);
      if (cfg_.inject_table_fault && step + 1 == cfg_.inject_table_fault->step) {
        backend_->synchronize();  // the steps before it have updated the table
        plant_table_fault(*cfg_.inject_table_fault, model_.checkpoint_layout(), *backend_);
        table_fault_planted = true;
      }
      if (step + 1 < cfg_.steps)
        ahead = std::async(std::launch::async, [this, &next, &next_layout] {
          next_batch(next);
          lay_out(next, next_layout);
        });
      model_.train_step(b, layout);
      if (ahead.valid()) {
        ahead.get();
        std::swap(b, next);
        std::swap(layout, next_layout);
      }
      const std::int64_t done = step + 1;
      const bool report =
          seconds_since(last_report) >= cfg_.report_interval_s || done == cfg_.steps;
      if (report) {
        const float loss = model_.last_loss();
        // Reports come by the clock, not at the same step on every rank: a run over several
        // ranks checks where the ranks meet (check_faults).
        if (!sharded() && !std::isfinite(loss)) check_faults(done);
        smoothed = std::isnan(smoothed) ? loss : 0.8 * smoothed + 0.2 * loss;
        TrainEvent e = event(TrainEvent::Kind::progress, done);
        const double window_s = seconds_since(last_report);
        e.loss = smoothed;
        e.steps_per_s = window_s > 0 ? static_cast<double>(done - window_start) / window_s : 0;
        e.examples_per_s = e.steps_per_s * static_cast<double>(cfg_.batch);
        emit(e);
        last_report = Clock::now();
        window_start = done;
        result_.final_loss = loss;
      }
      const auto pause_start = Clock::now();
      const bool eval_now = cfg_.eval_every > 0 && done % cfg_.eval_every == 0;
      const bool ckpt_now = !cfg_.checkpoint_dir.empty() && cfg_.checkpoint_every > 0 &&
                            done % cfg_.checkpoint_every == 0;
      if ((eval_now || ckpt_now) && done != cfg_.steps) {
        check_faults(done);  // never an evaluation or a checkpoint of a bad step
        if (eval_now) evaluate(done);
        if (ckpt_now) checkpoint(done);
      }
      paused += seconds_since(pause_start);
    }
    const auto loop_end =
        Clock::now();  // the last report read the last step's loss: its work is done
    if (cfg_.profile) {
      model_.finish_profile();
      const auto n = static_cast<double>(std::max<std::int64_t>(model_.profiled_steps(), 1));
      for (const auto& [k, v] : model_.profile_ms()) result_.profile_ms_per_step[k] = v / n;
      for (const auto& [k, v] : model_.profile_ops_ms()) result_.profile_ops_ms_per_step[k] = v / n;
      for (const auto& [k, v] : model_.profile_host_ops_ms())
        result_.profile_host_ops_ms_per_step[k] = v / n;
      result_.profiled_steps = model_.profiled_steps();
    }
    const double train_s = seconds_since(t0) - paused;
    result_.steps = model_.step();
    if (cfg_.comm != nullptr && result_.steps > start) {  // the mean over the global batch
      double loss = static_cast<double>(model_.last_loss()) * static_cast<double>(b.size) /
                    static_cast<double>(cfg_.batch);
      cfg_.comm->all_reduce_sum(std::span<double>(&loss, 1));
      result_.final_loss = loss;
    }
    result_.examples_per_s =
        train_s > 0 ? static_cast<double>((result_.steps - start) * cfg_.batch) / train_s : 0;
    result_.steady_examples_per_s = result_.examples_per_s;
    if (steady) {
      const double t = std::chrono::duration<double>(loop_end - *steady).count() -
                       (paused - paused_before_steady);
      const std::int64_t n = result_.steps - (start + kWarmupSteps);
      if (t > 0 && n > 0) result_.steady_examples_per_s = static_cast<double>(n * cfg_.batch) / t;
    }
    check_faults(result_.steps);
    if (replay_) return result_;
    if (!cfg_.checkpoint_dir.empty()) checkpoint(result_.steps);
    evaluate(result_.steps);
    result_.products_checked = backend_->product_checks().products;
    if (cfg_.inject_table_fault && !table_fault_planted) {
      TrainEvent w = event(TrainEvent::Kind::warning, result_.steps);
      w.message = fmt::format(
          "--inject-table-fault: step {} was not trained here (the run ended or resumed past it): "
          "nothing was tested",
          cfg_.inject_table_fault->step);
      emit(w);
    }
    if (cfg_.inject_fault && backend_->product_checks().fault_pending) {
      TrainEvent w = event(TrainEvent::Kind::warning, result_.steps);
      w.message = fmt::format(
          "--inject-fault: the fault for product {} of step {} never fired (the run ended or "
          "resumed past it, or the step has fewer products): nothing was tested",
          cfg_.inject_fault->fault.product, cfg_.inject_fault->step);
      emit(w);
    }
    result_.model_memory_bytes = model_.allocated_bytes_by_category();
    result_.backend_memory_bytes = backend_->internal_memory_bytes();
    result_.gemm_selection = backend_->gemm_selection_counts();
    if (model_.token_capacity_growths() > 0) {
      TrainEvent w = event(TrainEvent::Kind::warning, result_.steps);
      w.message = fmt::format(
          "{} batches had more tokens than the per-token buffers held ({} tokens planned): they "
          "grew to {}",
          model_.token_capacity_growths(), cfg_.token_capacity, model_.token_capacity());
      emit(w);
    }
    TrainEvent d = event(TrainEvent::Kind::done, result_.steps);
    d.loss = result_.final_loss;
    d.examples_per_s = result_.examples_per_s;
    d.steady_examples_per_s = result_.steady_examples_per_s;
    d.auc = result_.auc;
    d.teacher_auc = result_.teacher_auc;
    emit(d);
    return result_;
  }

 private:
  bool sharded() const { return cfg_.comm != nullptr && cfg_.comm->size() > 1; }
  std::string last_good() const {
    return result_.last_checkpoint.empty() ? std::string()
                                           : fmt::format(" (the last good checkpoint is '{}')",
                                                         result_.last_checkpoint.string());
  }

  // Stops the run (FaultInTraining, which train_hstu() replays) where a checksummed product has
  // failed its check or the loss of step `done` is not finite. Over several ranks a collective,
  // called by every rank at the same step: the ranks agree, and every rank stops.
  void check_faults(std::int64_t done) {
    const bool gpu = backend_->name() != "cpu";
    if (cfg_.product_checks)
      throw_if_products_failed(backend_->product_checks(), cfg_.comm, done, last_good(), gpu);
    bool bad = !std::isfinite(model_.last_loss());
    if (sharded()) bad = sum_over_ranks(*cfg_.comm, bad ? 1.0 : 0.0) > 0;
    if (bad)
      throw FaultInTraining(
          FaultKind::nonfinite, done, NAN,
          fmt::format("training diverged: the loss of step {} is NaN or infinite{}; nothing after "
                      "the last checkpoint was saved",
                      done, sharded() ? " on at least one rank" : ""),
          last_good(),
          ". A learning rate too high for this model and batch, or NaN or infinite values in the "
          "data, are the usual causes",
          gpu);
  }

  TrainEvent event(TrainEvent::Kind kind, std::int64_t step) const {
    TrainEvent e;
    e.kind = kind;
    e.step = step;
    e.total_steps = cfg_.steps;
    return e;
  }
  void emit(const TrainEvent& e) const {
    if (observer_ != nullptr) observer_->on_event(e);
  }

  // The next training batch (this rank's slice of it over several ranks): always a full one
  // (shard datasets repeat their examples).
  void next_batch(Batch& b) {
    if (cfg_.comm != nullptr) {
      const std::int64_t n =
          train_data_->next_slice(cfg_.batch, cfg_.comm->rank(), cfg_.comm->size(), b);
      if (n != cfg_.batch)
        throw InputError(fmt::format("{} gave {} examples where a batch of {} was asked for",
                                     train_data_->describe(), n, cfg_.batch));
      return;
    }
    if (!train_data_->next(cfg_.batch, b) || b.size != cfg_.batch)
      throw InputError(fmt::format("{} gave {} examples where a batch of {} was asked for",
                                   train_data_->describe(), b.size, cfg_.batch));
  }
  // The batch laid out as tokens; the step's examples over every rank are the global batch.
  void lay_out(const Batch& b, HstuModel::Layout& layout) const {
    model_.layout(b, layout);
    layout.global_batch = cfg_.batch;
  }

  // The newest good checkpoint, as the DLRM loop takes it: a damaged one is set aside and the
  // one before it tried; one of another run stops the run.
  void resume() {
    if (!cfg_.resume) return;
    auto steps = list_checkpoints(cfg_.checkpoint_dir);
    if (resume_at_ >= 0) std::erase_if(steps, [&](std::int64_t c) { return c > resume_at_; });
    if (cfg_.comm != nullptr)
      same_checkpoints_on_every_rank(*cfg_.comm, steps, cfg_.checkpoint_dir);
    if (steps.empty()) {
      TrainEvent w = event(TrainEvent::Kind::warning, 0);
      w.message =
          fmt::format("no checkpoint in '{}': starting from step 0", cfg_.checkpoint_dir.string());
      emit(w);
      return;
    }
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const auto path = find_checkpoint(cfg_.checkpoint_dir, *it);
      std::int64_t step = -1;
      std::string corrupt;
      std::exception_ptr failed;
      try {
        step = resumable_step(path, record_);
        load_checkpoint(path, model_.checkpoint_layout(), *backend_, TensorValues::finite);
      } catch (const CheckpointCorrupt& e) {
        corrupt = e.what();
      } catch (...) {
        failed = std::current_exception();
      }
      // The ranks agree: any rank's failure stops them all, any rank's damaged piece sets the
      // checkpoint aside for all.
      const auto [any_failed, any_corrupt] =
          agree_on_resume(cfg_.comm, failed != nullptr, !corrupt.empty());
      if (any_failed) {
        if (failed) std::rethrow_exception(failed);
        throw InputError(fmt::format(
            "another rank could not resume from '{}' (its message says why)", path.string()));
      }
      if (!any_corrupt) {
        model_.set_step(step);
        result_.last_checkpoint = path;
        return;
      }
      const bool mover = cfg_.comm == nullptr || cfg_.comm->rank() == 0;
      const auto aside =
          mover ? set_aside_checkpoint(path) : std::filesystem::path(path.string() + ".corrupt");
      if (cfg_.comm != nullptr) cfg_.comm->barrier();  // moved before any rank looks again
      TrainEvent w = event(TrainEvent::Kind::warning, 0);
      w.message = fmt::format("{}; set aside as '{}', trying the one before it",
                              corrupt.empty()
                                  ? "another rank found checkpoint '" + path.string() + "' damaged"
                                  : corrupt,
                              aside.string());
      emit(w);
    }
    throw InputError(fmt::format(
        "every checkpoint in '{}' is damaged; nothing to resume from: remove --resume to start "
        "again from step 0",
        cfg_.checkpoint_dir.string()));
  }

  // AUC per task on the held-out split, their mean reported as the AUC (over several ranks each
  // predicts its slice of every evaluation batch, and every rank gathers every prediction).
  void evaluate(std::int64_t step) {
    backend_->raise_input_errors();  // a bad id a GPU kernel skipped stops the run here
    const int tasks = static_cast<int>(cfg_.model.hstu->tasks.size());
    std::vector<float> probs, labels, teacher, p;
    Batch b;
    eval_data_->seek(0);
    for (std::int64_t seen = 0; seen < cfg_.eval_examples;) {
      const std::int64_t want = std::min(cfg_.batch, cfg_.eval_examples - seen);
      std::int64_t n = 0;
      if (cfg_.comm != nullptr) {
        n = eval_data_->next_slice(want, cfg_.comm->rank(), cfg_.comm->size(), b);
      } else if (eval_data_->next(want, b)) {
        n = b.size;
      }
      if (n == 0) break;
      seen += n;
      // A batch with fewer examples than ranks leaves some rank no slice, and a sharded lookup
      // needs every rank: every rank sees its size and drops it (as the DLRM loop does).
      if (cfg_.comm != nullptr && n < cfg_.comm->size()) continue;
      p.resize(b.labels.size());
      model_.predict(b, p.data());
      probs.insert(probs.end(), p.begin(), p.end());
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
      teacher.insert(teacher.end(), b.teacher_prob.begin(), b.teacher_prob.end());
    }
    if (cfg_.comm != nullptr) {
      probs = gather_all(*cfg_.comm, probs);
      labels = gather_all(*cfg_.comm, labels);
      teacher = gather_all(*cfg_.comm, teacher);
    }
    if (probs.empty())
      throw InputError(fmt::format("{} holds no examples to evaluate on", eval_data_->describe()));
    // The teacher's ceiling where every example came with its probability (synthetic data).
    const bool has_teacher = teacher.size() == probs.size();
    double auc = 0.0, ceiling = 0.0;  // 0: no teacher to compare with
    std::string per_task;
    for (int k = 0; k < tasks; ++k) {
      std::vector<float> pk, lk, tk;
      for (std::size_t i = static_cast<std::size_t>(k); i < probs.size();
           i += static_cast<std::size_t>(tasks)) {
        pk.push_back(probs[i]);
        lk.push_back(labels[i]);
        if (has_teacher) tk.push_back(teacher[i]);
      }
      const double a = roc_auc(pk, lk);
      auc += a / tasks;
      if (has_teacher) ceiling += roc_auc(tk, lk) / tasks;
      per_task += fmt::format("{}{} {:.4f}", per_task.empty() ? "" : ", ",
                              cfg_.model.hstu->tasks[static_cast<std::size_t>(k)], a);
    }
    result_.auc = auc;
    result_.eval_log_loss = log_loss(probs, labels);
    result_.teacher_auc = ceiling;
    TrainEvent e = event(TrainEvent::Kind::eval, step);
    e.auc = auc;
    e.eval_log_loss = result_.eval_log_loss;
    e.teacher_auc = ceiling;
    e.message = "AUC per task: " + per_task;
    emit(e);
  }

  void checkpoint(std::int64_t step) {
    backend_->raise_input_errors();  // never a checkpoint after a step that met bad input
    auto path = checkpoint_path(cfg_.checkpoint_dir, step);
    const auto metadata = checkpoint_metadata(record_, step);
    // One process holding its tables whole writes one file; sharded ranks write a set, each its
    // pieces.
    if (model_.sharded())
      path = save_checkpoint_set(cfg_.checkpoint_dir, step, model_.checkpoint_layout(), metadata,
                                 *cfg_.comm, *backend_, TensorValues::finite);
    else
      save_safetensors(path, model_.tensors(), metadata, *backend_, TensorValues::finite);
    if (cfg_.comm == nullptr || cfg_.comm->rank() == 0)
      prune_checkpoints(cfg_.checkpoint_dir, cfg_.keep_checkpoints);
    result_.last_checkpoint = path;
    TrainEvent e = event(TrainEvent::Kind::checkpoint, step);
    e.message = path.string();
    emit(e);
  }

  const TrainConfig& cfg_;
  TrainObserver* observer_;
  bool replay_;
  std::int64_t resume_at_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CheckpointDirLock> lock_;
  std::unique_ptr<BatchSource> train_data_, eval_data_;
  HstuModel model_;
  RunRecord record_;
  TrainResult result_;
};

}  // namespace

TrainResult train_hstu(const TrainConfig& in, TrainObserver* observer) {
  TrainConfig cfg = in;
  if (!cfg.train_files.empty() || !cfg.eval_files.empty())
    throw InputError(fmt::format(
        "model '{}' is an HSTU model: it trains on synthetic sequences or a sequence shard "
        "dataset (parity data synth --model {}), not on Criteo TSV files",
        cfg.model.name, cfg.model.name));
  if (static_cast<bool>(cfg.train_data) != static_cast<bool>(cfg.eval_data))
    throw InputError(
        "data of your own needs both sources, TrainConfig::train_data and eval_data (the built-in "
        "data bring their own held-out split)");
  if (cfg.train_data && !cfg.shard_dir.empty())
    throw InputError(
        "give either batch sources of your own (train_data, eval_data) or a shard "
        "dataset, not both");
  // Under bf16 the products and the attention take bf16 operands (fp32 sums); the activations
  // stay fp32 between ops.
  if (cfg.dense_math == DenseMath::fp16)
    throw InputError("HSTU models train with fp32, tf32 or bf16 dense math, not fp16");
  cfg.batch = cfg.batch > 0 ? cfg.batch : cfg.model.batch_size;
  if (cfg.batch <= 0)
    throw InputError(fmt::format("batch size must be positive, got {}", cfg.batch));
  if (cfg.steps < 0) throw InputError(fmt::format("--steps must be >= 0, got {}", cfg.steps));
  if (cfg.steps == 0) cfg.steps = 1000;
  if (cfg.eval_examples <= 0) throw InputError("eval examples must be positive");
  if (cfg.resume && cfg.checkpoint_dir.empty())
    throw InputError("--resume needs a checkpoint directory (--checkpoint DIR)");
  if (cfg.keep_checkpoints < 1)
    throw InputError(fmt::format(
        "checkpoints kept must be at least 1 (the newest good one), got {}", cfg.keep_checkpoints));
  if (cfg.inject_fault && cfg.inject_fault->step < 1)
    throw InputError(
        fmt::format("--inject-fault: step {}, expected 1 or more", cfg.inject_fault->step));
  if ((cfg.comm == nullptr) != (cfg.shard_plan == nullptr))
    throw InputError("a sharded run needs both its plan and its communicator");
  if (cfg.comm != nullptr && cfg.batch < cfg.comm->size())
    throw InputError(fmt::format("a batch of {} examples cannot be split over {} ranks", cfg.batch,
                                 cfg.comm->size()));
  std::vector<std::string> recovered;
  std::int64_t resume_at = -1;
  for (;;) {
    try {
      HstuTrainer trainer(cfg, make_sources(cfg), observer, false, resume_at);
      TrainResult r = trainer.run();
      r.faults_recovered = std::move(recovered);
      return r;
    } catch (const FaultInTraining& f) {
      std::int64_t from = -1;
      recovered.push_back(after_fault(cfg, f, observer, recovered.size(), from,
                                      [](const TrainConfig& rc, std::int64_t at) {
                                        HstuTrainer replay(rc, make_sources(rc), nullptr, true, at);
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

}  // namespace parity::train_detail
