// One rank's part of a DLRM's embedding tables as a plan shards them, and the exchange that gives
// the rank its local batch's pooled outputs from every rank's shards (forward) and takes their
// gradients back to the shards, where the backend's fused backward updates them.
//
// Why it is built this way: a rank's shards are tables of their own to the backend's whole-batch
// ops (rows [r0, r1) and columns [c0, c1) of the model's table), held in one buffer of backend
// memory, so the kernels that run whole tables run them, and the owner looks up every rank's bags
// for all its shards in one call, the batch in rank order as one process would hold it. The
// lookups' output [all ranks' bags, the owner's shard columns] is then already the exchange's send
// buffer (rank q's bags are consecutive rows), and the gradients received back stack in the same
// order into the input of one fused backward. By sharding:
// - table and column: every id of a bag goes to the shard's owner, which returns the bag's pooled
//   row (its columns);
// - row: the ids within the shard's rows go to its owner (as id - r0), which returns the bag's
//   partial sum; the requester adds the partials in shard order. Mean pooling is summed on the
//   owners and divided by the whole bag's size on the requester (the gradient scaled likewise);
// - replicated: every rank looks its own bags up; for the update every rank receives every rank's
//   bags and gradients and applies the same fused update over the whole batch, so the replicas
//   stay identical (the planner's model counts an all-reduce of the table's gradient instead).
// Only the bags that hold an id of some shard of an owner travel to it and back: where a rank's
// batch has bags that are empty in every shard an owner holds (a one-hot table split by rows, an
// HSTU model's per-token lookups, where each token's id lies in one row shard), the owner looks
// up and returns the others, plus one empty bag whose zero row stands for the left-out bags on
// the requester (placed by gather_rows, row partials added by scatter_add_rows). Owners that hold
// a row piece of a mean-pooled table always take every bag (its bag sizes scale the whole rows).
// Ids are routed on the host (a rank's batch is in host memory before it is staged); rows and
// gradients stay in backend memory, exchanged in place where the communicator takes it (NCCL),
// else through host memory (BackendCollectives).
// Each rank's output rows are the single process's rows bit for bit under table and column
// sharding (the same bag sums in the same order); row sharding adds partial sums, so a bag that
// spans shards differs by rounding. The update of a row sees the same gradients in the same order
// as one process would, except that rowwise Adagrad over a column shard keeps its row's state
// from the shard's columns alone.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "dist/backend_collectives.h"
#include "parity/backend.h"
#include "parity/dist.h"
#include "parity/plan.h"

namespace parity {

struct CheckpointPiece;  // parity/engine.h

class ShardedEmbedding {
 public:
  // The plan's tables (their shards) for DLRM model `m`, on the communicator's rank; plan.gpus
  // must equal the communicator's size. The shards are stored as the plan's tables are (fp32,
  // fp16 or bf16), in the backend's memory.
  ShardedEmbedding(const ModelSpec& m, const Plan& plan, Communicator& comm, Backend& backend);
  // A set of tables and their plans (checked by the caller's apply_plan to cover each table),
  // table t of the set being tables[t] and plans[t]: an HSTU model's sequence features (a bag a
  // token) or its contextual tables (a bag an example).
  ShardedEmbedding(std::vector<TableSpec> tables, std::vector<TablePlan> plans,
                   OptimizerKind optimizer, Communicator& comm, Backend& backend);

  // Every shard this rank holds filled from init(table, row, column) (the value a single
  // process's table would hold there; table: in the set), and every float of its optimizer state
  // set to initial_state (initial_optimizer_state of the optimizer's parameters).
  void fill(const std::function<float(int table, std::int64_t row, int col)>& init,
            float initial_state);

  // in: this rank's bags, every table, in host memory (table-major CSR of global row ids,
  // in.batch bags a table); out: backend memory [in.batch, sum of dims], table t at its column
  // offset (the sum of the dims before it). fp32, or bf16 (a bf16 interaction input): the rows
  // are made in fp32 and rounded once to nearest even, as the backend's own lookup rounds them.
  void forward(const SparseInput& in, AMat out);
  // The gradient of the last forward's outputs, backend memory [batch, sum of dims], fp32 or
  // bf16: every shard's rows updated by the backend's fused backward with `opt` (after the
  // exchange). A 16-bit piece's elements are rounded by `rounding` as the whole table's elements
  // would be (TableLayout::round_*): its table's index in the set, its rows and columns.
  void backward_update(CAMat dout, const OptimizerParams& opt,
                       const StochasticRounding& rounding = {});

