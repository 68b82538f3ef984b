// The training loop: data in, steps, periodic evaluation and checkpoints out.
// It reports through an observer and never prints; tools/parity renders the progress.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parity/data.h"
#include "parity/engine.h"
#include "parity/spec.h"

namespace parity {

// Makes a batch source (data.h). train() calls it once per run, so that every run, a resumed one
// too, starts from a fresh source and positions it with seek().
using BatchSourceFactory = std::function<std::unique_ptr<BatchSource>()>;

class Communicator;
struct Plan;

struct TrainConfig {
  ModelSpec model;
  // Steps to train in total (counting resumed ones); 0: one pass over file data or a source of
  // your own, or 1000 for synthetic data.
  std::int64_t steps = 0;
  std::int64_t batch = 0;  // examples per step; 0: the model's batch_size
  std::uint64_t seed = 1;  // initialisation and synthetic data
  std::string backend = "cpu";
  DenseMath dense_math = DenseMath::fp32;  // dense matrix products on GPU backends (a plan's)
  // HSTU models (a plan's): tokens a step the per-token buffers are sized for (0: the longest
  // possible batch), and activation recompute (HstuModel::Options).
  std::int64_t token_capacity = 0;
  bool recompute = false;
  // Data: sources of your own when train_data is set (eval_data then too: the held-out data),
  // else a shard dataset when shard_dir is set (parity data synth / convert), else Criteo TSV
  // files when train_files is set, else synthetic batches made on the fly.
  BatchSourceFactory train_data, eval_data;
  std::filesystem::path shard_dir;
  std::vector<std::filesystem::path> train_files;
  std::vector<std::filesystem::path> eval_files;
  OnBadLine on_bad_line = OnBadLine::stop;
  // Evaluation on held-out data.
  std::int64_t eval_examples = 32768;  // examples evaluated on (fewer where the eval data ends)
  std::int64_t eval_every = 0;         // steps between evaluations; 0: only at the end
  // Checkpoints: DIR/step-N.safetensors, written atomically.
  std::filesystem::path checkpoint_dir;  // empty: no checkpoints
  std::int64_t checkpoint_every = 0;     // steps between checkpoints; 0: only at the end
  int keep_checkpoints = 2;
  bool resume = false;              // continue from the newest checkpoint in checkpoint_dir
  double report_interval_s = 0.25;  // how often progress events are sent
  // Mean training loss over windows of this many steps (0: none), for comparing runs across
  // backends and precisions by their smoothed curves (docs/reliability.md). Reads every step's
  // loss, so the host waits for each step: a numerics run's setting, not a fast one's.
  std::int64_t loss_window = 0;
  // Profile the step by op category with device timing marks (from the third step on).
  bool profile = false;
  // GPU backends: every matrix product's kernel from this catalog's ranking (parity/select.h)
  // instead of the library's heuristic; gemm_hbm_bytes_per_s is the ranking's memory floor.
  std::shared_ptr<const GemmCatalog> gemm_catalog;
  double gemm_hbm_bytes_per_s = 0;
  // The plan's kernel choices (Plan::kernels with a catalog), run before the ranking, and the
  // library version they were ranked for: a backend whose library differs takes the library's
  // own choices instead of the plan's and the catalog's, and says so.
  std::vector<GemmDecision> gemm_decisions;
  std::int64_t gemm_library_version = 0;
  // GPU backends: the device's memory limited to this many bytes for the run (Backend::
  // limit_memory, at start-up); 0: the whole device.
  double memory_limit_bytes = 0;
  // The health ledger (parity/health.h) the GPU is looked up in before the first step: empty, the
  // host's (default_ledger_path()). A quarantined GPU is refused unless allow_quarantined.
  std::filesystem::path health_ledger;
  bool allow_quarantined = false;
  // Checksummed dense products (Backend::set_product_checks, DLRM): a product that fails its check
  // stops the run (NumericalError) where the finite-value guard is read, and marks the GPU
  // suspect in the health ledger. inject_fault flips a bit of a product's output in the given
  // step (1-based), to test detection end to end.
  bool product_checks = false;
  struct FaultAtStep {
    std::int64_t step = 1;
    Backend::ProductFault fault;
  };
  std::optional<FaultAtStep> inject_fault;
  // inject_table_fault flips bit `bit` (0: the least significant) of element (row, col) of table
  // `table`'s stored weights before step `step` (1-based) trains, once: a fault in an embedding
  // row. The product checks do not see it (they check their inputs' product, not the inputs):
  // what it does is found by the finite-value guard or the spike watch and replayed like any
  // other fault. In a run over several ranks each rank that holds the element flips its copy.
  struct TableFaultAtStep {
    std::int64_t step = 1;
    std::string table;
    std::int64_t row = 0;
    std::int64_t col = 0;
    int bit = 30;
  };
  std::optional<TableFaultAtStep> inject_table_fault;
  // Faults found in training (a NaN or an infinity, a checksummed product that fails its check, a
  // loss spike) are replayed: the newest checkpoint is loaded again and the steps up to the one
  // the fault was found in are trained again on the same device. The same result again means the
  // data or the model is the cause (the run stops and says so); a different one means the device
  // (marked suspect in the health ledger), and training then continues from that checkpoint, once
  // a run. Needs checkpoint_dir and a checkpoint before the fault; a run of several processes
  // does not replay yet.
  bool replay_faults = true;
  // A step whose loss exceeds spike_factor times the mean loss of the (up to 100) steps before it
  // is a loss spike, a fault to replay (0: spikes are not looked for; from 10 steps into a run).
  // Reads every step's loss, so the host waits for each step.
  double spike_factor = 0;
  // Several processes (DLRM): the plan that shards the tables over `comm`'s ranks
  // (Model::shard). Every rank trains on its slice of each global batch of `batch` examples, rank
  // r on examples [batch r / W, batch (r + 1) / W), reading only that slice where the source can
  // skip the rest (BatchSource::next_slice); evaluation predicts each rank's
  // slice of the held-out examples and gathers them, so every rank reports the same AUC. The
  // progress loss is this rank's. Checkpoints are sets (parity/checkpoint.h). Both null: one
  // process.
  const Plan* shard_plan = nullptr;
  Communicator* comm = nullptr;
  // The dense gradients' all-reduce buckets (Model::shard).
  std::size_t dense_bucket_bytes = Model::kDenseBucket;
};

// The backend a run names, with the run's kernel catalog given to it.
std::unique_ptr<Backend> make_train_backend(const TrainConfig& cfg);

struct TrainEvent {
  enum class Kind { start, progress, eval, checkpoint, warning, done } kind = Kind::progress;
  std::int64_t step = 0;
  std::int64_t total_steps = 0;  // -1 when unknown (one pass over files)
  double loss = 0;               // smoothed training loss
  double steps_per_s = 0;
  double examples_per_s = 0;
  double steady_examples_per_s = 0;  // done: after the first two steps (0 when there were none)
  double auc = 0;                    // eval
  double eval_log_loss = 0;          // eval
  double teacher_auc = 0;            // eval on synthetic data: the ceiling; 0 otherwise
  std::string message;               // start: a description; checkpoint: the path; warning: text
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_event(const TrainEvent& e) = 0;
};

struct TrainResult {
  std::int64_t steps = 0;       // global step reached
  std::int64_t start_step = 0;  // step resumed from
  double final_loss = 0;
  double auc = 0;
  double eval_log_loss = 0;
  double teacher_auc = 0;
  // With TrainConfig::loss_window W: {last step, mean loss} of steps (k W, (k + 1) W], for every
  // whole window this run trained.
  std::vector<std::pair<std::int64_t, double>> loss_windows;
  // Training steps only (evaluation, checkpoints, Model::prepare excluded); steady: the same
  // after the first two steps (one-time set-up excluded).
  double examples_per_s = 0;
  double steady_examples_per_s = 0;
  std::filesystem::path last_checkpoint;
  // With TrainConfig::profile: milliseconds per step by op category (device timing marks),
  // averaged over profiled_steps.
  std::map<std::string, double> profile_ms_per_step;
  std::map<std::string, double> profile_ops_ms_per_step;       // "category: op"
  std::map<std::string, double> profile_host_ops_ms_per_step;  // the host's time per op
  std::map<std::string, double> profile_beside_ms_per_step;    // Model::profile_beside_ms
  std::int64_t profiled_steps = 0;
  // With TrainConfig::profile: the one-time costs the steady rate excludes, in seconds (the device
  // drained at each mark): the first batch read and staged before any step runs, then each of
  // the first two steps (the second includes staging the third batch, not overlapped then).
  double first_batch_s = 0;
  std::vector<double> first_steps_s;
  // Model::prepare before the first step (every run; not counted in the rates).
  double prepare_s = 0;
  // --product-checks: the products checked (training and evaluation), none of which failed.
  std::int64_t products_checked = 0;
  // Faults that a replay did not reproduce (the device's), each with its verdict, after which the
  // run continued from the checkpoint before them (TrainConfig::replay_faults).
  std::vector<std::string> faults_recovered;
  // The model's buffers in backend memory by category (Model::allocated_bytes_by_category).
  std::map<std::string, std::size_t> model_memory_bytes;
  // The backend's own memory at the end (Backend::internal_memory_bytes: scratch, workspaces).
  std::map<std::string, std::size_t> backend_memory_bytes;
  // Host-placed tables: lookups since each cache was last re-chosen and how many hit it
  // (Model::cache_stats), and the bytes of host memory holding their rows.
  std::vector<Model::CacheStats> cache;
  std::size_t host_resident_bytes = 0;
  int cache_refreshes = 0;
  double cache_refresh_s = 0;  // wall seconds of the refreshes, inside the run's time
  // Where the matrix products' kernels came from (GPU backends with a plan's choices or a
  // catalog; zeros otherwise).
  GemmSelectionCounts gemm_selection;
};

// Trains. Throws InputError on bad input (data, checkpoint), Error on other failures. A bad input
// that a GPU backend meets in a step (an id outside its table) is recorded there and thrown at the
// next evaluation or checkpoint, or at the end, before that evaluation is reported or that
// checkpoint written (Backend::raise_input_errors; progress events of the steps in between are
// still sent); the cpu backend throws at the step itself.
TrainResult train(const TrainConfig& config, TrainObserver* observer = nullptr);

}  // namespace parity
