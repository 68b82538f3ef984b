// Lab probes for the embedding benchmarks (see row_probe.cu).
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"

namespace parity::gpu::lab {

// For each of the n rows listed (sorted, distinct): w[row, 0..128) += 1, with the rows kernel's
// access shape. Measures the HBM ceiling of the backward's random row read-modify-write.
void row_read_modify_write(Stream_t s, float* weights, const std::uint32_t* rows, std::int64_t n,
                           int dim);

}  // namespace parity::gpu::lab
