// Checkpoints in the safetensors format (an 8-byte little-endian header size, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw bytes), so
// that other tools can read the weights. Writes are atomic: a temporary file in the
// same directory, fsync, rename over the target, fsync of the directory. A crash at
// any point leaves either the old checkpoint or the new one, never a torn file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/engine.h"

namespace parity {

struct SafetensorsEntry {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // file offset of the data section (8 + header size)
};

// Writes every tensor (read from backend memory in chunks) and the metadata, atomically.
void save_safetensors(const std::filesystem::path& file, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata, Backend& backend);

// Reads and validates the header: sizes, offsets within the file, dtypes, shapes that
// match byte ranges. Throws InputError naming the file and the problem.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& file);

// Loads every tensor of `into` (matched by name; dtype and shape must agree) into backend
// memory. Tensors in the file but not in `into` are an error unless allow_extra. Returns the
// metadata.
std::map<std::string, std::string> load_safetensors(const std::filesystem::path& file,
                                                    const std::vector<TensorRef>& into,
                                                    Backend& backend, bool allow_extra = false);

// Checkpoint directory management: files are DIR/step-<N>.safetensors.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t step);
// Steps of the checkpoints present in dir, ascending (ignores temporaries and other files).
std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints.
void prune_checkpoints(const std::filesystem::path& dir, int keep);

}  // namespace parity
