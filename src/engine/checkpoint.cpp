// safetensors writer and reader. Tensors are streamed through a bounded host
// buffer so that a checkpoint of a 100 GB table set needs no 100 GB of host memory,
// and every read is bounds-checked against the file so that a truncated or corrupt
// checkpoint gives a message, not a crash.
#include "parity/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/atomic_file.h"
#include "parity/error.h"

namespace parity {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kChunk = std::size_t{64} << 20;           // host staging buffer
constexpr std::uint64_t kMaxHeader = std::uint64_t{100} << 20;  // safetensors' own limit

std::string sys_error() {
  return std::strerror(errno);
}

}  // namespace

void save_safetensors(const fs::path& file, const std::vector<TensorRef>& tensors,
                      const std::map<std::string, std::string>& metadata, Backend& backend) {
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name))
      throw Error(fmt::format("save_safetensors: duplicate tensor '{}'", t.name));
    header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {off, off + t.bytes()}}};
    off += t.bytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section to 8 bytes

  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(
        fmt::format("cannot create checkpoint directory '{}': {}", dir.string(), ec.message()));
  AtomicFile out(file, "checkpoint");
  std::uint8_t len[8];
  const std::uint64_t hs = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(hs >> (8 * i));
  out.write(len, 8);
  out.write(h.data(), h.size());
  std::vector<char> stage(std::min<std::size_t>(kChunk, std::max<std::uint64_t>(off, 1)));
  for (const auto& t : tensors) {
    const std::size_t total = t.bytes();
    for (std::size_t done = 0; done < total;) {
      const std::size_t n = std::min(stage.size(), total - done);
      backend.copy_to_host(stage.data(), static_cast<const char*>(t.data) + done, n);
      out.write(stage.data(), n);
      done += n;
    }
  }
  out.commit();
}

SafetensorsHeader read_safetensors_header(const fs::path& file) {
  const std::string where = fmt::format("checkpoint '{}'", file.string());
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read {}: {}", where, sys_error()));
  std::error_code ec;
  const std::uint64_t file_size = fs::file_size(file, ec);
  if (ec) throw InputError(fmt::format("cannot read {}: {}", where, ec.message()));
  std::uint8_t len[8];
  if (!in.read(reinterpret_cast<char*>(len), 8))
    throw InputError(
        fmt::format("{}: file is {} bytes, too short for a safetensors header", where, file_size));
  std::uint64_t hs = 0;
  for (int i = 0; i < 8; ++i) hs |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (hs > kMaxHeader || hs + 8 > file_size)
    throw InputError(fmt::format(
        "{}: header size {} does not fit the file ({} bytes); the file is truncated or not "
        "safetensors",
        where, hs, file_size));
  std::string h(hs, '\0');
  if (!in.read(h.data(), static_cast<std::streamsize>(hs)))
    throw InputError(fmt::format("{}: cannot read the {}-byte header", where, hs));
  nlohmann::json j = nlohmann::json::parse(h, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw InputError(fmt::format("{}: header is not a JSON object; the file is corrupt", where));

  SafetensorsHeader out;
  out.data_offset = 8 + hs;
  const std::uint64_t data_size = file_size - out.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        throw InputError(fmt::format("{}: __metadata__ is not an object", where));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          throw InputError(fmt::format("{}: metadata '{}' is not a string", where, m.key()));
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tw = fmt::format("{}: tensor '{}'", where, it.key());
    const auto& v = *it;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      throw InputError(
          fmt::format("{}: expected {{dtype, shape, data_offsets: [begin, end]}}", tw));
    SafetensorsEntry e;
    const auto dt = parse_safetensors_dtype(v["dtype"].get<std::string>());
    if (!dt)
      throw InputError(fmt::format("{}: unknown dtype '{}'", tw, v["dtype"].get<std::string>()));
    e.dtype = *dt;
    std::uint64_t elems = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        throw InputError(fmt::format("{}: shape must hold non-negative integers", tw));
      e.shape.push_back(d.get<std::int64_t>());
      elems *= static_cast<std::uint64_t>(e.shape.back());
    }
    for (const auto& d : v["data_offsets"])
      if (!d.is_number_unsigned())
        throw InputError(fmt::format("{}: data_offsets must be non-negative integers", tw));
    e.begin = v["data_offsets"][0].get<std::uint64_t>();
    e.end = v["data_offsets"][1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      throw InputError(fmt::format(
          "{}: byte range [{}, {}) lies outside the {}-byte data section; the file is truncated "
          "or corrupt",
          tw, e.begin, e.end, data_size));
    if (e.end - e.begin != elems * dtype_size(e.dtype))
      throw InputError(
          fmt::format("{}: byte range of {} bytes does not match its shape and dtype ({} bytes)",
                      tw, e.end - e.begin, elems * dtype_size(e.dtype)));
    out.tensors.emplace(it.key(), std::move(e));
  }
  return out;
}

