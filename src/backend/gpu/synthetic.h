// Synthetic batches made on the device (Backend::make_synthetic): the same examples as the host
// generator (SyntheticData::make), bit for bit, from a copy of its generator block. Host entry
// point; kernels in synthetic.cu.
#pragma once

#include "backend/gpu/port.h"
#include "parity/backend.h"

namespace parity::gpu {

// Enqueues the batch on stream s.
void make_synthetic(Stream_t s, const SyntheticBatch& batch);

}  // namespace parity::gpu
