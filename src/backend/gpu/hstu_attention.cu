// The HSTU attention on tensor cores (see hstu_attention.h).
//
// Why it is built this way:
// - One block takes 128 rows of one head of one sequence: query rows in the forward and dq (one
//   kernel template), keys in the key-side backward (dk, dv). The first two walk the query tile's
//   key tiles, the third the key tile's query tiles; tiles with no visible pair (above the
//   diagonal, or among the targets off it) are never loaded. Launches put the heaviest tiles
//   first (the last query tiles of the longest sequences, the first key tiles), so short and long
//   sequences share the device in one grid.
// - Consecutive short sequences that fit in one block together share it (a run, kPackedBlock):
//   the block takes them as one sequence, and each row sees only its own sequence's pairs (its
//   RowSpan). Most histories of a heavy-tailed batch are far shorter than a block, and a block's
//   fixed costs (loads, bias tables, barriers, the pipeline's fill) are then paid once per run.
// - In the forward and dq the scores live only in registers: the fp32 accumulators of Q Kᵀ get
//   the bias, the mask and SiLU, are rounded to bf16 and are fed straight back as the A operand of
//   the next product (mma.cuh says why the layouts agree). The key-side backward writes Pᵀ and dSᵀ
//   to shared memory once per step so that its dV and dK products can use a warp grid that
//   reuses each B fragment twice. Operand tiles are double-buffered by cp.async; rows are
//   XOR-swizzled in 16-byte chunks so that ldmatrix reads hit distinct banks.
// - Tiles far from the diagonal of a long sequence have one bias value for every pair; they skip
//   the per-pair bucket lookups.
// - No atomics on the data gradients: dq has its own kernel (it recomputes the scores), so every
//   output element is one thread's sum in a fixed order and runs repeat bit for bit. The bias
//   gradients are 64-bit fixed-point totals (2^-32 units), in shared memory and then in global
//   memory, as the scalar kernels keep them: integer sums do not depend on the order of the adds.
//   Runs of same-bucket pairs are summed in fp32 first (a key's queries come in order), one-value
//   tiles per warp, and the position buckets of tiles near the diagonal one diagonal per thread.
// - Registers are the kernels' limit (the D = 64 forward has 128 a thread, two blocks an SM):
//   values that a walk would hoist and hold (descriptor and fragment offsets) are recomputed per
//   step behind an empty asm where that avoids spills. The D = 64 forward still spills 20
//   bytes; recomputing its copies' offsets too removes that and measured slower.
// - SiLU's sigmoid comes from the one-instruction tanh, σ(x) = (1 + tanh(x/2)) / 2: the scores
//   are rounded to bf16 right after, far coarser than its error.
#include "backend/gpu/hstu_attention.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/gpu/launch.h"
#include "backend/gpu/mma.cuh"
#include "parity/error.h"

