// Checkpoints in the safetensors format (an 8-byte little-endian header size, a JSON
// header naming each tensor's dtype, shape and byte range, then the raw bytes), so
// that other tools can read the weights. Writes are atomic: a temporary file in the
// same directory, fsync, rename over the target, fsync of the directory. A crash at
// any point leaves either the old checkpoint or the new one, never a torn file.
//
// Every file parity writes carries checksums in its metadata (strings, as safetensors requires):
// "crc32c.<tensor>" for each tensor's bytes and "header_crc32c" for the header itself (computed
// with its own value written as "crc32c:00000000"). Readers verify each one present, so a flipped
// bit or a torn block anywhere in a checkpoint is found when it is loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parity/backend.h"
#include "parity/engine.h"
#include "parity/error.h"

namespace parity {

// A checkpoint whose bytes are not what was written (a checksum differs, the file is truncated)
// or whose values cannot be trained from (NaN or infinite): an older checkpoint may still be good.
class CheckpointCorrupt : public InputError {
 public:
  using InputError::InputError;
};

// What the values of floating-point tensors may be: anything, or finite only (a NaN or an
// infinity is refused, naming the tensor).
enum class TensorValues { any, finite };

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

// Writes every tensor (read from backend memory in chunks), the metadata and the checksums,
// atomically. With TensorValues::finite a NaN or an infinity in a floating-point tensor throws
// NumericalError naming the tensor, and the file is not written (what was at its path stays).
void save_safetensors(const std::filesystem::path& file, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata, Backend& backend,
                      TensorValues values = TensorValues::any);

// Reads and validates the header: sizes, offsets within the file, dtypes, shapes that
// match byte ranges, the header checksum where there is one. Throws InputError naming the file
// and the problem (CheckpointCorrupt where the checksum or the size says the file is damaged).
SafetensorsHeader read_safetensors_header(const std::filesystem::path& file);

// Loads every tensor of `into` (matched by name; dtype and shape must agree) into backend
// memory, verifying each tensor's checksum where the file has one. Tensors in the file but not in
// `into` are an error unless allow_extra. Returns the metadata. Names, dtypes and shapes are
// checked before anything is loaded; a checksum (or, with TensorValues::finite, a value) is known
// only once a tensor is read, so after a CheckpointCorrupt the tensors read before the bad one
// are loaded: load another checkpoint over them.
std::map<std::string, std::string> load_safetensors(const std::filesystem::path& file,
                                                    const std::vector<TensorRef>& into,
                                                    Backend& backend, bool allow_extra = false,
                                                    TensorValues values = TensorValues::any);

// ------------------------------------------------------------- sharded checkpoints --
// A run over several processes writes each checkpoint as a set: the directory DIR/step-<N>/ with
// one safetensors file per rank (rank-<r>-of-<W>.safetensors: the pieces that rank holds,
// checksummed as above) and index.json, which names every tensor of the model with its dtype and
// global shape and where each of its pieces lies (file, tensor, rows, columns), and carries each
// file's header checksum, so that a file of another set is found. The set is written in
// DIR/.step-<N>.partial and renamed into place once every file in it is synced: a crash at any
// point leaves the sets that were complete before it. Pieces are matched to what a loading rank
// holds by their global coordinates, so a set written by N ranks loads on M ranks under any
// sharding, or on one process, exactly; a single-file checkpoint loads the same way (its tensors
// are whole pieces). The ranks share the checkpoint directory (one host, or a shared file system).

// The tensors and pieces are engine.h's CheckpointTensor, CheckpointPiece and CheckpointLayout.

// A layout of whole tensors, every piece written: one process's.
CheckpointLayout whole_tensor_layout(const std::vector<TensorRef>& tensors);

class Communicator;

// Writes this rank's pieces (those with write set) and, on rank 0, the index, as the set
// checkpoint_set_path(dir, step); every rank of `comm` calls it. The metadata goes into the index
// and every file. With TensorValues::finite a NaN or an infinity on any rank throws NumericalError
// on every rank (naming the tensor on the rank that has it) and no set is written. A set already
// at that path is replaced. Returns the set's path.
std::filesystem::path save_checkpoint_set(const std::filesystem::path& dir, std::int64_t step,
                                          const CheckpointLayout& layout,
                                          const std::map<std::string, std::string>& metadata,
                                          Communicator& comm, Backend& backend,
                                          TensorValues values = TensorValues::any);

// Loads a checkpoint, a single safetensors file or a set, into the layout's pieces. The model's
// tensors and the checkpoint's must agree (names, dtypes, shapes; a tensor the model lacks is an
// error unless allow_extra) and the pieces written must cover each tensor once; each piece read
// is verified by its checksum. Throws InputError naming the file and the problem
// (CheckpointCorrupt where bytes are damaged or a file of the set is missing or of another set).
// Returns the metadata. load_safetensors is this on whole tensors.
std::map<std::string, std::string> load_checkpoint(const std::filesystem::path& path,
                                                   const CheckpointLayout& layout, Backend& backend,
                                                   TensorValues values = TensorValues::any,
                                                   bool allow_extra = false);
// The metadata of a checkpoint, a file or a set (the set's index verified).
std::map<std::string, std::string> read_checkpoint_metadata(const std::filesystem::path& path);

// ------------------------------------------------------------- checkpoint directories --
// A directory holds DIR/step-<N>.safetensors (one process) or DIR/step-<N>/ (a set).
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t step);
std::filesystem::path checkpoint_set_path(const std::filesystem::path& dir, std::int64_t step);
// The checkpoint of that step present in dir: its set if there is one, else its file.
std::filesystem::path find_checkpoint(const std::filesystem::path& dir, std::int64_t step);
// Steps of the checkpoints (files and sets) present in dir, ascending (ignores temporaries, sets
// still being written and other files).
std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints (keep >= 1), and what a crash left of sets being
// written (call it when no set is being written to dir).
void prune_checkpoints(const std::filesystem::path& dir, int keep);
// Renames a checkpoint (file or set) found corrupt to PATH.corrupt (kept for inspection;
// list_checkpoints and prune_checkpoints no longer see it). Returns the new path.
std::filesystem::path set_aside_checkpoint(const std::filesystem::path& file);

// Holds a checkpoint directory for one run: DIR/.parity-lock under an exclusive flock, which the
// kernel releases when the process ends however it ends (kill -9 too), with the holder's pid in
// it. Creates the directory. Throws InputError naming the directory and the reason when it is not
// a directory, cannot be created or written, or another run holds it (with that run's pid).
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::filesystem::path& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace parity
