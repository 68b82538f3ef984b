// Checksummed forward products on the GPU (see product_checks.h).
//
// Why rows, and why this bound. The cpu backend checks column sums against a bound from
// worst-case rounding, which is tight there because it sums in double. A GPU product sums its k
// terms in fp32, and a worst-case bound on that (about k u Σ_c |a_ic w_jc| an element) hides the
// flips it should catch. So the check is probabilistic, after Higham and Mary ("A new approach to
// probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019): the rounding errors
// of the fp32 additions are independent, of mean zero and at most u = 2^-24 of the value rounded.
// An element's error is then Σ_p δ_p S_p over its partial sums S_p (and δ' out_ij where the bias is
// added), and by Hoeffding's inequality a row's summed error exceeds λ u √V_i,
// V_i = Σ_j (Σ_p S_jp² + out_ij²), with probability at most 2 exp(-λ²/2). λ = 10 makes that 4e-22
// a row: no false alarm in any run. V_i is not known without the partial sums; a partial sum is
// its mean path (p/k) out_ij plus a centred walk of the terms, whose squares sum to about
// (k/3) out_ij² and (k/2) Σ_c a_ic² w_jc², so V_i = (k/3 + 1) Σ_j out_ij² + (k/2) Σ_c a_ic² t_c
// with t_c = Σ_j w_jc²: both the mean path (inputs and weights of one sign) and the cancelling walk
// are counted.
//
// Rows, not columns: a row's sum spans m elements of one example, a column's all n examples, so a
// row's spread is smaller by √(n/m) and one flipped element stands out more. The check reads the
// input and the fp32 product once and writes the stored output (rectified, rounded to bf16 where
// it is stored so): it must see the product before a bf16 output's rounding (2^-9, far above the
// accumulation's).
//
// Under bf16 math the tensor cores do not round to nearest: they truncate (Fasi, Higham, Mikaitis
// and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 2021), so where
// the terms share a sign every output comes out smaller by tens of u, and a prediction summed in
// double differs from the row sum by far more than the rounding model above allows. The prediction
// is then computed by the product itself: the weights' bf16 copy carries two more rows, the
// checksum row s = Σ_j w_j split into bf16 hi and lo parts, and the product's columns m and m + 1
// are a_i · hi and a_i · lo, truncated like the outputs (the small rest, a_i · (s - hi - lo), is
// added in double). The truncation's mean then cancels between the row sum and the checksum
// column; what is left varies by up to 2u of each partial sum, and the checksum column's own
// partial sums count in V_i. The bias is added by the check, after the check, as the product would.
//
// Inputs that are not finite, or products that may overflow, are the finite-value guard's to
// report (divergence or bad data, not a wrong product; under bf16 math that includes a row whose
// input's spread overflows fp32, inputs above about 1e19); an output that is not finite from
// finite inputs fails.
#include "backend/gpu/product_checks.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"
#include "backend/gpu/numerics.h"
#include "parity/error.h"

