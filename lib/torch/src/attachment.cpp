// The PyTorch attachment: a trace tracker on PyTorch's CUDA caching allocator feeding memsnap's
// recorder with every block (alloc, free_requested, free_completed), segment and OOM.
//
// The allocator calls each attached tracker for every trace entry, also while its own history
// recording is off, with its per-device lock held and perhaps the GIL too: the tracker takes no
// lock the application can contend on and never takes the GIL (DESIGN.md, "Do no harm").
// The C entry points below are what the memsnap_torch Python module calls through ctypes.
#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "log.hpp"
#include "memsnap/config.hpp"
#include "memsnap/launch_env.hpp"
#include "memsnap/recorder.hpp"
#include "python_frames.hpp"

namespace memsnap::pytorch {
namespace {

using c10::CachingDeviceAllocator::TraceEntry;

// memsnap's actions are PyTorch's, in PyTorch's order.
static_assert(static_cast<int>(Action::alloc) == TraceEntry::ALLOC);
static_assert(static_cast<int>(Action::free_requested) == TraceEntry::FREE_REQUESTED);
static_assert(static_cast<int>(Action::free_completed) == TraceEntry::FREE_COMPLETED);
static_assert(static_cast<int>(Action::segment_alloc) == TraceEntry::SEGMENT_ALLOC);
static_assert(static_cast<int>(Action::segment_free) == TraceEntry::SEGMENT_FREE);
static_assert(static_cast<int>(Action::segment_map) == TraceEntry::SEGMENT_MAP);
static_assert(static_cast<int>(Action::segment_unmap) == TraceEntry::SEGMENT_UNMAP);
static_assert(static_cast<int>(Action::snapshot) == TraceEntry::SNAPSHOT);
static_assert(static_cast<int>(Action::oom) == TraceEntry::OOM);

constexpr int kMaxDevices = 64;
constexpr int kMaxPythonFrames = 64;

struct State {
  std::mutex mutex;  // attach only
  bool attached = false;
  std::atomic<bool> python_stacks{false};
  bool python_probed = false;
  std::string python_why = "memsnap_torch_probe_python() was not called";
  std::array<std::atomic<std::uint64_t>, kMaxDevices> device_total{};
};
State& state() {
  static State* s = new State();  // never destroyed: the allocator may call in during teardown
  return *s;
}

// PyTorch stamps each entry with its approximate clock, the TSC on x86 where its allocator was
// built as plain C++. Checked once against our own read (the entry was stamped microseconds ago);
// where it holds, the recorder reuses the stamp instead of reading the TSC again.
std::atomic<int> g_entry_time_is_tsc{0};  // 0 not checked yet, 1 yes, 2 no

// Benchmarks only (memsnap_torch_bench_bypass): the tracker returns at once, as an empty one
// would, so that one process can alternate between memsnap's cost and PyTorch's alone.
std::atomic<bool> g_bypass{false};

std::uint64_t entry_tsc(const TraceEntry& te) noexcept {
#if defined(__x86_64__)
  const int known = g_entry_time_is_tsc.load(std::memory_order_relaxed);
  if (known == 1) return te.time_.approx_t_;
  if (known == 0) {
    const std::uint64_t now = __rdtsc(), stamp = te.time_.approx_t_;
    const bool tsc = stamp <= now && now - stamp < (std::uint64_t{1} << 32);  // about a second at 4 GHz
    g_entry_time_is_tsc.store(tsc ? 1 : 2, std::memory_order_relaxed);
    return tsc ? stamp : 0;
  }
#else
  (void)te;
#endif
  return 0;
}

void on_trace_entry(const TraceEntry& te) noexcept {
  if (g_bypass.load(std::memory_order_relaxed)) [[unlikely]] return;
  Recorder& r = Recorder::global();
  const auto action = static_cast<Action>(te.action_);
  const int device = te.device_;
  const auto stream = reinterpret_cast<std::uint64_t>(te.stream_);
  if (action == Action::oom) {
    // PyTorch's OOM entry: addr_ is the device's free bytes, size_ the request.
    const std::uint64_t total = device >= 0 && device < kMaxDevices ? state().device_total[device].load() : 0;
    r.record_oom(device, te.size_, te.addr_, total, stream);
    return;
  }
  if (state().python_stacks.load(std::memory_order_relaxed) && r.wants_stack(action, te.size_)) {
    std::array<std::uintptr_t, kMaxPythonFrames> frames;
    const int n = capture_python_frames(frames);
    r.record_from_allocator(action, device, te.addr_, te.size_, stream, std::span(frames.data(), n), entry_tsc(te));
    return;
  }
  r.record_from_allocator(action, device, te.addr_, te.size_, stream, {}, entry_tsc(te));
}

// Starts the recorder where no other source did (no CUPTI injection), or joins it.
bool start_recorder(const char* device_name) {
  RecorderOptions options;
  options.source = "torch_tracker";
  options.device_name = device_name != nullptr ? device_name : "";
  options.trim_modules = {"libmemsnap_pytorch", "libc10_cuda", "libc10.so"};
  if (!Recorder::global().start_from_environment("", options)) return false;
  if (wants_python(Recorder::global().stack_mode())) {
    if (state().python_probed) {
      state().python_stacks.store(true);
      Recorder::global().set_foreign_frame_resolver(resolve_python_frame);
    } else {
      log::write(log::Level::warn, "stacks: Python frames asked for, but they cannot be read here (" +
                                       state().python_why + "); recording without them");
    }
  }
  return true;
}

}  // namespace
}  // namespace memsnap::pytorch

