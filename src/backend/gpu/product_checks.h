// Checksummed forward products on the GPU (Backend::set_product_checks, include/parity/backend.h):
// each output row's sum checked against the sum its inputs predict, before the activation and
// before a bf16 output is rounded. Host entry points; kernels and the bound's derivation in
// product_checks.cu.
#pragma once

#include <cstdint>

#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// A stored operand of a checked product as the library read it: element (r, c) at
// data[r * ld + c], bf16 bits (under bf16 math) or fp32.
struct CheckOperand {
  const void* data = nullptr;
  std::int64_t ld = 0;
  bool bf16 = false;
};

// What a failed check leaves on the device (the first failure's record; the count of all).
struct ProductCheckRecord {
  unsigned long long failures = 0;     // products with a failing row
  unsigned long long last_failed = 0;  // the index + 1 of the last product counted
  unsigned long long first_set = 0;    // 0 until a failure writes the fields below
  long long product = -1;              // the product's index since the checks were turned on
  long long row = -1;
  long long rows = 0, cols = 0;
  int what = 0;  // the caller's code for the product
  double sum = 0, predicted = 0, bound = 0;
};

// The places the row pass's pairs of k columns may take beyond k (they are kept in the order its
// lanes read them, padded to a group of up to 64 lanes x 8 columns).
inline constexpr std::int64_t kPairPad = 512;
// Doubles of scratch the check of a product of depth k needs: [0, 2k) the weights' column sums as
// they are formed, then the pairs the row pass reads a column (two doubles a place at most), and
// last the bias's sum.
inline std::int64_t product_check_sums(std::int64_t k) {
  return 2 * k + 2 * (k + kPairPad) + 1;
}
// Where in those doubles the bias's sum is kept: the last.
inline std::int64_t product_check_bias_slot(std::int64_t k) {
  return product_check_sums(k) - 1;
}

// fp32 math, the weights' part of the check of out [n, m] = a [n, k] · wᵀ (+ bias), w [m, k] as
// the product read it: into sums, the pairs (s_c, t_c) of s_c = Σ_j w_jc and t_c = Σ_j w_jc² for
// each c < k, then Σ_j bias_j (0 without a bias), in double.
void product_check_weights(Stream_t s, CheckOperand w, std::int64_t m, std::int64_t k,
                           const float* bias, double* sums);

// bf16 math: the bf16 copy of w [m, k] that the checked product reads, wa [rows, ld] (ld >= k,
// rows >= m + 2, zeros past w): w's rows rounded to bf16, then the checksum row hi = bf16(s) and
// lo = bf16(s - hi) of s_c = Σ_j bf16(w_jc), so that the product's columns m and m + 1 carry the
// row sums' prediction computed by the same kernel as the outputs. Into sums: s_c, t_c =
// Σ_j bf16(w_jc)², and the pairs (r_c, t_c + s_c²) in fp32 with the rest r_c = s_c - hi_c - lo_c,
// for each c < k.
void product_check_augment(Stream_t s, CMat w, std::int64_t rows, std::int64_t ld, void* wa,
                           double* sums);

// Checks each row of the fp32 product out32 [n, m] (ld32) against a [n, k] (bf16 under bf16
// math, where augmented; fp32 under fp32) and sums (above):
// where a row fails, counts it in *record (the first failure's fields too, with `product` and
// `what`; record null: nothing is recorded, for a fault planted with the checks off). Then writes
// the stored output: out32 (plus bias where augmented: there the product ran
// without it, and columns m and m + 1 of out32 are the checksum columns), rectified where relu,
// into `stored` (fp32, which may be out32 itself, or bf16, rounded to nearest).
void product_check_rows(Stream_t s, CheckOperand a, std::int64_t n, std::int64_t k,
                        const float* out32, std::int64_t ld32, std::int64_t m, const double* sums,
                        bool augmented, const float* bias, bool relu, AMat stored,
                        long long product, int what, ProductCheckRecord* record);

