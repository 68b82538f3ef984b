// Element types the GPU kernels store (fp32, and fp16/bf16 as 16-bit patterns), their conversions
// to and from float (round to nearest even, and stochastic rounding), and the one vocabulary of
// vector loads and stores every kernel uses: N consecutive elements of a type, as floats.
//
// Why it is built this way:
// - fp16 and bf16 are stored as 16-bit patterns (F16, Bf16 below), not as the vendors' half
//   types: the patterns are the same on both vendors and on the host, so tests and checkpoints
//   read them directly, and no vendor type leaks into host code. The host's reference conversions
//   are dtype.h's (bf16_bits, half_bits and their inverses).
// - Stochastic rounding adds random bits below the kept mantissa and truncates, which rounds up
//   with probability equal to the dropped fraction: E[round(x)] = x. The random bits come from the
//   caller (counter-based, random.h), so a given (seed, step, row, column) always rounds the same
//   way. fp16 subnormals get the same treatment on their fixed 2^-24 grid.
// - Vector accesses are 16 bytes (4 floats or 8 halves) per instruction, or 8 bytes for 4 halves;
//   a group of N elements of other widths (N = 1, say) is read and written element by element.
//   The caller guarantees the alignment of a vector group (kernels check it on the host or per
//   table and pick N accordingly).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/gpu/port.h"
#include "parity/dtype.h"
#include "parity/random.h"

namespace parity::gpu {

struct F16 {
  std::uint16_t bits;
};
struct Bf16 {
  std::uint16_t bits;
};

// ----------------------------------------------------------------- device --
#if defined(PARITY_GPU_COMPILER)

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(F16 v) {
  return half_bits_to_float(v.bits);
}
__device__ __forceinline__ float to_float(Bf16 v) {
  return __uint_as_float(static_cast<std::uint32_t>(v.bits) << 16);
}

__device__ __forceinline__ std::uint16_t bf16_bits_rn(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class T>
__device__ __forceinline__ T from_float_rn(float v);
template <>
__device__ __forceinline__ float from_float_rn<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ F16 from_float_rn<F16>(float v) {
  return F16{float_to_half_bits_rn(v)};
}
template <>
__device__ __forceinline__ Bf16 from_float_rn<Bf16>(float v) {
  return Bf16{bf16_bits_rn(v)};
}

// Stochastic rounding of v with 16 random bits r (low 16 bits used).
template <class T>
__device__ __forceinline__ T from_float_sr(float v, std::uint32_t r);
template <>
__device__ __forceinline__ float from_float_sr<float>(float v, std::uint32_t) {
  return v;
}
template <>
__device__ __forceinline__ Bf16 from_float_sr<Bf16>(float v, std::uint32_t r) {
  const std::uint32_t u = __float_as_uint(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return Bf16{bf16_bits_rn(v)};  // inf, NaN
  return Bf16{static_cast<std::uint16_t>((u + (r & 0xffffu)) >> 16)};
}
template <>
__device__ __forceinline__ F16 from_float_sr<F16>(float v, std::uint32_t r) {
  const float a = fabsf(v);
  if (!(a < 65504.0f)) return F16{float_to_half_bits_rn(v)};  // max, beyond, inf, NaN: nearest
  if (a >= 6.103515625e-05f) {  // normal in fp16: 13 dropped mantissa bits
    const std::uint32_t u = (__float_as_uint(v) + (r & 0x1fffu)) & ~0x1fffu;
    return F16{float_to_half_bits_rn(__uint_as_float(u))};  // exact (or 65536 -> inf)
  }
  // Subnormal (or zero) in fp16: grid of 2^-24.
  const float s = a * 16777216.0f;
  const float lo = floorf(s);
  const float up = (s - lo) > static_cast<float>(r & 0xffffu) * (1.0f / 65536.0f) ? 1.0f : 0.0f;
  return F16{float_to_half_bits_rn(copysignf((lo + up) * (1.0f / 16777216.0f), v))};
}

// ---- vector access: N consecutive elements as floats, 16-byte (or 8-byte) transactions ----

template <class T>
struct VecWidth {
  static constexpr int value = 16 / static_cast<int>(sizeof(T));  // elements per 16 bytes
};

__device__ __forceinline__ void unpack2(std::uint32_t w, float& a, float& b, F16) {
  a = half_bits_to_float(static_cast<std::uint16_t>(w & 0xffffu));
  b = half_bits_to_float(static_cast<std::uint16_t>(w >> 16));
}
__device__ __forceinline__ void unpack2(std::uint32_t w, float& a, float& b, Bf16) {
  a = __uint_as_float(w << 16);
  b = __uint_as_float(w & 0xffff0000u);
}

// Raw 32-bit words of N consecutive elements of T (loads first, convert later, so that many loads
// are in flight while few registers hold them).
template <int N, class T>
struct RawWords {
  static constexpr int value = N * static_cast<int>(sizeof(T)) / 4;
};

// w = the N elements at p, as raw words. p aligned to min(16, N * sizeof(T)) bytes.
// kStream: a cache-streaming load (port.h, load_streaming).
template <int N, class T, bool kStream = false>
__device__ __forceinline__ void load_raw(const T* __restrict__ p,
                                         std::uint32_t (&w)[RawWords<N, T>::value]) {
  constexpr int kWords = RawWords<N, T>::value;
  if constexpr (kWords == 2) {
    const uint2 v = kStream ? load_streaming(reinterpret_cast<const uint2*>(p))
                            : *reinterpret_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kWords % 4 == 0);
#pragma unroll
    for (int c = 0; c < kWords / 4; ++c) {
      const uint4 v = kStream ? load_streaming(reinterpret_cast<const uint4*>(p) + c)
                              : reinterpret_cast<const uint4*>(p)[c];
      w[4 * c] = v.x;
      w[4 * c + 1] = v.y;
      w[4 * c + 2] = v.z;
      w[4 * c + 3] = v.w;
    }
  }
}

// out[i] (+)= element i of the raw words, as float, times scale (fma when accumulating).
template <int N, class T>
__device__ __forceinline__ void raw_fma(const std::uint32_t (&w)[RawWords<N, T>::value],
                                        float scale, float (&acc)[N]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = fmaf(__uint_as_float(w[i]), scale, acc[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      float a, b;
      unpack2(w[i], a, b, T{});
      acc[2 * i] = fmaf(a, scale, acc[2 * i]);
      acc[2 * i + 1] = fmaf(b, scale, acc[2 * i + 1]);
    }
  }
}
template <int N, class T>
__device__ __forceinline__ void raw_add(const std::uint32_t (&w)[RawWords<N, T>::value],
                                        float (&acc)[N]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      float a, b;
      unpack2(w[i], a, b, T{});
      acc[2 * i] += a;
      acc[2 * i + 1] += b;
    }
  }
}

