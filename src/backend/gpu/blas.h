// Matrix products of the dense path through cuBLASLt (hipBLASLt on AMD), on parity's row-major
// views. Host entry points only; the vendor names live in blas_port.h.
//
// Why it is built this way:
// - parity's matrices are row-major [rows, cols] with a leading dimension; the BLAS libraries are
//   column-major. A row-major matrix read column-major is its transpose, so D = op(A)·op(B) is
//   computed as Dᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap places, each keeps its own transpose flag,
//   and no data moves.
// - Everything the library builds per shape (the matmul descriptor, four layouts, the algorithm
//   chosen by its heuristic) is built on the first call with that shape, math, epilogue and
//   operand alignment, and kept: after the first training step no descriptor is created and no
//   heuristic runs (plans() counts them, for the tests). The only per-call host work is setting
//   the bias pointer on the cached descriptor.
// - Shapes that change every step (the token count of jagged sequence batches) would each pay
//   the heuristic (about a millisecond) and grow the cache without end. Shapes fall into classes
//   (m and k rounded up to 2^e or 1.5 x 2^e): the first shape of a class gets the heuristic's
//   answer for itself, as every fixed-shape model always does; later shapes of the class share
//   one algorithm chosen for the class's rounded-up shape (a shape the library then refuses gets
//   its own). The cache holds at most 4,096 plans; past that it starts again from the classes.
// - The workspace is one device buffer allocated with the handle, before any step.
// - An epilogue the library has no algorithm for (or a bias that is not 16-byte aligned) falls
//   back to the plain product plus a small kernel, counted by epilogue_fallbacks().
// - With a kernel catalog (use_catalog) a new product's configuration is the ranking's first that
//   the library accepts (blas_kernels.h rebuilds it from its description), asked per exact shape:
//   the ranking costs microseconds, so no shape classes are needed; a product the catalog has no
//   accepted configuration for takes the heuristic's, said once per kind of product.
// - A plan's decisions (use_catalog) come first: a product whose kind and shape a decision names
//   runs the decision's first configuration the library accepts; each one refused is printed
//   with the library's reason, never passed over silently.
// - Split-K reductions are limited to the out-of-place schemes, so a product gives the same bits
//   on every run (the same seed and plan give the same losses, bit for bit).
// - bf16 math takes operands that the caller already converted to bf16 (gpu_backend.cpp keeps
//   fp32 master weights and converts per call) or stores in bf16 (activations); accumulation is
//   fp32, and D (with C) is fp32 or, for activations stored in bf16, bf16 (rounded once from the
//   fp32 result, after the epilogue; the bias is then bf16 too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/gpu/port.h"
#include "parity/select.h"

namespace parity::gpu {

// How a product is computed:
//   fp32  fp32 operands, exact fp32 products and sums (CUBLAS_COMPUTE_32F)
//   tf32  fp32 operands read as tf32 by the tensor cores, fp32 sums (CUBLAS_COMPUTE_32F_FAST_TF32)
//   bf16  bf16 operands (the caller converts), fp32 sums, fp32 or bf16 output (GemmArgs::d_bf16)
enum class GemmMath : std::uint8_t { fp32, tf32, bf16 };

// What is applied to each output after the product: + bias[col], then max(·, 0).
enum class Epilogue : std::uint8_t { none, relu, bias, relu_bias };

// A row-major operand as stored: element (r, c) at data[r * ld + c] (fp32, or bf16 bits under
// GemmMath::bf16). transposed: the product uses the transpose of what is stored.
struct GemmOperand {
  const void* data = nullptr;
  std::int64_t ld = 0;
  bool transposed = false;
};

// D [m, n] (row-major, ldd) = op(A) [m, k] · op(B) [k, n] (+ beta · C, C = D unless set) (+ bias
// [n]) (relu). beta is 0 (D overwritten) or any value with D read first (accumulate in place).
struct GemmArgs {
  std::int64_t m = 0, n = 0, k = 0;
  GemmOperand a, b;
  float beta = 0.0f;
  void* d = nullptr;  // fp32, or bf16 bits when d_bf16 (GemmMath::bf16 only)
  bool d_bf16 = false;
  std::int64_t ldd = 0;
  // The addend of beta: C [m, n] (row-major, ldc, of D's type) instead of D itself when c is set,
  // so that D = A · B + C needs no copy of C into D first.
  const void* c = nullptr;
  std::int64_t ldc = 0;
  Epilogue epilogue = Epilogue::none;
  // [n], required by the bias epilogues: fp32, or bf16 bits when d_bf16 (the library adds a bias
  // of the output's type to a 16-bit output; an fp32 bias there has no fused algorithm).
  const void* bias = nullptr;
};

class Blas {
 public:
  // Creates the library handle and allocates the workspace (32 MiB: what cuBLAS recommends for
  // Hopper; enough for every split-K plan of the dense path's shapes).
  explicit Blas(std::size_t workspace_bytes = static_cast<std::size_t>(kGemmWorkspaceBytes));
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Enqueues the product on stream s. Throws GpuError naming the shape when the library has no
  // algorithm for it or the call fails. m, n or k of 0 are handled without the library.
  void gemm(Stream_t s, GemmMath math, const GemmArgs& args);

  // Plans (descriptor + layouts + algorithm) built so far; constant once every shape was seen.
  std::int64_t plans() const;
  // Questions asked of the library's algorithm heuristic so far (one per shape class, plus one
  // for each class's first shape; see above).
  std::int64_t heuristic_queries() const;
  // Chooses every product's configuration from now on with the kernel catalog's ranking
  // (parity/select.h: no timing, no heuristic): the first of the ranking the library accepts for
  // the product, else (printed once a kind of product, counted) the heuristic's. hbm_bytes_per_s
  // is the ranking's memory floor. Plans built before keep their algorithm.
  // A product a decision names (a plan's choice, keyed by decision_key) first tries the
  // decision's configurations in order, printing why the library refused any; then the ranking.
  void use_catalog(std::shared_ptr<const GemmCatalog> catalog, double hbm_bytes_per_s,
                   std::vector<GemmDecision> decisions = {});
  // Where the products' configurations came from (with a catalog or decisions in use).
  GemmSelectionCounts selection_counts() const;
  // The library's version as it reports it (cuBLASLt: 130100 for 13.1.0).
  static std::size_t library_version();

  // Plans whose epilogue the library could not fuse (bias and ReLU then run as a kernel after the
  // product; the result is the same up to rounding). 0 on the shapes the tests know.
  std::int64_t epilogue_fallbacks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parity::gpu
