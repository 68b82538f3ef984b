// Training data: batches in the layout the backends want (dense [B, F] row-major,
// labels [B], embedding ids in one table-major CSR, see SparseInput), a seeded
// synthetic generator whose labels come from a planted teacher model, a Criteo TSV
// reader, binary shard datasets, and the batch-source interface training reads them all
// through.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "parity/backend.h"
#include "parity/spec.h"
#include "parity/synthetic_example.h"

namespace parity {

namespace shard_io {
class SplitCursor;
}

// One step's examples, on the host.
struct Batch {
  std::int64_t size = 0;
  int num_dense = 0;
  int num_tables = 0;
  std::vector<float> dense;           // [size, num_dense]
  std::vector<float> labels;          // [size], 0 or 1
  std::vector<std::int64_t> ids;      // CSR ids, table-major (see SparseInput)
  std::vector<std::int64_t> offsets;  // [num_tables*size + 1]
  std::vector<float> teacher_prob;    // [size] the planted teacher's P(label=1); empty on real data

  // HSTU models (ModelKind::hstu): per example a history of events, then `targets` target items
  // to rank on `tasks` tasks. The tables above (num_tables, ids, offsets) are its contextual
  // features; there are no dense features. labels and teacher_prob are [size, targets, tasks].
  int targets = 0;
  int tasks = 0;
  int features = 0;                           // sequence features per event, features[0] the item
  std::vector<std::int64_t> history_offsets;  // [size + 1]: example b's events are
                                              // [history_offsets[b], history_offsets[b + 1])
  std::vector<std::int64_t> event_ids;        // [features, events]: feature f of event e at
                                              // f * events + e (events = history_offsets[size])
  std::vector<std::int64_t> event_times;      // [events] seconds, non-decreasing per example
  std::vector<std::int64_t> target_ids;       // [size, targets] items
  std::vector<std::int64_t> target_times;     // [size, targets], from the history's last on
  // Synthetic data only: the teacher's P(label = 1) with every history event weighted alike, the
  // best an order-blind copy of the teacher does ([size, targets, tasks]).
  std::vector<float> unordered_prob;
  std::int64_t events() const { return history_offsets.empty() ? 0 : history_offsets.back(); }
};

// Examples [first, first + count) of a DLRM batch: their dense features, labels, teacher and bags.
Batch slice_of(const Batch& b, std::int64_t first, std::int64_t count);

enum class Split : std::uint8_t { train, eval };

// Synthetic data with a planted teacher.
//
// Every value is a pure function of (seed, split, example index), so batch k is
// the same whichever order batches are made in, on whichever thread: training
// resumes exactly and generation runs in parallel.
//
// Ids: per table, pooling_size ids per bag, drawn uniform or Zipf(alpha) over the
// table's rows (Zipf ranks are scattered over the rows by a fixed permutation so that
// hot rows are not adjacent). Dense features: standard normal.
// Teacher: logit = bias + Σ_k a_k·dense_k + Σ_t s_t·pool_t(h_t(id)) + pairwise terms,
// where h_t(id) is a hash-derived N(0,1) value per (table, row): no memory per row,
// so tables of any size work. label ~ Bernoulli(sigmoid(logit)). The teacher's own
// probability is returned with the batch: its AUC is the ceiling a student can reach.
class SyntheticData {
 public:
  SyntheticData(const ModelSpec& model, std::uint64_t seed);
  // Fills out with examples [first, first + count) of the split.
  void make(Split split, std::int64_t first, std::int64_t count, Batch& out) const;
  // Batch number `index` of size batch_size: examples [index*batch_size, (index+1)*batch_size).
  void batch(Split split, std::int64_t index, std::int64_t batch_size, Batch& out) const {
    make(split, index * batch_size, batch_size, out);
  }
  // The generator as one flat block (synth::Generator and its arrays, no pointers): copied as it
  // is to a device, Backend::make_synthetic makes the same examples there, bit for bit.
  std::span<const std::byte> generator() const;
  // Embedding ids per example (the sum of the tables' pooling sizes).
  std::int64_t ids_per_example() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Synthetic HSTU data (ModelKind::hstu) with a planted sequential teacher.
//
// Like SyntheticData, every value is a pure function of (seed, split, example index). History
// lengths follow the model's length distribution; items, actions and the other per-event features
// and the contextual features are drawn from their tables' distributions; timestamps advance by
// log-uniform gaps from a second to a month. The teacher: each item row r has a latent vector
// z(r) in R^K and each action row a weight w(a) (hash-derived normals, no memory per row); the
// user's state is the recency-weighted sum u = Σ_j γ^(L-1-j) (1 + β w(a_j)) z(item_j) over the
// history (most recent event weight 1), normalised to unit variance per component; target item i
// gets, per task k, logit_k = bias_k + c_int <u ⊙ m_k, z(i)> / sqrt(K) + c_item g(i) + c_ctx
// (contexts' pooled values), and labels ~ Bernoulli(sigmoid(logit)). Order and recency matter: the
// same events in another order give another u. unordered_prob is the teacher with every event
// weighted alike (γ = 1), the best an order-blind copy of it does.
//
// With shuffled_history, each history is presented in a random order (the timestamps stay sorted
// by position), while the labels still follow the true order: data whose order carries nothing,
// for the comparison that a sequential model must win.
class SyntheticSequences {
 public:
  SyntheticSequences(const ModelSpec& model, std::uint64_t seed, bool shuffled_history = false);
  // Fills out with examples [first, first + count) of the split.
  void make(Split split, std::int64_t first, std::int64_t count, Batch& out) const;
  void batch(Split split, std::int64_t index, std::int64_t batch_size, Batch& out) const {
    make(split, index * batch_size, batch_size, out);
  }

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Samples integers in [0, n) with P(k) proportional to 1/(k+1)^alpha, in O(1) per
// draw for any n (rejection-inversion, Hörmann and Derflinger 1996). The sampling is
// synth::Zipf (parity/synthetic_example.h), which a device runs too.
class ZipfSampler {
 public:
  ZipfSampler(std::int64_t n, double alpha);
  // u1, u2 uniform in [0, 1); returns the rank (0 is the most frequent).
  std::int64_t sample(double u1, double u2) const { return z_.sample(u1, u2); }
  std::int64_t n() const { return z_.n; }
  const synth::Zipf& params() const { return z_; }

