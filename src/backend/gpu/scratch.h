// The GPU backend's own device scratch, one buffer per purpose, that only grows: after the first
// step of a run (or Model::prepare's rehearsal) nothing is allocated. Host-only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "backend/gpu/port.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

// Scratch purposes. An op may hold several slots at once, never the same slot twice.
// checked: a checked product's fp32 output before its bf16 rounding (or, in one kernel, its row
// sums); sums: the check's weight sums; held_checked, held_sums: the same for a cross layer's u,
// whose check waits for the layer's combine (GpuBackend::cross_forward); next_sums: the weights'
// sums of the product the last cross layer's output feeds (cross_feeds_product).
enum class ScratchSlot : int {
  a16,
  b16,
  dz,
  dz16,
  du,
  du16,
  bias16,
  reduce,
  dw,
  checked,
  sums,
  held_checked,
  held_sums,
  next_sums,
  count
};

class Scratch {
 public:
  // The slot's buffer, at least `bytes` long. Growing waits for `stream` first (kernels already
  // enqueued may still read the old buffer) and allocates a quarter more than asked, so that a
  // slowly growing shape does not reallocate every call.
  void* get(ScratchSlot slot, std::size_t bytes, Stream_t stream);
  template <class T>
  T* get_as(ScratchSlot slot, std::int64_t elements, Stream_t stream) {
    const auto n = static_cast<std::size_t>(elements > 1 ? elements : 1);
    return static_cast<T*>(get(slot, n * sizeof(T), stream));
  }
  // (Re)allocations so far.
  std::int64_t growths() const { return growths_; }
  // Bytes held by a slot now.
  std::size_t bytes(ScratchSlot slot) const { return bufs_[static_cast<int>(slot)].bytes(); }

 private:
  std::array<DeviceBuffer<std::byte>, static_cast<int>(ScratchSlot::count)> bufs_;
  std::int64_t growths_ = 0;
};

}  // namespace parity::gpu
