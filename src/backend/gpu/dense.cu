// Kernels of the dense path that are not matrix products (see dense.h for the contract).
//
// Why it is built this way:
// - Elementwise ops walk rows (for_each_element below); each output depends only on its own
//   inputs, so the grid shape never changes a result. Where the CPU reference
//   forms a value in double from fp32 inputs and rounds once (the loss, sigmoid, the optimizers,
//   x0 ⊙ z + xl, dx0 += g ⊙ z, y += x), these kernels do the same, so they agree with it bit for
//   bit or within an ulp; the H200's double rate is far above what these memory-bound loops need.
// - Reductions never use atomics: a first pass writes one double partial per (chunk, column) or
//   per block in a fixed order, a second pass adds the partials in index order. The split depends
//   only on the shape, so the same inputs give the same bits on every run.
// - The dot interaction is, per example, a Gram matrix of F <= ~30 feature vectors of D <= 256:
//   far too small for a library call per example. One block holds one example's features in
//   shared memory (rows padded to D + 1 floats so that threads working on different pairs hit
//   different banks) and its threads take the pairs (forward) or the (feature, column) outputs
//   (backward); each sum runs in ascending order in fp32.
// - No warp-level primitives: block reductions go through shared memory, so the file is the same
//   for 32- and 64-lane warps.
#include "backend/gpu/dense.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu::dense {

namespace {

constexpr int kBlock = 256;
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 20;

std::int64_t grid_for(std::int64_t n) { return std::max<std::int64_t>(1, std::min(ceil_div(n, kBlock), kMaxGrid)); }

__device__ __forceinline__ std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ double stable_sigmoid(double z) {
  if (z >= 0.0) return 1.0 / (1.0 + exp(-z));
  const double e = exp(z);
  return e / (1.0 + e);
}
__device__ __forceinline__ double softplus(double z) { return fmax(z, 0.0) + log1p(exp(-fabs(z))); }

// Elementwise kernels over [rows, cols] views walk rows, not a flat index: a flat index would need
// a 64-bit division per element to find (row, column), which costs more than the memory traffic
// on a [65536, 3456] activation (measured: 1.4 ms instead of 0.35 ms for one bf16 conversion).
// A row is taken by `tpr` consecutive threads (a power of two up to the block), so loads are
// coalesced; a block holds kBlock / tpr rows at a time.
struct RowSpan {
  int tpr = kBlock;  // threads per row
  int rpb = 1;       // rows per block step
};
RowSpan row_span(std::int64_t cols) {
  RowSpan r;
  int t = 1;
  while (t < kBlock && t < cols) t *= 2;
  r.tpr = t;
  r.rpb = kBlock / t;
  return r;
}
std::int64_t row_grid(std::int64_t rows, RowSpan span) {
  return std::max<std::int64_t>(1, std::min(ceil_div(rows, span.rpb), kMaxGrid));
}

// Calls f(r, c) for every group of V consecutive elements of a row (c = the group's first column,
// cols a multiple of V), each thread a fixed set of groups. V = 4 lets the kernels move 16 bytes per
// load where every view is 16-byte aligned (V = 8: 16 bytes of bf16; checked on the host: vec_width).
template <int V, class F>
__device__ __forceinline__ void for_each_element(std::int64_t rows, std::int64_t cols, RowSpan span, F&& f) {
  const int sub = static_cast<int>(threadIdx.x) / span.tpr;  // once per thread, small ints
  const int c0 = static_cast<int>(threadIdx.x) - sub * span.tpr;
  const std::int64_t groups = cols / V;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * span.rpb;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * span.rpb + sub; r < rows; r += step) {
#pragma unroll 4
    for (std::int64_t g = c0; g < groups; g += span.tpr) f(r, g * V);
  }
}