namespace parity::gpu {

namespace {

using elementwise::kBlock;

constexpr double kLambda = 10.0;
constexpr double kUnit = 5.9604644775390625e-08;        // 2^-24, fp32's unit roundoff
constexpr double kDoubleUnit = 1.1102230246251565e-16;  // 2^-53, double's

// The per-column sums the row pass reads, one pair a column of the input, at sums + 2k: p_c, the
// weight of the prediction's term, and q_c, of the spread's. fp32 math: p = s_c in double, so that
// the prediction Σ_c a_ic s_c is summed exactly enough; q = t_c. bf16 math: p = r_c, the rest the
// checksum columns leave (about 2^-17 of s_c), and q = t_c + s_c², the weights' and the checksum
// column's terms of the spread in one, both in fp32 (the rest's rounding is bounded in judge_row).
template <bool Augmented>
using ColumnSums = std::conditional_t<Augmented, float2, double2>;
// The input as the product read it: its bf16 copy under bf16 math, fp32 under fp32.
template <bool Augmented>
using Input = std::conditional_t<Augmented, Bf16, float>;
// Columns a lane takes at a time where every row is aligned to them: one 16-byte load of the
// input (8 bf16 under bf16 math, 4 fp32 under fp32) and of the fp32 product.
template <bool Augmented>
constexpr int kVectorIn = 16 / static_cast<int>(sizeof(Input<Augmented>));
constexpr int kVectorOut = 4;

// Where column c's pair is kept: in the order the row pass's lanes read them, so that a warp's
// load of one pair a lane is one contiguous run. In a group of kWarpSize x W columns lane l takes
// columns l W .. l W + W - 1 (one 16-byte load of the input); the pair of its e-th column is kept
// at e kWarpSize + l. A bijection on each group: the pairs of k columns fit k + kPairPad places.
template <bool Augmented>
__device__ __forceinline__ std::int64_t pair_place(std::int64_t c) {
  constexpr int W = kVectorIn<Augmented>;
  constexpr std::int64_t group = static_cast<std::int64_t>(kWarpSize) * W;
  return c / group * group + c % W * kWarpSize + c % group / W;
}

__device__ __forceinline__ double load(CheckOperand m, std::int64_t r, std::int64_t c) {
  if (m.bf16) return to_float(static_cast<const Bf16*>(m.data)[r * m.ld + c]);
  return static_cast<const float*>(m.data)[r * m.ld + c];
}

__global__ __launch_bounds__(kBlock) void weights_kernel(CheckOperand w, std::int64_t m,
                                                         std::int64_t k, const float* bias,
                                                         double* sums, double* bias_sum) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (c < k) {
    double s = 0, t = 0;
    for (std::int64_t j = 0; j < m; ++j) {
      const double v = load(w, j, c);
      s += v;
      t += v * v;
    }
    reinterpret_cast<double2*>(sums + 2 * k)[pair_place<false>(c)] = make_double2(s, t);
  }
  if (c == 0) {
    double b = 0;
    if (bias != nullptr)
      for (std::int64_t j = 0; j < m; ++j) b += bias[j];
    *bias_sum = b;
  }
}

// The copy's rows below m and their column sums: a thread a column c (< ld) of a chunk of rows,
// every row of the chunk loaded before any is stored, the sums s_c and t_c added into sums[c] and
// sums[k + c] (zeroed first). Sums of bf16 values and their squares are exact in double, so the
// order the chunks add in does not change them.
constexpr int kAugmentRows = 16;
__global__ __launch_bounds__(kBlock) void augment_rows_kernel(CMat w, std::int64_t ld,
                                                              std::int64_t column_blocks,
                                                              Bf16* __restrict__ wa,
                                                              double* __restrict__ sums) {
  const std::int64_t c = blockIdx.x % column_blocks * kBlock + threadIdx.x;
  if (c >= ld) return;
  const std::int64_t j0 = blockIdx.x / column_blocks * kAugmentRows;
  const int rows = w.rows - j0 < kAugmentRows ? static_cast<int>(w.rows - j0) : kAugmentRows;
  const float* __restrict__ from = w.data + j0 * w.ld + c;
  float v[kAugmentRows];
#pragma unroll
  for (int j = 0; j < kAugmentRows; ++j) v[j] = j < rows && c < w.cols ? from[j * w.ld] : 0.0f;
  double s = 0, t = 0;
#pragma unroll
  for (int j = 0; j < kAugmentRows; ++j) {
    if (j >= rows) continue;
    const Bf16 b = from_float_rn<Bf16>(v[j]);
    wa[(j0 + j) * ld + c] = b;
    const double x = to_float(b);
    s += x;
    t += x * x;
  }
  if (c < w.cols) {
    atomicAdd(&sums[c], s);
    atomicAdd(&sums[w.cols + c], t);
  }
}

// The checksum rows hi and lo, zeros below, and the row pass's pairs (r_c, t_c + s_c²) with the
// rest r_c = s_c - hi_c - lo_c: a thread a column.
__global__ __launch_bounds__(kBlock) void augment_sums_kernel(std::int64_t m, std::int64_t k,
                                                              std::int64_t rows, std::int64_t ld,
                                                              Bf16* __restrict__ wa,
                                                              double* __restrict__ sums) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (c >= ld) return;
  const double s = c < k ? sums[c] : 0.0;
  const Bf16 hi = from_float_rn<Bf16>(static_cast<float>(s));
  const Bf16 lo = from_float_rn<Bf16>(static_cast<float>(s - to_float(hi)));
  wa[m * ld + c] = hi;
  wa[(m + 1) * ld + c] = lo;
  for (std::int64_t j = m + 2; j < rows; ++j) wa[j * ld + c] = Bf16{0};
  if (c < k) {
    const double rest = s - static_cast<double>(to_float(hi)) - static_cast<double>(to_float(lo));
    reinterpret_cast<float2*>(sums + 2 * k)[pair_place<true>(c)] =
        make_float2(static_cast<float>(rest), static_cast<float>(sums[k + c] + s * s));
  }
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int d = kWarpSize / 2; d > 0; d /= 2) v += shfl_xor(kFullMask, v, d);
  return v;
}

// A warp checks kRowsPerWarp rows at once: each column's sums it loads (from L1) serve all of
// them. The pass is latency-bound, so registers are traded for occupancy: two rows a warp and one
// 16-byte group a row in flight at a time, at most 64 registers, so that 4 blocks (32 warps) fit a
// multiprocessor. Four rows with two groups in flight at 128 registers ran slower
// (docs/reliability.md).
constexpr int kRowsPerWarp = 2;
constexpr int kMinBlocks = 4;

