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

bool Recorder::Impl::in_trimmed_module(std::uintptr_t pc) const {
  if (trim_modules.empty()) return false;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) return false;
  const std::string_view file = info.dli_fname;
  for (const auto& m : trim_modules) {
    if (file.find(m) != std::string_view::npos) return true;
  }
  return false;
}

std::uint32_t Recorder::Impl::intern_stack(const std::uintptr_t* pcs, int depth) {
  // Seen before: one hash lookup. New: trim memsnap's own frames (the hook, the C API) from the
  // top once, and intern the trimmed stack.
  raw_key.assign(pcs, pcs + depth);
  if (auto it = raw_stack_ids.find(raw_key); it != raw_stack_ids.end()) return it->second;
  // The capture machinery sits on top: memsnap's own frames, the trimmed modules, and whatever
  // wraps backtrace() itself (a sanitizer's interceptor). Cut below the deepest of ours among
  // the top frames.
  auto ours = [&](std::uintptr_t pc) {
    return (pc & kForeignFrame) == 0 && (stacks::is_own_frame(pc) || in_trimmed_module(pc));
  };
  int first = 0;
  for (int i = 0; i < std::min(depth, 12); ++i) {
    if (ours(pcs[i])) first = i + 1;
  }
  while (first < depth && ours(pcs[first])) ++first;
  std::vector<std::uintptr_t> key(pcs + first, pcs + depth);
  std::uint32_t id = kNoStack;
  if (!key.empty()) {
    auto [it, inserted] = stack_ids.try_emplace(std::move(key), static_cast<std::uint32_t>(raw_stacks.size()));
    if (inserted) raw_stacks.push_back(it->first);
    id = it->second;
  }
  raw_stack_ids.emplace(raw_key, id);
  return id;
}

void Recorder::Impl::apply_live(Event& e) {
  const std::uint64_t key = live_key(e.device, e.addr);
  switch (e.action) {
    case Action::alloc:
      live_bytes -= live.put(key, LiveAlloc{e.addr, e.size, e.stream, e.time_ns, e.stack_id, e.device, 0, 0});
      live_bytes += e.size;
      break;
    case Action::free_completed: {
      const std::uint64_t size = live.erase_size(key);
      if (size != LiveTable::kAbsent) {
        if (e.size == 0) e.size = size;
        live_bytes -= size;
      }
      break;
    }
    case Action::free_requested:
      if (e.size == 0) {
        if (const LiveAlloc* a = live.find(key)) e.size = a->size;
      }
      break;
    case Action::segment_alloc:
    case Action::segment_map:
      segments.put(key, LiveAlloc{e.addr, e.size, e.stream, e.time_ns, e.stack_id, e.device, 1, 0});
      break;
    case Action::segment_free:
    case Action::segment_unmap: {
      const std::uint64_t size = segments.erase_size(key);
      if (e.size == 0 && size != LiveTable::kAbsent) e.size = size;
      break;
    }
    default:
      break;
  }
}

