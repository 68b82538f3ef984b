// The first value of a floating-point buffer that is not finite, read from its bits (shared by
// the checkpoint writers and readers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "parity/dtype.h"

namespace parity {

// The index of the first NaN or infinity among the elements of dtype t in data[0, bytes), or -1
// (-1 for integer types). Formats are read from their bits: an all-ones exponent is not finite
// (fp8 e4m3 has no infinity; its NaN is S.1111.111).
inline std::int64_t first_nonfinite(const void* data, std::size_t bytes, DType t) {
  const auto* b = static_cast<const unsigned char*>(data);
  auto scan = [&](auto word, auto mask, auto all) -> std::int64_t {
    using W = decltype(word);
    const std::size_t n = bytes / sizeof(W);
    for (std::size_t i = 0; i < n; ++i) {
      W w;
      std::memcpy(&w, b + i * sizeof(W), sizeof(W));
      if ((w & mask) == all) return static_cast<std::int64_t>(i);
    }
    return -1;
  };
  switch (t) {
    case DType::f32:
      return scan(std::uint32_t{}, std::uint32_t{0x7f800000}, std::uint32_t{0x7f800000});
    case DType::f16:
      return scan(std::uint16_t{}, std::uint16_t{0x7c00}, std::uint16_t{0x7c00});
    case DType::bf16:
      return scan(std::uint16_t{}, std::uint16_t{0x7f80}, std::uint16_t{0x7f80});
    case DType::fp8_e5m2:
      return scan(std::uint8_t{}, std::uint8_t{0x7c}, std::uint8_t{0x7c});
    case DType::fp8_e4m3:
      return scan(std::uint8_t{}, std::uint8_t{0x7f}, std::uint8_t{0x7f});
    default:
      return -1;
  }
}

}  // namespace parity
