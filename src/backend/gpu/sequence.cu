// The HSTU layer's kernels (see sequence.h).
//
// Why they are built this way: this is the first, correct GPU path of the HSTU layer, simple
// enough to check line by line against the CPU reference; the attention is not yet the tiled
// tensor-core kernel the layer needs for speed.
// - Row ops (layer norm, norm-multiply) give each row one warp and sum in double (shuffles), as the
//   CPU sums in double. A row of up to 16 x the warp's columns is held in registers, so each
//   element is read once and written once (these ops are bound by memory); wider rows loop over
//   memory. The column sums of dgamma and dbeta go through the deterministic column_sum.
// - Attention gives each (token, head) one warp (32 or 64 lanes: the lanes stride over the
//   attention and value dims). The forward and the query-side backward (dq) walk the token's
//   visible keys in order; the key-side backward (dk, dv) walks the queries that see the key. The
//   relative bias's gradients are sums over every pair: each warp adds runs of pairs in the same
//   bucket in fp32, in order, and adds each run to its bucket's 64-bit fixed-point total
//   (2^-32 units) with an integer atomic: integer sums do not depend on the order of the adds, so
//   the result is the same bits on every run.
#include "backend/gpu/sequence.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/gpu/column_sum.h"
#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "parity/error.h"

namespace parity::gpu {
namespace {

constexpr int kRowBlock = 128;
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 20;
constexpr int kMaxPerLane = 8;                // attention and value dims up to 8 x the warp size
constexpr double kFixedScale = 4294967296.0;  // 2^32: the bias gradients' fixed-point unit
constexpr int kMaxSumTables = 16;

std::int64_t grid_of(std::int64_t n, std::int64_t per_block) {
  return std::max<std::int64_t>(1, std::min((n + per_block - 1) / per_block, kMaxGrid));
}

// ------------------------------------------------------------- row ops --

// One warp per row, kNormBlock / kWarpSize rows a block: a row's sums are a warp's shuffles, not a
// block's shared-memory tree with its barriers, which left the memory idle (a row is a few hundred
// columns). Each lane sums its columns in double, in order; the warp's total is lane 0's, so every
// lane uses the same bits.
constexpr int kNormBlock = 256;

__device__ __forceinline__ double warp_total(double v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += shfl_xor(kFullMask, v, o);
  return shfl(kFullMask, v, 0);
}

__device__ __forceinline__ std::int64_t first_row() {
  return static_cast<std::int64_t>(blockIdx.x) * (kNormBlock / kWarpSize) +
         static_cast<int>(threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ std::int64_t row_stride() {
  return static_cast<std::int64_t>(gridDim.x) * (kNormBlock / kWarpSize);
}

// mode 0: layer norm (gamma, beta optional); mode 1: norm-multiply by u.
__global__ __launch_bounds__(kNormBlock) void norm_forward_kernel(CMat x, const float* gamma,
                                                                  const float* beta, CMat u,
                                                                  float eps, Mat y, float* mean,
                                                                  float* rstd) {
  const std::int64_t cols = x.cols;
  const int lane = lane_id();
  for (std::int64_t r = first_row(); r < x.rows; r += row_stride()) {
    const float* xr = x.data + r * x.ld;
    double s = 0.0;
    for (std::int64_t c = lane; c < cols; c += kWarpSize) s += xr[c];
    const double mu = warp_total(s) / static_cast<double>(cols);
    double q = 0.0;
    for (std::int64_t c = lane; c < cols; c += kWarpSize) {
      const double d = xr[c] - mu;
      q += d * d;
    }
    const double rho = 1.0 / sqrt(warp_total(q) / static_cast<double>(cols) + eps);
    if (lane == 0) {
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(rho);
    }
    float* yr = y.data + r * y.ld;
    for (std::int64_t c = lane; c < cols; c += kWarpSize) {
      double v = (xr[c] - mu) * rho;
      if (u.data != nullptr) {
        v *= u.data[r * u.ld + c];
      } else {
        if (gamma != nullptr) v *= gamma[c];
        if (beta != nullptr) v += beta[c];
      }
      yr[c] = static_cast<float>(v);
    }
  }
}

// dx = ρ (g - mean(g) - x̂ mean(g x̂)) with g = dy ⊙ (gamma or u); du = dy ⊙ x̂ (norm-multiply);
// prod = dy ⊙ x̂ (layer norm with dgamma, for its column sum).
__global__ __launch_bounds__(kNormBlock) void norm_backward_kernel(CMat x, const float* gamma,
                                                                   CMat u, const float* mean,
                                                                   const float* rstd, CMat dy,
                                                                   Mat dx, Mat du, float* prod) {
  const std::int64_t cols = x.cols;
  const int lane = lane_id();
  for (std::int64_t r = first_row(); r < x.rows; r += row_stride()) {
    const double mu = mean[r], rho = rstd[r];
    const float* xr = x.data + r * x.ld;
    const float* dyr = dy.data + r * dy.ld;
    auto g_of = [&](std::int64_t c) {
      const double d = dyr[c];
      if (u.data != nullptr) return d * u.data[r * u.ld + c];
      return gamma != nullptr ? d * gamma[c] : d;
    };
    double sg = 0.0, sgx = 0.0;
    for (std::int64_t c = lane; c < cols; c += kWarpSize) {
      const double g = g_of(c), xh = (xr[c] - mu) * rho;
      sg += g;
      sgx += g * xh;
    }
    const double g_mean = warp_total(sg) / static_cast<double>(cols);
    const double gx_mean = warp_total(sgx) / static_cast<double>(cols);
    for (std::int64_t c = lane; c < cols; c += kWarpSize) {
      const double xh = (xr[c] - mu) * rho;
      dx.data[r * dx.ld + c] = static_cast<float>(rho * (g_of(c) - g_mean - xh * gx_mean));
      if (du.data != nullptr) du.data[r * du.ld + c] = static_cast<float>(dyr[c] * xh);
      if (prod != nullptr) prod[r * cols + c] = static_cast<float>(dyr[c] * xh);
    }
  }
}

// The same row ops with the row held in registers (N values a lane: 4, 8 or 16, the fewest that
// hold the row, so that short rows keep few registers and many warps in flight): each element is
// read from memory once and written once, where the loops above read a row two or three times.
// V = 4 loads and stores 16 bytes a lane (rows of a multiple of 4 columns, every view aligned);
// V = 1 one element. Rows wider than kRowCache x the warp take the kernels above.
constexpr int kRowCache = 16;

template <int V, int N>
struct RowRegs {
  static_assert((V == 1 || V == 4) && N % V == 0 && N <= kRowCache);
  float v[N];

  // The column of a lane's i-th value: V consecutive columns a lane, the warp's lanes side by side.
  __device__ __forceinline__ static std::int64_t col(int i, int lane) {
    return (static_cast<std::int64_t>(i / V) * kWarpSize + lane) * V + i % V;
  }
  // Columns at or past `cols` read as 0.
  __device__ __forceinline__ void load(const float* row, std::int64_t cols, int lane) {
#pragma unroll
    for (int i = 0; i < N; i += V) {
      const std::int64_t c = col(i, lane);
      if constexpr (V == 4) {
        const float4 t =
            c < cols ? *reinterpret_cast<const float4*>(row + c) : float4{0.0f, 0.0f, 0.0f, 0.0f};
        v[i] = t.x;
        v[i + 1] = t.y;
        v[i + 2] = t.z;
        v[i + 3] = t.w;
      } else {
        v[i] = c < cols ? row[c] : 0.0f;
      }
    }
  }
  __device__ __forceinline__ void store(float* row, std::int64_t cols, int lane) const {
#pragma unroll
    for (int i = 0; i < N; i += V) {
      const std::int64_t c = col(i, lane);
      if (c >= cols) continue;
      if constexpr (V == 4)
        *reinterpret_cast<float4*>(row + c) = float4{v[i], v[i + 1], v[i + 2], v[i + 3]};
      else
        row[c] = v[i];
    }
  }
};

template <int V, int N>
__global__ __launch_bounds__(kNormBlock) void norm_forward_cached_kernel(CMat x, const float* gamma,
                                                                         const float* beta, CMat u,
                                                                         float eps, Mat y,
                                                                         float* mean, float* rstd) {
  using R = RowRegs<V, N>;
  const std::int64_t cols = x.cols;
  const int lane = lane_id();
  for (std::int64_t r = first_row(); r < x.rows; r += row_stride()) {
    R v;
    v.load(x.data + r * x.ld, cols, lane);
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < N; ++i) s += v.v[i];  // the padding adds zeros
    const double mu = warp_total(s) / static_cast<double>(cols);
    double q = 0.0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const double d = R::col(i, lane) < cols ? v.v[i] - mu : 0.0;
      q += d * d;
    }
    const double rho = 1.0 / sqrt(warp_total(q) / static_cast<double>(cols) + eps);
    if (lane == 0) {
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(rho);
    }
    R m;  // the multiplier: u's row, or gamma
    if (u.data != nullptr) m.load(u.data + r * u.ld, cols, lane);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const std::int64_t c = R::col(i, lane);
      if (c >= cols) continue;
      double o = (v.v[i] - mu) * rho;
      if (u.data != nullptr) {
        o *= m.v[i];
      } else {
        if (gamma != nullptr) o *= gamma[c];
        if (beta != nullptr) o += beta[c];
      }
      v.v[i] = static_cast<float>(o);
    }
    v.store(y.data + r * y.ld, cols, lane);
  }
}

template <int V, int N>
__global__ __launch_bounds__(kNormBlock) void norm_backward_cached_kernel(
    CMat x, const float* gamma, CMat u, const float* mean, const float* rstd, CMat dy, Mat dx,
    Mat du, float* prod) {
  using R = RowRegs<V, N>;
  const std::int64_t cols = x.cols;
  const int lane = lane_id();
  for (std::int64_t r = first_row(); r < x.rows; r += row_stride()) {
    const double mu = mean[r], rho = rstd[r];
    R xv, dv, g;
    xv.load(x.data + r * x.ld, cols, lane);
    dv.load(dy.data + r * dy.ld, cols, lane);
    if (u.data != nullptr) g.load(u.data + r * u.ld, cols, lane);
    double sg = 0.0, sgx = 0.0;
    double gd[N];  // g = dy ⊙ (u or gamma), in double as the CPU forms it
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const std::int64_t c = R::col(i, lane);
      const double d = dv.v[i];  // 0 in the padding, so g is too
      gd[i] = u.data != nullptr ? d * g.v[i] : (gamma != nullptr && c < cols ? d * gamma[c] : d);
      sg += gd[i];
      sgx += gd[i] * ((xv.v[i] - mu) * rho);
    }
    const double g_mean = warp_total(sg) / static_cast<double>(cols);
    const double gx_mean = warp_total(sgx) / static_cast<double>(cols);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const double xh = (xv.v[i] - mu) * rho;
      g.v[i] = static_cast<float>(rho * (gd[i] - g_mean - xh * gx_mean));  // dx
      xv.v[i] = static_cast<float>(dv.v[i] * xh);                          // dy ⊙ x̂
    }
    g.store(dx.data + r * dx.ld, cols, lane);
    if (du.data != nullptr) xv.store(du.data + r * du.ld, cols, lane);
    if (prod != nullptr) xv.store(prod + r * cols, cols, lane);
  }
}