void Recorder::Impl::drain(bool hold_back) {
  double rate = tick_rate;
  std::uint64_t base_tick = tick_anchor;
  std::int64_t base_ns = tick_anchor_ns;
  std::int64_t drained_at = 0;
  if (tsc_clock) {
    // Piecewise linear between anchors taken at drains at least 1 ms apart: exact at every
    // anchor, so CLOCK_MONOTONIC's own slewing (NTP) is followed.
    const std::uint64_t t = read_tsc();
    const std::int64_t n = now_ns();
    drained_at = n;
    if (n - tick_anchor_ns >= 1'000'000 && t > tick_anchor) {
      rate = static_cast<double>(n - tick_anchor_ns) / static_cast<double>(t - tick_anchor);
      tick_rate = rate;
      tick_anchor = t;
      tick_anchor_ns = n;
    }
  }
  runs.clear();
  for (auto& bp : buffers) {
    ThreadBuffer* b = bp.get();
    const std::uint64_t tail = b->tail.load(std::memory_order_relaxed);
    std::uint64_t head = b->head.load(std::memory_order_acquire);
    if (head == tail) continue;
    if (hold_back && allocator_trace_seen.load(std::memory_order_relaxed)) {
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
    const bool dedupe = allocator_trace_seen.load(std::memory_order_relaxed);
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
    runs.push_back(Run{b, tail, head});
  }
  if (runs.empty()) return;
  auto take = [&](Run& r) {
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
      e.stack_id = intern_stack(r.b->pcs.get() + slot * r.b->depth_limit, r.b->depth[slot]);
    }
    apply_live(e);
    if (window_open || config.oom_snapshot) history->push(e);
    ++events_seen;
  };
  if (runs.size() == 1) {
    // One thread's events are already in order.
    Run& r = runs.front();
    while (r.next < r.end) take(r);
  } else {
    // Each ring is in time order: merge them, the earlier ring first on equal times.
    for (;;) {
      Run* best = nullptr;
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

std::vector<LiveAlloc> Recorder::Impl::listed(const LiveTable& segs, const LiveTable& allocs) {
  std::vector<LiveAlloc> out;
  out.reserve(segs.size() + allocs.size());
  segs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
  allocs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
  std::sort(out.begin(), out.end(), [](const LiveAlloc& a, const LiveAlloc& b) {
    return std::tie(a.time_ns, a.device, a.addr) < std::tie(b.time_ns, b.device, b.addr);
  });
  return out;
}

std::vector<LiveAlloc> Recorder::Impl::live_snapshot() const { return listed(segments, live); }

std::vector<LiveAlloc> Recorder::Impl::live_before_history() const {
  LiveTable allocs = live;
  LiveTable segs = segments;
  std::vector<Event> events;
  history->for_each([&](const Event& e) { events.push_back(e); });
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    const Event& e = *it;
    const auto key = live_key(e.device, e.addr);
    switch (e.action) {
      case Action::alloc: allocs.erase(key); break;
      case Action::free_completed: allocs.put(key, LiveAlloc{e.addr, e.size, e.stream, 0, kNoStack, e.device, 0, 0}); break;
      case Action::segment_alloc:
      case Action::segment_map: segs.erase(key); break;
      case Action::segment_free:
      case Action::segment_unmap: segs.put(key, LiveAlloc{e.addr, e.size, e.stream, 0, kNoStack, e.device, 1, 0}); break;
      default: break;
    }
  }
  return listed(segs, allocs);
}

std::vector<Segment> Recorder::Impl::segment_state() const {
  std::vector<Segment> out;
  std::vector<LiveAlloc> allocs;
  live.for_each([&](std::uint64_t, const LiveAlloc& a) { allocs.push_back(a); });
  std::sort(allocs.begin(), allocs.end(), [](const LiveAlloc& a, const LiveAlloc& b) { return a.addr < b.addr; });
  segments.for_each([&](std::uint64_t, const LiveAlloc& s) {
    Segment seg;
    seg.addr = s.addr;
    seg.size = s.size;
    seg.stream = s.stream;
    seg.device = s.device;
    auto first = std::lower_bound(allocs.begin(), allocs.end(), s.addr,
                                  [](const LiveAlloc& a, std::uint64_t addr) { return a.addr < addr; });
    for (auto it = first; it != allocs.end() && it->addr < s.addr + s.size; ++it) {
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
            spill.error() + "; recording stops here, the job goes on (what was written stays readable)");
  active.store(false);
  close_spill();
}

void Recorder::Impl::close_spill() {
  std::lock_guard io(io_mutex);  // a write in flight on another thread ends first
  spill.close();
}

bool Recorder::Impl::publish(std::unique_lock<std::mutex>* lock) {
  if (!spill.is_open()) return false;
  std::unique_lock io(io_mutex);
  const bool sync = spill.take_pending(io_bytes);
  if (io_bytes.empty() && !sync) return true;
  // Whoever took earlier records holds io_mutex until they are written: the order is kept.
  io_in_flight.store(io_bytes.size(), std::memory_order_relaxed);
  if (lock != nullptr) lock->unlock();
  const std::string error = spill.write_out(io_bytes, sync);
  io_in_flight.store(0, std::memory_order_relaxed);
  io.unlock();
  if (lock != nullptr) lock->lock();
  if (!error.empty()) {
    spill.set_error(error);
    fail_io();
    return false;
  }
  return true;
}

bool Recorder::Impl::write_new_stacks() {
  if (stack_slots == 0 || stacks_written == raw_stacks.size()) return true;
  // One symboliser for the process's life: loading debug info is the expensive part.
  std::vector<Stack> fresh;
  const ForeignFrameResolver foreign = g_foreign_resolver.load();
  for (std::size_t i = stacks_written; i < raw_stacks.size(); ++i) {
    Stack s;
    for (auto pc : raw_stacks[i]) {
      auto [it, inserted] = frame_ids.try_emplace(pc, static_cast<std::uint32_t>(frames.size()));
      if (inserted) {
        if ((pc & kForeignFrame) != 0) {
          frames.push_back(foreign != nullptr ? foreign(pc) : Frame{"<frame>", "", 0});
        } else {
          if (!symbolizer) symbolizer = std::make_unique<stacks::Symbolizer>();
          frames.push_back(symbolizer->resolve(pc));
        }
      }
      s.push_back(it->second);
    }
    fresh.push_back(std::move(s));
  }
  if (frames.size() > frames_written) {
    if (!spill.write_frames(static_cast<std::uint32_t>(frames_written),
                            std::span<const Frame>(frames).subspan(frames_written))) return false;
    frames_written = frames.size();
  }
  if (!spill.write_stacks(static_cast<std::uint32_t>(stacks_written), fresh)) return false;
  stacks_written = raw_stacks.size();
  return true;
}

bool Recorder::Impl::flush_history() {
  if (!spill.still_linked()) return false;  // one fstat per batch
  // Straight from the history's memory: no copy of the batch's events.
  for (const auto part : history->spans()) {
    if (!part.empty() && !spill.write_events(window_id, part)) return false;
    events_written += part.size();
  }
  history->discard();
  return true;
}

void Recorder::Impl::open_window(std::int64_t time) {
  window_open = true;
  history->clear();
  window_dropped = 0;
  if (!spill.write_window_open(window_id, batch, time, live_snapshot()) ||
      !spill.write_batch(window_id, BatchMark{batch, time})) {
    fail_io();
  }
}

bool Recorder::Impl::close_window(std::int64_t batch_end, bool oom, std::int64_t time) {
  const auto dropped = history->dropped();
  const bool ok = flush_history() && write_new_stacks() && spill.write_segments(window_id, segment_state()) &&
                  spill.write_window_close(window_id, batch_end, time, oom, dropped) && spill.sync();
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
  const auto live_before = live_before_history();
  std::int64_t first_time = now_ns();
  history->for_each([&](const Event& e) { first_time = std::min(first_time, e.time_ns); });
  if (!spill.write_window_open(window_id, batch, first_time, live_before) ||
      !spill.write_batch(window_id, BatchMark{batch, first_time})) {
    fail_io();
    return false;
  }
  window_open = true;
  const bool ok = close_window(batch, oom, now_ns());
  // The history keeps feeding later OOM snapshots.
  return ok;
}

void Recorder::Impl::end_batch_at(std::int64_t time) {
  if (!spill.is_open()) return;
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
  if (!spill.is_open()) return;  // the close failed
  if (policy.opens_at(batch)) {
    open_window(time);
  } else if (window_open) {
    if (!spill.write_batch(window_id, BatchMark{batch, time})) fail_io();
  } else if (!config.oom_snapshot) {
    history->clear();
  }
}

}  // namespace memsnap
