#include "memsnap/recorder.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "live_table.hpp"
#include "log.hpp"
#include "memsnap/names.hpp"
#include "memsnap/record.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/version.hpp"
#include "stacks.hpp"

namespace memsnap {

// ---------------------------------------------------------------------------------------------
// WindowPolicy

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

// ---------------------------------------------------------------------------------------------
// EventRing

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

// ---------------------------------------------------------------------------------------------
// Recorder

namespace {

std::int64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The hot path's clock. CLOCK_MONOTONIC through the vDSO costs about 20 ns a read. Where the kernel
// keeps time with the TSC itself (clocksource "tsc": invariant, and checked by the kernel to be
// synchronised across CPUs), an event holds raw TSC ticks (about 7 ns a read) until the drain
// converts them to CLOCK_MONOTONIC ns; everything written keeps ns.
struct TickSource {
  bool tsc = false;
  double ns_per_tick = 1.0;  // first estimate; each recorder refines it between drains
};

#if defined(__x86_64__)
inline std::uint64_t read_tsc() noexcept { return __rdtsc(); }

bool kernel_clocksource_is_tsc() noexcept {
  const int fd = ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  return n >= 3 && std::string_view(buf, static_cast<std::size_t>(n)).substr(0, 3) == "tsc" &&
         (n == 3 || buf[3] == '\n');
}
#else
inline std::uint64_t read_tsc() noexcept { return 0; }
bool kernel_clocksource_is_tsc() noexcept { return false; }
#endif

const TickSource& tick_source() noexcept {
  static const TickSource source = [] {
    TickSource s;
    if (!kernel_clocksource_is_tsc()) return s;
    // 200 us of spinning once per process; the drains refine the rate over longer spans.
    const std::uint64_t t0 = read_tsc();
    const std::int64_t n0 = now_ns();
    std::int64_t n1 = n0;
    std::uint64_t t1 = t0;
    while (n1 - n0 < 200'000) {
      t1 = read_tsc();
      n1 = now_ns();
    }
    if (t1 <= t0) return s;
    s.ns_per_tick = static_cast<double>(n1 - n0) / static_cast<double>(t1 - t0);
    s.tsc = s.ns_per_tick > 0.01 && s.ns_per_tick < 100.0;  // 10 MHz .. 100 GHz, else distrust it
    return s;
  }();
  return source;
}

std::int64_t wall_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

constexpr int kMaxDepth = 64;

// One thread's events on their way to the recorder: a single-producer (the owning thread),
// single-consumer (whoever drains, under the recorder's lock) ring.
struct ThreadBuffer {
  static constexpr std::uint64_t kCapacity = 4096;
  explicit ThreadBuffer(int depth) : depth_limit(depth) {
    if (depth > 0) pcs = std::make_unique<std::uintptr_t[]>(kCapacity * depth);
  }
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  std::atomic<bool> retired{false};
  int depth_limit = 0;
  // Consumer side (under the recorder's lock): the last allocator-trace segment event drained
  // from this thread, for dropping CUPTI's copy that follows it (see drain()).
  int trace_segment_kind = 0;  // 0 none, 1 alloc-like, 2 free-like
  std::uint64_t trace_segment_lo = 0, trace_segment_hi = 0;
  Event events[kCapacity];
  std::uint8_t depth[kCapacity] = {};
  std::unique_ptr<std::uintptr_t[]> pcs;
};

// Set while a thread is inside memsnap (a hook re-entered through the allocator is ignored).
// initial-exec: a plain %fs-relative access instead of a __tls_get_addr call per hook.
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_hook = false;
struct HookGuard {
  HookGuard() { t_in_hook = true; }
  ~HookGuard() { t_in_hook = false; }
};

std::atomic<std::uint64_t> g_epoch{0};
std::atomic<Recorder::Impl*> g_global_impl{nullptr};

struct ThreadSlot {
  const void* owner = nullptr;
  std::uint64_t epoch = 0;
  // Shared with the recorder, so that a thread outliving a (test's) recorder still holds memory.
  std::shared_ptr<ThreadBuffer> buffer;
  ~ThreadSlot() {
    if (buffer != nullptr) buffer->retired.store(true, std::memory_order_release);
  }
};
thread_local ThreadSlot t_slot;  // touched only when a thread registers

// What the hot path reads: trivially destructible, so no TLS init guard either.
struct ThreadCache {
  const void* owner;
  std::uint64_t epoch;
  ThreadBuffer* buffer;
};
__attribute__((tls_model("initial-exec"))) thread_local ThreadCache t_cache = {nullptr, 0, nullptr};

// Event::flags in the thread buffers only; cleared when drained.
constexpr std::uint8_t kFromAllocatorTrace = 1;
constexpr std::uint8_t kDropped = 2;  // the drain's mark on CUPTI's copy of an allocator segment event
constexpr std::uint8_t kBatchMark = 4;  // a batch ends here (end_batch()): not an event, a place in the stream

// 1: the segment gains memory (segment_alloc, segment_map), 2: loses it, 0: not a segment event.
int segment_kind(Action a) {
  if (a == Action::segment_alloc || a == Action::segment_map) return 1;
  if (a == Action::segment_free || a == Action::segment_unmap) return 2;
  return 0;
}

// What the segment de-duplication compares: the allocator trace's segment events, and CUPTI's
// view of the same calls (cudaMalloc and cudaFree reach CUPTI as alloc and free_completed,
// cuMemMap and cuMemUnmap as segment_map and segment_unmap). 0: neither.
int dedupe_kind(const Event& e) {
  if ((e.flags & kFromAllocatorTrace) != 0) return segment_kind(e.action);
  if (e.action == Action::alloc) return 1;
  if (e.action == Action::free_completed) return 2;
  return segment_kind(e.action);
}

std::atomic<ForeignFrameResolver> g_foreign_resolver{nullptr};

std::uint64_t live_key(int device, std::uint64_t addr) {
  return addr ^ (static_cast<std::uint64_t>(static_cast<std::uint16_t>(device + 1)) << 48);
}

struct StackKeyHash {
  std::size_t operator()(const std::vector<std::uintptr_t>& v) const noexcept {
    std::size_t h = 1469598103934665603ull;
    for (auto pc : v) h = (h ^ pc) * 1099511628211ull;
    return h;
  }
};

// Whether this process initialised MPI itself: `memsnap run` aggregates in the same slot only when
// it did not (a second MPI_Init there fails). Looks for a loaded libmpi without linking one.
bool process_used_mpi() noexcept {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const char* name = info->dlpi_name;
        if (name != nullptr && std::strstr(name, "libmpi.so") != nullptr) {
          *static_cast<std::string*>(out) = name;
          return 1;
        }
        return 0;
      },
      &path);
  if (path.empty()) return false;
  void* lib = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return false;
  using Query = int (*)(int*);
  int initialized = 0;
  if (auto query = reinterpret_cast<Query>(dlsym(lib, "MPI_Initialized"))) query(&initialized);
  dlclose(lib);
  return initialized != 0;
}

}  // namespace