namespace parity::gpu {
namespace {

constexpr int kRows = 128;  // a block's own tile: query rows (forward, dq) or keys (dk, dv)
static_assert(kRows == kSequenceBlockRows, "SequenceBatch::blocks lists blocks of kRows tokens");
[[maybe_unused]] constexpr float kFixedScale = 4294967296.0f;  // 2^32: bias gradients' unit

// A kernel's shape: each warp owns MT 16-row m-tiles of the block's kRows (more rows a warp reuse
// each B fragment MT times, fewer registers remain), and the block walks the other side WALK rows
// at a time.
template <int D_, int MT_, int WALK_>
struct Shape {
  static constexpr int D = D_, MT = MT_, WALK = WALK_;
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int kWarps = kRows / kWarpRows;
  static constexpr int kThreads = kWarps * 32;
};
// Register budgets (255 a thread) set these: the fp32 accumulators of the output rows (MT x D / 2
// a thread per output) plus the walked scores (MT x WALK / 2 each).
template <int D>
using ForwardShape = Shape<D, 2, (D >= 128 ? 32 : 64)>;
template <int D>
using QueryShape = Shape<D, 1, 64>;
// The key-side backward computes its transposed scores with 8 warps of 16 keys over 64 queries
// a step, then its products dV += Pᵀ dO and dK += dSᵀ Q with the warps as a KW x DW grid over
// (keys, head dims), Pᵀ and dSᵀ passing through shared memory: each warp's accumulators are then
// 2 x (128 / KW) x (D / DW) / 32 floats, and every B fragment it loads serves 128 / KW / 16
// m-tiles.
template <int D_>
struct KeyShape {
  static constexpr int D = D_, MT = 1, WALK = 64;
  static constexpr int kWarpRows = 16, kWarps = 8, kThreads = 256;
  static constexpr int DW = D >= 32 ? 2 : 1, KW = kWarps / DW;
  static constexpr int kKeyRows = kRows / KW, kDims = D / DW;  // a warp's block of dK, dV
};

struct Args {
  const std::int64_t* offsets;
  const std::int64_t* times;
  const std::int64_t* blocks;  // SequenceBatch::blocks (null: every tile of every sequence)
  std::int64_t block_count;
  std::int64_t packed_from;  // blocks[packed_from..] are runs of short sequences (kPackedBlock)
  std::int64_t batch;
  int heads, targets, pb, tb, tiles;
  float scale, inv_n;
  const float* position;
  const float* time;
};

// A bf16 matrix: its element (0, 0) and leading dimension (elements).
struct In {
  const std::uint16_t* p;
  std::int64_t ld;
};
struct Out {
  void* p;
  std::int64_t ld;
};

// The pairs of one block: which sequence, head and tile it takes; or a run of `count` short
// sequences from `seq` on, taken as one sequence of n tokens whose rows see only their own
// sequence's (RowSpan).
struct Work {
  std::int64_t begin, n, history, seq;
  int h, tile, count;
};

// What row r of a block sees: keys j (of the block's sequence, or run) with start <= j <= r, j
// < hend or j == r, and queries i < end. One sequence's rows share {0, history, n}; in a run each
// row has its own sequence's bounds, local to the run.
struct RowSpan {
  int start, hend, end;
};

#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)

// Element (row, col) of a [rows, D] shared tile, 16-byte chunks XOR-swizzled by row.
template <int D>
__device__ __forceinline__ int swizzle(int row, int col) {
  constexpr int chunks = D / 8;
  constexpr int mask = chunks < 8 ? chunks - 1 : 7;
  const int chunk = col >> 3;
  return row * D + (((chunk & ~mask) | ((chunk ^ row) & mask)) << 3) + (col & 7);
}

// Element (row, col) of a [ROWS, D] shared tile in the layout of the warpgroup products
// (mma.cuh): 64-column slabs of ROWS rows, 16-byte chunks XOR-swizzled by row.
template <int D, int ROWS>
__device__ __forceinline__ int slab_swizzle(int row, int col) {
  return (col >> 6) * ROWS * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Rows [row0, row0 + ROWS) of head h's D columns into a shared tile, zeros past valid rows; in
// the slab layout when kSlabs.
template <int D, int ROWS, int THREADS, bool kSlabs = false>
__device__ __forceinline__ void copy_tile(std::uint16_t* dst, In src, int h, std::int64_t row0,
                                          std::int64_t valid) {
  constexpr int chunks = D / 8;
  for (int i = static_cast<int>(threadIdx.x); i < ROWS * chunks; i += THREADS) {
    const int r = i / chunks, c = i % chunks;
    const bool ok = r < valid;
    const std::uint16_t* from = src.p + (ok ? (row0 + r) * src.ld + h * D + c * 8 : 0);
    mma::copy_async_16(dst + (kSlabs ? slab_swizzle<D, ROWS>(r, c * 8) : swizzle<D>(r, c * 8)),
                       from, ok);
  }
}

template <int ROWS, int THREADS>
__device__ __forceinline__ void copy_times(std::int64_t* dst, const std::int64_t* times,
                                           std::int64_t row0, std::int64_t valid) {
  for (int r = static_cast<int>(threadIdx.x); r < ROWS; r += THREADS)
    dst[r] = r < valid ? times[row0 + r] : 0;
}

// The A fragment of rows [r0, r0+16) and columns [k0, k0+16) of a row-major tile.
template <int D>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const std::uint16_t* s, int r0, int k0) {
  const int l = lane_id();
  mma::load_x4(a, s + swizzle<D>(r0 + (l & 7) + ((l >> 3) & 1) * 8, k0 + (l >> 4) * 8));
}
// B fragments of two 8-column tiles (b[0..1] columns n0.., b[2..3] n0+8..) over k [k0, k0+16)
// from a tile stored [n][k] (its rows are B's columns).
template <int D>
__device__ __forceinline__ void load_b_nk(unsigned (&b)[4], const std::uint16_t* s, int n0,
                                          int k0) {
  const int l = lane_id();
  mma::load_x4(b, s + swizzle<D>(n0 + (l & 7) + (l >> 4) * 8, k0 + ((l >> 3) & 1) * 8));
}
// The same from a tile stored [k][n] (transposed on the way).
template <int D>
__device__ __forceinline__ void load_b_kn(unsigned (&b)[4], const std::uint16_t* s, int k0,
                                          int n0) {
  const int l = lane_id();
  mma::load_x4_transposed(b, s + swizzle<D>(k0 + (l & 7) + ((l >> 3) & 1) * 8, n0 + (l >> 4) * 8));
}

// The A operand of the 16 columns [16 kb, 16 kb + 16) of fp32 accumulators, rounded to bf16.
template <int NT>
__device__ __forceinline__ void to_a(unsigned (&a)[4], const float (&c)[NT][4], int kb) {
  a[0] = mma::pack_bf16(c[2 * kb][0], c[2 * kb][1]);
  a[1] = mma::pack_bf16(c[2 * kb][2], c[2 * kb][3]);
  a[2] = mma::pack_bf16(c[2 * kb + 1][0], c[2 * kb + 1][1]);
  a[3] = mma::pack_bf16(c[2 * kb + 1][2], c[2 * kb + 1][3]);
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < NT; ++i) c[m][i][0] = c[m][i][1] = c[m][i][2] = c[m][i][3] = 0.0f;
}

// c [MT x 16 rows, N] += A · Bᵀ where A is rows [r0, r0 + 16 MT) of a shared [.., D] tile and B
// the N rows of another (scores: q · k over the head's D columns).
template <int D, int MT, int N>
__device__ __forceinline__ void rows_times_rows(float (&c)[MT][N / 8][4],
                                                const std::uint16_t* a_tile, int r0,
                                                const std::uint16_t* b_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) load_a<D>(a[m], a_tile, r0 + 16 * m, kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned b[4];
      load_b_nk<D>(b, b_tile, np * 16, kk * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma::mma_bf16(c[m][2 * np], a[m], b[0], b[1]);
        mma::mma_bf16(c[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// c [MT x 16, D] += P [MT x 16, K] · T where P is fp32 accumulators and T a shared [K, D] tile.
template <int D, int MT, int K>
__device__ __forceinline__ void acc_times_tile(float (&c)[MT][D / 8][4],
                                               const float (&p)[MT][K / 8][4],
                                               const std::uint16_t* tile) {
#pragma unroll
  for (int kb = 0; kb < K / 16; ++kb) {
    unsigned a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) to_a(a[m], p[m], kb);
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      unsigned b[4];
      load_b_kn<D>(b, tile, kb * 16, dn * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma::mma_bf16(c[m][2 * dn], a[m], b[0], b[1]);
        mma::mma_bf16(c[m][2 * dn + 1], a[m], b[2], b[3]);
      }
    }
  }
}

__device__ __forceinline__ int time_bucket(std::int64_t delta, int tb) {
  const int width = delta <= 0 ? 0 : 64 - __clzll(static_cast<long long>(delta));
  return width < tb - 1 ? width : tb - 1;
}
__device__ __forceinline__ int position_bucket(int dist, int pb) {
  return dist <= 0 ? 0 : dist < pb - 1 ? dist : pb - 1;
}
__device__ __forceinline__ bool visible(int il, int jl, int n, int history) {
  return il < n && jl <= il && (jl < history || jl == il);
}
// visible() for a pair of a block's sequence or run of n tokens, from the query's span (query
// side: its row's key range [start, hend)) or the key's (key side: queries before end).
__device__ __forceinline__ bool seen_by_query(int il, int jl, int n, int start, int hend) {
  return visible(il, jl, n, hend) && jl >= start;
}
__device__ __forceinline__ bool seen_by_key(int il, int jl, int hend, int end) {
  return visible(il, jl, end, hend);
}
__device__ __forceinline__ float sigmoid_fast(float x) {
  return 0.5f + 0.5f * mma::tanh_approx(0.5f * x);
}
// SiLU(x) / n = (x / 2n) (1 + tanh(x / 2)): one instruction fewer than x σ(x) / n.
__device__ __forceinline__ float silu_over_n(float x, float inv_n) {
  const float a = 0.5f * inv_n * x;
  return fmaf(a, mma::tanh_approx(0.5f * x), a);
}

__device__ __forceinline__ void store_pair(Out o, std::int64_t row, int col, float a, float b,
                                           bool bf16) {
  if (bf16) {
    *reinterpret_cast<unsigned*>(static_cast<std::uint16_t*>(o.p) + row * o.ld + col) =
        mma::pack_bf16(a, b);
  } else {
    *reinterpret_cast<float2*>(static_cast<float*>(o.p) + row * o.ld + col) = make_float2(a, b);
  }
}

// A warp's accumulator rows (tile row0 on), scaled, into head h's columns.
template <class S>
__device__ __forceinline__ void store_rows(Out o, bool bf16, const float (&c)[S::MT][S::D / 8][4],
                                           const Work& w, std::int64_t row0, float mul) {
  const int l = lane_id(), warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int m = 0; m < S::MT; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t r = row0 + warp * S::kWarpRows + m * 16 + (l >> 2) + half * 8;
      if (r >= w.n) continue;
#pragma unroll
      for (int nt = 0; nt < S::D / 8; ++nt)
        store_pair(o, w.begin + r, w.h * S::D + nt * 8 + (l & 3) * 2, c[m][nt][2 * half] * mul,
                   c[m][nt][2 * half + 1] * mul, bf16);
    }
}

__device__ __forceinline__ bool work_of(const Args& g, bool heaviest_last_tile, Work& w) {
  const std::int64_t x = blockIdx.x;
  std::int64_t b = 0;
  w.count = 0;
  if (g.blocks != nullptr) {
    // The list holds the last tiles first, walked backward for tile 0 (the heaviest key tiles);
    // the runs of short sequences, the lightest blocks either way, come last in both walks.
    const std::int64_t i = x / g.heads;
    const std::int64_t item =
        g.blocks[heaviest_last_tile || i >= g.packed_from ? i : g.packed_from - 1 - i];
    w.h = static_cast<int>(x % g.heads);
    b = item >> 20;
    if (item & kPackedBlock) {
      w.seq = b;
      w.count = static_cast<int>(item & (kPackedBlock - 1));
      w.tile = 0;
      w.begin = g.offsets[b];
      w.n = g.offsets[b + w.count] - w.begin;
      // No key counts as history: the fast paths for tiles wholly in a sequence's history never
      // take a run's tiles, and the walks cover every key and query up to n; the rows' spans
      // give each pair its mask.
      w.history = 0;
      return w.n > 0;
    }
    w.tile = static_cast<int>(item & (kPackedBlock - 1));
  } else {
    const std::int64_t bh = g.batch * g.heads;
    b = x % g.batch;
    w.h = static_cast<int>((x / g.batch) % g.heads);
    const int rank = static_cast<int>(x / bh);
    w.tile = heaviest_last_tile ? g.tiles - 1 - rank : rank;
  }
  w.begin = g.offsets[b];
  w.n = g.offsets[b + 1] - w.begin;
  w.history = w.n - g.targets;
  return static_cast<std::int64_t>(w.tile) * kRows < w.n;
}

// The block's rows' spans into span[kRows] ({start, hend, end, -}); a barrier must follow before
// they are read. Kept in shared memory, read where a step needs them: registers held across the
// walk would be the kernels' last free ones.
template <int THREADS>
__device__ __forceinline__ void fill_spans(const Args& g, const Work& w, int4* span) {
  if (w.count == 0) {
    const int4 all{0, static_cast<int>(w.history), static_cast<int>(w.n), 0};
    for (int r = static_cast<int>(threadIdx.x); r < kRows; r += THREADS) span[r] = all;
    return;
  }
  for (int r = static_cast<int>(w.n) + static_cast<int>(threadIdx.x); r < kRows; r += THREADS)
    span[r] = int4{0, 0, 0, 0};  // past the run: sees nothing
  for (int s = static_cast<int>(threadIdx.x); s < w.count; s += THREADS) {
    const int a = static_cast<int>(g.offsets[w.seq + s] - w.begin);
    const int e = static_cast<int>(g.offsets[w.seq + s + 1] - w.begin);
    const int4 own{a, max(a, e - g.targets), e, 0};
    for (int r = a; r < e; ++r) span[r] = own;
  }
}
__device__ __forceinline__ RowSpan row_span(const int4* span, int row) {
  const int4 x = span[row];
  return {x.x, x.y, x.z};
}
// A query row's [start, hend) only.
__device__ __forceinline__ int2 query_span(const int4* span, int row) {
  return *reinterpret_cast<const int2*>(span + row);
}
// The spans' place in shared memory: after the bias tables, on 16 bytes.
__device__ __forceinline__ int4* spans_after(const float* tim, const Args& g) {
  return reinterpret_cast<int4*>((reinterpret_cast<std::uintptr_t>(tim + g.tb) + 15) &
                                 ~std::uintptr_t{15});
}

template <int THREADS>
__device__ __forceinline__ void load_bias(const Args& g, int h, float* pos, float* tim) {
  for (int x = static_cast<int>(threadIdx.x); x < g.pb; x += THREADS)
    pos[x] = g.position[h * g.pb + x];
  for (int x = static_cast<int>(threadIdx.x); x < g.tb; x += THREADS) tim[x] = g.time[h * g.tb + x];
}

// The key tiles (of WALK keys) that queries [i0, i0 + kRows) see: those holding history keys
// before the queries end, then those meeting the diagonal. Returned as [0, split) then
// [diagonal, end).
struct KeyTiles {
  int split, diagonal, end;
  __device__ int count() const { return split + end - diagonal; }
  __device__ int at(int i) const { return i < split ? i : diagonal + (i - split); }
};
template <int WALK>
__device__ __forceinline__ KeyTiles key_tiles(const Work& w, std::int64_t i0) {
  const std::int64_t key_end = min(w.n, i0 + kRows);
  const std::int64_t hist_end = max(std::int64_t{0}, min(w.history, key_end));
  KeyTiles t;
  t.end = static_cast<int>((key_end + WALK - 1) / WALK);
  t.diagonal = static_cast<int>(i0 / WALK);
  t.split = min(static_cast<int>((hist_end + WALK - 1) / WALK), t.diagonal);
  return t;
}

// The score of query il and key jl: the product, scaled, plus the relative bias.
__device__ __forceinline__ float biased(const Args& g, float dot, int il, int jl, std::int64_t ti,
                                        std::int64_t tj, const float* pos, const float* tim) {
  return dot * g.scale + pos[position_bucket(il - jl, g.pb)] + tim[time_bucket(ti - tj, g.tb)];
}

// Whether a tile's relative bias is one value for all its pairs (every distance past the last
// position bucket, both extreme time gaps in one bucket), and which: far from the diagonal of a
// long sequence almost every tile is so, and its pairs skip the per-pair bias lookups.
__device__ __forceinline__ bool constant_bias(const Args& g, std::int64_t min_dist,
                                              std::int64_t min_gap, std::int64_t max_gap,
                                              const float* pos, const float* tim, float& bias,
                                              int& time_bkt) {
  if (min_dist < g.pb - 1) return false;
  time_bkt = time_bucket(min_gap, g.tb);
  if (time_bucket(max_gap, g.tb) != time_bkt) return false;
  bias = pos[g.pb - 1] + tim[time_bkt];
  return true;
}

// ---------------------------------------------------------------- forward --

template <class S>
constexpr std::size_t query_side_smem(int operands, int pb, int tb) {  // operands: q (and dO)
  return (operands * kRows * S::D + 4 * S::WALK * S::D) * 2 + (kRows + 2 * S::WALK) * 8 +
         static_cast<std::size_t>(pb + tb) * 4 + kRows * 16 + 16;
}

// The pipeline of a query-side kernel: Q (and dO) of the block's rows once, then K, V and the
// keys' times WALK keys at a time, double-buffered.
template <class S>
struct KeyWalk {
  std::uint16_t* sk;  // [2][WALK][D]
  std::uint16_t* sv;  // [2][WALK][D]
  std::int64_t* tk;   // [2][WALK]
  KeyTiles tiles;
  __device__ void load(const Args& g, const Work& w, In k, In v, int i, int stage) const {
    const std::int64_t j0 = static_cast<std::int64_t>(tiles.at(i)) * S::WALK;
    copy_tile<S::D, S::WALK, S::kThreads>(sk + stage * S::WALK * S::D, k, w.h, w.begin + j0,
                                          w.n - j0);
    copy_tile<S::D, S::WALK, S::kThreads>(sv + stage * S::WALK * S::D, v, w.h, w.begin + j0,
                                          w.n - j0);
    copy_times<S::WALK, S::kThreads>(tk + stage * S::WALK, g.times, w.begin + j0, w.n - j0);
    mma::copy_async_commit();
  }
  // Issues the next tile's copies and waits for this one's.
  __device__ void next(const Args& g, const Work& w, In k, In v, int it) const {
    if (it + 1 < tiles.count()) {
      load(g, w, k, v, it + 1, (it + 1) & 1);
      mma::copy_async_wait<1>();
    } else {
      mma::copy_async_wait<0>();
    }
    __syncthreads();
  }
};

// Calls f(m, nt, e, row, col) for each fp32 accumulator of a warp's [MT x 16, N] block whose
// first row is row0 (row and col within the block's tiles).
template <int MT, int N, class F>
__device__ __forceinline__ void for_each_element(int row0, F&& f) {
  const int l = lane_id();
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        f(m, nt, e, row0 + m * 16 + (l >> 2) + (e >> 1) * 8, nt * 8 + (l & 3) * 2 + (e & 1));
}

// The query-side kernels, one template: the forward (out = P V) and dq (dq = scale dS K, from the
// scores and dP = dO Vᵀ recomputed). A block takes kRows queries and walks their key tiles.
template <class S, bool kDq>
__global__ __launch_bounds__(S::kThreads, 1) void query_kernel(Args g, In q, In k, In v, In dout,
                                                               Out out, int out_bf16) {
  constexpr int D = S::D, MT = S::MT, WALK = S::WALK, kOperands = kDq ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* sq = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* sg = sq + kRows * D;  // dO (dq only)
  KeyWalk<S> kw;
  kw.sk = sq + kOperands * kRows * D;
  kw.sv = kw.sk + 2 * WALK * D;
  auto* tq = reinterpret_cast<std::int64_t*>(kw.sv + 2 * WALK * D);
  kw.tk = tq + kRows;
  auto* pos = reinterpret_cast<float*>(kw.tk + 2 * WALK);
  float* tim = pos + g.pb;

  Work w;
  if (!work_of(g, true, w)) return;
  const std::int64_t i0 = static_cast<std::int64_t>(w.tile) * kRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, row0 = warp * S::kWarpRows;
  load_bias<S::kThreads>(g, w.h, pos, tim);
  copy_times<kRows, S::kThreads>(tq, g.times, w.begin + i0, w.n - i0);
  copy_tile<D, kRows, S::kThreads>(sq, q, w.h, w.begin + i0, w.n - i0);
  if constexpr (kDq) copy_tile<D, kRows, S::kThreads>(sg, dout, w.h, w.begin + i0, w.n - i0);
  mma::copy_async_commit();
  kw.tiles = key_tiles<WALK>(w, i0);
  kw.load(g, w, k, v, 0, 0);
  fill_spans<S::kThreads>(g, w, spans_after(tim, g));  // read after the first step's barrier

  float acc[MT][D / 8][4];
  zero(acc);
  for (int it = 0; it < kw.tiles.count(); ++it) {
    const int stage = it & 1;
    kw.next(g, w, k, v, it);
    const std::int64_t j0 = static_cast<std::int64_t>(kw.tiles.at(it)) * WALK;
    const std::uint16_t* ks = kw.sk + stage * WALK * D;
    const std::uint16_t* vs = kw.sv + stage * WALK * D;
    const std::int64_t* tks = kw.tk + stage * WALK;
    // s: the scores, then P (forward); dp: dO Vᵀ, then dS (dq).
    float s[MT][WALK / 8][4], dp[MT][WALK / 8][4];
    zero(s);
    rows_times_rows<D, MT, WALK>(s, sq, row0, ks);
    if constexpr (kDq) {
      zero(dp);
      rows_times_rows<D, MT, WALK>(dp, sg, row0, vs);
    }
    // x: a pair's biased score; vis: whether the pair is seen.
    auto apply = [&](int m, int nt, int e, float x, bool vis) {
      if constexpr (kDq) {
        const float sig = sigmoid_fast(x);
        dp[m][nt][e] = vis ? dp[m][nt][e] * g.inv_n * sig * (1.0f + x * (1.0f - sig)) : 0.0f;
      } else {
        s[m][nt][e] = vis ? silu_over_n(x, g.inv_n) : 0.0f;
      }
    };
    const bool full = j0 + WALK - 1 <= i0 && j0 + WALK <= w.history;
    float cb = 0.0f;
    int ctb = 0;
    if (full &&
        constant_bias(g, i0 - (j0 + WALK - 1), tq[0] - tks[WALK - 1],
                      tq[min(w.n - i0, std::int64_t{kRows}) - 1] - tks[0], pos, tim, cb, ctb)) {
      for_each_element<MT, WALK>(row0, [&](int m, int nt, int e, int, int) {
        apply(m, nt, e, s[m][nt][e] * g.scale + cb, true);
      });
    } else {
      // The spans of this thread's rows (for_each_element's), read here, not kept across steps.
      int2 rs[MT][2];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          rs[m][half] =
              query_span(spans_after(tim, g), row0 + m * 16 + (lane_id() >> 2) + half * 8);
      const int n = static_cast<int>(w.n);
      for_each_element<MT, WALK>(row0, [&](int m, int nt, int e, int row, int col) {
        const int il = static_cast<int>(i0) + row, jl = static_cast<int>(j0) + col;
        const int2 r = rs[m][e >> 1];
        apply(m, nt, e, biased(g, s[m][nt][e], il, jl, tq[row], tks[col], pos, tim),
              seen_by_query(il, jl, n, r.x, r.y));
      });
    }
    if constexpr (kDq)
      acc_times_tile<D, MT, WALK>(acc, dp, ks);
    else
      acc_times_tile<D, MT, WALK>(acc, s, vs);
    __syncthreads();
  }
  store_rows<S>(out, out_bf16 != 0, acc, w, i0, kDq ? g.scale : 1.0f);
}

// The query-side kernels on warpgroup products (sm_90a), D = 64 or 128: the same walk, masks and
// element steps as query_kernel, with two warpgroups of 64 query rows each. Q Kᵀ (and dO Vᵀ) read
// both operands from shared memory; P V (dS K) takes P (dS) from the registers that held the
// scores, rounded to bf16, and V (K) read down its columns. Each warpgroup overlaps its tensor
// cores with its element steps: while P V of one key tile runs, the next tile's scores are
// ready and get their bias, mask and SiLU. Key tiles of 64 come through a three-stage ring:
// tile it + 2 loads while tile it + 1's scores and tile it's P V run.
#if defined(PARITY_WGMMA)
// Bytes from a slab tile of ROWS rows to head columns [16 kk, 16 kk + 16): slab kk / 4, 32 bytes
// a step within it.
template <int ROWS>
__device__ __forceinline__ constexpr unsigned slab_step(int kk) {
  return static_cast<unsigned>(((kk >> 2) * 64 * ROWS + (kk & 3) * 16) * 2);
}

// c (64 x N) = A Bᵀ over the D head columns (issued, not waited for): A the warpgroup's 64 rows
// of a slab tile of A_ROWS rows (a_desc at its first row), B the N rows of a slab tile at b_desc,
// `b_bytes` further on (its stage).
template <int D, int A_ROWS, int N>
__device__ __forceinline__ void rows_times_rows_wg(float (&c)[N / 8][4], std::uint64_t a_desc,
                                                   std::uint64_t b_desc, unsigned b_bytes) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    mma::wg::mma_ss<N>(c, mma::wg::advance(a_desc, slab_step<A_ROWS>(kk)),
                       mma::wg::advance(b_desc, b_bytes + slab_step<N>(kk)), kk > 0);
}
#endif

template <int D>
constexpr std::size_t query_wg_smem(int operands, int pb, int tb) {
  return (operands * kRows * D + 3 * 2 * 64 * D) * 2 + (kRows + 3 * 64) * 8 +
         static_cast<std::size_t>(pb + tb) * 4 + kRows * 16 + 16 +
         1024;  // + 1024: the swizzle period's alignment
}

// The D = 64 forward fits two blocks on an SM (registers and shared memory), so one block's
// loads and epilogue overlap another's products: short sequences have few key tiles to hide
// them behind.
template <int D, bool kDq>
__global__ __launch_bounds__(256, D == 64 && !kDq ? 2 : 1) void query_kernel_wg(Args g, In q, In k,
                                                                                In v, In dout,
                                                                                Out out,
                                                                                int out_bf16) {
#if defined(PARITY_WGMMA)
  using S = Shape<D, 1, 64>;
  static_assert(S::kThreads == 256 && (D == 64 || D == 128));
  constexpr int WALK = S::WALK, kOperands = kDq ? 2 : 1, kStages = 3;
  constexpr unsigned kRowGroup = 8 * 128;       // bytes between groups of 8 rows of a slab
  constexpr unsigned kKeySlab = WALK * 64 * 2;  // bytes between a key tile's 64-column slabs
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* sq = reinterpret_cast<std::uint16_t*>(smem_raw + (-mma::shared_address(smem_raw) & 1023));
  std::uint16_t* sg = sq + kRows * D;              // dO (dq only)
  std::uint16_t* sk = sq + kOperands * kRows * D;  // [kStages][WALK][D]
  std::uint16_t* sv = sk + kStages * WALK * D;     // [kStages][WALK][D]
  auto* tq = reinterpret_cast<std::int64_t*>(sv + kStages * WALK * D);
  std::int64_t* tk = tq + kRows;  // [kStages][WALK]
  auto* pos = reinterpret_cast<float*>(tk + kStages * WALK);
  float* tim = pos + g.pb;

  Work w;
  if (!work_of(g, true, w)) return;
  const std::int64_t i0 = static_cast<std::int64_t>(w.tile) * kRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, row0 = warp * 16;
  const int group_row = (warp / 4) * 64;  // the warpgroup's first row
  const KeyTiles tiles = key_tiles<WALK>(w, i0);
  const int count = tiles.count();
  auto load = [&](int i) {  // key tile i into its stage, one commit group (empty past the end)
    if (i < count) {
      const int st = i % kStages;
      const std::int64_t j0 = static_cast<std::int64_t>(tiles.at(i)) * WALK;
      copy_tile<D, WALK, S::kThreads, true>(sk + st * WALK * D, k, w.h, w.begin + j0, w.n - j0);
      copy_tile<D, WALK, S::kThreads, true>(sv + st * WALK * D, v, w.h, w.begin + j0, w.n - j0);
      copy_times<WALK, S::kThreads>(tk + st * WALK, g.times, w.begin + j0, w.n - j0);
    }
    mma::copy_async_commit();
  };
  // Waits until at most `pending` of this thread's copy groups are in flight, then for every
  // thread (which also frees the stage of the tile every warp has finished).
  auto arrived = [&]<int pending>() {
    mma::copy_async_wait<pending>();
    mma::wg::fence_shared();
    __syncthreads();
  };
  load_bias<S::kThreads>(g, w.h, pos, tim);
  copy_times<kRows, S::kThreads>(tq, g.times, w.begin + i0, w.n - i0);
  copy_tile<D, kRows, S::kThreads, true>(sq, q, w.h, w.begin + i0, w.n - i0);
  if constexpr (kDq) copy_tile<D, kRows, S::kThreads, true>(sg, dout, w.h, w.begin + i0, w.n - i0);
  load(0);  // one group with Q (and dO)
  load(1);
  fill_spans<S::kThreads>(g, w, spans_after(tim, g));  // read after the first barrier

  // Issues tile i's scores (and dO Vᵀ) into s (dp). Step kk of the products reads head columns
  // [16 kk, 16 kk + 16): slab kk / 4, 32 bytes a step within it.
  float s[1][WALK / 8][4], dp[1][WALK / 8][4];
  // Descriptors made once; a step moves them by constant byte offsets.
  const std::uint64_t q_desc = mma::wg::descriptor(sq + group_row * 64, 16, kRowGroup);
  const std::uint64_t g_desc =
      kDq ? mma::wg::descriptor(sg + group_row * 64, 16, kRowGroup) : 0;  // dO: dq only
  const std::uint64_t k_desc = mma::wg::descriptor(sk, 16, kRowGroup);
  const std::uint64_t v_desc = mma::wg::descriptor(sv, 16, kRowGroup);
  auto issue_scores = [&](int i) {
    const unsigned stage = (i % kStages) * WALK * D * 2;
    // The row tile's descriptors pass through an empty asm so that their per-step offsets are
    // added here, not hoisted out of the walk into registers it has none left for.
    std::uint64_t qd = q_desc, gd = g_desc;
    asm volatile("" : "+l"(qd), "+l"(gd));
    mma::wg::fence();
    rows_times_rows_wg<D, kRows, WALK>(s[0], qd, k_desc, stage);
    if constexpr (kDq) rows_times_rows_wg<D, kRows, WALK>(dp[0], gd, v_desc, stage);
    mma::wg::commit();
  };
  // Tile i's bias, mask and SiLU (or its derivative) on the scores, in place.
  auto elements = [&](int i) {
    const int st = i % kStages;
    const std::int64_t j0 = static_cast<std::int64_t>(tiles.at(i)) * WALK;
    const std::int64_t* tks = tk + st * WALK;
    auto apply = [&](int m, int nt, int e, float x, bool vis) {
      if constexpr (kDq) {
        const float sig = sigmoid_fast(x);
        dp[m][nt][e] = vis ? dp[m][nt][e] * g.inv_n * sig * (1.0f + x * (1.0f - sig)) : 0.0f;
      } else {
        s[m][nt][e] = vis ? silu_over_n(x, g.inv_n) : 0.0f;
      }
    };
    // Far from the diagonal every pair is seen and in the last position bucket: the bias is
    // one value, or varies only with the time bucket.
    const bool far =
        j0 + WALK <= w.history && i0 - (j0 + WALK - 1) >= static_cast<std::int64_t>(g.pb) - 1;
    float cb = 0.0f;
    int ctb = 0;
    if (far &&
        constant_bias(g, i0 - (j0 + WALK - 1), tq[0] - tks[WALK - 1],
                      tq[min(w.n - i0, std::int64_t{kRows}) - 1] - tks[0], pos, tim, cb, ctb)) {
      for_each_element<1, WALK>(row0, [&](int m, int nt, int e, int, int) {
        apply(m, nt, e, s[m][nt][e] * g.scale + cb, true);
      });
    } else if (far) {
      const float pfar = pos[g.pb - 1];
      for_each_element<1, WALK>(row0, [&](int m, int nt, int e, int row, int col) {
        apply(m, nt, e, s[m][nt][e] * g.scale + pfar + tim[time_bucket(tq[row] - tks[col], g.tb)],
              true);
      });
    } else {
      // The spans of this thread's two rows, read here, not kept across steps.
      const int2 rs[2] = {query_span(spans_after(tim, g), row0 + (lane_id() >> 2)),
                          query_span(spans_after(tim, g), row0 + (lane_id() >> 2) + 8)};
      const int n = static_cast<int>(w.n);
      for_each_element<1, WALK>(row0, [&](int m, int nt, int e, int row, int col) {
        const int il = static_cast<int>(i0) + row, jl = static_cast<int>(j0) + col;
        apply(m, nt, e, biased(g, s[m][nt][e], il, jl, tq[row], tks[col], pos, tim),
              seen_by_query(il, jl, n, rs[e >> 1].x, rs[e >> 1].y));
      });
    }
  };

  float acc[1][D / 8][4];
  zero(acc);
  unsigned pa[WALK / 16][4];         // P (dS) of the tile whose P V (dS K) runs, as A operands
  arrived.template operator()<1>();  // Q (dO) and tile 0
  issue_scores(0);
  mma::wg::wait<0>();
  mma::wg::pin(s[0]);
  if constexpr (kDq) mma::wg::pin(dp[0]);
  elements(0);
  auto to_operands = [&]() {
#pragma unroll
    for (int kb = 0; kb < WALK / 16; ++kb) to_a(pa[kb], kDq ? dp[0] : s[0], kb);
  };
  // acc += P V (dS K) of tile it: B is V (K) rows [16 kb, 16 kb + 16), all D columns.
  const std::uint64_t b_desc = mma::wg::descriptor(kDq ? sk : sv, kKeySlab, kRowGroup);
  auto issue_product = [&](int it) {
    mma::wg::fence();
    const unsigned stage = (it % kStages) * WALK * D * 2;
#pragma unroll
    for (int kb = 0; kb < WALK / 16; ++kb)
      mma::wg::mma_rs<D>(acc[0], pa[kb], mma::wg::advance(b_desc, stage + kb * 16 * 64 * 2));
    mma::wg::commit();
  };
  auto product_done = [&]() {
    mma::wg::wait<0>();
    mma::wg::pin(acc[0]);
#pragma unroll
    for (int kb = 0; kb < WALK / 16; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pa[kb][e]));
  };
  // Every step but the last has a next tile: its scores are issued before this tile's product
  // and get their element step while the product runs (one straight path for the compiler's
  // wgmma pipeline analysis).
  for (int it = 0; it + 1 < count; ++it) {
    arrived.template operator()<0>();  // tile it + 1; every warp is past tile it - 1's P V
    load(it + 2);                      // into tile it - 1's stage
    to_operands();                     // before the scores of tile it + 1 overwrite s
    issue_scores(it + 1);
    issue_product(it);
    mma::wg::wait<1>();  // the scores of tile it + 1; the product still running
    mma::wg::pin(s[0]);
    if constexpr (kDq) mma::wg::pin(dp[0]);
    elements(it + 1);
    product_done();
  }
  to_operands();
  issue_product(count - 1);
  product_done();
  mma::copy_async_wait<0>();
  store_rows<S>(out, out_bf16 != 0, acc, w, i0, kDq ? g.scale : 1.0f);
#else
  (void)g, (void)q, (void)k, (void)v, (void)dout, (void)out, (void)out_bf16;
  __trap();
#endif
}

