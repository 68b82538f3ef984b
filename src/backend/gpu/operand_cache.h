// bf16 copies of fp32 product operands in memory the engine holds constant for the rest of a step
// (Backend::hold_constant): under bf16 dense math an fp32 activation that several products read
// (the dot interaction's output: the first top layer's forward and its weight gradient) is
// converted once per step instead of once per product. Activations stored in bf16 need no copy;
// weights are not held (they change every step). Host-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/gpu/numerics.h"
#include "backend/gpu/port.h"
#include "backend/gpu/runtime.h"
#include "parity/tensor.h"

namespace parity::gpu {

class OperandCache {
 public:
  // [p, p + bytes) is constant until release().
  void hold(const void* p, std::size_t bytes);
  // Nothing is held any more; the copies keep their buffers (the shapes repeat) but not their
  // contents.
  void release();
  // The memory block [p, p + bytes) is about to be freed: nothing derived from it may outlive it
  // (the address may be handed out again).
  void forget(const void* p, std::size_t bytes);

  // The bf16 copy of m with leading dimension ld when m lies in held memory (converted on first
  // use since the last release()), else nullptr.
  const Bf16* find(CMat m, std::int64_t ld, Stream_t s);
  // The buffer of m's bf16 copy (leading dimension ld) for the op that writes m to write beside
  // it, in stream order: valid from now until release(), and found by find() once m is held.
  Bf16* written_with(CMat m, std::int64_t ld);
  // Device allocations of copies so far.
  std::int64_t allocations() const { return allocations_; }
  // Bytes of the copies held now.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const Copy& c : copies_) n += c.bf16.bytes();
    return n;
  }

 private:
  struct Range {
    std::uintptr_t begin, end;
  };
  struct Key {
    const float* data;
    std::int64_t rows, cols, ld;
    bool operator==(const Key&) const = default;
  };
  struct Copy {
    Key key;
    DeviceBuffer<Bf16> bf16;
    bool valid = false;
  };
  bool is_held(CMat m) const;
  Copy& slot_for(CMat m, std::int64_t ld);

  std::vector<Range> held_;
  std::vector<Copy> copies_;
  std::int64_t allocations_ = 0;
};

}  // namespace parity::gpu