// ----------------------------------------------------- elementwise, rows --

// op 0: y = silu(x); 1: y = dy silu'(x) (y may be dy); 2: y += x. In fp32 (sigmoid by expf, a few
// ulps from the double reference; the sum of two floats is the correctly rounded one either way):
// double exponentials made these memory-bound passes compute-bound.
__device__ __forceinline__ float sigmoid_f(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  const float e = expf(z);
  return e / (1.0f + e);
}
__device__ __forceinline__ float pointwise_of(int op, float v, float g, float y) {
  if (op == 0) return v * sigmoid_f(v);
  if (op == 1) {
    const float s = sigmoid_f(v);
    return g * s * (1.0f + v * (1.0f - s));
  }
  return y + v;
}

__global__ __launch_bounds__(kRowBlock) void pointwise_kernel(int op, CMat x, CMat dy, Mat y) {
  const std::int64_t n = x.rows * x.cols;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t r = i / x.cols, c = i - r * x.cols;
    float* out = y.data + r * y.ld + c;
    *out = pointwise_of(op, x.data[r * x.ld + c], op == 1 ? dy.data[r * dy.ld + c] : 0.0f,
                        op == 2 ? *out : 0.0f);
  }
}

// The same over contiguous views (ld == cols) of 16-byte-aligned rows, four elements a thread.
__global__ __launch_bounds__(kRowBlock) void pointwise4_kernel(int op, const float4* x,
                                                               const float4* dy, float4* y,
                                                               std::int64_t n4) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; i < n4;
       i += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const float4 v = x[i];
    const float4 g = op == 1 ? dy[i] : float4{};
    const float4 o = op == 2 ? y[i] : float4{};
    y[i] = float4{pointwise_of(op, v.x, g.x, o.x), pointwise_of(op, v.y, g.y, o.y),
                  pointwise_of(op, v.z, g.z, o.z), pointwise_of(op, v.w, g.w, o.w)};
  }
}

