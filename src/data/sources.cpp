// The built-in batch sources (data.h): synthetic data (DLRM examples or HSTU sequences), shard
// datasets and Criteo TSV files behind the one interface that training and evaluation read
// through. Each is a thin adapter: what a batch holds and how the data is checked stay with
// SyntheticData, SyntheticSequences, the shard readers and CriteoReader.
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "parity/data.h"
#include "parity/error.h"

namespace parity {
namespace {

// Rank r's slice of n examples over W ranks: [n r / W, n (r + 1) / W), as first and count.
std::pair<std::int64_t, std::int64_t> slice_bounds(std::int64_t n, int rank, int ranks) {
  const std::int64_t first = n * rank / ranks;
  return {first, n * (rank + 1) / ranks - first};
}

// The synthetic data of one split, made on the fly: a DLRM model's examples (SyntheticData) or an
// HSTU model's sequences (SyntheticSequences).
template <class Data>
class SyntheticSource final : public BatchSource {
  static constexpr bool kSequences = std::is_same_v<Data, SyntheticSequences>;

 public:
  SyntheticSource(const ModelSpec& model, std::uint64_t seed, Split split)
      : data_(model, seed), split_(split) {}
  bool next(std::int64_t max_examples, Batch& out) override {
    data_.make(split_, position_, max_examples, out);
    position_ += max_examples;
    return true;
  }
  void seek(std::int64_t example) override { position_ = example; }
  bool reads_slices() const override { return true; }
  std::int64_t next_slice(std::int64_t batch, int rank, int ranks, Batch& out) override {
    // Example e is a function of e alone: the slice is made where it lies.
    const auto [first, count] = slice_bounds(batch, rank, ranks);
    data_.make(split_, position_ + first, count, out);
    position_ += batch;
    return batch;
  }
  std::string describe() const override {
    return kSequences ? "synthetic sequences with a planted sequential teacher" : "synthetic data";
  }
  // "synthetic-sequences": the kind HSTU runs' checkpoints have recorded since they exist.
  std::string kind() const override { return kSequences ? "synthetic-sequences" : "synthetic"; }
  Generated generated() const override {
    if constexpr (kSequences)
      return {};
    else
      return {&data_, split_};
  }

 private:
  Data data_;
  Split split_;
  std::int64_t position_ = 0;
};

// A split of a shard dataset: ShardReader's (DLRM) or SequenceShardReader's (HSTU).
template <class Reader>
class ShardSource final : public BatchSource {
 public:
  ShardSource(const std::filesystem::path& dir, const ModelSpec& model, Split split, bool wrap)
      : dir_(dir), reader_(dir, model, split), wrap_(wrap) {
    if (reader_.examples() > 0) return;
    if (split == Split::train)
      throw InputError(fmt::format("'{}' holds no training examples", dir.string()));
    throw InputError(
        fmt::format("'{}' holds no held-out (eval) examples; write some with parity data synth "
                    "--eval-examples N",
                    dir.string()));
  }
  bool next(std::int64_t max_examples, Batch& out) override {
    const bool more = reader_.next(max_examples, out, wrap_);
    if (more) position_ += out.size;
    return more;
  }
  void seek(std::int64_t example) override {
    reader_.seek(example, wrap_);
    position_ = example;
  }
  bool reads_slices() const override { return true; }
  std::int64_t next_slice(std::int64_t batch, int rank, int ranks, Batch& out) override {
    // The batch next() would read: `batch` examples, fewer at the end of a pass without wrap.
    const std::int64_t n =
        wrap_ ? batch : std::clamp<std::int64_t>(reader_.examples() - position_, 0, batch);
    if (n == 0) return 0;
    const auto [first, count] = slice_bounds(n, rank, ranks);
    reader_.seek(position_ + first, wrap_);
    if (count > 0 && !reader_.next(count, out, wrap_))
      throw Error(fmt::format("{}: examples {} to {} could not be read", dir_.string(),
                              position_ + first, position_ + first + count));
    if (count == 0) out = Batch{};
    position_ += n;
    reader_.seek(position_, wrap_);
    return n;
  }
  std::int64_t epoch() const override { return reader_.epoch(); }
  std::string describe() const override {
    return fmt::format("shards {} ({} examples)", dir_.string(), reader_.examples());
  }
  std::string kind() const override { return "shards"; }