template <int V>
struct Floats {
  float v[V];
};
template <int V>
__device__ __forceinline__ Floats<V> load(const float* p) {
  Floats<V> x;
  if constexpr (V == 4 || V == 8) {
#pragma unroll
    for (int h = 0; h < V; h += 4) {
      const float4 t = *reinterpret_cast<const float4*>(p + h);
      x.v[h] = t.x, x.v[h + 1] = t.y, x.v[h + 2] = t.z, x.v[h + 3] = t.w;
    }
  } else {
    for (int i = 0; i < V; ++i) x.v[i] = p[i];
  }
  return x;
}
template <int V>
__device__ __forceinline__ void store(float* p, const Floats<V>& x) {
  if constexpr (V == 4 || V == 8) {
#pragma unroll
    for (int h = 0; h < V; h += 4)
      *reinterpret_cast<float4*>(p + h) = make_float4(x.v[h], x.v[h + 1], x.v[h + 2], x.v[h + 3]);
  } else {
    for (int i = 0; i < V; ++i) p[i] = x.v[i];
  }
}
template <int V>
__device__ __forceinline__ Floats<V> load(const std::uint16_t* p) {  // bf16 bits
  Floats<V> x;
  if constexpr (V == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x.v[2 * i] = __uint_as_float(w[i] << 16);
      x.v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else if constexpr (V == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    x.v[0] = __uint_as_float(u.x << 16), x.v[1] = __uint_as_float(u.x & 0xffff0000u);
    x.v[2] = __uint_as_float(u.y << 16), x.v[3] = __uint_as_float(u.y & 0xffff0000u);
  } else {
    for (int i = 0; i < V; ++i) x.v[i] = __uint_as_float(static_cast<std::uint32_t>(p[i]) << 16);
  }
  return x;
}
template <int V>
__device__ __forceinline__ void store_bf16(std::uint16_t* p, const Floats<V>& x) {
  if constexpr (V == 8) {
    std::uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = static_cast<std::uint32_t>(bf16_bits_rn(x.v[2 * i])) |
             static_cast<std::uint32_t>(bf16_bits_rn(x.v[2 * i + 1])) << 16;
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (V == 4) {
    uint2 u;
    u.x = static_cast<std::uint32_t>(bf16_bits_rn(x.v[0])) | static_cast<std::uint32_t>(bf16_bits_rn(x.v[1])) << 16;
    u.y = static_cast<std::uint32_t>(bf16_bits_rn(x.v[2])) | static_cast<std::uint32_t>(bf16_bits_rn(x.v[3])) << 16;
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    for (int i = 0; i < V; ++i) p[i] = bf16_bits_rn(x.v[i]);
  }
}
// Activations stored in bf16 are written with the same rule as every other bf16 copy.
template <int V>
__device__ __forceinline__ void store(std::uint16_t* p, const Floats<V>& x) {
  store_bf16<V>(p, x);
}

// A device view of an activation stored as S (float, or std::uint16_t for bf16 bits).
template <class S>
MatView<const S> typed(CAMat m) {
  return {static_cast<const S*>(m.data), m.rows, m.cols, m.ld};
}
template <class S>
MatView<S> typed(AMat m) {
  return {static_cast<S*>(m.data), m.rows, m.cols, m.ld};
}

// The widest group of elements every view can be read in: 8 (16 bytes of bf16, two 16-byte loads
// of fp32), 4 (16 bytes of fp32, 8 of bf16) or 1. A width w needs cols and every ld multiples of w
// and every base aligned to min(w elements, 16 bytes). 16-byte loads of bf16 data matter on
// [65536, 3456] activations: 8-byte loads left the cross layer's gradient pass at 3.2-3.4 TB/s.
struct VecView {
  const void* p;
  std::int64_t ld;
  std::int64_t bytes = 4;  // per element
};
bool width_ok(int w, std::int64_t cols, std::initializer_list<VecView> views) {
  if (cols % w != 0) return false;
  for (const VecView& v : views) {
    if (v.p == nullptr) continue;
    const auto align = static_cast<std::uintptr_t>(std::min<std::int64_t>(w * v.bytes, 16));
    if (reinterpret_cast<std::uintptr_t>(v.p) % align != 0 || v.ld % w != 0) return false;
  }
  return true;
}
int vec_width(std::int64_t cols, std::initializer_list<VecView> views) {
  return width_ok(8, cols, views) ? 8 : width_ok(4, cols, views) ? 4 : 1;
}
VecView vec_view(CAMat m) { return {m.data, m.ld, static_cast<std::int64_t>(m.element_bytes())}; }
VecView bf16_packed(const std::uint16_t* p, std::int64_t cols) { return {p, cols, 2}; }

// f(std::integral_constant<int, V>) with V = width (8, 4 or 1: vec_width).
template <class F>
void with_width(int width, F&& f) {
  if (width == 8)
    f(std::integral_constant<int, 8>{});
  else if (width == 4)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 1>{});
}
// f(S{}) with S the element type of activations stored as t: std::uint16_t (bf16 bits) or float.
template <class F>
void with_storage(const char* op, DType t, F&& f) {
  if (t == DType::bf16)
    f(std::uint16_t{});
  else if (t == DType::f32)
    f(float{});
  else
    throw Error(cat(op, ": activations stored as ", dtype_name(t), "; fp32 or bf16 expected"));
}

// ------------------------------------------------------------------ fills --

__global__ __launch_bounds__(kBlock) void fill_kernel(float* __restrict__ p, std::int64_t n, float value) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) p[i] = value;
}

template <int kKind>  // 0 bf16, 1 f16
__global__ __launch_bounds__(kBlock) void round_kernel(float* __restrict__ p, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const float v = p[i];
    if (v != v) continue;  // NaN stays as it is
    if constexpr (kKind == 0) {
      std::uint32_t u = __float_as_uint(v);
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even on the top 16 bits (dtype.cpp)
      p[i] = __uint_as_float(u & 0xffff0000u);
    } else {
      p[i] = half_bits_to_float(float_to_half_bits_rn(v));  // IEEE binary16, nearest even, overflow to inf
    }
  }
}

template <int V, class A, class B>
__global__ __launch_bounds__(kBlock) void convert_kernel(MatView<const A> src, MatView<B> dst, RowSpan span) {
  for_each_element<V>(src.rows, src.cols, span, [&](std::int64_t r, std::int64_t c) {
    store<V>(dst.data + r * dst.ld + c, load<V>(src.data + r * src.ld + c));
  });
}

// ------------------------------------------------- around matrix products --

template <int V, class S, class G>
__global__ __launch_bounds__(kBlock) void relu_backward_kernel(MatView<const S> y, MatView<const G> dy, float* __restrict__ dz,
                                                               std::uint16_t* __restrict__ dz16, RowSpan span) {
  for_each_element<V>(y.rows, y.cols, span, [&](std::int64_t r, std::int64_t c) {
    const Floats<V> yv = load<V>(y.data + r * y.ld + c);
    Floats<V> v = load<V>(dy.data + r * dy.ld + c);
    for (int i = 0; i < V; ++i) v.v[i] = yv.v[i] > 0.0f ? v.v[i] : 0.0f;
    const std::int64_t at = r * y.cols + c;
    store<V>(dz + at, v);
    if (dz16 != nullptr) store_bf16<V>(dz16 + at, v);
  });
}

template <int V>
__global__ __launch_bounds__(kBlock) void to_bf16_kernel(CMat src, std::uint16_t* __restrict__ dst, std::int64_t dst_ld,
                                                          RowSpan span) {
  for_each_element<V>(src.rows, src.cols, span, [&](std::int64_t r, std::int64_t c) {
    store_bf16<V>(dst + r * dst_ld + c, load<V>(src.data + r * src.ld + c));
  });
}

__global__ __launch_bounds__(kBlock) void gemm_empty_k_kernel(std::int64_t m, std::int64_t n, float beta,
                                                              float* __restrict__ d, std::int64_t ldd,
                                                              const float* __restrict__ bias, bool relu) {
  const std::int64_t total = m * n;
  for (std::int64_t i = global_index(); i < total; i += grid_stride()) {
    const std::int64_t r = i / n, c = i - r * n;
    float v = beta != 0.0f ? beta * d[r * ldd + c] : 0.0f;
    if (bias != nullptr) v += bias[c];
    if (relu && !(v > 0.0f)) v = 0.0f;
    d[r * ldd + c] = v;
  }
}

