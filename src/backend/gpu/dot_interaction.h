// The dot interaction (Backend::dot_interaction_forward / _backward, include/parity/backend.h; the
// CPU reference is src/backend/cpu/cpu_interaction.cpp): per example, the Gram matrix of the
// bottom MLP's output and the pooled embeddings. Host entry points; kernels in dot_interaction.cu.
#pragma once

#include "backend/gpu/port.h"
#include "parity/tensor.h"

namespace parity::gpu {

// num_tables + 1 features of dense.cols each. Throws Error when one example's features do not fit
// in shared memory.
void dot_forward(Stream_t s, CMat dense, CMat emb, int num_tables, Mat out);
void dot_backward(Stream_t s, CMat dense, CMat emb, int num_tables, CMat dout, Mat ddense,
                  Mat demb);

}  // namespace parity::gpu
