// The checked bf16 product in one kernel (sm_90a warpgroup products; see product_checks.h).
//
// Why a kernel of our own. Through the library a checked bf16 product writes its fp32 output,
// reads it back to sum each row and stores the bf16 output: 8 bytes an output element more than
// the unchecked product's bf16 write, the checks' floor on that path. Here each block sums its
// tile's rows from the accumulators and stores the bf16 output in the same epilogue, so the fp32
// output never reaches memory: what is left is a double pair a row and column tile, and the pass
// over the input that the bound needs (product_checks.cu).
//
// The layout. A block computes a 256 x 128 tile of out = a · wᵀ over k in steps of 64 (tma_kernel
// below): both operands K-major in 128-byte-swizzled shared slabs (mma.cuh), copied by the
// tensor-memory accelerator from tensor maps the host makes (the driver's cuTensorMapEncodeTiled,
// found through the runtime). The blocks of the first column tile also compute the checksum
// columns, a_i · hi and a_i · lo, with the narrowest warpgroup product (N = 8: hi, lo and six rows
// of zeros) over the same shared tile of a: the same instruction family over the same k steps as
// the outputs, so that the tensor cores' truncation matches. The epilogue stages the bf16 tile in
// shared memory, and the tensor-memory accelerator stores it while the block's next tile runs.
#include "backend/gpu/product_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#if defined(PARITY_GPU_CUDA)
#include <cuda.h>
#endif

#include "backend/gpu/launch.h"
#include "backend/gpu/mma.cuh"
#include "backend/gpu/runtime.h"
#include "parity/error.h"