// d = bf16((add ? d : 0) + bias) (relu) over a bf16 [m, n] output: an empty-k product (add false)
// or the unfused epilogue of a bf16-output product (add true).
__global__ __launch_bounds__(kBlock) void epilogue_bf16_kernel(std::int64_t m, std::int64_t n, bool add,
                                                               std::uint16_t* __restrict__ d, std::int64_t ldd,
                                                               const std::uint16_t* __restrict__ bias, bool relu) {
  const std::int64_t total = m * n;
  for (std::int64_t i = global_index(); i < total; i += grid_stride()) {
    const std::int64_t r = i / n, c = i - r * n;
    float v = add ? __uint_as_float(static_cast<std::uint32_t>(d[r * ldd + c]) << 16) : 0.0f;
    if (bias != nullptr) v += __uint_as_float(static_cast<std::uint32_t>(bias[c]) << 16);
    if (relu && !(v > 0.0f)) v = 0.0f;
    d[r * ldd + c] = bf16_bits_rn(v);
  }
}

// ------------------------------------------------------------ column sums --
// Pass 1: block = 32 columns x 8 row lanes over one chunk of rows; partial[chunk, col] in double.

constexpr int kColTile = 32;
constexpr int kRowLanes = kBlock / kColTile;
constexpr std::int64_t kRowsPerChunkMin = 64;
constexpr std::int64_t kMaxChunks = 1024;

struct ColumnSplit {
  std::int64_t chunks = 1;
  std::int64_t rows_per_chunk = 1;
  std::int64_t col_tiles = 1;
};
ColumnSplit column_split(std::int64_t rows, std::int64_t cols) {
  ColumnSplit s;
  s.chunks = std::clamp<std::int64_t>(ceil_div(rows, kRowsPerChunkMin), 1, kMaxChunks);
  s.rows_per_chunk = std::max<std::int64_t>(1, ceil_div(rows, s.chunks));
  s.chunks = std::max<std::int64_t>(1, ceil_div(rows, s.rows_per_chunk));
  s.col_tiles = ceil_div(cols, kColTile);
  return s;
}

__global__ __launch_bounds__(kBlock) void column_partial_kernel(CMat m, std::int64_t col_tiles,
                                                                std::int64_t rows_per_chunk,
                                                                double* __restrict__ partial) {
  __shared__ double sh[kRowLanes][kColTile];
  const std::int64_t tile = blockIdx.x % col_tiles;
  const std::int64_t chunk = blockIdx.x / col_tiles;
  const int tx = static_cast<int>(threadIdx.x) % kColTile;
  const int ly = static_cast<int>(threadIdx.x) / kColTile;
  const std::int64_t c = tile * kColTile + tx;
  const std::int64_t r0 = chunk * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < m.rows ? r0 + rows_per_chunk : m.rows;
  double acc = 0.0;
  if (c < m.cols) {
    for (std::int64_t r = r0 + ly; r < r1; r += kRowLanes) acc += static_cast<double>(m.data[r * m.ld + c]);
  }
  sh[ly][tx] = acc;
  __syncthreads();
  if (ly == 0 && c < m.cols) {
    double t = sh[0][tx];
    for (int k = 1; k < kRowLanes; ++k) t += sh[k][tx];
    partial[chunk * m.cols + c] = t;
  }
}

// Columns per block of pass 2 (column_final_kernel): enough lanes per column that each adds about
// kPartialsPerLane partials (a 1024-chunk sum split 8 ways was 55 us per call, latency-bound on a
// few dozen blocks), then as many columns as the block has room for (at most kColTile).
constexpr std::int64_t kPartialsPerLane = 16;
int final_columns_per_block(std::int64_t chunks, std::int64_t cols) {
  int lanes = 1;
  while (lanes < kBlock && lanes * kPartialsPerLane < chunks) lanes *= 2;
  int cpb = 1;
  while (cpb < kColTile && cpb < cols && cpb * 2 * lanes <= kBlock) cpb *= 2;
  return cpb;
}

// Pass 2: a block takes `cpb` columns (a power of two up to 32); its kBlock / cpb lanes per column
// add strided subsets of the chunks in index order, then a fixed tree in shared memory adds the
// lanes: the same order on every run, and enough threads that a [B, 1] column is not a
// 1024-step serial loop (measured 0.2 ms per call before).
__global__ __launch_bounds__(kBlock) void column_final_kernel(const double* __restrict__ partial, std::int64_t chunks,
                                                              std::int64_t cols, int cpb, float* __restrict__ out) {
  __shared__ double sh[kBlock];
  const int lanes = kBlock / cpb;
  const int lane = static_cast<int>(threadIdx.x) / cpb;
  const int tx = static_cast<int>(threadIdx.x) - lane * cpb;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * cpb + tx;
  double t = 0.0;
  if (c < cols) {
#pragma unroll 4
    for (std::int64_t k = lane; k < chunks; k += lanes) t += partial[k * cols + c];
  }
  sh[threadIdx.x] = t;
  __syncthreads();
  for (int half = lanes / 2; half > 0; half /= 2) {
    if (lane < half) sh[threadIdx.x] += sh[threadIdx.x + half * cpb];
    __syncthreads();
  }
  if (lane == 0 && c < cols) out[c] = static_cast<float>(sh[threadIdx.x]);
}

// ------------------------------------------------------------ cross layer --

template <int V, class S>
__global__ __launch_bounds__(kBlock) void cross_combine_kernel(MatView<const S> x0, MatView<const S> z,
                                                               MatView<const S> xl, MatView<S> x_next, RowSpan span) {
  for_each_element<V>(x0.rows, x0.cols, span, [&](std::int64_t r, std::int64_t c) {
    const Floats<V> a = load<V>(x0.data + r * x0.ld + c);
    const Floats<V> b = load<V>(z.data + r * z.ld + c);
    Floats<V> o = load<V>(xl.data + r * xl.ld + c);
    for (int i = 0; i < V; ++i)
      o.v[i] = static_cast<float>(static_cast<double>(a.v[i]) * static_cast<double>(b.v[i]) + static_cast<double>(o.v[i]));
    store<V>(x_next.data + r * x_next.ld + c, o);
  });
}


