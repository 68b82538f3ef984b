// The finite-value guard (Backend::flag_nonfinite, include/parity/backend.h): records the first
// step whose loss or dense parameters hold a NaN or an infinity, on the device, so that the step
// never waits for the host. Host entry point; kernel in finite_guard.cu.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"

namespace parity::gpu {

// *first_bad = step where *first_bad is -1 and some x[i], i in [0, n), is NaN or infinite.
void flag_nonfinite(Stream_t s, const float* x, std::int64_t n, std::int64_t step,
                    std::int64_t* first_bad);

}  // namespace parity::gpu