namespace parity::gpu {

namespace {

[[maybe_unused]] constexpr int kTmaRows = 256, kTileCols = 128, kTileK = 64;
[[maybe_unused]] constexpr int kCheckRows = 8;  // hi, lo and six rows of zeros: wgmma's narrowest N
// The epilogue stages the bf16 tile in shared memory as the output map's boxes: two slabs of 64
// columns, each row of a slab 128 bytes in the 128-byte swizzle (mma.cuh), so that a warp's
// fragments (8 rows, 16 bytes each) fall in distinct banks and a row's 8-column chunk is whole.
[[maybe_unused]] constexpr int kOutSlabCols = 64;

// Where row r, column c of a staged tile is (in elements).
[[maybe_unused]] __host__ __device__ constexpr int staged(int r, int c) {
  return (c / kOutSlabCols) * kTmaRows * kOutSlabCols + r * kOutSlabCols +
         (((c % kOutSlabCols / 8) ^ (r % 8)) * 8 | c % 8);
}

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
  std::int64_t tiles;  // column tiles
  float2* checksum;
  std::int64_t fault;  // the element whose fp32 value (plus its bias) gets a flip, or -1
  int fault_bit;
  float walk_share;  // 1 / (4 (k / 3 + 1)) of the check's k: stage_rows
};

#if defined(PARITY_WGMMA)
// The planted fault (its place in the tile, row kTileCols + column) into the accumulator that
// holds it, if this thread's (stage_rows' layout, r the 64-row block's first row): bit fault_bit
// of its fp32 value plus its bias flipped, as if the product had computed it so. A select for
// each element, not a branch: branches between the elements would keep the rows' sums from
// interleaving.
__device__ __forceinline__ void plant(const FusedArgs& g, float (&acc)[kTileCols / 8][4], int r,
                                      int fault, const float* bias) {
  const int lane = static_cast<int>(threadIdx.x) & 31, quad = lane & 3;
  const int at = fault - (r + (lane >> 2)) * kTileCols - 2 * quad;  // from this thread's first
  const float b = bias[fault % kTileCols];
#pragma unroll
  for (int nt = 0; nt < kTileCols / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x = acc[nt][i];
      const float flipped = __uint_as_float(__float_as_uint(x + b) ^ (1u << g.fault_bit)) - b;
      acc[nt][i] = at == (i / 2) * 8 * kTileCols + nt * 8 + i % 2 ? flipped : x;
    }
}

// One warp's 16 rows of a 64-row block (its first, r, a row of the tile at r0, c0): lane l holds
// rows r + l / 4 and 8 more at columns 8 nt + 2 (l % 4) and the next (mma.cuh). Each row's sums
// over the lane's 32 elements, then over the 4 lanes of its quad, written for the tile; the bf16
// outputs (bias, ReLU) into the shared tile. Edge: the tile crosses the output's last row or
// column.
//
// A lane sums its elements of a row in fp32, converted to double once. The fp32 sum's roundings
// are counted as the product's are (product_checks.cu): at most u of each partial sum S_p and
// independent, they add Σ_p S_p² u² to the variance that the bound takes as
// (2u)² (k/3 + 1) Σ_j out_ij² under bf16 math; so the lane sums the S_p² too and adds them to its
// squares scaled by walk_share = 1 / (4 (k/3 + 1)). Where fp32 cannot hold a row's squares (an
// element beyond about 2^62, as a flipped exponent makes, or elements so small that their squares
// leave fp32's normal range) the lane sums its elements in double instead.
template <bool Edge>
__device__ __forceinline__ void stage_rows(const FusedArgs& g, const float (&acc)[kTileCols / 8][4],
                                           const float (&chk)[1][4], int r, std::int64_t r0,
                                           std::int64_t c0, std::int64_t tile_col, bool checksum,
                                           const float* bias, std::uint16_t* tile) {
  const int lane = static_cast<int>(threadIdx.x) & 31, quad = lane & 3;
  const auto counted = [&](int h, int nt, int e) {
    return !Edge || (r0 + r + (lane >> 2) + h * 8 < g.n && c0 + nt * 8 + 2 * quad + e < g.m);
  };
  float sum[2] = {}, squares[2] = {}, walk[2] = {};  // walk: Σ_p S_p²
#pragma unroll
  for (int nt = 0; nt < kTileCols / 8; ++nt) {
    const int c = nt * 8 + 2 * quad;
    const float2 b = *reinterpret_cast<const float2*>(bias + c);
    const float bs[2] = {b.x, b.y};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[nt][2 * h + e];
        if (counted(h, nt, e)) {
          sum[h] += x;
          squares[h] = fmaf(x, x, squares[h]);
          walk[h] = fmaf(sum[h], sum[h], walk[h]);
        }
        const float z = x + bs[e];
        y[e] = g.relu && z <= 0.0f ? 0.0f : z;  // a NaN stays for the guard to see
      }
      const int rr = r + (lane >> 2) + h * 8;
      *reinterpret_cast<unsigned*>(tile + staged(rr, c)) = mma::pack_bf16(y[0], y[1]);
    }
  }
  double dsum[2], dsquares[2];
  bool held = true;  // by fp32: finite, and the squares in its normal range
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    dsum[h] = sum[h];
    dsquares[h] = fmaf(walk[h], g.walk_share, squares[h]);
    held = held && isfinite(walk[h]) && isfinite(squares[h]) && squares[h] >= 0x1p-100f;
  }
  if (!held) {  // in double (a NaN or an infinity kept as it was)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      dsum[h] = 0;
      dsquares[h] = 0;
#pragma unroll
      for (int nt = 0; nt < kTileCols / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (counted(h, nt, e)) {
            const double d = acc[nt][2 * h + e];
            dsum[h] += d;
            dsquares[h] += d * d;
          }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    double s = dsum[h], q = dsquares[h];
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
    s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
    q += __shfl_xor_sync(0xFFFFFFFFu, q, 1);
    q += __shfl_xor_sync(0xFFFFFFFFu, q, 2);
    const std::int64_t row = r0 + r + (lane >> 2) + h * 8;
    if (quad == 0 && (!Edge || row < g.n)) {
      g.partials[row * g.tiles + tile_col] = make_double2(s, q);
      if (checksum) g.checksum[row] = make_float2(chk[0][2 * h], chk[0][2 * h + 1]);
    }
  }
}