// The same with dz's column sums (the bias gradient) folded in, so dz is not read again. Each
// thread owns one group of V columns of a row lane and keeps its column sums in double across the
// rows it visits: a block of kSumBlock threads holds kSumBlock / tpr row lanes (tpr = threads per
// row, a power of two covering the row's groups), lane l of block b takes rows
// b * rpb + l, + grid * rpb, ... and writes one double partial per column at the end;
// column_final adds the lanes' partials in a fixed order. One group per thread keeps the
// accumulators to V doubles: with four groups per thread in 256-thread blocks (16 doubles) the
// pass over [65536, 3456] ran at 3.2-3.4 TB/s, bounded by the warps in flight (ncu, 2026-11-29).
constexpr int kSumBlock = 1024;
constexpr std::int64_t kSumLanes = 1024;  // row lanes in all (partial sums per column)

struct FoldShape {
  int tpr = 1, rpb = 1;
  std::int64_t grid = 1;
  std::int64_t lanes() const { return grid * rpb; }
};
bool fused_sum_fits(std::int64_t rows, std::int64_t cols, int v) {
  // The row walk counts in int and steps by at most 2 kSumLanes past the last row.
  return cols / v <= kSumBlock && rows <= std::numeric_limits<int>::max() - 2 * kSumLanes;
}
FoldShape fold_shape(std::int64_t rows, std::int64_t cols, int v) {
  FoldShape f;
  while (f.tpr < kSumBlock && f.tpr < cols / v) f.tpr *= 2;
  f.rpb = kSumBlock / f.tpr;
  f.grid = std::max<std::int64_t>(1, ceil_div(std::min(std::max<std::int64_t>(rows, 1), kSumLanes), f.rpb));
  return f;
}

// The row walk of the folded kernels (see above): calls f(r, c) -> Floats<V> for the thread's group
// of every row it visits and writes its lane's column sums of what f returns,
// partial[lane * cols + col].
template <int V, class F>
__device__ __forceinline__ void rows_with_column_sums(std::int64_t rows, std::int64_t cols, int tpr,
                                                      double* __restrict__ partial, F&& f) {
  const int sub = static_cast<int>(threadIdx.x) / tpr;
  const int grp = static_cast<int>(threadIdx.x) - sub * tpr;
  const int rpb = kSumBlock / tpr;
  if (static_cast<std::int64_t>(grp) * V >= cols) return;
  // 32-bit row indices (the lanes and the grid are small; rows fit an int: a [2^31, ·] activation
  // would not fit a device): fewer registers under the 64 a 1024-thread block allows.
  const int lane = static_cast<int>(blockIdx.x) * rpb + sub;
  const int c = grp * V;
  double acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0;
  const int step = static_cast<int>(gridDim.x) * rpb;
  const int nrows = static_cast<int>(rows);
  for (int r = lane; r < nrows; r += step) {
    const Floats<V> d = f(r, c);
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] += static_cast<double>(d.v[i]);
  }
#pragma unroll
  for (int i = 0; i < V; ++i) partial[static_cast<std::int64_t>(lane) * cols + c + i] = acc[i];
}

// One group of the cross-layer gradients: dz = g ⊙ x0 (returned), dx0 (+)= g ⊙ z (+ g).
template <int V, class S, class G>
__device__ __forceinline__ Floats<V> cross_gradient_group(MatView<const G> g, MatView<const S> x0, MatView<const S> z,
                                                          float* __restrict__ dz, std::uint16_t* __restrict__ dz16,
                                                          MatView<G> dx0, CrossGradientFlags flags, std::int64_t r,
                                                          std::int64_t c) {
  const Floats<V> gv = load<V>(g.data + r * g.ld + c);
  const Floats<V> xv = load<V>(x0.data + r * x0.ld + c);
  const Floats<V> zv = load<V>(z.data + r * z.ld + c);
  G* o = dx0.data + r * dx0.ld + c;
  Floats<V> a;
  if (flags.overwrite) {
#pragma unroll
    for (int i = 0; i < V; ++i) a.v[i] = 0.0f;
  } else {
    a = load<V>(o);
  }
  Floats<V> d;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const double gi = gv.v[i];
    d.v[i] = static_cast<float>(gi * static_cast<double>(xv.v[i]));
    a.v[i] = static_cast<float>(static_cast<double>(a.v[i]) + gi * static_cast<double>(zv.v[i]) + (flags.add_g ? gi : 0.0));
  }
  const std::int64_t at = r * g.cols + c;
  if (!flags.dz_bf16_only) store<V>(dz + at, d);
  if (dz16 != nullptr) store_bf16<V>(dz16 + at, d);
  store<V>(o, a);
  return d;
}

template <int V, class S, class G>
__global__ __launch_bounds__(kBlock) void cross_gradients_kernel(MatView<const G> g, MatView<const S> x0, MatView<const S> z,
                                                                 float* __restrict__ dz,
                                                                 std::uint16_t* __restrict__ dz16, MatView<G> dx0,
                                                                 CrossGradientFlags flags, RowSpan span) {
  for_each_element<V>(g.rows, g.cols, span, [&](std::int64_t r, std::int64_t c) {
    (void)cross_gradient_group<V, S, G>(g, x0, z, dz, dz16, dx0, flags, r, c);
  });
}