// scatter 0: dst(i) = src(index[i]); 1: dst(index[i]) += src(i).
__global__ __launch_bounds__(kRowBlock) void rows_kernel(int scatter, CMat src,
                                                         const std::int64_t* index, Mat dst,
                                                         std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t i = e / cols, c = e - i * cols;
    const std::int64_t r = index[i];
    if (scatter == 0) {
      if (r >= 0 && r < src.rows) dst.data[i * dst.ld + c] = src.data[r * src.ld + c];
    } else if (r >= 0 && r < dst.rows) {
      float* d = dst.data + r * dst.ld + c;
      *d = static_cast<float>(static_cast<double>(*d) + src.data[i * src.ld + c]);
    }
  }
}

// dst(i) = src(index[i]) between element types (each element through float, stored rounded to
// nearest even): fp32 rows into bf16 activations and back.
template <class S, class D>
__global__ __launch_bounds__(kRowBlock) void gather_convert_kernel(
    const S* src, std::int64_t src_rows, std::int64_t src_ld, const std::int64_t* index, D* dst,
    std::int64_t dst_ld, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t i = e / cols, c = e - i * cols;
    const std::int64_t r = index[i];
    if (r >= 0 && r < src_rows)
      dst[i * dst_ld + c] = from_float_rn<D>(to_float(src[r * src_ld + c]));
  }
}

__global__ __launch_bounds__(kRowBlock) void scale_rows_kernel(const float* scale, float alpha,
                                                               Mat x) {
  const std::int64_t n = x.rows * x.cols;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t r = e / x.cols, c = e - r * x.cols;
    const float f = scale == nullptr ? alpha : alpha * scale[r];
    x.data[r * x.ld + c] *= f;
  }
}

struct SumTable {
  std::int64_t rows = 0, weight_offset = 0;
  int dtype = 0;  // 0 fp32, 1 fp16, 2 bf16
  int mean = 0;
};
struct SumTables {
  SumTable t[kMaxSumTables];
  int count = 0;
  const float* f32 = nullptr;
  const F16* f16 = nullptr;
  const Bf16* bf16 = nullptr;
};

