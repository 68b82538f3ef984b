// The process group from the launcher's environment (dist.h).
#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <vector>

#include "parity/dist.h"

namespace parity {
namespace {

// The names one launcher sets.
struct LauncherVars {
  Launcher launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;  // optional
};

constexpr LauncherVars kLaunchers[] = {
    {Launcher::mpirun, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {Launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
};

constexpr int kMaxWorld = 1 << 20;

// A whole number in [lo, hi] from the variable `name`.
int read_int(const EnvLookup& env, const char* name, int lo, int hi) {
  const std::optional<std::string> v = env(name);
  if (!v) throw InputError(fmt::format("environment variable {} is not set", name));
  int out = 0;
  const char* first = v->data();
  const char* last = first + v->size();
  const auto [end, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || end != last || out < lo || out > hi)
    throw InputError(fmt::format(
        "environment variable {}='{}': expected a whole number from {} to {}", name, *v, lo, hi));
  return out;
}

}  // namespace

ProcessGroupInfo detect_process_group(const EnvLookup& env) {
  ProcessGroupInfo g;
  for (const LauncherVars& l : kLaunchers) {
    const bool has_rank = env(l.rank).has_value(), has_world = env(l.world).has_value();
    if (!has_rank && !has_world) continue;
    if (!has_rank || !has_world)
      throw InputError(fmt::format(
          "{} is set without {}: a {} launch sets both (the rank of this process and the number "
          "of ranks)",
          has_rank ? l.rank : l.world, has_rank ? l.world : l.rank,
          name_in(kLauncherNames, l.launcher)));
    g.launcher = l.launcher;
    g.world = read_int(env, l.world, 1, kMaxWorld);
    g.rank = read_int(env, l.rank, 0, kMaxWorld - 1);
    if (g.rank >= g.world)
      throw InputError(fmt::format("environment variable {}={} is not below {}={}", l.rank, g.rank,
                                   l.world, g.world));
    g.local_rank = env(l.local_rank) ? read_int(env, l.local_rank, 0, g.world - 1) : 0;
    if (l.launcher == Launcher::slurm && env(l.local_world)) {
      // SLURM_NTASKS_PER_NODE may read "4" or "4(x2)" (four tasks on each of two nodes).
      std::string v = *env(l.local_world);
      const std::size_t paren = v.find('(');
      if (paren != std::string::npos) v.resize(paren);
      const EnvLookup one = [&](std::string_view) { return std::optional<std::string>(v); };
      g.local_world = read_int(one, l.local_world, 1, g.world);
    } else {
      g.local_world = env(l.local_world) ? read_int(env, l.local_world, 1, g.world) : 1;
    }
    if (g.local_rank >= g.local_world && env(l.local_world))
      throw InputError(fmt::format("environment variable {}={} is not below {}={}", l.local_rank,
                                   g.local_rank, l.local_world, g.local_world));
    g.local_world = std::max(g.local_world, g.local_rank + 1);
    g.source = fmt::format("{}={}, {}={}", l.rank, g.rank, l.world, g.world);
    if (l.launcher == Launcher::torchrun && g.world > 1) {
      const std::optional<std::string> addr = env("MASTER_ADDR");
      if (!addr || addr->empty())
        throw InputError(
            "environment variable MASTER_ADDR is not set: a torchrun-style launch of several ranks "
            "names the host of rank 0 in MASTER_ADDR and its port in MASTER_PORT");
      g.master_addr = *addr;
      g.master_port = read_int(env, "MASTER_PORT", 1, 65535);
    }
    return g;
  }
  return g;
}

ProcessGroupInfo detect_process_group() {
  return detect_process_group([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace parity
