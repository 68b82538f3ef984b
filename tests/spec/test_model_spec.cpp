// Model specs: the zoo loads, derived quantities match hand counts, and every
// kind of bad input gets an InputError naming the file, line and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "parity/error.h"
#include "parity/spec.h"
#include "spec/yaml_util.h"
#include "spec_test_util.h"

namespace parity {
namespace {

using testing::input_error_of;
using testing::model_dir;
using testing::replaced;

std::vector<std::filesystem::path> yaml_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".yaml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// ------------------------------------------------------------------ zoo ----

TEST(ModelZoo, EveryFileLoads) {
  const auto files = yaml_files(model_dir());
  ASSERT_GE(files.size(), 13u);
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    ModelSpec m;
    ASSERT_NO_THROW(m = load_model_spec(f));
    EXPECT_EQ(m.name, f.stem().string()) << "a zoo model's name is its file name";
    EXPECT_EQ(m.source_file, f.string());
    EXPECT_FALSE(m.description.empty());
  }
}

TEST(ModelZoo, MlperfDlrmv2DerivedQuantities) {
  const ModelSpec m = load_model_spec(model_dir() / "mlperf-dlrmv2.yaml");
  EXPECT_EQ(m.num_tables(), 26);
  EXPECT_EQ(m.dense_features, 13);
  EXPECT_EQ(m.batch_size, 65536);
  for (int i = 0; i < m.num_tables(); ++i) {
    EXPECT_EQ(m.tables[i].name, "cat_" + std::to_string(i));
    EXPECT_EQ(m.tables[i].dim, 128);
    EXPECT_EQ(m.tables[i].dtype, DType::f32);
    EXPECT_EQ(m.tables[i].pooling, Pooling::sum);
    EXPECT_EQ(m.tables[i].distribution, IdDistribution::uniform);
  }
  EXPECT_EQ(m.tables[20].rows, 40000000);
  EXPECT_EQ(m.tables[20].pooling_size, 100);
  // Rows: five 40M tables (cat_0, 9, 19, 20, 21) = 200,000,000, plus the other 21
  // tables: 39060+17295+7424+20265+3+7122+1543+63+3067956+405282+10+2209+11938
  //         +155+4+976+14+590152+12973+108+36 = 4,184,588.
  EXPECT_EQ(m.embedding_rows(), 204184588);
  EXPECT_EQ(m.embedding_parameters(), 204184588LL * 128);  // 26,135,627,264
  // Multi-hot sizes 3+2+1+2+6+1+1+1+1+7+3+8+1+6+9+5+1+1+1+12+100+27+10+3+1+1.
  EXPECT_EQ(m.lookups_per_example(), 214);
  EXPECT_EQ(m.embedding_output_dim(), 26 * 128);
  EXPECT_EQ(m.interaction_input_dim(), 128 + 26 * 128);  // N = 3456
  EXPECT_EQ(m.interaction_output_dim(), 3456);
  // Dense parameters, weights + biases:
  //   bottom 13->512->256->128: (13*512+512) + (512*256+256) + (256*128+128)
  //                           = 7,168 + 131,328 + 32,896 = 171,392
  //   cross, 3 layers of V [512, 3456], W [3456, 512], b [3456]:
  //          3 * (2*512*3456 + 3456) = 3 * 3,542,400 = 10,627,200
  //   top 3456->1024->1024->512->256->1: 3,539,968 + 1,049,600 + 524,800
  //                                      + 131,328 + 257 = 5,245,953
  //   total 171,392 + 10,627,200 + 5,245,953 = 16,044,545 (the reference's ~16.0M MACs).
  EXPECT_EQ(m.dense_parameters(), 16044545);
  EXPECT_EQ(m.interaction.kind, InteractionKind::dcnv2);
  EXPECT_EQ(m.interaction.cross_layers, 3);
  EXPECT_EQ(m.interaction.low_rank, 512);
  EXPECT_EQ(m.bottom_mlp, (std::vector<int>{512, 256, 128}));
  EXPECT_EQ(m.top_mlp, (std::vector<int>{1024, 1024, 512, 256, 1}));
  EXPECT_EQ(m.embedding_optimizer.kind, OptimizerKind::adagrad);
  EXPECT_EQ(m.dense_optimizer.kind, OptimizerKind::adagrad);
  EXPECT_DOUBLE_EQ(m.embedding_optimizer.lr, 0.005);
  EXPECT_DOUBLE_EQ(m.dense_optimizer.lr, 0.005);
  EXPECT_DOUBLE_EQ(m.embedding_optimizer.eps, 1e-8);
  EXPECT_TRUE(m.allow_rowwise_adagrad);
  EXPECT_EQ(m.allowed_table_dtypes, (std::vector<DType>{DType::f32}));  // tables stay fp32
  EXPECT_EQ(m.max_global_batch, 65536);
  EXPECT_EQ(m.allowed_dense_math, (std::vector<DenseMath>{DenseMath::fp32, DenseMath::tf32,
                                                          DenseMath::bf16, DenseMath::fp16}));
}

TEST(ModelZoo, TinyDotDerivedQuantities) {
  const ModelSpec m = load_model_spec(model_dir() / "tiny-dot.yaml");
  EXPECT_EQ(m.interaction.kind, InteractionKind::dot);
  EXPECT_EQ(m.num_tables(), 8);
  // F = 8 tables + the bottom output = 9 vectors: 9*8/2 = 36 pairwise dots, plus
  // the 16-wide bottom output passed through.
  EXPECT_EQ(m.interaction_output_dim(), 16 + 36);
  EXPECT_EQ(m.interaction_input_dim(), 16 + 8 * 16);
  // bottom 13->64->16: 896 + 1040; top 52->64->32->1: 3392 + 2080 + 33.
  EXPECT_EQ(m.dense_parameters(), 1936 + 5505);
  // Rows 5000+2000+1000+500+3000+200+50+4000.
  EXPECT_EQ(m.embedding_rows(), 15750);
  EXPECT_EQ(m.lookups_per_example(), 1 + 2 + 1 + 3 + 4 + 1 + 2 + 3);
}

TEST(ModelZoo, TinyIsSmallAndMixed) {
  const ModelSpec m = load_model_spec(model_dir() / "tiny.yaml");
  EXPECT_EQ(m.interaction.kind, InteractionKind::dcnv2);
  // N = 144; cross 2 * (8*144 + 144*8 + 144) = 4896; bottom 1936; top 144->64->32->1 = 11393.
  EXPECT_EQ(m.dense_parameters(), 1936 + 4896 + 11393);
  int mean = 0, zipf = 0;
  for (const auto& t : m.tables) {
    EXPECT_GE(t.rows, 50);
    EXPECT_LE(t.rows, 5000);
    EXPECT_EQ(t.dim, 16);
    EXPECT_GE(t.pooling_size, 1);
    EXPECT_LE(t.pooling_size, 4);
    mean += t.pooling == Pooling::mean;
    zipf += t.distribution == IdDistribution::zipf;
  }
  EXPECT_EQ(mean, 1);
  EXPECT_EQ(zipf, 2);
  EXPECT_EQ(m.embedding_optimizer.kind, OptimizerKind::rowwise_adagrad);
  EXPECT_EQ(m.dense_optimizer.kind, OptimizerKind::adam);
}

// Each prod-*.yaml says "~<N><M|B|T> params" and "<K> GPUs" in its description;
// the parameter count must match within 15 % and the set must span ~1e8 to ~1e12.
TEST(ModelZoo, ProductionModelsSpanTheirStatedSizes) {
  const std::regex size_re(R"(~([0-9.]+)([MBT]) params)");
  const std::regex gpus_re(R"((\d+) GPUs)");
  double smallest = 1e300, largest = 0;
  int count = 0, with_1000_tables = 0;
  bool dot = false, dcnv2 = false;
  for (const auto& f : yaml_files(model_dir())) {
    if (f.filename().string().rfind("prod-", 0) != 0) continue;
    SCOPED_TRACE(f.string());
    const ModelSpec m = load_model_spec(f);
    const double params =
        static_cast<double>(m.embedding_parameters()) + static_cast<double>(m.dense_parameters());
    std::printf("  %-22s %5d tables  %.3e params  %4lld lookups/example  %s\n", m.name.c_str(),
                m.num_tables(), params, static_cast<long long>(m.lookups_per_example()),
                std::string(interaction_name(m.interaction.kind)).c_str());
    EXPECT_GE(params, 1e8);
    EXPECT_LE(params, 1.2e12);
    std::smatch match;
    ASSERT_TRUE(std::regex_search(m.description, match, size_re)) << m.description;
    const double unit = match[2] == "M" ? 1e6 : match[2] == "B" ? 1e9 : 1e12;
    const double stated = std::stod(match[1]) * unit;
    EXPECT_NEAR(params / stated, 1.0, 0.15) << "stated " << stated << ", counted " << params;
    ASSERT_TRUE(std::regex_search(m.description, match, gpus_re)) << m.description;
    const int gpus = std::stoi(match[1]);
    EXPECT_GE(gpus, 8);
    EXPECT_LE(gpus, 128);
    smallest = std::min(smallest, params);
    largest = std::max(largest, params);
    with_1000_tables += m.num_tables() >= 900;
    dot |= m.interaction.kind == InteractionKind::dot;
    dcnv2 |= m.interaction.kind == InteractionKind::dcnv2;
    ++count;
  }
  EXPECT_EQ(count, 10);
  EXPECT_LT(smallest, 5e8);
  EXPECT_GT(largest, 5e11);
  EXPECT_EQ(with_1000_tables, 1);
  EXPECT_TRUE(dot && dcnv2);
}

// ------------------------------------------------------------- parsing ----

// A valid model; the bad-input tests change one thing each. Line numbers matter.
const std::string kBase =
    "name: m\n"                                           // 1
    "dense_features: 4\n"                                 // 2
    "batch_size: 64\n"                                    // 3
    "tables:\n"                                           // 4
    "  - {name: a, rows: 10, dim: 8}\n"                   // 5
    "  - {name: b, rows: 20, dim: 8, pooling_size: 2}\n"  // 6
    "bottom_mlp: [16, 8]\n"                               // 7
    "top_mlp: [8, 1]\n"                                   // 8
    "interaction: {kind: dot}\n"                          // 9
    "optimizer:\n"                                        // 10
    "  embedding: {kind: rowwise_adagrad, lr: 0.1}\n"     // 11
    "  dense: {kind: adam, lr: 0.001}\n";                 // 12

std::string model_error(const std::string& text) {
  return input_error_of([&] { parse_model_spec(text, "bad.yaml"); });
}

TEST(ModelParse, BaseIsValidWithDefaults) {
  const ModelSpec m = parse_model_spec(kBase, "<string>");
  EXPECT_EQ(m.source_file, "<string>");
  ASSERT_EQ(m.num_tables(), 2);
  EXPECT_EQ(m.tables[0].pooling_size, 1);
  EXPECT_EQ(m.tables[0].pooling, Pooling::sum);
  EXPECT_EQ(m.tables[0].distribution, IdDistribution::uniform);
  EXPECT_EQ(m.tables[0].dtype, DType::f32);
  EXPECT_EQ(m.tables[1].pooling_size, 2);
  EXPECT_EQ(m.dense_optimizer.kind, OptimizerKind::adam);
  EXPECT_DOUBLE_EQ(m.dense_optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(m.dense_optimizer.beta2, 0.999);
  EXPECT_EQ(m.embedding_optimizer.initial_accumulator, 0.0);
  const ModelSpec held = parse_model_spec(
      replaced(kBase, "lr: 0.1}", "lr: 0.1, initial_accumulator: 0.01}"), "<string>");
  EXPECT_DOUBLE_EQ(held.embedding_optimizer.initial_accumulator, 0.01);
  // No recipe: nothing may change the numerics.
  EXPECT_FALSE(m.allow_rowwise_adagrad);
  EXPECT_EQ(m.allowed_table_dtypes, std::vector<DType>{DType::f32});
  EXPECT_EQ(m.allowed_dense_math, std::vector<DenseMath>{DenseMath::fp32});
  EXPECT_EQ(m.interaction_output_dim(), 8 + 3);
}

TEST(ModelParse, DefaultTableDtypesAreTheOnesUsed) {
  const ModelSpec m = parse_model_spec(
      replaced(kBase, "pooling_size: 2}", "pooling_size: 2, dtype: bf16}"), "x.yaml");
  EXPECT_EQ(m.allowed_table_dtypes, (std::vector<DType>{DType::f32, DType::bf16}));
}

TEST(ModelParse, CountExpandsAndTableDefaultsApply) {
  const std::string text = replaced(
      replaced(kBase, "tables:\n",
               "table_defaults: {dim: 8, pooling: mean, distribution: zipf, zipf_alpha: 1.3}\n"
               "tables:\n"),
      "  - {name: b, rows: 20, dim: 8, pooling_size: 2}\n",
      "  - {name: h, count: 3, rows: 4e3, pooling_size: 0, zipf_alpha: 1.1}\n"
      "  - {name: u, rows: 7, distribution: uniform, pooling: sum}\n");
  const ModelSpec m = parse_model_spec(text, "x.yaml");
  ASSERT_EQ(m.num_tables(), 5);
  EXPECT_EQ(m.tables[1].name, "h_0");
  EXPECT_EQ(m.tables[3].name, "h_2");
  EXPECT_EQ(m.tables[3].rows, 4000);
  EXPECT_EQ(m.tables[3].pooling_size, 0);
  EXPECT_EQ(m.tables[3].pooling, Pooling::mean);
  EXPECT_DOUBLE_EQ(m.tables[3].zipf_alpha, 1.1);
  EXPECT_DOUBLE_EQ(m.tables[0].zipf_alpha, 1.3);
  EXPECT_EQ(m.tables[4].distribution, IdDistribution::uniform);
  EXPECT_EQ(m.tables[4].pooling, Pooling::sum);
}

TEST(ModelParse, SyntaxError) {
  const std::string msg = model_error(replaced(kBase, "bottom_mlp: [16, 8]", "bottom_mlp: [16, 8"));
  // yaml-cpp reports where it noticed the problem: the next line.
  EXPECT_CONTAINS(msg, "bad.yaml:8:8: YAML syntax error: end of sequence flow not found");
}

TEST(ModelParse, DeepNestingSaysSo) {
  const std::string deep = std::string(3000, '[') + std::string(3000, ']');
  const std::string msg =
      model_error(replaced(kBase, "bottom_mlp: [16, 8]", "bottom_mlp: " + deep));
  EXPECT_CONTAINS(msg, "levels deep, deeper than the parser allows");
}

TEST(ModelParse, UnknownFieldSuggestsClosest) {
  std::string msg = model_error(replaced(kBase, "rows: 10,", "row: 10,"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg, "unknown field 'row' in 'tables[0]'");
  EXPECT_CONTAINS(msg, "did you mean 'rows'?");
  msg = model_error(replaced(kBase, "bottom_mlp:", "botom_mlp:"));
  EXPECT_CONTAINS(msg, "bad.yaml:7:1: unknown field 'botom_mlp' (did you mean 'bottom_mlp'?)");
  msg = model_error(replaced(kBase, "kind: adam,", "knd: adam,"));
  EXPECT_CONTAINS(msg, "bad.yaml:12:");
  EXPECT_CONTAINS(msg, "in 'optimizer.dense' (did you mean 'kind'?)");
  // Nothing close: the message lists what is allowed.
  msg = model_error(
      replaced(kBase, "interaction: {kind: dot}", "interaction: {kind: dot, zzzzzz: 1}"));
  EXPECT_CONTAINS(msg, "bad.yaml:9:");
  EXPECT_CONTAINS(msg, "expected one of kind, cross_layers or low_rank");
}

TEST(ModelParse, WrongNodeType) {
  std::string msg = model_error(replaced(kBase, "dense_features: 4", "dense_features: {a: 1}"));
  EXPECT_CONTAINS(msg, "bad.yaml:2:17: field 'dense_features': expected a positive integer");
  EXPECT_CONTAINS(msg, "got a map");
  msg = model_error(replaced(kBase, "bottom_mlp: [16, 8]", "bottom_mlp: 16"));
  EXPECT_CONTAINS(msg, "bad.yaml:7:13: field 'bottom_mlp': expected a list of layer sizes");
  msg = model_error(replaced(kBase, "  - {name: a, rows: 10, dim: 8}", "  - [a, 10, 8]"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:5: field 'tables[0]': expected a table map");
  EXPECT_CONTAINS(msg, "got a list");
  msg = model_error(replaced(kBase, "name: m\n", "name: [m]\n"));
  EXPECT_CONTAINS(msg, "bad.yaml:1:7: field 'name'");
  msg = model_error(replaced(kBase, "batch_size: 64", "batch_size:"));
  EXPECT_CONTAINS(msg, "field 'batch_size'");
  EXPECT_CONTAINS(msg, "got nothing");
  msg = model_error(replaced(kBase, "{name: a,", "{{x: 1}: 2, name: a,"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg, "expected a field name in 'tables[0]', got a map");
}

TEST(ModelParse, MissingField) {
  std::string msg = model_error(replaced(kBase, "bottom_mlp: [16, 8]\n", ""));
  EXPECT_CONTAINS(msg, "bad.yaml:1:1: missing field 'bottom_mlp' (expected a list of layer sizes");
  msg = model_error(replaced(kBase, ", dim: 8}", "}"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:5: missing field 'tables[0].dim'");
  msg = model_error(replaced(kBase, "{kind: adam, lr: 0.001}", "{kind: adam}"));
  EXPECT_CONTAINS(msg, "bad.yaml:12:10: missing field 'optimizer.dense.lr'");
  msg = model_error(
      replaced(kBase, "interaction: {kind: dot}", "interaction: {kind: dcnv2, cross_layers: 2}"));
  EXPECT_CONTAINS(msg, "bad.yaml:9:14: missing field 'interaction.low_rank'");
}

TEST(ModelParse, NegativeRows) {
  const std::string msg = model_error(replaced(kBase, "rows: 10", "rows: -5"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg, "field 'tables[0].rows': expected a positive integer");
  EXPECT_CONTAINS(msg, "got '-5'");
}

TEST(ModelParse, NonIntegerRows) {
  std::string msg = model_error(replaced(kBase, "rows: 20", "rows: 1.5"));
  EXPECT_CONTAINS(msg, "bad.yaml:6:");
  EXPECT_CONTAINS(msg, "field 'tables[1].rows'");
  EXPECT_CONTAINS(msg, "got '1.5'");
  msg = model_error(replaced(kBase, "rows: 20", "rows: 4611686018427387905"));  // 2^62 + 1
  EXPECT_CONTAINS(msg, "field 'tables[1].rows': expected a positive integer up to 2^62");
  msg = model_error(replaced(kBase, "rows: 20", "rows: 99999999999999999999999"));
  EXPECT_CONTAINS(msg, "field 'tables[1].rows'");
  msg = model_error(replaced(kBase, "rows: 20", "rows: twenty"));
  EXPECT_CONTAINS(msg, "got 'twenty'");
  // Whole numbers written with an exponent are fine.
  EXPECT_EQ(parse_model_spec(replaced(kBase, "rows: 20", "rows: 4.0e7"), "x").tables[1].rows,
            40000000);
}

TEST(ModelParse, ZipfWithoutAlpha) {
  const std::string msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, distribution: zipf}"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:5: missing field 'tables[0].zipf_alpha'");
  EXPECT_CONTAINS(msg, "distribution zipf needs");
}

TEST(ModelParse, AlphaWithUniform) {
  std::string msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, zipf_alpha: 1.1}"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg, "field 'tables[0].zipf_alpha': zipf_alpha is only for distribution: zipf");
  msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, distribution: zipf, zipf_alpha: 0}"));
  EXPECT_CONTAINS(msg, "field 'tables[0].zipf_alpha': expected a positive number, got '0'");
}

TEST(ModelParse, DuplicateTableNames) {
  std::string msg = model_error(replaced(kBase, "{name: b,", "{name: a,"));
  EXPECT_CONTAINS(msg, "bad.yaml:6:");
  EXPECT_CONTAINS(msg, "field 'tables[1].name': duplicate table name 'a', also tables[0]");
  // A name made by count: can collide too.
  msg = model_error(
      replaced(replaced(kBase, "{name: a,", "{name: b_1,"), "{name: b,", "{name: b, count: 2,"));
  EXPECT_CONTAINS(msg, "duplicate table name 'b_1' (made by count: 2), also tables[0]");
  // A repeated key is an error, not a silent override.
  msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, dim: 16}"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg, "duplicate field 'dim' in 'tables[0]'");
}

TEST(ModelParse, TopMlpMustEndInOne) {
  const std::string msg = model_error(replaced(kBase, "top_mlp: [8, 1]", "top_mlp: [8, 2]"));
  EXPECT_CONTAINS(msg, "bad.yaml:8:14: field 'top_mlp[1]'");
  EXPECT_CONTAINS(msg, "must have size 1");
}

TEST(ModelParse, DotDimMismatch) {
  std::string msg = model_error(replaced(kBase, "rows: 20, dim: 8", "rows: 20, dim: 16"));
  EXPECT_CONTAINS(msg,
                  "bad.yaml:9:14: field 'interaction': dot interaction needs every table dim "
                  "(tables[1] 'b' has 16) equal to the last bottom_mlp size (8)");
  msg = model_error(replaced(kBase, "{kind: dot}", "{kind: dot, cross_layers: 2}"));
  EXPECT_CONTAINS(msg, "field 'interaction.cross_layers': only dcnv2 takes cross_layers");
  // dcnv2 has no such constraint.
  EXPECT_NO_THROW(
      parse_model_spec(replaced(replaced(kBase, "rows: 20, dim: 8", "rows: 20, dim: 16"),
                                "{kind: dot}", "{kind: dcnv2, cross_layers: 1, low_rank: 4}"),
                       "x"));
}

TEST(ModelParse, OptimizerRules) {
  std::string msg = model_error(replaced(kBase, "rowwise_adagrad, lr: 0.1", "adam, lr: 0.1"));
  EXPECT_CONTAINS(msg, "bad.yaml:11:");
  EXPECT_CONTAINS(msg,
                  "field 'optimizer.embedding.kind': adam is not supported for embedding tables");
  msg = model_error(replaced(kBase, "{kind: adam,", "{kind: rowwise_adagrad,"));
  EXPECT_CONTAINS(msg,
                  "field 'optimizer.dense.kind': rowwise_adagrad applies to embedding tables only");
  msg = model_error(replaced(kBase, "lr: 0.1", "lr: 0"));
  EXPECT_CONTAINS(msg, "field 'optimizer.embedding.lr': expected a positive number, got '0'");
  msg = model_error(replaced(kBase, "lr: 0.001}", "lr: 0.001, beta2: 1.0}"));
  EXPECT_CONTAINS(msg, "field 'optimizer.dense.beta2': expected a number in [0, 1), got '1.0'");
  msg = model_error(replaced(kBase, "lr: 0.1}", "lr: 0.1, beta1: 0.9}"));
  EXPECT_CONTAINS(msg, "field 'optimizer.embedding.beta1': only adam takes beta1");
  msg = model_error(replaced(kBase, "lr: 0.001}", "lr: 0.001, weight_decay: -1}"));
  EXPECT_CONTAINS(msg, "field 'optimizer.dense.weight_decay': expected a number >= 0");
  msg = model_error(replaced(kBase, "lr: 0.001}", "lr: 0.001, initial_accumulator: 0.1}"));
  EXPECT_CONTAINS(msg,
                  "field 'optimizer.dense.initial_accumulator': only adagrad and rowwise_adagrad "
                  "take initial_accumulator (this optimizer is adam)");
  msg = model_error(replaced(kBase, "lr: 0.1}", "lr: 0.1, initial_accumulator: -0.1}"));
  EXPECT_CONTAINS(msg, "field 'optimizer.embedding.initial_accumulator': expected a number >= 0");
  msg = model_error(
      replaced(kBase, "{kind: rowwise_adagrad, lr: 0.1}", "{kind: sgd, lr: 0.1, eps: 1e-8}"));
  EXPECT_CONTAINS(msg, "field 'optimizer.embedding.eps': sgd takes no eps");
  msg = model_error(replaced(kBase, "{kind: adam,", "{kind: adamw,"));
  EXPECT_CONTAINS(msg,
                  "expected one of sgd, adagrad, rowwise_adagrad or adam, got 'adamw' (did you "
                  "mean 'adam'?)");
}

TEST(ModelParse, BadDtype) {
  std::string msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, dtype: fp8_e4m3}"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:");
  EXPECT_CONTAINS(msg,
                  "field 'tables[0].dtype': expected one of fp32, fp16 or bf16, got 'fp8_e4m3'");
  msg = model_error(replaced(kBase, "dim: 8}", "dim: 8, dtype: fp23}"));
  EXPECT_CONTAINS(msg, "got 'fp23' (did you mean 'fp32'?)");
}

TEST(ModelParse, RecipeRules) {
  const std::string with_recipe = kBase +
                                  "recipe:\n"                        // 13
                                  "  allow_rowwise_adagrad: true\n"  // 14
                                  "  table_dtypes: [fp16, bf16]\n"   // 15
                                  "  dense_math: [fp32, tf32]\n";    // 16
  std::string msg = model_error(with_recipe);
  EXPECT_CONTAINS(msg,
                  "bad.yaml:15:17: field 'recipe.table_dtypes': must include every table's own "
                  "dtype: tables[0] 'a' is fp32");
  const std::string ok = replaced(with_recipe, "[fp16, bf16]", "[fp32, bf16]");
  const ModelSpec m = parse_model_spec(ok, "x");
  EXPECT_TRUE(m.allow_rowwise_adagrad);
  EXPECT_EQ(m.allowed_table_dtypes, (std::vector<DType>{DType::f32, DType::bf16}));
  EXPECT_EQ(m.allowed_dense_math, (std::vector<DenseMath>{DenseMath::fp32, DenseMath::tf32}));
  msg = model_error(replaced(ok, "[fp32, tf32]", "[fp32, fp32]"));
  EXPECT_CONTAINS(msg, "bad.yaml:16:");
  EXPECT_CONTAINS(msg, "field 'recipe.dense_math[1]': 'fp32' is listed twice");
  msg = model_error(replaced(ok, "[fp32, tf32]", "[fp32, fp8]"));
  EXPECT_CONTAINS(msg, "field 'recipe.dense_math[1]': expected one of fp32, tf32, bf16 or fp16");
  msg = model_error(replaced(ok, "allow_rowwise_adagrad: true", "allow_rowwise_adagrad: maybe"));
  EXPECT_CONTAINS(msg, "bad.yaml:14:");
  EXPECT_CONTAINS(msg, "expected true or false, got 'maybe'");
  msg = model_error(replaced(ok, "[fp32, tf32]", "[]"));
  EXPECT_CONTAINS(msg, "field 'recipe.dense_math': expected a non-empty list");
}

TEST(ModelParse, DocumentShape) {
  EXPECT_CONTAINS(model_error(""), "bad.yaml: the model spec is empty");
  EXPECT_CONTAINS(model_error("# only a comment\n"), "bad.yaml: the model spec is empty");
  EXPECT_CONTAINS(model_error("- a\n- b\n"), "bad.yaml:1:1: expected a map of model spec fields");
  EXPECT_CONTAINS(model_error(kBase + "---\nname: n\n"),
                  "bad.yaml:14:1: expected one YAML document");
  // A ',' where a document starts (yaml-cpp 0.7's LoadAll never returns on it).
  EXPECT_CONTAINS(model_error(",\n"), "bad.yaml:1:1: expected one YAML document");
  EXPECT_CONTAINS(model_error(kBase + "...\n, x\n"), "expected one YAML document");
  EXPECT_CONTAINS(model_error(replaced(kBase,
                                       "tables:\n  - {name: a, rows: 10, dim: 8}\n"
                                       "  - {name: b, rows: 20, dim: 8, pooling_size: 2}\n",
                                       "tables: []\n")),
                  "bad.yaml:4:9: field 'tables': expected at least one table");
  EXPECT_CONTAINS(model_error(replaced(kBase, "name: m", "name: my model")),
                  "field 'name': expected a model name made of letters");
}

TEST(ModelParse, TotalsThatWouldOverflowAreRejected) {
  // Two tables of 2^62 rows each: the total does not fit.
  std::string msg = model_error(replaced(replaced(kBase, "rows: 10", "rows: 4611686018427387904"),
                                         "rows: 20", "rows: 4611686018427387904"));
  EXPECT_CONTAINS(msg, "bad.yaml:5:3: field 'tables': the tables hold more than 2^62 rows");
  // 2^61 rows at dim 8: the rows fit, the parameters do not.
  msg = model_error(replaced(kBase, "rows: 10", "rows: 2305843009213693952"));
  EXPECT_CONTAINS(msg, "more than 2^62 parameters");
  // Dot over 100000 tables has ~5e9 outputs.
  msg = model_error(replaced(kBase, "{name: b, rows: 20,", "{name: b, count: 99999, rows: 20,"));
  EXPECT_CONTAINS(msg, "dot interaction over 100000 tables has more than 2147483647 outputs");
}

TEST(ModelLoad, MissingFile) {
  const std::string msg = input_error_of([] { load_model_spec("/nonexistent/dir/model.yaml"); });
  EXPECT_EQ(msg, "cannot read model spec '/nonexistent/dir/model.yaml': no such file");
  EXPECT_CONTAINS(input_error_of([] { load_model_spec(model_dir()); }), "it is a directory");
}

TEST(ModelLoad, ErrorsNameTheFilePath) {
  const auto path = std::filesystem::temp_directory_path() / "parity_test_bad_model.yaml";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text = replaced(kBase, "rows: 10", "rows: -5");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  const std::string msg = input_error_of([&] { load_model_spec(path); });
  std::filesystem::remove(path);
  EXPECT_CONTAINS(msg, path.string() + ":5:");
  EXPECT_CONTAINS(msg, "field 'tables[0].rows'");
}

// Never crash: every mutation of every zoo file either parses or throws InputError.
TEST(ModelParse, MutatedZooFilesNeverCrash) {
  const std::vector<std::string> replacements = {
      "", "{a: 1}", "[1, [2]]", "-1", "1e400", "\"\"", "~", "&x [*x]", "!!binary AAAA", "{"};
  int parsed = 0, rejected = 0;
  for (const auto& f : yaml_files(model_dir())) {
    if (f.filename() == "prod-many-features.yaml" || f.filename() == "prod-trillion.yaml") continue;
    const std::string text = spec_yaml::read_text_file(f, "model");
    // Each line: dropped, or its value replaced by something of another shape.
    std::size_t start = 0;
    while (start < text.size()) {
      const std::size_t end = text.find('\n', start);
      const std::size_t stop = end == std::string::npos ? text.size() : end + 1;
      const std::string line = text.substr(start, stop - start);
      std::vector<std::string> variants = {text.substr(0, start) + text.substr(stop),
                                           text.substr(0, start + (stop - start) / 2)};
      const std::size_t colon = line.find(": ");
      if (colon != std::string::npos)
        for (const auto& r : replacements)
          variants.push_back(text.substr(0, start) + line.substr(0, colon + 2) + r + "\n" +
                             text.substr(stop));
      for (const auto& v : variants) {
        try {
          parse_model_spec(v, f.filename().string());
          ++parsed;
        } catch (const InputError& e) {
          ++rejected;
          EXPECT_EQ(std::string(e.what()).rfind(f.filename().string(), 0), 0u) << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "non-InputError exception: " << e.what() << "\nfor text:\n" << v;
        }
      }
      start = stop;
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_GT(parsed, 0);
}

// ------------------------------------------------------------- names ----

TEST(ModelNames, EnumNames) {
  EXPECT_EQ(pooling_name(Pooling::mean), "mean");
  EXPECT_EQ(distribution_name(IdDistribution::zipf), "zipf");
  EXPECT_EQ(interaction_name(InteractionKind::dcnv2), "dcnv2");
  EXPECT_EQ(optimizer_name(OptimizerKind::rowwise_adagrad), "rowwise_adagrad");
  EXPECT_EQ(dense_math_name(DenseMath::tf32), "tf32");
}

TEST(YamlUtil, EditDistanceAndSuggestions) {
  EXPECT_EQ(spec_yaml::edit_distance("hbm_byte", "hbm_bytes"), 1u);
  EXPECT_EQ(spec_yaml::edit_distance("tabels", "tables"), 1u);  // a transposition is one edit
  EXPECT_EQ(spec_yaml::edit_distance("", "abc"), 3u);
  const std::vector<std::string_view> keys = {"hbm_bytes", "hbm_bandwidth", "l2_bytes"};
  EXPECT_EQ(spec_yaml::closest_match("hbm_byte", keys), "hbm_bytes");
  EXPECT_EQ(spec_yaml::closest_match("HBM_Bandwidth", keys), "hbm_bandwidth");
  EXPECT_FALSE(spec_yaml::closest_match("color", keys).has_value());
  EXPECT_EQ(spec_yaml::closest_match("dimension", {"rows", "dim"}), "dim");
  EXPECT_EQ(spec_yaml::closest_match("l2", keys), std::nullopt);
}

}  // namespace
}  // namespace parity

namespace parity {
namespace {

TEST(ModelParse, MaxGlobalBatch) {
  EXPECT_EQ(parse_model_spec(kBase, "x.yaml").max_global_batch, 64);  // default: batch_size
  const std::string with = std::string(kBase) + "recipe: {max_global_batch: 256}\n";
  EXPECT_EQ(parse_model_spec(with, "x.yaml").max_global_batch, 256);
  const std::string msg = model_error(std::string(kBase) + "recipe: {max_global_batch: 32}\n");
  EXPECT_CONTAINS(msg, "bad.yaml:13:");
  EXPECT_CONTAINS(msg, "field 'recipe.max_global_batch': expected an integer >= batch_size (64)");
}

TEST(ModelParse, MinGlobalBatch) {
  EXPECT_EQ(parse_model_spec(kBase, "x.yaml").min_global_batch, 64);  // default: batch_size
  const std::string with = std::string(kBase) + "recipe: {min_global_batch: 16}\n";
  EXPECT_EQ(parse_model_spec(with, "x.yaml").min_global_batch, 16);
  for (const char* bad : {"128", "0"}) {
    const std::string msg =
        model_error(std::string(kBase) + "recipe: {min_global_batch: " + bad + "}\n");
    EXPECT_CONTAINS(msg, "bad.yaml:13:");
    EXPECT_CONTAINS(
        msg, "field 'recipe.min_global_batch': expected an integer from 1 to batch_size (64)");
  }
}

TEST(ModelParse, LearningRateRules) {
  const ModelSpec plain = parse_model_spec(kBase, "x.yaml");
  EXPECT_EQ(plain.lr_scaling, LrScaling::linear);
  EXPECT_EQ(plain.lr_warmup_steps, 0);
  const ModelSpec sq = parse_model_spec(
      std::string(kBase) +
          "recipe: {max_global_batch: 256, lr_scaling: sqrt, lr_warmup_steps: 40}\n",
      "x.yaml");
  EXPECT_EQ(sq.lr_scaling, LrScaling::sqrt);
  EXPECT_EQ(sq.lr_warmup_steps, 40);
  std::string msg = model_error(std::string(kBase) + "recipe: {lr_scaling: cubic}\n");
  EXPECT_CONTAINS(msg, "bad.yaml:13:");
  EXPECT_CONTAINS(msg, "recipe.lr_scaling");
  EXPECT_CONTAINS(msg, "linear");
  msg = model_error(std::string(kBase) + "recipe: {lr_warmup_steps: -1}\n");
  EXPECT_CONTAINS(msg,
                  "field 'recipe.lr_warmup_steps': expected a number of steps, an integer >= 0");
}

TEST(ModelSpec, WithBatchScalesByTheRuleAndRefusesNonPositiveBatches) {
  ModelSpec m = parse_model_spec(kBase, "x.yaml");  // batch_size 64
  const ModelSpec four = with_batch(m, 256);
  EXPECT_EQ(four.batch_size, 256);
  EXPECT_DOUBLE_EQ(four.embedding_optimizer.lr, m.embedding_optimizer.lr * 4);
  EXPECT_DOUBLE_EQ(four.lr_batch_scale, 4.0);
  m.lr_scaling = LrScaling::sqrt;
  EXPECT_DOUBLE_EQ(with_batch(m, 256).dense_optimizer.lr, m.dense_optimizer.lr * 2);
  EXPECT_DOUBLE_EQ(with_batch(m, 16).lr_batch_scale, 0.5);
  EXPECT_THROW(with_batch(m, 0), InputError);
  m.batch_size = 0;
  EXPECT_THROW(with_batch(m, 64), InputError);
}

TEST(ModelSpec, WarmUpRampsFromTheReferenceRates) {
  ModelSpec m = parse_model_spec(kBase, "x.yaml");
  m.lr_warmup_steps = 10;
  EXPECT_EQ(m.lr_factor(0), 1.0);  // no batch change: no warm-up
  m.lr_batch_scale = 4.0;
  EXPECT_DOUBLE_EQ(m.lr_factor(0), 0.25);
  EXPECT_DOUBLE_EQ(m.lr_factor(5), 0.25 + 0.75 * 0.5);
  EXPECT_DOUBLE_EQ(m.lr_factor(10), 1.0);
  EXPECT_DOUBLE_EQ(m.lr_factor(1000), 1.0);
  m.lr_warmup_steps = 0;
  EXPECT_EQ(m.lr_factor(0), 1.0);
  m.lr_warmup_steps = 10;
  m.lr_batch_scale = 0.5;  // a smaller batch: the lower rates at once
  EXPECT_EQ(m.lr_factor(0), 1.0);
}

// ------------------------------------------------------------------ hstu ----

constexpr const char* kHstu =
    "name: seq\n"                                               // 1
    "kind: hstu\n"                                              // 2
    "batch_size: 32\n"                                          // 3
    "sequence:\n"                                               // 4
    "  max_len: 100\n"                                          // 5
    "  targets: 3\n"                                            // 6
    "  features:\n"                                             // 7
    "    - {name: item, rows: 500, dim: 16}\n"                  // 8
    "    - {name: action, rows: 4, dim: 16}\n"                  // 9
    "context:\n"                                                // 10
    "  - {name: country, rows: 9, dim: 16, pooling_size: 2}\n"  // 11
    "hstu: {model_dim: 16, layers: 2, heads: 2, attention_dim: 8, value_dim: 4, "
    "position_buckets: 10, time_buckets: 6}\n"         // 12
    "tasks: [click, like]\n"                           // 13
    "optimizer:\n"                                     // 14
    "  embedding: {kind: rowwise_adagrad, lr: 0.1}\n"  // 15
    "  dense: {kind: adam, lr: 0.001}\n";              // 16

TEST(HstuParse, FieldsAndDerivedQuantities) {
  const ModelSpec m = parse_model_spec(kHstu, "seq.yaml");
  EXPECT_EQ(m.kind, ModelKind::hstu);
  ASSERT_TRUE(m.hstu.has_value());
  const HstuSpec& h = *m.hstu;
  EXPECT_EQ(h.sequence.max_len, 100);
  EXPECT_EQ(h.sequence.min_len, 1);
  EXPECT_EQ(h.sequence.targets, 3);
  EXPECT_EQ(h.sequence.lengths, LengthDistribution::uniform);
  EXPECT_EQ(h.sequence.combine, EventCombine::sum);
  ASSERT_EQ(h.sequence.features.size(), 2u);
  EXPECT_EQ(h.sequence.features[0].name, "item");
  EXPECT_EQ(h.sequence.features[1].pooling_size, 1);
  ASSERT_EQ(m.tables.size(), 1u);  // the contextual feature
  EXPECT_EQ(m.tables[0].pooling_size, 2);
  EXPECT_EQ(h.tasks, (std::vector<std::string>{"click", "like"}));
  EXPECT_EQ(m.dense_features, 0);
  EXPECT_TRUE(m.bottom_mlp.empty());
  EXPECT_EQ(m.embedding_parameters(), (500 + 4 + 9) * 16);
  EXPECT_EQ(m.lookups_per_example(), 2 + 2 * (100 + 3));
  // Per layer: LayerNorm 2d, projection d x h(2v + 2a) + its bias, LayerNorm of AV 2hv, output
  // h v x d + d, relative bias (10 + 6) x h; then 2 tasks x (d + 1).
  const std::int64_t d = 16, uvqk = 2 * (2 * 4 + 2 * 8);
  const std::int64_t layer = 2 * d + d * uvqk + uvqk + 2 * 2 * 4 + 2 * 4 * d + d + 16 * 2;
  EXPECT_EQ(m.dense_parameters(), 2 * layer + 2 * (d + 1));
  // The tables' dtypes are the recipe's by default.
  EXPECT_EQ(m.allowed_table_dtypes, (std::vector<DType>{DType::f32}));
}

TEST(HstuParse, BadFieldsAreNamed) {
  const auto err = [](const std::string& from, const std::string& to) {
    return model_error(replaced(kHstu, from, to));
  };
  EXPECT_CONTAINS(err("batch_size: 32\n", "batch_size: 32\nbottom_mlp: [4]\n"),
                  "field 'bottom_mlp': bottom_mlp is a field of dlrm models; this model is kind: "
                  "hstu");
  EXPECT_CONTAINS(model_error(replaced(kBase, "top_mlp:", "tasks: [a]\ntop_mlp:")),
                  "field 'tasks': tasks is a field of hstu models; this model is kind: dlrm");
  EXPECT_CONTAINS(err("kind: hstu", "kind: transformer"), "field 'kind'");
  EXPECT_CONTAINS(err("  max_len: 100\n", ""), "missing field 'sequence.max_len'");
  EXPECT_CONTAINS(err("  targets: 3\n", "  targets: 3\n  min_len: 101\n"),
                  "field 'sequence.min_len': expected an integer from 1 to max_len (100)");
  EXPECT_CONTAINS(err("  targets: 3\n", "  targets: 3\n  length_alpha: 1.5\n"),
                  "length_alpha is only for lengths: power_law");
  EXPECT_CONTAINS(err("  targets: 3\n", "  targets: 3\n  lengths: power_law\n"),
                  "missing field 'sequence.length_alpha'");
  EXPECT_CONTAINS(err("{name: action, rows: 4, dim: 16}", "{name: action, rows: 4, dim: 8}"),
                  "combine: sum needs every feature dim equal to hstu.model_dim (16): 'action' "
                  "has 8");
  EXPECT_CONTAINS(err("  features:\n", "  combine: concat\n  features:\n"),
                  "combine: concat needs the feature dims to add up to hstu.model_dim (16), they "
                  "add up to 32");
  EXPECT_CONTAINS(err("{name: item, rows: 500, dim: 16}",
                      "{name: item, rows: 500, dim: 16, "
                      "pooling_size: 3}"),
                  "field 'sequence.features[0].pooling_size': a sequence feature is looked up "
                  "once per event and takes no pooling_size");
  EXPECT_CONTAINS(err("{name: country, rows: 9, dim: 16,", "{name: country, rows: 9, dim: 32,"),
                  "a contextual feature is one token: its dim must be hstu.model_dim (16), "
                  "'country' has 32");
  EXPECT_CONTAINS(err("{name: country,", "{name: item,"), "duplicate table name 'item'");
  EXPECT_CONTAINS(err("heads: 2,", "heads: 0,"), "field 'hstu.heads'");
  EXPECT_CONTAINS(err("layers: 2,", "layers: 2, dropout: 1.0,"),
                  "field 'hstu.dropout': expected a number in [0, 1)");
  EXPECT_CONTAINS(err("hstu: {model_dim: 16,", "hstu: {model_dim: 16, low_rank: 3,"),
                  "unknown field 'low_rank' in 'hstu'");
  EXPECT_CONTAINS(err("tasks: [click, like]", "tasks: [click, click]"), "listed twice");
  EXPECT_CONTAINS(err("tasks: [click, like]\n", ""), "missing field 'tasks'");
}

TEST(HstuParse, TheRestOfTheSystemRefusesItByName) {
  const ModelSpec m = parse_model_spec(kHstu, "seq.yaml");
  const std::string msg = input_error_of([&] { require_dlrm(m, "the planner"); });
  EXPECT_CONTAINS(msg,
                  "seq.yaml: model 'seq' is an hstu model (kind: hstu); the planner handles "
                  "DLRM models only so far");
  EXPECT_NO_THROW(require_dlrm(parse_model_spec(kBase, "base.yaml"), "the planner"));
}

TEST(ModelZoo, HstuModelsSpanTheProductionRange) {
  int lo_len = INT_MAX, hi_len = 0, lo_d = INT_MAX, hi_d = 0, lo_layers = INT_MAX, hi_layers = 0;
  std::int64_t biggest = 0;
  int n = 0;
  for (const auto& f : yaml_files(model_dir())) {
    const ModelSpec m = load_model_spec(f);
    if (m.kind != ModelKind::hstu || m.name == "hstu-tiny") continue;
    ++n;
    const HstuSpec& h = *m.hstu;
    lo_len = std::min(lo_len, h.sequence.max_len);
    hi_len = std::max(hi_len, h.sequence.max_len);
    lo_d = std::min(lo_d, h.model_dim);
    hi_d = std::max(hi_d, h.model_dim);
    lo_layers = std::min(lo_layers, h.layers);
    hi_layers = std::max(hi_layers, h.layers);
    for (const auto& t : h.sequence.features) biggest = std::max(biggest, t.rows);
  }
  EXPECT_GE(n, 4);
  EXPECT_LE(lo_len, 1024);
  EXPECT_GE(hi_len, 8192);
  EXPECT_LE(lo_d, 256);
  EXPECT_GE(hi_d, 1024);
  EXPECT_LE(lo_layers, 3);
  EXPECT_GE(hi_layers, 8);
  EXPECT_GE(biggest, 1000000000);
  const ModelSpec tiny = load_model_spec(model_dir() / "hstu-tiny.yaml");
  EXPECT_LE(tiny.hstu->sequence.max_len, 64);
}

// The seed-like zoo (seed-*.yaml) spans the study's range: DLRM and HSTU models, 100M to 1T
// parameters (embedding and dense), 8 to 128 GPUs, histories of 512 to 8,192 events; each file
// says what binds it, and each recipe that allows a larger batch names its learning-rate rule.
TEST(ModelZoo, SeedZooSpansTheStudysRange) {
  int n = 0, hstu = 0, lo_gpus = INT_MAX, hi_gpus = 0, lo_len = INT_MAX, hi_len = 0;
  double lo_params = 1e300, hi_params = 0;
  for (const auto& f : yaml_files(model_dir())) {
    if (f.filename().string().rfind("seed-", 0) != 0) continue;
    SCOPED_TRACE(f.string());
    const ModelSpec m = load_model_spec(f);
    ++n;
    std::ifstream in(f);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("What binds it"), std::string::npos) << "its comment says what binds it";
    lo_gpus = std::min(lo_gpus, m.gpus);
    hi_gpus = std::max(hi_gpus, m.gpus);
    double params = static_cast<double>(m.embedding_parameters());
    if (m.kind == ModelKind::hstu) {
      ++hstu;
      lo_len = std::min(lo_len, m.hstu->sequence.max_len);
      hi_len = std::max(hi_len, m.hstu->sequence.max_len);
    } else {
      params += static_cast<double>(m.dense_parameters());
    }
    lo_params = std::min(lo_params, params);
    hi_params = std::max(hi_params, params);
    if (m.max_global_batch > m.batch_size) {
      EXPECT_EQ(m.lr_scaling, LrScaling::sqrt);
    }
  }
  EXPECT_EQ(n, 10);
  EXPECT_GE(hstu, 3);
  EXPECT_LE(n - hstu, 7);
  EXPECT_EQ(lo_gpus, 8);
  EXPECT_EQ(hi_gpus, 128);
  EXPECT_LE(lo_len, 512);
  EXPECT_GE(hi_len, 8192);
  EXPECT_LE(lo_params, 2e8);
  EXPECT_GE(lo_params, 1e8);
  EXPECT_GE(hi_params, 1e12);
}

}  // namespace
}  // namespace parity
