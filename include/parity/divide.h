// Exact unsigned 32-bit division by a divisor that is fixed for a whole kernel launch, as a
// multiply-high, a subtract, an add and two shifts (Granlund and Montgomery, "Division by
// invariant integers using multiplication", PLDI 1994, figure 4.1). A general 32-bit division is
// about twenty instructions on a GPU; a kernel that divides per element by a run-time value (the
// embedding backward finds each occurrence's table as bag / batch) pays them on its hot path.
#pragma once

#include <cstdint>

#include "parity/host_device.h"

namespace parity {

struct DivideBy {
  std::uint32_t multiplier = 1;
  int shift1 = 0;
  int shift2 = 0;

  // d >= 1. With l = ceil(log2 d): multiplier = floor(2^32 (2^l - d) / d) + 1, shifts min(l, 1)
  // and max(l - 1, 0). d = 1 gives multiplier 1 and no shifts (the high word of n is 0).
  static DivideBy of(std::uint32_t d) {
    int l = 0;
    while ((std::uint64_t{1} << l) < d) ++l;
    DivideBy q;
    q.multiplier = static_cast<std::uint32_t>(
        ((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d)) / d + 1);
    q.shift1 = l < 1 ? l : 1;
    q.shift2 = l > 1 ? l - 1 : 0;
    return q;
  }

  PARITY_HD std::uint32_t operator()(std::uint32_t n) const {
    const auto t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(multiplier) * n) >> 32);
    return (t + ((n - t) >> shift1)) >> shift2;
  }
};

}  // namespace parity