// What a row's check has summed over its input (Σ_c over the row's k columns) and its product
// (Σ_j over its m columns), reduced over the warp. The input's sums are fp32 under bf16 math (the
// rest's terms are small and the spread is a bound's: judge_row bounds their rounding) and double
// under fp32 math, where the prediction is the whole row sum.
template <bool Augmented>
struct RowSums {
  using In = std::conditional_t<Augmented, float, double>;
  // predicted: Σ_c a_ic p_c; magnitude: Σ_c |a_ic p_c|; spread_in: Σ_c a_ic² q_c (ColumnSums).
  In predicted = 0, magnitude = 0, spread_in = 0;
  double sum = 0, squares = 0;  // of the product's m elements
};

// The rows [first, first + rows) of n that this warp of a kBlock-thread block takes, R a warp;
// false where it has none.
template <int R>
__device__ __forceinline__ bool warp_rows(std::int64_t n, std::int64_t& first, int& rows) {
  const std::int64_t warp =
      static_cast<std::int64_t>(blockIdx.x) * (kBlock / kWarpSize) + threadIdx.x / kWarpSize;
  first = warp * R;
  if (first >= n) return false;
  rows = n - first < R ? static_cast<int>(n - first) : R;
  return true;
}

// The totals of a row, reduced over the warp, in double.
struct RowTotals {
  double predicted, magnitude, spread_in, sum, squares;
};

// Lane 0's verdict on row i of the product (o: the row of out32), recorded where it fails.
// Under bf16 math hi and lo are the row's checksum columns.
template <bool Augmented>
__device__ void judge_row(RowTotals r, std::int64_t i, std::int64_t n, std::int64_t k, double hi,
                          double lo, std::int64_t m, const double* bias_sum, long long product,
                          int what, ProductCheckRecord* record) {
  const double kd = static_cast<double>(k), md = static_cast<double>(m);
  double unit = kUnit, variance = (kd / 3 + 1) * r.squares + kd / 2 * r.spread_in;
  // The check's own arithmetic: its double sums of the product (at most m + 64 roundings of 2^-53
  // of Σ_j |out_ij| <= √(m Σ_j out_ij²)) and of the input's terms (k + 64 of the magnitude); under
  // bf16 math the input's terms are summed in fp32 from fp32 pairs (k + 2 roundings of u). A fused
  // product's element sums start in fp32; their squares carry those roundings (checked_product.cu).
  double own =
      (md + 64) * kDoubleUnit * sqrt(md * r.squares) + (kd + 64) * kDoubleUnit * r.magnitude;
  if (Augmented) {
    own += (kd + 2) * kUnit * r.magnitude;
    r.predicted += hi + lo;
    r.magnitude += fabs(hi) + fabs(lo);
    own += 2 * kDoubleUnit * r.magnitude;
    variance += (kd / 3 + 1) * (hi * hi + lo * lo);
    unit = 2 * kUnit;  // truncation: up to one ulp, 2u of the value
  } else {
    r.predicted += *bias_sum;
    r.magnitude += fabs(*bias_sum);
  }
  // Not finite inputs, or a product that may overflow fp32: the finite-value guard's to report.
  if (!isfinite(r.magnitude) || !isfinite(r.spread_in) || r.magnitude > FLT_MAX) return;
  // Besides the rounding: the check's own sums, and values below fp32's normal range, which
  // the product may flush to zero (each of its k + 1 terms an element).
  const double bound = kLambda * unit * sqrt(variance) + own + (kd + 1) * md * FLT_MIN;
  const double diff = fabs(r.sum - r.predicted);
  // A NaN or an infinity in the output fails (its bound may be infinite too).
  if ((diff <= bound && isfinite(r.sum)) || record == nullptr) return;
  // Failures count products: the first failing row of a product counts it (products run in
  // order on one stream, so a later product's tag is always larger).
  const auto tag = static_cast<unsigned long long>(product) + 1;
  if (atomicMax(&record->last_failed, tag) < tag) atomicAdd(&record->failures, 1ull);
  if (atomicCAS(&record->first_set, 0ull, 1ull) != 0ull) return;
  record->product = product;
  record->row = i;
  record->rows = n;
  record->cols = m;
  record->what = what;
  record->sum = r.sum;
  record->predicted = r.predicted;
  record->bound = bound;
}

