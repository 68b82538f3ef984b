// The one file that names CUDA and HIP symbols. Everything else in src/backend/gpu (and the GPU
// tests and benchmarks) speaks gpu:: and compiles unchanged for either vendor.
//
// Why it is built this way:
// - Aliases and inline wrappers in namespace parity::gpu, never `#define cudaX hipX`: a macro shim
//   leaks into every file that includes it and renames symbols behind the reader's back.
// - The runtime part (types, memory, streams, events, attributes) is plain host C++ and compiles
//   with the host compiler too, so tests and benchmarks can be .cpp files.
// - The device part (warp intrinsics, half conversions) exists only under a GPU compiler. Warp
//   size there is a compile-time constant (32 on NVIDIA, 64 on CDNA); on the host it is never a
//   constant: ask device_info().warp_size (runtime.h). Lane masks are 64-bit on AMD.
// - Sub-warp groups: the shuffles take the mask of the lanes that execute them (CUDA needs it;
//   HIP has no masks and ignores it). Callers keep every lane of a mask on the same path.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(PARITY_GPU_HIP) || defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#ifndef PARITY_GPU_HIP
#define PARITY_GPU_HIP 1
#endif
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime.h>
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#endif
#else
#define PARITY_GPU_CUDA 1
#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PARITY_GPU_COMPILER 1
#endif

// __launch_bounds__(threads, min_blocks) on CUDA (registers capped so that min_blocks blocks fit a
// multiprocessor); on HIP the second argument means waves per execution unit, so only the block
// size is given there. Parenthesise a min_blocks that contains a comma.
#if defined(PARITY_GPU_HIP)
#define PARITY_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define PARITY_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

namespace parity::gpu {

// ------------------------------------------------------------------ types --

#if defined(PARITY_GPU_HIP)
inline constexpr const char* kVendorRuntime = "HIP";
using Error_t = hipError_t;
using Stream_t = hipStream_t;
using Event_t = hipEvent_t;
inline constexpr Error_t kSuccess = hipSuccess;
#else
inline constexpr const char* kVendorRuntime = "CUDA";
using Error_t = cudaError_t;
using Stream_t = cudaStream_t;
using Event_t = cudaEvent_t;
inline constexpr Error_t kSuccess = cudaSuccess;
#endif

// Device attributes we read (mapped to each vendor's enum below).
enum class Attribute {
  multiprocessor_count,
  warp_size,
  l2_cache_bytes,
  shared_memory_per_block,        // default limit per block
  shared_memory_per_block_optin,  // after raising a kernel's dynamic limit
  max_threads_per_block,
  max_threads_per_multiprocessor,  // resident threads an SM (a CU on AMD) can hold
  max_grid_x,
  max_grid_y,
  max_grid_z,
  compute_major,
  compute_minor,
};

// ---------------------------------------------------------------- runtime --

#if defined(PARITY_GPU_HIP)
#define PARITY_GPU_VENDOR(cuda_name, hip_name) hip_name
#else
#define PARITY_GPU_VENDOR(cuda_name, hip_name) cuda_name
#endif

inline const char* error_name(Error_t e) {
  return PARITY_GPU_VENDOR(cudaGetErrorName, hipGetErrorName)(e);
}
inline const char* error_string(Error_t e) {
  return PARITY_GPU_VENDOR(cudaGetErrorString, hipGetErrorString)(e);
}
inline Error_t get_last_error() {
  return PARITY_GPU_VENDOR(cudaGetLastError, hipGetLastError)();
}
inline Error_t get_device_count(int* n) {
  return PARITY_GPU_VENDOR(cudaGetDeviceCount, hipGetDeviceCount)(n);
}
inline Error_t get_device(int* d) {
  return PARITY_GPU_VENDOR(cudaGetDevice, hipGetDevice)(d);
}
inline Error_t set_device(int d) {
  return PARITY_GPU_VENDOR(cudaSetDevice, hipSetDevice)(d);
}
inline Error_t device_synchronize() {
  return PARITY_GPU_VENDOR(cudaDeviceSynchronize, hipDeviceSynchronize)();
}
inline Error_t mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  return PARITY_GPU_VENDOR(cudaMemGetInfo, hipMemGetInfo)(free_bytes, total_bytes);
}