struct Recorder::Impl {
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

  static void* writer_main(void* arg) {
    auto* s = static_cast<Impl*>(arg);
    t_in_hook = true;  // what this thread allocates is memsnap's own, never recorded
    std::uint32_t seen = 0;
    for (;;) {
      s->writer_wake.wait(seen, std::memory_order_acquire);
      seen = s->writer_wake.load(std::memory_order_acquire);
      if (s->writer_quit.load()) break;
      try {
        std::lock_guard lock(s->mutex);
        if (s->active.load()) s->drain(true);
      } catch (...) {
        log::once(s->warned_internal, log::Level::warn, "internal error in memsnap's writer; recording stops, the job goes on");
        s->active.store(false);
      }
    }
    return nullptr;
  }

  // True while the writer thread runs; starts it on the first call that wants it.
  bool writer_up() {
    if (writer_running.load(std::memory_order_acquire)) return true;
    if (!config.background_writes) return false;  // set before `active`, constant after
    std::lock_guard lock(writer_mutex);
    if (writer_started || writer_refused) return writer_running.load();
    // Signals are for the job's threads: this one blocks them all.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(&writer, nullptr, &Impl::writer_main, this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
      writer_refused = true;
      log::write(log::Level::warn, std::string("cannot start memsnap's writer thread (") + std::strerror(rc) +
                                       "); batches are written on the job's own thread");
      return false;
    }
    pthread_setname_np(writer, "memsnap-writer");
    writer_started = true;
    writer_running.store(true, std::memory_order_release);
    return true;
  }

  // Ends the writer thread; what it left in the rings is drained by the caller.
  void stop_writer() {
    std::lock_guard lock(writer_mutex);
    writer_refused = true;
    if (!writer_started) return;
    writer_running.store(false);
    writer_quit.store(true);
    wake_writer();
    pthread_join(writer, nullptr);
    writer_started = false;
  }

  ThreadBuffer* buffer_for_this_thread(const void* owner) {
    if (t_cache.owner == owner && t_cache.epoch == epoch && t_cache.buffer != nullptr) return t_cache.buffer;
    std::lock_guard lock(mutex);
    std::shared_ptr<ThreadBuffer> buf;
    for (auto& b : buffers) {
      // A retired buffer is reused once drained, so thread churn does not grow memory.
      if (b->retired.load(std::memory_order_acquire) &&
          b->head.load(std::memory_order_acquire) == b->tail.load(std::memory_order_relaxed)) {
        b->retired.store(false, std::memory_order_relaxed);
        buf = b;
        break;
      }
    }
    if (buf == nullptr) {
      buffers.push_back(std::make_shared<ThreadBuffer>(stack_slots));
      buf = buffers.back();
    }
    // This thread's old buffer (of an earlier recorder) is retired with the reference dropped.
    if (t_slot.buffer) t_slot.buffer->retired.store(true, std::memory_order_release);
    t_slot.owner = owner;
    t_slot.epoch = epoch;
    t_slot.buffer = buf;
    t_cache = ThreadCache{owner, epoch, buf.get()};
    return buf.get();
  }

  std::vector<std::string> trim_modules;
  bool in_trimmed_module(std::uintptr_t pc) const {
    if (trim_modules.empty()) return false;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) return false;
    const std::string_view file = info.dli_fname;
    for (const auto& m : trim_modules) {
      if (file.find(m) != std::string_view::npos) return true;
    }
    return false;
  }

  std::uint32_t intern_stack(const std::uintptr_t* pcs, int depth) {
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

  // Live tracking for one event. A source that frees by address only (CUPTI: cudaFree(ptr))
  // records size 0; the size is the allocation's, found by the same lookup.
  void apply_live(Event& e) {
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

  // Moves every thread's pending events, in time order, into live tracking and the history.
  //
  // One segment, two sources: with CUPTI and the PyTorch attachment in one process, the caching
  // allocator's cudaMalloc (or cuMemMap, page by page with expandable segments) reaches CUPTI and
  // the allocator's own trace entry reaches the attachment, on the same thread, back to back.
  // The allocator's event covers CUPTI's range: CUPTI's copies next to it are dropped, before or
  // after it. `hold_back` (a drain because a ring filled) leaves a thread's trailing CUPTI segment
  // events in its ring, so that the allocator's event that follows still finds them.
  //
  // The events are read where they lie in the rings (no copy): a first pass per ring converts
  // the clock and marks CUPTI's duplicates, a second merges the rings by time into the tables.
  void drain(bool hold_back = false) {
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
        while (keep > tail && head - keep < ThreadBuffer::kCapacity / 4) {
          const Event& e = b->events[(keep - 1) & (ThreadBuffer::kCapacity - 1)];
          const int k = dedupe_kind(e);
          if (k == 0 || (e.flags & kFromAllocatorTrace) != 0 || (run_kind != 0 && k != run_kind)) break;
          run_kind = k;
          --keep;
        }
        head = keep;
      }
      for (std::uint64_t i = tail; i < head; ++i) {
        Event& e = b->events[i & (ThreadBuffer::kCapacity - 1)];
        if (tsc_clock) {
          const auto ticks = static_cast<double>(static_cast<std::int64_t>(static_cast<std::uint64_t>(e.time_ns) - base_tick));
          // Extrapolated past the last anchor, a rate off by parts per thousand could put an
          // event after this drain began, past the batch mark that follows: never later than now.
          e.time_ns = std::min(base_ns + static_cast<std::int64_t>(ticks * rate), drained_at);
        }
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
            Event& p = b->events[(j - 1) & (ThreadBuffer::kCapacity - 1)];
            if ((p.flags & kDropped) != 0) continue;
            if (dedupe_kind(p) != kind || p.device != e.device || p.addr < e.addr || p.addr >= hi ||
                (p.flags & kFromAllocatorTrace) != 0) {
              break;
            }
            p.flags |= kDropped;
          }
          b->trace_segment_kind = kind;
          b->trace_segment_lo = e.addr;
          b->trace_segment_hi = hi;
        } else if (b->trace_segment_kind == kind && e.addr >= b->trace_segment_lo && e.addr < b->trace_segment_hi) {
          e.flags |= kDropped;  // CUPTI's copy of the segment the allocator just reported
        }
      }
      runs.push_back(Run{b, tail, head});
    }
    if (runs.empty()) return;
    auto take = [&](Run& r) {
      const std::size_t slot = r.next & (ThreadBuffer::kCapacity - 1);
      ++r.next;
      Event e = r.b->events[slot];
      if ((e.flags & kDropped) != 0) return;
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
          const std::int64_t t = r.b->events[r.next & (ThreadBuffer::kCapacity - 1)].time_ns;
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
  }

  // Segments and allocations of two tables, oldest first: the LIVE record's order.
  static std::vector<LiveAlloc> listed(const LiveTable& segs, const LiveTable& allocs) {
    std::vector<LiveAlloc> out;
    out.reserve(segs.size() + allocs.size());
    segs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
    allocs.for_each([&](std::uint64_t, const LiveAlloc& a) { out.push_back(a); });
    std::sort(out.begin(), out.end(), [](const LiveAlloc& a, const LiveAlloc& b) {
      return std::tie(a.time_ns, a.device, a.addr) < std::tie(b.time_ns, b.device, b.addr);
    });
    return out;
  }

  std::vector<LiveAlloc> live_snapshot() const { return listed(segments, live); }

  // What was live before the events now in the history: live now, with the history undone.
  std::vector<LiveAlloc> live_before_history() const {
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

  // Allocator state at window end: each live segment with the live allocations inside it.
  std::vector<Segment> segment_state() const {
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

  // Steps aside after a write failure: one line, then the job runs on unrecorded.
  void fail_io() {
    log::once(warned_io, log::Level::warn,
              spill.error() + "; recording stops here, the job goes on (what was written stays readable)");
    active.store(false);
    spill.close();
  }

  bool write_new_stacks() {
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

  bool flush_history() {
    if (!spill.still_linked()) return false;  // one fstat per batch
    // Straight from the history's memory: no copy of the batch's events.
    for (const auto part : history->spans()) {
      if (!part.empty() && !spill.write_events(window_id, part)) return false;
      events_written += part.size();
    }
    history->discard();
    return true;
  }

  void open_window(std::int64_t time) {
    window_open = true;
    history->clear();
    window_dropped = 0;
    if (!spill.write_window_open(window_id, batch, time, live_snapshot()) ||
        !spill.write_batch(window_id, BatchMark{batch, time})) {
      fail_io();
    }
  }

  bool close_window(std::int64_t batch_end, bool oom, std::int64_t time) {
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

  // A window outside the schedule (OOM or dump outside a window): the recent history.
  bool write_adhoc_window(bool oom) {
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

  // A batch mark reached the drain at `time`: the batch that was running ends there.
  // Whether it still records is the spill's state, not `active`: stop() clears that first and
  // then drains the marks still in the rings.
  void end_batch_at(std::int64_t time) {
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
};

Recorder::Recorder() : impl_(std::make_unique<Impl>()) {}

Recorder::~Recorder() { stop(); }

Recorder& Recorder::global() {
  // Never destroyed: threads and atexit handlers may still call in during process teardown.
  static Recorder* instance = new Recorder();
  return *instance;
}

namespace {
void stop_global_at_exit() { Recorder::global().stop(); }
void disable_in_fork_child() {
  // The child inherits a copy of a recorder whose lock may be held by a thread that does not
  // exist there: it records nothing and never touches the lock.
  if (Recorder::Impl* impl = g_global_impl.load()) {
    impl->in_fork_child.store(true);
    impl->active.store(false);
    impl->writer_running.store(false);  // the writer thread is not copied
  }
}
}  // namespace

bool Recorder::start(const Config& config, const LaunchInfo& launch, const RecorderOptions& options) noexcept {
  Impl& s = *impl_;
  try {
    std::lock_guard lock(s.mutex);
    if (s.started) {
      // A second capture source in the same process (CUPTI and the PyTorch attachment) joins the
      // recording; a second start of the same source is a mistake worth a line.
      const bool joins = !options.source.empty() && s.meta.source.find(options.source) == std::string::npos;
      if (!joins) {
        log::write(log::Level::warn, "memsnap is already started; the second start is ignored");
        return s.active.load();
      }
      if (!s.active.load()) return false;  // the first start said why
      s.meta.source += "+" + options.source;
      if (s.meta.device_name.empty()) s.meta.device_name = options.device_name;
      s.trim_modules.insert(s.trim_modules.end(), options.trim_modules.begin(), options.trim_modules.end());
      if (!s.spill.write_meta(s.meta)) s.fail_io();  // a later META record replaces the first
      return s.active.load();
    }
    s.started = true;
    log::set_rank(launch.rank);
    if (!config.enabled) {
      log::write(log::Level::info, "disabled by the config (enabled: false)");
      return false;
    }
    s.config = config;
    s.policy = WindowPolicy(config.skip_batches, config.interval, config.repeat);
    s.history = std::make_unique<EventRing>(static_cast<std::size_t>(config.max_entries));
    s.stack_mode = config.stacks;
    s.native_stacks = wants_native(config.stacks);
    s.python_stacks = wants_python(config.stacks);
    s.stack_min_bytes = static_cast<std::uint64_t>(config.stack_min_bytes);
    s.trim_modules = options.trim_modules;
    s.stack_depth = static_cast<int>(std::clamp<std::int64_t>(config.stack_depth + 4, 1, kMaxDepth));
    s.stack_slots = (s.native_stacks ? s.stack_depth : 0) +
                    (s.python_stacks ? static_cast<int>(std::clamp<std::int64_t>(config.stack_depth, 1, kMaxDepth)) : 0);
    if (s.native_stacks) stacks::warm_up();

    RankMeta& m = s.meta;
    m.rank = launch.rank;
    m.local_rank = launch.local_rank;
    m.world_size = launch.world_size;
    m.local_world_size = launch.local_world_size;
    m.node_rank = launch.node_rank;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    m.host = host;
    m.pid = getpid();
    m.run_name = config.run_name.empty() ? default_run_name(launch) : config.run_name;
    m.source = options.source;
    m.device_name = options.device_name;
    m.config_json = config_to_json(config).dump();
    m.tool_version = kVersion;
    m.start_unix_ns = wall_ns();
    m.clock_offset_ns = m.start_unix_ns - now_ns();

    NameVars vars{m.run_name, m.rank, m.local_rank, m.world_size, m.local_world_size, m.node_rank, std::nullopt,
                  timestamp_now()};
    check_run_name(m.run_name);
    const std::filesystem::path folder = format_name(config.folder, vars);
    const std::filesystem::path spill_dir = folder / "spill";
    std::error_code ec;
    std::filesystem::create_directories(spill_dir, ec);
    if (ec) {
      log::write(log::Level::warn, "cannot create " + spill_dir.string() + ": " + ec.message() +
                                       "; this run is not recorded, the job goes on");
      return false;
    }
    // One live recorder per rank and folder: a second run into the same folder at the same time
    // refuses instead of interleaving two records. The kernel drops the lock when we die.
    const std::filesystem::path lock_path = spill_dir / ("rank" + std::to_string(m.rank) + ".lock");
    s.lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s.lock_fd < 0 || ::flock(s.lock_fd, LOCK_EX | LOCK_NB) != 0) {
      char holder[32] = {};
      if (s.lock_fd >= 0) {
        ssize_t n = ::pread(s.lock_fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        ::close(s.lock_fd);
        s.lock_fd = -1;
      }
      log::write(log::Level::warn, "another process (pid " + std::string(holder[0] ? holder : "?") +
                                       ") is recording rank " + std::to_string(m.rank) + " into " + spill_dir.string() +
                                       "; this one is not recorded and the job goes on");
      return false;
    }
    // Released again unless this start succeeds.
    struct LockRelease {
      int& fd;
      bool keep = false;
      ~LockRelease() {
        if (!keep && fd >= 0) {
          ::close(fd);
          fd = -1;
        }
      }
    } lock_release{s.lock_fd};
    // overwrite: false keeps an earlier run's record of this rank untouched, its lock file's
    // contents included (the lock is taken, but the pid is written only once this run records).
    const std::string prefix = "rank" + std::to_string(m.rank) + ".pid";
    std::vector<std::filesystem::path> earlier;
    for (const auto& entry : std::filesystem::directory_iterator(spill_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && entry.path().extension() == kSpillSuffix) earlier.push_back(entry.path());
    }
    if (!earlier.empty() && !config.overwrite) {
      log::write(log::Level::warn, "an earlier record of rank " + std::to_string(m.rank) + " is in " +
                                       spill_dir.string() + " (" + earlier.front().filename().string() +
                                       "); overwrite is false, so this run is not recorded and the job goes on. "
                                       "Set overwrite: true, another folder or another run_name.");
      return false;
    }
    for (const auto& p : earlier) std::filesystem::remove(p, ec);
    const std::string pid_text = std::to_string(m.pid);
    if (::ftruncate(s.lock_fd, 0) == 0) {
      ssize_t ignored = ::pwrite(s.lock_fd, pid_text.data(), pid_text.size(), 0);
      (void)ignored;
    }

    if (!s.spill.open(spill_dir / spill_file_name(m.rank, m.pid)) || !s.spill.write_meta(m)) {
      log::write(log::Level::warn, s.spill.error() + "; this run is not recorded, the job goes on");
      s.spill.close();
      return false;
    }
    s.tsc_clock = tick_source().tsc;
    s.tick_rate = tick_source().ns_per_tick;
    s.tick_anchor = read_tsc();
    s.tick_anchor_ns = now_ns();
    s.epoch = g_epoch.fetch_add(1) + 1;
    s.batch = 1;
    if (s.policy.opens_at(s.batch)) s.open_window(now_ns());
    if (this == &global()) {
      g_global_impl.store(&s);
      static std::once_flag hooks;
      std::call_once(hooks, [] {
        std::atexit(stop_global_at_exit);
        pthread_atfork(nullptr, nullptr, disable_in_fork_child);
      });
    }
    s.active.store(s.spill.is_open());
    lock_release.keep = s.active.load();
    return s.active.load();
  } catch (const std::exception& e) {
    log::write(log::Level::warn, std::string(e.what()) + "; this run is not recorded, the job goes on");
  } catch (...) {
    log::write(log::Level::warn, "unexpected error at start; this run is not recorded, the job goes on");
  }
  s.active.store(false);
  return false;
}

namespace {
bool gains_memory(Action a) { return a == Action::alloc || a == Action::segment_alloc || a == Action::segment_map; }
}  // namespace

bool Recorder::wants_stack(Action action, std::uint64_t size) const noexcept {
  const Impl& s = *impl_;
  if (s.stack_slots == 0) return false;
  return s.stack_min_bytes == 0 || (gains_memory(action) && size >= s.stack_min_bytes);
}

StackMode Recorder::stack_mode() const noexcept { return impl_->stack_mode; }

void Recorder::set_foreign_frame_resolver(ForeignFrameResolver resolver) noexcept { g_foreign_resolver.store(resolver); }

// The hot path of every source: one slot of this thread's ring.
void Recorder::Impl::push(const void* owner, Action action, int device, std::uint64_t addr, std::uint64_t size,
                          std::uint64_t stream, std::uint8_t flags, std::span<const std::uintptr_t> foreign,
                          std::uint64_t tsc_ticks) {
  ThreadBuffer* b = buffer_for_this_thread(owner);
  const std::uint64_t head = b->head.load(std::memory_order_relaxed);
  const std::uint64_t used = head - b->tail.load(std::memory_order_acquire);
  if (used >= ThreadBuffer::kCapacity) [[unlikely]] {
    std::lock_guard lock(mutex);
    // Another thread's drain may have emptied this ring while this one waited for the lock.
    if (head - b->tail.load(std::memory_order_acquire) >= ThreadBuffer::kCapacity) drain(true);
  } else if (used == ThreadBuffer::kCapacity / 2 && writer_running.load(std::memory_order_relaxed)) [[unlikely]] {
    wake_writer();  // a long batch: drained while it runs, so this thread need not
  }
  const std::size_t slot = head & (ThreadBuffer::kCapacity - 1);
  Event& e = b->events[slot];
  e.time_ns = tsc_clock ? static_cast<std::int64_t>(tsc_ticks != 0 ? tsc_ticks : read_tsc()) : now_ns();
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  e.stack_id = kNoStack;
  e.device = static_cast<std::int16_t>(device);
  e.action = action;
  e.flags = flags;
  if (b->depth_limit > 0) {
    int depth = 0;
    if ((flags & kBatchMark) == 0 && (stack_min_bytes == 0 || (gains_memory(action) && size >= stack_min_bytes))) {
      std::uintptr_t* out = b->pcs.get() + slot * b->depth_limit;
      if (native_stacks) depth = stacks::capture(out, stack_depth);
      const int room = b->depth_limit - depth;
      const int n = std::min<int>(room, static_cast<int>(foreign.size()));
      std::copy_n(foreign.data(), n, out + depth);
      depth += n;
    }
    b->depth[slot] = static_cast<std::uint8_t>(depth);
  }
  b->head.store(head + 1, std::memory_order_release);
}

bool Recorder::start_from_environment(const std::string& config_path, const RecorderOptions& options) noexcept {
  try {
    const EnvLookup env = process_env();
    const LaunchInfo launch = detect_launch(env);
    log::set_rank(launch.rank);
    Config config;
    try {
      config = load_config(config_path, env);
    } catch (const ConfigError& e) {
      log::write(log::Level::warn, std::string(e.what()) + "; this run is not recorded, the job goes on");
      return false;
    }
    return start(config, launch, options);
  } catch (...) {
    log::write(log::Level::warn, "could not start; this run is not recorded, the job goes on");
    return false;
  }
}

void Recorder::record(Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept {
  Impl& s = *impl_;
  if (!s.active.load(std::memory_order_relaxed) || t_in_hook) return;
  HookGuard guard;
  try {
    s.push(this, action, device, addr, size, stream, 0, {});
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error while recording; recording stops, the job goes on");
    s.active.store(false);
  }
}

void Recorder::record_from_allocator(Action action, int device, std::uint64_t addr, std::uint64_t size,
                                     std::uint64_t stream, std::span<const std::uintptr_t> foreign,
                                     std::uint64_t tsc_ticks) noexcept {
  Impl& s = *impl_;
  if (!s.active.load(std::memory_order_relaxed) || t_in_hook) return;
  HookGuard guard;
  try {
    if (!s.allocator_trace_seen.load(std::memory_order_relaxed)) s.allocator_trace_seen.store(true, std::memory_order_relaxed);
    s.push(this, action, device, addr, size, stream, kFromAllocatorTrace, foreign, tsc_ticks);
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error while recording; recording stops, the job goes on");
    s.active.store(false);
  }
}

void Recorder::record_oom(int device, std::uint64_t requested, std::uint64_t device_free,
                          std::uint64_t device_total, std::uint64_t stream) noexcept {
  Impl& s = *impl_;
  if (!s.active.load() || t_in_hook) return;
  HookGuard guard;
  try {
    std::lock_guard lock(s.mutex);
    if (!s.active.load()) return;
    s.drain();
    Event e{now_ns(), device_free, requested, stream, kNoStack, static_cast<std::int16_t>(device), Action::oom, 0};
    s.history->push(e);
    ++s.events_seen;
    if (device >= 0) {
      if (s.meta.device_total_bytes.size() <= static_cast<std::size_t>(device)) s.meta.device_total_bytes.resize(device + 1);
      s.meta.device_total_bytes[device] = device_total;
      // A later META record replaces the first: the reader learns the device's total.
      if (!s.spill.write_meta(s.meta)) s.fail_io();
    }
    log::write(log::Level::warn, "out of memory on device " + std::to_string(device) + " in batch " +
                                     std::to_string(s.batch) + " (requested " + std::to_string(requested) +
                                     " bytes, " + std::to_string(device_free) + " free); writing the window now");
    if (s.window_open) {
      s.close_window(s.batch, true, now_ns());
    } else if (s.config.oom_snapshot) {
      s.write_adhoc_window(true);
    }
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error at an OOM; recording stops, the job goes on");
    s.active.store(false);
  }
}

void Recorder::batch_marks_expected() noexcept { impl_->explicit_batch_marks.store(true, std::memory_order_relaxed); }

void Recorder::step_hint() noexcept {
  if (impl_->explicit_batch_marks.load(std::memory_order_relaxed)) return;
  end_batch();
}

void Recorder::step() noexcept {
  impl_->explicit_batch_marks.store(true, std::memory_order_relaxed);
  end_batch();
}

void Recorder::end_batch() noexcept {
  Impl& s = *impl_;
  if (!s.active.load() || t_in_hook) return;
  HookGuard guard;
  try {
    // The batch ends here in this thread's stream of events; whoever drains next ends it there:
    // the writer thread, woken now, or this thread.
    s.push(this, Action::snapshot, -1, 0, 0, 0, kBatchMark, {});
    if (s.writer_up()) {
      s.wake_writer();
      return;
    }
    std::lock_guard lock(s.mutex);
    if (s.active.load()) s.drain();
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error at a batch step; recording stops, the job goes on");
    s.active.store(false);
  }
}

bool Recorder::dump() noexcept {
  Impl& s = *impl_;
  if (!s.active.load() || t_in_hook) return false;
  HookGuard guard;
  try {
    std::lock_guard lock(s.mutex);
    if (!s.active.load()) return false;
    s.drain();
    return s.window_open ? s.close_window(s.batch, false, now_ns()) : s.write_adhoc_window(false);
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error at a dump; recording stops, the job goes on");
    s.active.store(false);
    return false;
  }
}

void Recorder::stop() noexcept {
  Impl& s = *impl_;
  if (t_in_hook || s.in_fork_child.load()) return;
  HookGuard guard;
  try {
    s.stop_writer();  // outside the lock, which the writer takes
    std::lock_guard lock(s.mutex);
    if (s.stopped || !s.started) return;
    s.stopped = true;
    const bool was_active = s.active.exchange(false);
    if (!was_active || !s.spill.is_open()) return;
    s.drain();
    // A window still open when the job ends closes at the batch that was running.
    if (s.window_open && !s.close_window(s.batch, false, now_ns())) return;
    if (!s.spill.write_end(process_used_mpi()) || !s.spill.sync()) {
      s.fail_io();
      return;
    }
    s.spill.close();
    if (s.lock_fd >= 0) ::close(s.lock_fd);
    s.lock_fd = -1;
  } catch (...) {
    log::once(s.warned_internal, log::Level::warn, "internal error at shutdown");
  }
}

bool Recorder::active() const noexcept { return impl_->active.load(); }

RecorderStats Recorder::stats() const noexcept {
  Impl& s = *impl_;
  RecorderStats out;
  if (s.in_fork_child.load()) return out;
  try {
    std::lock_guard lock(s.mutex);
    if (s.active.load()) s.drain();
    out.active = s.active.load();
    out.batch = s.batch;
    out.window_open = s.window_open;
    out.events = s.events_seen;
    out.written = s.events_written;
    out.dropped = s.dropped_total + (s.history ? s.history->dropped() : 0) * (s.window_open ? 1 : 0);
    out.windows = s.windows_written;
    out.live_allocations = s.live.size();
    out.live_bytes = s.live_bytes;
    out.spill_path = s.spill.path().string();
  } catch (...) {
  }
  return out;
}

}  // namespace memsnap