__global__ __launch_bounds__(kRowBlock) void embedding_sum_kernel(SumTables tables,
                                                                  const std::int64_t* ids,
                                                                  const std::int64_t* offsets,
                                                                  std::int64_t batch, Mat out) {
  const std::int64_t dim = out.cols, n = batch * dim;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t b = e / dim, d = e - b * dim;
    double acc = 0.0;
    for (int t = 0; t < tables.count; ++t) {
      const SumTable& tb = tables.t[t];
      const std::int64_t lo = offsets[t * batch + b], hi = offsets[t * batch + b + 1];
      double bag = 0.0;
      for (std::int64_t j = lo; j < hi; ++j) {
        const std::int64_t id = ids[j];
        if (id < 0 || id >= tb.rows) continue;
        const std::int64_t at = tb.weight_offset + id * dim + d;
        bag += tb.dtype == 0   ? static_cast<double>(tables.f32[at])
               : tb.dtype == 1 ? static_cast<double>(to_float(tables.f16[at]))
                               : static_cast<double>(to_float(tables.bf16[at]));
      }
      acc += tb.mean && hi > lo ? bag / static_cast<double>(hi - lo) : bag;
    }
    out.data[b * out.ld + d] = static_cast<float>(acc);
  }
}

// The same four columns a thread (dim, every table's offset and out's leading dimension multiples
// of 4, out 16-byte aligned): 16-byte loads of fp32 rows and 8-byte loads of 16-bit ones, where a
// thread an element made 2-byte loads of 16-bit rows. Each element is summed in the same order,
// so the two kernels give the same bits.
__device__ __forceinline__ void load4(const SumTables& tables, const SumTable& tb, std::int64_t at,
                                      float v[4]) {
  if (tb.dtype == 0) {
    const float4 t = *reinterpret_cast<const float4*>(tables.f32 + at);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
    return;
  }
  const uint2 raw =
      *reinterpret_cast<const uint2*>(tb.dtype == 1 ? static_cast<const void*>(tables.f16 + at)
                                                    : static_cast<const void*>(tables.bf16 + at));
  if (tb.dtype == 1) {
    F16 h[4];
    memcpy(h, &raw, sizeof raw);
    for (int k = 0; k < 4; ++k) v[k] = to_float(h[k]);
  } else {
    Bf16 h[4];
    memcpy(h, &raw, sizeof raw);
    for (int k = 0; k < 4; ++k) v[k] = to_float(h[k]);
  }
}

__global__ __launch_bounds__(kRowBlock) void embedding_sum4_kernel(SumTables tables,
                                                                   const std::int64_t* ids,
                                                                   const std::int64_t* offsets,
                                                                   std::int64_t batch, Mat out) {
  const std::int64_t dim = out.cols, quads = dim / 4, n = batch * quads;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kRowBlock + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * kRowBlock) {
    const std::int64_t b = e / quads, d = (e - b * quads) * 4;
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    for (int t = 0; t < tables.count; ++t) {
      const SumTable& tb = tables.t[t];
      const std::int64_t lo = offsets[t * batch + b], hi = offsets[t * batch + b + 1];
      double bag[4] = {0.0, 0.0, 0.0, 0.0};
      for (std::int64_t j = lo; j < hi; ++j) {
        const std::int64_t id = ids[j];
        if (id < 0 || id >= tb.rows) continue;
        float v[4];
        load4(tables, tb, tb.weight_offset + id * dim + d, v);
        for (int k = 0; k < 4; ++k) bag[k] += static_cast<double>(v[k]);
      }
      for (int k = 0; k < 4; ++k)
        acc[k] += tb.mean && hi > lo ? bag[k] / static_cast<double>(hi - lo) : bag[k];
    }
    *reinterpret_cast<float4*>(out.data + b * out.ld + d) =
        float4{static_cast<float>(acc[0]), static_cast<float>(acc[1]), static_cast<float>(acc[2]),
               static_cast<float>(acc[3])};
  }
}

// -------------------------------------------------------------- attention --

struct AttentionArgs {
  const std::int64_t* offsets;
  const std::int64_t* times;
  std::int64_t batch, tokens;
  int targets, heads, a, v, pb, tb;
  float scale, inv_n;
  const float* position;
  const float* time;
};

// The sequence of token i: its first token and length.
__device__ __forceinline__ void find_sequence(const AttentionArgs& g, std::int64_t i,
                                              std::int64_t& begin, std::int64_t& n) {
  std::int64_t lo = 0, hi = g.batch;  // the last b with offsets[b] <= i: i's (empty ones skipped)
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (g.offsets[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  begin = g.offsets[lo];
  n = g.offsets[lo + 1] - begin;
}

__device__ __forceinline__ int time_bucket(const AttentionArgs& g, std::int64_t ti,
                                           std::int64_t tj) {
  const std::int64_t delta = ti > tj ? ti - tj : 0;
  const int width = delta == 0 ? 0 : 64 - __clzll(static_cast<long long>(delta));
  return width < g.tb - 1 ? width : g.tb - 1;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += shfl_xor(kFullMask, v, o);
  return v;
}

// The score of query i (il within its sequence) and key j (jl).
__device__ __forceinline__ float score(const AttentionArgs& g, int h,
                                       const float (&qi)[kMaxPerLane], const float* kj,
                                       std::int64_t il, std::int64_t jl, std::int64_t ti,
                                       std::int64_t tj) {
  const int lane = lane_id();
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < g.a) dot += qi[k] * kj[c];
  }
  dot = warp_sum(dot);
  const std::int64_t dist = il - jl < g.pb - 1 ? il - jl : g.pb - 1;
  return g.scale * dot + g.position[h * g.pb + dist] + g.time[h * g.tb + time_bucket(g, ti, tj)];
}

