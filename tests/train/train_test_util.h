// Helpers of the training tests: the tiny model, scratch directories, the bytes of a checkpoint's
// tensors, and an observer that keeps every event.
#pragma once

#include <unistd.h>
#include <cstdint>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parity/checkpoint.h"
#include "parity/spec.h"
#include "parity/train.h"

namespace parity::test {

// The zoo's tiny model, as its file says.
inline ModelSpec tiny() {
  return load_model_spec(std::filesystem::path(PARITY_SOURCE_DIR) / "configs/models/tiny.yaml");
}

// A short run of the tiny model (batch 64, seed 3) with a checkpoint every 10 steps into `dir`.
inline TrainConfig small_run(const std::filesystem::path& dir, std::int64_t steps) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.batch = 64;
  cfg.steps = steps;
  cfg.eval_examples = 256;
  cfg.seed = 3;
  cfg.checkpoint_dir = dir;
  cfg.checkpoint_every = 10;
  return cfg;
}

// An empty path in the temporary directory (whatever an earlier run left there removed), named
// for this process too, so that two test runs on one machine never share it.
inline std::filesystem::path temp_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                  ("parity-train-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d;
}

// Every tensor of a safetensors file, as bytes, in name order.
inline std::vector<std::vector<char>> tensor_bytes(const std::filesystem::path& file) {
  const SafetensorsHeader h = read_safetensors_header(file);
  std::ifstream in(file, std::ios::binary);
  std::vector<std::vector<char>> out;
  for (const auto& [name, e] : h.tensors) {
    std::vector<char> v(e.end - e.begin);
    in.seekg(static_cast<std::streamoff>(h.data_offset + e.begin));
    in.read(v.data(), static_cast<std::streamsize>(v.size()));
    out.push_back(std::move(v));
  }
  return out;
}

// Every event of a run, in order.
struct Events : TrainObserver {
  std::vector<TrainEvent> all;
  void on_event(const TrainEvent& e) override { all.push_back(e); }
  std::vector<double> losses() const {
    std::vector<double> v;
    for (const auto& e : all)
      if (e.kind == TrainEvent::Kind::progress) v.push_back(e.loss);
    return v;
  }
  std::vector<std::int64_t> steps_of(TrainEvent::Kind kind) const {
    std::vector<std::int64_t> v;
    for (const auto& e : all)
      if (e.kind == kind) v.push_back(e.step);
    return v;
  }
  std::vector<std::string> warnings() const {
    std::vector<std::string> v;
    for (const auto& e : all)
      if (e.kind == TrainEvent::Kind::warning) v.push_back(e.message);
    return v;
  }
  std::string warning_text() const {
    std::string text;
    for (const auto& w : warnings()) text += w + "\n";
    return text;
  }
};

}  // namespace parity::test
