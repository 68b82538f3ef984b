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

const DTypeInfo& info(DType t) {
  return kInfo[static_cast<std::size_t>(t)];
}

}  // namespace

std::size_t dtype_size(DType t) {
  return info(t).size;
}
std::string_view dtype_name(DType t) {
  return info(t).name;
}
std::string_view dtype_safetensors_name(DType t) {
  return info(t).safetensors;
}

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
    case DType::f32:
      return v;
    case DType::f16:
      return std::isnan(v) ? v : half_to_float(half_bits(v));
    case DType::bf16:
      return std::isnan(v) ? v : bf16_to_float(bf16_bits(v));
    default:
      throw std::invalid_argument("round_to_dtype: not a floating-point storage type");
  }
}

std::uint16_t bf16_bits(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t half_bits(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u)
    return static_cast<std::uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to infinity
  // Below 2^-14: the subnormal grid of 2^-24 (the scaling is exact, rint rounds to nearest even).
  if (a < 0x38800000u) {
    const float q = std::nearbyint(std::bit_cast<float>(a) * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(q));
  }
  std::uint32_t h = ((((a >> 23) - 127u + 15u) << 10) | ((a & 0x7fffffu) >> 13));
  const std::uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
  const std::uint32_t e = (bits >> 10) & 0x1fu;
  const std::uint32_t m = bits & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

std::uint16_t bf16_bits_sr(float v, std::uint32_t r) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return bf16_bits(v);  // inf, NaN
  return static_cast<std::uint16_t>((u + (r & 0xffffu)) >> 16);
}

std::uint16_t half_bits_sr(float v, std::uint32_t r) {
  const float a = std::fabs(v);
  if (!(a < 65504.0f)) return half_bits(v);
  if (a >= 6.103515625e-05f) {  // normal in fp16: 13 dropped mantissa bits
    const std::uint32_t u = (std::bit_cast<std::uint32_t>(v) + (r & 0x1fffu)) & ~0x1fffu;
    return half_bits(std::bit_cast<float>(u));  // exact (or 65536 -> infinity)
  }
  // Subnormal (or zero) in fp16: the grid of 2^-24.
  const float s = a * 16777216.0f;
  const float lo = std::floor(s);
  const float up = (s - lo) > static_cast<float>(r & 0xffffu) * (1.0f / 65536.0f) ? 1.0f : 0.0f;
  return half_bits(std::copysign((lo + up) * (1.0f / 16777216.0f), v));
}

float load_element(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    default:
      throw std::invalid_argument("load_element: not a floating-point storage type");
  }
}

void store_element(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(p)[i] = half_bits(v);
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(p)[i] = bf16_bits(v);
      return;
    default:
      throw std::invalid_argument("store_element: not a floating-point storage type");
  }
}

}  // namespace parity
