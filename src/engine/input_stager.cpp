#include "engine/input_stager.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

#include "parity/error.h"
#include "parity/synthetic_example.h"

namespace parity::engine {
namespace {

// memcpy in parallel chunks: staging a large batch (the MLPerf model's ids are 112 MB) must take
// a small part of a step.
void parallel_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  if (bytes <= kChunk) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  const auto chunks = static_cast<std::int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t first = static_cast<std::size_t>(c) * kChunk;
    std::memcpy(static_cast<char*>(dst) + first, static_cast<const char*>(src) + first,
                std::min(kChunk, bytes - first));
  }
}

std::size_t align8(std::size_t x) {
  return (x + 7) / 8 * 8;
}

// Pinned staging layout of a batch: dense | labels | offsets | ids, 8-byte aligned.
struct PinnedLayout {
  std::size_t labels, offsets, ids, total;
};
PinnedLayout pinned_layout(std::size_t dense_floats, std::size_t labels, std::size_t offsets,
                           std::size_t ids) {
  PinnedLayout l{};
  l.labels = align8(dense_floats * 4);
  l.offsets = l.labels + align8(labels * 4);
  l.ids = l.offsets + offsets * 8;
  l.total = l.ids + ids * 8;
  return l;
}

}  // namespace

InputStager::InputStager(Backend& backend, const ModelSpec& spec, std::int64_t max_batch)
    : backend_(backend), spec_(spec), max_batch_(max_batch) {
  const std::int64_t B = max_batch;
  for (InputSlot& slot : slots_) {
    slot.dense = Buffer(backend_, static_cast<std::size_t>(B * spec.dense_features) * 4);
    slot.labels = Buffer(backend_, static_cast<std::size_t>(B) * 4);
    slot.ids_capacity = std::max<std::int64_t>(1, B * spec.lookups_per_example());
    slot.ids = Buffer(backend_, static_cast<std::size_t>(slot.ids_capacity) * 8);
    slot.offsets = Buffer(backend_, static_cast<std::size_t>(B * spec.num_tables() + 1) * 8);
  }
}

InputStager::~InputStager() {
  for (InputSlot& slot : slots_) backend_.deallocate_pinned(slot.pinned);
}

std::size_t InputStager::allocated_bytes() const {
  std::size_t total = 0;
  for (const InputSlot& slot : slots_)
    for (const Buffer* b : {&slot.dense, &slot.labels, &slot.ids, &slot.offsets})
      total += b->bytes();
  return total + generator_block_.bytes() + synthetic_workspace_.bytes();
}

// A batch that does not fit the model is bad data (a user's batch source may make one).
void InputStager::check_batch(const Batch& batch) const {
  const std::int64_t n = batch.size;
  if (n <= 0 || n > max_batch_)
    throw InputError(
        fmt::format("Model: batch of {} examples; this model was built for 1..{}", n, max_batch_));
  if (batch.num_dense != spec_.dense_features || batch.num_tables != spec_.num_tables())
    throw InputError(fmt::format(
        "Model: batch has {} dense features and {} tables; model '{}' expects {} and {}",
        batch.num_dense, batch.num_tables, spec_.name, spec_.dense_features, spec_.num_tables()));
  const std::size_t T = static_cast<std::size_t>(batch.num_tables);
  if (batch.offsets.size() != T * static_cast<std::size_t>(n) + 1 ||
      batch.dense.size() != static_cast<std::size_t>(n * batch.num_dense) ||
      batch.ids.size() != static_cast<std::size_t>(batch.offsets.back()) ||
      (!batch.labels.empty() && batch.labels.size() != static_cast<std::size_t>(n)))
    throw InputError(
        "Model: malformed batch (dense, labels, offsets or ids have the wrong length)");
}