template <int V, class S, class G>
__global__ __launch_bounds__(kSumBlock) void cross_gradients_sum_kernel(MatView<const G> g, MatView<const S> x0,
                                                                     MatView<const S> z,
                                                                     float* __restrict__ dz,
                                                                     std::uint16_t* __restrict__ dz16, MatView<G> dx0,
                                                                     CrossGradientFlags flags, int tpr,
                                                                     double* __restrict__ partial) {
  rows_with_column_sums<V>(g.rows, g.cols, tpr, partial, [&](std::int64_t r, std::int64_t c) {
    return cross_gradient_group<V, S, G>(g, x0, z, dz, dz16, dx0, flags, r, c);
  });
}

// The ReLU backward with the bias gradient's column sums folded in (dz is not written when null).
template <int V, class S, class G>
__global__ __launch_bounds__(kSumBlock) void relu_backward_sum_kernel(MatView<const S> y, MatView<const G> dy,
                                                                   float* __restrict__ dz,
                                                                   std::uint16_t* __restrict__ dz16, int tpr,
                                                                   double* __restrict__ partial) {
  rows_with_column_sums<V>(y.rows, y.cols, tpr, partial, [&](std::int64_t r, std::int64_t c) {
    const Floats<V> yv = load<V>(y.data + r * y.ld + c);
    Floats<V> v = load<V>(dy.data + r * dy.ld + c);
#pragma unroll
    for (int i = 0; i < V; ++i) v.v[i] = yv.v[i] > 0.0f ? v.v[i] : 0.0f;
    const std::int64_t at = r * y.cols + c;
    if (dz != nullptr) store<V>(dz + at, v);
    if (dz16 != nullptr) store_bf16<V>(dz16 + at, v);
    return v;
  });
}

// -------------------------------------------------------- dot interaction --

constexpr int kDotBlock = 128;

// (i, j) with i > j of pair p in the row-major strict lower triangle: p = i(i-1)/2 + j.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * static_cast<double>(p))) * 0.5);
  while (i * (i - 1) / 2 > p) --i;
  while ((i + 1) * i / 2 <= p) ++i;
  j = p - i * (i - 1) / 2;
}

__global__ __launch_bounds__(kDotBlock) void dot_forward_kernel(CMat dense, CMat emb, int features, Mat out) {
  extern __shared__ float zs[];  // [F, D + 1]
  const std::int64_t b = blockIdx.x;
  const int D = static_cast<int>(dense.cols);
  const int stride = D + 1;
  const float* drow = dense.data + b * dense.ld;
  const float* erow = emb.data + b * emb.ld;
  float* orow = out.data + b * out.ld;
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int f = idx / D, d = idx - f * D;
    const float v = f == 0 ? drow[d] : erow[(f - 1) * D + d];
    zs[f * stride + d] = v;
    if (f == 0) orow[d] = v;
  }
  __syncthreads();
  const int pairs = features * (features - 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int i, j;
    pair_of(p, i, j);
    const float* zi = zs + i * stride;
    const float* zj = zs + j * stride;
    float acc = 0.0f;
    for (int d = 0; d < D; ++d) acc = fmaf(zi[d], zj[d], acc);
    orow[D + p] = acc;
  }
}

__global__ __launch_bounds__(kDotBlock) void dot_backward_kernel(CMat dense, CMat emb, int features, CMat dout,
                                                                 Mat ddense, Mat demb) {
  extern __shared__ float sm[];
  const int D = static_cast<int>(dense.cols);
  float* zs = sm;                  // [F, D]
  float* gs = sm + features * D;   // [F, F] symmetric, zero diagonal
  const std::int64_t b = blockIdx.x;
  const float* drow = dense.data + b * dense.ld;
  const float* erow = emb.data + b * emb.ld;
  const float* grow = dout.data + b * dout.ld;
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int f = idx / D, d = idx - f * D;
    zs[idx] = f == 0 ? drow[d] : erow[(f - 1) * D + d];
  }
  for (int idx = threadIdx.x; idx < features * features; idx += blockDim.x) {
    const int i = idx / features, j = idx - i * features;
    const int hi = i > j ? i : j, lo = i > j ? j : i;
    gs[idx] = i == j ? 0.0f : grow[D + hi * (hi - 1) / 2 + lo];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < features * D; idx += blockDim.x) {
    const int k = idx / D, d = idx - k * D;
    const float* gk = gs + k * features;
    float acc = 0.0f;
    for (int j = 0; j < features; ++j) acc = fmaf(gk[j], zs[j * D + d], acc);
    if (k == 0) {
      ddense.data[b * ddense.ld + d] = static_cast<float>(static_cast<double>(grow[d]) + static_cast<double>(acc));
    } else {
      demb.data[b * demb.ld + (k - 1) * D + d] = acc;
    }
  }
}

std::size_t dot_forward_smem(int features, int dim) {
  return static_cast<std::size_t>(features) * static_cast<std::size_t>(dim + 1) * sizeof(float);
}
std::size_t dot_backward_smem(int features, int dim) {
  return (static_cast<std::size_t>(features) * dim + static_cast<std::size_t>(features) * features) * sizeof(float);
}
void check_dot_smem(const char* op, std::size_t bytes, int features, int dim) {
  const std::size_t limit = device_info().shared_memory_per_block_optin;
  if (bytes > limit) {
    throw Error(cat(op, ": ", features, " features of dimension ", dim, " need ", bytes,
                    " bytes of shared memory per example; this device allows ", limit,
                    " (use fewer tables or a smaller embedding dimension)"));
  }
}

// -------------------------------------------------------------------- loss --

constexpr std::int64_t kLossMaxBlocks = 1024;

__device__ __forceinline__ void block_sum_store(double* sh, double v, double* out) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}

__global__ __launch_bounds__(kBlock) void bce_terms_kernel(const float* __restrict__ logits,
                                                           const float* __restrict__ labels, std::int64_t n,
                                                           float* __restrict__ dlogits, double* __restrict__ partial) {
  __shared__ double sh[kBlock];
  const double count = static_cast<double>(n);
  double acc = 0.0;
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double z = logits[i];
    const double y = labels[i];
    acc += softplus(z) - y * z;
    dlogits[i] = static_cast<float>((stable_sigmoid(z) - y) / count);
  }
  block_sum_store(sh, acc, partial + blockIdx.x);
}