__device__ __forceinline__ bool visible(std::int64_t il, std::int64_t jl, std::int64_t history) {
  return jl <= il && (jl < history || jl == il);
}

__global__ void attention_forward_kernel(AttentionArgs g, CMat q, CMat k, CMat v, Mat out) {
  const std::int64_t w =
      (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (w >= g.tokens * g.heads) return;
  const std::int64_t i = w / g.heads;
  const int h = static_cast<int>(w - i * g.heads), lane = lane_id();
  std::int64_t begin, n;
  find_sequence(g, i, begin, n);
  const std::int64_t il = i - begin, history = n - g.targets;
  float qi[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    qi[c] = col < g.a ? q.data[i * q.ld + h * g.a + col] : 0.0f;
    acc[c] = 0.0f;
  }
  for (std::int64_t jl = 0; jl <= il; ++jl) {
    if (!visible(il, jl, history)) continue;
    const std::int64_t j = begin + jl;
    const float s = score(g, h, qi, k.data + j * k.ld + h * g.a, il, jl, g.times[i], g.times[j]);
    const float wgt = g.inv_n * s / (1.0f + expf(-s));
    const float* vj = v.data + j * v.ld + h * g.v;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int col = lane + c * kWarpSize;
      if (col < g.v) acc[c] += wgt * vj[col];
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    if (col < g.v) out.data[i * out.ld + h * g.v + col] = acc[c];
  }
}

// dq of query (i, h).
__global__ void attention_dq_kernel(AttentionArgs g, CMat q, CMat k, CMat v, CMat dout, Mat dq) {
  const std::int64_t w =
      (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (w >= g.tokens * g.heads) return;
  const std::int64_t i = w / g.heads;
  const int h = static_cast<int>(w - i * g.heads), lane = lane_id();
  std::int64_t begin, n;
  find_sequence(g, i, begin, n);
  const std::int64_t il = i - begin, history = n - g.targets;
  float qi[kMaxPerLane], gi[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    qi[c] = col < g.a ? q.data[i * q.ld + h * g.a + col] : 0.0f;
    gi[c] = col < g.v ? dout.data[i * dout.ld + h * g.v + col] : 0.0f;
    acc[c] = 0.0f;
  }
  for (std::int64_t jl = 0; jl <= il; ++jl) {
    if (!visible(il, jl, history)) continue;
    const std::int64_t j = begin + jl;
    const float* kj = k.data + j * k.ld + h * g.a;
    const float s = score(g, h, qi, kj, il, jl, g.times[i], g.times[j]);
    const float* vj = v.data + j * v.ld + h * g.v;
    float da = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int col = lane + c * kWarpSize;
      if (col < g.v) da += gi[c] * vj[col];
    }
    da = warp_sum(da);
    const float sg = 1.0f / (1.0f + expf(-s));
    const float ds = g.inv_n * da * sg * (1.0f + s * (1.0f - sg));
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int col = lane + c * kWarpSize;
      if (col < g.a) acc[c] += ds * kj[col];
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    if (col < g.a) dq.data[i * dq.ld + h * g.a + col] = g.scale * acc[c];
  }
}

__device__ __forceinline__ void flush(unsigned long long* total, float run) {
  if (run != 0.0f)
    atomicAdd(total,
              static_cast<unsigned long long>(llrint(static_cast<double>(run) * kFixedScale)));
}

// dk and dv of key (j, h), and its pairs' share of the bias gradients.
__global__ void attention_dkv_kernel(AttentionArgs g, CMat q, CMat k, CMat v, CMat dout, Mat dk,
                                     Mat dv, unsigned long long* dpos, unsigned long long* dtime) {
  const std::int64_t w =
      (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (w >= g.tokens * g.heads) return;
  const std::int64_t j = w / g.heads;
  const int h = static_cast<int>(w - j * g.heads), lane = lane_id();
  std::int64_t begin, n;
  find_sequence(g, j, begin, n);
  const std::int64_t jl = j - begin, history = n - g.targets;
  float kj[kMaxPerLane], vj[kMaxPerLane], ak[kMaxPerLane], av[kMaxPerLane];
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    kj[c] = col < g.a ? k.data[j * k.ld + h * g.a + col] : 0.0f;
    vj[c] = col < g.v ? v.data[j * v.ld + h * g.v + col] : 0.0f;
    ak[c] = av[c] = 0.0f;
  }
  int pos_bucket = -1, time_b = -1;
  float pos_run = 0.0f, time_run = 0.0f;
  // A key is seen by itself, and by every later query when it is history.
  const std::int64_t last = jl < history ? n - 1 : jl;
  for (std::int64_t il = jl; il <= last; ++il) {
    if (!visible(il, jl, history)) continue;
    const std::int64_t i = begin + il;
    const float* qi = q.data + i * q.ld + h * g.a;
    const float* gi = dout.data + i * dout.ld + h * g.v;
    float dot = 0.0f, da = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int col = lane + c * kWarpSize;
      if (col < g.a) dot += qi[col] * kj[c];
      if (col < g.v) da += gi[col] * vj[c];
    }
    dot = warp_sum(dot);
    da = warp_sum(da);
    const int p = static_cast<int>(il - jl < g.pb - 1 ? il - jl : g.pb - 1);
    const int tbk = time_bucket(g, g.times[i], g.times[j]);
    const float s = g.scale * dot + g.position[h * g.pb + p] + g.time[h * g.tb + tbk];
    const float sg = 1.0f / (1.0f + expf(-s));
    const float ds = g.inv_n * da * sg * (1.0f + s * (1.0f - sg));
    const float wgt = g.inv_n * s * sg;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int col = lane + c * kWarpSize;
      if (col < g.a) ak[c] += ds * qi[col];
      if (col < g.v) av[c] += wgt * gi[col];
    }
    if (lane == 0) {
      if (p != pos_bucket) {
        if (pos_bucket >= 0) flush(dpos + h * g.pb + pos_bucket, pos_run);
        pos_bucket = p;
        pos_run = 0.0f;
      }
      pos_run += ds;
      if (tbk != time_b) {
        if (time_b >= 0) flush(dtime + h * g.tb + time_b, time_run);
        time_b = tbk;
        time_run = 0.0f;
      }
      time_run += ds;
    }
  }
  if (lane == 0) {
    if (pos_bucket >= 0) flush(dpos + h * g.pb + pos_bucket, pos_run);
    if (time_b >= 0) flush(dtime + h * g.tb + time_b, time_run);
  }
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int col = lane + c * kWarpSize;
    if (col < g.a) dk.data[j * dk.ld + h * g.a + col] = g.scale * ak[c];
    if (col < g.v) dv.data[j * dv.ld + h * g.v + col] = av[c];
  }
}

