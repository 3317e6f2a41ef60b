// The in-process recorder: every capture source (C/C++ API, CUPTI) feeds one Recorder.
//
// Hot path (record): a thread-local lock-free ring per thread, a clock read, and, with
// `stacks: native`, a backtrace. Everything else (ordering, live tracking, stack interning,
// symbolisation, spill writes) happens when a batch ends or a buffer fills, under one lock that
// only memsnap's own code takes.
//
// Do no harm: no method throws, exits or blocks the application on I/O errors. A failure logs one
// line and the recorder steps aside (active() turns false); the application runs on.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memsnap/config.hpp"
#include "memsnap/event.hpp"
#include "memsnap/launch_env.hpp"

namespace memsnap {

// Which batches are recorded (Composer's MemorySnapshot semantics). Batches count from 1.
// Window k (k = 0 .. repeat, or unbounded when repeat is -1) covers batches
// [skip + 1 + k * interval, skip + (k + 1) * interval] and is named by its last batch.
// Defaults (skip 1, interval 3, repeat 0): one window over batches 2..4, named 4.
class WindowPolicy {
 public:
  WindowPolicy(std::int64_t skip_batches, std::int64_t interval, std::int64_t repeat);
  std::int64_t window_of(std::int64_t batch) const;  // window index, or -1 when not recorded
  bool opens_at(std::int64_t batch) const;
  bool closes_at(std::int64_t batch) const;
  std::int64_t first_batch(std::int64_t window) const;
  std::int64_t last_batch(std::int64_t window) const;

 private:
  std::int64_t skip_, interval_, repeat_;
};

// Bounded history: keeps the newest `capacity` events and counts those it dropped.
class EventRing {
 public:
  explicit EventRing(std::size_t capacity);
  void push(const Event& e) {  // inline: once per drained event
    const std::size_t cap = buf_.size();
    if (size_ == cap) {
      buf_[start_] = e;
      if (++start_ == cap) start_ = 0;
      ++dropped_;
      return;
    }
    std::size_t i = start_ + size_;
    if (i >= cap) i -= cap;
    buf_[i] = e;
    ++size_;
  }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return buf_.size(); }
  std::uint64_t dropped() const { return dropped_; }
  // Oldest first.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < size_; ++i) f(buf_[(start_ + i) % buf_.size()]);
  }
  std::vector<Event> take();  // the events, oldest first; empties the ring, keeps dropped()
  // The events as at most two contiguous runs, oldest first: written without a copy.
  std::array<std::span<const Event>, 2> spans() const;
  void discard();             // empties the ring, keeps dropped()
  void clear();               // empties and resets dropped()

 private:
  std::vector<Event> buf_;
  std::size_t start_ = 0, size_ = 0;
  std::uint64_t dropped_ = 0;
};

/// A stack entry that is not a native return address (top bit set): a frame of another kind, such
/// as a Python interpreter frame, encoded by the source that captured it and resolved by that
/// source's ForeignFrameResolver when the stack is written (possibly on another thread).
inline constexpr std::uintptr_t kForeignFrame = std::uintptr_t{1} << 63;
using ForeignFrameResolver = Frame (*)(std::uintptr_t entry) noexcept;

struct RecorderOptions {
  // api | cupti | torch_tracker. A second source joining a started recorder adds its name
  // ("cupti+torch_tracker").
  std::string source = "api";
  std::string device_name;
  // Native stacks: frames at the top that lie in a module whose file name contains one of these
  // are trimmed like memsnap's own (the CUPTI source: libmemsnap_cupti, libcupti, libcuda).
  std::vector<std::string> trim_modules;
};

struct RecorderStats {
  bool active = false;
  std::int64_t batch = 0;        // the batch now running (1-based)
  bool window_open = false;
  std::uint64_t events = 0;      // events seen since start
  std::uint64_t written = 0;     // events written to the spill
  std::uint64_t dropped = 0;     // events dropped by the bounded history, all windows
  std::uint64_t windows = 0;     // windows written
  std::uint64_t live_allocations = 0;
  std::uint64_t live_bytes = 0;
  std::string spill_path;
};

class Recorder {
 public:
  Recorder();
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // The process-wide recorder behind the C API and CUPTI. Never destroyed; flushed at exit.
  static Recorder& global();

  // Opens the spill and starts counting batches. Returns false (after one log line) when the
  // config or the folder does not allow recording; the recorder then ignores every call.
  bool start(const Config& config, const LaunchInfo& launch, const RecorderOptions& options = {}) noexcept;
  // start() with the config of this process's environment (`config_path`, else $MEMSNAP_CONFIG,
  // then MEMSNAP_<KEY>) and the launcher's rank: what the C API and the PyTorch attachment do.
  // A bad config is one line and false.
  bool start_from_environment(const std::string& config_path, const RecorderOptions& options = {}) noexcept;

  void record(Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept;
  void record_alloc(int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept {
    record(Action::alloc, device, addr, size, stream);
  }
  void record_free(int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept {
    record(Action::free_completed, device, addr, size, stream);
  }
  // An event from a block-level allocator trace (PyTorch's caching allocator). Its segment events
  // replace the same segment reported by CUPTI on this thread (the cudaMalloc or cuMemMap inside
  // the allocator), whichever comes first: each segment is counted once. `foreign` frames
  // (innermost first) follow the native ones when native stacks are on; pass them only when
  // wants_stack() said so. `tsc_ticks`: the allocator's own TSC reading of the event (x86's
  // rdtsc, as PyTorch's trace entries hold), saving the recorder a read; 0: none.
  void record_from_allocator(Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                             std::span<const std::uintptr_t> foreign = {}, std::uint64_t tsc_ticks = 0) noexcept;
  // Whether an event of this action and size gets a stack (stacks on, size >= stack_min_bytes).
  bool wants_stack(Action action, std::uint64_t size) const noexcept;
  StackMode stack_mode() const noexcept;
  void set_foreign_frame_resolver(ForeignFrameResolver resolver) noexcept;

  // A failed allocation: records an `oom` event and writes the current window at once, flagged.
  void record_oom(int device, std::uint64_t requested, std::uint64_t device_free,
                  std::uint64_t device_total, std::uint64_t stream) noexcept;

  // The current batch ended (memsnap_step, or an NVTX batch range closed).
  void step() noexcept;
  // A batch boundary from a fallback source (an optimizer step hook). Counts only while the
  // process has marked no batch otherwise: once step() or batch_marks_expected() was called,
  // hints are ignored, so one batch is never counted twice.
  void step_hint() noexcept;
  // An explicit batch mark is in use (an NVTX range matching batch_marker was opened).
  void batch_marks_expected() noexcept;
  // Writes the current window now (or, outside a window, the recent history). True on success.
  bool dump() noexcept;
  // Flushes everything and closes the spill. Idempotent.
  void stop() noexcept;

  bool active() const noexcept;
  RecorderStats stats() const noexcept;

  struct Impl;

 private:
  void end_batch() noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memsnap