std::map<std::string, std::string> load_safetensors(const fs::path& file,
                                                    const std::vector<TensorRef>& into,
                                                    Backend& backend, bool allow_extra) {
  const SafetensorsHeader h = read_safetensors_header(file);
  const std::string where = fmt::format("checkpoint '{}'", file.string());
  auto shape_str = [](const std::vector<std::int64_t>& s) {
    return fmt::format("[{}]", fmt::join(s, ", "));
  };
  // Validate everything before touching the model, so a bad file changes nothing.
  for (const auto& t : into) {
    auto it = h.tensors.find(t.name);
    if (it == h.tensors.end())
      throw InputError(fmt::format("{}: tensor '{}' is missing; the checkpoint is of another model",
                                   where, t.name));
    if (it->second.dtype != t.dtype || it->second.shape != t.shape)
      throw InputError(fmt::format("{}: tensor '{}' is {}{}, the model expects {}{}", where, t.name,
                                   dtype_name(it->second.dtype), shape_str(it->second.shape),
                                   dtype_name(t.dtype), shape_str(t.shape)));
  }
  if (!allow_extra) {
    for (const auto& tensor : h.tensors) {
      const std::string& name = tensor.first;  // not a structured binding: clang < 16 cannot
                                               // capture one in the lambda below
      const bool known =
          std::any_of(into.begin(), into.end(), [&](const TensorRef& t) { return t.name == name; });
      if (!known)
        throw InputError(fmt::format(
            "{}: tensor '{}' is not part of this model; the checkpoint is of another model or "
            "optimizer",
            where, name));
    }
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read {}", where));
  std::vector<char> stage(kChunk);
  for (const auto& t : into) {
    const SafetensorsEntry& e = h.tensors.at(t.name);
    in.seekg(static_cast<std::streamoff>(h.data_offset + e.begin));
    const std::size_t total = t.bytes();
    for (std::size_t done = 0; done < total;) {
      const std::size_t n = std::min(stage.size(), total - done);
      if (!in.read(stage.data(), static_cast<std::streamsize>(n)))
        throw InputError(fmt::format("{}: short read in tensor '{}'", where, t.name));
      backend.copy_to_device(static_cast<char*>(t.data) + done, stage.data(), n);
      done += n;
    }
  }
  return h.metadata;
}

fs::path checkpoint_path(const fs::path& dir, std::int64_t step) {
  return dir / fmt::format("step-{}.safetensors", step);
}

std::vector<std::int64_t> list_checkpoints(const fs::path& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  static const std::regex re(R"(step-(\d{1,18})\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(ec) && std::regex_match(name, m, re))
      steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void prune_checkpoints(const fs::path& dir, int keep) {
  auto steps = list_checkpoints(dir);
  std::error_code ec;
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i)
    fs::remove(checkpoint_path(dir, steps[i]), ec);
}

}  // namespace parity
