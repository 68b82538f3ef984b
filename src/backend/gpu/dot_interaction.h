// The dot interaction (Backend::dot_interaction_forward / _backward, include/parity/backend.h; the
// CPU reference is src/backend/cpu/cpu_interaction.cpp): per example, the Gram matrix of the
// bottom MLP's output and the pooled embeddings. Host entry points; kernels in dot_interaction.cu.
#pragma once

#include "backend/gpu/numerics.h"
#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// A bf16 copy of the output written beside it (rows of ld, ld the columns rounded up to a multiple
// of 8, the columns past them zeros: what gpu::convert_padded makes), where a product reads it
// next; data null: none.
struct BF16Copy {
  Bf16* data = nullptr;
  std::int64_t ld = 0;
};

// num_tables + 1 features of dense.cols each. Throws Error when one example's features do not fit
// in shared memory.
void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out, BF16Copy copy = {});
void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                  Mat demb);

}  // namespace parity::gpu
