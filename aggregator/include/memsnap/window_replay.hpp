// One replay of a window: its events applied in order to what was live when it opened, keeping
// the live allocations, the live segments and the allocated and reserved levels. The window
// analysis, batch inference, `memsnap export --format chrome` and the rank page all walk a window
// with it, so they agree on what every event does to memory:
//
//   - The allocations and segments live at the window's open (live_at_start) come first; of a
//     key listed twice the first counts.
//   - An alloc takes its key. On a key that is already live it REPLACES the allocation there:
//     that one ends at this event (its bytes leave the allocated level) and the new one begins.
//     The source lost the free in between (dropped events, a ring that overflowed); the alloc is
//     the later word on what the address holds.
//   - The free action (free_action: free_completed, or free_requested for a source that never
//     reports completion) ends the allocation on its key; on a key not live (allocated before the
//     trace began, or its alloc was lost) it changes nothing. The other free action changes
//     nothing.
//   - segment_alloc and segment_map take their key the same way: on a segment key that is
//     already live the new segment REPLACES the old one (reserved loses the old size and gains
//     the new), as an alloc does and as the recorder's own live tracking does (lib/, LiveState).
//     segment_free and segment_unmap end the segment on their key, if live.
//   - oom and snapshot events change nothing live.
//
// Allocations and segments are separate tables: a segment and an allocation at one address are
// both live.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memsnap/detail/flat_map.hpp"
#include "memsnap/record.hpp"

namespace memsnap {

// The action that ends an allocation in this window: free_completed, or free_requested for a
// source that never reports completion.
inline Action free_action(const WindowRecord& w) {
  bool requested = false;
  for (const auto& e : w.events) {
    if (e.action == Action::free_completed) return Action::free_completed;
    requested |= e.action == Action::free_requested;
  }
  return requested ? Action::free_requested : Action::free_completed;
}

// A live allocation or segment.
struct LiveBlock {
  std::uint64_t size = 0;
  std::int64_t time_ns = 0;            // of its alloc; live at the open: the window's open time
  std::uint32_t stack_id = kNoStack;
  // Allocations: the order the replay made them live in, from 0: those live at the open first
  // (in live_at_start's order, a duplicated key's second entry skipped), then the window's allocs.
  // Segments: 0.
  std::uint32_t serial = 0;
};

// What one event did.
struct ReplayStep {
  enum Kind : std::uint8_t {
    none,           // nothing live changes (the other free action, a snapshot)
    alloc,          // an allocation began (and ended one on its key: `ended`)
    free,           // the free action: ended the allocation on its key, where one was live
    segment_alloc,  // segment_alloc or segment_map (and ended a segment on its key: `ended`)
    segment_free,   // segment_free or segment_unmap: ended the segment on its key, where live
    oom,            // an allocation was refused
  };
  Kind kind = none;
  bool ended = false;  // `old` was live on the event's key and ended at this event
  LiveBlock old;
};

class WindowReplay {
 public:
  // At the window's open, no event applied. `w` must outlive it.
  explicit WindowReplay(const WindowRecord& w) : m_w(w), m_free(memsnap::free_action(w)), m_marks(w.batches) {
    std::sort(m_marks.begin(), m_marks.end(), [](const BatchMark& a, const BatchMark& b) { return a.time_ns < b.time_ns; });
    restart();
  }

  // Back to the window's open. `on_open(const LiveAlloc&, const LiveBlock&)` is called for every
  // allocation (not segment) live then that counts, in live_at_start's order.
  void restart() {
    restart([](const LiveAlloc&, const LiveBlock&) {});
  }
  template <class OnOpen>
  void restart(OnOpen&& on_open) {
    m_live.clear();
    m_segs.clear();
    m_allocated = m_reserved = 0;
    m_next = 0;
    m_serial = 0;
    m_marks_begun = 0;
    for (const auto& a : m_w.live_at_start) {
      const LiveBlock b{a.size, m_w.open_time_ns, a.stack_id, a.is_segment ? 0u : m_serial};
      if (!(a.is_segment ? m_segs : m_live).try_emplace(live_key(a.device, a.addr), b).second) continue;
      if (a.is_segment) {
        m_reserved += a.size;
      } else {
        m_allocated += a.size;
        ++m_serial;
        on_open(a, b);
      }
    }
    m_open_count = m_serial;
  }