// ----------------------------------------------------------------- dk, dv --

// The query tiles (of Q rows) that see keys [j0, j0 + kRows): from the diagonal to the end, or
// only those meeting the diagonal when every key of the tile is a target.
__device__ __forceinline__ void query_tiles(const Work& w, std::int64_t j0, int Q, int& first,
                                            int& end) {
  first = static_cast<int>(j0 / Q);
  const std::int64_t last = j0 < w.history ? w.n : min(w.n, j0 + kRows);
  end = static_cast<int>((last + Q - 1) / Q);
}

template <class S>
constexpr std::size_t key_side_smem(int pb, int tb) {
  return (2 * kRows * S::D + 4 * S::WALK * S::D + 2 * kRows * S::WALK) * 2 +
         static_cast<std::size_t>(kRows) * (S::WALK + 1) * 4 + (kRows + 2 * S::WALK) * 8 +
         static_cast<std::size_t>(pb + tb) * 12 + kRows * 16 + 16;
}

__device__ __forceinline__ long long to_fixed(float v) {
  return __float2ll_rn(v * kFixedScale);
}
// Adds v to a fixed-point total in shared memory as two 32-bit atomics, the carry out of the low
// word into the high one: a 64-bit atomic add in shared memory compiles to a compare-and-swap
// loop, on which lanes adding to one bucket spin. The total is exact in any order (mod 2^64),
// and its words are the 64-bit value's (little-endian).
__device__ __forceinline__ void add_fixed(unsigned long long* total, long long v) {
  const auto u = static_cast<unsigned long long>(v);
  const auto lo = static_cast<unsigned>(u), hi = static_cast<unsigned>(u >> 32);
  auto* word = reinterpret_cast<unsigned*>(total);
  const unsigned old = atomicAdd(word, lo);
  const unsigned high = hi + (old + lo < old ? 1u : 0u);
  if (high != 0) atomicAdd(word + 1, high);
}
// One bucket's running sum of a thread's pairs: added to the block's fixed-point total when the
// bucket changes. A key's queries come in increasing order, so its position and time buckets
// never decrease and each run is as long as it can be.
struct Run {
  int bucket = -1;
  float sum = 0.0f;
  __device__ void add(unsigned long long* hist, int b, float v) {
    if (b != bucket) {
      flush(hist);
      bucket = b;
      sum = 0.0f;
    }
    sum += v;
  }
  __device__ void flush(unsigned long long* hist) const {
    if (bucket >= 0 && sum != 0.0f) add_fixed(hist + bucket, to_fixed(sum));
  }
};

