// How much memory this process may still use on the host: the kernel's estimate of memory
// available without swapping (/proc/meminfo MemAvailable), lowered to the cgroup's remaining limit
// where the process runs in one (containers, Slurm jobs). Memory needs known before allocation are
// compared with it, so that a batch or a model too large for the machine is an error with the
// figures instead of a kill by the out-of-memory killer (Linux overcommits: a huge malloc succeeds
// and the process dies when it touches the pages).
#pragma once

#include <cstdint>
#include <optional>

namespace parity {

// Bytes available now; nullopt where the system does not say (not Linux, /proc not mounted).
std::optional<std::uint64_t> host_memory_available();

}  // namespace parity
