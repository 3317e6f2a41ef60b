// The recorder's inside, shared by its two halves: recorder.cpp (the job's threads: the hot path
// into per-thread rings, start, stop, the writer thread) and recorder_drain.cpp (the consumer:
// rings drained in time order into live tables, the window history and the spill). Its parts:
// the rings (Rings, ThreadBuffer), the spill and its I/O (SpillIo), the writer thread
// (WriterThread), what is live (LiveState) and the stack interner (stack_interner.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <pthread.h>

#include "memsnap/detail/flat_map.hpp"
#include "memsnap/live_tables.hpp"
#include "memsnap/record.hpp"
#include "memsnap/recorder.hpp"
#include "memsnap/spill.hpp"
#include "stack_interner.hpp"
#include "stacks.hpp"

namespace memsnap {
namespace detail {

constexpr int kMaxDepth = 64;

// One thread's events on their way to the recorder: a single-producer (the owning thread),
// single-consumer (whoever drains, under the recorder's lock) ring.
struct ThreadBuffer {
  // Events a ring holds: a long batch's worth, so that the writer thread drains it while the job
  // runs on (640 KiB a recording thread). With stacks each slot also holds its frames, and the
  // ring is kept smaller.
  static constexpr std::uint64_t kCapacity = 16384;
  static constexpr std::uint64_t kCapacityWithStacks = 4096;
  explicit ThreadBuffer(int depth)
      : capacity(depth > 0 ? kCapacityWithStacks : kCapacity), mask(capacity - 1), depth_limit(depth),
        dropped(std::make_unique<bool[]>(capacity)), events(std::make_unique<Event[]>(capacity)),
        depth(std::make_unique<std::uint8_t[]>(capacity)) {
    if (depth > 0) pcs = std::make_unique<std::uintptr_t[]>(capacity * depth);
  }
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  // Read-only after construction, read by both sides.
  alignas(64) const std::uint64_t capacity;  // a power of two
  const std::uint64_t mask;
  const int depth_limit;
  std::atomic<bool> retired{false};
  // Consumer side (under the recorder's lock): the last allocator-trace segment event drained
  // from this thread, for dropping CUPTI's copy that follows it (see drain()).
  int trace_segment_kind = 0;  // 0 none, 1 alloc-like, 2 free-like
  std::uint64_t trace_segment_lo = 0, trace_segment_hi = 0;
  // Consumer side: the drain's marks on CUPTI's copies of allocator segment events. The drain
  // only reads the producer's slots: a line it wrote would bounce back to the producing core.
  std::unique_ptr<bool[]> dropped;
  std::unique_ptr<Event[]> events;
  std::unique_ptr<std::uint8_t[]> depth;
  std::unique_ptr<std::uintptr_t[]> pcs;
};

// Event::flags in the thread buffers only; cleared when drained.
constexpr std::uint8_t kFromAllocatorTrace = 1;
constexpr std::uint8_t kBatchMark = 4;  // a batch ends here (end_batch()): not an event, a place in the stream

// 1: the segment gains memory (segment_alloc, segment_map), 2: loses it, 0: not a segment event.
inline int segment_kind(Action a) {
  if (a == Action::segment_alloc || a == Action::segment_map) return 1;
  if (a == Action::segment_free || a == Action::segment_unmap) return 2;
  return 0;
}

// What the segment de-duplication compares: the allocator trace's segment events, and CUPTI's
// view of the same calls (cudaMalloc and cudaFree reach CUPTI as alloc and free_completed,
// cuMemMap and cuMemUnmap as segment_map and segment_unmap). 0: neither.
inline int dedupe_kind(const Event& e) {
  if ((e.flags & kFromAllocatorTrace) != 0) return segment_kind(e.action);
  if (e.action == Action::alloc) return 1;
  if (e.action == Action::free_completed) return 2;
  return segment_kind(e.action);
}

// Set by Recorder::set_foreign_frame_resolver: names the frames a source captured itself.
extern std::atomic<ForeignFrameResolver> g_foreign_resolver;

// The rings of the job's threads, one each, and the drain's view of them. Under the recorder's
// lock, except allocator_trace_seen.
struct Rings {
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  // Set by the first allocator-trace event, before it is in a ring: a ring's first drain already
  // holds back CUPTI's trailing segment events. Written once, read per drain.
  std::atomic<bool> allocator_trace_seen{false};
  struct Run {
    ThreadBuffer* b;
    std::uint64_t next, end;
  };
  std::vector<Run> runs;  // the drain's rings with events, reused
};

// Hot-path ticks to ns (see TickSource): the last anchor and the rate since the one before.
struct TickAnchor {
  std::uint64_t tick = 0;
  std::int64_t ns = 0;
  double rate = 1.0;
};

// The writer thread (config.background_writes): a batch end, or a ring half full, wakes it; it
// drains, writes and syncs, so the job's threads only fill their rings. Started at the first
// batch end (Recorder::Impl::writer_up); without it the thread that ends a batch drains in place.
struct WriterThread {
  std::mutex mutex;  // its start and stop
  pthread_t thread{};
  bool started = false;  // under mutex
  bool refused = false;  // stopped, or it could not start
  std::atomic<bool> running{false};
  std::atomic<bool> quit{false};
  std::atomic<std::uint32_t> wake_count{0};

