// The checked bf16 product in one kernel (sm_90a warpgroup products; see product_checks.h).
//
// Why a kernel of our own. Through the library a checked bf16 product writes its fp32 output,
// reads it back to sum each row and stores the bf16 output: 8 bytes an output element more than
// the unchecked product's bf16 write, the checks' floor on that path. Here each block sums its
// tile's rows from the accumulators and stores the bf16 output in the same epilogue, so the fp32
// output never reaches memory: what is left is a double pair a row and column tile, and the pass
// over the input that the bound needs (product_checks.cu).
//
// The layout. A block computes a 128 x 128 tile of out = a · wᵀ over k in steps of 64, its two
// warpgroups 64 rows each, both operands K-major in 128-byte-swizzled shared slabs (mma.cuh)
// filled by cp.async through a three-stage ring; two blocks a multiprocessor, so that one's
// epilogue runs under the other's products. The blocks of the first column tile also compute the
// checksum columns, a_i · hi and a_i · lo, with the narrowest warpgroup product (N = 8: hi, lo and
// six rows of zeros) over the same shared tile of a: the same instruction family over the same
// k steps as the outputs, so that the tensor cores' truncation matches.
//
// Not yet the library's speed (docs/reliability.md): its 128 x 128 tiles read more through L2 than
// the library's larger, clustered ones, and each step waits for its copies and products; so
// GpuBackend runs it only when asked (use_fused_checks).
#include "backend/gpu/product_checks.h"

#include <cstdint>
#include <string>

#include "backend/gpu/launch.h"
#include "backend/gpu/mma.cuh"
#include "backend/gpu/runtime.h"
#include "parity/error.h"

