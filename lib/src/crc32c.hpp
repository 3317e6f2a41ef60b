// CRC-32C (Castagnoli): the spill's record checksum. Uses the SSE4.2 instruction where the CPU
// has it (8 bytes per instruction: checksumming stays a small part of a flush), a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memsnap {

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t seed = 0) noexcept;

}  // namespace memsnap