 private:
  synth::Zipf z_;
};

// Criteo TSV: label \t 13 integer features \t 26 hexadecimal categorical features,
// any of the features may be empty. Integer features become log(1 + max(x, 0));
// missing ones 0. A categorical value v of table t becomes row hash(v) mod rows_t; a
// missing one becomes row 0. Models read with it must have 13 dense features and 26 tables
// of pooling size 1 (checked at construction).
enum class OnBadLine : std::uint8_t { skip, stop };

struct CriteoOptions {
  OnBadLine on_bad_line = OnBadLine::stop;
  std::int64_t max_reported = 10;  // skip mode: bad lines described in warnings(), the rest counted
};

class CriteoReader {
 public:
  CriteoReader(std::vector<std::filesystem::path> files, const ModelSpec& model,
               CriteoOptions options = {});
  // Reads up to batch_size examples into out. Returns false when no example was left.
  // In stop mode a malformed line throws InputError "FILE:LINE: <what>, expected <what>".
  bool next(std::int64_t batch_size, Batch& out);
  std::int64_t lines_read() const { return lines_read_; }
  std::int64_t bad_lines() const { return bad_lines_; }
  // Descriptions of the first max_reported bad lines ("FILE:LINE: ...").
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  std::vector<std::filesystem::path> files_;
  std::vector<std::int64_t> table_rows_;
  CriteoOptions options_;
  std::size_t file_index_ = 0;
  std::ifstream in_;
  std::int64_t line_no_ = 0;
  std::int64_t lines_read_ = 0;
  std::int64_t bad_lines_ = 0;
  std::vector<std::string> warnings_;
  bool open_next();
};

// Binary shards (src/data/shards.cpp has the file format): a dataset prepared once, from the
// synthetic generator or from Criteo TSV, and read back at memory speed. A dataset is a
// directory with meta.json (model shape, splits, files) and part files train-NNNNN.bin and
// eval-NNNNN.bin.
bool is_shard_dataset(const std::filesystem::path& path);

class ShardWriter {
 public:
  // Creates dir (which must not hold a dataset yet). source describes where the data came from.
  ShardWriter(std::filesystem::path dir, const ModelSpec& model, std::string source,
              std::int64_t examples_per_file = 262144);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  // Appends a batch's examples to a split; full part files are written as they fill.
  void write(Split split, const Batch& batch);
  // Writes the last part files and meta.json (the dataset exists only after this).
  void finish();

