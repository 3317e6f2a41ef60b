// The recorder's inside, shared by its two halves: recorder.cpp (the job's threads: the hot path
// into per-thread rings, start, stop, the writer thread) and recorder_drain.cpp (the consumer:
// rings drained in time order into live tables, the window history and the spill).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <pthread.h>

#include "live_table.hpp"
#include "memsnap/record.hpp"
#include "memsnap/recorder.hpp"
#include "memsnap/spill.hpp"
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

inline std::uint64_t live_key(int device, std::uint64_t addr) {
  return addr ^ (static_cast<std::uint64_t>(static_cast<std::uint16_t>(device + 1)) << 48);
}

struct StackKeyHash {
  std::size_t operator()(const std::vector<std::uintptr_t>& v) const noexcept {
    std::size_t h = 1469598103934665603ull;
    for (auto pc : v) h = (h ^ pc) * 1099511628211ull;
    return h;
  }
};

}  // namespace detail

struct Recorder::Impl {
  using ThreadBuffer = detail::ThreadBuffer;
  using StackKeyHash = detail::StackKeyHash;

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

  std::mutex mutex;  // everything below; taken only by memsnap's own code
  // The spill's file descriptor (writes, sync, close). Taken after `mutex` when both are held.
  std::mutex io_mutex;
  std::vector<char> io_bytes;  // under io_mutex: the records being written
  std::atomic<std::size_t> io_in_flight{0};  // their size while they are
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  bool started = false;
  bool stopped = false;
  Config config;
  RankMeta meta;
  WindowPolicy policy{1, 3, 0};
  SpillWriter spill;
  std::int64_t batch = 1;
  bool window_open = false;
  std::uint32_t window_id = 0;  // id of the open window, or the next one
  std::uint64_t window_dropped = 0;
  std::unique_ptr<EventRing> history;
  LiveTable live;      // allocations
  LiveTable segments;  // reserved memory
  std::uint64_t live_bytes = 0;
  std::uint64_t events_seen = 0, events_written = 0, dropped_total = 0, windows_written = 0;
  // Set by the first allocator-trace event, before it is in a ring: a ring's first drain already
  // holds back CUPTI's trailing segment events. Written once, read per drain.
  std::atomic<bool> allocator_trace_seen{false};
  // Hot-path ticks to ns (see TickSource): the last anchor and the rate since the one before.
  std::uint64_t tick_anchor = 0;
  std::int64_t tick_anchor_ns = 0;
  double tick_rate = 1.0;
  struct Run {
    ThreadBuffer* b;
    std::uint64_t next, end;
  };
  std::vector<Run> runs;  // the drain's rings with events, reused

  // The writer thread (config.background_writes): a batch end, or a ring half full, wakes it; it
  // drains, writes and syncs, so the job's threads only fill their rings. Started at the first
  // batch end; without it the thread that ends a batch drains in place.
  std::mutex writer_mutex;  // its start and stop
  pthread_t writer{};
  bool writer_started = false;  // under writer_mutex
  bool writer_refused = false;  // stopped, or it could not start
  std::atomic<bool> writer_running{false};
  std::atomic<bool> writer_quit{false};
  std::atomic<std::uint32_t> writer_wake{0};

  // Native stacks: raw return-address stacks interned by value; symbolised when written.
  std::unordered_map<std::vector<std::uintptr_t>, std::uint32_t, StackKeyHash> stack_ids;
  std::vector<std::vector<std::uintptr_t>> raw_stacks;
  std::unordered_map<std::vector<std::uintptr_t>, std::uint32_t, StackKeyHash> raw_stack_ids;  // untrimmed
  std::vector<std::uintptr_t> raw_key;
  std::unordered_map<std::uintptr_t, std::uint32_t> frame_ids;
  std::vector<Frame> frames;
  std::unique_ptr<stacks::Symbolizer> symbolizer;
  std::size_t frames_written = 0, stacks_written = 0;
  std::atomic<bool> warned_io{false}, warned_internal{false};

  // tsc_ticks: the caller's own TSC reading of the event (0: read it here); used where the
  // recorder keeps TSC ticks.
  void push(const void* owner, Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
            std::uint8_t flags, std::span<const std::uintptr_t> foreign, std::uint64_t tsc_ticks = 0);

  void wake_writer() noexcept {
    writer_wake.fetch_add(1, std::memory_order_release);
    writer_wake.notify_one();
  }

  static void* writer_main(void* arg);

  // True while the writer thread runs; starts it on the first call that wants it.
  bool writer_up();

  // Ends the writer thread; what it left in the rings is drained by the caller.
  void stop_writer();

  // This thread's first event for this recorder: a ring of its own (the hot path checks a
  // thread-local cache first).
  [[gnu::noinline]] ThreadBuffer* register_this_thread(const void* owner);

  std::vector<std::string> trim_modules;
  bool in_trimmed_module(std::uintptr_t pc) const;

  std::uint32_t intern_stack(const std::uintptr_t* pcs, int depth);

  // Live tracking for one event. A source that frees by address only (CUPTI: cudaFree(ptr))
  // records size 0; the size is the allocation's, found by the same lookup.
  void apply_live(Event& e);

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

  // Segments and allocations of two tables, oldest first: the LIVE record's order.
  static std::vector<LiveAlloc> listed(const LiveTable& segs, const LiveTable& allocs);

  std::vector<LiveAlloc> live_snapshot() const;

  // What was live before the events now in the history: live now, with the history undone.
  std::vector<LiveAlloc> live_before_history() const;

  // Allocator state at window end: each live segment with the live allocations inside it.
  std::vector<Segment> segment_state() const;

  // Steps aside after a write failure: one line, then the job runs on unrecorded.
  void fail_io();
  // Closes the spill once no write of it is in flight (under io_mutex).
  void close_spill();

  // The spill is buffered (SpillWriter::set_buffered): what the drain and the window records
  // append under `mutex` reaches the file here, in order, under `io_mutex`. With `lock` (held on
  // entry and on return) `mutex` is let go while the bytes are written and synced: the job's
  // threads drain their rings meanwhile instead of waiting on the disk. Without it (start, OOM,
  // dump, stop) the write is done before the caller goes on. False after a failed write, which
  // has stepped aside.
  bool publish(std::unique_lock<std::mutex>* lock);
  // A full ring's drain leaves the writing to the writer thread, unless this much is waiting or
  // being written: then the draining thread waits for the disk too. Every recording thread is
  // held back alike, so that no batch outgrows max_entries because its end was held back.
  static constexpr std::size_t kMaxPendingBytes = std::size_t{16} << 20;
  bool writer_keeps_up() const {
    return spill.pending_bytes() + io_in_flight.load(std::memory_order_relaxed) < kMaxPendingBytes;
  }

  bool write_new_stacks();

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