// The input's part of row x's sums: columns [c, c + W) of its row of a (W = kVectorIn<Augmented>:
// one 16-byte load a row; or 1), against the columns' sums (loaded once for all the warp's rows;
// the e-th at cols[e kWarpSize], pair_place).
template <bool Augmented, int W>
__device__ __forceinline__ void add_row_input(const float (&v)[W],
                                              const ColumnSums<Augmented> (&pq)[W],
                                              RowSums<Augmented>& r) {
  using In = typename RowSums<Augmented>::In;
#pragma unroll
  for (int e = 0; e < W; ++e) {
    const In u = v[e], p = pq[e].x;
    r.predicted += u * p;
    r.magnitude += fabs(u * p);
    r.spread_in += u * u * pq[e].y;
  }
}
template <bool Augmented, int R, int W>
__device__ __forceinline__ void add_input(const float (&v)[R][W], int rows,
                                          const ColumnSums<Augmented>* __restrict__ cols,
                                          RowSums<Augmented> (&r)[R]) {
  ColumnSums<Augmented> pq[W];
#pragma unroll
  for (int e = 0; e < W; ++e) pq[e] = cols[e * kWarpSize];
#pragma unroll
  for (int x = 0; x < R; ++x)
    if (x < rows) add_row_input<Augmented, W>(v[x], pq, r[x]);
}

// The product's part of row x's sums, columns [j, j + W), and the stored output of them.
template <class S, bool Augmented, int R, int W>
__device__ __forceinline__ void add_product(const float (&v)[R][W], std::int64_t first, int rows,
                                            std::int64_t j, const float* __restrict__ bias,
                                            bool relu, S* stored, std::int64_t ld_stored,
                                            RowSums<Augmented> (&r)[R]) {
  float b[W];
#pragma unroll
  for (int e = 0; e < W; ++e) b[e] = Augmented && bias != nullptr ? bias[j + e] : 0.0f;
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;
    float y[W];
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const float u = v[x][e];
      const double d = u;
      r[x].sum += d;
      r[x].squares += d * d;
      const float z = Augmented && bias != nullptr ? u + b[e] : u;
      y[e] = relu && z <= 0.0f ? 0.0f : z;  // a NaN stays for the guard to see
    }
    store_vec_rn<W>(stored + (first + x) * ld_stored + j, y);
  }
}

// Loads columns [c, c + W) of the warp's rows of p (row stride ld): streamed, as nothing reads
// them again soon.
template <int R, int W, class T>
__device__ __forceinline__ void load_rows(const T* p, std::int64_t ld, std::int64_t first, int rows,
                                          std::int64_t c, float (&v)[R][W]) {
#pragma unroll
  for (int x = 0; x < R; ++x)
    if (x < rows) load_vec<W, T, true>(p + (first + x) * ld + c, v[x]);
}

// The input's part of the sums of the warp's rows [first, first + rows): W consecutive columns a
// lane at a time (Vector: one 16-byte load a row), the last columns one at a time.
template <bool Augmented, bool Vector, int R>
__device__ __forceinline__ void input_sums(const Input<Augmented>* a, std::int64_t lda,
                                           std::int64_t k, std::int64_t first, int rows,
                                           const ColumnSums<Augmented>* __restrict__ cols,
                                           RowSums<Augmented> (&r)[R]) {
  constexpr int WI = Vector ? kVectorIn<Augmented> : 1;
  const int lane = lane_id();
  const std::int64_t k_vec = k / WI * WI;
  constexpr std::int64_t in_step = kWarpSize * WI;
  for (std::int64_t c = lane * WI; c < k_vec; c += in_step) {
    float v[R][WI];
    load_rows<R, WI>(a, lda, first, rows, c, v);
    // The group's pairs in the lanes' order (pair_place): this lane's e-th at e kWarpSize.
    const ColumnSums<Augmented>* own =
        Vector ? cols + (c - lane * WI + lane) : cols + pair_place<Augmented>(c);
    add_input<Augmented, R, WI>(v, rows, own, r);
  }
  for (std::int64_t c = k_vec + lane; c < k; c += kWarpSize) {
    float v[R][1];
    load_rows<R, 1>(a, lda, first, rows, c, v);
    add_input<Augmented, R, 1>(v, rows, cols + pair_place<Augmented>(c), r);
  }
}

// The warp's row sums reduced over its lanes, in double.
template <bool Augmented, int R>
__device__ __forceinline__ void reduce_rows(const RowSums<Augmented> (&r)[R], int rows,
                                            RowTotals (&t)[R]) {
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;  // the same for every lane: the shuffles see the whole warp
    t[x].predicted = warp_sum(static_cast<double>(r[x].predicted));
    t[x].magnitude = warp_sum(static_cast<double>(r[x].magnitude));
    t[x].spread_in = warp_sum(static_cast<double>(r[x].spread_in));
    t[x].sum = warp_sum(r[x].sum);
    t[x].squares = warp_sum(r[x].squares);
  }
}

