// The one file that names cuBLASLt and hipBLASLt symbols (port.h's rule, for the BLAS library):
// blas.cpp speaks gpu::blas:: and compiles unchanged for either vendor.
//
// Why it is built this way:
// - Aliases and inline wrappers, never `#define cublasLtX hipblasLtX` (see port.h).
// - Only the calls and enumerators blas.cpp uses are mapped; adding one means adding it for both
//   vendors here.
// - hipBLASLt is optional on the host that compiles: where its header is absent (the CI's HIP
//   compile check installs only the HIP runtime), PARITY_GPU_HAVE_BLASLT stays 0 and blas.cpp
//   builds an implementation whose every call throws "not available". The hipBLASLt branch mirrors
//   ROCm 6's names and is checked only by that compile; cuBLASLt's is the tested one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/gpu/port.h"

#if defined(PARITY_GPU_HIP)
#if __has_include(<hipblaslt/hipblaslt.h>)
#include <hipblaslt/hipblaslt.h>
#define PARITY_GPU_HAVE_BLASLT 1
#else
#define PARITY_GPU_HAVE_BLASLT 0
#endif
#else
#include <cublasLt.h>
#define PARITY_GPU_HAVE_BLASLT 1
#endif

#if PARITY_GPU_HAVE_BLASLT