// Adds the warp's fixed-point values of one bucket (the same bucket in every lane) with one
// atomic: many lanes adding to one address in shared memory would take turns.
__device__ __forceinline__ void warp_flush(unsigned long long* hist, int bucket, long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += shfl_xor(kFullMask, v, o);
  if (lane_id() == 0 && v != 0) add_fixed(hist + bucket, v);
}

// A thread's fp32 accumulators (16 rows at r0 of a [.., W] bf16 tile, C layout) into the tile.
template <int W, int NT>
__device__ __forceinline__ void store_tile(std::uint16_t* tile, int r0, const float (&c)[NT][4]) {
  const int l = lane_id();
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<unsigned*>(tile +
                                   swizzle<W>(r0 + (l >> 2) + half * 8, nt * 8 + (l & 3) * 2)) =
          mma::pack_bf16(c[nt][2 * half], c[nt][2 * half + 1]);
}

// c [MT x 16 rows, N cols] += A · B with A rows [r0, r0 + 16 MT) of a shared [.., K] tile and B
// columns [n0, n0 + N) of a shared [K, D] tile (stored [k][n]).
template <int K, int D, int MT, int N>
__device__ __forceinline__ void tile_times_tile(float (&c)[MT][N / 8][4], const std::uint16_t* a,
                                                int r0, const std::uint16_t* b, int n0) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned af[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) load_a<K>(af[m], a, r0 + 16 * m, kk * 16);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned bf[4];
      load_b_kn<D>(bf, b, kk * 16, n0 + np * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma::mma_bf16(c[m][2 * np], af[m], bf[0], bf[1]);
        mma::mma_bf16(c[m][2 * np + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// The key side's element step and relative-bias gradient sums, one body for dkv_kernel and
// dkv_kernel_wg: a warp holds the transposed scores of its 16 keys (rows) over a step's Q queries
// (columns), in the C layout.
template <int Q>
struct KeySums {
  Run time_run[2];
  // Tiles of one bias value add to warp-wide totals: the last position bucket, and the time
  // bucket of the latest such tile (the same in every lane: it is the tile's).
  long long sat_fixed = 0, tile_fixed = 0;
  int tile_bucket = -1;

  // Turns sT (the scores) into Pᵀ and dpT (dO Vᵀ) into dSᵀ, in place, for the queries [i0,
  // i0 + Q) and keys [j0, j0 + kRows) of the block, and adds the pairs' bias gradients. Returns
  // whether the step is near the diagonal: its dSᵀ is then in sdf, for diagonals() after a block
  // barrier.
  __device__ bool elements(const Args& g, const Work& w, std::int64_t i0, std::int64_t j0,
                           float (&sT)[Q / 8][4], float (&dpT)[Q / 8][4], const std::int64_t* tqs,
                           const std::int64_t* tk, const float* pos, const float* tim, float* sdf,
                           unsigned long long* hist) {
    // Far from the diagonal every pair is seen and in the last position bucket: the bias is one
    // value, or varies only with the time bucket; the position gradients are one sum.
    const bool far = j0 + kRows <= w.history && i0 + Q <= w.n &&
                     i0 - (j0 + kRows - 1) >= static_cast<std::int64_t>(g.pb) - 1;
    float cb = 0.0f;
    int ctb = 0;
    if (far && constant_bias(g, i0 - (j0 + kRows - 1), tqs[0] - tk[kRows - 1], tqs[Q - 1] - tk[0],
                             pos, tim, cb, ctb)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < Q / 8; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            sum += pair(g, sT[nt][half * 2 + c], dpT[nt][half * 2 + c], cb, true);
        if (ctb != tile_bucket) {
          if (tile_bucket >= 0) warp_flush(hist + g.pb, tile_bucket, tile_fixed);
          tile_bucket = ctb;
          tile_fixed = 0;
        }
        sat_fixed += to_fixed(sum);
        tile_fixed += to_fixed(sum);
      }
      return false;
    }
    if (far)
      pairs<true>(g, w, i0, j0, sT, dpT, tqs, tk, pos, tim, sdf, hist);
    else
      pairs<false>(g, w, i0, j0, sT, dpT, tqs, tk, pos, tim, sdf, hist);
    return !far;
  }

  // elements() on a step whose bias varies by pair: far from the diagonal (kFar: every pair seen,
  // one position bucket, summed into sat_fixed) or near it (masks, position buckets, dSᵀ into
  // sdf). Pairs in order of the query within each key row: same-bucket pairs come in runs.
  template <bool kFar>
  __device__ void pairs(const Args& g, const Work& w, std::int64_t i0, std::int64_t j0,
                        float (&sT)[Q / 8][4], float (&dpT)[Q / 8][4], const std::int64_t* tqs,
                        const std::int64_t* tk, const float* pos, const float* tim, float* sdf,
                        unsigned long long* hist) {
    const int l = lane_id(), warp = static_cast<int>(threadIdx.x) / 32;
    const float pfar = pos[g.pb - 1];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * 16 + (l >> 2) + half * 8;
      const int jl = static_cast<int>(j0) + row;
      const RowSpan key = kFar ? RowSpan{} : row_span(spans_after(tim, g), row);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < Q / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int e = half * 2 + c, col = nt * 8 + (l & 3) * 2 + c;
          const int tbk = time_bucket(tqs[col] - tk[row], g.tb);
          if constexpr (kFar) {
            const float ds = pair(g, sT[nt][e], dpT[nt][e], pfar + tim[tbk], true);
            sum += ds;
            time_run[half].add(hist + g.pb, tbk, ds);
          } else {
            const int il = static_cast<int>(i0) + col;
            const bool vis = seen_by_key(il, jl, key.hend, key.end);
            const float ds =
                pair(g, sT[nt][e], dpT[nt][e], pos[position_bucket(il - jl, g.pb)] + tim[tbk], vis);
            sdf[row * (Q + 1) + col] = ds;
            if (vis) time_run[half].add(hist + g.pb, tbk, ds);
          }
        }
      if constexpr (kFar) sat_fixed += to_fixed(sum);
    }
  }

  // One pair: its score s becomes P = SiLU(x) / n and dp (dO·v) becomes dS = dp SiLU'(x) / n, x
  // the biased score; zeros where unseen. Returns dS.
  __device__ static float pair(const Args& g, float& s, float& dp, float bias, bool vis) {
    const float x = s * g.scale + bias;
    const float sig = sigmoid_fast(x);
    const float ds = vis ? dp * g.inv_n * sig * (1.0f + x * (1.0f - sig)) : 0.0f;
    s = vis ? x * sig * g.inv_n : 0.0f;
    dp = ds;
    return ds;
  }

  // The position gradients of a step near the diagonal: thread x sums diagonal x of the tile
  // (query - key = x - (kRows - 1) within it) in a fixed order, one bucket, so one add; the
  // diagonals past the last bucket join sat_fixed.
  template <int THREADS>
  __device__ void diagonals(const Args& g, std::int64_t i0, std::int64_t j0, const float* sdf,
                            unsigned long long* hist) {
    static_assert(kRows + Q - 1 <= THREADS, "a thread per diagonal");
    const int x = static_cast<int>(threadIdx.x), o = x - (kRows - 1);
    if (x >= kRows + Q - 1) return;
    float sum = 0.0f;
    for (int jr = max(0, -o); jr < min(kRows, Q - o); ++jr) sum += sdf[jr * (Q + 1) + jr + o];
    const std::int64_t dist = i0 - j0 + o;
    if (sum == 0.0f || dist < 0) return;
    if (dist >= g.pb - 1)
      sat_fixed += to_fixed(sum);
    else
      add_fixed(hist + dist, to_fixed(sum));
  }

  // Every partial sum into the block's histogram.
  __device__ void flush(const Args& g, unsigned long long* hist) {
#pragma unroll
    for (int half = 0; half < 2; ++half) time_run[half].flush(hist + g.pb);
    warp_flush(hist, g.pb - 1, sat_fixed);
    if (tile_bucket >= 0) warp_flush(hist + g.pb, tile_bucket, tile_fixed);
  }
};