__global__ void zero_kernel(unsigned long long* p, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = 0;
}

__global__ void fixed_to_float_kernel(const unsigned long long* p, std::int64_t n, float* out) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(static_cast<double>(static_cast<long long>(p[i])) / kFixedScale);
}

AttentionArgs attention_args(const SequenceBatch& seq, const HstuAttention& att) {
  if (att.attention_dim > kMaxPerLane * 32 || att.value_dim > kMaxPerLane * 32)
    throw Error("hstu_attention: attention_dim " + std::to_string(att.attention_dim) +
                " and value_dim " + std::to_string(att.value_dim) + " must be at most " +
                std::to_string(kMaxPerLane * 32) + " on the GPU");
  return {seq.offsets,          seq.timestamps,   seq.batch,         seq.tokens,
          seq.targets,          att.heads,        att.attention_dim, att.value_dim,
          att.position_buckets, att.time_buckets, att.scale,         att.inv_n,
          att.position,         att.time};
}

// Blocks of kNormBlock threads for a warp per row.
std::int64_t norm_grid(std::int64_t rows) {
  return grid_of(rows, kNormBlock / device_info().warp_size);
}
bool flat(CMat m) {
  return m.ld == m.cols || m.rows <= 1;
}

std::int64_t warp_grid(const AttentionArgs& g, int block) {
  const std::int64_t warps_per_block = block / device_info().warp_size;
  return (g.tokens * g.heads + warps_per_block - 1) / warps_per_block;
}

}  // namespace

namespace {
// Which row kernel serves rows of `cols` columns: n = 0 the looping one (rows wider than the
// warp's registers hold), else the cached one with n values a lane, 16 bytes at a time (v = 4)
// where every view's start and leading dimension allow it, else an element at a time (v = 1).
struct RowShape {
  int v = 1, n = 0;
};
RowShape norm_path(std::int64_t cols,
                   std::initializer_list<std::pair<const float*, std::int64_t>> views) {
  const std::int64_t per_lane = ceil_div(cols, device_info().warp_size);
  if (per_lane > kRowCache) return {};
  RowShape r{4, per_lane <= 4 ? 4 : per_lane <= 8 ? 8 : 16};
  if (cols % 4 != 0) r.v = 1;
  for (const auto& [p, ld] : views)
    if (p != nullptr && (reinterpret_cast<std::uintptr_t>(p) % 16 != 0 || ld % 4 != 0)) r.v = 1;
  return r;
}

// f(V, N) with V and N as std::integral_constant, for a RowShape with n > 0.
template <class F>
void with_row_shape(RowShape r, F&& f) {
  using std::integral_constant;
  auto per_lane = [&](auto v) {
    if (r.n == 4) return f(v, integral_constant<int, 4>{});
    if (r.n == 8) return f(v, integral_constant<int, 8>{});
    return f(v, integral_constant<int, 16>{});
  };
  if (r.v == 4) return per_lane(integral_constant<int, 4>{});
  return per_lane(integral_constant<int, 1>{});
}

void norm_forward(Stream_t s, const char* name, CMat x, const float* gamma, const float* beta,
                  CMat u, float eps, Mat y, float* mean, float* rstd) {
  if (x.rows == 0) return;
  const LaunchShape shape{norm_grid(x.rows), kNormBlock, 0};
  const RowShape r = norm_path(x.cols, {{x.data, x.ld}, {u.data, u.ld}, {y.data, y.ld}});
  if (r.n == 0)
    return launch(name, norm_forward_kernel, shape, s, x, gamma, beta, u, eps, y, mean, rstd);
  with_row_shape(r, [&](auto v, auto n) {
    launch(name, norm_forward_cached_kernel<decltype(v)::value, decltype(n)::value>, shape, s, x,
           gamma, beta, u, eps, y, mean, rstd);
  });
}

void norm_backward(Stream_t s, const char* name, CMat x, const float* gamma, CMat u,
                   const float* mean, const float* rstd, CMat dy, Mat dx, Mat du, float* prod) {
  if (x.rows == 0) return;
  const LaunchShape shape{norm_grid(x.rows), kNormBlock, 0};
  const RowShape r = norm_path(x.cols, {{x.data, x.ld},
                                        {u.data, u.ld},
                                        {dy.data, dy.ld},
                                        {dx.data, dx.ld},
                                        {du.data, du.ld},
                                        {prod, x.cols}});
  if (r.n == 0)
    return launch(name, norm_backward_kernel, shape, s, x, gamma, u, mean, rstd, dy, dx, du, prod);
  with_row_shape(r, [&](auto v, auto n) {
    launch(name, norm_backward_cached_kernel<decltype(v)::value, decltype(n)::value>, shape, s, x,
           gamma, u, mean, rstd, dy, dx, du, prod);
  });
}
}  // namespace

