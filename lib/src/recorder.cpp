// The recorder, the job's side: start and stop, the hot path into per-thread rings, batch ends,
// OOM, and memsnap's writer thread. What drains the rings is in recorder_drain.cpp.
#include "memsnap/recorder.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <nlohmann/json.hpp>

#include "clock.hpp"
#include "log.hpp"
#include "memsnap/names.hpp"
#include "memsnap/record.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/version.hpp"
#include "recorder_impl.hpp"
#include "stacks.hpp"

namespace memsnap {

using namespace detail;

std::atomic<ForeignFrameResolver> detail::g_foreign_resolver{nullptr};

namespace {

// Set while a thread is inside memsnap (a hook re-entered through the allocator is ignored).
// initial-exec: a plain %fs-relative access instead of a __tls_get_addr call per hook.
__attribute__((tls_model("initial-exec"))) thread_local bool t_in_hook = false;
struct HookGuard {
  HookGuard() { t_in_hook = true; }
  ~HookGuard() { t_in_hook = false; }
};

// Who may enter: `hot` and `active` (the job's hooks) while recording, `hot` with a relaxed load
// (record, record_from_allocator); `shutdown` (stop) whenever this is not a fork() copy.
enum class Gate { hot, active, shutdown };

// Every entry point of the job's threads: inactive or re-entered? return. Otherwise `body` runs
// with the re-entry guard set; an exception out of it is one line (once) and the recorder steps
// aside (stop() has stepped aside already), and the entry returns what it returns when skipped:
// nothing, or false.
template <Gate G, class Body>
[[gnu::always_inline]] inline auto guarded(Recorder::Impl& s, const char* where, Body&& body) noexcept {
  using R = decltype(body());
  if constexpr (G == Gate::shutdown) {
    if (t_in_hook || s.in_fork_child.load()) return R();
  } else {
    if (!s.active.load(G == Gate::hot ? std::memory_order_relaxed : std::memory_order_seq_cst) || t_in_hook) return R();
  }
  HookGuard guard;
  try {
    return body();
  } catch (...) {
    if constexpr (G == Gate::shutdown) {
      log::once(s.warned_internal, log::Level::warn, std::string("internal error ") + where);
    } else {
      s.step_aside(where);
    }
  }
  return R();
}

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

void* Recorder::Impl::writer_main(void* arg) {
  auto* s = static_cast<Impl*>(arg);
  t_in_hook = true;  // what this thread allocates is memsnap's own, never recorded
  std::uint32_t seen = 0;
  for (;;) {
    s->writer.wake_count.wait(seen, std::memory_order_acquire);
    seen = s->writer.wake_count.load(std::memory_order_acquire);
    if (s->writer.quit.load()) break;
    try {
      std::unique_lock lock(s->mutex);
      if (s->active.load()) {
        s->drain(true);
        s->publish(&lock);
      }
    } catch (...) {
      s->step_aside("in memsnap's writer");
    }
  }
  return nullptr;
}

bool Recorder::Impl::writer_up() {
  if (writer.running.load(std::memory_order_acquire)) return true;
  if (!config.background_writes) return false;  // set before `active`, constant after
  std::lock_guard lock(writer.mutex);
  if (writer.started || writer.refused) return writer.running.load();
  // Signals are for the job's threads: this one blocks them all.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int rc = pthread_create(&writer.thread, nullptr, &Impl::writer_main, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    writer.refused = true;
    log::write(log::Level::warn, std::string("cannot start memsnap's writer thread (") + std::strerror(rc) +
                                     "); batches are written on the job's own thread");
    return false;
  }
  pthread_setname_np(writer.thread, "memsnap-writer");
  writer.started = true;
  writer.running.store(true, std::memory_order_release);
  return true;
}

void detail::WriterThread::stop() {
  std::lock_guard lock(mutex);
  refused = true;
  if (!started) return;
  running.store(false);
  quit.store(true);
  wake();
  pthread_join(thread, nullptr);
  started = false;
}

ThreadBuffer* Recorder::Impl::register_this_thread(const void* owner) {
  std::lock_guard lock(mutex);
  std::shared_ptr<ThreadBuffer> buf;
  for (auto& b : rings.buffers) {
    // A retired buffer is reused once drained, so thread churn does not grow memory.
    if (b->retired.load(std::memory_order_acquire) &&
        b->head.load(std::memory_order_acquire) == b->tail.load(std::memory_order_relaxed)) {
      b->retired.store(false, std::memory_order_relaxed);
      buf = b;
      break;
    }
  }
  if (buf == nullptr) {
    rings.buffers.push_back(std::make_shared<ThreadBuffer>(stack_slots));
    buf = rings.buffers.back();
  }
  // This thread's old buffer (of an earlier recorder) is retired with the reference dropped.
  if (t_slot.buffer) t_slot.buffer->retired.store(true, std::memory_order_release);
  t_slot.owner = owner;
  t_slot.epoch = epoch;
  t_slot.buffer = buf;
  t_cache = ThreadCache{owner, epoch, buf.get()};
  return buf.get();
}

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
    impl->writer.running.store(false);  // the writer thread is not copied
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
      s.interner.trim_modules.insert(s.interner.trim_modules.end(), options.trim_modules.begin(),
                                     options.trim_modules.end());
      if (!s.io.spill.write_meta(s.meta)) s.fail_io();  // a later META record replaces the first
      s.publish(nullptr);
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
    s.interner.trim_modules = options.trim_modules;
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
    // The launch that started this process (`memsnap run` names it): what a store is made of.
    if (const char* launch_id = std::getenv("MEMSNAP_LAUNCH")) m.launch = launch_id;
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