  // Applies the next event (there must be one) and says what it did.
  ReplayStep step() { return apply(m_w.events[m_next++]); }
  bool done() const { return m_next == m_w.events.size(); }
  std::size_t applied() const { return m_next; }  // events applied: the next one's index

  std::uint64_t allocated() const { return m_allocated; }
  std::uint64_t reserved() const { return m_reserved; }
  const FlatMap<LiveBlock>& live() const { return m_live; }
  const FlatMap<LiveBlock>& segments() const { return m_segs; }
  // An allocation the window made (by an alloc event), not one live at its open.
  bool made_in_window(const LiveBlock& b) const { return b.serial >= m_open_count; }
  Action free_action() const { return m_free; }

  // The window's batch marks, by time.
  const std::vector<BatchMark>& marks() const { return m_marks; }
  // Marks begin before the first event at or after their time: the next mark (its index in
  // marks()) that begins before the next event, counted begun; -1 when none does. After the last
  // event, the marks left begin only by begin_remaining_mark().
  std::ptrdiff_t begin_mark() {
    if (done() || m_marks_begun == m_marks.size() || m_marks[m_marks_begun].time_ns > m_w.events[m_next].time_ns) return -1;
    return static_cast<std::ptrdiff_t>(m_marks_begun++);
  }
  std::ptrdiff_t begin_remaining_mark() {
    return m_marks_begun == m_marks.size() ? -1 : static_cast<std::ptrdiff_t>(m_marks_begun++);
  }
  std::size_t marks_begun() const { return m_marks_begun; }

 private:
  ReplayStep apply(const Event& e) {
    ReplayStep s;
    const auto key = live_key(e.device, e.addr);
    if (e.action == Action::alloc) {
      s.kind = ReplayStep::alloc;
      take(m_live, m_allocated, key, LiveBlock{e.size, e.time_ns, e.stack_id, m_serial++}, s);
    } else if (e.action == m_free) {
      s.kind = ReplayStep::free;
      if (m_live.erase(key, &s.old)) {
        s.ended = true;
        m_allocated -= s.old.size;
      }
    } else if (e.action == Action::segment_alloc || e.action == Action::segment_map) {
      s.kind = ReplayStep::segment_alloc;
      take(m_segs, m_reserved, key, LiveBlock{e.size, e.time_ns, e.stack_id, 0}, s);
    } else if (e.action == Action::segment_free || e.action == Action::segment_unmap) {
      s.kind = ReplayStep::segment_free;
      if (m_segs.erase(key, &s.old)) {
        s.ended = true;
        m_reserved -= s.old.size;
      }
    } else if (e.action == Action::oom) {
      s.kind = ReplayStep::oom;
    }
    return s;
  }

  // `b` takes `key`, replacing what was live there.
  static void take(FlatMap<LiveBlock>& table, std::uint64_t& level, std::uint64_t key, const LiveBlock& b, ReplayStep& s) {
    auto [slot, inserted] = table.try_emplace(key, b);
    if (!inserted) {
      s.ended = true;
      s.old = *slot;
      level -= slot->size;
      *slot = b;
    }
    level += b.size;
  }

  const WindowRecord& m_w;
  Action m_free;
  std::vector<BatchMark> m_marks;
  FlatMap<LiveBlock> m_live, m_segs;
  std::uint64_t m_allocated = 0, m_reserved = 0;
  std::size_t m_next = 0;
  std::uint32_t m_serial = 0;
  std::uint32_t m_open_count = 0;
  std::size_t m_marks_begun = 0;
};

}  // namespace memsnap