  // Whether a plan run by comm's ranks keeps every table whole on one rank (one rank, one shard a
  // table): nothing to shard or exchange, the model keeps its own tables.
  static bool every_table_whole(const Plan& plan, const Communicator& comm);

  // Table t's element (row, col) where this rank holds it, else nullopt (one value copied from
  // backend memory: for tests).
  std::optional<float> weight(int t, std::int64_t row, int col) const;

  // A shard this rank holds, for checkpoints: where it lies, its weights [rows, cols] and its
  // optimizer state (backend memory; cache_state_per_row floats a row, null without state), and
  // whether this rank writes it (a replicated table's first holder does, the others hold replicas).
  struct View {
    int table = 0;
    ShardPlan where;
    bool replicated = false, writer = true;
    DType dtype = DType::f32;  // of the weights
    void* weights = nullptr;
    float* state = nullptr;
  };
  std::vector<View> shards();
  // The shards as checkpoint pieces: embedding.{table}.weight and, with the optimizer's state,
  // optimizer.embedding.{table}.state (a rowwise state over a column shard's own columns).
  std::vector<CheckpointPiece> checkpoint_pieces();
  // Bags of this rank's batches that were not sent to an owner (their rows not exchanged), summed
  // over owners and forwards.
  std::int64_t bags_left_out() const { return bags_left_out_; }
  // Bytes of the shards' weights and of their optimizer state.
  std::size_t weight_bytes() const;
  std::size_t state_bytes() const;
  // Bytes of backend memory held for the exchange: the bags, rows and gradients of the last step.
  std::size_t exchange_bytes() const;

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
    DType dtype = DType::f32;
    std::int64_t weight_offset = 0;  // elements into weights_[buffer_of(dtype)]
    std::int64_t state_offset = 0;   // floats into state_
  };
  // A shard that is exchanged (not replicated), in the global order every rank walks.
  struct Route {
    int table, index;
    ShardPlan where;
    std::int64_t col;  // its first column in its owner's block of pooled rows
    bool add;          // a row shard after its table's first: added to the partial sums
  };

  std::int64_t cols_of(const ShardPlan& s) const { return s.col_end - s.col_begin; }
  TableLayout layout_of(const Shard& s) const;
  // Each route's block of ids for its owner: the bag count, each bag's size, the ids (relative to
  // the shard's first row), from this rank's bags; tables in parallel.
  void route_ids(std::int64_t b);  // into blocks_
  // Table t's routes' blocks (blocks holds one per route).
  void route_table(int t, std::int64_t b, std::vector<std::vector<std::byte>>& blocks) const;
  // host_send_'s blocks (send_bytes[q] to rank q, in rank order) exchanged: every rank's block
  // for this one in host_recv_, rank q's from host_from_[q] to host_from_[q + 1].
  void exchange(std::span<const std::int64_t> send_bytes);
  void forward_f32(const SparseInput& in, Mat out);
  void backward_update_f32(CMat dout, const OptimizerParams& opt,
                           const StochasticRounding& rounding);
  // Per rank q, which of this rank's b bags travel to q (compact_): none of q's routes is of a
  // mean-split table and some bag is empty in all of them; kept_[q] the bags that do (those with
  // an id in some route to q), sent_[q] their count plus the empty bag. From blocks_.
  void choose_bags(std::int64_t b);
  // The owner's side of the same choice, from the blocks received (recv_sizes_): which of rank
  // q's n bags this rank looks up, and whether some are left out (the empty bag then follows).
  bool keep_received(std::size_t q, std::int64_t n, std::vector<char>& keep) const;
  // Every rank learns whether any rank's exchange would reach MPI's 2^31-byte counts, so that all
  // refuse together instead of some waiting for the rest.
  void agree_on_size(std::int64_t out_bytes, std::int64_t in_bytes);
  // A buffer of backend memory of at least `bytes` (grown, never shrunk).
  void* grow(Buffer& b, std::size_t bytes);
  // Backend memory holding 0, 1, ..., n - 1: gather_rows through it copies a strided view.
  const std::int64_t* identity(std::int64_t n);
  // Uploads a host CSR into two buffers of backend memory.
  SparseInput upload(const std::vector<std::int64_t>& offsets, const std::vector<std::int64_t>& ids,
                     std::int64_t batch, int tables, Buffer& d_offsets, Buffer& d_ids);

