#include "backend/gpu/scratch.h"

namespace parity::gpu {

namespace {
constexpr std::array<const char*, static_cast<int>(ScratchSlot::count)> kSlotNames = {
    "bf16 operand A",
    "bf16 operand B",
    "masked gradient",
    "masked gradient (bf16)",
    "cross du",
    "cross du (bf16)",
    "bf16 bias",
    "column-sum partials",
    "product over a padded n",
    "checked product (fp32)",
    "product check sums",
    "held checked product (row sums)",
    "held product check sums",
    "next product check sums"};
// Every slot named: a slot added without one would format a null name into its out-of-memory error.
constexpr bool all_named() {
  for (const char* n : kSlotNames)
    if (n == nullptr) return false;
  return true;
}
static_assert(all_named(), "every ScratchSlot needs a name in kSlotNames");
}  // namespace

void* Scratch::get(ScratchSlot slot, std::size_t bytes, Stream_t stream) {
  auto& b = bufs_[static_cast<int>(slot)];
  if (b.bytes() < bytes) {
    check(stream_synchronize(stream), "GpuBackend scratch growth");
    const std::size_t want = (bytes + bytes / 4 + 255) / 256 * 256;
    b = DeviceBuffer<std::byte>();  // the old buffer goes before the new one is made
    b = DeviceBuffer<std::byte>(want, kSlotNames[static_cast<int>(slot)]);
    ++growths_;
  }
  return b.data();
}

}  // namespace parity::gpu
