// One rank's part of a DLRM's embedding tables as a plan shards them, and the exchange that gives
// the rank its local batch's pooled outputs from every rank's shards (forward) and takes their
// gradients back to the shards, where the backend's fused backward updates them.
//
// Why it is built this way: each shard is a table of its own for the backend's whole-batch ops
// (rows [r0, r1) and columns [c0, c1) of the model's table), so the same kernels run a shard as
// run a whole table, and an owner looks up the bags of every rank's batch at once (the batch in
// rank order, as one process would hold it). By sharding:
// - table and column: every id of a bag goes to the shard's owner, which returns the bag's pooled
//   row (its columns);
// - row: the ids within the shard's rows go to its owner (as id - r0), which returns the bag's
//   partial sum; the requester adds the partials in shard order. Mean pooling is summed on the
//   owners and divided by the whole bag's size on the requester (the gradient scaled likewise);
// - replicated: every rank looks its own bags up; for the update every rank receives every rank's
//   bags and gradients and applies the same fused update over the whole batch, so the replicas
//   stay identical (the planner's model counts an all-reduce of the table's gradient instead).
// Each rank's output rows are the single process's rows bit for bit under table and column
// sharding (the same bag sums in the same order); row sharding adds partial sums, so a bag that
// spans shards differs by rounding. The update of a row sees the same gradients in the same order
// as one process would, except that rowwise Adagrad over a column shard keeps its row's state
// from the shard's columns alone.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "parity/backend.h"
#include "parity/dist.h"
#include "parity/plan.h"

namespace parity {

class ShardedEmbedding {
 public:
  // The plan's tables (their shards) for `m`, on the communicator's rank; plan.gpus must equal
  // the communicator's size. Host-side buffers: the backend must read host memory (the cpu one).
  ShardedEmbedding(const ModelSpec& m, const Plan& plan, Communicator& comm, Backend& backend);

  // Every shard this rank holds filled from init(table, row, column) (the value a single
  // process's table would hold there), and its optimizer state zeroed.
  void fill(const std::function<float(int table, std::int64_t row, int col)>& init);

  // in: this rank's bags, every table (table-major CSR of global row ids, in.batch bags a table);
  // out: [in.batch, sum of dims] fp32, table t at its model column offset.
  void forward(const SparseInput& in, Mat out);
  // The gradient of the last forward's outputs, [batch, sum of dims]: every shard's rows updated
  // by the backend's fused backward with `opt` (after the exchange).
  void backward_update(CMat dout, const OptimizerParams& opt);

  // Table t's element (row, col) where this rank holds it, else nullopt.
  std::optional<float> weight(int t, std::int64_t row, int col) const;

  // A shard this rank holds, for checkpoints: where it lies, its weights [rows, cols] and its
  // optimizer state (host memory; cache_state_per_row floats a row), and whether this rank writes
  // it (a replicated table's first holder does, the others hold replicas).
  struct View {
    int table = 0;
    ShardPlan where;
    bool replicated = false, writer = true;
    float* weights = nullptr;
    float* state = nullptr;
  };
  std::vector<View> shards();
  // Bytes of the shards' weights and of their optimizer state.
  std::size_t weight_bytes() const;
  std::size_t state_bytes() const;

  // Called with a step-profile category as the work changes between the exchange
  // ("embedding_exchange") and the lookups ("embedding_forward") or updates
  // ("embedding_backward"), so that a profile times them apart (Model::shard sets it).
  void set_marker(std::function<void(const char* category)> mark) { mark_ = std::move(mark); }

 private:
  struct Shard {
    int table = 0;
    int index = 0;  // within the table's shards
    ShardPlan where;
    bool replicated = false;
    std::vector<float> weights;  // [rows, cols]
    std::vector<float> state;
    // The last forward's bags of every rank (rank order): CSR with ids relative to the shard.
    std::vector<std::int64_t> offsets, ids;
    std::vector<std::int64_t> bags_from;  // bags from each rank
  };
  // A shard that is exchanged (not replicated) in the global order every rank walks.
  struct Route {
    int table, index;
    ShardPlan where;
  };

  TableLayout layout_of(const Shard& s) const;
  void exchange(const std::vector<std::vector<std::byte>>& out,
                std::vector<std::vector<std::byte>>& in);

  const ModelSpec& m_;
  Communicator& comm_;
  Backend& backend_;
  OptimizerKind optimizer_;
  std::vector<std::int64_t> out_col_;  // per table
  std::vector<Route> routes_;          // every exchanged shard of every table, in order
  std::vector<Shard> mine_;            // shards this rank holds
  // The last forward's local bags: per table, per bag, the ids' count (for mean pooling and
  // the gradients' routing).
  std::int64_t batch_ = 0;
  std::vector<std::int64_t> local_offsets_, local_ids_;
  std::function<void(const char*)> mark_;
  void mark(const char* category) {
    if (mark_) mark_(category);
  }
};

}  // namespace parity