// The tile's columns' bias into shared memory (threads [0, kTileCols) of those calling).
__device__ __forceinline__ void stage_bias(const FusedArgs& g, std::int64_t c0, int t,
                                           float* bias) {
  if (t < kTileCols) {
    const std::int64_t col = c0 + t;
    bias[t] = g.bias != nullptr && col < g.m ? g.bias[col] : 0.0f;
  }
}

// The shared tile out by the threads, 8 columns (16 bytes) a lane where the output's
// rows allow it (THREADS threads, this one t): for outputs the tensor map cannot describe.
template <int THREADS>
__device__ __forceinline__ void store_tile(const FusedArgs& g, const std::uint16_t* tile,
                                           std::int64_t r0, std::int64_t c0, int t) {
  constexpr int kChunks = kTileCols / 8;
  for (int i = t; i < kTmaRows * kChunks; i += THREADS) {
    const int r = i / kChunks, c = i % kChunks * 8;
    const std::int64_t row = r0 + r, col = c0 + c;
    if (row >= g.n || col >= g.m) continue;
    const std::uint16_t* from = tile + staged(r, c);
    std::uint16_t* to = g.out + row * g.ldo + col;
    if (g.vector && col + 8 <= g.m) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int e = 0; e < 8 && col + e < g.m; ++e) to[e] = from[e];
    }
  }
}
#endif

#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)
// The form fed by the tensor-memory accelerator, its warpgroups in two roles: the first copies
// (one thread) each step's tiles as whole boxes (the 128-byte swizzle done by the copy) into a
// ring of stages, refilling a stage as soon as both computing warpgroups have released it; the
// other two, 128 rows each (two 64-row blocks), issue a step's products as soon as its tiles land
// and wait only for the step before, whose stage each then releases, and never wait on a copy
// they did not need. 256 x 128 tiles. The copying warpgroup hands most of its registers to the
// computing ones, which hold 136 accumulators a thread. The epilogue's bf16 tile goes out by the
// tensor-memory accelerator's store.
//
// Two forms of it, by the depth of a tile. A short tile (few k-steps, like a cross layer's z)
// spends as long in its fill and epilogue as in its products, so the grid is persistent: one
// block a multiprocessor takes every gridDim-th tile, the copies of its next tile run under its
// epilogue, and the tile's store under the next tile's products; the staged tile needs shared
// memory of its own, which leaves room for three stages. A deep tile (like a cross layer's u)
// is bound by its main loop, which keeps its products fed better with four stages: one tile a
// block, the tile staged in the drained ring.
constexpr int kCopyThreads = 128, kComputeThreads = 256;
// The deepest tile in the persistent form: about where the two forms' times cross on an H100
// (docs/reliability.md, "Two forms of the kernel").
constexpr std::int64_t kPersistentSteps = 16;
constexpr int kTmaThreads = kCopyThreads + kComputeThreads;
// Registers a thread: the copying warpgroup gives what the computing ones take, within the
// 64K registers of an sm_90 multiprocessor (128 x 40 + 256 x 232).
constexpr int kCopyRegisters = 40, kComputeRegisters = 232;
static_assert(kCopyThreads * kCopyRegisters + kComputeThreads * kComputeRegisters <= 65536,
              "the register file holds the three warpgroups");
constexpr int kTmaStageBytes = (kTmaRows + kTileCols + kCheckRows) * kTileK * 2;
constexpr int kTmaTileBytes = kTmaRows * kTileCols * 2;  // the staged output tile
static_assert(kOutSlabCols == kTileK, "the output map's boxes are the operands' (tile_map)");
static_assert(kTmaStageBytes % 1024 == 0 && kTmaTileBytes % 1024 == 0,
              "stages and the staged tile keep the swizzle's alignment");