// The device's UUID as nvidia-smi prints it: "GPU-" and its 16 bytes in hex, 8-4-4-4-12.
inline Error_t device_uuid(int device, char (&out)[41]) {
  unsigned char b[16] = {};
#if defined(PARITY_GPU_HIP)
  hipUUID u;
  const Error_t e = hipDeviceGetUuid(&u, device);
  for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(u.bytes[i]);
#else
  cudaDeviceProp p;
  const Error_t e = cudaGetDeviceProperties(&p, device);
  for (int i = 0; i < 16; ++i) b[i] = static_cast<unsigned char>(p.uuid.bytes[i]);
#endif
  static constexpr char kHex[] = "0123456789abcdef";
  int at = 0;
  for (const char c : {'G', 'P', 'U', '-'}) out[at++] = c;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[at++] = '-';
    out[at++] = kHex[b[i] >> 4];
    out[at++] = kHex[b[i] & 15];
  }
  out[at] = '\0';
  return e;
}

inline Error_t device_name(int device, char* buf, std::size_t n) {
#if defined(PARITY_GPU_HIP)
  hipDeviceProp_t p;
  const Error_t e = hipGetDeviceProperties(&p, device);
#else
  cudaDeviceProp p;
  const Error_t e = cudaGetDeviceProperties(&p, device);
#endif
  if (e != kSuccess || n == 0) return e;
  std::size_t i = 0;
  for (; i + 1 < n && i < sizeof(p.name) && p.name[i] != '\0'; ++i) buf[i] = p.name[i];
  buf[i] = '\0';
  return e;
}

inline Error_t device_attribute(int* value, Attribute a, int device) {
#if defined(PARITY_GPU_HIP)
  hipDeviceAttribute_t attr = hipDeviceAttributeMultiprocessorCount;
  switch (a) {
    case Attribute::multiprocessor_count:
      attr = hipDeviceAttributeMultiprocessorCount;
      break;
    case Attribute::warp_size:
      attr = hipDeviceAttributeWarpSize;
      break;
    case Attribute::l2_cache_bytes:
      attr = hipDeviceAttributeL2CacheSize;
      break;
    case Attribute::shared_memory_per_block:
      attr = hipDeviceAttributeMaxSharedMemoryPerBlock;
      break;
    case Attribute::shared_memory_per_block_optin:
      attr = hipDeviceAttributeSharedMemPerBlockOptin;
      break;
    case Attribute::max_threads_per_block:
      attr = hipDeviceAttributeMaxThreadsPerBlock;
      break;
    case Attribute::max_threads_per_multiprocessor:
      attr = hipDeviceAttributeMaxThreadsPerMultiProcessor;
      break;
    case Attribute::max_grid_x:
      attr = hipDeviceAttributeMaxGridDimX;
      break;
    case Attribute::max_grid_y:
      attr = hipDeviceAttributeMaxGridDimY;
      break;
    case Attribute::max_grid_z:
      attr = hipDeviceAttributeMaxGridDimZ;
      break;
    case Attribute::compute_major:
      attr = hipDeviceAttributeComputeCapabilityMajor;
      break;
    case Attribute::compute_minor:
      attr = hipDeviceAttributeComputeCapabilityMinor;
      break;
  }
  return hipDeviceGetAttribute(value, attr, device);
#else
  cudaDeviceAttr attr = cudaDevAttrMultiProcessorCount;
  switch (a) {
    case Attribute::multiprocessor_count:
      attr = cudaDevAttrMultiProcessorCount;
      break;
    case Attribute::warp_size:
      attr = cudaDevAttrWarpSize;
      break;
    case Attribute::l2_cache_bytes:
      attr = cudaDevAttrL2CacheSize;
      break;
    case Attribute::shared_memory_per_block:
      attr = cudaDevAttrMaxSharedMemoryPerBlock;
      break;
    case Attribute::shared_memory_per_block_optin:
      attr = cudaDevAttrMaxSharedMemoryPerBlockOptin;
      break;
    case Attribute::max_threads_per_block:
      attr = cudaDevAttrMaxThreadsPerBlock;
      break;
    case Attribute::max_threads_per_multiprocessor:
      attr = cudaDevAttrMaxThreadsPerMultiProcessor;
      break;
    case Attribute::max_grid_x:
      attr = cudaDevAttrMaxGridDimX;
      break;
    case Attribute::max_grid_y:
      attr = cudaDevAttrMaxGridDimY;
      break;
    case Attribute::max_grid_z:
      attr = cudaDevAttrMaxGridDimZ;
      break;
    case Attribute::compute_major:
      attr = cudaDevAttrComputeCapabilityMajor;
      break;
    case Attribute::compute_minor:
      attr = cudaDevAttrComputeCapabilityMinor;
      break;
  }
  return cudaDeviceGetAttribute(value, attr, device);
#endif
}

