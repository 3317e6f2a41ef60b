#include "log.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace memsnap::log {
namespace {
std::atomic<int> g_rank{-1};

Level threshold() {
  static const Level level = [] {
    const char* v = std::getenv("MEMSNAP_LOG");
    if (v == nullptr) return Level::info;
    std::string s(v);
    if (s == "debug") return Level::debug;
    if (s == "warn") return Level::warn;
    if (s == "error" || s == "quiet") return Level::error;
    return Level::info;
  }();
  return level;
}
}  // namespace

void set_rank(int rank) { g_rank.store(rank); }

void write(Level level, const std::string& message) noexcept {
  try {
    if (level < threshold()) return;
    const char* tag = level == Level::warn ? " warning" : level == Level::error ? " error" : "";
    std::string line = "memsnap";
    const int rank = g_rank.load();
    if (rank >= 0) line += "[rank " + std::to_string(rank) + "]";
    line += std::string(tag) + ": " + message + "\n";
    // One write(2) so that lines of many ranks do not interleave.
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  } catch (...) {
  }
}

void once(std::atomic<bool>& flag, Level level, const std::string& message) noexcept {
  if (!flag.exchange(true)) write(level, message);
}

}  // namespace memsnap::log
