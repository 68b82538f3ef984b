// What the training loops of a run over several ranks share (ranks.h).
#include "ranks.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "parity/error.h"

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

void same_checkpoints_on_every_rank(Communicator& comm, const std::vector<std::int64_t>& steps,
                                    const std::filesystem::path& dir) {
  const double mine[2] = {static_cast<double>(steps.size()),
                          steps.empty() ? -1.0 : static_cast<double>(steps.back())};
  std::vector<double> all(static_cast<std::size_t>(2 * comm.size()));
  comm.all_gather(std::as_bytes(std::span<const double>(mine, 2)),
                  std::as_writable_bytes(std::span<double>(all)));
  for (int q = 0; q < comm.size(); ++q)
    if (all[static_cast<std::size_t>(2 * q)] != mine[0] ||
        all[static_cast<std::size_t>(2 * q + 1)] != mine[1])
      throw InputError(fmt::format(
          "rank {} sees {} checkpoints in '{}' (newest step {}) and rank {} sees {} (newest {}): "
          "the ranks of a run must share one checkpoint directory",
          comm.rank(), mine[0], dir.string(), mine[1], q, all[static_cast<std::size_t>(2 * q)],
          all[static_cast<std::size_t>(2 * q + 1)]));
}

std::pair<bool, bool> agree_on_resume(Communicator* comm, bool failed, bool corrupt) {
  if (comm == nullptr) return {failed, corrupt};
  double flags[2] = {failed ? 1.0 : 0.0, corrupt ? 1.0 : 0.0};
  comm->all_reduce_sum(std::span<double>(flags, 2));
  return {flags[0] > 0, flags[1] > 0};
}

std::int64_t earliest_on_any_rank(Communicator& comm, std::int64_t mine) {
  const double me = static_cast<double>(mine);
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::as_bytes(std::span<const double>(&me, 1)),
                  std::as_writable_bytes(std::span<double>(all)));
  std::int64_t first = -1;
  for (const double v : all)
    if (v >= 0 && (first < 0 || v < static_cast<double>(first)))
      first = static_cast<std::int64_t>(v);
  return first;
}

double sum_over_ranks(Communicator& comm, double mine) {
  comm.all_reduce_sum(std::span<double>(&mine, 1));
  return mine;
}

}  // namespace parity::train_detail
