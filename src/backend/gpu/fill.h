// Fills and in-place rounding: constant fills, the counter-based uniform fill that initialises
// parameters (the GPU twin of Backend::fill_uniform, so tables of any size are initialised at
// memory speed and the same (seed, stream) gives the same values on every device and on the CPU).
// Host entry points; kernels in fill.cu.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/dtype.h"

namespace parity::gpu {

// p[i] = value for i in [0, n).
void fill(Stream_t s, float* p, std::int64_t n, float value);

// p[i] = lo + (hi - lo) * rng::uniform01(rng::key(seed, stream), i) for i in [0, n), computed as
// the CPU backend computes it (hi - lo in float, the rest in double) and rounded once to dtype
// (f32, f16 or bf16; nearest even).
void fill_uniform(Stream_t s, void* p, DType dtype, std::int64_t n, float lo, float hi,
                  std::uint64_t seed, std::uint64_t stream);

}  // namespace parity::gpu
