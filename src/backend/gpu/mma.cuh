// Warp-level matrix-multiply primitives for hand-written tensor-core kernels: the one place that
// names the vendor's fragment instructions, as port.h names the runtime.
//
// NVIDIA (sm_80 and later): mma.sync m16n8k16 with bf16 operands and fp32 accumulators, ldmatrix
// for the operand fragments, cp.async for global-to-shared copies that bypass the registers, and
// the one-instruction tanh. The fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
// for lane l, g = l / 4 and t = l % 4:
//   A (16 x 16, row-major) a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16 x 8, k x n)      b0: (k 2t..2t+1, n g)  b1: (k 2t+8.., n g)
//   C (16 x 8)             c0,c1: (g, 2t..2t+1)  c2,c3: (g+8, 2t..2t+1)
// so the C fragments of two adjacent 8-column tiles, packed to bf16, are the A fragment of the
// next product over those 16 columns (no trip through shared memory).
//
// AMD: the MFMA instructions have other fragment layouts (and 64-lane waves); kTensorCores is
// false there and the callers use their scalar kernels until the MFMA forms are added here.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"

namespace parity::gpu::mma {

#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)
inline constexpr bool kTensorCores = true;

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 bf16 matrices from shared memory; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void load_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
// The same, each matrix transposed.
__device__ __forceinline__ void load_x4_transposed(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// c += a · b for one 16 x 8 tile (fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to nearest-even bf16, lo in the low half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 16 bytes from global to shared memory without the registers; zeros where !valid (src is then
// not read but must still be a mapped address).
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `pending` committed groups of this thread are still in flight.
template <int pending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// tanh to about 2^-11 relative (one special-function instruction).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#else
inline constexpr bool kTensorCores = false;
#endif

}  // namespace parity::gpu::mma