void InputStager::stage(const Batch& batch, std::int64_t global_examples) {
  check_batch(batch);
  if (staged_count_ >= kSlots)
    throw Error(fmt::format(
        "Model::stage: {} batches are staged already; train one (train_staged) first", kSlots));
  const int index = static_cast<int>(staged_total_ % kSlots);
  InputSlot& slot = slots_[index];
  slot.global_examples = global_examples;
  const std::int64_t n = batch.size;
  const auto nids = static_cast<std::int64_t>(batch.ids.size());
  const std::size_t dense_bytes = batch.dense.size() * 4, label_bytes = batch.labels.size() * 4;
  const std::size_t offset_bytes = batch.offsets.size() * 8;
  const std::size_t id_bytes = static_cast<std::size_t>(nids) * 8;
  const PinnedLayout at = pinned_layout(batch.dense.size(), batch.labels.size(),
                                        batch.offsets.size(), static_cast<std::size_t>(nids));

  // Backends that copy in the background read from pinned staging memory; the others (cpu) copy
  // at once, straight from the batch.
  const bool staging = backend_.copies_in_background();
  backend_.begin_input(index);  // the slot's last copies have read its pinned memory
  // First use (unless allocate_pinned ran), or ids beyond the capacity.
  if (staging) ensure_pinned(slot, at.total, nids);
  if (nids > slot.ids_capacity) {  // variable pooling above the spec's sizes: grow once
    const std::int64_t capacity = nids + nids / 4;
    // May throw: the slot stays as it was.
    Buffer grown(backend_, static_cast<std::size_t>(capacity) * 8);
    slot.ids = std::move(grown);
    slot.ids_capacity = capacity;
  }
  struct Part {
    void* dst;
    const void* src;
    std::size_t bytes, staged_at;
  };
  Part parts[] = {{slot.dense.get(), batch.dense.data(), dense_bytes, 0},
                  {slot.labels.get(), batch.labels.data(), label_bytes, at.labels},
                  {slot.offsets.get(), batch.offsets.data(), offset_bytes, at.offsets},
                  {slot.ids.get(), batch.ids.data(), id_bytes, at.ids}};
  try {
    for (Part& p : parts) {
      if (p.bytes == 0) continue;
      if (staging) {
        char* pinned = static_cast<char*>(slot.pinned) + p.staged_at;
        parallel_copy(pinned, p.src, p.bytes);
        p.src = pinned;
      }
      backend_.input_copy(p.dst, p.src, p.bytes);
    }
  } catch (...) {
    // Copies already enqueued are still waited for before the slot is reused.
    backend_.end_input(index);
    throw;
  }
  backend_.end_input(index);
  slot.has_labels = label_bytes > 0;
  slot.sparse = SparseInput{n, batch.num_tables, slot.ids.as<std::int64_t>(),
                            slot.offsets.as<std::int64_t>(), nids};
  slot.host_sparse = slot.sparse;
  if (staging) {
    const auto* pinned = static_cast<const char*>(slot.pinned);
    slot.host_sparse.ids = reinterpret_cast<const std::int64_t*>(pinned + at.ids);
    slot.host_sparse.offsets = reinterpret_cast<const std::int64_t*>(pinned + at.offsets);
  } else if (!backend_.memory_is_host()) {
    slot.host_sparse.ids = slot.host_sparse.offsets = nullptr;
  }
  ++staged_total_;
  ++staged_count_;
}