// A kernel's shared memory: the ring, the staged tile (after the ring where the grid is
// persistent, else in it), the bias, the barriers and room to align.
template <int Stages, bool Persistent>
struct TmaLayout {
  static constexpr int kRingBytes = Stages * kTmaStageBytes;
  static constexpr int kTileAt = Persistent ? kRingBytes : 0;
  static constexpr int kBiasAt = Persistent ? kRingBytes + kTmaTileBytes : kRingBytes;
  static constexpr std::size_t kBytes = kBiasAt + kTileCols * 4 + 2 * Stages * 8 + 1024;
  static_assert(kRingBytes >= kTmaTileBytes, "a ring holds the staged tile");
};

#if defined(PARITY_WGMMA)
constexpr unsigned kTmaBlockBytes = 64 * 128;  // 64 rows of a slab

// One k-step's products of the warpgroup's two 64-row blocks of the stage's input slab (a) by the
// N rows of a weight slab (b), 16 columns (32 bytes along a swizzled row) a product; issued, not
// waited for.
template <int N>
__device__ __forceinline__ void issue_step(float (&d)[2][N / 8][4], std::uint64_t a,
                                           std::uint64_t b, unsigned stage) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk)
      mma::wg::mma_ss<N>(d[mt], mma::wg::advance(a, stage + mt * kTmaBlockBytes + kk * 32),
                         mma::wg::advance(b, stage + kk * 32), 1);
}
#endif

