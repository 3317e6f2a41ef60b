// The event model shared by every layer: what the recorder captures, what the spill holds,
// what the aggregator analyses and what the store keeps.
//
// Actions follow PyTorch's allocator trace entries so that import and export are lossless.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace memsnap {

enum class Action : std::uint8_t {
  alloc = 0,
  free_requested = 1,
  free_completed = 2,
  segment_alloc = 3,
  segment_free = 4,
  segment_map = 5,
  segment_unmap = 6,
  snapshot = 7,
  oom = 8,
};
inline constexpr int kActionCount = 9;

// The name PyTorch uses for the action ("alloc", "free_requested", ...).
std::string_view action_name(Action a);
std::optional<Action> action_from_name(std::string_view name);

// True for the actions on a whole segment of the allocator (segment_alloc, segment_free,
// segment_map, segment_unmap), as against those on one allocation.
inline bool is_segment_action(Action a) {
  return a == Action::segment_alloc || a == Action::segment_free || a == Action::segment_map ||
         a == Action::segment_unmap;
}

inline constexpr std::uint32_t kNoStack = 0xffffffffu;

// One allocator event. Trivially copyable: written to spills and HDF5 as raw bytes.
// For `oom`: size holds the requested bytes and addr the device's free bytes at the failure
// (PyTorch's device_free); the device's total is in RankMeta::device_total_bytes.
struct Event {
  std::int64_t time_ns = 0;   // CLOCK_MONOTONIC of the recording process (see RankMeta)
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint32_t stack_id = kNoStack;  // into RankRecord::stacks, or kNoStack
  std::int16_t device = 0;            // -1: host (pinned) memory
  Action action = Action::alloc;
  std::uint8_t flags = 0;             // reserved, 0
};
static_assert(std::is_trivially_copyable_v<Event>);
static_assert(sizeof(Event) == 40);

// A source frame. Native frames carry the function (demangled) and file:line where debug info
// exists; Python frames from torch snapshots carry the same fields.
struct Frame {
  std::string name;
  std::string file;
  std::uint32_t line = 0;
  bool operator==(const Frame&) const = default;
};

// A stack: frame ids into RankRecord::frames, innermost first.
using Stack = std::vector<std::uint32_t>;

// An allocation live at some instant (window open, or an OOM).
struct LiveAlloc {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time_ns = 0;  // when it was allocated (0 if unknown)
  std::uint32_t stack_id = kNoStack;
  std::int16_t device = 0;
  std::uint8_t is_segment = 0;  // 1: a segment (reserved memory), 0: an allocation
  std::uint8_t pad = 0;
  bool operator==(const LiveAlloc&) const = default;
};
static_assert(std::is_trivially_copyable_v<LiveAlloc>);

// A batch boundary inside a window: batch `batch` started at time_ns.
struct BatchMark {
  std::int64_t batch = 0;
  std::int64_t time_ns = 0;
  bool operator==(const BatchMark&) const = default;
};

// Allocator state at window end: one segment with its blocks (torch snapshots carry these; for
// recorded windows the segments are reconstructed from the events).
struct Block {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::uint8_t state = 0;  // 0 inactive, 1 active_allocated, 2 active_pending_free
  std::uint32_t stack_id = kNoStack;
  bool operator==(const Block&) const = default;
};
struct Segment {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int16_t device = 0;
  std::string pool;  // "large", "small", or "" when unknown
  std::vector<Block> blocks;
  bool operator==(const Segment&) const = default;
};

}  // namespace memsnap
