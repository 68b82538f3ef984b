// The backend-neutral DLRM: parameters, activations and the training step,
// composed from the whole-batch ops of a Backend. All buffers are allocated once,
// at construction, for the largest batch; the step allocates nothing. Where each parameter lives:
// src/engine/layout.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/data.h"
#include "parity/dtype.h"
#include "parity/spec.h"

namespace parity {

// A named parameter or optimizer-state tensor in backend memory (for checkpoints).
struct TensorRef {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  void* data = nullptr;  // backend memory

  std::int64_t elements() const;
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * dtype_size(dtype); }
};

// What a process holds of a model's tensors, for checkpoints that load on any number of ranks
// (parity/checkpoint.h says how they are written and read). A tensor as one process names it
// (Model::tensors()):
struct CheckpointTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // [rows] or [rows, cols]
};

// What one rank holds of a tensor: rows [row_begin, row_end) and columns [col_begin, col_end) (a
// 1-D tensor has one column), row-major in `local` (backend memory).
struct CheckpointPiece {
  std::string name;  // the whole tensor's
  TensorRef local;
  std::int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  // A rowwise optimizer state (one value a row) kept over columns [begin, end) of a table of `of`
  // columns: a column shard's own state; of == 0 where the piece is not such a state. Loaded where
  // the columns differ from those of the pieces written, a row's state is the mean of the written
  // states over its columns, each weighted by the columns it shares: the whole row's state where
  // the written shards saw the same gradients.
  struct StateColumns {
    std::int64_t begin = 0, end = 0, of = 0;
  } state_columns;
  bool write = true;  // false: a replica of a piece another rank writes
};

struct CheckpointLayout {
  std::vector<CheckpointTensor> tensors;  // every tensor of the model
  std::vector<CheckpointPiece> pieces;    // what this rank holds
};

class Communicator;
struct Plan;
class ShardedEmbedding;

class Model {
 public:
  // Builds the model for batches of up to max_batch examples and initialises the
  // parameters from seed (deterministically, on the backend). With a plan and a communicator the
  // model is sharded from the start (shard()), and holds no whole table at any point.
  Model(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed,
        const Plan* shard_plan = nullptr, Communicator* comm = nullptr,
        std::size_t dense_bucket_bytes = kDenseBucket);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Forward, backward and update on one batch (stage, then train_staged). Does not synchronise
  // the host beyond waiting for the copy of an earlier batch from the same staging slot.
  void train_step(const Batch& batch);

  // The input pipeline: stage(batch) copies a batch into pinned host memory and starts its copy
  // to the device on the backend's copy queue; train_staged() enqueues forward, backward and
  // update on the oldest staged batch. Staging batch k+1 right after enqueuing step k hides both
  // copies behind step k. At most kInputSlots batches may be staged at once.
  static constexpr int kInputSlots = 2;
  // global_examples: where the batch is this rank's slice of a step over several ranks (shard()),
  // the step's examples over every rank, whose mean loss the ranks' summed gradients are (the
  // caller knows it); 0: the ranks sum their batch sizes at the step, one collective more.
  void stage(const Batch& batch, std::int64_t global_examples = 0);
  // Stages examples [first, first + count) of a split of synthetic data made on the device, where
  // the backend makes synthetic data (Backend::makes_synthetic_data): the batch
  // stage(data.make(split, first, count)) would stage, bit for bit, with no host work and no copy.
  void stage_synthetic(const SyntheticData& data, Split split, std::int64_t first,
                       std::int64_t count);
  void train_staged();
  // Makes the first step allocate and plan nothing: rehearses forward, backward and update on the
  // oldest staged batch's shapes (Backend::rehearse: scratch, workspaces and library plans made,
  // nothing enqueued, no value changed) and allocates every input slot's pinned staging memory.
  // Call it once, after staging the first batch; it neither trains nor takes the batch.
  void prepare();
  int staged() const;
  // Mean loss of the last train_step (synchronises).
  float last_loss();
  // The finite-value guard: the first step (counted as step() counts them) whose loss or updated
  // dense parameters held a NaN or an infinity, or -1 (synchronises). Every step is checked on the
  // device as part of the step; steps after a bad one still run, so a caller reads this wherever
  // it synchronises anyway and stops there.
  std::int64_t first_nonfinite_step();
  // Forward only; probs gets sigmoid(logit) per example (host memory, batch.size floats).
  void predict(const Batch& batch, float* probs);

