// The Backend interface's defaults for backends that have one queue and no device events (the
// cpu reference): pinned memory is ordinary host memory, and timing marks read the wall clock,
// which is exact there because every op has finished when it returns.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "parity/backend.h"
#include "parity/error.h"

namespace parity {

std::int64_t sequence_blocks(std::span<const std::int64_t> offsets,
                             std::vector<std::int64_t>& out) {
  out.clear();
  const std::size_t batch = offsets.empty() ? 0 : offsets.size() - 1;
  auto length = [&](std::size_t b) { return offsets[b + 1] - offsets[b]; };
  // Runs of consecutive sequences of at most a block's tokens together, greedily; a run with
  // fewer than two non-empty sequences stays unpacked.
  std::vector<char> packed(batch, 0);
  std::vector<std::int64_t> runs;
  std::size_t first = 0, count = 0, filled = 0;
  std::int64_t tokens = 0;
  auto close = [&] {
    if (filled >= 2) {
      runs.push_back(static_cast<std::int64_t>(first) << 20 | kPackedBlock |
                     static_cast<std::int64_t>(count));
      std::fill(packed.begin() + static_cast<std::ptrdiff_t>(first),
                packed.begin() + static_cast<std::ptrdiff_t>(first + count), 1);
    }
    count = filled = 0;
    tokens = 0;
  };
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t n = length(b);
    if (n > kSequenceBlockRows) {
      close();
      continue;
    }
    if (tokens + n > kSequenceBlockRows || count + 1 >= static_cast<std::size_t>(kPackedBlock))
      close();
    if (count == 0) first = b;
    ++count;
    filled += n > 0 ? 1 : 0;
    tokens += n;
  }
  close();
  std::int64_t most = 0;  // blocks of the longest sequence
  for (std::size_t b = 0; b < batch; ++b)
    most = std::max(most, (length(b) + kSequenceBlockRows - 1) / kSequenceBlockRows);
  if (most > kPackedBlock)
    throw Error(
        fmt::format("sequence_blocks: a sequence of {} blocks of {} tokens; the block "
                    "list holds at most {}",
                    most, kSequenceBlockRows, kPackedBlock - 1));
  for (std::int64_t t = most - 1; t >= 0; --t)
    for (std::size_t b = 0; b < batch; ++b)
      if (!packed[b] && length(b) > t * kSequenceBlockRows)
        out.push_back(static_cast<std::int64_t>(b) << 20 | t);
  out.insert(out.end(), runs.begin(), runs.end());
  return static_cast<std::int64_t>(runs.size());
}

void Backend::set_product_checks(bool on) {
  if (on)
    throw InputError(fmt::format(
        "checksummed products are not built for the {} backend yet: train with --backend cpu, or "
        "without --product-checks",
        name()));
}

void Backend::inject_product_fault(const ProductFault&) {
  throw Error(fmt::format("checksummed products are not built for the {} backend yet", name()));
}

void Backend::limit_memory(std::size_t bytes) {
  throw Error(fmt::format("limit_memory({:.2f} GB): the {} backend has no device memory to limit",
                          static_cast<double>(bytes) / 1e9, name()));
}

// The defaults work on memory the host can address (the cpu backend's).
namespace {
void check_pattern_buffer(const char* op, const void* p, std::size_t bytes) {
  if (bytes % 4 != 0 || (bytes > 0 && p == nullptr))
    throw Error(
        fmt::format("{}: {} bytes at {} is not a buffer of whole 32-bit words", op, bytes, p));
}
}  // namespace

void Backend::memory_pattern_write(void* p, std::size_t bytes, MemoryPattern pattern,
                                   std::uint64_t seed) {
  check_pattern_buffer("memory_pattern_write", p, bytes);
  auto* w = static_cast<std::uint32_t*>(p);
  const std::uint64_t n = bytes / 4;
  for (std::uint64_t i = 0; i < n; ++i) w[i] = memory_pattern_word(pattern, i, seed);
}