using namespace memsnap;
using namespace memsnap::pytorch;

/// Starts (or joins) the recording and attaches the trace tracker, once per process. Call with
/// CUDA initialised (the allocator's per-device state exists only then). 1: recording, 0: not
/// (one line said why), -1: PyTorch refused the tracker.
extern "C" __attribute__((visibility("default"))) int memsnap_torch_attach(const char* device_name) {
  State& s = state();
  try {
    std::lock_guard lock(s.mutex);
    if (s.attached) return Recorder::global().active() ? 1 : 0;
    if (!start_recorder(device_name)) return 0;
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(
        [](const TraceEntry& te) { on_trace_entry(te); });
    s.attached = true;
    return 1;
  } catch (const std::exception& e) {
    log::write(log::Level::warn, std::string("cannot attach to PyTorch's allocator: ") + e.what() +
                                     "; the job goes on without block-level recording");
  } catch (...) {
    log::write(log::Level::warn, "cannot attach to PyTorch's allocator; the job goes on without block-level recording");
  }
  return -1;
}

/// With the GIL held (ctypes.PyDLL): finds where this interpreter keeps a thread's frames. 1: Python
/// stacks can be captured. Before memsnap_torch_attach.
extern "C" __attribute__((visibility("default"))) int memsnap_torch_probe_python() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.python_probed) s.python_probed = probe_python_frames(s.python_why);
  return s.python_probed ? 1 : 0;
}

/// With the GIL held (ctypes.PyDLL): names and lines of the Python frames captured since the last
/// call. Called at each optimizer step and before memsnap_torch_step/dump, so that a window's
/// frames have names when it is written.
extern "C" __attribute__((visibility("default"))) void memsnap_torch_resolve_python() {
  if (state().python_stacks.load(std::memory_order_relaxed)) resolve_pending_python_frames();
}

/// For tests/bench only: attaches a tracker that does nothing, to measure what a tracker costs
/// PyTorch itself (its trace entries are built only while some tracker or its history is on).
extern "C" __attribute__((visibility("default"))) void memsnap_torch_attach_empty_tracker() {
  c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const TraceEntry&) {});
}

/// For tests/bench only: what the attached tracker does with one trace entry (no GPU needed).
extern "C" __attribute__((visibility("default"))) void memsnap_torch_on_trace_entry(const TraceEntry* te) {
  on_trace_entry(*te);
}

/// For benchmarks only: 1 makes the attached tracker return at once (the record then has holes),
/// 0 records again. Lets one process alternate batches with and without memsnap's share.
extern "C" __attribute__((visibility("default"))) void memsnap_torch_bench_bypass(int on) {
  g_bypass.store(on != 0, std::memory_order_relaxed);
}

/// The device's memory size, for OOM records (PyTorch's OOM entry carries only the free bytes).
extern "C" __attribute__((visibility("default"))) void memsnap_torch_set_device_total(int device, std::uint64_t bytes) {
  if (device >= 0 && device < kMaxDevices) state().device_total[device].store(bytes);
}

/// An optimizer step ended a batch: counts unless NVTX ranges or explicit steps mark batches.
extern "C" __attribute__((visibility("default"))) void memsnap_torch_step_hint() { Recorder::global().step_hint(); }

/// An explicit batch boundary (memsnap_torch.step()).
extern "C" __attribute__((visibility("default"))) void memsnap_torch_step() { Recorder::global().step(); }

/// Writes the current window now. 1 on success.
extern "C" __attribute__((visibility("default"))) int memsnap_torch_dump() { return Recorder::global().dump() ? 1 : 0; }

/// 1 while this process records.
extern "C" __attribute__((visibility("default"))) int memsnap_torch_recording() { return Recorder::global().active() ? 1 : 0; }

/// Events the recorder has seen (all sources), and the batch now running: for tests and benchmarks.
extern "C" __attribute__((visibility("default"))) std::uint64_t memsnap_torch_events() { return Recorder::global().stats().events; }
extern "C" __attribute__((visibility("default"))) std::int64_t memsnap_torch_batch() { return Recorder::global().stats().batch; }
