// memsnap's clocks inside the training process: CLOCK_MONOTONIC ns for everything written, and
// the hot path's raw tick source.
#pragma once

#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <cstdint>

namespace memsnap {

inline std::int64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline std::int64_t wall_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The hot path's clock. CLOCK_MONOTONIC through the vDSO costs about 20 ns a read. Where the kernel
// keeps time with the TSC itself (clocksource "tsc": invariant, and checked by the kernel to be
// synchronised across CPUs), an event holds raw TSC ticks (about 7 ns a read) until the drain
// converts them to CLOCK_MONOTONIC ns; everything written keeps ns.
struct TickSource {
  bool tsc = false;
  double ns_per_tick = 1.0;  // first estimate; each recorder refines it between drains
};

#if defined(__x86_64__)
inline std::uint64_t read_tsc() noexcept { return __rdtsc(); }
#else
inline std::uint64_t read_tsc() noexcept { return 0; }
#endif

// Measured once per process (200 us); tsc is false where the kernel's clocksource is not the TSC.
const TickSource& tick_source() noexcept;

}  // namespace memsnap