template <int Stages, bool Persistent>
__global__ __launch_bounds__(kTmaThreads, 1) void tma_kernel(const __grid_constant__ CUtensorMap ma,
                                                             const __grid_constant__ CUtensorMap mw,
                                                             const __grid_constant__ CUtensorMap mc,
                                                             const __grid_constant__ CUtensorMap mo,
                                                             FusedArgs g) {
#if defined(PARITY_WGMMA)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* base = smem_raw + (-mma::shared_address(smem_raw) & 1023);
  using Layout = TmaLayout<Stages, Persistent>;
  auto* tile = reinterpret_cast<std::uint16_t*>(base + Layout::kTileAt);
  auto* bias = reinterpret_cast<float*>(base + Layout::kBiasAt);
  auto* full = reinterpret_cast<std::uint64_t*>(bias + kTileCols);
  std::uint64_t* empty = full + Stages;
  const std::int64_t tiles = (g.n + kTmaRows - 1) / kTmaRows * g.tiles;
  const int steps = static_cast<int>((g.k + kTileK - 1) / kTileK);
  const int warp = static_cast<int>(threadIdx.x) / 32, group = warp / 4;
  if (threadIdx.x == 0) {
    for (int st = 0; st < Stages; ++st) {
      mma::wg::barrier_init(&full[st], 1);   // the copying thread's, with the bytes
      mma::wg::barrier_init(&empty[st], 2);  // one a computing warpgroup
    }
    mma::wg::barrier_init_fence();
  }
  __syncthreads();

  // it counts the block's k-steps over all its tiles: the stage is it % Stages, and its
  // barriers' phase flips each round of the ring.
  if (group == 0) {
    mma::wg::set_max_registers<kCopyRegisters, false>();
    if (threadIdx.x == 0) {
      int it = 0;
      for (std::int64_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
        const int r0 = static_cast<int>(tl / g.tiles * kTmaRows);
        const int c0 = static_cast<int>(tl % g.tiles * kTileCols);
        const bool checksum = c0 == 0;
        const unsigned bytes = (kTmaRows + kTileCols + (checksum ? kCheckRows : 0)) * kTileK * 2;
        for (int i = 0; i < steps; ++i, ++it) {
          const int st = it % Stages;
          // The stage's last step, it - Stages, released by every computing warpgroup.
          if (it >= Stages) mma::wg::barrier_wait(&empty[st], (it / Stages - 1) & 1);
          mma::wg::barrier_expect(&full[st], bytes);
          unsigned char* p = base + st * kTmaStageBytes;
          const int k0 = i * kTileK;
          mma::wg::tma_load_2d(p, &ma, k0, r0, &full[st]);
          mma::wg::tma_load_2d(p + kTmaRows * kTileK * 2, &mw, k0, c0, &full[st]);
          if (checksum)
            mma::wg::tma_load_2d(p + (kTmaRows + kTileCols) * kTileK * 2, &mc, k0, 0, &full[st]);
        }
      }
    }
    return;
  }

  mma::wg::set_max_registers<kComputeRegisters, true>();
  const int half = group - 1;  // this warpgroup's 128 rows of the tile
  const int t = static_cast<int>(threadIdx.x) - kCopyThreads;
  constexpr unsigned kRowGroup = 8 * 128;  // bytes between groups of 8 rows of a slab
  const std::uint64_t a_desc = mma::wg::descriptor(base + half * 2 * kTmaBlockBytes, 16, kRowGroup);
  const std::uint64_t b_desc = mma::wg::descriptor(base + kTmaRows * 128, 16, kRowGroup);
  const std::uint64_t c_desc =
      mma::wg::descriptor(base + (kTmaRows + kTileCols) * 128, 16, kRowGroup);
  const int first = half * 128 + (warp % 4) * 16;
  int it = 0;
  for (std::int64_t tl = blockIdx.x; tl < tiles; tl += gridDim.x) {
    const std::int64_t tile_col = tl % g.tiles, tile_row = tl / g.tiles;
    const std::int64_t r0 = tile_row * kTmaRows, c0 = tile_col * kTileCols;
    const bool checksum = tile_col == 0;
    float acc[2][kTileCols / 8][4], chk[2][1][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kTileCols / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) chk[mt][0][e] = 0.0f;
    }
    for (int i = 0; i < steps; ++i, ++it) {
      const int st = it % Stages;
      mma::wg::barrier_wait(&full[st], (it / Stages) & 1);
      const unsigned stage = static_cast<unsigned>(st * kTmaStageBytes);
      mma::wg::fence();
      issue_step<kTileCols>(acc, a_desc, b_desc, stage);
      if (checksum) {
        mma::wg::fence();  // past the branch, the compiler would otherwise add it
        issue_step<kCheckRows>(chk, a_desc, c_desc, stage);
      }
      mma::wg::commit();
      mma::wg::wait<1>();  // step it - 1's products are done: its stage may be refilled
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma::wg::pin(acc[mt]);
        mma::wg::pin(chk[mt]);
      }
      if (i > 0 && t % 128 == 0) mma::wg::barrier_arrive(&empty[(it - 1) % Stages]);
    }
    mma::wg::wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mma::wg::pin(acc[mt]);
      mma::wg::pin(chk[mt]);
    }
    // The tile's last step read: the copies of the next tile may take its stage.
    if (t % 128 == 0) mma::wg::barrier_arrive(&empty[(it - 1) % Stages]);
    // The last tile's staged output read by its stores (the bias's readers are past the barrier
    // before them).
    if (t == 0 && g.vector) mma::wg::bulk_wait<0, true>();
    stage_bias(g, c0, t, bias);
    mma::wg::sync_threads<kComputeThreads>();
    // The planted fault's place in this tile, if it is here.
    int fault = -1;
    if (g.fault >= 0) {
      const std::int64_t fr = g.fault / g.m - r0, fc = g.fault % g.m - c0;
      if (fr >= 0 && fr < kTmaRows && fc >= 0 && fc < kTileCols)
        fault = static_cast<int>(fr * kTileCols + fc);
    }
    const bool edge = r0 + kTmaRows > g.n || c0 + kTileCols > g.m;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      if (fault >= 0) plant(g, acc[mt], first + mt * 64, fault, bias);
      if (edge)
        stage_rows<true>(g, acc[mt], chk[mt], first + mt * 64, r0, c0, tile_col, checksum, bias,
                         tile);
      else
        stage_rows<false>(g, acc[mt], chk[mt], first + mt * 64, r0, c0, tile_col, checksum, bias,
                          tile);
    }
    if (g.vector) {
      // Stored by the tensor-memory accelerator while the next tile's products run.
      mma::wg::fence_shared();
      mma::wg::sync_threads<kComputeThreads>();
      if (t == 0) {
        for (int slab = 0; slab < kTileCols / kOutSlabCols && c0 + slab * kOutSlabCols < g.m;
             ++slab)
          mma::wg::tma_store_2d(&mo, static_cast<int>(c0) + slab * kOutSlabCols,
                                static_cast<int>(r0), tile + slab * kTmaRows * kOutSlabCols);
        mma::wg::bulk_commit();
      }
    } else {
      mma::wg::sync_threads<kComputeThreads>();
      store_tile<kComputeThreads>(g, tile, r0, c0, t);
    }
  }
  if (t == 0 && g.vector) mma::wg::bulk_wait<0, false>();
