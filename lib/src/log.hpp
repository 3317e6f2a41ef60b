// In-process logging: one leveled line on stderr, prefixed "memsnap[rank R]:". Never throws.
#pragma once

#include <atomic>
#include <string>

namespace memsnap::log {

enum class Level { debug, info, warn, error };

void set_rank(int rank);
void write(Level level, const std::string& message) noexcept;

// Writes `message` the first time `flag` is seen unset; later calls are silent ("warns once").
void once(std::atomic<bool>& flag, Level level, const std::string& message) noexcept;

}  // namespace memsnap::log
