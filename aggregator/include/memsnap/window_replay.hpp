// One replay of a window: its events applied in order to what was live when it opened, keeping
// the live allocations, the live segments and the allocated and reserved levels. The window
// analysis, batch inference, `memsnap export --format chrome` and the rank page all walk a window
// with it, so they agree on what every event does to memory. What an event does is the rule of
// memsnap/live_tables.hpp, the same that the recorder's own live tracking applies; the replay adds:
//
//   - The allocations and segments live at the window's open (live_at_start) come first; of a
//     key listed twice the first counts.
//   - The free action is the window's (free_action below).
//   - Allocations are numbered in the order they became live (LiveBlock::serial), and the
//     window's batch marks begin between events.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memsnap/detail/flat_map.hpp"
#include "memsnap/live_tables.hpp"
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

// What one event did (kind, and the block it ended).
using ReplayStep = LiveStep<LiveBlock>;

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
    m_tables.clear();
    m_next = 0;
    m_serial = 0;
    m_marks_begun = 0;
    for (const auto& a : m_w.live_at_start) {
      const LiveBlock b{a.size, m_w.open_time_ns, a.stack_id, a.is_segment ? 0u : m_serial};
      const std::uint64_t key = live_key(a.device, a.addr);
      if (a.is_segment) {
        m_tables.put_segment(key, b);
      } else if (m_tables.put_allocation(key, b)) {
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

  std::uint64_t allocated() const { return m_tables.allocated(); }
  std::uint64_t reserved() const { return m_tables.reserved(); }
  const FlatMap<LiveBlock>& live() const { return m_tables.allocations(); }
  const FlatMap<LiveBlock>& segments() const { return m_tables.segments(); }
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
    return m_tables.apply(e, m_free, [&] {
      const bool segment = e.action != Action::alloc;
      return LiveBlock{e.size, e.time_ns, e.stack_id, segment ? 0u : m_serial++};
    });
  }

  const WindowRecord& m_w;
  Action m_free;
  std::vector<BatchMark> m_marks;
  LiveTables<LiveBlock> m_tables;
  std::size_t m_next = 0;
  std::uint32_t m_serial = 0;
  std::uint32_t m_open_count = 0;
  std::size_t m_marks_begun = 0;
};

}  // namespace memsnap