#else
  (void)ma;
  (void)mw;
  (void)mc;
  (void)mo;
  (void)g;
#endif
}
#endif

}  // namespace

#if defined(PARITY_CUDA_SM90A)
namespace {
// The driver's cuTensorMapEncodeTiled, through the runtime (parity links no libcuda).
using EncodeTiled = decltype(&cuTensorMapEncodeTiled);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A tensor map of a row-major bf16 matrix [rows, cols] (row stride ld elements), in boxes of 64
// columns by box_rows rows with the 128-byte swizzle; reads past its edges give zeros.
CUtensorMap tile_map(const void* data, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                     int box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr)
    throw Error("product_check_fused: the driver gives no cuTensorMapEncodeTiled");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kTileK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box,
             unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("product_check_fused: cuTensorMapEncodeTiled failed (" + std::to_string(r) +
                ") for a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] matrix");
  return map;
}
}  // namespace
#endif

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
  // Rounded up, so that the fp32 sums' share of the bound is never undercounted.
  const double depth = static_cast<double>(p.check_depth > 0 ? p.check_depth : p.k);
  g.walk_share = std::nextafter(static_cast<float>(1.0 / (4.0 * (depth / 3.0 + 1.0))), 1.0f);
#if defined(PARITY_CUDA_SM90A)
  CUtensorMap ma{}, mw{}, mc{}, mo{};
  if (!rehearsing()) {
    ma = tile_map(p.a, p.n, p.k, p.lda, kTmaRows);
    mw = tile_map(p.w, p.m, p.k, p.ldw, kTileCols);  // rows from m on read as zeros
    mc = tile_map(static_cast<const std::uint16_t*>(p.w) + p.m * p.ldw, 2, p.k, p.ldw, kCheckRows);
    if (g.vector) mo = tile_map(p.out, p.n, p.m, p.ldo, kTmaRows);
  }
  // Persistent (short tiles): a block a multiprocessor, or a tile a block where there are fewer.
  const std::int64_t tiles = ceil_div(p.n, kTmaRows) * g.tiles;
  if (ceil_div(p.k, kTileK) <= kPersistentSteps) {
    const std::int64_t blocks = std::min<std::int64_t>(tiles, device_info().multiprocessor_count);
    launch("product_check_fused", tma_kernel<3, true>,
           {blocks, kTmaThreads, TmaLayout<3, true>::kBytes}, s, ma, mw, mc, mo, g);
  } else {
    launch("product_check_fused", tma_kernel<4, false>,
           {tiles, kTmaThreads, TmaLayout<4, false>::kBytes}, s, ma, mw, mc, mo, g);
  }
#else
  (void)s;
#endif
}

}  // namespace parity::gpu
