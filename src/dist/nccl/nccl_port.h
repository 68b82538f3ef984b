// NCCL on NVIDIA, RCCL on AMD: RCCL keeps NCCL's names and types, so only the header differs.
#pragma once

#include "backend/gpu/port.h"  // PARITY_GPU_HIP where the build is for AMD

#if defined(PARITY_GPU_HIP)
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif
