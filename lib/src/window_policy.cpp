// WindowPolicy: the window schedule (skip_batches, interval, repeat): which batches a window spans.
#include <algorithm>

#include "memsnap/recorder.hpp"

namespace memsnap {

WindowPolicy::WindowPolicy(std::int64_t skip, std::int64_t interval, std::int64_t repeat)
    : skip_(std::max<std::int64_t>(skip, 0)), interval_(std::max<std::int64_t>(interval, 1)), repeat_(repeat) {}

std::int64_t WindowPolicy::window_of(std::int64_t batch) const {
  if (batch <= skip_) return -1;
  const std::int64_t k = (batch - skip_ - 1) / interval_;
  if (repeat_ >= 0 && k > repeat_) return -1;
  return k;
}
bool WindowPolicy::opens_at(std::int64_t batch) const {
  const auto k = window_of(batch);
  return k >= 0 && first_batch(k) == batch;
}
bool WindowPolicy::closes_at(std::int64_t batch) const {
  const auto k = window_of(batch);
  return k >= 0 && last_batch(k) == batch;
}
std::int64_t WindowPolicy::first_batch(std::int64_t k) const { return skip_ + 1 + k * interval_; }
std::int64_t WindowPolicy::last_batch(std::int64_t k) const { return skip_ + (k + 1) * interval_; }

}  // namespace memsnap