  void wake() noexcept {
    wake_count.fetch_add(1, std::memory_order_release);
    wake_count.notify_one();
  }
  // Ends the thread; what it left in the rings is drained by the caller.
  void stop();
};

// The spill and its I/O. The spill is buffered (SpillWriter::set_buffered): what the recorder
// appends under its lock reaches the file through Recorder::Impl::publish, under `mutex`.
struct SpillIo {
  SpillWriter spill;
  // The spill's file descriptor (writes, sync, close). Taken after the recorder's lock when both
  // are held.
  std::mutex mutex;
  std::vector<char> bytes;                // under mutex: the records being written
  std::atomic<std::size_t> in_flight{0};  // their size while they are
  // A full ring's drain leaves the writing to the writer thread, unless this much is waiting or
  // being written: then the draining thread waits for the disk too. Every recording thread is
  // held back alike, so that no batch outgrows max_entries because its end was held back.
  static constexpr std::size_t kMaxPendingBytes = std::size_t{16} << 20;
  bool keeps_up() const {
    return spill.pending_bytes() + in_flight.load(std::memory_order_relaxed) < kMaxPendingBytes;
  }
};

// What is live now: allocations and reserved segments, by live_key (the rule of
// memsnap/live_tables.hpp, shared with the replay of a window). Under the recorder's lock.
using LiveTable = FlatMap<LiveAlloc>;
struct LiveState {
  LiveTables<LiveAlloc> tables{1024};

  // Live tracking for one event. A source that frees by address only (CUPTI: cudaFree(ptr))
  // records size 0; the size is the allocation's, found by the same lookup.
  void apply(Event& e);
  // Segments and allocations, oldest first: the LIVE record's order.
  std::vector<LiveAlloc> snapshot() const;
  // What was live before `history`'s events: live now, with them undone.
  std::vector<LiveAlloc> before(const EventRing& history) const;
  // Allocator state at window end: each live segment with the live allocations inside it.
  std::vector<Segment> segment_state() const;
};

}  // namespace detail

struct Recorder::Impl {
  using ThreadBuffer = detail::ThreadBuffer;

  // Read on every hot-path call.
  std::atomic<bool> active{false};
  std::atomic<bool> in_fork_child{false};  // a fork() copy: never touch the lock or the file
  int lock_fd = -1;                         // flock on spill/rank<R>.lock while recording
  bool tsc_clock = false;  // events hold TSC ticks until drained (see TickSource)
  bool native_stacks = false;
  bool python_stacks = false;
  int stack_depth = 0;        // native entries per captured stack
  int stack_slots = 0;        // entries per thread-buffer slot: native plus foreign
  std::uint64_t stack_min_bytes = 0;
  StackMode stack_mode = StackMode::none;
  std::atomic<bool> explicit_batch_marks{false};
  std::uint64_t epoch = 0;