inline Error_t malloc_device(void** p, std::size_t bytes) {
  return PARITY_GPU_VENDOR(cudaMalloc, hipMalloc)(p, bytes);
}
inline Error_t free_device(void* p) {
  return PARITY_GPU_VENDOR(cudaFree, hipFree)(p);
}
inline Error_t malloc_host(void** p, std::size_t bytes) {
  return PARITY_GPU_VENDOR(cudaMallocHost, hipHostMalloc)(p, bytes);
}
inline Error_t free_host(void* p) {
  return PARITY_GPU_VENDOR(cudaFreeHost, hipHostFree)(p);
}

// cudaMemcpyDefault / hipMemcpyDefault: the runtime infers the direction (unified addressing).
inline Error_t memcpy_async(void* dst, const void* src, std::size_t bytes, Stream_t s) {
  return PARITY_GPU_VENDOR(cudaMemcpyAsync, hipMemcpyAsync)(
      dst, src, bytes, PARITY_GPU_VENDOR(cudaMemcpyDefault, hipMemcpyDefault), s);
}
inline Error_t memset_async(void* p, int value, std::size_t bytes, Stream_t s) {
  return PARITY_GPU_VENDOR(cudaMemsetAsync, hipMemsetAsync)(p, value, bytes, s);
}

inline Error_t stream_create(Stream_t* s) {
  return PARITY_GPU_VENDOR(cudaStreamCreateWithFlags, hipStreamCreateWithFlags)(
      s, PARITY_GPU_VENDOR(cudaStreamNonBlocking, hipStreamNonBlocking));
}
inline Error_t stream_destroy(Stream_t s) {
  return PARITY_GPU_VENDOR(cudaStreamDestroy, hipStreamDestroy)(s);
}
inline Error_t stream_synchronize(Stream_t s) {
  return PARITY_GPU_VENDOR(cudaStreamSynchronize, hipStreamSynchronize)(s);
}
// kSuccess once everything enqueued on s has run, kNotReady while work is pending, else an error.
inline constexpr Error_t kNotReady = PARITY_GPU_VENDOR(cudaErrorNotReady, hipErrorNotReady);
inline Error_t stream_query(Stream_t s) {
  return PARITY_GPU_VENDOR(cudaStreamQuery, hipStreamQuery)(s);
}

// Whether p points into memory a kernel can read: device or managed memory (ordinary host memory,
// which the runtime does not know, is not; nor is pinned host memory).
inline bool is_device_pointer(const void* p) {
  PARITY_GPU_VENDOR(cudaPointerAttributes, hipPointerAttribute_t) a{};
  if (PARITY_GPU_VENDOR(cudaPointerGetAttributes, hipPointerGetAttributes)(&a, p) != kSuccess) {
    (void)get_last_error();  // older runtimes flag unknown host memory as an error
    return false;
  }
#if defined(PARITY_GPU_HIP) && HIP_VERSION_MAJOR < 6
  return a.memoryType == hipMemoryTypeDevice || a.isManaged != 0;  // ROCm 5 names it memoryType
#elif defined(PARITY_GPU_HIP)
  return a.type == hipMemoryTypeDevice || a.isManaged != 0;
#else
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#endif
}

inline Error_t event_create(Event_t* e) {
  return PARITY_GPU_VENDOR(cudaEventCreate, hipEventCreate)(e);
}
inline Error_t event_destroy(Event_t e) {
  return PARITY_GPU_VENDOR(cudaEventDestroy, hipEventDestroy)(e);
}
inline Error_t event_record(Event_t e, Stream_t s) {
  return PARITY_GPU_VENDOR(cudaEventRecord, hipEventRecord)(e, s);
}
inline Error_t stream_wait_event(Stream_t s, Event_t e) {
  return PARITY_GPU_VENDOR(cudaStreamWaitEvent, hipStreamWaitEvent)(s, e, 0);
}
inline Error_t event_synchronize(Event_t e) {
  return PARITY_GPU_VENDOR(cudaEventSynchronize, hipEventSynchronize)(e);
}
inline Error_t event_elapsed_ms(float* ms, Event_t start, Event_t stop) {
  return PARITY_GPU_VENDOR(cudaEventElapsedTime, hipEventElapsedTime)(ms, start, stop);
}

// Raises a kernel's dynamic shared-memory limit (needed above the default per-block limit).
inline Error_t func_set_max_dynamic_shared_memory(const void* kernel, int bytes) {
#if defined(PARITY_GPU_HIP)
  return hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
#else
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
#endif
}
inline Error_t occupancy_max_active_blocks(int* blocks, const void* kernel, int block_threads,
                                           std::size_t dynamic_smem) {
  return PARITY_GPU_VENDOR(cudaOccupancyMaxActiveBlocksPerMultiprocessor,
                           hipOccupancyMaxActiveBlocksPerMultiprocessor)(
      blocks, kernel, block_threads, dynamic_smem);
}