// The block's histogram (after a barrier) into head h's global fixed-point totals.
template <int THREADS>
__device__ void add_histogram(const Args& g, int h, const unsigned long long* hist,
                              unsigned long long* fixed_pos, unsigned long long* fixed_time) {
  for (int x = static_cast<int>(threadIdx.x); x < g.pb + g.tb; x += THREADS) {
    if (hist[x] == 0) continue;
    if (x < g.pb)
      atomicAdd(fixed_pos + h * g.pb + x, hist[x]);
    else
      atomicAdd(fixed_time + h * g.tb + (x - g.pb), hist[x]);
  }
}

template <class S>
__global__ __launch_bounds__(S::kThreads, 1) void dkv_kernel(Args g, In q, In k, In v, In dout,
                                                             Out dk, Out dv, int out_bf16,
                                                             unsigned long long* fixed_pos,
                                                             unsigned long long* fixed_time) {
  constexpr int D = S::D, Q = S::WALK, MB = S::kKeyRows / 16, NB = S::kDims;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* sk = reinterpret_cast<std::uint16_t*>(smem);
  auto* sv = sk + kRows * D;
  auto* sq = sv + kRows * D;   // [2][Q][D]
  auto* sg = sq + 2 * Q * D;   // [2][Q][D]
  auto* sp = sg + 2 * Q * D;   // Pᵀ [kRows][Q]
  auto* sds = sp + kRows * Q;  // dSᵀ [kRows][Q]
  // dSᵀ in fp32 for the position gradients of tiles near the diagonal, rows padded by one so
  // that a warp reading a diagonal hits 32 banks.
  auto* sdf = reinterpret_cast<float*>(sds + kRows * Q);  // [kRows][Q + 1]
  auto* tk = reinterpret_cast<std::int64_t*>(sdf + kRows * (Q + 1));
  auto* tq = tk + kRows;                                           // [2][Q]
  auto* hist = reinterpret_cast<unsigned long long*>(tq + 2 * Q);  // [pb + tb]
  auto* pos = reinterpret_cast<float*>(hist + g.pb + g.tb);
  float* tim = pos + g.pb;

  Work w;
  if (!work_of(g, false, w)) return;
  const std::int64_t j0 = static_cast<std::int64_t>(w.tile) * kRows;
  const int l = lane_id(), warp = static_cast<int>(threadIdx.x) / 32;
  // This warp's block of dK and dV: keys [kr0, kr0 + kKeyRows), dims [d0, d0 + kDims).
  const int kr0 = (warp / S::DW) * S::kKeyRows, d0 = (warp % S::DW) * S::kDims;
  load_bias<S::kThreads>(g, w.h, pos, tim);
  for (int x = static_cast<int>(threadIdx.x); x < g.pb + g.tb; x += S::kThreads) hist[x] = 0;
  copy_times<kRows, S::kThreads>(tk, g.times, w.begin + j0, w.n - j0);
  copy_tile<D, kRows, S::kThreads>(sk, k, w.h, w.begin + j0, w.n - j0);
  copy_tile<D, kRows, S::kThreads>(sv, v, w.h, w.begin + j0, w.n - j0);
  mma::copy_async_commit();
  fill_spans<S::kThreads>(g, w, spans_after(tim, g));  // read after the first barrier

  int first = 0, end = 0;
  query_tiles(w, j0, Q, first, end);
  auto load_queries = [&](int tile, int stage) {
    const std::int64_t i0 = static_cast<std::int64_t>(tile) * Q;
    copy_tile<D, Q, S::kThreads>(sq + stage * Q * D, q, w.h, w.begin + i0, w.n - i0);
    copy_tile<D, Q, S::kThreads>(sg + stage * Q * D, dout, w.h, w.begin + i0, w.n - i0);
    copy_times<Q, S::kThreads>(tq + stage * Q, g.times, w.begin + i0, w.n - i0);
    mma::copy_async_commit();
  };
  load_queries(first, 0);

  float ak[MB][NB / 8][4], av[MB][NB / 8][4];
  zero(ak);
  zero(av);
  KeySums<Q> sums;
  for (int tile = first; tile < end; ++tile) {
    const int stage = (tile - first) & 1;
    if (tile + 1 < end) {
      load_queries(tile + 1, stage ^ 1);
      mma::copy_async_wait<1>();
    } else {
      mma::copy_async_wait<0>();
    }
    __syncthreads();
    const std::int64_t i0 = static_cast<std::int64_t>(tile) * Q;
    const std::uint16_t* qs = sq + stage * Q * D;
    const std::uint16_t* gs = sg + stage * Q * D;
    const std::int64_t* tqs = tq + stage * Q;
    bool near = true;  // a step near the diagonal: position gradients by diagonal
    {
      // Transposed scores: rows are this warp's 16 keys, columns the step's queries.
      float st[1][Q / 8][4], dpt[1][Q / 8][4];
      zero(st);
      zero(dpt);
      // The warp's first key through an empty asm: the fragments' addresses are computed here,
      // not hoisted out of the walk into registers it has none left for.
      int r0 = warp * 16;
      asm volatile("" : "+r"(r0));
      rows_times_rows<D, 1, Q>(st, sk, r0, qs);
      rows_times_rows<D, 1, Q>(dpt, sv, r0, gs);
      near = sums.elements(g, w, i0, j0, st[0], dpt[0], tqs, tk, pos, tim, sdf, hist);
      store_tile<Q>(sp, warp * 16, st[0]);
      store_tile<Q>(sds, warp * 16, dpt[0]);
    }
    __syncthreads();
    tile_times_tile<Q, D, MB, NB>(av, sp, kr0, gs, d0);
    tile_times_tile<Q, D, MB, NB>(ak, sds, kr0, qs, d0);
    if (near) sums.template diagonals<S::kThreads>(g, i0, j0, sdf, hist);
    __syncthreads();
  }
  sums.flush(g, hist);
  // This warp's block of dK (scaled) and dV.
#pragma unroll
  for (int m = 0; m < MB; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t r = j0 + kr0 + m * 16 + (l >> 2) + half * 8;
      if (r >= w.n) continue;
#pragma unroll
      for (int nt = 0; nt < NB / 8; ++nt) {
        const int col = w.h * D + d0 + nt * 8 + (l & 3) * 2;
        store_pair(dk, w.begin + r, col, ak[m][nt][2 * half] * g.scale,
                   ak[m][nt][2 * half + 1] * g.scale, out_bf16 != 0);
        store_pair(dv, w.begin + r, col, av[m][nt][2 * half], av[m][nt][2 * half + 1],
                   out_bf16 != 0);
      }
    }
  __syncthreads();
  add_histogram<S::kThreads>(g, w.h, hist, fixed_pos, fixed_time);
}