  std::int64_t step() const;
  void set_step(std::int64_t s);
  const ModelSpec& spec() const;
  Backend& backend();

  // Every parameter and optimizer-state tensor, with stable names:
  //   bottom_mlp.{i}.weight [out, in], bottom_mlp.{i}.bias [out], cross.{l}.v [r, N],
  //   cross.{l}.w [N, r], cross.{l}.bias [N], top_mlp.{i}.weight, top_mlp.{i}.bias,
  //   embedding.{table}.weight [rows, dim], optimizer.embedding.{table}.state [rows] or
  //   [rows, dim], optimizer.dense.state [k, n_dense] (k = 1 adagrad, 2 adam: m then v).
  // Host-placed tables' tensors are their host-resident rows: their caches are written back
  // first, so every tensor holds its true values. After writing into the tensors (loading a
  // checkpoint), call tensors_written() so that the caches are read again.
  std::vector<TensorRef> tensors();
  void tensors_written();

  // Several processes: the tables as `plan` shards them over `comm`'s ranks (src/dist
  // ShardedEmbedding: each rank holds its shards, the bags and pooled rows are exchanged), and the
  // dense layers data-parallel (their gradients summed over the ranks before the optimizer step).
  // Each rank trains on its own slice of the global batch, and its loss gradient is scaled by its
  // share of the global batch, so the ranks' step is one process's step on the whole batch (to
  // rounding). Call before the first step, on every rank, with the same plan; the shards start
  // from the values this model's tables started from, and the whole tables are freed (each rank
  // holds its shards only). Tables in device memory only so far (any storage type); host-placed
  // ones are refused by name.
  // Checkpoints go through checkpoint_layout(); tensors() is refused. One rank whose plan holds
  // every table whole keeps its tables (nothing is exchanged). The dense gradients are summed in
  // buckets of at least dense_bucket_bytes, each as soon as the backward has made it, on a worker
  // thread and a communicator of their own (comm.duplicate()) while the backward goes on; where
  // the engine gives no such communicator, once at the end of the backward.
  void shard(const Plan& plan, Communicator& comm, std::size_t dense_bucket_bytes = kDenseBucket);
  // PyTorch DDP's default bucket (bucket_cap_mb = 25): large enough that each all-reduce runs near
  // the link's bandwidth, small enough that the first starts early in the backward.
  static constexpr std::size_t kDenseBucket = std::size_t{25} << 20;
  // What this process holds of every tensor tensors() names, for checkpoints that load on any
  // number of ranks: the whole tensors (as tensors(), host-placed tables written back first), or
  // on a sharded model the dense tensors (rank 0 writes them) and this rank's shards. After
  // loading into it, call tensors_written().
  CheckpointLayout checkpoint_layout();
  // The shards, when shard() was called (else null).
  const ShardedEmbedding* sharded_embedding() const;
  // Whether the dense gradients are summed in buckets while the backward goes on (shard()).
  bool dense_allreduce_overlapped() const;
  // The dense parameters and their optimizer state (tensors() without the tables), also on a
  // sharded model.
  std::vector<TensorRef> dense_tensors();

  // Host-placed tables (TableSpec::host_placed): each one's rows, cache rows, and the lookups
  // counted since its cache was last re-chosen, with how many hit the cache (synchronises).
  struct CacheStats {
    std::string table;
    std::int64_t rows = 0, cache_rows = 0;
    std::uint64_t hits = 0, lookups = 0;
  };
  std::vector<CacheStats> cache_stats();
  // The caches' refreshes so far and the wall seconds they took.
  int cache_refreshes() const;
  double cache_refresh_seconds() const;
  // Bytes of host memory holding host-placed tables' rows and optimizer state.
  std::size_t host_resident_bytes() const;

  // Profiling: with it on, every step records a device timing mark between op categories
  // (input_wait, mlp, embedding_forward, interaction, loss, embedding_backward,
  // dense_optimizer); profile_ms() gives the milliseconds per category summed over the
  // profiled steps. The marks of step k are read after step k+1 is enqueued, so the host does
  // not drain the device; the last step is read by finish_profile() (synchronises).
  void set_profiling(bool on);
  void finish_profile();
  const std::map<std::string, double>& profile_ms() const;
  // The same per op ("category: op", e.g. "interaction: cross.0 backward").
  const std::map<std::string, double>& profile_ops_ms() const;
  // The host's time per op, from its mark to the next (enqueueing it, and any wait in between).
  const std::map<std::string, double>& profile_host_ops_ms() const;
  std::int64_t profiled_steps() const;
  // Work on other queues beside the steps, summed the same way: "synthetic_input", the span of
  // making each step's batch on the device (on the copy queue, while the step before runs).
  const std::map<std::string, double>& profile_beside_ms() const;