// kRowsPerWarp rows a warp, lanes across the columns, W consecutive columns a lane at a time
// (16-byte accesses where every row is aligned to them; W = 1 otherwise), the last columns one at
// a time. Every element of a group of the product is loaded before any is stored: the stores may
// alias the loads (fp32 checked in place). The loops over the rows are unrolled, so that the
// per-row sums stay in registers.
template <class S, bool Augmented, bool Vector>
__global__ __launch_bounds__(kBlock, kMinBlocks) void rows_kernel(
    const Input<Augmented>* a, std::int64_t lda, std::int64_t n, std::int64_t k, const float* out32,
    std::int64_t ld32, std::int64_t m, const ColumnSums<Augmented>* __restrict__ cols,
    const double* bias_sum, const float* __restrict__ bias, bool relu, S* stored,
    std::int64_t ld_stored, long long product, int what, ProductCheckRecord* record) {
  constexpr int R = kRowsPerWarp;
  constexpr int WO = Vector ? kVectorOut : 1;
  std::int64_t first;
  int rows;
  if (!warp_rows<R>(n, first, rows)) return;
  const int lane = lane_id();
  RowSums<Augmented> r[R];
  input_sums<Augmented, Vector>(a, lda, k, first, rows, cols, r);

  const std::int64_t m_vec = m / WO * WO;
  constexpr std::int64_t out_step = kWarpSize * WO;

  for (std::int64_t j = lane * WO; j < m_vec; j += out_step) {
    float v[R][WO];
    load_rows<R, WO>(out32, ld32, first, rows, j, v);
    add_product<S, Augmented, R, WO>(v, first, rows, j, bias, relu, stored, ld_stored, r);
  }
  for (std::int64_t j = m_vec + lane; j < m; j += kWarpSize) {
    float v[R][1];
    load_rows<R, 1>(out32, ld32, first, rows, j, v);
    add_product<S, Augmented, R, 1>(v, first, rows, j, bias, relu, stored, ld_stored, r);
  }
  RowTotals t[R];
  reduce_rows<Augmented, R>(r, rows, t);
  if (lane != 0) return;
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;
    const float* o = out32 + (first + x) * ld32;
    judge_row<Augmented>(t[x], first + x, n, k, Augmented ? o[m] : 0.0, Augmented ? o[m + 1] : 0.0,
                         m, bias_sum, product, what, record);
  }
}

// The product's part of the warp's rows' sums in a fused product (checked_product.cu): its tiles'
// partial sums, the tiles across the lanes.
template <int R>
__device__ __forceinline__ void add_tiles(const double2* __restrict__ partials, std::int64_t tiles,
                                          std::int64_t first, int rows, RowSums<true> (&r)[R]) {
  for (std::int64_t j = lane_id(); j < tiles; j += kWarpSize) {
#pragma unroll
    for (int x = 0; x < R; ++x) {
      if (x >= rows) continue;
      const double2 p = partials[(first + x) * tiles + j];
      r[x].sum += p.x;
      r[x].squares += p.y;
    }
  }
}

// Lane 0's verdicts on the warp's rows of a fused product, from their totals and checksum columns.
template <int R>
__device__ __forceinline__ void judge_tiles(const RowTotals (&t)[R], std::int64_t first, int rows,
                                            std::int64_t n, std::int64_t k,
                                            const float2* __restrict__ checksum, std::int64_t m,
                                            long long product, int what,
                                            ProductCheckRecord* record) {
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;
    const float2 c = checksum[first + x];
    judge_row<true>(t[x], first + x, n, k, c.x, c.y, m, nullptr, product, what, record);
  }
}

// The fused product's check (checked_product.cu): the input's part as above, the product's from
// its tiles' partial sums, kRowsPerWarp rows a warp.
template <bool Vector>
__global__ __launch_bounds__(kBlock, kMinBlocks) void tiles_kernel(
    const Bf16* a, std::int64_t lda, std::int64_t n, std::int64_t k,
    const double2* __restrict__ partials, std::int64_t tiles, const float2* __restrict__ checksum,
    std::int64_t m, const float2* __restrict__ cols, long long product, int what,
    ProductCheckRecord* record) {
  constexpr int R = kRowsPerWarp;
  std::int64_t first;
  int rows;
  if (!warp_rows<R>(n, first, rows)) return;
  RowSums<true> r[R];
  input_sums<true, Vector>(a, lda, k, first, rows, cols, r);
  add_tiles<R>(partials, tiles, first, rows, r);
  RowTotals t[R];
  reduce_rows<true, R>(r, rows, t);
  if (lane_id() == 0) judge_tiles<R>(t, first, rows, n, k, checksum, m, product, what, record);
}

// The group's pairs in the lanes' order (pair_place): this lane's e-th at e kWarpSize.
template <int W>
__device__ __forceinline__ void load_pairs(const float2* __restrict__ cols, std::int64_t c,
                                           int lane, float2 (&pq)[W]) {
#pragma unroll
  for (int e = 0; e < W; ++e) pq[e] = cols[c - lane * W + lane + e * kWarpSize];
}