void layer_norm_forward(Stream_t s, CMat x, const float* gamma, const float* beta, float eps, Mat y,
                        float* mean, float* rstd) {
  norm_forward(s, "layer_norm_forward", x, gamma, beta, CMat{}, eps, y, mean, rstd);
}

std::int64_t layer_norm_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  return (rows * cols * 4 + 7) / 8 * 8 + column_sum_scratch_bytes(rows, cols);
}

void layer_norm_backward(Stream_t s, CMat x, const float* gamma, const float* mean,
                         const float* rstd, CMat dy, Mat dx, float* dgamma, float* dbeta,
                         void* scratch) {
  auto* prod = static_cast<float*>(scratch);
  void* sums = static_cast<char*>(scratch) + (x.rows * x.cols * 4 + 7) / 8 * 8;
  norm_backward(s, "layer_norm_backward", x, gamma, CMat{}, mean, rstd, dy, dx, Mat{},
                dgamma != nullptr ? prod : nullptr);
  if (dgamma != nullptr) column_sum(s, CMat(prod, x.rows, x.cols), dgamma, sums);
  if (dbeta != nullptr) column_sum(s, dy, dbeta, sums);
}

void norm_mul_forward(Stream_t s, CMat x, CMat u, float eps, Mat y, float* mean, float* rstd) {
  norm_forward(s, "norm_mul_forward", x, nullptr, nullptr, u, eps, y, mean, rstd);
}

void norm_mul_backward(Stream_t s, CMat x, CMat u, const float* mean, const float* rstd, CMat dy,
                       Mat dx, Mat du) {
  norm_backward(s, "norm_mul_backward", x, nullptr, u, mean, rstd, dy, dx, du, nullptr);
}

namespace {
// Four at a time where every view is contiguous and 16-byte aligned.
void pointwise(Stream_t s, const char* name, int op, CMat x, CMat dy, Mat y) {
  const std::int64_t n = x.rows * x.cols;
  if (n == 0) return;
  auto aligned = [](const float* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (n % 4 == 0 && flat(x) && flat(y) && aligned(x.data) && aligned(y.data) &&
      (op != 1 || (flat(dy) && aligned(dy.data)))) {
    launch(name, pointwise4_kernel, {grid_of(n / 4, kRowBlock), kRowBlock, 0}, s, op,
           reinterpret_cast<const float4*>(x.data),
           reinterpret_cast<const float4*>(op == 1 ? dy.data : x.data),
           reinterpret_cast<float4*>(y.data), n / 4);
    return;
  }
  launch(name, pointwise_kernel, {grid_of(n, kRowBlock), kRowBlock, 0}, s, op, x, dy, y);
}
}  // namespace

void silu_forward(Stream_t s, CMat x, Mat y) {
  pointwise(s, "silu_forward", 0, x, CMat{}, y);
}
void silu_backward(Stream_t s, CMat x, CMat dy, Mat dx) {
  pointwise(s, "silu_backward", 1, x, dy, dx);
}
void add_into(Stream_t s, CMat x, Mat y) {
  pointwise(s, "add_into", 2, x, CMat{}, y);
}

void gather_rows(Stream_t s, CMat src, const std::int64_t* index, Mat dst) {
  launch("gather_rows", rows_kernel, {grid_of(dst.rows * dst.cols, kRowBlock), kRowBlock, 0}, s, 0,
         src, index, dst, dst.rows, dst.cols);
}
namespace {
// f(T{}) with T the element type of dtype t (fp32, fp16 or bf16).
template <class F>
void with_element(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(F16{});
    case DType::bf16:
      return f(Bf16{});
    default:
      throw Error("gather_rows: rows of " + std::string(dtype_name(t)) +
                  ", where fp32, fp16 or bf16 were expected");
  }
}
}  // namespace