    if (!s.io.spill.open(spill_dir / spill_file_name(m.rank, m.pid)) || !s.io.spill.write_meta(m)) {
      log::write(log::Level::warn, s.io.spill.error() + "; this run is not recorded, the job goes on");
      s.io.spill.close();
      return false;
    }
    s.io.spill.set_buffered(true);
    s.tsc_clock = tick_source().tsc;
    s.ticks.rate = tick_source().ns_per_tick;
    s.ticks.tick = read_tsc();
    s.ticks.ns = now_ns();
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
    s.active.store(s.publish(nullptr));
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
  ThreadBuffer* b = t_cache.buffer;
  if (t_cache.owner != owner || t_cache.epoch != epoch || b == nullptr) [[unlikely]] b = register_this_thread(owner);
  const std::uint64_t head = b->head.load(std::memory_order_relaxed);
  const std::uint64_t used = head - b->tail.load(std::memory_order_acquire);
  if (used >= b->capacity) [[unlikely]] {
    std::unique_lock lock(mutex);
    // Another thread's drain may have emptied this ring while this one waited for the lock.
    if (head - b->tail.load(std::memory_order_acquire) >= b->capacity) drain(true);
    // What the drain wrote (a batch mark in the ring closes a batch) is the writer's, unless it
    // is far behind.
    if (writer.running.load(std::memory_order_relaxed) && io.keeps_up()) {
      if (io.spill.pending_bytes() > 0) writer.wake();
    } else {
      publish(&lock);
    }
  } else if (used == b->capacity / 2 && writer.running.load(std::memory_order_relaxed)) [[unlikely]] {
    writer.wake();  // a long batch: drained while it runs, so this thread need not
  }
  const std::size_t slot = head & b->mask;
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
    // A config that does not load means "do not record", never "record with the defaults".
    const std::optional<Config> config = recording_config(config_path, env);
    if (!config) return false;
    return start(*config, launch, options);
  } catch (...) {
    log::write(log::Level::warn, "could not start; this run is not recorded, the job goes on");
    return false;
  }
}

