#include "clock.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <string_view>

namespace memsnap {
namespace {

#if defined(__x86_64__)
bool kernel_clocksource_is_tsc() noexcept {
  const int fd = ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n >= 3 && std::string_view(buf, static_cast<std::size_t>(n)).substr(0, 3) == "tsc" &&
         (n == 3 || buf[3] == '\n');
}
#else
bool kernel_clocksource_is_tsc() noexcept { return false; }
#endif

}  // namespace

const TickSource& tick_source() noexcept {
  static const TickSource source = [] {
    TickSource s;
    if (!kernel_clocksource_is_tsc()) return s;
    // 200 us of spinning once per process; the drains refine the rate over longer spans.
    const std::uint64_t t0 = read_tsc();
    const std::int64_t n0 = now_ns();
    std::int64_t n1 = n0;
    std::uint64_t t1 = t0;
    while (n1 - n0 < 200'000) {
      t1 = read_tsc();
      n1 = now_ns();
    }
    if (t1 <= t0) return s;
    s.ns_per_tick = static_cast<double>(n1 - n0) / static_cast<double>(t1 - t0);
    s.tsc = s.ns_per_tick > 0.01 && s.ns_per_tick < 100.0;  // 10 MHz .. 100 GHz, else distrust it
    return s;
  }();
  return source;
}

}  // namespace memsnap