// ---- bf16 math in one kernel (checked_product.cu) ----
// Whether product_check_fused runs here: sm_90a code in this binary and a device of compute
// capability 9.0. Elsewhere a checked bf16 product goes through the library and
// product_check_rows.
bool product_check_fused_available();
// The column tiles of the fused product's output: each row's sums come one pair a tile.
std::int64_t product_check_tiles(std::int64_t m);

// out [n, m] (bf16) = a [n, k] · wᵀ (+ bias) (relu), a and w bf16 with k a multiple of 8 and rows
// 16-byte aligned, w [m + 2, k] the weights' copy with its checksum rows (product_check_augment).
// Besides the output it writes, for each row i and column tile t, partials[2 (i tiles + t)] and
// the next: the sum and the sum of squares of the tile's fp32 outputs before the bias (the squares
// with the share of the sums' own fp32 roundings, below), and checksum[2 i] and the next: the
// checksum columns a_i · hi and a_i · lo. Where fault_element >= 0 that element's fp32 value plus
// its bias gets bit fault_bit flipped before it is summed and stored (the planted fault).
struct FusedProduct {
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* w = nullptr;
  std::int64_t ldw = 0;
  std::int64_t n = 0, m = 0, k = 0;
  const float* bias = nullptr;
  bool relu = false;
  void* out = nullptr;
  std::int64_t ldo = 0;
  double* partials = nullptr;  // 2 n product_check_tiles(m)
  // The depth the check's bound counts, k less the zeros that pad it (0: k): the sums of squares
  // carry the share of their own fp32 roundings in units of that bound (checked_product.cu).
  std::int64_t check_depth = 0;
  float* checksum = nullptr;  // 2 n
  std::int64_t fault_element = -1;
  int fault_bit = 0;
};
void product_check_fused(Stream_t s, const FusedProduct& p);

// Checks each row of a fused product (above) against its input a [n, k] (bf16) and the sums of
// product_check_augment, as product_check_rows does; counts a failure in *record.
void product_check_tiles_rows(Stream_t s, CheckOperand a, std::int64_t n, std::int64_t k,
                              const double* partials, const float* checksum, std::int64_t m,
                              const double* sums, long long product, int what,
                              ProductCheckRecord* record);

// ---- the cross layer's u checked through its combine ----
// Whether product_check_cross_combine runs on these operands: bf16, rows 16-byte aligned, a
// multiple of 8 columns.
bool product_check_combine_runs(CAMat x0, CAMat z, CAMat xl, AMat x_next);
// x_next = x0 ⊙ z + xl (as cross_combine), and for each row i of xl [n, k] the input's part of the
// check of the fused u = xl · vᵀ against v's pairs (sums, product_check_augment):
// terms[3 i .. 3 i + 2] = Σ_c xl_ic r_c, Σ_c |xl_ic r_c| and Σ_c xl_ic² (t_c + s_c²), in double.
// Where next_sums is given (the pairs of the weights of the product x_next feeds), the same of
// x_next as stored into next_terms.
void product_check_cross_combine(Stream_t s, CAMat x0, CAMat z, CAMat xl, AMat x_next,
                                 const double* sums, double* terms,
                                 const double* next_sums = nullptr, double* next_terms = nullptr);
// Checks each row of a fused product from its partials and checksum (product_check_fused) and
// the input's terms (above), as product_check_tiles_rows does.
void product_check_tiles_terms(Stream_t s, const double* terms, std::int64_t n, std::int64_t k,
                               const double* partials, const float* checksum, std::int64_t m,
                               long long product, int what, ProductCheckRecord* record);

// v[0..n) = the fp32 values of v rounded to bf16 (a bf16 output's bias, as the product adds it).
void round_to_bf16(Stream_t s, const float* v, std::int64_t n, float* out);

// Flips bit `bit` of element `element` (row-major over cols) of the stored view m (fp32 or bf16).
// Where bias is given (m fp32), the flip is of the element plus bias[its column], the value that
// will be stored once the bias is added: the element becomes flip(x + b) - b.
void flip_bit(Stream_t s, AMat m, std::int64_t element, int bit, const float* bias = nullptr);

}  // namespace parity::gpu