  std::int64_t dense_parameter_count() const;
  std::int64_t embedding_parameter_count() const;
  // Bytes of backend memory held by the model (parameters, state, activations).
  std::size_t allocated_bytes() const;
  // The same by category, named as the plan's memory prediction names them where the two agree:
  // embedding_weights, embedding_optimizer_state, dense_parameters_and_state (parameters, their
  // gradients and the optimizer's state), activations (every activation and gradient buffer of
  // the step), and input_slots (the staged batches' buffers, the synthetic generator's block and
  // workspace), and, with host-placed tables, embedding_cache_maps (their cache maps and lookup
  // counts). The
  // backend's own scratch and workspaces are not the model's and not here.
  std::map<std::string, std::size_t> allocated_bytes_by_category() const;

 private:
  // The parameters and activations with the forward and backward over them, the input stager and
  // the step profiler (src/engine/model.cpp).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The backend-neutral HSTU model (ModelKind::hstu; src/engine/hstu_model.cpp): its parameters,
// activations and training step, composed from the backend's sequence ops. Per example the
// tokens are its contextual features (one each), its history events and its targets; every
// layer is
//   n = LayerNorm(x); [U V Q K] = SiLU(n W_uvqkᵀ + b); O = attention(Q, K, V) (causal, targets see
//   the history and themselves, relative position and time bias); x += (LayerNorm(O) ⊙ U) W_oᵀ +
//   b_o
// and each target's final token, layer-normed, gives one logit per task through a linear head;
// the loss is the mean BCE over targets and tasks. Tables are updated by their fused optimizer,
// the dense parameters (one flat buffer) by one optimizer call. Buffers are allocated once, for
// the longest batch; the step allocates nothing on the backend.
class HstuModel {
 public:
  struct Options {
    // A history longer than the model's max_len: keep its most recent max_len events (true) or
    // refuse the batch, naming the example (false).
    bool truncate_long_histories = false;
    // Tokens the per-token buffers (activations, their gradients, the token inputs) are sized for:
    // a plan's token_capacity; 0 (or more than the largest batch can have): max_tokens(). A batch
    // with more tokens grows them to an eighth more than it needs (token_capacity_growths counts
    // it), so a capacity planned for nearly every batch costs no run, only that one allocation.
    std::int64_t token_capacity = 0;
    // Activation recompute: each layer keeps x, the projection before SiLU, the attention output
    // and the statistics; its normed input, U/V/Q/K after SiLU and its norm-multiply output are
    // formed again in its backward (one buffer each for all layers), with the same bits.
    bool recompute = false;
  };
  // With a plan and a communicator the model is sharded from the start (shard()), and holds no
  // whole table at any point.
  HstuModel(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed,
            Options options, const Plan* shard_plan = nullptr, Communicator* comm = nullptr,
            std::size_t dense_bucket_bytes = Model::kDenseBucket);
  HstuModel(const ModelSpec& spec, Backend& backend, std::int64_t max_batch, std::uint64_t seed)
      : HstuModel(spec, backend, max_batch, seed, Options{}) {}
  ~HstuModel();
  HstuModel(const HstuModel&) = delete;
  HstuModel& operator=(const HstuModel&) = delete;

  // Forward, backward and update on one batch (Batch's HSTU fields).
  void train_step(const Batch& batch);

  // A batch checked and laid out as the step's tokens, on the host: the half of staging a batch
  // that touches no backend memory, so another thread may build the next one while a step runs.
  struct Staging;
  struct Layout {
    std::int64_t batch = 0, tokens = 0;
    std::vector<std::int64_t> seq, times, token_ids, token_offsets, ctx_rows, target_rows;
    std::vector<std::int64_t> blocks;  // sequence_blocks(seq)
    std::int64_t packed_blocks = 0;    // of them, the runs of short sequences that end it
    // Under shard(): the examples of the step over every rank, whose mean loss the ranks' summed
    // gradients are (the caller knows it; 0: summed over the ranks at each step).
    std::int64_t global_batch = 0;
    // The arrays the step copies in, packed by layout() in pinned memory where the backend copies
    // in the background, so that the step only enqueues the copies: the batch's contextual ids
    // and labels as they were at layout() (a batch changed since needs its layout again). Copies
    // of a Layout share it.
    std::shared_ptr<Staging> staged;
  };
  // Throws InputError naming the example and field, as train_step does. Const and thread-safe
  // (beside train_step on another layout: a layout's staging waits for the copies of its last
  // step).
  void layout(const Batch& batch, Layout& out) const;
  // train_step on a batch whose layout() is `layout`.
  void train_step(const Batch& batch, const Layout& layout);
  // Mean loss of the last train_step (synchronises).
  float last_loss();
  // Forward only: probs [batch.size, targets, tasks] (host memory) gets sigmoid of each logit.
  void predict(const Batch& batch, float* probs);