// Writes a warp's row totals (lane 0): terms[3 i .. 3 i + 2] for row i.
template <int R>
__device__ __forceinline__ void write_terms(const RowSums<true> (&r)[R], std::int64_t first,
                                            int rows, double* terms) {
  RowTotals t[R];
  reduce_rows<true, R>(r, rows, t);
  if (lane_id() != 0) return;
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;
    double* out = terms + 3 * (first + x);
    out[0] = t[x].predicted;
    out[1] = t[x].magnitude;
    out[2] = t[x].spread_in;
  }
}

// The cross layer's combine, x_next = x0 ⊙ z + xl (as cross_combine forms it: in double, rounded
// once to bf16), with the input's part of the check of u = xl · vᵀ (the pairs of v's copy, cols)
// summed over each row of xl as it is read: the u check then reads no input of its own. Next:
// also the part of the product x_next feeds (its pairs, next_cols), over x_next as stored.
// kRowsPerWarp rows a warp, 8 columns a lane at a time; every row 16-byte aligned, k % 8 == 0.
template <bool Next>
__global__ __launch_bounds__(kBlock, kMinBlocks) void cross_combine_kernel(
    const Bf16* x0, std::int64_t ld0, const Bf16* z, std::int64_t ldz, const Bf16* xl,
    std::int64_t ldl, Bf16* x_next, std::int64_t ldn, std::int64_t n, std::int64_t k,
    const float2* __restrict__ cols, double* terms, const float2* __restrict__ next_cols,
    double* next_terms) {
  constexpr int R = kRowsPerWarp, W = kVectorIn<true>;
  std::int64_t first;
  int rows;
  if (!warp_rows<R>(n, first, rows)) return;
  const int lane = lane_id();
  RowSums<true> r[R], rn[R];
  for (std::int64_t c = lane * W; c < k; c += static_cast<std::int64_t>(kWarpSize) * W) {
#pragma unroll
    for (int x = 0; x < R; ++x) {  // a row at a time: three operands' values in registers
      if (x >= rows) continue;
      const std::int64_t row = first + x;
      float a[W], b[W], o[W];
      load_vec<W, Bf16, true>(x0 + row * ld0 + c, a);
      load_vec<W, Bf16, true>(z + row * ldz + c, b);
      load_vec<W, Bf16, true>(xl + row * ldl + c, o);
      {
        float2 pq[W];
        load_pairs<W>(cols, c, lane, pq);
        add_row_input<true, W>(o, pq, r[x]);
      }
#pragma unroll
      for (int e = 0; e < W; ++e)
        o[e] = static_cast<float>(static_cast<double>(a[e]) * static_cast<double>(b[e]) +
                                  static_cast<double>(o[e]));
      store_vec_rn<W>(x_next + row * ldn + c, o);
      if constexpr (Next) {  // as the next product reads it: rounded to bf16
#pragma unroll
        for (int e = 0; e < W; ++e)
          o[e] = __uint_as_float(static_cast<unsigned>(bf16_bits_rn(o[e])) << 16);
        float2 pq[W];
        load_pairs<W>(next_cols, c, lane, pq);
        add_row_input<true, W>(o, pq, rn[x]);
      }
    }
  }
  write_terms<R>(r, first, rows, terms);
  if constexpr (Next) write_terms<R>(rn, first, rows, next_terms);
}

// A fused product's rows judged from its tiles' partial sums and the input's part summed
// elsewhere (cross_combine_kernel), kRowsPerWarp rows a warp.
__global__ __launch_bounds__(kBlock, kMinBlocks) void tiles_terms_kernel(
    const double* __restrict__ terms, std::int64_t n, std::int64_t k,
    const double2* __restrict__ partials, std::int64_t tiles, const float2* __restrict__ checksum,
    std::int64_t m, long long product, int what, ProductCheckRecord* record) {
  constexpr int R = kRowsPerWarp;
  std::int64_t first;
  int rows;
  if (!warp_rows<R>(n, first, rows)) return;
  RowSums<true> r[R];
  add_tiles<R>(partials, tiles, first, rows, r);
  RowTotals t[R];
  reduce_rows<true, R>(r, rows, t);
  if (lane_id() != 0) return;
#pragma unroll
  for (int x = 0; x < R; ++x) {
    if (x >= rows) continue;
    const double* in = terms + 3 * (first + x);
    t[x].predicted = in[0];
    t[x].magnitude = in[1];
    t[x].spread_in = in[2];
  }
  judge_tiles<R>(t, first, rows, n, k, checksum, m, product, what, record);
}

__global__ __launch_bounds__(kBlock) void round_kernel(const float* v, std::int64_t n, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i < n) out[i] = to_float(from_float_rn<Bf16>(v[i]));
}

