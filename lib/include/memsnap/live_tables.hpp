// What an event does to what is live: the one rule shared by the recorder's live tracking (lib/,
// Recorder's LiveState, while recording) and the replay of a recorded window (aggregator/,
// memsnap/window_replay.hpp, for analysis, batch inference, export and the rank page).
//
//   - An alloc takes its key (live_key: device and address). On a key that is already live it
//     REPLACES the allocation there: that one ends at this event (its bytes leave the allocated
//     level) and the new one begins. The source lost the free in between (dropped events, a ring
//     that overflowed); the alloc is the later word on what the address holds.
//   - The free action (given by the caller: free_completed, or free_requested for a source that
//     never reports completion) ends the allocation on its key; on a key not live (allocated
//     before tracking began, or its alloc was lost) it changes nothing. Any other free action
//     changes nothing.
//   - segment_alloc and segment_map take their key the same way: on a segment key that is already
//     live the new segment REPLACES the old one (reserved loses the old size, gains the new).
//     segment_free and segment_unmap end the segment on their key, if live.
//   - oom and snapshot events change nothing live.
//
// Allocations and segments are separate tables: a segment and an allocation at one address are
// both live.
#pragma once

#include <cstdint>

#include "memsnap/detail/flat_map.hpp"
#include "memsnap/event.hpp"

namespace memsnap {

// What one event did to the live tables.
struct LiveStepKind {
  enum Kind : std::uint8_t {
    none,           // nothing live changes (the other free action, a snapshot)
    alloc,          // an allocation began (and ended one on its key: `ended`)
    free,           // the free action: ended the allocation on its key, where one was live
    segment_alloc,  // segment_alloc or segment_map (and ended a segment on its key: `ended`)
    segment_free,   // segment_free or segment_unmap: ended the segment on its key, where live
    oom,            // an allocation was refused
  };
};

template <class Block>
struct LiveStep : LiveStepKind {
  Kind kind = none;
  bool ended = false;  // `old` was live on the event's key and ended at this event
  Block old{};
};

// Live allocations and segments by live_key, with the allocated and reserved levels. `Block` is
// what the caller keeps of a live block; it has a `size`.
template <class Block>
class LiveTables {
 public:
  explicit LiveTables(std::size_t capacity = 64) : m_allocs(capacity), m_segments(capacity) {}

  // Applies `e`. `free_action` is the action that ends an allocation; `made()` builds the block
  // that an alloc or segment event makes live (called only for those).
  template <class Made>
  LiveStep<Block> apply(const Event& e, Action free_action, Made&& made) {
    LiveStep<Block> s;
    const std::uint64_t key = live_key(e.device, e.addr);
    if (e.action == Action::alloc) {
      s.kind = LiveStepKind::alloc;
      take(m_allocs, m_allocated, key, made(), s);
    } else if (e.action == free_action) {
      s.kind = LiveStepKind::free;
      end(m_allocs, m_allocated, key, s);
    } else if (e.action == Action::segment_alloc || e.action == Action::segment_map) {
      s.kind = LiveStepKind::segment_alloc;
      take(m_segments, m_reserved, key, made(), s);
    } else if (e.action == Action::segment_free || e.action == Action::segment_unmap) {
      s.kind = LiveStepKind::segment_free;
      end(m_segments, m_reserved, key, s);
    } else if (e.action == Action::oom) {
      s.kind = LiveStepKind::oom;
    }
    return s;
  }

  // Puts a block that was live before the events (a window's live_at_start). A key already
  // present keeps its first block; returns whether `b` was put.
  bool put_allocation(std::uint64_t key, const Block& b) { return put(m_allocs, m_allocated, key, b); }
  bool put_segment(std::uint64_t key, const Block& b) { return put(m_segments, m_reserved, key, b); }

  void clear() {
    m_allocs.clear();
    m_segments.clear();
    m_allocated = m_reserved = 0;
  }

  const FlatMap<Block>& allocations() const { return m_allocs; }
  const FlatMap<Block>& segments() const { return m_segments; }
  std::uint64_t allocated() const { return m_allocated; }  // bytes of the live allocations
  std::uint64_t reserved() const { return m_reserved; }    // bytes of the live segments

 private:
  static bool put(FlatMap<Block>& table, std::uint64_t& level, std::uint64_t key, const Block& b) {
    if (!table.try_emplace(key, b).second) return false;
    level += b.size;
    return true;
  }
  // `b` takes `key`, replacing what was live there.
  static void take(FlatMap<Block>& table, std::uint64_t& level, std::uint64_t key, const Block& b, LiveStep<Block>& s) {
    auto [slot, inserted] = table.try_emplace(key, b);
    if (!inserted) {
      s.ended = true;
      s.old = *slot;
      level -= slot->size;
      *slot = b;
    }
    level += b.size;
  }
  static void end(FlatMap<Block>& table, std::uint64_t& level, std::uint64_t key, LiveStep<Block>& s) {
    if (table.erase(key, &s.old)) {
      s.ended = true;
      level -= s.old.size;
    }
  }

  FlatMap<Block> m_allocs, m_segments;
  std::uint64_t m_allocated = 0, m_reserved = 0;
};

}  // namespace memsnap
