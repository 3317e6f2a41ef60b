// Small numeric helpers the analysis, batch inference, cross-rank rules and the CLI's lines share
// (no MPI, no HDF5: any layer above lib/ may include it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace memsnap {

// The median; the mean of the two middle values for an even count, 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The upper of the two middle values for an even count (a value the input holds), 0 for none.
inline double upper_median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// A byte count computed in double (sums and differences of sizes that damaged inputs can make
// near 2^64): clamped to what a uint64 holds, never an out-of-range cast.
inline std::uint64_t bytes_of(double v) {
  if (!(v > 0)) return 0;
  return v >= 18446744073709549568.0 ? UINT64_MAX : static_cast<std::uint64_t>(v);
}

/// 1536 -> "1.50 KiB" (B, KiB, MiB, GiB, TiB, PiB): three significant digits.
inline std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, units[u]);
  return buf;
}

}  // namespace memsnap