void Recorder::record(Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept {
  Impl& s = *impl_;
  guarded<Gate::hot>(s, "while recording", [&] { s.push(this, action, device, addr, size, stream, 0, {}); });
}

void Recorder::record_from_allocator(Action action, int device, std::uint64_t addr, std::uint64_t size,
                                     std::uint64_t stream, std::span<const std::uintptr_t> foreign,
                                     std::uint64_t tsc_ticks) noexcept {
  Impl& s = *impl_;
  guarded<Gate::hot>(s, "while recording", [&] {
    auto& seen = s.rings.allocator_trace_seen;
    if (!seen.load(std::memory_order_relaxed)) seen.store(true, std::memory_order_relaxed);
    s.push(this, action, device, addr, size, stream, kFromAllocatorTrace, foreign, tsc_ticks);
  });
}

void Recorder::record_oom(int device, std::uint64_t requested, std::uint64_t device_free,
                          std::uint64_t device_total, std::uint64_t stream) noexcept {
  Impl& s = *impl_;
  guarded<Gate::active>(s, "at an OOM", [&] {
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
      if (!s.io.spill.write_meta(s.meta)) s.fail_io();
    }
    log::write(log::Level::warn, "out of memory on device " + std::to_string(device) + " in batch " +
                                     std::to_string(s.batch) + " (requested " + std::to_string(requested) +
                                     " bytes, " + std::to_string(device_free) + " free); writing the window now");
    if (s.window_open) {
      s.close_window(s.batch, true, now_ns());
    } else if (s.config.oom_snapshot) {
      s.write_adhoc_window(true);
    }
    s.publish(nullptr);  // on disk before the job reacts to its OOM
  });
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
  guarded<Gate::active>(s, "at a batch step", [&] {
    // The batch ends here in this thread's stream of events; whoever drains next ends it there:
    // the writer thread, woken now, or this thread.
    s.push(this, Action::snapshot, -1, 0, 0, 0, kBatchMark, {});
    if (s.writer_up()) {
      s.writer.wake();
      return;
    }
    std::unique_lock lock(s.mutex);
    if (s.active.load()) {
      s.drain();
      s.publish(&lock);
    }
  });
}

bool Recorder::dump() noexcept {
  Impl& s = *impl_;
  return guarded<Gate::active>(s, "at a dump", [&] {
    std::lock_guard lock(s.mutex);
    if (!s.active.load()) return false;
    s.drain();
    const bool ok = s.window_open ? s.close_window(s.batch, false, now_ns()) : s.write_adhoc_window(false);
    return s.publish(nullptr) && ok;
  });
}

void Recorder::stop() noexcept {
  Impl& s = *impl_;
  guarded<Gate::shutdown>(s, "at shutdown", [&] {
    s.writer.stop();  // outside the lock, which the writer takes
    std::lock_guard lock(s.mutex);
    if (s.stopped || !s.started) return;
    s.stopped = true;
    const bool was_active = s.active.exchange(false);
    if (!was_active || !s.io.spill.is_open()) return;
    s.drain();
    // A window still open when the job ends closes at the batch that was running.
    if (s.window_open && !s.close_window(s.batch, false, now_ns())) return;
    if (!s.io.spill.write_end(process_used_mpi()) || !s.io.spill.sync()) {
      s.fail_io();
      return;
    }
    if (!s.publish(nullptr)) return;
    s.close_spill();
    if (s.lock_fd >= 0) ::close(s.lock_fd);
    s.lock_fd = -1;
  });
}

void Recorder::Impl::step_aside(const char* where) noexcept {
  try {
    log::once(warned_internal, log::Level::warn,
              std::string("internal error ") + where + "; recording stops, the job goes on");
  } catch (...) {
  }
  active.store(false);
}

bool Recorder::active() const noexcept { return impl_->active.load(); }

RecorderStats Recorder::stats() const noexcept {
  Impl& s = *impl_;
  RecorderStats out;
  if (s.in_fork_child.load()) return out;
  try {
    std::lock_guard lock(s.mutex);
    if (s.active.load()) {
      s.drain();
      s.publish(nullptr);
    }
    out.active = s.active.load();
    out.batch = s.batch;
    out.window_open = s.window_open;
    out.events = s.events_seen;
    out.written = s.events_written;
    out.dropped = s.dropped_total + (s.history ? s.history->dropped() : 0) * (s.window_open ? 1 : 0);
    out.windows = s.windows_written;
    out.live_allocations = s.live.tables.allocations().size();
    out.live_bytes = s.live.tables.allocated();
    out.spill_path = s.io.spill.path().string();
  } catch (...) {
  }
  return out;
}

}  // namespace memsnap
