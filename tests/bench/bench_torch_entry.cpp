// memsnap's share of a PyTorch trace entry, without a GPU: the allocator's way of calling its
// trackers (a TraceEntry built per call, each tracker a std::function) replayed in a loop.
//   build/bin/memsnap_bench_torch_entry [--benchmark_filter=...]
// BM_EntryEmptyTracker is what PyTorch itself spends per entry once any tracker is attached (the
// entry, its two strings, the call); BM_EntryMemsnap* adds memsnap's tracker, outside windows (live
// tracking only) and in windows (every batch written by the writer thread). The difference is
// memsnap's own cost per entry. A batch ends every 3,600 entries, as in a 12-layer transformer step.
#include <benchmark/benchmark.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/ApproximateClock.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "memsnap/recorder.hpp"

extern "C" void memsnap_torch_on_trace_entry(const c10::CachingDeviceAllocator::TraceEntry* te);
extern "C" void memsnap_torch_step();

namespace {

using c10::CachingDeviceAllocator::TraceEntry;
using Tracker = std::function<void(const TraceEntry&)>;

std::filesystem::path g_dir;

void start_recorder(bool in_windows) {
  g_dir = std::filesystem::temp_directory_path() / ("memsnap-bench-entry-" + std::to_string(getpid()));
  std::filesystem::remove_all(g_dir);
  memsnap::Config c;
  c.folder = g_dir.string();
  c.run_name = "bench";
  c.skip_batches = in_windows ? 0 : std::int64_t{1} << 40;
  c.interval = 1;
  c.repeat = -1;
  c.max_entries = 1 << 20;
  c.overwrite = true;
  memsnap::RecorderOptions options;
  options.source = "torch_tracker";
  memsnap::Recorder::global().start(c, memsnap::LaunchInfo{}, options);
}
void stop_recorder() {
  memsnap::Recorder::global().stop();
  std::filesystem::remove_all(g_dir);
}

// What the caching allocator does per alloc/free once a tracker is attached: builds the entry and
// calls every tracker with it.
[[gnu::noinline]] void record_trace(const std::vector<Tracker>& trackers, TraceEntry::Action action, std::size_t addr,
                                    std::size_t size) {
  TraceEntry te(action, 0, addr, size, nullptr, {0, 0}, c10::getApproximateTime(), nullptr, "N/A", "");
  for (const auto& cb : trackers) cb(te);
}

void entry_loop(benchmark::State& state, const std::vector<Tracker>& trackers, bool steps) {
  const std::size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 256 << 10};
  std::size_t addr = 0x7f0000000000, i = 0;
  for (auto _ : state) {
    // One block's life: alloc, free_requested, free_completed (3 entries an iteration).
    const std::size_t size = sizes[i % 6];
    record_trace(trackers, TraceEntry::ALLOC, addr, size);
    record_trace(trackers, TraceEntry::FREE_REQUESTED, addr, size);
    record_trace(trackers, TraceEntry::FREE_COMPLETED, addr, size);
    addr += 1 << 20;
    if (steps && ++i % 1200 == 0) memsnap_torch_step();
  }
  state.SetItemsProcessed(state.iterations() * 3);
  state.counters["per_entry"] = benchmark::Counter(static_cast<double>(state.iterations() * 3),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_EntryNoTracker(benchmark::State& state) {
  // Not what PyTorch does without trackers (it builds no entry then): the loop's own floor.
  entry_loop(state, {}, false);
}
void BM_EntryEmptyTracker(benchmark::State& state) {
  entry_loop(state, {[](const TraceEntry&) {}}, false);
}
void BM_EntryMemsnapOutsideWindows(benchmark::State& state) {
  entry_loop(state, {[](const TraceEntry& te) { memsnap_torch_on_trace_entry(&te); }}, true);
}
void BM_EntryMemsnapInWindows(benchmark::State& state) {
  entry_loop(state, {[](const TraceEntry& te) { memsnap_torch_on_trace_entry(&te); }}, true);
}

BENCHMARK(BM_EntryNoTracker);
BENCHMARK(BM_EntryEmptyTracker);
BENCHMARK(BM_EntryMemsnapOutsideWindows)
    ->Setup([](const benchmark::State&) { start_recorder(false); })
    ->Teardown([](const benchmark::State&) { stop_recorder(); })
    ->UseRealTime();
BENCHMARK(BM_EntryMemsnapInWindows)
    ->Setup([](const benchmark::State&) { start_recorder(true); })
    ->Teardown([](const benchmark::State&) { stop_recorder(); })
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