// The key-side backward on warpgroup products (sm_90a), D = 64 or 128: dkv_kernel's walk, element
// step and bias-gradient sums, with two warpgroups of 64 keys each. Sᵀ = K Qᵀ and dPᵀ = V dOᵀ read
// both operands from shared memory; dV += Pᵀ dO and dK += dSᵀ Q take Pᵀ and dSᵀ from the
// registers that held the scores, and dO and Q read down their columns, so neither passes
// through shared memory. Query tiles of 64 come through a three-stage ring: the next tile loads
// while this step's scores are computed and the previous step's products dV, dK still run.
template <int D>
constexpr std::size_t key_wg_smem(int pb, int tb) {
  constexpr int Q = 64;
  return (2 * kRows * D + 3 * 2 * Q * D) * 2 + static_cast<std::size_t>(kRows) * (Q + 1) * 4 +
         (kRows + 3 * Q) * 8 + static_cast<std::size_t>(pb + tb) * 12 + kRows * 16 + 16 + 1024;
}

template <int D>
__global__ __launch_bounds__(256, 1) void dkv_kernel_wg(Args g, In q, In k, In v, In dout, Out dk,
                                                        Out dv, int out_bf16,
                                                        unsigned long long* fixed_pos,
                                                        unsigned long long* fixed_time) {
#if defined(PARITY_WGMMA)
  static_assert(D == 64 || D == 128);
  constexpr int Q = 64, kStages = 3, kThreads = 256;
  // Whether a step's products run on while the next step's scores are computed: their operands'
  // registers stay live meanwhile, more than D = 128's accumulators leave.
  constexpr bool kOverlap = D < 128;
  constexpr unsigned kRowGroup = 8 * 128;      // bytes between groups of 8 rows of a slab
  constexpr unsigned kQuerySlab = Q * 64 * 2;  // bytes between a query tile's 64-column slabs
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* sk = reinterpret_cast<std::uint16_t*>(smem_raw + (-mma::shared_address(smem_raw) & 1023));
  auto* sv = sk + kRows * D;
  auto* sq = sv + kRows * D;        // [kStages][Q][D]
  auto* sg = sq + kStages * Q * D;  // [kStages][Q][D]
  // dSᵀ in fp32 for the position gradients of tiles near the diagonal, rows padded by one so
  // that a warp reading a diagonal hits 32 banks.
  auto* sdf = reinterpret_cast<float*>(sg + kStages * Q * D);  // [kRows][Q + 1]
  auto* tk = reinterpret_cast<std::int64_t*>(sdf + kRows * (Q + 1));
  auto* tq = tk + kRows;                                                 // [kStages][Q]
  auto* hist = reinterpret_cast<unsigned long long*>(tq + kStages * Q);  // [pb + tb]
  auto* pos = reinterpret_cast<float*>(hist + g.pb + g.tb);
  float* tim = pos + g.pb;

  Work w;
  if (!work_of(g, false, w)) return;
  const std::int64_t j0 = static_cast<std::int64_t>(w.tile) * kRows;
  const int l = lane_id(), warp = static_cast<int>(threadIdx.x) / 32;
  const int group_row = (warp / 4) * 64;  // the warpgroup's first key
  load_bias<kThreads>(g, w.h, pos, tim);
  for (int x = static_cast<int>(threadIdx.x); x < g.pb + g.tb; x += kThreads) hist[x] = 0;
  copy_times<kRows, kThreads>(tk, g.times, w.begin + j0, w.n - j0);
  copy_tile<D, kRows, kThreads, true>(sk, k, w.h, w.begin + j0, w.n - j0);
  copy_tile<D, kRows, kThreads, true>(sv, v, w.h, w.begin + j0, w.n - j0);
  fill_spans<kThreads>(g, w, spans_after(tim, g));  // read after the first barrier

  int first = 0, end = 0;
  query_tiles(w, j0, Q, first, end);
  auto load = [&](int tile) {  // one commit group (empty past the end)
    if (tile < end) {
      const int st = (tile - first) % kStages;
      const std::int64_t i0 = static_cast<std::int64_t>(tile) * Q;
      copy_tile<D, Q, kThreads, true>(sq + st * Q * D, q, w.h, w.begin + i0, w.n - i0);
      copy_tile<D, Q, kThreads, true>(sg + st * Q * D, dout, w.h, w.begin + i0, w.n - i0);
      copy_times<Q, kThreads>(tq + st * Q, g.times, w.begin + i0, w.n - i0);
    }
    mma::copy_async_commit();
  };
  load(first);  // with K and V

  // Descriptors made once; a step moves them by constant byte offsets. Q and dO are read along
  // their rows in the scores and down their columns (qt, gt) in the products.
  const std::uint64_t k_desc = mma::wg::descriptor(sk + group_row * 64, 16, kRowGroup);
  const std::uint64_t v_desc = mma::wg::descriptor(sv + group_row * 64, 16, kRowGroup);
  const std::uint64_t q_desc = mma::wg::descriptor(sq, 16, kRowGroup);
  const std::uint64_t g_desc = mma::wg::descriptor(sg, 16, kRowGroup);
  const std::uint64_t qt_desc = mma::wg::descriptor(sq, kQuerySlab, kRowGroup);
  const std::uint64_t gt_desc = mma::wg::descriptor(sg, kQuerySlab, kRowGroup);
  float ak[1][D / 8][4], av[1][D / 8][4];
  zero(ak);
  zero(av);
  unsigned pp[Q / 16][4], pds[Q / 16][4];  // Pᵀ and dSᵀ of the step whose products run
  auto products_done = [&]() {
    mma::wg::wait<0>();
    mma::wg::pin(ak[0]);
    mma::wg::pin(av[0]);
#pragma unroll
    for (int kb = 0; kb < Q / 16; ++kb)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pp[kb][e]), "+r"(pds[kb][e]));
  };
  KeySums<Q> sums;
  for (int tile = first; tile < end; ++tile) {
    const int st = (tile - first) % kStages;
    mma::copy_async_wait<0>();
    mma::wg::fence_shared();
    __syncthreads();  // tile arrived; every warp has waited for the products of tile - 2
    load(tile + 1);   // into tile - 2's stage, while this step and tile - 1's products run

    const std::int64_t i0 = static_cast<std::int64_t>(tile) * Q;
    const std::int64_t* tqs = tq + st * Q;
    // Transposed scores: rows are this warp's 16 keys, columns the step's queries.
    float sT[1][Q / 8][4], dpT[1][Q / 8][4];
    const unsigned stage = st * Q * D * 2;
    mma::wg::fence();
    rows_times_rows_wg<D, kRows, Q>(sT[0], k_desc, q_desc, stage);
    rows_times_rows_wg<D, kRows, Q>(dpT[0], v_desc, g_desc, stage);
    mma::wg::commit();
    if constexpr (kOverlap)
      products_done();  // the scores, and the previous step's products
    else
      mma::wg::wait<0>();
    mma::wg::pin(sT[0]);
    mma::wg::pin(dpT[0]);
    const bool near = sums.elements(g, w, i0, j0, sT[0], dpT[0], tqs, tk, pos, tim, sdf, hist);
    // dV += Pᵀ dO, dK += dSᵀ Q: B is dO (Q) rows [16 kb, 16 kb + 16) of the step, all D columns.
#pragma unroll
    for (int kb = 0; kb < Q / 16; ++kb) {
      to_a(pp[kb], sT[0], kb);
      to_a(pds[kb], dpT[0], kb);
    }
    mma::wg::fence();
#pragma unroll
    for (int kb = 0; kb < Q / 16; ++kb) {
      mma::wg::mma_rs<D>(av[0], pp[kb], mma::wg::advance(gt_desc, stage + kb * 16 * 64 * 2));
      mma::wg::mma_rs<D>(ak[0], pds[kb], mma::wg::advance(qt_desc, stage + kb * 16 * 64 * 2));
    }
    mma::wg::commit();
    if constexpr (!kOverlap) products_done();
    if (near) {
      __syncthreads();  // sdf complete
      sums.template diagonals<kThreads>(g, i0, j0, sdf, hist);
    }
  }
  if constexpr (kOverlap) products_done();
  sums.flush(g, hist);
  // This warp's 16 keys of dK (scaled) and dV.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t r = j0 + warp * 16 + (l >> 2) + half * 8;
    if (r >= w.n) continue;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = w.h * D + nt * 8 + (l & 3) * 2;
      store_pair(dk, w.begin + r, col, ak[0][nt][2 * half] * g.scale,
                 ak[0][nt][2 * half + 1] * g.scale, out_bf16 != 0);
      store_pair(dv, w.begin + r, col, av[0][nt][2 * half], av[0][nt][2 * half + 1], out_bf16 != 0);
    }
  }
  __syncthreads();
  add_histogram<kThreads>(g, w.h, hist, fixed_pos, fixed_time);