__global__ __launch_bounds__(kBlock) void bce_final_kernel(const double* __restrict__ partial, std::int64_t blocks,
                                                           std::int64_t n, float* __restrict__ loss_out,
                                                           double* __restrict__ total) {
  __shared__ double sh[kBlock];
  double acc = 0.0;
  for (std::int64_t k = threadIdx.x; k < blocks; k += blockDim.x) acc += partial[k];
  block_sum_store(sh, acc, total);
  if (threadIdx.x == 0) loss_out[0] = static_cast<float>(*total / static_cast<double>(n));
}

__global__ __launch_bounds__(kBlock) void sigmoid_kernel(const float* __restrict__ logits, float* __restrict__ probs,
                                                         std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    probs[i] = static_cast<float>(stable_sigmoid(static_cast<double>(logits[i])));
  }
}

template <int V>
__global__ __launch_bounds__(kBlock) void add_kernel(Mat y, CMat x, RowSpan span) {
  for_each_element<V>(y.rows, y.cols, span, [&](std::int64_t r, std::int64_t c) {
    float* o = y.data + r * y.ld + c;
    Floats<V> a = load<V>(o);
    const Floats<V> b = load<V>(x.data + r * x.ld + c);
    for (int i = 0; i < V; ++i) a.v[i] = static_cast<float>(static_cast<double>(a.v[i]) + static_cast<double>(b.v[i]));
    store<V>(o, a);
  });
}

// -------------------------------------------------------------- optimizers --

struct OptArgs {
  double lr, eps, wd, beta1, beta2, correction1, correction2;
  bool decay;
};

__global__ __launch_bounds__(kBlock) void sgd_kernel(float* __restrict__ w, const float* __restrict__ g,
                                                     std::int64_t n, OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = a.decay ? static_cast<double>(g[i]) + a.wd * wi : static_cast<double>(g[i]);
    w[i] = static_cast<float>(wi - a.lr * gi);
  }
}

__global__ __launch_bounds__(kBlock) void adagrad_kernel(float* __restrict__ w, const float* __restrict__ g,
                                                         float* __restrict__ s, std::int64_t n, OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = a.decay ? static_cast<double>(g[i]) + a.wd * wi : static_cast<double>(g[i]);
    const double sum = static_cast<double>(s[i]) + gi * gi;
    s[i] = static_cast<float>(sum);
    w[i] = static_cast<float>(wi - a.lr * gi / (sqrt(sum) + a.eps));
  }
}

__global__ __launch_bounds__(kBlock) void adam_kernel(float* __restrict__ w, const float* __restrict__ g,
                                                      float* __restrict__ m, float* __restrict__ v, std::int64_t n,
                                                      OptArgs a) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    const double wi = w[i];
    const double gi = g[i];
    const double mi = a.beta1 * static_cast<double>(m[i]) + (1.0 - a.beta1) * gi;
    const double vi = a.beta2 * static_cast<double>(v[i]) + (1.0 - a.beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double step = (mi / a.correction1) / (sqrt(vi / a.correction2) + a.eps);
    w[i] = static_cast<float>(wi - a.lr * (a.decay ? step + a.wd * wi : step));
  }
}

}  // namespace

// ---------------------------------------------------------------- host side --

void fill(Stream_t s, float* p, std::int64_t n, float value) {
  if (n <= 0) return;
  if (value == 0.0f && !std::signbit(value)) {  // +0.0f is all zero bits: the runtime's memset is the fastest fill
    if (!rehearsing()) check(memset_async(p, 0, static_cast<std::size_t>(n) * sizeof(float), s), "dense_fill (memset)");
    return;
  }
  launch("dense_fill", fill_kernel, {grid_for(n), kBlock, 0}, s, p, n, value);
}

void round_to_dtype(Stream_t s, float* p, std::int64_t n, DType dtype) {
  if (n <= 0 || dtype == DType::f32) return;
  if (dtype == DType::bf16) {
    launch("round_to_bf16", round_kernel<0>, {grid_for(n), kBlock, 0}, s, p, n);
  } else if (dtype == DType::f16) {
    launch("round_to_f16", round_kernel<1>, {grid_for(n), kBlock, 0}, s, p, n);
  } else {
    throw Error(cat("round_to_dtype: ", dtype_name(dtype), " is not a floating-point storage type (fp32, fp16, bf16)"));
  }
}


// The second pass of a folded kernel's column sums: out[c] = the lanes' partials of column c
// (scratch, written by rows_with_column_sums) added in a fixed order.
void folded_column_sums(Stream_t s, const char* name, const FoldShape& f, std::int64_t cols, void* scratch,
                        float* out) {
  const int cpb = final_columns_per_block(f.lanes(), cols);
  launch(name, column_final_kernel, {ceil_div(cols, cpb), kBlock, 0}, s, static_cast<const double*>(scratch),
         f.lanes(), cols, cpb, out);
}

void relu_backward(Stream_t s, CAMat y, CAMat dy, float* dz, std::uint16_t* dz16, float* dbias, void* scratch,
                   bool dz_bf16_only) {
  if (dbias != nullptr && y.rows <= 0) {
    fill(s, dbias, y.cols, 0.0f);
    return;
  }
  const std::int64_t n = y.rows * y.cols;
  if (n <= 0) return;
  const int vec = vec_width(y.cols, {vec_view(y), vec_view(dy), {dz, y.cols}, bf16_packed(dz16, y.cols)});
  const bool fold = dbias != nullptr && fused_sum_fits(y.rows, y.cols, vec);
  float* dz_out = fold && dz_bf16_only && dz16 != nullptr ? nullptr : dz;  // the fold needs no fp32 dz to sum
  with_storage("relu_backward", y.dtype, [&](auto tag) {
    using S = decltype(tag);
    with_storage("relu_backward", dy.dtype, [&](auto gtag) {
    using G = decltype(gtag);
    with_width(vec, [&](auto width) {
      constexpr int V = decltype(width)::value;
      if (fold) {
        const FoldShape f = fold_shape(y.rows, y.cols, V);
        launch("relu_backward_sum", relu_backward_sum_kernel<V, S, G>, {f.grid, kSumBlock, 0}, s, typed<S>(y),
               typed<G>(dy), dz_out, dz16, f.tpr, static_cast<double*>(scratch));
        folded_column_sums(s, "relu_backward_bias", f, y.cols, scratch, dbias);
        return;
      }
      const RowSpan span = row_span(y.cols / V);
      launch("relu_backward", relu_backward_kernel<V, S, G>, {row_grid(y.rows, span), kBlock, 0}, s, typed<S>(y),
             typed<G>(dy), dz, dz16, span);
    });
    });
  });
  if (dbias != nullptr && !fold) column_sum(s, CMat(dz, y.rows, y.cols), dbias, scratch);
}