#undef PARITY_GPU_VENDOR

// ----------------------------------------------------------------- device --

#if defined(PARITY_GPU_COMPILER)

#if defined(PARITY_GPU_HIP)
using LaneMask = std::uint64_t;
inline constexpr int kWarpSize = warpSize;  // constexpr in HIP device code: 64 on CDNA
#else
using LaneMask = std::uint32_t;
inline constexpr int kWarpSize = 32;
#endif
static_assert(kWarpSize == 32 || kWarpSize == 64, "warp size must be 32 or 64");

inline constexpr LaneMask kFullMask = ~LaneMask{0};

// Lane of this thread within its warp (1-D blocks).
__device__ __forceinline__ int lane_id() {
  return static_cast<int>(threadIdx.x) & (kWarpSize - 1);
}

// Mask of `width` consecutive lanes starting at `first` (width a power of two, <= kWarpSize).
__device__ __forceinline__ LaneMask group_mask(int first, int width) {
  return width >= kWarpSize ? kFullMask : (((LaneMask{1} << width) - 1) << first);
}
// Lanes below this one.
__device__ __forceinline__ LaneMask lanemask_lt() {
  return (LaneMask{1} << lane_id()) - 1;
}

__device__ __forceinline__ int popc(LaneMask m) {
#if defined(PARITY_GPU_HIP)
  return __popcll(m);
#else
  return __popc(m);
#endif
}
__device__ __forceinline__ int lowest_lane(LaneMask m) {
#if defined(PARITY_GPU_HIP)
  return __ffsll(static_cast<unsigned long long>(m)) - 1;
#else
  return __ffs(static_cast<int>(m)) - 1;
#endif
}

__device__ __forceinline__ LaneMask ballot(LaneMask mask, bool pred) {
#if defined(PARITY_GPU_HIP)
  (void)mask;
  return __ballot(pred);
#else
  return __ballot_sync(mask, pred);
#endif
}

// Value of v in lane src (an absolute lane index within the warp).
template <class T>
__device__ __forceinline__ T shfl(LaneMask mask, T v, int src) {
#if defined(PARITY_GPU_HIP)
  (void)mask;
  return __shfl(v, src);
#else
  return __shfl_sync(mask, v, src);
#endif
}
template <class T>
__device__ __forceinline__ T shfl_xor(LaneMask mask, T v, int lane_xor) {
#if defined(PARITY_GPU_HIP)
  (void)mask;
  return __shfl_xor(v, lane_xor);
#else
  return __shfl_xor_sync(mask, v, lane_xor);
#endif
}
// Value of v in lane (lane - delta) within segments of `width` lanes (own value below delta).
template <class T>
__device__ __forceinline__ T shfl_up(LaneMask mask, T v, int delta, int width = kWarpSize) {
#if defined(PARITY_GPU_HIP)
  (void)mask;
  return __shfl_up(v, static_cast<unsigned int>(delta), width);
#else
  return __shfl_up_sync(mask, v, static_cast<unsigned int>(delta), width);
#endif
}

// Orders the shared-memory accesses of the lanes of one warp.
__device__ __forceinline__ void sync_warp() {
#if defined(PARITY_GPU_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// Loads and stores that are not expected to be reused soon (cache-streaming: evict first), so
// that they do not push out of L2 data that is (an embedding backward's output gradients, read
// once per occurrence, while every weight row streams through once). Plain accesses on HIP.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
#if defined(PARITY_GPU_CUDA)
  return __ldcs(p);
#else
  return *p;
#endif
}
__device__ __forceinline__ uint2 load_streaming(const uint2* p) {
#if defined(PARITY_GPU_CUDA)
  return __ldcs(p);
#else
  return *p;
#endif
}
__device__ __forceinline__ void store_streaming(uint4* p, uint4 v) {
#if defined(PARITY_GPU_CUDA)
  __stcs(p, v);
#else
  *p = v;
#endif
}
__device__ __forceinline__ void store_streaming(uint2* p, uint2 v) {
#if defined(PARITY_GPU_CUDA)
  __stcs(p, v);
#else
  *p = v;
#endif
}

// IEEE half <-> float through the hardware conversions (bits in a uint16).
__device__ __forceinline__ float half_bits_to_float(std::uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ std::uint16_t float_to_half_bits_rn(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

#endif  // PARITY_GPU_COMPILER

}  // namespace parity::gpu