void gather_rows(Stream_t s, CAMat src, const std::int64_t* index, AMat dst) {
  if (src.is_f32() && dst.is_f32()) return gather_rows(s, src.f32(), index, dst.f32());
  if (dst.rows * dst.cols == 0) return;
  with_element(src.dtype, [&](auto from) {
    with_element(dst.dtype, [&](auto to) {
      using S = decltype(from);
      using D = decltype(to);
      launch("gather_rows", gather_convert_kernel<S, D>,
             {grid_of(dst.rows * dst.cols, kRowBlock), kRowBlock, 0}, s,
             static_cast<const S*>(src.data), src.rows, src.ld, index, static_cast<D*>(dst.data),
             dst.ld, dst.rows, dst.cols);
    });
  });
}

void scale_rows(Stream_t s, const float* scale, float alpha, Mat x) {
  if (x.rows * x.cols == 0) return;
  launch("scale_rows", scale_rows_kernel, {grid_of(x.rows * x.cols, kRowBlock), kRowBlock, 0}, s,
         scale, alpha, x);
}
void scatter_add_rows(Stream_t s, CMat src, const std::int64_t* index, Mat dst) {
  launch("scatter_add_rows", rows_kernel, {grid_of(src.rows * src.cols, kRowBlock), kRowBlock, 0},
         s, 1, src, index, dst, src.rows, src.cols);
}

std::int64_t embedding_sum_scratch_bytes(std::size_t) {
  return 0;
}

void embedding_sum_forward(Stream_t s, std::span<const TableLayout> tables,
                           const TableWeights& weights, const SparseInput& in, Mat out, void*) {
  constexpr const char* op = "embedding_sum_forward";
  if (tables.size() > static_cast<std::size_t>(kMaxSumTables))
    throw Error(std::string(op) + ": " + std::to_string(tables.size()) + " tables, at most " +
                std::to_string(kMaxSumTables) + " on the GPU");
  SumTables st;
  st.count = static_cast<int>(tables.size());
  st.f32 = static_cast<const float*>(weights.f32);
  st.f16 = static_cast<const F16*>(weights.f16);
  st.bf16 = static_cast<const Bf16*>(weights.bf16);
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const TableLayout& tl = tables[t];
    if (tl.host_placed())
      throw Error(std::string(op) + ": table " + std::to_string(t) +
                  " is host-placed, which the GPU op does not read");
    st.t[t] = {tl.rows, tl.weight_offset,
               tl.dtype == DType::f32   ? 0
               : tl.dtype == DType::f16 ? 1
                                        : 2,
               tl.pooling == Pooling::mean ? 1 : 0};
  }
  bool by4 =
      out.cols % 4 == 0 && out.ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(out.data) % 16 == 0;
  for (int t = 0; t < st.count; ++t) by4 = by4 && st.t[t].weight_offset % 4 == 0;
  if (by4)
    return launch("embedding_sum_forward", embedding_sum4_kernel,
                  {grid_of(in.batch * out.cols / 4, kRowBlock), kRowBlock, 0}, s, st, in.ids,
                  in.offsets, in.batch, out);
  launch("embedding_sum_forward", embedding_sum_kernel,
         {grid_of(in.batch * out.cols, kRowBlock), kRowBlock, 0}, s, st, in.ids, in.offsets,
         in.batch, out);
}

void hstu_attention_forward(Stream_t s, const SequenceBatch& seq, const HstuAttention& att, CMat q,
                            CMat k, CMat v, Mat out) {
  const AttentionArgs g = attention_args(seq, att);
  if (g.tokens == 0) return;
  launch("hstu_attention_forward", attention_forward_kernel,
         {warp_grid(g, kRowBlock), kRowBlock, 0}, s, g, q, k, v, out);
}

std::int64_t attention_scratch_bytes(const HstuAttention& att) {
  return static_cast<std::int64_t>(att.heads) * (att.position_buckets + att.time_buckets) * 8;
}

void hstu_attention_backward(Stream_t s, const SequenceBatch& seq, const HstuAttention& att, CMat q,
                             CMat k, CMat v, CMat dout, Mat dq, Mat dk, Mat dv, float* dposition,
                             float* dtime, void* scratch) {
  const AttentionArgs g = attention_args(seq, att);
  auto* fixed = static_cast<unsigned long long*>(scratch);
  const std::int64_t np = static_cast<std::int64_t>(g.heads) * g.pb,
                     nt = static_cast<std::int64_t>(g.heads) * g.tb;
  launch("hstu_attention_zero", zero_kernel, {grid_of(np + nt, kRowBlock), kRowBlock, 0}, s, fixed,
         np + nt);
  if (g.tokens > 0) {
    launch("hstu_attention_dq", attention_dq_kernel, {warp_grid(g, kRowBlock), kRowBlock, 0}, s, g,
           q, k, v, dout, dq);
    launch("hstu_attention_dkv", attention_dkv_kernel, {warp_grid(g, kRowBlock), kRowBlock, 0}, s,
           g, q, k, v, dout, dk, dv, fixed, fixed + np);
  }
  launch("hstu_attention_bias_position", fixed_to_float_kernel,
         {grid_of(np, kRowBlock), kRowBlock, 0}, s, static_cast<const unsigned long long*>(fixed),
         np, dposition);
  launch("hstu_attention_bias_time", fixed_to_float_kernel, {grid_of(nt, kRowBlock), kRowBlock, 0},
         s, static_cast<const unsigned long long*>(fixed + np), nt, dtime);
}

}  // namespace parity::gpu