#else
  (void)g, (void)q, (void)k, (void)v, (void)dout, (void)dk, (void)dv, (void)out_bf16;
  (void)fixed_pos, (void)fixed_time;
  __trap();
#endif
}

__global__ void fixed_to_float_kernel(const unsigned long long* p, std::int64_t n, float* out) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<float>(static_cast<double>(static_cast<long long>(p[i])) /
                                static_cast<double>(kFixedScale));
}

#endif  // PARITY_GPU_CUDA && __CUDACC__

bool supported_dim(int d) {
  return d == 16 || d == 32 || d == 64 || d == 128;
}

std::size_t largest_smem(int d, int pb, int tb) {
#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)
  auto of = [&]<int D>() {
    return std::max({query_side_smem<ForwardShape<D>>(1, pb, tb),
                     query_side_smem<QueryShape<D>>(2, pb, tb), query_wg_smem<D>(2, pb, tb),
                     key_wg_smem<D>(pb, tb), key_side_smem<KeyShape<D>>(pb, tb)});
  };
  return d == 16   ? of.operator()<16>()
         : d == 32 ? of.operator()<32>()
         : d == 64 ? of.operator()<64>()
                   : of.operator()<128>();
#else
  (void)d;
  (void)pb;
  (void)tb;
  return 0;
#endif
}

[[maybe_unused]] Args args_of(const SequenceBatch& seq, const HstuAttention& att) {
  Args g{};
  g.offsets = seq.offsets;
  g.times = seq.timestamps;
  g.blocks = seq.blocks;
  g.block_count = seq.blocks != nullptr ? seq.block_count : 0;
  g.packed_from = g.block_count - (seq.blocks != nullptr ? seq.packed_blocks : 0);
  if (g.packed_from < 0 || g.packed_from > g.block_count)
    throw Error("hstu attention: the sequence batch lists " + std::to_string(seq.packed_blocks) +
                " packed runs among " + std::to_string(g.block_count) + " blocks");
  g.batch = seq.batch;
  g.heads = att.heads;
  g.targets = seq.targets;
  g.pb = att.position_buckets;
  g.tb = att.time_buckets;
  g.tiles = static_cast<int>(ceil_div(seq.max_len, kRows));
  g.scale = att.scale;
  g.inv_n = att.inv_n;
  g.position = att.position;
  g.time = att.time;
  return g;
}

// One workgroup per (block, head): the listed blocks, or every tile of every sequence.
[[maybe_unused]] std::int64_t grid_of(const Args& g) {
  return (g.blocks != nullptr ? g.block_count : static_cast<std::int64_t>(g.tiles) * g.batch) *
         g.heads;
}