Backend::MemoryCheck Backend::memory_pattern_check(const void* p, std::size_t bytes,
                                                   MemoryPattern pattern, std::uint64_t seed) {
  check_pattern_buffer("memory_pattern_check", p, bytes);
  // volatile: the words are read back from memory, not from what the compiler remembers writing.
  const volatile auto* w = static_cast<const volatile std::uint32_t*>(p);
  const std::uint64_t n = bytes / 4;
  MemoryCheck c;
  for (std::uint64_t i = 0; i < n; ++i)
    if (w[i] != memory_pattern_word(pattern, i, seed) && c.errors++ == 0) c.first_error_word = i;
  return c;
}

void Backend::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void* Backend::allocate_pinned(std::size_t bytes) {
  return bytes == 0 ? nullptr : ::operator new(bytes);
}

void Backend::deallocate_pinned(void* p) noexcept {
  ::operator delete(p);
}

void* Backend::allocate_host_resident(std::size_t bytes) {
  return allocate_pinned(bytes);
}

void Backend::deallocate_host_resident(void* p) noexcept {
  deallocate_pinned(p);
}

void Backend::make_synthetic(const SyntheticBatch&) {
  throw Error(fmt::format(
      "make_synthetic: the {} backend does not make synthetic data on its device (the host makes "
      "it: makes_synthetic_data() is false)",
      name()));
}

// A backend that does not run HSTU layers yet says so at the first one, by op and by name.
namespace {
[[noreturn]] void no_sequence_op(const Backend& b, const char* op) {
  throw Error(fmt::format("{}: the {} backend does not run HSTU layers yet (the cpu backend does)",
                          op, b.name()));
}
}  // namespace

void Backend::embedding_sum_forward(std::span<const TableLayout>, const TableWeights&,
                                    const SparseInput&, AMat) {
  no_sequence_op(*this, "embedding_sum_forward");
}
void Backend::layer_norm_forward(CAMat, const float*, const float*, float, AMat, float*, float*) {
  no_sequence_op(*this, "layer_norm_forward");
}
void Backend::layer_norm_backward(CAMat, const float*, const float*, const float*, CAMat, AMat,
                                  float*, float*) {
  no_sequence_op(*this, "layer_norm_backward");
}
void Backend::norm_mul_forward(CAMat, CAMat, float, AMat, float*, float*) {
  no_sequence_op(*this, "norm_mul_forward");
}
void Backend::norm_mul_backward(CAMat, CAMat, const float*, const float*, CAMat, AMat, AMat) {
  no_sequence_op(*this, "norm_mul_backward");
}
void Backend::silu_forward(CAMat, AMat) {
  no_sequence_op(*this, "silu_forward");
}
void Backend::silu_backward(CAMat, CAMat, AMat) {
  no_sequence_op(*this, "silu_backward");
}
void Backend::add_into(CAMat, AMat) {
  no_sequence_op(*this, "add_into");
}
void Backend::gather_rows(CAMat, const std::int64_t*, AMat) {
  no_sequence_op(*this, "gather_rows");
}
void Backend::scatter_add_rows(CAMat, const std::int64_t*, AMat) {
  no_sequence_op(*this, "scatter_add_rows");
}
void Backend::scale_rows(const float*, float, Mat) {
  no_sequence_op(*this, "scale_rows");
}
void Backend::hstu_attention_forward(const SequenceBatch&, const HstuAttention&, CAMat, CAMat,
                                     CAMat, AMat) {
  no_sequence_op(*this, "hstu_attention_forward");
}
void Backend::hstu_attention_backward(const SequenceBatch&, const HstuAttention&, CAMat, CAMat,
                                      CAMat, CAMat, AMat, AMat, AMat, float*, float*) {
  no_sequence_op(*this, "hstu_attention_backward");
}

void Backend::timing_mark(int i) {
  if (i < 0) throw Error(fmt::format("timing_mark: mark index must be >= 0, got {}", i));
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  if (static_cast<std::size_t>(i) >= marks_.size())
    marks_.resize(static_cast<std::size_t>(i) + 1, -1.0);
  marks_[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::milli>(now).count();
}

double Backend::timing_elapsed_ms(int i, int j) {
  auto at = [&](int k) {
    if (k < 0 || static_cast<std::size_t>(k) >= marks_.size() ||
        marks_[static_cast<std::size_t>(k)] < 0)
      throw Error(fmt::format("timing_elapsed_ms: mark {} was never recorded", k));
    return marks_[static_cast<std::size_t>(k)];
  };
  return at(j) - at(i);
}

}  // namespace parity
