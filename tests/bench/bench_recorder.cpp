// The recorder's hot path, drains and flushes included.
//   build/bin/memsnap_bench_recorder [--benchmark_filter=BM_Record...]
// Each iteration is one alloc and one free (two events). items_per_second counts events of all
// threads together; per_event is the wall time per event of one thread (1 thread: ns per
// event); with native stacks every event captures one stack, so per_event is also the time per
// captured stack, the rest of the hot path included.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <unistd.h>

#include "call_without_frame_pointer.hpp"
#include "memsnap/recorder.hpp"

namespace {

using memsnap::Config;
using memsnap::Recorder;

// Pairs recorded by all threads of the run, counted 1,000 at a time.
std::atomic<std::int64_t> g_pairs{0};

// One recorder per benchmark run, shared by its threads, writing under /tmp.
struct Fixture {
  std::filesystem::path dir;
  std::unique_ptr<Recorder> recorder;
  void set_up(memsnap::StackMode stacks, bool in_window = true, bool background_writes = true) {
    dir = std::filesystem::temp_directory_path() / ("memsnap-bench-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    Config c;
    c.folder = dir.string();
    c.run_name = "bench";
    // Outside a window the recorder keeps live tracking only: the spill's share of the cost drops out.
    c.skip_batches = in_window ? 0 : std::int64_t{1} << 40;
    c.interval = 1;
    c.repeat = -1;
    c.stacks = stacks;
    c.max_entries = 1 << 20;
    c.overwrite = true;
    c.background_writes = background_writes;
    recorder = std::make_unique<Recorder>();
    recorder->start(c, memsnap::LaunchInfo{});
    g_pairs.store(0);
  }
  void tear_down() {
    // A run that dropped events (a batch past max_entries) measured less than the whole record.
    if (const auto dropped = recorder->stats().dropped; dropped > 0) {
      std::fprintf(stderr, "memsnap_bench_recorder: %llu events dropped; this run's numbers do not count\n",
                   static_cast<unsigned long long>(dropped));
    }
    recorder->stop();
    recorder.reset();
    std::filesystem::remove_all(dir);
  }
};
Fixture g_fixture;

[[gnu::noinline]] void allocate_in_model(Recorder& r, std::uint64_t addr) {
  r.record_alloc(0, addr, 4096, 0);
  r.record_free(0, addr, 4096, 0);
  benchmark::ClobberMemory();
}

// Set up before the benchmark's threads start and torn down after they all stopped.
void set_up_no_stacks(const benchmark::State&) { g_fixture.set_up(memsnap::StackMode::none); }
void set_up_native(const benchmark::State&) { g_fixture.set_up(memsnap::StackMode::native); }
void set_up_outside_windows(const benchmark::State&) { g_fixture.set_up(memsnap::StackMode::none, false); }
void set_up_in_place(const benchmark::State&) { g_fixture.set_up(memsnap::StackMode::none, true, false); }
void tear_down(const benchmark::State&) { g_fixture.tear_down(); }

void record_loop(benchmark::State& state) {
  Recorder& r = *g_fixture.recorder;
  std::uint64_t addr = (std::uint64_t(state.thread_index()) << 40) + 0x1000;
  std::int64_t n = 0;
  for (auto _ : state) {
    allocate_in_model(r, addr);
    addr += 4096;
    // A batch step every 50k pairs of all threads together, as a training loop would: flushes
    // to the spill. Whichever thread crosses the mark ends the batch, so that a thread the
    // scheduler holds back (more threads than cores) does not stretch a batch past max_entries.
    if (++n % 1000 == 0) {
      const std::int64_t before = g_pairs.fetch_add(1000, std::memory_order_relaxed);
      if ((before + 1000) / 50000 != before / 50000) r.step();
    }
  }
  state.SetItemsProcessed(state.iterations() * 2);
  state.counters["per_event"] = benchmark::Counter(static_cast<double>(state.iterations() * 2),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// A program built with frame pointers whose stack is deeper than stack_depth: the frame-pointer
// walk reaches the depth limit inside frames that keep them, and the DWARF unwinder is not used.
[[gnu::noinline]] void record_deep(benchmark::State& state, int depth) {
  if (depth > 0) {
    record_deep(state, depth - 1);
    benchmark::ClobberMemory();
    return;
  }
  record_loop(state);
}

void BM_RecordAllocFree_NoStacks(benchmark::State& state) { record_loop(state); }
void BM_RecordAllocFree_NoStacksOutsideWindows(benchmark::State& state) { record_loop(state); }
void BM_RecordAllocFree_NativeStacks(benchmark::State& state) { record_loop(state); }
void BM_RecordAllocFree_NativeStacksFramePointers(benchmark::State& state) { record_deep(state, 40); }
#ifdef MEMSNAP_TEST_HAVE_CALL_WITHOUT_FRAME_POINTER
// A frame that breaks the walk a few frames above the hook, inside stack_depth: every stack is
// libunwind's, as in a program whose libraries keep no frame pointers.
void BM_RecordAllocFree_NativeStacksUnwinder(benchmark::State& state) {
  memsnap_test_call_without_frame_pointer([](void* s) { record_loop(*static_cast<benchmark::State*>(s)); }, &state);
}
#endif

// One training batch per iteration: 1800 alloc/free pairs (3,600 events, about one step of a
// 12-layer transformer under PyTorch's caching allocator), then the batch end; every batch is
// a window's end (written and synced). Counters, on the job's thread: per_event, the events'
// time per event; batch_end_us, the mean time step() took; batch_end_max_us, the longest.
// Between batches the thread "computes" for 5 ms (untimed), as a step's kernels would keep it
// busy: without it the writes (an fsync per window) would be the whole loop.
// _Writer is the default (background_writes), _InPlace the job's thread doing the writes.
// With threads: each records its 3,600 events a batch and thread 0 ends the batches (a data
// loader or an optimizer thread beside the training thread); per_event is the mean over the
// threads, so that it stays flat as threads are added when their rings are independent.
void batch_loop(benchmark::State& state) {
  using clock = std::chrono::steady_clock;
  Recorder& r = *g_fixture.recorder;
  std::uint64_t addr = (std::uint64_t(state.thread_index()) << 40) + 0x1000;
  const bool ends_batches = state.thread_index() == 0;
  clock::duration events{}, ends{}, worst{};
  for (auto _ : state) {
    const auto t0 = clock::now();
    for (int i = 0; i < 1800; ++i) {
      allocate_in_model(r, addr);
      addr += 4096;
    }
    const auto t1 = clock::now();
    if (ends_batches) r.step();
    const auto t2 = clock::now();
    events += t1 - t0;
    ends += t2 - t1;
    worst = std::max(worst, t2 - t1);
    while (clock::now() - t2 < std::chrono::milliseconds(5)) benchmark::ClobberMemory();
  }
  const double n = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * 3600);
  state.counters["per_event"] = benchmark::Counter(std::chrono::duration<double, std::nano>(events).count() / (n * 3600),
                                                   benchmark::Counter::kAvgThreads);
  if (ends_batches) {
    state.counters["batch_end_us"] = std::chrono::duration<double, std::micro>(ends).count() / n;
    state.counters["batch_end_max_us"] = std::chrono::duration<double, std::micro>(worst).count();
  }
}
void BM_Batch3600_Writer(benchmark::State& state) { batch_loop(state); }
void BM_Batch3600_InPlace(benchmark::State& state) { batch_loop(state); }

// The cost when memsnap is linked but not recording (before init or after stepping aside).
void BM_RecordInactive(benchmark::State& state) {
  static Recorder idle;
  std::uint64_t addr = 0x1000;
  for (auto _ : state) {
    allocate_in_model(idle, addr);
    addr += 4096;
  }
  state.SetItemsProcessed(state.iterations() * 2);
}

BENCHMARK(BM_RecordAllocFree_NoStacks)->Setup(set_up_no_stacks)->Teardown(tear_down)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();
BENCHMARK(BM_RecordAllocFree_NoStacksOutsideWindows)->Setup(set_up_outside_windows)->Teardown(tear_down)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_RecordAllocFree_NativeStacks)->Setup(set_up_native)->Teardown(tear_down)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_RecordAllocFree_NativeStacksFramePointers)->Setup(set_up_native)->Teardown(tear_down)->Threads(1)->UseRealTime();
#ifdef MEMSNAP_TEST_HAVE_CALL_WITHOUT_FRAME_POINTER
BENCHMARK(BM_RecordAllocFree_NativeStacksUnwinder)->Setup(set_up_native)->Teardown(tear_down)->Threads(1)->UseRealTime();
#endif
BENCHMARK(BM_Batch3600_Writer)->Setup(set_up_no_stacks)->Teardown(tear_down)->Threads(1)->Threads(4)->UseRealTime();
BENCHMARK(BM_Batch3600_InPlace)->Setup(set_up_in_place)->Teardown(tear_down)->UseRealTime();
BENCHMARK(BM_RecordInactive);

}  // namespace

BENCHMARK_MAIN();
