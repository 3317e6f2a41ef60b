// The consumer side of the recorder: the rings drained in time order into live tracking, the
// window history and the spill's records (windows, batches, stacks, segment state). Runs under
// Recorder::Impl::mutex, on the writer thread or on the thread that ends a batch.
#include <dlfcn.h>

#include <algorithm>
#include <string_view>
#include <tuple>

#include "clock.hpp"
#include "log.hpp"
#include "recorder_impl.hpp"

namespace memsnap {

using namespace detail;

void detail::LiveState::apply(Event& e) {
  // free_requested never ends an allocation here: this recorder's sources report completion.
  const auto step = tables.apply(e, Action::free_completed, [&] {
    const bool segment = e.action != Action::alloc;
    return LiveAlloc{e.addr, e.size, e.stream, e.time_ns, e.stack_id, e.device, static_cast<std::uint8_t>(segment), 0};
  });
  // A source that frees by address only (CUPTI: cudaFree(ptr)) records size 0; the size is the
  // allocation's or the segment's, found by the same lookup.
  if (e.size != 0) return;
  if (step.kind == LiveStep<LiveAlloc>::free || step.kind == LiveStep<LiveAlloc>::segment_free) {
    if (step.ended) e.size = step.old.size;
  } else if (e.action == Action::free_requested) {
    if (const LiveAlloc* a = tables.allocations().find(live_key(e.device, e.addr))) e.size = a->size;
  }
}

void Recorder::Impl::drain(bool hold_back) {
  double rate = ticks.rate;
  std::uint64_t base_tick = ticks.tick;
  std::int64_t base_ns = ticks.ns;
  std::int64_t drained_at = 0;
  if (tsc_clock) {
    // Piecewise linear between anchors taken at drains at least 1 ms apart: exact at every
    // anchor, so CLOCK_MONOTONIC's own slewing (NTP) is followed.
    const std::uint64_t t = read_tsc();
    const std::int64_t n = now_ns();
    drained_at = n;
    if (n - ticks.ns >= 1'000'000 && t > ticks.tick) {
      rate = static_cast<double>(n - ticks.ns) / static_cast<double>(t - ticks.tick);
      ticks = TickAnchor{t, n, rate};
    }
  }
  auto& runs = rings.runs;
  runs.clear();
  for (auto& bp : rings.buffers) {
    ThreadBuffer* b = bp.get();
    const std::uint64_t tail = b->tail.load(std::memory_order_relaxed);
    std::uint64_t head = b->head.load(std::memory_order_acquire);
    if (head == tail) continue;
    if (hold_back && rings.allocator_trace_seen.load(std::memory_order_relaxed)) {
      // The trailing run of CUPTI events of one kind (a large expandable segment maps hundreds
      // of pages before its one trace entry), at most a quarter of the ring.
      std::uint64_t keep = head;
      int run_kind = 0;
      while (keep > tail && head - keep < b->capacity / 4) {
        const Event& e = b->events[(keep - 1) & b->mask];
        const int k = dedupe_kind(e);
        if (k == 0 || (e.flags & kFromAllocatorTrace) != 0 || (run_kind != 0 && k != run_kind)) break;
        run_kind = k;
        --keep;
      }
      head = keep;
    }
    const std::uint64_t mask = b->mask;
    // Only the allocator trace's events drop CUPTI's: without them there is nothing to mark.
    // Read per ring, after its head: the flag is set before the first traced event is pushed,
    // so a traced event inside [tail, head) is always seen with the flag set.
    const bool dedupe = rings.allocator_trace_seen.load(std::memory_order_relaxed);
    if (!dedupe) b->trace_segment_kind = 0;
    for (std::uint64_t i = dedupe ? tail : head; i < head; ++i) {
      const Event& e = b->events[i & mask];
      const int kind = dedupe_kind(e);
      if (kind == 0) {
        b->trace_segment_kind = 0;
        continue;
      }
      const bool traced = (e.flags & kFromAllocatorTrace) != 0;
      if (traced) {
        const std::uint64_t hi = e.addr + std::max<std::uint64_t>(e.size, 1);
        // CUPTI's copies just before it, on this thread, in this drain.
        for (std::uint64_t j = i; j > tail; --j) {
          const Event& p = b->events[(j - 1) & mask];
          if (b->dropped[(j - 1) & mask]) continue;
          if (dedupe_kind(p) != kind || p.device != e.device || p.addr < e.addr || p.addr >= hi ||
              (p.flags & kFromAllocatorTrace) != 0) {
            break;
          }
          b->dropped[(j - 1) & mask] = true;
        }
        b->trace_segment_kind = kind;
        b->trace_segment_lo = e.addr;
        b->trace_segment_hi = hi;
      } else if (b->trace_segment_kind == kind && e.addr >= b->trace_segment_lo && e.addr < b->trace_segment_hi) {
        b->dropped[i & mask] = true;  // CUPTI's copy of the segment the allocator just reported
      }
    }
    runs.push_back(Rings::Run{b, tail, head});
  }
  if (runs.empty()) return;
  auto take = [&](Rings::Run& r) {
    const std::size_t slot = r.next & r.b->mask;
    ++r.next;
    if (r.b->dropped[slot]) {
      r.b->dropped[slot] = false;
      return;
    }
    Event e = r.b->events[slot];
    if (tsc_clock) {
      const auto ticks = static_cast<double>(static_cast<std::int64_t>(static_cast<std::uint64_t>(e.time_ns) - base_tick));
      // Extrapolated past the last anchor, a rate off by parts per thousand could put an
      // event after this drain began, past the batch mark that follows: never later than now.
      e.time_ns = std::min(base_ns + static_cast<std::int64_t>(ticks * rate), drained_at);
    }
    if ((e.flags & kBatchMark) != 0) {
      end_batch_at(e.time_ns);  // the events before it in time are in; those after are not yet
      return;
    }
    e.flags = 0;
    if (r.b->depth_limit > 0 && r.b->depth[slot] > 0) {
      e.stack_id = interner.intern(r.b->pcs.get() + slot * r.b->depth_limit, r.b->depth[slot]);
    }
    live.apply(e);
    if (window_open || config.oom_snapshot) history->push(e);
    ++events_seen;
  };
  if (runs.size() == 1) {
    // One thread's events are already in order.
    Rings::Run& r = runs.front();
    while (r.next < r.end) take(r);
  } else {
    // Each ring is in time order: merge them, the earlier ring first on equal times.
    for (;;) {
      Rings::Run* best = nullptr;
      std::int64_t best_time = 0;
      for (auto& r : runs) {
        if (r.next == r.end) continue;
        const std::int64_t t = r.b->events[r.next & r.b->mask].time_ns;
        if (best == nullptr || t < best_time) {
          best = &r;
          best_time = t;
        }
      }
      if (best == nullptr) break;
      take(*best);
    }
  }
  for (auto& r : runs) r.b->tail.store(r.end, std::memory_order_release);
  // An open window's events go to the spill at every drain, not at the batch's end: the history
  // stays small enough to be packed from cache, and a long batch's end is not one long stall
  // under the lock (the job's threads wait on it once their rings are full).
  if (window_open && history->size() > 0 && !flush_history()) fail_io();
}

namespace {
// Segments and allocations of two tables, oldest first: the LIVE record's order.
std::vector<LiveAlloc> listed(const LiveTable& segs, const LiveTable& allocs) {
  std::vector<LiveAlloc> out;
  out.reserve(segs.size() + allocs.size());
  segs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
  allocs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
  std::sort(out.begin(), out.end(), [](const LiveAlloc& a, const LiveAlloc& b) {
    return std::tie(a.time_ns, a.device, a.addr) < std::tie(b.time_ns, b.device, b.addr);
  });
  return out;
}

}  // namespace

std::vector<LiveAlloc> detail::LiveState::snapshot() const { return listed(tables.segments(), tables.allocations()); }

std::vector<LiveAlloc> detail::LiveState::before(const EventRing& history) const {
  LiveTable allocs_then = tables.allocations();
  LiveTable segs = tables.segments();
  std::vector<Event> events;
  history.for_each([&](const Event& e) { events.push_back(e); });
  auto put_back = [](LiveTable& table, std::uint64_t key, const LiveAlloc& a) { *table.try_emplace(key, a).first = a; };
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const Event& e = *it;
    const auto key = live_key(e.device, e.addr);
    switch (e.action) {
      case Action::alloc: allocs_then.erase(key); break;
      case Action::free_completed: put_back(allocs_then, key, LiveAlloc{e.addr, e.size, e.stream, 0, kNoStack, e.device, 0, 0}); break;
      case Action::segment_alloc:
      case Action::segment_map: segs.erase(key); break;
      case Action::segment_free:
      case Action::segment_unmap: put_back(segs, key, LiveAlloc{e.addr, e.size, e.stream, 0, kNoStack, e.device, 1, 0}); break;
      default: break;
    }
  }
  return listed(segs, allocs_then);
}