void convert(Stream_t s, CAMat src, AMat dst) {
  if (src.rows <= 0 || src.cols <= 0) return;
  const int vec = vec_width(src.cols, {vec_view(src), vec_view(dst)});
  with_storage("convert", src.dtype, [&](auto atag) {
    using A = decltype(atag);
    with_storage("convert", dst.dtype, [&](auto btag) {
      using B = decltype(btag);
      with_width(vec, [&](auto width) {
        constexpr int V = decltype(width)::value;
        const RowSpan span = row_span(src.cols / V);
        launch("dense_convert", convert_kernel<V, A, B>, {row_grid(src.rows, span), kBlock, 0}, s, typed<A>(src),
               typed<B>(dst), span);
      });
    });
  });
}

void to_bf16(Stream_t s, CMat src, std::uint16_t* dst, std::int64_t dst_ld) {
  if (src.rows <= 0 || src.cols <= 0) return;
  if (dst_ld < 0) dst_ld = src.cols;
  with_width(vec_width(src.cols, {{src.data, src.ld}, {dst, dst_ld, 2}}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const RowSpan span = row_span(src.cols / V);
    launch("to_bf16", to_bf16_kernel<V>, {row_grid(src.rows, span), kBlock, 0}, s, src, dst, dst_ld, span);
  });
}

std::int64_t column_sum_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  const ColumnSplit sp = column_split(rows, cols);
  return sp.chunks * std::max<std::int64_t>(cols, 1) * static_cast<std::int64_t>(sizeof(double));
}

void column_sum(Stream_t s, CMat m, float* out, void* scratch) {
  if (m.cols <= 0) return;
  if (m.rows <= 0) {
    fill(s, out, m.cols, 0.0f);
    return;
  }
  const ColumnSplit sp = column_split(m.rows, m.cols);
  auto* partial = static_cast<double*>(scratch);
  launch("column_sum_partial", column_partial_kernel, {sp.col_tiles * sp.chunks, kBlock, 0}, s, m, sp.col_tiles,
         sp.rows_per_chunk, partial);
  const int cpb = final_columns_per_block(sp.chunks, m.cols);
  launch("column_sum_final", column_final_kernel, {ceil_div(m.cols, cpb), kBlock, 0}, s,
         static_cast<const double*>(partial), sp.chunks, m.cols, cpb, out);
}

void cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next) {
  const std::int64_t n = x0.rows * x0.cols;
  if (n <= 0) return;
  const int vec = vec_width(x0.cols, {vec_view(x0), vec_view(z), vec_view(xl), vec_view(x_next)});
  with_storage("cross_combine", x0.dtype, [&](auto tag) {
    using S = decltype(tag);
    with_width(vec, [&](auto width) {
      constexpr int V = decltype(width)::value;
      const RowSpan span = row_span(x0.cols / V);
      launch("cross_combine", cross_combine_kernel<V, S>, {row_grid(x0.rows, span), kBlock, 0}, s, typed<S>(x0),
             typed<S>(z), typed<S>(xl), typed<S>(x_next), span);
    });
  });
}


std::int64_t gradient_sums_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  std::int64_t lanes = 0;
  for (int v : {1, 4, 8}) lanes = std::max(lanes, fold_shape(rows, cols, v).lanes());
  return std::max(column_sum_scratch_bytes(rows, cols),
                  lanes * std::max<std::int64_t>(cols, 1) * static_cast<std::int64_t>(sizeof(double)));
}

void cross_gradients(Stream_t s, CAMat g, CAMat x0, CAMat z, float* dz, std::uint16_t* dz16, AMat dx0, float* dbias,
                     void* scratch, CrossGradientFlags flags) {
  if (dx0.dtype != g.dtype) throw Error("cross_gradients: g and dx0 must share one storage type");
  const std::int64_t n = g.rows * g.cols;
  if (dbias != nullptr && g.rows <= 0) {
    fill(s, dbias, g.cols, 0.0f);
    return;
  }
  if (n <= 0) return;
  if (dz16 == nullptr) flags.dz_bf16_only = false;  // dz is the only copy then
  // Groups of 8 only for bf16 x0 and z: with fp32 ones the folded kernel spills at 8 per thread.
  const int vec = std::min(x0.dtype == DType::f32 ? 4 : 8,
                           vec_width(g.cols, {vec_view(g), vec_view(x0), vec_view(z), {dz, g.cols}, vec_view(dx0),
                                              bf16_packed(dz16, g.cols)}));
  // dbias folded into the pass (cross_gradients_sum_kernel) where a block's threads cover a row.
  const bool fold = dbias != nullptr && fused_sum_fits(g.rows, g.cols, vec);
  if (dbias != nullptr && !fold) flags.dz_bf16_only = false;  // the column sum below reads dz
  with_storage("cross_gradients", x0.dtype, [&](auto tag) {
    using S = decltype(tag);
    with_storage("cross_gradients", g.dtype, [&](auto gtag) {
    using G = decltype(gtag);
    with_width(vec, [&](auto width) {
      constexpr int V = decltype(width)::value;
      if constexpr (V == 8 && std::is_same_v<S, float>) {
        throw Error("cross_gradients: groups of 8 with fp32 x0 (not instantiated)");
      } else if (fold) {
        const FoldShape f = fold_shape(g.rows, g.cols, V);
        launch("cross_gradients_sum", cross_gradients_sum_kernel<V, S, G>, {f.grid, kSumBlock, 0}, s, typed<G>(g),
               typed<S>(x0), typed<S>(z), dz, dz16, typed<G>(dx0), flags, f.tpr, static_cast<double*>(scratch));
        folded_column_sums(s, "cross_gradients_bias", f, g.cols, scratch, dbias);
        return;
      }
      const RowSpan span = row_span(g.cols / V);
      launch("cross_gradients", cross_gradients_kernel<V, S, G>, {row_grid(g.rows, span), kBlock, 0}, s, typed<G>(g),
             typed<S>(x0), typed<S>(z), dz, dz16, typed<G>(dx0), flags, span);
    });
    });
  });
  if (dbias != nullptr && !fold) column_sum(s, CMat(dz, g.rows, g.cols), dbias, scratch);
}