 private:
  struct Pending;
  void flush(Split split);
  std::filesystem::path dir_;
  ModelSpec model_;
  std::string source_;
  std::int64_t per_file_;
  int id_bytes_ = 4;
  std::unique_ptr<Pending> pending_[2];
  std::vector<std::pair<std::string, std::int64_t>> files_[2];
};

class ShardReader {
 public:
  // Opens a split of a dataset and checks it against the model (InputError naming the file and
  // field otherwise).
  ShardReader(const std::filesystem::path& dir, const ModelSpec& model, Split split);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  // Reads the next batch_size examples (fewer at the end of the data). With wrap, reading goes
  // on from the start (a new epoch) instead; without it, false once nothing is left.
  bool next(std::int64_t batch_size, Batch& out, bool wrap = false);
  // Continues from example `example`: resuming a run. With wrap, epochs repeat the split (the
  // position is taken modulo its size, the epoch counted); without, a position at or past the
  // end leaves nothing to read.
  void seek(std::int64_t example, bool wrap = true);
  std::int64_t examples() const;
  std::int64_t epoch() const;
  const std::string& source() const { return source_; }

 private:
  struct File;
  void open_file(File& f, std::int64_t expected_examples, const ModelSpec& model);
  std::filesystem::path dir_;
  std::vector<std::int64_t> rows_;
  std::vector<std::unique_ptr<File>> files_;
  std::unique_ptr<shard_io::SplitCursor> cursor_;
  std::string source_;
};

// HSTU models' shard datasets (src/data/sequence_shards.cpp has the file format): the same
// directory layout as above (meta.json of format parity-sequence-shards-1, part files per split),
// each part file holding examples' histories, targets, labels and contextual features, so that
// training reads them back as SyntheticSequences makes them.
class SequenceShardWriter {
 public:
  // Creates dir (which must not hold a dataset yet). source describes where the data came from.
  SequenceShardWriter(std::filesystem::path dir, const ModelSpec& model, std::string source,
                      std::int64_t examples_per_file = 65536);
  ~SequenceShardWriter();
  SequenceShardWriter(const SequenceShardWriter&) = delete;
  SequenceShardWriter& operator=(const SequenceShardWriter&) = delete;
  // Appends a batch's examples to a split (checked against the model as the reader checks them);
  // full part files are written as they fill.
  void write(Split split, const Batch& batch);
  // Writes the last part files and meta.json (the dataset exists only after this).
  void finish();

 private:
  struct Pending;
  void flush(Split split);
  std::filesystem::path dir_;
  ModelSpec model_;
  std::string source_;
  std::int64_t per_file_;
  int id_bytes_ = 4;
  std::unique_ptr<Pending> pending_[2];
  std::vector<std::pair<std::string, std::int64_t>> files_[2];
};

class SequenceShardReader {
 public:
  // Opens a split of a dataset and checks it against the model (InputError naming the file and
  // field otherwise).
  SequenceShardReader(const std::filesystem::path& dir, const ModelSpec& model, Split split);
  ~SequenceShardReader();
  SequenceShardReader(const SequenceShardReader&) = delete;
  SequenceShardReader& operator=(const SequenceShardReader&) = delete;
  // As ShardReader's.
  bool next(std::int64_t batch_size, Batch& out, bool wrap = false);
  void seek(std::int64_t example, bool wrap = true);
  std::int64_t examples() const;
  std::int64_t epoch() const;
  const std::string& source() const { return source_; }