  std::vector<TableSpec> tables_;
  Communicator& comm_;
  Backend& backend_;
  BackendCollectives coll_;
  OptimizerKind optimizer_;
  std::vector<std::int64_t> out_col_;       // per table
  std::vector<Route> routes_;               // every exchanged shard of every table, in order
  std::vector<std::int64_t> table_routes_;  // per table, its first route; then routes_.size()
  std::vector<std::int64_t> owner_width_;   // per rank: the columns of the routes it owns
  std::vector<Shard> owned_, replicas_;     // shards this rank holds, each in table order
  std::vector<int> mean_split_;             // mean-pooled tables split by rows
  std::vector<char> compactable_;           // per rank: no route of a mean-split table
  // owned_ as the backend sees them: out_col is the column in this rank's block; replicas_ with
  // out_col the model's column (forward) and the column in the gathered gradients (backward).
  std::vector<TableLayout> owned_layouts_, replica_out_layouts_, replica_block_layouts_;
  std::int64_t owned_width_ = 0, replica_width_ = 0;
  // The pieces' weights, a buffer per storage type (TableWeights' order: fp32, fp16, bf16), and
  // their optimizer state (fp32).
  static int buffer_of(DType t) { return t == DType::f32 ? 0 : t == DType::f16 ? 1 : 2; }
  Buffer weights_[3], state_;
  std::int64_t weight_elements_[3] = {}, state_floats_ = 0;

  // The last forward's: local bags, per table, per bag (for mean pooling); every rank's bag count
  // (each owned shard sees each rank's whole batch), the widest; the owned shards' bags of every
  // rank (backend memory), and the replicas' (every rank's, each padded to the widest batch).
  std::int64_t batch_ = 0;
  std::vector<std::int64_t> local_offsets_, local_ids_;
  std::vector<std::int64_t> bags_from_;
  std::int64_t widest_ = 0;
  SparseInput owned_in_, replica_in_;
  Buffer owned_offsets_, owned_ids_, replica_offsets_, replica_ids_, local_offsets_d_, local_ids_d_;
  // The bags this rank sends each owner (choose_bags): per rank whether they are compacted, the
  // kept bags, their count with the empty bag (every bag where not compacted); in backend memory
  // for each compacted owner its kept bags and the empty bag's index 0 (sent_[q] entries, from
  // kept_at_[q]), and each local bag's row in what q returns (b entries, from expand_at_[q]).
  std::vector<char> compact_;
  std::vector<std::vector<std::int64_t>> kept_;
  std::vector<std::int64_t> sent_, kept_at_, expand_at_;
  std::int64_t bags_left_out_ = 0;
  Buffer route_index_;
  // The owner's received blocks, per (owned shard k, rank q) at k * ranks + q: bag sizes, ids.
  std::vector<std::vector<std::int64_t>> recv_sizes_, recv_ids_;
  // Exchange and scratch buffers (backend memory): pooled rows or gradients out and in, the mean
  // bags' inverse sizes, the identity index.
  Buffer send_, recv_, inv_sizes_, index_;
  Buffer rows_f32_;  // the fp32 rows (or gradients) of a bf16 output
  std::int64_t index_rows_ = 0;

  // The ids' exchange on the host: each route's block, the send and receive buffers (kept from
  // step to step: no allocation, no page faults once they have grown).
  std::vector<std::vector<std::byte>> blocks_;
  std::vector<std::byte> host_send_, host_recv_;
  std::vector<std::size_t> host_from_;
  std::vector<std::int64_t> csr_sizes_, csr_offsets_, csr_ids_;  // the bags an upload is built in

  std::function<void(const char*)> mark_;
  void mark(const char* category) {
    if (mark_) mark_(category);
  }
};

}  // namespace parity