[[maybe_unused]] In in_of(const char* op, const char* name, CAMat m) {
  if (m.dtype != DType::bf16)
    throw Error(std::string(op) + ": " + name + " is " + std::string(dtype_name(m.dtype)) +
                ", expected bf16 for the tensor-core attention");
  if (reinterpret_cast<std::uintptr_t>(m.data) % 16 != 0 || m.ld % 8 != 0)
    throw Error(std::string(op) + ": " + name +
                "'s rows do not start on 16 bytes (the tensor-core attention copies 16-byte "
                "chunks)");
  return {static_cast<const std::uint16_t*>(m.data), m.ld};
}

[[maybe_unused]] Out out_of(const char* op, const char* name, AMat m, DType want) {
  if (m.dtype != want)
    throw Error(std::string(op) + ": " + name + " is " + std::string(dtype_name(m.dtype)) +
                ", expected " + std::string(dtype_name(want)) + " like the other outputs");
  if (m.dtype != DType::f32 && m.dtype != DType::bf16)
    throw Error(std::string(op) + ": " + name + " must be fp32 or bf16");
  if (reinterpret_cast<std::uintptr_t>(m.data) % (2 * m.element_bytes()) != 0 || m.ld % 2 != 0)
    throw Error(std::string(op) + ": " + name + "'s rows do not start on pairs of elements");
  return {m.data, m.ld};
}

}  // namespace

std::string tensor_core_attention_refusal(const HstuAttention& att) {
  if (!mma::kTensorCores) return "this build's GPU has no tensor-core attention kernels yet";
  if (device_info().compute_major < 8)
    return "the device (compute capability " + std::to_string(device_info().compute_major) +
           ") has no bf16 mma";
  if (att.attention_dim != att.value_dim || !supported_dim(att.attention_dim))
    return "attention_dim " + std::to_string(att.attention_dim) + " and value_dim " +
           std::to_string(att.value_dim) + " must be equal and one of 16, 32, 64, 128";
  const std::size_t need = largest_smem(att.attention_dim, att.position_buckets, att.time_buckets);
  if (need > device_info().shared_memory_per_block_optin)
    return "its tiles and bias tables need " + std::to_string(need) +
           " bytes of shared memory, more than the device's " +
           std::to_string(device_info().shared_memory_per_block_optin);
  return {};
}

#if defined(PARITY_GPU_CUDA) && defined(__CUDACC__)

namespace {
// Whether the query-side kernels run on warpgroup products: sm_90a code in this binary, a device
// of compute capability 9.0, and a head dim they take.
bool warpgroup_kernels(int d) {
#if defined(PARITY_CUDA_SM90A)
  return (d == 64 || d == 128) && device_info().compute_major == 9 &&
         device_info().compute_minor == 0;
#else
  (void)d;
  return false;
#endif
}

// The longest sequence (rounded up to the 128-row tile) from which the warpgroup forward at
// D = 128 (one block an SM, 256 threads) overtakes the mma.sync one (128 threads): below it a
// batch's blocks are too short to fill its pipeline (docs/perf/hstu.md, 2026-12-04). At D = 64 it
// runs two blocks an SM and is ahead at every length.
constexpr std::int64_t kWarpgroupForwardMinLength128 = 1024;

template <int D>
void forward_d(Stream_t s, const Args& g, In q, In k, In v, Out o, bool bf16) {
  using S = ForwardShape<D>;
  if (grid_of(g) == 0) return;
  if constexpr (D == 64 || D == 128) {
    if (warpgroup_kernels(D) &&
        (D == 64 || static_cast<std::int64_t>(g.tiles) * kRows >= kWarpgroupForwardMinLength128)) {
      launch("hstu_attention_forward_wg", query_kernel_wg<D, false>,
             {grid_of(g), 256, query_wg_smem<D>(1, g.pb, g.tb)}, s, g, q, k, v, In{}, o,
             bf16 ? 1 : 0);
      return;
    }
  }
  launch("hstu_attention_forward_tc", query_kernel<S, false>,
         {grid_of(g), S::kThreads, query_side_smem<S>(1, g.pb, g.tb)}, s, g, q, k, v, In{}, o,
         bf16 ? 1 : 0);
}
template <int D>
void backward_d(Stream_t s, const Args& g, In q, In k, In v, In dout, Out dq, Out dk, Out dv,
                bool bf16, unsigned long long* fp, unsigned long long* ft) {
  const std::int64_t grid = grid_of(g);
  if (grid == 0) return;
  using SQ = QueryShape<D>;
  using SK = KeyShape<D>;
  bool wg = false;
  if constexpr (D == 64 || D == 128) {
    wg = warpgroup_kernels(D);
    if (wg)
      launch("hstu_attention_dq_wg", query_kernel_wg<D, true>,
             {grid, SQ::kThreads, query_wg_smem<D>(2, g.pb, g.tb)}, s, g, q, k, v, dout, dq,
             bf16 ? 1 : 0);
  }
  if (!wg)
    launch("hstu_attention_dq_tc", query_kernel<SQ, true>,
           {grid, SQ::kThreads, query_side_smem<SQ>(2, g.pb, g.tb)}, s, g, q, k, v, dout, dq,
           bf16 ? 1 : 0);
  if constexpr (D == 64 || D == 128) {
    if (wg) {
      launch("hstu_attention_dkv_wg", dkv_kernel_wg<D>, {grid, 256, key_wg_smem<D>(g.pb, g.tb)}, s,
             g, q, k, v, dout, dk, dv, bf16 ? 1 : 0, fp, ft);
      return;
    }
  }
  launch("hstu_attention_dkv_tc", dkv_kernel<SK>,
         {grid, SK::kThreads, key_side_smem<SK>(g.pb, g.tb)}, s, g, q, k, v, dout, dk, dv,
         bf16 ? 1 : 0, fp, ft);
}
}  // namespace

void hstu_attention_forward_tc(Stream_t s, const SequenceBatch& seq, const HstuAttention& att,
                               CAMat q, CAMat k, CAMat v, AMat out) {
  constexpr const char* op = "hstu_attention_forward_tc";
  if (const std::string why = tensor_core_attention_refusal(att); !why.empty())
    throw Error(std::string(op) + ": " + why);
  const In qi = in_of(op, "q", q), ki = in_of(op, "k", k), vi = in_of(op, "v", v);
  const Out o = out_of(op, "out", out, out.dtype);
  if (seq.tokens == 0 || seq.max_len == 0) return;
  const Args g = args_of(seq, att);
  const bool bf16 = out.dtype == DType::bf16;
  switch (att.attention_dim) {
    case 16:
      forward_d<16>(s, g, qi, ki, vi, o, bf16);
      break;
    case 32:
      forward_d<32>(s, g, qi, ki, vi, o, bf16);
      break;
    case 64:
      forward_d<64>(s, g, qi, ki, vi, o, bf16);
      break;
    default:
      forward_d<128>(s, g, qi, ki, vi, o, bf16);
      break;
  }
}

void hstu_attention_backward_tc(Stream_t s, const SequenceBatch& seq, const HstuAttention& att,
                                CAMat q, CAMat k, CAMat v, CAMat dout, AMat dq, AMat dk, AMat dv,
                                float* dposition, float* dtime, void* scratch) {
  constexpr const char* op = "hstu_attention_backward_tc";
  if (const std::string why = tensor_core_attention_refusal(att); !why.empty())
    throw Error(std::string(op) + ": " + why);
  const In qi = in_of(op, "q", q), ki = in_of(op, "k", k), vi = in_of(op, "v", v),
           gi = in_of(op, "dout", dout);
  const Out dqo = out_of(op, "dq", dq, dq.dtype), dko = out_of(op, "dk", dk, dq.dtype),
            dvo = out_of(op, "dv", dv, dq.dtype);
  const Args g = args_of(seq, att);
  auto* fixed = static_cast<unsigned long long*>(scratch);
  const std::int64_t np = static_cast<std::int64_t>(g.heads) * g.pb,
                     nt = static_cast<std::int64_t>(g.heads) * g.tb;
  check(memset_async(fixed, 0, static_cast<std::size_t>(np + nt) * 8, s), "memset_async");
  if (seq.tokens > 0 && seq.max_len > 0) {
    const bool bf16 = dq.dtype == DType::bf16;
    switch (att.attention_dim) {
      case 16:
        backward_d<16>(s, g, qi, ki, vi, gi, dqo, dko, dvo, bf16, fixed, fixed + np);
        break;
      case 32:
        backward_d<32>(s, g, qi, ki, vi, gi, dqo, dko, dvo, bf16, fixed, fixed + np);
        break;
      case 64:
        backward_d<64>(s, g, qi, ki, vi, gi, dqo, dko, dvo, bf16, fixed, fixed + np);
        break;
      default:
        backward_d<128>(s, g, qi, ki, vi, gi, dqo, dko, dvo, bf16, fixed, fixed + np);
        break;
    }
  }
  constexpr int block = 256;
  launch("hstu_attention_bias_tc", fixed_to_float_kernel, {ceil_div(np, block), block, 0}, s,
         static_cast<const unsigned long long*>(fixed), np, dposition);
  launch("hstu_attention_bias_tc", fixed_to_float_kernel, {ceil_div(nt, block), block, 0}, s,
         static_cast<const unsigned long long*>(fixed + np), nt, dtime);
}

#else

void hstu_attention_forward_tc(Stream_t, const SequenceBatch&, const HstuAttention& att, CAMat,
                               CAMat, CAMat, AMat) {
  throw Error("hstu_attention_forward_tc: " + tensor_core_attention_refusal(att));
}
void hstu_attention_backward_tc(Stream_t, const SequenceBatch&, const HstuAttention& att, CAMat,
                                CAMat, CAMat, CAMat, AMat, AMat, AMat, float*, float*, void*) {
  throw Error("hstu_attention_backward_tc: " + tensor_core_attention_refusal(att));
}

#endif

}  // namespace parity::gpu