namespace parity::gpu {

namespace {

constexpr int kThreads = 256, kTileRows = 128, kTileCols = 128, kTileK = 64, kStages = 3;
constexpr int kCheckRows = 8;  // hi, lo and six rows of zeros: wgmma's narrowest N
constexpr int kStageElements = (kTileRows + kTileCols + kCheckRows) * kTileK;
// Every slab starts 1024-byte aligned (the swizzle's period): 16 KiB, 16 KiB and 1 KiB a stage.
constexpr std::size_t kSmemBytes = kStages * kStageElements * 2 + 1024;
// The epilogue stages the bf16 tile in shared memory, rows padded by 16 bytes so that the
// fragments' 4-byte writes fall in distinct banks.
constexpr int kOutStride = kTileCols + 8;
static_assert(kTileRows * kOutStride + 2 * kTileCols <= kStages * kStageElements,
              "the output tile and its bias fit the ring");

struct FusedArgs {
  const std::uint16_t* a;
  std::int64_t lda;
  const std::uint16_t* w;  // rows [0, m) the weights, m and m + 1 the checksum rows hi and lo
  std::int64_t ldw;
  std::int64_t n, m, k;  // k: the columns read, a multiple of 8
  const float* bias;     // or null
  int relu;
  std::uint16_t* out;
  std::int64_t ldo;
  int vector;  // whether every row of the output starts 16-byte aligned
  double2* partials;
  std::int64_t tiles;
  float2* checksum;
  std::int64_t fault;  // the element whose fp32 value (plus its bias) gets a flip, or -1
  int fault_bit;
};

#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)

// Element (row, col) of a slab of 64 bf16 columns, 16-byte chunks XOR-swizzled by row.
__device__ __forceinline__ int slab_swizzle(int row, int col) {
  return row * 64 + ((((col >> 3) ^ row) & 7) << 3) + (col & 7);
}

// Rows [r0, r0 + ROWS) of src (rows from `limit` on, and columns from k on, read as zeros),
// columns [k0, k0 + 64), into a slab.
template <int ROWS>
__device__ __forceinline__ void copy_slab(std::uint16_t* dst, const std::uint16_t* src,
                                          std::int64_t ld, std::int64_t r0, std::int64_t limit,
                                          std::int64_t k0, std::int64_t k) {
  for (int i = static_cast<int>(threadIdx.x); i < ROWS * 8; i += kThreads) {
    const int r = i >> 3, c = i & 7;
    const std::int64_t col = k0 + c * 8;
    const bool ok = r0 + r < limit && col < k;
    mma::copy_async_16(dst + slab_swizzle(r, c * 8), ok ? src + (r0 + r) * ld + col : src, ok);
  }
}

#endif

__global__ __launch_bounds__(kThreads, 2) void fused_kernel(FusedArgs g) {
#if defined(PARITY_WGMMA)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* base = reinterpret_cast<std::uint16_t*>(smem_raw + (-mma::shared_address(smem_raw) & 1023));
  const std::int64_t tile_col = blockIdx.x % g.tiles, tile_row = blockIdx.x / g.tiles;
  const std::int64_t r0 = tile_row * kTileRows, c0 = tile_col * kTileCols;
  const bool checksum = tile_col == 0;
  const int steps = static_cast<int>((g.k + kTileK - 1) / kTileK);
  auto load = [&](int i) {  // step i's tiles into its stage, one commit group (empty past the end)
    if (i < steps) {
      std::uint16_t* st = base + (i % kStages) * kStageElements;
      const std::int64_t k0 = static_cast<std::int64_t>(i) * kTileK;
      copy_slab<kTileRows>(st, g.a, g.lda, r0, g.n, k0, g.k);
      copy_slab<kTileCols>(st + kTileRows * kTileK, g.w, g.ldw, c0, g.m, k0, g.k);
      if (checksum)
        copy_slab<kCheckRows>(st + (kTileRows + kTileCols) * kTileK, g.w, g.ldw, g.m, g.m + 2, k0,
                              g.k);
    }
    mma::copy_async_commit();
  };
  const int warp = static_cast<int>(threadIdx.x) / 32, group = warp / 4;
  constexpr unsigned kRowGroup = 8 * 128;  // bytes between groups of 8 rows of a slab
  const std::uint64_t a_desc = mma::wg::descriptor(base + group * 64 * kTileK, 16, kRowGroup);
  const std::uint64_t b_desc = mma::wg::descriptor(base + kTileRows * kTileK, 16, kRowGroup);
  const std::uint64_t c_desc =
      mma::wg::descriptor(base + (kTileRows + kTileCols) * kTileK, 16, kRowGroup);

  float acc[kTileCols / 8][4], chk[1][4];
#pragma unroll
  for (int nt = 0; nt < kTileCols / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) chk[0][e] = 0.0f;

  load(0);
  load(1);
  for (int i = 0; i < steps; ++i) {
    // Step i's copies have landed for every thread, and every warpgroup has finished step i - 1,
    // whose stage step i + 2 takes.
    mma::copy_async_wait<1>();
    mma::wg::fence_shared();
    __syncthreads();
    const unsigned stage = static_cast<unsigned>((i % kStages) * kStageElements * 2);
    mma::wg::fence();
    // 16 columns a product: 32 bytes along a swizzled row. The checksum's products are issued
    // after the tile's, not between them, so that no branch separates the tile's products.
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk)
      mma::wg::mma_ss<kTileCols>(acc, mma::wg::advance(a_desc, stage + kk * 32),
                                 mma::wg::advance(b_desc, stage + kk * 32), 1);
    if (checksum) {
      mma::wg::fence();  // past the branch, the compiler would otherwise add it
#pragma unroll
      for (int kk = 0; kk < kTileK / 16; ++kk)
        mma::wg::mma_ss<kCheckRows>(chk, mma::wg::advance(a_desc, stage + kk * 32),
                                    mma::wg::advance(c_desc, stage + kk * 32), 1);
    }
    mma::wg::commit();
    load(i + 2);  // issued while the products run
    mma::wg::wait<0>();
    mma::wg::pin(acc);
    mma::wg::pin(chk);
  }
  mma::copy_async_wait<0>();