std::vector<Segment> detail::LiveState::segment_state() const {
  std::vector<Segment> out;
  std::vector<LiveAlloc> sorted;
  tables.allocations().for_each([&](std::uint64_t, const LiveAlloc& a) { sorted.push_back(a); });
  std::sort(sorted.begin(), sorted.end(), [](const LiveAlloc& a, const LiveAlloc& b) { return a.addr < b.addr; });
  tables.segments().for_each([&](std::uint64_t, const LiveAlloc& s) {
    Segment seg;
    seg.addr = s.addr;
    seg.size = s.size;
    seg.stream = s.stream;
    seg.device = s.device;
    auto first = std::lower_bound(sorted.begin(), sorted.end(), s.addr,
                                  [](const LiveAlloc& a, std::uint64_t addr) { return a.addr < addr; });
    for (auto it = first; it != sorted.end() && it->addr < s.addr + s.size; ++it) {
      if (it->device == s.device) seg.blocks.push_back(Block{it->addr, it->size, it->size, 1, it->stack_id});
    }
    out.push_back(std::move(seg));
  });
  std::sort(out.begin(), out.end(), [](const Segment& a, const Segment& b) {
    return std::tie(a.device, a.addr) < std::tie(b.device, b.addr);
  });
  return out;
}

void Recorder::Impl::fail_io() {
  log::once(warned_io, log::Level::warn,
            io.spill.error() + "; recording stops here, the job goes on (what was written stays readable)");
  active.store(false);
  close_spill();
}

