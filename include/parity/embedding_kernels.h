// What the performance model needs to know about how the embedding kernels split their work: one
// definition, read by the kernels (src/backend/gpu/embedding_common.cuh) and by the model
// (src/perf/embedding.cpp), so the two cannot drift apart.
#pragma once

namespace parity {

// The backward sums a distinct row with more occurrences than this in chunks, by many groups, then
// the chunks' sums in order (a Zipf head row has millions of occurrences): its own stages, with
// their own cost per occurrence (Calibration::embedding_heavy_lookup_s).
inline constexpr int kEmbeddingHeavyRow = 64;

}  // namespace parity