namespace parity::gpu::blas {

// The configuration fields and capabilities of a library algorithm that blas_kernels.cpp reads
// and writes (each vendor branch maps them to its attributes).
enum class AlgoField : std::uint8_t {
  id,
  tile,
  stages,
  split_k,
  reduction,
  swizzle,
  custom,
  cluster,
  inner
};
enum class AlgoCap : std::uint8_t {
  split_k,
  reduction_mask,
  swizzle,
  custom_max,
  tiles,
  stages,
  min_align_a,
  min_align_b,
  min_align_c,
  min_align_d
};

#if defined(PARITY_GPU_HIP)
inline constexpr const char* kLibrary = "hipBLASLt";
using Status = hipblasStatus_t;
using Handle = hipblasLtHandle_t;
using MatmulDesc = hipblasLtMatmulDesc_t;
using Layout = hipblasLtMatrixLayout_t;
using Preference = hipblasLtMatmulPreference_t;
using Heuristic = hipblasLtMatmulHeuristicResult_t;
using ComputeType = hipblasComputeType_t;
using DataType = hipDataType;
using Operation = hipblasOperation_t;
using EpilogueKind = hipblasLtEpilogue_t;
inline constexpr Status kSuccess = HIPBLAS_STATUS_SUCCESS;
inline constexpr ComputeType kCompute32F = HIPBLAS_COMPUTE_32F;
// gfx950 has no XF32 units: there hipBLASLt runs this as three bf16 products (tf32_emulation).
inline constexpr ComputeType kCompute32FFastTf32 = HIPBLAS_COMPUTE_32F_FAST_TF32;
inline constexpr DataType kF32 = HIP_R_32F;
inline constexpr DataType kBf16 = HIP_R_16BF;
inline constexpr Operation kOpN = HIPBLAS_OP_N;
inline constexpr Operation kOpT = HIPBLAS_OP_T;
inline constexpr EpilogueKind kEpilogueDefault = HIPBLASLT_EPILOGUE_DEFAULT;
inline constexpr EpilogueKind kEpilogueRelu = HIPBLASLT_EPILOGUE_RELU;
inline constexpr EpilogueKind kEpilogueBias = HIPBLASLT_EPILOGUE_BIAS;
inline constexpr EpilogueKind kEpilogueReluBias = HIPBLASLT_EPILOGUE_RELU_BIAS;
inline constexpr bool kHasAlignmentPreferences = false;
inline constexpr bool kHasReductionSchemeMask = false;

inline Status create(Handle* h) {
  return hipblasLtCreate(h);
}
inline Status destroy(Handle h) {
  return hipblasLtDestroy(h);
}
inline Status desc_create(MatmulDesc* d, ComputeType c, DataType scale) {
  return hipblasLtMatmulDescCreate(d, c, scale);
}
inline Status desc_destroy(MatmulDesc d) {
  return hipblasLtMatmulDescDestroy(d);
}
inline Status desc_set_transa(MatmulDesc d, Operation op) {
  return hipblasLtMatmulDescSetAttribute(d, HIPBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op);
}
inline Status desc_set_transb(MatmulDesc d, Operation op) {
  return hipblasLtMatmulDescSetAttribute(d, HIPBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op);
}
inline Status desc_set_epilogue(MatmulDesc d, EpilogueKind e) {
  return hipblasLtMatmulDescSetAttribute(d, HIPBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
}
inline Status desc_set_bias(MatmulDesc d, const void* bias) {
  return hipblasLtMatmulDescSetAttribute(d, HIPBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
}
inline Status desc_set_bias_type(MatmulDesc d, DataType t) {
  return hipblasLtMatmulDescSetAttribute(d, HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t);
}
inline Status layout_create(Layout* l, DataType t, std::uint64_t rows, std::uint64_t cols,
                            std::int64_t ld) {
  return hipblasLtMatrixLayoutCreate(l, t, rows, cols, ld);
}
inline Status layout_destroy(Layout l) {
  return hipblasLtMatrixLayoutDestroy(l);
}
inline Status pref_create(Preference* p) {
  return hipblasLtMatmulPreferenceCreate(p);
}
inline Status pref_destroy(Preference p) {
  return hipblasLtMatmulPreferenceDestroy(p);
}
inline Status pref_set_workspace(Preference p, std::uint64_t bytes) {
  return hipblasLtMatmulPreferenceSetAttribute(p, HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                               sizeof bytes);
}
inline Status pref_set_alignment(Preference, int, std::uint32_t) {
  return kSuccess;
}
inline Status pref_set_reduction_mask(Preference, std::uint32_t) {
  return kSuccess;
}
inline Status heuristic(Handle h, MatmulDesc d, Layout a, Layout b, Layout c, Layout dd,
                        Preference p, int want, Heuristic* out, int* got) {
  return hipblasLtMatmulAlgoGetHeuristic(h, d, a, b, c, dd, p, want, out, got);
}
inline Status matmul(Handle h, MatmulDesc d, const void* alpha, const void* a, Layout la,
                     const void* b, Layout lb, const void* beta, const void* c, Layout lc, void* dd,
                     Layout ld, const Heuristic& algo, void* ws, std::size_t ws_bytes, Stream_t s) {
  return hipblasLtMatmul(h, d, alpha, a, la, b, lb, beta, c, lc, dd, ld, &algo.algo, ws, ws_bytes,
                         s);
}
inline std::size_t heuristic_workspace(const Heuristic& h) {
  return h.workspaceSize;
}

// Kernel enumeration (blas_kernels.cpp). hipBLASLt's C interface has no per-algorithm
// configuration fields: its kernels are enumerated through the heuristic (asked for many
// answers) and described by their solution index alone.
using Algo = hipblasLtMatmulAlgo_t;
inline constexpr DataType kF16 = HIP_R_16F;
inline constexpr DataType kE4M3 = HIP_R_8F_E4M3_FNUZ;
inline constexpr bool kHasAlgoConfig = false;
inline Status algo_ids(Handle, ComputeType, DataType, DataType, DataType, DataType, DataType, int,
                       int*, int* n) {
  *n = 0;
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_init(Handle, ComputeType, DataType, DataType, DataType, DataType, DataType, int,
                        Algo*) {
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_get(const Algo&, AlgoField, std::int64_t* v) {
  *v = 0;
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_set(Algo*, AlgoField, std::int64_t) {
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_cap(const Algo&, AlgoCap, std::int64_t* v) {
  *v = 0;
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_cap_list(const Algo&, AlgoCap, std::vector<std::uint32_t>& ids) {
  ids.clear();
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status algo_check(Handle, MatmulDesc, Layout, Layout, Layout, Layout, const Algo&,
                         Heuristic*) {
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline Status pref_set_algo_id_search(Preference) {
  return HIPBLAS_STATUS_NOT_SUPPORTED;
}
inline float heuristic_waves(const Heuristic&) {
  return 0.0f;
}
inline int solution_index(const Algo& a) {
  int v = 0;
  std::memcpy(&v, a.data, sizeof v);
  return v;
}
inline std::size_t library_version() {
  return 0;
}
inline constexpr std::uint32_t kReductionNone = 0;
inline constexpr std::uint32_t kReductionInPlace = 1;
inline constexpr std::uint32_t kReductionComputeType = 2;
inline constexpr std::uint32_t kReductionOutputType = 4;
inline int status_code(Status s) {
  return static_cast<int>(s);
}
inline const char* status_name(Status) {
  return "hipblasStatus";
}
#else
inline constexpr const char* kLibrary = "cuBLASLt";
using Status = cublasStatus_t;
using Handle = cublasLtHandle_t;
using MatmulDesc = cublasLtMatmulDesc_t;
using Layout = cublasLtMatrixLayout_t;
using Preference = cublasLtMatmulPreference_t;
using Heuristic = cublasLtMatmulHeuristicResult_t;
using ComputeType = cublasComputeType_t;
using DataType = cudaDataType_t;
using Operation = cublasOperation_t;
using EpilogueKind = cublasLtEpilogue_t;
inline constexpr Status kSuccess = CUBLAS_STATUS_SUCCESS;
inline constexpr ComputeType kCompute32F = CUBLAS_COMPUTE_32F;
inline constexpr ComputeType kCompute32FFastTf32 = CUBLAS_COMPUTE_32F_FAST_TF32;
inline constexpr DataType kF32 = CUDA_R_32F;
inline constexpr DataType kBf16 = CUDA_R_16BF;
inline constexpr Operation kOpN = CUBLAS_OP_N;
inline constexpr Operation kOpT = CUBLAS_OP_T;
inline constexpr EpilogueKind kEpilogueDefault = CUBLASLT_EPILOGUE_DEFAULT;
inline constexpr EpilogueKind kEpilogueRelu = CUBLASLT_EPILOGUE_RELU;
inline constexpr EpilogueKind kEpilogueBias = CUBLASLT_EPILOGUE_BIAS;
inline constexpr EpilogueKind kEpilogueReluBias = CUBLASLT_EPILOGUE_RELU_BIAS;
inline constexpr bool kHasAlignmentPreferences = true;
inline constexpr bool kHasReductionSchemeMask = true;
// Split-K reductions that keep partial sums in the workspace and add them in a fixed order
// (the in-place scheme, which sums the slices in the output buffer itself, is left out).
inline constexpr std::uint32_t kDeterministicReductions = CUBLASLT_REDUCTION_SCHEME_NONE |
                                                          CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                                          CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;

inline Status create(Handle* h) {
  return cublasLtCreate(h);
}
inline Status destroy(Handle h) {
  return cublasLtDestroy(h);
}
inline Status desc_create(MatmulDesc* d, ComputeType c, DataType scale) {
  return cublasLtMatmulDescCreate(d, c, scale);
}
inline Status desc_destroy(MatmulDesc d) {
  return cublasLtMatmulDescDestroy(d);
}
inline Status desc_set_transa(MatmulDesc d, Operation op) {
  return cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op);
}
inline Status desc_set_transb(MatmulDesc d, Operation op) {
  return cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op);
}
inline Status desc_set_epilogue(MatmulDesc d, EpilogueKind e) {
  return cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
}
inline Status desc_set_bias(MatmulDesc d, const void* bias) {
  return cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
}
inline Status desc_set_bias_type(MatmulDesc d, DataType t) {
  return cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t);
}
inline Status layout_create(Layout* l, DataType t, std::uint64_t rows, std::uint64_t cols,
                            std::int64_t ld) {
  return cublasLtMatrixLayoutCreate(l, t, rows, cols, ld);
}
inline Status layout_destroy(Layout l) {
  return cublasLtMatrixLayoutDestroy(l);
}
inline Status pref_create(Preference* p) {
  return cublasLtMatmulPreferenceCreate(p);
}
inline Status pref_destroy(Preference p) {
  return cublasLtMatmulPreferenceDestroy(p);
}
inline Status pref_set_workspace(Preference p, std::uint64_t bytes) {
  return cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                              sizeof bytes);
}
// operand: 0 A, 1 B, 2 C, 3 D.
inline Status pref_set_alignment(Preference p, int operand, std::uint32_t bytes) {
  static constexpr cublasLtMatmulPreferenceAttributes_t kAttr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  return cublasLtMatmulPreferenceSetAttribute(p, kAttr[operand], &bytes, sizeof bytes);
}
inline Status pref_set_reduction_mask(Preference p, std::uint32_t mask) {
  return cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                              sizeof mask);
}
inline Status heuristic(Handle h, MatmulDesc d, Layout a, Layout b, Layout c, Layout dd,
                        Preference p, int want, Heuristic* out, int* got) {
  return cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, dd, p, want, out, got);
}
inline Status matmul(Handle h, MatmulDesc d, const void* alpha, const void* a, Layout la,
                     const void* b, Layout lb, const void* beta, const void* c, Layout lc, void* dd,
                     Layout ld, const Heuristic& algo, void* ws, std::size_t ws_bytes, Stream_t s) {
  return cublasLtMatmul(h, d, alpha, a, la, b, lb, beta, c, lc, dd, ld, &algo.algo, ws, ws_bytes,
                        s);
}
inline std::size_t heuristic_workspace(const Heuristic& h) {
  return h.workspaceSize;
}

// Kernel enumeration (blas_kernels.cpp): algorithm ids for a type combination, each algorithm's
// capabilities, its configuration fields, and the library's check of one configuration.
using Algo = cublasLtMatmulAlgo_t;
inline constexpr DataType kF16 = CUDA_R_16F;
inline constexpr DataType kE4M3 = CUDA_R_8F_E4M3;
inline constexpr bool kHasAlgoConfig = true;
inline Status algo_ids(Handle h, ComputeType c, DataType scale, DataType a, DataType b, DataType cc,
                       DataType d, int capacity, int* ids, int* n) {
  return cublasLtMatmulAlgoGetIds(h, c, scale, a, b, cc, d, capacity, ids, n);
}
inline Status algo_init(Handle h, ComputeType c, DataType scale, DataType a, DataType b,
                        DataType cc, DataType d, int id, Algo* algo) {
  return cublasLtMatmulAlgoInit(h, c, scale, a, b, cc, d, id, algo);
}
// The configuration fields have different widths in the library; each is read and written at
// its own.
namespace detail {
inline cublasLtMatmulAlgoConfigAttributes_t config_attr(AlgoField f) {
  switch (f) {
    case AlgoField::id:
      return CUBLASLT_ALGO_CONFIG_ID;
    case AlgoField::tile:
      return CUBLASLT_ALGO_CONFIG_TILE_ID;
    case AlgoField::stages:
      return CUBLASLT_ALGO_CONFIG_STAGES_ID;
    case AlgoField::split_k:
      return CUBLASLT_ALGO_CONFIG_SPLITK_NUM;
    case AlgoField::reduction:
      return CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME;
    case AlgoField::swizzle:
      return CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING;
    case AlgoField::custom:
      return CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION;
    case AlgoField::cluster:
      return CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID;
    case AlgoField::inner:
      return CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID;
  }
  return CUBLASLT_ALGO_CONFIG_ID;
}
inline std::size_t config_width(AlgoField f) {
  return f == AlgoField::cluster || f == AlgoField::inner ? 2 : 4;
}
}  // namespace detail
inline Status algo_get(const Algo& a, AlgoField f, std::int64_t* v) {
  std::size_t written = 0;
  if (detail::config_width(f) == 2) {
    std::uint16_t x = 0;
    const Status st =
        cublasLtMatmulAlgoConfigGetAttribute(&a, detail::config_attr(f), &x, sizeof x, &written);
    *v = x;
    return st;
  }
  std::uint32_t x = 0;
  const Status st =
      cublasLtMatmulAlgoConfigGetAttribute(&a, detail::config_attr(f), &x, sizeof x, &written);
  *v = f == AlgoField::id || f == AlgoField::split_k ? static_cast<std::int32_t>(x) : x;
  return st;
}
inline Status algo_set(Algo* a, AlgoField f, std::int64_t v) {
  if (detail::config_width(f) == 2) {
    const auto x = static_cast<std::uint16_t>(v);
    return cublasLtMatmulAlgoConfigSetAttribute(a, detail::config_attr(f), &x, sizeof x);
  }
  const auto x = static_cast<std::uint32_t>(v);
  return cublasLtMatmulAlgoConfigSetAttribute(a, detail::config_attr(f), &x, sizeof x);
}
inline Status algo_cap(const Algo& a, AlgoCap c, std::int64_t* v) {
  cublasLtMatmulAlgoCapAttributes_t attr = CUBLASLT_ALGO_CAP_SPLITK_SUPPORT;
  switch (c) {
    case AlgoCap::split_k:
      attr = CUBLASLT_ALGO_CAP_SPLITK_SUPPORT;
      break;
    case AlgoCap::reduction_mask:
      attr = CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK;
      break;
    case AlgoCap::swizzle:
      attr = CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT;
      break;
    case AlgoCap::custom_max:
      attr = CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX;
      break;
    case AlgoCap::min_align_a:
      attr = CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES;
      break;
    case AlgoCap::min_align_b:
      attr = CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES;
      break;
    case AlgoCap::min_align_c:
      attr = CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES;
      break;
    case AlgoCap::min_align_d:
      attr = CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES;
      break;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::uint32_t x = 0;  // int32 or uint32, both four bytes
  std::size_t written = 0;
  const Status st = cublasLtMatmulAlgoCapGetAttribute(&a, attr, &x, sizeof x, &written);
  *v = c == AlgoCap::split_k || c == AlgoCap::custom_max ? static_cast<std::int32_t>(x) : x;
  return st;
}
// The tile or stages ids an algorithm accepts (at most `capacity`).
inline Status algo_cap_list(const Algo& a, AlgoCap c, std::vector<std::uint32_t>& ids) {
  const auto attr = c == AlgoCap::tiles ? CUBLASLT_ALGO_CAP_TILE_IDS : CUBLASLT_ALGO_CAP_STAGES_IDS;
  std::size_t need = 0;
  ids.clear();
  Status st = cublasLtMatmulAlgoCapGetAttribute(&a, attr, nullptr, 0, &need);
  if (st != CUBLAS_STATUS_SUCCESS || need == 0) return st;
  ids.resize(need / sizeof(std::uint32_t));
  std::size_t written = 0;
  st = cublasLtMatmulAlgoCapGetAttribute(&a, attr, ids.data(), ids.size() * sizeof(std::uint32_t),
                                         &written);
  ids.resize(st == CUBLAS_STATUS_SUCCESS ? written / sizeof(std::uint32_t) : 0);
  return st;
}
inline Status algo_check(Handle h, MatmulDesc d, Layout a, Layout b, Layout c, Layout dd,
                         const Algo& algo, Heuristic* result) {
  return cublasLtMatmulAlgoCheck(h, d, a, b, c, dd, &algo, result);
}
// The heuristic's answers limited to the algorithm id of the Algo passed to it.
inline Status pref_set_algo_id_search(Preference p) {
  const std::uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
  return cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode,
                                              sizeof mode);
}
inline float heuristic_waves(const Heuristic& h) {
  return h.wavesCount;
}
inline std::size_t library_version() {
  return cublasLtGetVersion();
}
inline int solution_index(const Algo& a) {  // (the algorithm id; configurations add fields)
  std::int32_t id = 0;
  std::size_t written = 0;
  (void)cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
  return id;
}
inline constexpr std::uint32_t kReductionNone = CUBLASLT_REDUCTION_SCHEME_NONE;
inline constexpr std::uint32_t kReductionInPlace = CUBLASLT_REDUCTION_SCHEME_INPLACE;
inline constexpr std::uint32_t kReductionComputeType = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
inline constexpr std::uint32_t kReductionOutputType = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
inline int status_code(Status s) {
  return static_cast<int>(s);
}
// (cublasGetStatusName lives in libcublas, which parity does not link: the names are spelled here.)
inline const char* status_name(Status s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "CUBLAS_STATUS_(unknown)";
  }
}
#endif

}  // namespace parity::gpu::blas

#endif  // PARITY_GPU_HAVE_BLASLT
