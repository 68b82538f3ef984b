// gemm_epilogue (see gemm_epilogue.h): a grid-stride loop over the output's elements; it runs on
// a fallback path only, so a flat index (one division per element) is good enough.
#include "backend/gpu/gemm_epilogue.h"

#include "backend/gpu/elementwise.cuh"

namespace parity::gpu {

namespace {

using namespace elementwise;

template <class S>
__global__ __launch_bounds__(kBlock) void gemm_epilogue_kernel(MatView<S> d, float beta,
                                                               const S* __restrict__ bias,
                                                               bool relu) {
  const std::int64_t n = d.cols;
  const std::int64_t total = d.rows * n;
  for (std::int64_t i = global_index(); i < total; i += grid_stride()) {
    const std::int64_t r = i / n, c = i - r * n;
    S* o = d.data + r * d.ld + c;
    float v = beta != 0.0f ? beta * to_float(*o) : 0.0f;
    if (bias != nullptr) v += to_float(bias[c]);
    if (relu && !(v > 0.0f)) v = 0.0f;
    *o = from_float_rn<S>(v);
  }
}

}  // namespace

void gemm_epilogue(Stream_t s, AMat d, float beta, const void* bias, bool relu) {
  if (d.rows <= 0 || d.cols <= 0) return;
  dispatch(
      "gemm_epilogue", 1,
      [&](auto, auto tag) {
        using S = decltype(tag);
        launch("gemm_epilogue", gemm_epilogue_kernel<S>, {grid_for(d.rows * d.cols), kBlock, 0}, s,
               typed<S>(d), beta, static_cast<const S*>(bias), relu);
      },
      d.dtype);
}

}  // namespace parity::gpu