void InputStager::stage_synthetic(const SyntheticData& data, Split split, std::int64_t first,
                                  std::int64_t count) {
  if (!backend_.makes_synthetic_data())
    throw Error(
        fmt::format("Model::stage_synthetic: the {} backend does not make synthetic data; "
                    "stage batches the host made",
                    backend_.name()));
  if (count <= 0 || count > max_batch_)
    throw InputError(fmt::format("Model: batch of {} examples; this model was built for 1..{}",
                                 count, max_batch_));
  if (first < 0) throw Error(fmt::format("Model::stage_synthetic: first example {} < 0", first));
  const std::span<const std::byte> block = data.generator();
  const auto* gen = reinterpret_cast<const synth::Generator*>(block.data());
  if (gen->num_dense != spec_.dense_features || gen->num_tables != spec_.num_tables() ||
      data.ids_per_example() != spec_.lookups_per_example())
    throw InputError(fmt::format(
        "Model: the synthetic data has {} dense features, {} tables and {} ids an example; model "
        "'{}' expects {}, {} and {}",
        gen->num_dense, gen->num_tables, data.ids_per_example(), spec_.name, spec_.dense_features,
        spec_.num_tables(), spec_.lookups_per_example()));
  if (staged_count_ >= kSlots)
    throw Error(fmt::format(
        "Model::stage: {} batches are staged already; train one (train_staged) first", kSlots));
  if (!generator_ || generator_->generator().data() != block.data()) {
    // Set-up, once per generator. The kernels of an earlier one may still read the old block, and
    // the copy runs on the compute queue while the kernels run on the copy queue: drain before
    // and after. The kept SyntheticData keeps its block (and so its address) alive.
    if (generator_) backend_.synchronize();
    if (generator_block_.bytes() < block.size()) generator_block_ = Buffer(backend_, block.size());
    backend_.copy_to_device(generator_block_.get(), block.data(), block.size());
    if (synthetic_workspace_.get() == nullptr)
      synthetic_workspace_ =
          Buffer(backend_, std::max<std::size_t>(
                               8, SyntheticBatch::workspace_bytes(spec_.num_tables(), max_batch_)));
    backend_.synchronize();
    generator_ = data;
  }
  const int index = static_cast<int>(staged_total_ % kSlots);
  InputSlot& slot = slots_[index];
  slot.global_examples = 0;  // one process's batch (a sharded model routes host batches)
  const std::int64_t nids = count * data.ids_per_example();
  SyntheticBatch b;
  b.generator = generator_block_.get();
  b.num_dense = spec_.dense_features;
  b.num_tables = spec_.num_tables();
  b.ids_per_example = data.ids_per_example();
  b.split = split == Split::train ? 0 : 1;
  b.first = first;
  b.count = count;
  b.dense = slot.dense.as<float>();
  b.labels = slot.labels.as<float>();
  b.ids = slot.ids.as<std::int64_t>();
  b.offsets = slot.offsets.as<std::int64_t>();
  b.workspace = synthetic_workspace_.get();
  backend_.begin_input(index);
  try {
    backend_.make_synthetic(b);
  } catch (...) {
    backend_.end_input(index);
    throw;
  }
  backend_.end_input(index);
  slot.has_labels = true;
  slot.sparse = SparseInput{count, spec_.num_tables(), slot.ids.as<std::int64_t>(),
                            slot.offsets.as<std::int64_t>(), nids};
  slot.host_sparse = SparseInput{count, spec_.num_tables(), nullptr, nullptr, slot.sparse.nnz};
  ++staged_total_;
  ++staged_count_;
}

void InputStager::ensure_pinned(InputSlot& slot, std::size_t bytes, std::int64_t nids) {
  if (slot.pinned != nullptr && bytes <= slot.pinned_bytes) return;
  backend_.deallocate_pinned(slot.pinned);
  slot.pinned = nullptr;
  slot.pinned_bytes = 0;
  const auto B = static_cast<std::size_t>(max_batch_);
  const std::size_t full =
      pinned_layout(B * static_cast<std::size_t>(spec_.dense_features), B,
                    B * static_cast<std::size_t>(spec_.num_tables()) + 1,
                    static_cast<std::size_t>(std::max(slot.ids_capacity, nids)))
          .total;
  const std::size_t want = std::max(bytes, full);
  slot.pinned = backend_.allocate_pinned(want);
  slot.pinned_bytes = want;
}

void InputStager::allocate_pinned() {
  if (!backend_.copies_in_background()) return;
  for (InputSlot& slot : slots_)
    if (slot.pinned == nullptr) ensure_pinned(slot, 0, 0);  // a used slot was sized when staged
}

int InputStager::take() {
  const int index = oldest();
  --staged_count_;
  return index;
}

InputStager::InUse::InUse(InputStager& stager, int index) : stager_(stager), index_(index) {
  stager_.backend_.use_input(index_);
}

InputStager::InUse::~InUse() {
  if (released_) return;
  try {
    stager_.backend_.release_input(index_);  // unwinding: later copies into the slot still wait
  } catch (...) {
  }
}

void InputStager::InUse::release() {
  released_ = true;
  stager_.backend_.release_input(index_);
}

}  // namespace parity::engine