  std::mutex mutex;  // everything below but `io` and `writer`; taken only by memsnap's own code
  detail::SpillIo io;
  detail::Rings rings;
  detail::WriterThread writer;
  bool started = false;
  bool stopped = false;
  Config config;
  RankMeta meta;
  detail::TickAnchor ticks;

  // The window schedule and the open window's history.
  WindowPolicy policy{1, 3, 0};
  std::int64_t batch = 1;
  bool window_open = false;
  std::uint32_t window_id = 0;  // id of the open window, or the next one
  std::unique_ptr<EventRing> history;
  detail::LiveState live;
  detail::StackInterner interner;  // native stacks, interned by value; symbolised when written
  std::uint64_t events_seen = 0, events_written = 0, dropped_total = 0, windows_written = 0;
  std::atomic<bool> warned_io{false}, warned_internal{false};

  // tsc_ticks: the caller's own TSC reading of the event (0: read it here); used where the
  // recorder keeps TSC ticks.
  void push(const void* owner, Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
            std::uint8_t flags, std::span<const std::uintptr_t> foreign, std::uint64_t tsc_ticks = 0);

  // This thread's first event for this recorder: a ring of its own (the hot path checks a
  // thread-local cache first).
  [[gnu::noinline]] ThreadBuffer* register_this_thread(const void* owner);

  static void* writer_main(void* arg);
  // True while the writer thread runs; starts it on the first call that wants it.
  bool writer_up();

  // Moves every thread's pending events, in time order, into live tracking and the history.
  //
  // One segment, two sources: with CUPTI and the PyTorch attachment in one process, the caching
  // allocator's cudaMalloc (or cuMemMap, page by page with expandable segments) reaches CUPTI and
  // the allocator's own trace entry reaches the attachment, on the same thread, back to back.
  // The allocator's event covers CUPTI's range: CUPTI's copies next to it are dropped, before or
  // after it. `hold_back` (a drain because a ring filled) leaves a thread's trailing CUPTI segment
  // events in its ring, so that the allocator's event that follows still finds them.
  //
  // The events are read where they lie in the rings, never written there: a first pass per ring
  // marks CUPTI's duplicates, a second merges the rings by time (in the hot path's clock, whose
  // conversion keeps the order) into the tables, converting each event's time as it goes.
  void drain(bool hold_back = false);

  // An internal error in an entry point or the writer thread: one line (once), then the job
  // runs on unrecorded. `where`: "while recording", "at an OOM", ...
  [[gnu::cold, gnu::noinline]] void step_aside(const char* where) noexcept;
  // Steps aside after a write failure: one line, then the job runs on unrecorded.
  void fail_io();
  // Closes the spill once no write of it is in flight (under io.mutex).
  void close_spill();

  // What the drain and the window records append under `mutex` reaches the file here, in order,
  // under `io.mutex`. With `lock` (held on entry and on return) `mutex` is let go while the bytes
  // are written and synced: the job's threads drain their rings meanwhile instead of waiting on
  // the disk. Without it (start, OOM, dump, stop) the write is done before the caller goes on.
  // False after a failed write, which has stepped aside.
  bool publish(std::unique_lock<std::mutex>* lock);

  bool write_new_stacks() { return stack_slots == 0 || interner.write_new(io.spill); }

  bool flush_history();

  void open_window(std::int64_t time);

  bool close_window(std::int64_t batch_end, bool oom, std::int64_t time);

  // A window outside the schedule (OOM or dump outside a window): the recent history.
  bool write_adhoc_window(bool oom);

  // A batch mark reached the drain at `time`: the batch that was running ends there.
  // Whether it still records is the spill's state, not `active`: stop() clears that first and
  // then drains the marks still in the rings.
  void end_batch_at(std::int64_t time);
};

}  // namespace memsnap
