// Helpers of the training tests: scratch directories and the bytes of a checkpoint's tensors.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parity/checkpoint.h"

namespace parity::test {

// An empty path in the temporary directory (whatever an earlier run left there removed).
inline std::filesystem::path temp_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / ("parity-train-" + name);
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

}  // namespace parity::test
