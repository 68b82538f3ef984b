// PARITY_HD marks a function that the host compiler and the GPU compilers (nvcc, hipcc) both
// compile: the counter-based generators and the synthetic data's math run on either side and
// must give the same bits.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PARITY_HD __host__ __device__ inline
#else
#define PARITY_HD inline
#endif
