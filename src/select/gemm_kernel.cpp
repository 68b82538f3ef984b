// Text forms of the selection's problems and kernel configurations.
#include <fmt/format.h>

#include "parity/select.h"

namespace parity {

const char* gemm_type_name(GemmType t) {
  switch (t) {
    case GemmType::f32:
      return "fp32";
    case GemmType::tf32:
      return "tf32";
    case GemmType::bf16:
      return "bf16";
    case GemmType::f16:
      return "fp16";
    case GemmType::e4m3:
      return "fp8e4m3";
  }
  return "?";
}

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none:
      return "none";
    case GemmEpilogue::relu:
      return "relu";
    case GemmEpilogue::bias:
      return "bias";
    case GemmEpilogue::relu_bias:
      return "relu_bias";
  }
  return "?";
}

int gemm_operand_bytes(GemmType t) {
  switch (t) {
    case GemmType::f32:
    case GemmType::tf32:
      return 4;
    case GemmType::bf16:
    case GemmType::f16:
      return 2;
    case GemmType::e4m3:
      return 1;
  }
  return 4;
}

std::string GemmProblem::describe() const {
  static constexpr const char* kEpilogue[] = {"", " +relu", " +bias", " +bias+relu"};
  return fmt::format("{} {}x{}x{} {}{}{}{}{}", gemm_type_name(type), m, n, k, ta ? 'T' : 'N',
                     tb ? 'T' : 'N', narrow_output ? " 16-bit out" : "", accumulate ? " +=" : "",
                     kEpilogue[static_cast<int>(epilogue)]);
}

std::string decision_key(GemmProblem p) {
  p.accumulate = false;
  return p.describe();
}

std::string GemmKernel::key() const {
  return fmt::format("a{} t{}x{} k{}x{} c{}x{} s{} r{} w{} o{} i{}", algo, tile_m, tile_n, tile_k,
                     stages, cluster_m, cluster_n, split_k, static_cast<int>(reduction), swizzle,
                     custom, inner);
}

}  // namespace parity