void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out) {
  if (dense.rows <= 0) return;
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  const std::size_t smem = dot_forward_smem(features, dim);
  check_dot_smem("dot_interaction_forward", smem, features, dim);
  launch("dot_interaction_forward", dot_forward_kernel, {dense.rows, kDotBlock, smem}, s, dense, emb, features, out);
}

void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense, Mat demb) {
  if (dense.rows <= 0) return;
  const int features = num_tables + 1;
  const int dim = static_cast<int>(dense.cols);
  const std::size_t smem = dot_backward_smem(features, dim);
  check_dot_smem("dot_interaction_backward", smem, features, dim);
  launch("dot_interaction_backward", dot_backward_kernel, {dense.rows, kDotBlock, smem}, s, dense, emb, features,
         dout, ddense, demb);
}

std::int64_t bce_scratch_bytes() { return (kLossMaxBlocks + 1) * static_cast<std::int64_t>(sizeof(double)); }

void bce_with_logits(Stream_t s, const float* logits, const float* labels, std::int64_t n, float* dlogits,
                     float* loss_out, void* scratch) {
  auto* partial = static_cast<double*>(scratch);  // [blocks], then the total
  const std::int64_t blocks = std::min(ceil_div(n, kBlock), kLossMaxBlocks);
  launch("bce_terms", bce_terms_kernel, {blocks, kBlock, 0}, s, logits, labels, n, dlogits, partial);
  launch("bce_final", bce_final_kernel, {1, kBlock, 0}, s, static_cast<const double*>(partial), blocks, n, loss_out,
         partial + kLossMaxBlocks);
}

void sigmoid(Stream_t s, const float* logits, float* probs, std::int64_t n) {
  if (n <= 0) return;
  launch("sigmoid", sigmoid_kernel, {grid_for(n), kBlock, 0}, s, logits, probs, n);
}

void add_inplace(Stream_t s, Mat y, CMat x) {
  if (y.rows <= 0 || y.cols <= 0) return;
  with_width(vec_width(y.cols, {{y.data, y.ld}, {x.data, x.ld}}), [&](auto width) {
    constexpr int V = decltype(width)::value;
    const RowSpan span = row_span(y.cols / V);
    launch("add_inplace", add_kernel<V>, {row_grid(y.rows, span), kBlock, 0}, s, y, x, span);
  });
}

void optimizer_step(Stream_t s, float* params, const float* grads, float* state, std::int64_t n,
                    const OptimizerParams& opt, std::int64_t step) {
  if (n <= 0) return;
  OptArgs a{};
  a.lr = opt.lr;
  a.eps = opt.eps;
  a.wd = opt.weight_decay;
  a.decay = a.wd != 0.0;
  a.beta1 = opt.beta1;
  a.beta2 = opt.beta2;
  // Bias corrections on the host, with the same std::pow the CPU reference uses.
  a.correction1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  a.correction2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  const LaunchShape shape{grid_for(n), kBlock, 0};
  switch (opt.kind) {
    case OptimizerKind::sgd: return launch("dense_sgd", sgd_kernel, shape, s, params, grads, n, a);
    case OptimizerKind::adagrad: return launch("dense_adagrad", adagrad_kernel, shape, s, params, grads, state, n, a);
    case OptimizerKind::adam:
      return launch("dense_adam", adam_kernel, shape, s, params, grads, state, state + n, n, a);
    case OptimizerKind::rowwise_adagrad: break;
  }
  throw Error("dense_optimizer_step: rowwise_adagrad is an embedding optimizer (use sgd, adagrad or adam)");
}

void gemm_empty_k(Stream_t s, std::int64_t m, std::int64_t n, float beta, float* d, std::int64_t ldd,
                  const float* bias, bool relu) {
  if (m <= 0 || n <= 0) return;
  launch("gemm_empty_k", gemm_empty_k_kernel, {grid_for(m * n), kBlock, 0}, s, m, n, beta, d, ldd, bias, relu);
}

void gemm_empty_k_bf16(Stream_t s, std::int64_t m, std::int64_t n, std::uint16_t* d, std::int64_t ldd,
                       const std::uint16_t* bias, bool relu) {
  if (m <= 0 || n <= 0) return;
  launch("gemm_empty_k_bf16", epilogue_bf16_kernel, {grid_for(m * n), kBlock, 0}, s, m, n, false, d, ldd, bias, relu);
}

void epilogue_bf16(Stream_t s, std::int64_t m, std::int64_t n, std::uint16_t* d, std::int64_t ldd,
                   const std::uint16_t* bias, bool relu) {
  if (m <= 0 || n <= 0) return;
  launch("epilogue_bf16", epilogue_bf16_kernel, {grid_for(m * n), kBlock, 0}, s, m, n, true, d, ldd, bias, relu);
}

void vector_to_bf16(Stream_t s, const float* src, std::uint16_t* dst, std::int64_t n) {
  if (n <= 0) return;
  to_bf16(s, CMat(src, 1, n), dst);
}

}  // namespace parity::gpu::dense
