// The meeting of a run's ranks before a collective engine exists: rank 0 gives every rank a few
// bytes (NCCL's unique id) over TCP at the address a torchrun-style launcher names (MASTER_ADDR,
// MASTER_PORT), as torch's TCPStore does. It carries those bytes once and nothing else: the
// collectives themselves are NCCL's or MPI's.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "parity/dist.h"

namespace parity {

// Rank 0 listens on g.master_port, waits for the other g.world - 1 ranks and sends each of them
// `payload`; every other rank connects to g.master_addr:g.master_port (trying again until rank 0
// listens) and receives it. Returns the payload on every rank; returns at once where g.world is 1.
// Every rank says who it is, so a rank of another run or a rank number given twice is refused.
// Throws Error naming the address, the rank and what was expected when the ranks have not all met
// within timeout_s, or a connection fails.
std::vector<std::byte> rendezvous_broadcast(const ProcessGroupInfo& g,
                                            std::span<const std::byte> payload, double timeout_s);

}  // namespace parity
