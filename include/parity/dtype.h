// Element types and their names as they appear in configs and checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace parity {

enum class DType : std::uint8_t { f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, i64 };

// Bytes per element.
std::size_t dtype_size(DType t);
// Config name: "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int32", "int64".
std::string_view dtype_name(DType t);
// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> parse_dtype(std::string_view name);
// safetensors name: "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I32", "I64".
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// v rounded to the nearest value representable in t (fp16 or bf16; ties to even; fp16
// overflows to infinity). Identity for fp32: the value an fp32 number has once stored as t.
float round_to_dtype(float v, DType t);

// bf16 storage bits of v (nearest even; NaN stays NaN) and back: what activations stored in bf16
// hold (the GPU kernels use the same rule).
std::uint16_t bf16_bits(float v);
float bf16_to_float(std::uint16_t bits);
// IEEE binary16 storage bits of v (nearest even, overflow to infinity, subnormals kept; NaN stays
// NaN) and back: the host's reference for fp16 tables (the GPU converts in hardware).
std::uint16_t half_bits(float v);
float half_to_float(std::uint16_t bits);

// Stochastic rounding to bf16 and fp16 with 16 random bits r (the low 16 used): rounds up with
// probability equal to the dropped fraction, so E[round(v)] = v. Infinities, NaN and (fp16)
// magnitudes of 65504 or more round to nearest. The GPU kernels round with the same rule (and the
// same bits), so the CPU backend is their oracle bit for bit.
std::uint16_t bf16_bits_sr(float v, std::uint32_t r);
std::uint16_t half_bits_sr(float v, std::uint32_t r);

// Element i of a buffer stored as t (fp32, fp16 or bf16) as float, and the store that rounds to t.
float load_element(const void* p, DType t, std::int64_t i);
void store_element(void* p, DType t, std::int64_t i, float v);

}  // namespace parity