__global__ void flip_kernel(void* p, bool bf16, std::int64_t offset, int bit, const float* bias,
                            std::int64_t column) {
  if (threadIdx.x != 0) return;
  if (bf16) {
    static_cast<std::uint16_t*>(p)[offset] ^= static_cast<std::uint16_t>(1u << bit);
  } else if (bias == nullptr) {
    static_cast<std::uint32_t*>(p)[offset] ^= 1u << bit;
  } else {
    float& x = static_cast<float*>(p)[offset];
    const float b = bias[column];
    x = __uint_as_float(__float_as_uint(x + b) ^ (1u << bit)) - b;
  }
}

}  // namespace

void product_check_weights(Stream_t s, CheckOperand w, std::int64_t m, std::int64_t k,
                           const float* bias, double* sums) {
  // At least one block: thread 0 writes the bias sum (k = 0 too).
  launch("product_check_weights", weights_kernel,
         {std::max<std::int64_t>(1, ceil_div(k, kBlock)), kBlock, 0}, s, w, m, k, bias, sums,
         sums + product_check_bias_slot(k));
}

void product_check_augment(Stream_t s, CMat w, std::int64_t rows, std::int64_t ld, void* wa,
                           double* sums) {
  if (rows < w.rows + 2 || ld < w.cols)
    throw Error("product_check_augment: the copy has " + std::to_string(rows) + " rows of " +
                std::to_string(ld) + " for a [" + std::to_string(w.rows) + ", " +
                std::to_string(w.cols) + "] weight and its two checksum rows");
  if (!rehearsing())
    detail::zero(sums, static_cast<std::size_t>(2 * w.cols) * sizeof(double), s,
                 "product_check_augment");
  if (w.rows > 0) {
    const std::int64_t column_blocks = ceil_div(ld, kBlock);
    launch("product_check_augment_rows", augment_rows_kernel,
           {column_blocks * ceil_div(w.rows, kAugmentRows), kBlock, 0}, s, w, ld, column_blocks,
           static_cast<Bf16*>(wa), sums);
  }
  launch("product_check_augment_sums", augment_sums_kernel, {ceil_div(ld, kBlock), kBlock, 0}, s,
         w.rows, w.cols, rows, ld, static_cast<Bf16*>(wa), sums);
}

void product_check_rows(Stream_t s, CheckOperand a, std::int64_t n, std::int64_t k,
                        const float* out32, std::int64_t ld32, std::int64_t m, const double* sums,
                        bool augmented, const float* bias, bool relu, AMat stored,
                        long long product, int what, ProductCheckRecord* record) {
  if (n <= 0 || m <= 0) return;
  if (a.bf16 != augmented)
    throw Error(std::string("product_check_rows: a ") + (a.bf16 ? "bf16" : "fp32") +
                " input under " + (augmented ? "bf16" : "fp32") +
                " math; the product reads the input in its math's type");
  // 16-byte accesses where every row of every operand starts aligned to its group of columns.
  const auto rows_aligned = [](const void* p, std::int64_t ld, int group, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % (group * bytes) == 0 && ld % group == 0;
  };
  const std::size_t stored_bytes = stored.dtype == DType::bf16 ? 2 : 4;
  const bool vector =
      rows_aligned(a.data, a.ld, augmented ? kVectorIn<true> : kVectorIn<false>, a.bf16 ? 2 : 4) &&
      rows_aligned(out32, ld32, kVectorOut, 4) &&
      rows_aligned(stored.data, stored.ld, kVectorOut, stored_bytes);
  const double* bias_sum = sums + product_check_bias_slot(k);
  const LaunchShape shape{ceil_div(n, kBlock / device_info().warp_size * kRowsPerWarp), kBlock, 0};
  auto run = [&]<bool Augmented, bool Vector, class S>(S* out) {
    launch("product_check_rows", rows_kernel<S, Augmented, Vector>, shape, s,
           static_cast<const Input<Augmented>*>(a.data), a.ld, n, k, out32, ld32, m,
           reinterpret_cast<const ColumnSums<Augmented>*>(sums + 2 * k), bias_sum, bias, relu, out,
           stored.ld, product, what, record);
  };
  auto pick = [&]<class S>(S* out) {
    if (augmented)
      vector ? run.template operator()<true, true>(out) : run.template operator()<true, false>(out);
    else
      vector ? run.template operator()<false, true>(out)
             : run.template operator()<false, false>(out);
  };
  if (stored.dtype == DType::bf16) {
    pick(static_cast<Bf16*>(stored.data));
  } else if (stored.is_f32()) {
    pick(static_cast<float*>(stored.data));
  } else {
    throw Error("product_check_rows: an output stored in " + std::string(dtype_name(stored.dtype)) +
                "; fp32 or bf16 expected");
  }
}