  // The epilogue. Lane l of warp w holds rows 16 w + l / 4 and 8 more of the tile, at columns
  // 8 nt + 2 (l % 4) and the next (mma.cuh). Each row's sums over its 32 elements, then over the
  // 4 lanes of its quad, in double (a flipped exponent squared overflows fp32); the bf16 outputs
  // into shared memory, then stored 16 bytes a lane.
  const int lane = static_cast<int>(threadIdx.x) & 31, quad = lane & 3;
  __syncthreads();  // every warpgroup is done with the stages: the tile and the bias reuse them
  std::uint16_t* tile = base;
  auto* bias = reinterpret_cast<float*>(base + kTileRows * kOutStride);
  if (threadIdx.x < kTileCols) {
    const std::int64_t col = c0 + threadIdx.x;
    bias[threadIdx.x] = g.bias != nullptr && col < g.m ? g.bias[col] : 0.0f;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + (lane >> 2) + h * 8;
    const std::int64_t row = r0 + r;
    double sum = 0, squares = 0;
#pragma unroll
    for (int nt = 0; nt < kTileCols / 8; ++nt) {
      const int c = nt * 8 + 2 * quad;
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = row < g.n && c0 + c + e < g.m;
        const float b = bias[c + e];
        float x = acc[nt][2 * h + e];
        if (valid && g.fault == row * g.m + c0 + c + e)
          x = __uint_as_float(__float_as_uint(x + b) ^ (1u << g.fault_bit)) - b;
        if (valid) {
          const double d = x;
          sum += d;
          squares += d * d;
        }
        const float z = x + b;
        y[e] = g.relu && z <= 0.0f ? 0.0f : z;  // a NaN stays for the guard to see
      }
      *reinterpret_cast<unsigned*>(tile + r * kOutStride + c) = mma::pack_bf16(y[0], y[1]);
    }
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    squares += __shfl_xor_sync(0xFFFFFFFFu, squares, 1);
    squares += __shfl_xor_sync(0xFFFFFFFFu, squares, 2);
    if (quad == 0 && row < g.n) {
      g.partials[row * g.tiles + tile_col] = make_double2(sum, squares);
      if (checksum) g.checksum[row] = make_float2(chk[0][2 * h], chk[0][2 * h + 1]);
    }
  }
  __syncthreads();
  // The tile's rows out, 8 columns (16 bytes) a lane where the output's rows allow it.
  constexpr int kChunks = kTileCols / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kTileRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * 8;
    const std::int64_t row = r0 + r, col = c0 + c;
    if (row >= g.n || col >= g.m) continue;
    const std::uint16_t* from = tile + r * kOutStride + c;
    std::uint16_t* to = g.out + row * g.ldo + col;
    if (g.vector && col + 8 <= g.m) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int e = 0; e < 8 && col + e < g.m; ++e) to[e] = from[e];
    }
  }
#else
  (void)g;
#endif
}

}  // namespace

bool product_check_fused_available() {
#if defined(PARITY_CUDA_SM90A)
  return device_info().compute_major == 9 && device_info().compute_minor == 0;
#else
  return false;
#endif
}

std::int64_t product_check_tiles(std::int64_t m) {
  return ceil_div(m, kTileCols);
}

void product_check_fused(Stream_t s, const FusedProduct& p) {
  if (!product_check_fused_available())
    throw Error("product_check_fused: needs sm_90a code and a device of compute capability 9.0");
  const auto aligned = [](const void* ptr, std::int64_t ld) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0 && ld % 8 == 0;
  };
  if (p.k % 8 != 0 || !aligned(p.a, p.lda) || !aligned(p.w, p.ldw))
    throw Error("product_check_fused: the operands' rows must start 16-byte aligned and k (" +
                std::to_string(p.k) + ") be a multiple of 8");
  if (p.n <= 0 || p.m <= 0) return;
  FusedArgs g{};
  g.a = static_cast<const std::uint16_t*>(p.a);
  g.lda = p.lda;
  g.w = static_cast<const std::uint16_t*>(p.w);
  g.ldw = p.ldw;
  g.n = p.n;
  g.m = p.m;
  g.k = p.k;
  g.bias = p.bias;
  g.relu = p.relu ? 1 : 0;
  g.out = static_cast<std::uint16_t*>(p.out);
  g.ldo = p.ldo;
  g.vector = reinterpret_cast<std::uintptr_t>(p.out) % 16 == 0 && p.ldo % 8 == 0;
  g.partials = reinterpret_cast<double2*>(p.partials);
  g.tiles = product_check_tiles(p.m);
  g.checksum = reinterpret_cast<float2*>(p.checksum);
  g.fault = p.fault_element;
  g.fault_bit = p.fault_bit;
  launch("product_check_fused", fused_kernel,
         {ceil_div(p.n, kTileRows) * g.tiles, kThreads, kSmemBytes}, s, g);
}

}  // namespace parity::gpu