// Whether N elements of T move as vector accesses: 16-byte ones, or one 8-byte access for 4 halves.
template <int N, class T>
inline constexpr bool kVectorGroup = (N * sizeof(T)) % 16 == 0 || (sizeof(T) == 2 && N == 4);

// out[0..N) = p[0..N) as floats. p aligned to min(16, N * sizeof(T)) bytes for a vector group.
template <int N, class T, bool kStream = false>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&out)[N]) {
  if constexpr (kVectorGroup<N, T>) {
    std::uint32_t w[RawWords<N, T>::value];
    load_raw<N, T, kStream>(p, w);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.0f;
    raw_add<N, T>(w, out);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

__device__ __forceinline__ std::uint32_t pack2(std::uint16_t a, std::uint16_t b) {
  return static_cast<std::uint32_t>(a) | (static_cast<std::uint32_t>(b) << 16);
}

// p[0..N) = v[0..N) (16-bit types: already converted bit patterns in v16).
template <int N, bool kStream = false>
__device__ __forceinline__ void store_vec(float* __restrict__ p, const float (&v)[N]) {
  static_assert(N % 4 == 0);
#pragma unroll
  for (int c = 0; c < N / 4; ++c) {
    const uint4 u = make_uint4(__float_as_uint(v[4 * c]), __float_as_uint(v[4 * c + 1]),
                               __float_as_uint(v[4 * c + 2]), __float_as_uint(v[4 * c + 3]));
    if (kStream) {
      store_streaming(reinterpret_cast<uint4*>(p) + c, u);
    } else {
      reinterpret_cast<uint4*>(p)[c] = u;
    }
  }
}
template <int N, class T, bool kStream = false>
__device__ __forceinline__ void store_vec16(T* __restrict__ p, const std::uint16_t (&h)[N]) {
  if constexpr (N == 4) {
    const uint2 u = make_uint2(pack2(h[0], h[1]), pack2(h[2], h[3]));
    if (kStream) {
      store_streaming(reinterpret_cast<uint2*>(p), u);
    } else {
      *reinterpret_cast<uint2*>(p) = u;
    }
  } else {
    static_assert(N % 8 == 0);
#pragma unroll
    for (int c = 0; c < N / 8; ++c) {
      const uint4 u =
          make_uint4(pack2(h[8 * c], h[8 * c + 1]), pack2(h[8 * c + 2], h[8 * c + 3]),
                     pack2(h[8 * c + 4], h[8 * c + 5]), pack2(h[8 * c + 6], h[8 * c + 7]));
      if (kStream) {
        store_streaming(reinterpret_cast<uint4*>(p) + c, u);
      } else {
        reinterpret_cast<uint4*>(p)[c] = u;
      }
    }
  }
}

// Rounds v to T (nearest even) and stores N elements (vector stores for a vector group).
template <int N, class T, bool kStream = false>
__device__ __forceinline__ void store_vec_rn(T* __restrict__ p, const float (&v)[N]) {
  if constexpr (!kVectorGroup<N, T>) {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float_rn<T>(v[i]);
  } else if constexpr (std::is_same_v<T, float>) {
    store_vec<N, kStream>(p, v);
  } else {
    std::uint16_t h[N];
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = from_float_rn<T>(v[i]).bits;
    store_vec16<N, T, kStream>(p, h);
  }
}

#endif  // PARITY_GPU_COMPILER

}  // namespace parity::gpu
