// EventRing: bounded event history that keeps the newest events and counts those it dropped.
#include <algorithm>

#include "memsnap/recorder.hpp"

namespace memsnap {

EventRing::EventRing(std::size_t capacity) : buf_(std::max<std::size_t>(capacity, 1)) {}

std::array<std::span<const Event>, 2> EventRing::spans() const {
  const std::size_t first = std::min(size_, buf_.size() - start_);
  return {std::span<const Event>(buf_.data() + start_, first), std::span<const Event>(buf_.data(), size_ - first)};
}

std::vector<Event> EventRing::take() {
  std::vector<Event> out;
  out.reserve(size_);
  for_each([&](const Event& e) { out.push_back(e); });
  discard();
  return out;
}

void EventRing::discard() {
  start_ = 0;
  size_ = 0;
}

void EventRing::clear() {
  start_ = 0;
  size_ = 0;
  dropped_ = 0;
}

}  // namespace memsnap