void Recorder::Impl::close_spill() {
  std::lock_guard lock(io.mutex);  // a write in flight on another thread ends first
  io.spill.close();
}

bool Recorder::Impl::publish(std::unique_lock<std::mutex>* lock) {
  if (!io.spill.is_open()) return false;
  std::unique_lock io_lock(io.mutex);
  const bool sync = io.spill.take_pending(io.bytes);
  if (io.bytes.empty() && !sync) return true;
  // Whoever took earlier records holds io.mutex until they are written: the order is kept.
  io.in_flight.store(io.bytes.size(), std::memory_order_relaxed);
  if (lock != nullptr) lock->unlock();
  const std::string error = io.spill.write_out(io.bytes, sync);
  io.in_flight.store(0, std::memory_order_relaxed);
  io_lock.unlock();
  if (lock != nullptr) lock->lock();
  if (!error.empty()) {
    io.spill.set_error(error);
    fail_io();
    return false;
  }
  return true;
}

bool Recorder::Impl::flush_history() {
  if (!io.spill.still_linked()) return false;  // one fstat per batch
  // Straight from the history's memory: no copy of the batch's events.
  for (const auto part : history->spans()) {
    if (!part.empty() && !io.spill.write_events(window_id, part)) return false;
    events_written += part.size();
  }
  history->discard();
  return true;
}

void Recorder::Impl::open_window(std::int64_t time) {
  window_open = true;
  history->clear();
  if (!io.spill.write_window_open(window_id, batch, time, live.snapshot()) ||
      !io.spill.write_batch(window_id, BatchMark{batch, time})) {
    fail_io();
  }
}

bool Recorder::Impl::close_window(std::int64_t batch_end, bool oom, std::int64_t time) {
  const auto dropped = history->dropped();
  const bool ok = flush_history() && write_new_stacks() && io.spill.write_segments(window_id, live.segment_state()) &&
                  io.spill.write_window_close(window_id, batch_end, time, oom, dropped) && io.spill.sync();
  dropped_total += dropped;
  history->clear();
  window_open = false;
  ++window_id;
  if (!ok) {
    fail_io();
    return false;
  }
  ++windows_written;
  if (dropped > 0) {
    log::write(log::Level::warn, "window ending at batch " + std::to_string(batch_end) + " dropped " +
                                     std::to_string(dropped) + " events (max_entries = " +
                                     std::to_string(config.max_entries) + ")");
  }
  return true;
}

bool Recorder::Impl::write_adhoc_window(bool oom) {
  const auto live_before = live.before(*history);
  std::int64_t first_time = now_ns();
  history->for_each([&](const Event& e) { first_time = std::min(first_time, e.time_ns); });
  if (!io.spill.write_window_open(window_id, batch, first_time, live_before) ||
      !io.spill.write_batch(window_id, BatchMark{batch, first_time})) {
    fail_io();
    return false;
  }
  window_open = true;
  const bool ok = close_window(batch, oom, now_ns());
  // The history keeps feeding later OOM snapshots.
  return ok;
}

void Recorder::Impl::end_batch_at(std::int64_t time) {
  if (!io.spill.is_open()) return;
  const std::int64_t ended = batch;
  if (window_open) {
    if (policy.closes_at(ended)) {
      close_window(ended, false, time);
    } else if (!flush_history()) {
      fail_io();
      return;
    }
  }
  batch = ended + 1;
  if (!io.spill.is_open()) return;  // the close failed
  if (policy.opens_at(batch)) {
    open_window(time);
  } else if (window_open) {
    if (!io.spill.write_batch(window_id, BatchMark{batch, time})) fail_io();
  } else if (!config.oom_snapshot) {
    history->clear();
  }
}

}  // namespace memsnap