  // Several processes, as Model::shard: the tables as an HSTU plan lays them out over `comm`'s
  // ranks (split by rows, whole on one rank or replicated; ShardedEmbedding), the sequence
  // features' per-token lookups and the contextual tables' per-example ones exchanged with their
  // owners; the dense layers data-parallel, their gradients summed over the ranks before the
  // optimizer step, and each rank's loss gradient scaled by its share of the step's examples
  // (Layout::global_batch), so that the ranks' step is one process's step on the whole batch (to
  // rounding). Call once, before the first step, on every rank with the same plan (plan.gpus ==
  // comm.size()). The tables' storage types are the plan's (the model built from apply_plan). A
  // rank whose plan holds every table whole keeps its tables. Checkpoints then go through
  // checkpoint_layout(); tensors() is refused where the tables are sharded. The dense gradients
  // are summed in buckets of at least dense_bucket_bytes while the backward goes on, as Model's.
  void shard(const Plan& plan, Communicator& comm,
             std::size_t dense_bucket_bytes = Model::kDenseBucket);
  bool sharded() const;
  bool dense_allreduce_overlapped() const;
  // As Model's: whole tensors, or the dense tensors (rank 0 writes them) and this rank's shards.
  CheckpointLayout checkpoint_layout();
  // The dense parameters and their optimizer state (tensors() without the tables).
  std::vector<TensorRef> dense_tensors();
  // Table t's element (row, col) (t counts the sequence features, then the contextual tables)
  // where this process holds it, else nullopt (one value copied from backend memory: for tests).
  std::optional<float> table_value(int t, std::int64_t row, int col);

  std::int64_t step() const;
  void set_step(std::int64_t s);  // resuming: the step a checkpoint was written at
  const ModelSpec& spec() const;
  // Tokens of the largest batch the model was built for (examples x (contexts + max_len +
  // targets)).
  std::int64_t max_tokens() const;
  // Every parameter and optimizer-state tensor, named:
  //   layer.{l}.norm.gamma [d], layer.{l}.norm.beta [d], layer.{l}.uvqk.weight [2hv + 2ha, d],
  //   layer.{l}.uvqk.bias, layer.{l}.out.weight [d, hv], layer.{l}.out.bias [d],
  //   layer.{l}.rab.position [h, position_buckets], layer.{l}.rab.time [h, time_buckets],
  //   final_norm.gamma, final_norm.beta [d], head.weight [tasks, d], head.bias [tasks],
  //   embedding.{table}.weight [rows, dim] (sequence features, then contexts),
  //   optimizer.embedding.{table}.state, optimizer.dense.state [k, n_dense].
  std::vector<TensorRef> tensors();
  std::int64_t dense_parameter_count() const;
  std::int64_t embedding_parameter_count() const;
  std::size_t allocated_bytes() const;
  // The same by category, named as the plan's memory prediction names them: embedding_weights,
  // embedding_optimizer_state, dense_parameters_and_state, activations (kept for the backward),
  // gradients (of the activations), input_slots (the staged batch). The backend's own scratch and
  // workspaces are not here (Backend::internal_memory_bytes).
  std::map<std::string, std::size_t> allocated_bytes_by_category() const;
  // Tokens the per-token buffers hold now, and how many batches made them grow (Options).
  std::int64_t token_capacity() const;
  int token_capacity_growths() const;

  // The step profile, as Model's: device timing marks between categories (input, embedding_forward,
  // norms, projections, attention, recompute, head, embedding_backward, dense_optimizer) and per op
  // ("layer.0 attention backward"), summed over the profiled steps; predict() is not profiled.
  void set_profiling(bool on);
  void finish_profile();
  const std::map<std::string, double>& profile_ms() const;
  const std::map<std::string, double>& profile_ops_ms() const;
  const std::map<std::string, double>& profile_host_ops_ms() const;
  std::int64_t profiled_steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parity