void product_check_tiles_rows(Stream_t s, CheckOperand a, std::int64_t n, std::int64_t k,
                              const double* partials, const float* checksum, std::int64_t m,
                              const double* sums, long long product, int what,
                              ProductCheckRecord* record) {
  if (n <= 0 || m <= 0) return;
  if (!a.bf16) throw Error("product_check_tiles_rows: an fp32 input; the fused product reads bf16");
  const bool vector =
      reinterpret_cast<std::uintptr_t>(a.data) % 16 == 0 && a.ld % kVectorIn<true> == 0;
  const LaunchShape shape{ceil_div(n, kBlock / device_info().warp_size * kRowsPerWarp), kBlock, 0};
  const auto* cols = reinterpret_cast<const float2*>(sums + 2 * k);
  const auto* in = static_cast<const Bf16*>(a.data);
  const auto* p = reinterpret_cast<const double2*>(partials);
  const auto* c = reinterpret_cast<const float2*>(checksum);
  const std::int64_t tiles = product_check_tiles(m);
  if (vector)
    launch("product_check_tiles_rows", tiles_kernel<true>, shape, s, in, a.ld, n, k, p, tiles, c, m,
           cols, product, what, record);
  else
    launch("product_check_tiles_rows", tiles_kernel<false>, shape, s, in, a.ld, n, k, p, tiles, c,
           m, cols, product, what, record);
}

bool product_check_combine_runs(CAMat x0, CAMat z, CAMat xl, AMat x_next) {
  const auto fits = [](const void* p, std::int64_t ld, DType t) {
    return t == DType::bf16 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0 &&
           ld % kVectorIn<true> == 0;
  };
  return x0.cols % kVectorIn<true> == 0 && fits(x0.data, x0.ld, x0.dtype) &&
         fits(z.data, z.ld, z.dtype) && fits(xl.data, xl.ld, xl.dtype) &&
         fits(x_next.data, x_next.ld, x_next.dtype);
}

void product_check_cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next,
                                 const double* sums, double* terms, const double* next_sums,
                                 double* next_terms) {
  if (!product_check_combine_runs(x0, z, xl, x_next))
    throw Error(
        "product_check_cross_combine: bf16 matrices with 16-byte aligned rows and a "
        "multiple of 8 columns expected");
  const std::int64_t n = x0.rows, k = x0.cols;
  if (n <= 0) return;
  const LaunchShape shape{ceil_div(n, kBlock / device_info().warp_size * kRowsPerWarp), kBlock, 0};
  const auto* cols = reinterpret_cast<const float2*>(sums + 2 * k);
  const auto* x0b = static_cast<const Bf16*>(x0.data);
  const auto* zb = static_cast<const Bf16*>(z.data);
  const auto* xlb = static_cast<const Bf16*>(xl.data);
  auto* xn = static_cast<Bf16*>(x_next.data);
  if (next_sums != nullptr)
    launch("product_check_cross_combine", cross_combine_kernel<true>, shape, s, x0b, x0.ld, zb,
           z.ld, xlb, xl.ld, xn, x_next.ld, n, k, cols, terms,
           reinterpret_cast<const float2*>(next_sums + 2 * k), next_terms);
  else
    launch("product_check_cross_combine", cross_combine_kernel<false>, shape, s, x0b, x0.ld, zb,
           z.ld, xlb, xl.ld, xn, x_next.ld, n, k, cols, terms, static_cast<const float2*>(nullptr),
           static_cast<double*>(nullptr));
}

void product_check_tiles_terms(Stream_t s, const double* terms, std::int64_t n, std::int64_t k,
                               const double* partials, const float* checksum, std::int64_t m,
                               long long product, int what, ProductCheckRecord* record) {
  if (n <= 0 || m <= 0) return;
  const LaunchShape shape{ceil_div(n, kBlock / device_info().warp_size * kRowsPerWarp), kBlock, 0};
  launch("product_check_tiles_terms", tiles_terms_kernel, shape, s, terms, n, k,
         reinterpret_cast<const double2*>(partials), product_check_tiles(m),
         reinterpret_cast<const float2*>(checksum), m, product, what, record);
}

void round_to_bf16(Stream_t s, const float* v, std::int64_t n, float* out) {
  if (n <= 0) return;
  launch("round_to_bf16", round_kernel, {ceil_div(n, kBlock), kBlock, 0}, s, v, n, out);
}

void flip_bit(Stream_t s, AMat m, std::int64_t element, int bit, const float* bias) {
  if (m.rows <= 0 || m.cols <= 0) return;
  if (bias != nullptr && !m.is_f32())
    throw Error("flip_bit: a bias is added to fp32 elements only");
  const std::int64_t offset = element / m.cols * m.ld + element % m.cols;
  launch("flip_bit", flip_kernel, {1, device_info().warp_size, 0}, s, m.data,
         m.dtype == DType::bf16, offset, bit, bias, element % m.cols);
}

}  // namespace parity::gpu
