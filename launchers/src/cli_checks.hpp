// Checks for the memsnap subcommands' numbers: a bad value is refused in words ("--interval: 0
// is not allowed: give a whole number from 1 to 100000"), never as CLI11's range of doubles.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace memsnap::cli {

/// A whole number from `lo` to `hi` (no upper bound when `hi` is the largest int64). `unit`
/// names what it counts, in the message and in --help ("batches").
inline CLI::Validator whole_number(std::int64_t lo, std::int64_t hi = std::numeric_limits<std::int64_t>::max(),
                                   const std::string& unit = "") {
  const bool open = hi == std::numeric_limits<std::int64_t>::max();
  const std::string range = open ? std::to_string(lo) + " or more" : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  const std::string allowed = "give a whole number" + (unit.empty() ? std::string() : " of " + unit) + " " +
                              (open ? "of " + range : range);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
          return "'" + text + "' is not a whole number: " + allowed;
        }
        if (v < lo || v > hi) return text + " is not allowed: " + allowed;
        return "";
      },
      open ? ">= " + std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi));
}

}  // namespace memsnap::cli