 private:
  std::filesystem::path dir_;
  Reader reader_;
  bool wrap_;
  std::int64_t position_ = 0;  // examples read or skipped since the start (epochs included)
};

class CriteoSource final : public BatchSource {
 public:
  CriteoSource(std::vector<std::filesystem::path> files, const ModelSpec& model,
               CriteoOptions options)
      : files_(std::move(files)), model_(model), options_(options) {
    seek(0);  // the reader checks the model against the format now, before any step
  }
  bool next(std::int64_t max_examples, Batch& out) override {
    return reader_->next(max_examples, out);
  }
  void seek(std::int64_t example) override {
    reader_ = std::make_unique<CriteoReader>(files_, model_, options_);
    constexpr std::int64_t kChunk = 65536;  // examples read and dropped at a time
    Batch skipped;
    for (std::int64_t left = example; left > 0; left -= skipped.size)
      if (!reader_->next(std::min(left, kChunk), skipped)) break;
  }
  std::string describe() const override { return "Criteo data"; }
  std::string kind() const override { return "criteo"; }
  std::string closing_warning() const override {
    if (reader_->bad_lines() == 0) return {};
    std::string text = fmt::format("{} malformed lines skipped", reader_->bad_lines());
    for (const auto& w : reader_->warnings()) text += fmt::format("\n  {}", w);
    return text;
  }

 private:
  std::vector<std::filesystem::path> files_;
  ModelSpec model_;
  CriteoOptions options_;
  std::unique_ptr<CriteoReader> reader_;
};

}  // namespace

Batch slice_of(const Batch& b, std::int64_t first, std::int64_t count) {
  Batch out;
  out.size = count;
  out.num_dense = b.num_dense;
  out.num_tables = b.num_tables;
  out.dense.assign(b.dense.begin() + static_cast<std::ptrdiff_t>(first * b.num_dense),
                   b.dense.begin() + static_cast<std::ptrdiff_t>((first + count) * b.num_dense));
  out.labels.assign(b.labels.begin() + first, b.labels.begin() + first + count);
  if (!b.teacher_prob.empty())
    out.teacher_prob.assign(b.teacher_prob.begin() + first, b.teacher_prob.begin() + first + count);
  out.offsets.push_back(0);
  for (int t = 0; t < b.num_tables; ++t)
    for (std::int64_t i = first; i < first + count; ++i) {
      const std::int64_t lo = b.offsets[static_cast<std::size_t>(t * b.size + i)];
      const std::int64_t hi = b.offsets[static_cast<std::size_t>(t * b.size + i + 1)];
      out.ids.insert(out.ids.end(), b.ids.begin() + lo, b.ids.begin() + hi);
      out.offsets.push_back(static_cast<std::int64_t>(out.ids.size()));
    }
  return out;
}

std::int64_t BatchSource::next_slice(std::int64_t, int, int, Batch&) {
  throw Error(fmt::format("{}: this source reads whole batches only (reads_slices() is false)",
                          describe()));
}

std::unique_ptr<BatchSource> make_synthetic_source(const ModelSpec& model, std::uint64_t seed,
                                                   Split split) {
  if (model.kind == ModelKind::hstu)
    return std::make_unique<SyntheticSource<SyntheticSequences>>(model, seed, split);
  return std::make_unique<SyntheticSource<SyntheticData>>(model, seed, split);
}

std::unique_ptr<BatchSource> make_shard_source(const std::filesystem::path& dir,
                                               const ModelSpec& model, Split split, bool wrap) {
  if (model.kind == ModelKind::hstu)
    return std::make_unique<ShardSource<SequenceShardReader>>(dir, model, split, wrap);
  return std::make_unique<ShardSource<ShardReader>>(dir, model, split, wrap);
}

std::unique_ptr<BatchSource> make_criteo_source(std::vector<std::filesystem::path> files,
                                                const ModelSpec& model, CriteoOptions options) {
  return std::make_unique<CriteoSource>(std::move(files), model, options);
}

}  // namespace parity
