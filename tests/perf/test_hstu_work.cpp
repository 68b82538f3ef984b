// The HSTU workload model (perf.h): tokens and attention pairs per example from the length
// distribution, counted by hand for a small case, and the per-layer FLOPs and activation bytes.
#include <gtest/gtest.h>

#include <string>

#include "parity/error.h"
#include "parity/perf.h"
#include "parity/spec.h"

namespace parity {
namespace {

ModelSpec hstu(const std::string& lengths) {
  return parse_model_spec(R"(
name: work
kind: hstu
batch_size: 8
sequence:
  max_len: 3
  targets: 2
  lengths: )" + lengths + R"(
  features:
    - {name: item, rows: 100, dim: 8}
context:
  - {name: segment, rows: 5, dim: 8}
hstu: {model_dim: 8, layers: 2, heads: 2, attention_dim: 3, value_dim: 5, position_buckets: 4, time_buckets: 4}
tasks: [click]
optimizer: {embedding: {kind: rowwise_adagrad, lr: 0.05}, dense: {kind: adam, lr: 0.001}}
)",
                          "<test>");
}

TEST(HstuWork, MomentsCountedByHand) {
  // One context and 1 to 3 events (uniform), two targets: H = 2, 3, 4 tokens before the targets,
  // pairs H(H+1)/2 + 2(H+1) = 9, 14, 20.
  const SequenceMoments m = sequence_moments(hstu("uniform"));
  EXPECT_DOUBLE_EQ(m.history, 2.0);
  EXPECT_DOUBLE_EQ(m.tokens, 5.0);
  EXPECT_DOUBLE_EQ(m.pairs, 43.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.tokens_max, 6.0);
  // A power law puts more weight on the short lengths.
  const SequenceMoments p = sequence_moments(hstu("power_law\n  length_alpha: 2.0"));
  EXPECT_LT(p.history, 2.0);
  EXPECT_GT(p.history, 1.0);
  EXPECT_LT(p.pairs, m.pairs);
}

TEST(HstuWork, LayerWork) {
  const ModelSpec spec = hstu("uniform");
  const HstuLayerWork w = hstu_layer_work(spec);
  // d 8, hv 10, ha 6: the projection 8 x 32 and the output 10 x 8 per token, 5 tokens.
  EXPECT_DOUBLE_EQ(w.projection_flops_forward, 2.0 * 5.0 * (8 * 32 + 10 * 8));
  EXPECT_DOUBLE_EQ(w.projection_flops_backward, 2.0 * w.projection_flops_forward);
  EXPECT_DOUBLE_EQ(w.attention_flops_forward, 2.0 * 43.0 / 3.0 * 2 * (3 + 5));
  EXPECT_DOUBLE_EQ(w.attention_flops_backward, 2.0 * 43.0 / 3.0 * 2 * (9 + 10));
  EXPECT_DOUBLE_EQ(w.activation_bytes_per_token, 4.0 * (16 + 64 + 20 + 4));
  EXPECT_DOUBLE_EQ(w.activation_bytes_per_token_recompute, 4.0 * (8 + 32 + 10 + 4));
  EXPECT_THROW(sequence_moments(load_model_spec(PARITY_SOURCE_DIR "/configs/models/tiny.yaml")),
               InputError);
}

}  // namespace
}  // namespace parity
