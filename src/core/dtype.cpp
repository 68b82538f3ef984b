#include "parity/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace parity {
namespace {

struct DTypeInfo {
  DType type;
  std::size_t size;
  std::string_view name;
  std::string_view safetensors;
};

constexpr std::array<DTypeInfo, 7> kInfo{{
    {DType::f32, 4, "fp32", "F32"},
    {DType::f16, 2, "fp16", "F16"},
    {DType::bf16, 2, "bf16", "BF16"},
    {DType::fp8_e4m3, 1, "fp8_e4m3", "F8_E4M3"},
    {DType::fp8_e5m2, 1, "fp8_e5m2", "F8_E5M2"},
    {DType::i32, 4, "int32", "I32"},
    {DType::i64, 8, "int64", "I64"},
}};

const DTypeInfo& info(DType t) { return kInfo[static_cast<std::size_t>(t)]; }

}  // namespace

std::size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_safetensors_name(DType t) { return info(t).safetensors; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.type;
  return std::nullopt;
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.safetensors == name) return i.type;
  return std::nullopt;
}

float round_to_dtype(float v, DType t) {
  switch (t) {
    case DType::f32: return v;
    case DType::f16: return static_cast<float>(static_cast<_Float16>(v));  // IEEE binary16, RNE
    case DType::bf16: {
      if (std::isnan(v)) return v;
      std::uint32_t u = std::bit_cast<std::uint32_t>(v);
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even on the top 16 bits
      return std::bit_cast<float>(u & 0xffff0000u);
    }
    default: throw std::invalid_argument("round_to_dtype: not a floating-point storage type");
  }
}

std::uint16_t bf16_bits(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

}  // namespace parity
