// Collectives over a backend's memory (backend_collectives.h).
#include "dist/backend_collectives.h"

namespace parity {

BackendCollectives::BackendCollectives(Communicator& comm, Backend& backend)
    : comm_(comm),
      backend_(backend),
      in_place_(backend.memory_is_host() || comm.takes_device_memory()),
      device_(!backend.memory_is_host()) {}

void BackendCollectives::before_in_place() {
  // The engine runs the collective on its own stream, which does not wait for the backend's.
  if (device_) backend_.synchronize();
}

void BackendCollectives::all_reduce_sum(float* data, std::size_t n, bool ready) {
  if (n == 0) return;
  if (in_place_) {
    if (!ready) before_in_place();
    comm_.all_reduce_sum(std::span<float>(data, n));
    return;
  }
  send_.resize(n * sizeof(float));
  backend_.copy_to_host(send_.data(), data, send_.size());
  comm_.all_reduce_sum(std::span<float>(reinterpret_cast<float*>(send_.data()), n));
  backend_.copy_to_device(data, send_.data(), send_.size());
}

void BackendCollectives::all_to_all_v(const void* send, std::span<const std::int64_t> send_bytes,
                                      void* recv, std::span<const std::int64_t> recv_bytes) {
  std::size_t out = 0, in = 0;
  for (const std::int64_t n : send_bytes) out += static_cast<std::size_t>(n);
  for (const std::int64_t n : recv_bytes) in += static_cast<std::size_t>(n);
  if (in_place_) {
    before_in_place();
    comm_.all_to_all_v(std::span<const std::byte>(static_cast<const std::byte*>(send), out),
                       send_bytes, std::span<std::byte>(static_cast<std::byte*>(recv), in),
                       recv_bytes);
    return;
  }
  send_.resize(out);
  recv_.resize(in);
  if (out > 0) backend_.copy_to_host(send_.data(), send, out);
  comm_.all_to_all_v(send_, send_bytes, recv_, recv_bytes);
  if (in > 0) backend_.copy_to_device(recv, recv_.data(), in);
}

void BackendCollectives::all_gather(const void* send, std::size_t bytes, void* recv) {
  const std::size_t in = bytes * static_cast<std::size_t>(comm_.size());
  if (in_place_) {
    before_in_place();
    comm_.all_gather(std::span<const std::byte>(static_cast<const std::byte*>(send), bytes),
                     std::span<std::byte>(static_cast<std::byte*>(recv), in));
    return;
  }
  send_.resize(bytes);
  recv_.resize(in);
  if (bytes > 0) backend_.copy_to_host(send_.data(), send, bytes);
  comm_.all_gather(send_, recv_);
  if (in > 0) backend_.copy_to_device(recv, recv_.data(), in);
}

}  // namespace parity
