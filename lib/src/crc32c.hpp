// CRC-32C (Castagnoli): the spill's record checksum. Uses the SSE4.2 instruction where the CPU
// has it (8 bytes per instruction: checksumming stays a small part of a flush), a table otherwise.
// (Three interleaved streams were tried: no faster on the AMD EPYC development machine, whose
// crc32 instruction is not pipelined, and aggregation within noise, so the one stream stays.)
#pragma once

#include <cstddef>
#include <cstdint>

namespace memsnap {

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t seed = 0) noexcept;

// The same by table on any CPU (tests hold the instruction path to it).
std::uint32_t crc32c_portable(const void* data, std::size_t n, std::uint32_t seed = 0) noexcept;

}  // namespace memsnap
