// The Backend interface's defaults for backends that have one queue and no device events (the
// cpu reference): pinned memory is ordinary host memory, and timing marks read the wall clock,
// which is exact there because every op has finished when it returns.
#include <fmt/format.h>

#include <chrono>
#include <new>

#include "parity/backend.h"
#include "parity/error.h"

namespace parity {

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
