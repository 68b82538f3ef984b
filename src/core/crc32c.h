// CRC-32C (Castagnoli), the checksum of checkpoint tensors and headers: cheap enough to run over
// every byte a checkpoint moves (the SSE4.2 crc32 instruction where the CPU has it, a table
// otherwise; both give the same value) and strong against the bit flips and torn or shifted
// blocks that corrupt files on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace parity {

// The CRC-32C of data[0, bytes) continued from crc (0 for a new sum): crc32c(b, crc32c(a)) is the
// sum of a followed by b. crc32c("123456789") == 0xe3069283.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// The same sum by table lookups only (what crc32c computes where the CPU lacks SSE4.2).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0);

// "crc32c:" and 8 lower-case hex digits: the form checkpoints store.
std::string crc32c_text(std::uint32_t crc);

}  // namespace parity