 private:
  struct File;
  ModelSpec model_;
  std::vector<std::unique_ptr<File>> files_;
  std::unique_ptr<shard_io::SplitCursor> cursor_;
  std::string source_;
};

// ---- batch sources: where training and evaluation read their batches ----
// One interface for every kind of data, so that the training loop does not branch on it. train()
// reads its training source from a background thread, one batch ahead, and its evaluation source
// between steps; each source is used by one thread at a time. Built-in sources exist for
// synthetic data, shard datasets and Criteo TSV files (make_*_source below); a library user can
// give train() sources of their own (TrainConfig::train_data, eval_data).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills out with the next examples, at most max_examples of them (fewer only where the data
  // ends); false once no example is left.
  virtual bool next(std::int64_t max_examples, Batch& out) = 0;
  // Continues after the first `example` examples of the data. train() calls seek(k * batch) on
  // its training source before reading (k: the step it resumes from, 0 in a fresh run), and
  // seek(0) on its evaluation source before every evaluation. For a resumed run to be
  // bit-identical to an uninterrupted one, the batches after seek(k * batch) must be the ones an
  // uninterrupted run reads after its first k.
  virtual void seek(std::int64_t example) = 0;
  // Completed passes over the data, for sources that repeat it (0 otherwise): train() warns once
  // when its training data starts a second pass.
  virtual std::int64_t epoch() const { return 0; }
  // What the data is, for the start of training ("synthetic data").
  virtual std::string describe() const = 0;
  // A short name of the kind of data, recorded in checkpoints ("synthetic", "shards", "criteo").
  virtual std::string kind() const { return "custom"; }
  // A warning to give once training ends (the malformed lines a reader skipped), or empty.
  virtual std::string closing_warning() const { return {}; }
  // The generator behind a synthetic source and its split (data null for every other source): a
  // backend that makes synthetic data (Backend::makes_synthetic_data) makes the same batches on
  // its device, and train() has it do so (batch k is examples [k * batch, (k + 1) * batch)).
  struct Generated {
    const SyntheticData* data = nullptr;
    Split split = Split::train;
  };
  virtual Generated generated() const { return {}; }
  // A rank's slice of the next batch, read without the rest (a run over several ranks, each on
  // its slice of every global batch): moves past the next `batch` examples (fewer where the data
  // ends) as next(batch) would, and fills out with examples [n r / W, n (r + 1) / W) of those n,
  // r = rank of W = ranks: what slicing next(batch)'s batch gives, bit for bit. Returns n, 0
  // once no example is left. Only where reads_slices() (the source skips without reading).
  virtual bool reads_slices() const { return false; }
  virtual std::int64_t next_slice(std::int64_t batch, int rank, int ranks, Batch& out);
};

// The synthetic planted-teacher data of one split (SyntheticData, or SyntheticSequences for an
// HSTU model), made on the fly: no end; after seek(e) the next call of next(n) makes examples
// [e, e + n), so batch k is a pure function of k.
std::unique_ptr<BatchSource> make_synthetic_source(const ModelSpec& model, std::uint64_t seed,
                                                   Split split);
// A split of a shard dataset (ShardReader, or SequenceShardReader for an HSTU model). With wrap,
// epochs follow each other (seek takes the position modulo the split's size); without, one pass.
// InputError when the split is empty.
std::unique_ptr<BatchSource> make_shard_source(const std::filesystem::path& dir,
                                               const ModelSpec& model, Split split, bool wrap);
// Criteo TSV files read in order, one pass; seek(e) reads them again from the start and skips e
// examples (the malformed lines among them handled as options says). The closing warning counts
// the lines skipped as malformed and describes the first options.max_reported of them.
std::unique_ptr<BatchSource> make_criteo_source(std::vector<std::filesystem::path> files,
                                                const ModelSpec& model, CriteoOptions options);

}  // namespace parity
