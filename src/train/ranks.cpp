// What the training loops of a run over several ranks share (ranks.h).
#include "ranks.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace parity::train_detail {

std::vector<float> gather_all(Communicator& comm, const std::vector<float>& mine) {
  const auto P = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> bytes(P, static_cast<std::int64_t>(mine.size() * sizeof(float)));
  std::vector<std::int64_t> counts(P), eight(P, 8);
  comm.all_to_all_v(std::as_bytes(std::span<const std::int64_t>(bytes)), eight,
                    std::as_writable_bytes(std::span<std::int64_t>(counts)), eight);
  std::vector<std::byte> send;
  for (std::size_t q = 0; q < P; ++q) {
    const auto* p = reinterpret_cast<const std::byte*>(mine.data());
    send.insert(send.end(), p, p + mine.size() * sizeof(float));
  }
  std::int64_t total = 0;
  for (const std::int64_t c : counts) total += c;
  std::vector<float> all(static_cast<std::size_t>(total) / sizeof(float));
  comm.all_to_all_v(send, bytes, std::as_writable_bytes(std::span<float>(all)), counts);
  return all;
}

}  // namespace parity::train_detail
