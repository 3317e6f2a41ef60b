// Small numeric helpers the analysis, batch inference and cross-rank rules share.
#pragma once

#include <algorithm>
#include <cstdint>
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

}  // namespace memsnap
