#include "core/host_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace parity {
namespace {

// A number in a file of one (cgroup limits; "max" means none).
std::optional<std::uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoull(word);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<std::uint64_t> host_memory_available() {
  std::optional<std::uint64_t> avail;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::uint64_t kb = 0;
    if (fields >> kb) avail = kb * 1024;
    break;
  }
  // cgroup v2, then v1: the limit less what the group uses already.
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto l = read_number(limit), u = read_number(usage);
    if (!l || !u) continue;
    const std::uint64_t room = *l > *u ? *l - *u : 0;
    avail = avail ? std::min(*avail, room) : room;
    break;
  }
  return avail;
}

}  // namespace parity
