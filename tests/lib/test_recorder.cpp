#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include "memsnap/recorder.hpp"
#include "memsnap/spill.hpp"
#include "call_without_frame_pointer.hpp"
#include "test_util.hpp"
#include "../../lib/src/recorder_impl.hpp"
#include "../../lib/src/stacks.hpp"

namespace memsnap {
namespace {

Config config_in(const test::TempDir& dir) {
  Config c;
  c.folder = dir.path().string();
  c.run_name = "t";
  return c;
}

// Batches are written by memsnap's writer thread: what a batch end causes shows a moment later.
template <class Pred>
bool within_10s(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    usleep(10000);
  }
  return pred();
}

RankRecord only_spill(const test::TempDir& dir) {
  auto spills = find_spills(dir.path());
  EXPECT_EQ(spills.size(), 1u);
  return spills.empty() ? RankRecord{} : read_spill(spills[0]);
}

TEST(WindowPolicy, ComposerDefaultsRecordBatchesTwoToFour) {
  WindowPolicy p(1, 3, 0);
  EXPECT_EQ(p.window_of(1), -1);
  EXPECT_TRUE(p.opens_at(2));
  EXPECT_EQ(p.window_of(3), 0);
  EXPECT_TRUE(p.closes_at(4));
  EXPECT_EQ(p.window_of(5), -1) << "repeat 0: one window";
}

TEST(WindowPolicy, EdgeCases) {
  WindowPolicy none_skipped(0, 1, 2);  // batches 1, 2, 3 each a window
  for (int b = 1; b <= 3; ++b) {
    EXPECT_TRUE(none_skipped.opens_at(b));
    EXPECT_TRUE(none_skipped.closes_at(b));
  }
  EXPECT_EQ(none_skipped.window_of(4), -1);
  WindowPolicy forever(2, 2, -1);
  EXPECT_EQ(forever.window_of(2), -1);
  EXPECT_EQ(forever.window_of(3), 0);
  EXPECT_EQ(forever.window_of(1000001), 499999);
  EXPECT_TRUE(forever.closes_at(1000002));
  EXPECT_EQ(forever.last_batch(0), 4);
}

TEST(EventRing, KeepsTheNewestAndCountsDropped) {
  EventRing ring(3);
  for (int i = 0; i < 5; ++i) ring.push(Event{i, 0, 0, 0, kNoStack, 0, Action::alloc, 0});
  EXPECT_EQ(ring.dropped(), 2u);
  auto events = ring.take();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].time_ns, 2);
  EXPECT_EQ(events[2].time_ns, 4);
  EXPECT_EQ(ring.dropped(), 2u) << "take keeps the count";
  ring.clear();
  EXPECT_EQ(ring.dropped(), 0u);
}

// `memsnap run` names its launch in MEMSNAP_LAUNCH; the spill's META carries it, so that a store
// is made of one launch's records.
TEST(Recorder, SpillNamesTheLaunchThatStartedTheProcess) {
  test::TempDir dir;
  ASSERT_EQ(setenv("MEMSNAP_LAUNCH", "1296957441", 1), 0);
  {
    Recorder r;
    ASSERT_TRUE(r.start(config_in(dir), LaunchInfo{}));
    r.stop();
  }
  unsetenv("MEMSNAP_LAUNCH");
  EXPECT_EQ(only_spill(dir).meta.launch, "1296957441");
  const auto meta = read_spill_meta(find_spills(dir.path()).at(0));
  ASSERT_TRUE(meta.has_value());
  EXPECT_EQ(meta->launch, "1296957441");
}

TEST(Recorder, RecordsTheConfiguredWindowWithWhatWasLiveAtOpen) {
  test::TempDir dir;
  {
    Recorder r;
    ASSERT_TRUE(r.start(config_in(dir), LaunchInfo{}));
    r.record_alloc(0, 0x1000, 100, 0);  // batch 1: before the window, still live at open
    r.record_alloc(0, 0x2000, 200, 0);  // batch 1: freed in batch 1
    r.record_free(0, 0x2000, 200, 0);
    r.step();
    for (int b = 2; b <= 6; ++b) {
      r.record_alloc(0, 0x10000 * b, 1000 * b, 0);
      r.step();
    }
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  EXPECT_EQ(rec.status, RecordStatus::ok) << rec.status_detail;
  ASSERT_EQ(rec.windows.size(), 1u);
  const auto& w = rec.windows[0];
  EXPECT_EQ(w.batch_start, 2);
  EXPECT_EQ(w.batch_end, 4);
  EXPECT_TRUE(w.closed);
  ASSERT_EQ(w.live_at_start.size(), 1u);
  EXPECT_EQ(w.live_at_start[0].addr, 0x1000u);
  EXPECT_EQ(w.live_at_start[0].size, 100u);
  ASSERT_EQ(w.events.size(), 3u) << "only batches 2..4";
  EXPECT_EQ(w.events[0].size, 2000u);
  EXPECT_EQ(w.events[2].size, 4000u);
  ASSERT_EQ(w.batches.size(), 3u);
  EXPECT_EQ(w.batches[0].batch, 2);
  EXPECT_EQ(w.batches[2].batch, 4);
  for (std::size_t i = 1; i < w.events.size(); ++i) EXPECT_LE(w.events[i - 1].time_ns, w.events[i].time_ns);
}

TEST(Recorder, RepeatWritesConsecutiveWindows) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 2;
  c.repeat = 2;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    for (int b = 1; b <= 10; ++b) {
      r.record_alloc(0, 0x1000 * b, 10, 0);
      r.step();
    }
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 3u);
  EXPECT_EQ(rec.windows[0].batch_end, 2);
  EXPECT_EQ(rec.windows[1].batch_start, 3);
  EXPECT_EQ(rec.windows[2].batch_end, 6);
  EXPECT_EQ(rec.windows[2].live_at_start.size(), 4u) << "allocations of batches 1..4 are live when batch 5 opens";
}

// The names of this process's threads (/proc/self/task/*/comm).
std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    names.push_back(test::read_file(t.path() / "comm"));
    if (!names.back().empty() && names.back().back() == '\n') names.back().pop_back();
  }
  return names;
}

bool has_writer_thread() {
  const auto names = thread_names();
  return std::find(names.begin(), names.end(), "memsnap-writer") != names.end();
}

// background_writes (the default): a batch end only marks the place in the stream; memsnap's own
// thread drains, writes and syncs. The window reaches the disk with no other call into memsnap.
TEST(Recorder, BatchesReachTheDiskFromTheWriterThreadAlone) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 4;
  Recorder r;
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  EXPECT_FALSE(has_writer_thread()) << "started at the first batch end, not before";
  for (int b = 0; b < 4; ++b) {
    for (int i = 0; i < 50; ++i) r.record_alloc(0, (std::uint64_t(b) << 20) + i * 64, 64, 0);
    r.step();
  }
  EXPECT_TRUE(has_writer_thread());
  // Batches 1-4 are the window: closed by the writer once it has seen the fourth batch's mark.
  RankRecord rec;
  for (int tries = 0; tries < 1000; ++tries) {
    rec = only_spill(dir);
    if (!rec.windows.empty() && rec.windows[0].closed) break;
    usleep(10000);
  }
  ASSERT_EQ(rec.windows.size(), 1u);
  EXPECT_TRUE(rec.windows[0].closed) << "the writer closed the window by itself";
  EXPECT_EQ(rec.windows[0].batch_end, 4);
  EXPECT_EQ(rec.windows[0].events.size(), 200u) << "batches 1-4, every event";
  r.stop();
  EXPECT_FALSE(has_writer_thread()) << "stop() ends the writer";
}

// A long batch inside a window reaches the disk while it runs: each drain (a ring filling, a
// stats() call) writes what it took, so a job killed mid-batch still leaves those events, and
// the history never holds more than one drain's worth.
TEST(Recorder, AnOpenWindowsEventsReachTheSpillBeforeItsBatchEnds) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 2;
  Recorder r;
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  for (int i = 0; i < 40000; ++i) r.record_alloc(0, 0x100000 + std::uint64_t(i) * 64, 64, 0);
  EXPECT_EQ(r.stats().events, 40000u);  // drains what the rings hold
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  const auto& w = rec.windows[0];
  EXPECT_FALSE(w.closed) << "batch 1 is still running";
  ASSERT_EQ(w.events.size(), 40000u) << "every event drained so far is on disk";
  for (std::size_t i = 0; i < w.events.size(); ++i) {
    ASSERT_EQ(w.events[i].addr, 0x100000 + i * 64) << i;
  }
  r.step();
  r.step();
  r.stop();
  const RankRecord done = only_spill(dir);
  ASSERT_EQ(done.windows.size(), 1u);
  EXPECT_TRUE(done.windows[0].closed);
  EXPECT_EQ(done.windows[0].events.size(), 40000u) << "written once, not again at the batch's end";
  EXPECT_EQ(done.windows[0].dropped, 0u);
}

// The same calls with and without the writer thread give the same record, event for event, and
// the same answers to stats() at every step.
TEST(Recorder, TheWriterThreadChangesNothingInTheRecord) {
  auto run = [](bool background) {
    test::TempDir dir;
    Config c = config_in(dir);
    c.skip_batches = 1;
    c.interval = 3;
    c.repeat = -1;
    c.background_writes = background;
    std::vector<std::int64_t> batches;
    {
      Recorder r;
      EXPECT_TRUE(r.start(c, LaunchInfo{}));
      for (int b = 0; b < 20; ++b) {
        // A batch longer than half a thread's ring (5/8 of it): the writer drains while it runs.
        for (int i = 0; i < int(detail::ThreadBuffer::kCapacity * 3 / 8); ++i) {
          const std::uint64_t addr = (std::uint64_t(b) << 24) + i * 256;
          r.record_alloc(0, addr, 256, 0);
          if (i % 3 != 0) r.record_free(0, addr, 256, 0);
        }
        r.step();
        if (b % 5 == 0) batches.push_back(r.stats().batch);
      }
      EXPECT_EQ(has_writer_thread(), background);
      r.stop();
    }
    return std::make_pair(only_spill(dir), batches);
  };
  const auto [in_place, in_place_batches] = run(false);
  const auto [threaded, threaded_batches] = run(true);
  EXPECT_EQ(in_place_batches, threaded_batches) << "stats() sees every batch that ended";
  ASSERT_EQ(in_place.windows.size(), threaded.windows.size());
  ASSERT_GE(threaded.windows.size(), 6u);
  for (std::size_t w = 0; w < threaded.windows.size(); ++w) {
    const auto& a = in_place.windows[w];
    const auto& b = threaded.windows[w];
    EXPECT_EQ(a.batch_start, b.batch_start) << w;
    EXPECT_EQ(a.batch_end, b.batch_end) << w;
    EXPECT_EQ(a.batches.size(), b.batches.size()) << w;
    EXPECT_EQ(a.live_at_start.size(), b.live_at_start.size()) << w;
    ASSERT_EQ(a.events.size(), b.events.size()) << w;
    for (std::size_t i = 0; i < a.events.size(); ++i) {
      ASSERT_EQ(a.events[i].addr, b.events[i].addr) << w << " " << i;
      ASSERT_EQ(a.events[i].action, b.events[i].action) << w << " " << i;
    }
    EXPECT_EQ(b.dropped, 0u);
  }
}

TEST(Recorder, BoundedHistoryKeepsTheNewestAndCountsDropped) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 1;
  c.max_entries = 100;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    for (int i = 0; i < 10000; ++i) r.record_alloc(0, 0x1000 + i * 16, 16, 0);
    r.step();
    EXPECT_EQ(r.stats().live_allocations, 10000u) << "live tracking sees every event";
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  EXPECT_EQ(rec.windows[0].events.size(), 100u);
  EXPECT_EQ(rec.windows[0].dropped, 9900u);
  EXPECT_EQ(rec.windows[0].events.back().addr, 0x1000u + 9999 * 16) << "the newest are kept";
}

TEST(Recorder, OomClosesTheWindowAtOnceFlagged) {
  test::TempDir dir;
  Recorder r;
  ASSERT_TRUE(r.start(config_in(dir), LaunchInfo{}));
  r.step();  // batch 1
  r.record_alloc(0, 0x1000, 1 << 20, 0);
  r.record_oom(0, 8ull << 30, 1 << 30, 80ull << 30, 0);
  // Before the process goes on (or dies), the window is on disk.
  const RankRecord rec = read_spill(r.stats().spill_path);
  ASSERT_EQ(rec.windows.size(), 1u);
  EXPECT_TRUE(rec.windows[0].oom);
  EXPECT_TRUE(rec.windows[0].closed);
  EXPECT_EQ(rec.windows[0].batch_end, 2);
  ASSERT_EQ(rec.windows[0].events.size(), 2u);
  EXPECT_EQ(rec.windows[0].events[1].action, Action::oom);
  EXPECT_EQ(rec.windows[0].events[1].size, 8ull << 30);
  r.stop();
}

TEST(Recorder, OomOutsideAWindowWritesTheRecentHistory) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 100;
  Recorder r;
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  r.record_alloc(0, 0x1000, 10, 0);
  r.step();
  r.record_alloc(0, 0x2000, 20, 0);
  r.record_oom(0, 1000, 5, 100, 0);
  const RankRecord rec = read_spill(r.stats().spill_path);
  ASSERT_EQ(rec.windows.size(), 1u);
  const auto& w = rec.windows[0];
  EXPECT_TRUE(w.oom);
  EXPECT_EQ(w.batch_end, 2);
  EXPECT_TRUE(w.live_at_start.empty()) << "the whole history is in the window";
  EXPECT_EQ(w.events.size(), 3u);
  r.stop();
}

TEST(Recorder, ManyThreadsLoseNothing) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 1;
  c.max_entries = 1 << 20;
  constexpr int kThreads = 4, kPerThread = 20000;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&r, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const std::uint64_t addr = (std::uint64_t(t) << 32) + i * 64;
          r.record_alloc(0, addr, 64, t);
          if (i % 2) r.record_free(0, addr, 64, t);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(r.stats().live_allocations, std::uint64_t(kThreads) * kPerThread / 2);
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  EXPECT_EQ(rec.windows[0].events.size(), std::size_t(kThreads) * kPerThread * 3 / 2);
  EXPECT_EQ(rec.windows[0].dropped, 0u);
}

[[gnu::noinline]] void allocate_from_a_named_site(Recorder& r) {
  r.record_alloc(0, 0x5000, 4096, 0);
  asm volatile("" ::: "memory");  // no tail call: this frame stays on the stack
}

TEST(Recorder, NativeStacksNameTheCaller) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.stacks = StackMode::native;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    volatile int calls = 3;  // one call site, not unrolled
    for (int i = 0; i < calls; ++i) allocate_from_a_named_site(r);
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  ASSERT_EQ(rec.windows[0].events.size(), 3u);
  const auto id = rec.windows[0].events[0].stack_id;
  ASSERT_LT(id, rec.stacks.size());
  EXPECT_EQ(rec.windows[0].events[1].stack_id, id) << "identical stacks are interned once";
  const Frame& top = rec.frames.at(rec.stacks[id].front());
  EXPECT_NE(top.name.find("allocate_from_a_named_site"), std::string::npos) << top.name;
  EXPECT_NE(top.file.find("test_recorder.cpp"), std::string::npos) << top.file;
  EXPECT_GT(top.line, 0u);
}

void capture_both_ways(std::vector<std::uintptr_t>& walked, std::vector<std::uintptr_t>& unwound, int depth);

// Two functions calling each other: every frame's return address differs from its neighbour's.
[[gnu::noinline]] void capture_via_other(std::vector<std::uintptr_t>& walked, std::vector<std::uintptr_t>& unwound,
                                         int depth) {
  capture_both_ways(walked, unwound, depth - 1);
  asm volatile("" ::: "memory");  // no tail call
}

[[gnu::noinline]] void capture_both_ways(std::vector<std::uintptr_t>& walked, std::vector<std::uintptr_t>& unwound,
                                         int depth) {
  if (depth > 0) {
    capture_via_other(walked, unwound, depth - 1);
    asm volatile("" ::: "memory");
    return;
  }
  walked.resize(32);
  unwound.resize(40);
  walked.resize(stacks::capture_with_frame_pointers(walked.data(), 32));
  unwound.resize(stacks::capture_with_dwarf(unwound.data(), 40));
}

// This file keeps frame pointers, so 40 frames of it hold a whole chain up to the depth limit.
TEST(Stacks, TheFramePointerWalkAgreesWithTheDwarfUnwinder) {
  std::vector<std::uintptr_t> walked, unwound;
  capture_both_ways(walked, unwound, 40);
#if defined(__x86_64__) || defined(__aarch64__)
  ASSERT_EQ(walked.size(), 32u) << "the chain is whole up to the limit";
#else
  GTEST_SKIP() << "no frame-pointer walk on this architecture";
#endif
  // The two calls differ in their innermost frames; from the first recursive frame on they agree.
  ASSERT_NE(walked[1], walked[2]);
  const auto at = std::find(unwound.begin(), unwound.end(), walked[1]);
  ASSERT_NE(at, unwound.end());
  const std::size_t offset = static_cast<std::size_t>(at - unwound.begin());
  ASSERT_GE(unwound.size(), offset + 31);
  for (std::size_t i = 1; i < walked.size(); ++i) EXPECT_EQ(walked[i], unwound[offset + i - 1]) << "frame " << i;
}

#ifdef MEMSNAP_TEST_HAVE_CALL_WITHOUT_FRAME_POINTER
struct BrokenFrameCall {
  Recorder* recorder;
  int walked = -1;  // what the frame-pointer walk made of this stack
};

[[gnu::noinline]] void allocate_beneath_a_broken_frame(void* arg) {
  auto* call = static_cast<BrokenFrameCall*>(arg);
  std::uintptr_t pcs[32];
  call->walked = stacks::capture_with_frame_pointers(pcs, 32);
  call->recorder->record_alloc(0, 0x5000, 4096, 0);
  asm volatile("" ::: "memory");  // no tail call
}

[[gnu::noinline]] void call_through_a_broken_frame(BrokenFrameCall& call) {
  memsnap_test_call_without_frame_pointer(&allocate_beneath_a_broken_frame, &call);
  asm volatile("" ::: "memory");
}

// A frame whose frame pointer is not one (a library built without them, rbp in other use): the
// walk gives up there, and the DWARF unwinder takes the stack on past it to its callers.
TEST(Recorder, NativeStacksGoPastAFrameWithoutAFramePointer) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.stacks = StackMode::native;
  BrokenFrameCall call;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    call.recorder = &r;
    call_through_a_broken_frame(call);
    r.step();
    r.stop();
  }
  EXPECT_EQ(call.walked, 0) << "the walk refuses this chain, so the unwinder is what is tested";
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  ASSERT_EQ(rec.windows[0].events.size(), 1u);
  const auto id = rec.windows[0].events[0].stack_id;
  ASSERT_LT(id, rec.stacks.size());
  std::vector<std::string> names;
  for (const auto f : rec.stacks[id]) names.push_back(rec.frames.at(f).name);
  ASSERT_FALSE(names.empty());
  EXPECT_NE(names.front().find("allocate_beneath_a_broken_frame"), std::string::npos) << names.front();
  const auto named = [&](const char* what) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(named("memsnap_test_call_without_frame_pointer"));
  EXPECT_TRUE(named("call_through_a_broken_frame")) << "the stack goes on past the broken frame";
  EXPECT_TRUE(named("NativeStacksGoPastAFrameWithoutAFramePointer"));
}
#endif

// What the PyTorch attachment relies on (lib/torch/): see also tests/gpu/torch_attachment.sh.

Frame name_foreign_frame(std::uintptr_t entry) noexcept {
  return Frame{"py_fn_" + std::to_string(entry & 0xff), "train.py", static_cast<std::uint32_t>(entry & 0xff)};
}

TEST(Recorder, StacksOnlyForAllocationsAtOrAboveStackMinBytes) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.stacks = StackMode::python;
  c.stack_min_bytes = 1 << 20;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    r.set_foreign_frame_resolver(name_foreign_frame);
    EXPECT_FALSE(r.wants_stack(Action::alloc, 4096));
    EXPECT_TRUE(r.wants_stack(Action::alloc, 1 << 20));
    EXPECT_FALSE(r.wants_stack(Action::free_completed, 1 << 20)) << "frees carry no stack under a size floor";
    const std::uintptr_t frames[] = {kForeignFrame | 7, kForeignFrame | 9};
    r.record_from_allocator(Action::alloc, 0, 0x1000, 4096, 0, frames);       // small: no stack kept
    r.record_from_allocator(Action::alloc, 0, 0x100000, 1 << 20, 0, frames);  // large: its frames
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  ASSERT_EQ(rec.windows[0].events.size(), 2u);
  EXPECT_EQ(rec.windows[0].events[0].stack_id, kNoStack);
  const auto id = rec.windows[0].events[1].stack_id;
  ASSERT_LT(id, rec.stacks.size());
  ASSERT_EQ(rec.stacks[id].size(), 2u);
  EXPECT_EQ(rec.frames.at(rec.stacks[id][0]), (Frame{"py_fn_7", "train.py", 7})) << "innermost first, resolved by the source";
  EXPECT_EQ(rec.frames.at(rec.stacks[id][1]).name, "py_fn_9");
}

TEST(Recorder, OptimizerStepHintsCountOnlyWithoutExplicitBatchMarks) {
  for (const bool nvtx : {false, true}) {
    test::TempDir dir;
    Config c = config_in(dir);
    c.skip_batches = 1;
    c.interval = 2;
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    if (nvtx) r.batch_marks_expected();  // an NVTX "step" range was opened in batch 1
    for (int b = 1; b <= 4; ++b) {
      r.record_alloc(0, 0x1000 * b, 100, 0);
      r.step_hint();  // optimizer.step()
      if (nvtx) r.step();  // the range closes after it
    }
    EXPECT_EQ(r.stats().batch, 5) << (nvtx ? "with NVTX ranges the hints are ignored" : "hints count batches");
    r.stop();
    const RankRecord rec = only_spill(dir);
    ASSERT_EQ(rec.windows.size(), 1u);
    EXPECT_EQ(rec.windows[0].batch_start, 2);
    EXPECT_EQ(rec.windows[0].batch_end, 3);
    EXPECT_EQ(rec.windows[0].events.size(), 2u);
  }
}

TEST(Recorder, ASegmentSeenByCuptiAndTheAllocatorIsCountedOnce) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  constexpr std::uint64_t MiB = 1 << 20;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    // cudaMalloc inside the caching allocator (CUPTI first: an alloc, as CUPTI reports every
    // cudaMalloc), then its trace entry.
    r.record(Action::alloc, 0, 0x10000000, 20 * MiB, 0);
    r.record_from_allocator(Action::segment_alloc, 0, 0x10000000, 20 * MiB, 7);
    r.record_from_allocator(Action::alloc, 0, 0x10000000, 4 * MiB, 7);
    // Expandable segments: one cuMemMap per 2 MiB page, then one trace entry for the range.
    for (int page = 0; page < 3; ++page) r.record(Action::segment_map, 0, 0x20000000 + page * 2 * MiB, 2 * MiB, 0);
    r.record_from_allocator(Action::segment_map, 0, 0x20000000, 6 * MiB, 7);
    // The trace entry first, CUPTI's cudaFree after it.
    r.record_from_allocator(Action::free_completed, 0, 0x10000000, 4 * MiB, 7);
    r.record_from_allocator(Action::segment_free, 0, 0x10000000, 20 * MiB, 7);
    r.record(Action::free_completed, 0, 0x10000000, 0, 0);  // cudaFree, as CUPTI reports it
    // Memory the allocator never saw (NCCL's own cudaMalloc) stays.
    r.record(Action::alloc, 0, 0x30000000, 8 * MiB, 0);
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  std::vector<std::pair<Action, std::uint64_t>> got;
  for (const Event& e : rec.windows[0].events) got.emplace_back(e.action, e.addr);
  const std::vector<std::pair<Action, std::uint64_t>> want = {
      {Action::segment_alloc, 0x10000000}, {Action::alloc, 0x10000000},        {Action::segment_map, 0x20000000},
      {Action::free_completed, 0x10000000}, {Action::segment_free, 0x10000000}, {Action::alloc, 0x30000000}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(rec.windows[0].events[0].stream, 7u) << "the allocator's copy is the one kept";
  ASSERT_EQ(rec.windows[0].segments.size(), 1u) << "the mapped range at window end";
}

TEST(Recorder, ASegmentSeenByBothIsCountedOnceWhenARingFillsBetweenThem) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  constexpr std::uint64_t MiB = 1 << 20;
  constexpr int kRing = detail::ThreadBuffer::kCapacity;  // events a thread's ring holds before it is drained
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    r.record_from_allocator(Action::alloc, 0, 0x1000, 64, 7);
    for (int i = 1; i < kRing - 2; ++i) r.record_alloc(0, 0x100000 + i * 64, 64, 0);
    // CUPTI's three page maps fill the ring at the third; the trace entry comes after the drain.
    for (int page = 0; page < 3; ++page) r.record(Action::segment_map, 0, 0x20000000 + page * 2 * MiB, 2 * MiB, 0);
    r.record_from_allocator(Action::segment_map, 0, 0x20000000, 6 * MiB, 7);
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  std::vector<Event> maps;
  for (const Event& e : rec.windows[0].events) {
    if (e.action == Action::segment_map) maps.push_back(e);
  }
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].stream, 7u);
  EXPECT_EQ(maps[0].size, 6 * MiB);
  EXPECT_EQ(rec.windows[0].events.size(), std::size_t(kRing - 2) + 1);
}

std::int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The hot path may read the TSC; what is written is CLOCK_MONOTONIC ns, also across drains.
TEST(Recorder, EventTimesAreTheMonotonicClockAcrossDrains) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.max_entries = 1 << 16;
  constexpr int kRounds = 3;
  constexpr int kPerRound = detail::ThreadBuffer::kCapacity + 904;  // more than a thread's ring: drains mid-round
  std::vector<std::pair<std::int64_t, std::int64_t>> rounds;
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    for (int round = 0; round < kRounds; ++round) {
      const std::int64_t before = monotonic_ns();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a margin either side
      for (int i = 0; i < kPerRound; ++i) r.record_alloc(0, 0x100000 + (round * kPerRound + i) * 64, 64, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      rounds.emplace_back(before, monotonic_ns());
    }
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  const auto& events = rec.windows[0].events;
  ASSERT_EQ(events.size(), std::size_t(kRounds) * kPerRound);
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto [before, after] = rounds[i / kPerRound];
    ASSERT_GT(events[i].time_ns, before) << "event " << i;
    ASSERT_LT(events[i].time_ns, after) << "event " << i;
    if (i > 0) {
      ASSERT_GE(events[i].time_ns, events[i - 1].time_ns) << "event " << i;
    }
  }
}

TEST(Recorder, ASecondSourceJoinsTheRecordingAndIsNamed) {
  test::TempDir dir;
  {
    Recorder r;
    RecorderOptions cupti;
    cupti.source = "cupti";
    ASSERT_TRUE(r.start(config_in(dir), LaunchInfo{}, cupti));
    RecorderOptions torch;
    torch.source = "torch_tracker";
    EXPECT_TRUE(r.start(config_in(dir), LaunchInfo{}, torch)) << "the attachment joins CUPTI's recording";
    r.stop();
  }
  EXPECT_EQ(only_spill(dir).meta.source, "cupti+torch_tracker");
}

TEST(Recorder, OverwriteFalseKeepsTheEarlierRunAndStepsAside) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "spill");
  test::write_file(dir / "spill/rank0.pid1.spill", "earlier run");
  {
    Recorder r;
    EXPECT_FALSE(r.start(config_in(dir), LaunchInfo{}));
    r.record_alloc(0, 1, 1, 0);  // ignored, never crashes
    r.step();
    EXPECT_FALSE(r.active());
  }
  EXPECT_EQ(test::read_file(dir / "spill/rank0.pid1.spill"), "earlier run");
  EXPECT_EQ(find_spills(dir.path()).size(), 1u);

  Config c = config_in(dir);
  c.overwrite = true;
  Recorder r2;
  EXPECT_TRUE(r2.start(c, LaunchInfo{}));
  r2.stop();
  const auto spills = find_spills(dir.path());
  ASSERT_EQ(spills.size(), 1u);
  EXPECT_NE(spills[0].filename(), "rank0.pid1.spill");
}

TEST(Recorder, TwoRunsIntoOneFolderAtOnceTheSecondRefuses) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.overwrite = true;  // even so: the first run is alive
  Recorder first;
  ASSERT_TRUE(first.start(c, LaunchInfo{}));
  const pid_t child = fork();
  if (child == 0) {
    Recorder second;
    _exit(second.start(c, LaunchInfo{}) ? 1 : 0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the second recorder must refuse while the first records";
  first.record_alloc(0, 0x10, 16, 0);
  first.stop();
  EXPECT_EQ(find_spills(dir.path()).size(), 1u);
  // Once the first is done, the folder is free again.
  Recorder third;
  EXPECT_TRUE(third.start(c, LaunchInfo{}));
  third.stop();
}

TEST(Recorder, AFolderRemovedWhileRecordingIsNoticedOnce) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 2;
  c.repeat = -1;
  Recorder r;
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  r.record_alloc(0, 0x10, 16, 0);
  r.step();
  std::filesystem::remove_all(dir / "spill");
  for (int b = 0; b < 5; ++b) {
    r.record_alloc(0, 0x100 + b, 16, 0);
    r.step();
  }
  EXPECT_TRUE(within_10s([&] { return !r.active(); })) << "recording into a deleted file helps nobody";
  r.stop();
}

// Many threads keep allocating while the main thread closes window after window.
TEST(Recorder, ThreadsAllocatingWhileWindowsCloseLoseNothing) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 1;
  c.repeat = -1;
  c.max_entries = 1 << 22;
  std::atomic<bool> go{true};
  std::atomic<std::uint64_t> recorded{0};
  {
    Recorder r;
    ASSERT_TRUE(r.start(c, LaunchInfo{}));
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Freed again: every window opens and closes with what is live listed, and a live set
        // growing with the recorder's speed would make each window slower than the last.
        for (std::uint64_t i = 0; go.load(std::memory_order_relaxed); ++i) {
          const std::uint64_t addr = (std::uint64_t(t + 1) << 36) + i * 64;
          r.record_alloc(0, addr, 64, t);
          r.record_free(0, addr, 64, t);
          recorded.fetch_add(2, std::memory_order_relaxed);
        }
      });
    }
    for (int b = 0; b < 40; ++b) {
      usleep(2000);
      r.step();
    }
    go = false;
    for (auto& th : threads) th.join();
    r.step();
    r.stop();
  }
  const RankRecord rec = only_spill(dir);
  EXPECT_EQ(rec.status, RecordStatus::ok) << rec.status_detail;
  std::uint64_t stored = 0, dropped = 0;
  for (const auto& w : rec.windows) {
    EXPECT_TRUE(w.closed);
    stored += w.events.size();
    dropped += w.dropped;
  }
  EXPECT_EQ(stored + dropped, recorded.load()) << "every event is in a window or counted as dropped";
  EXPECT_EQ(dropped, 0u);
}

// A program whose SIGTERM handler exits while memsnap may be writing a window: it always ends,
// and what it wrote reads back.
volatile std::sig_atomic_t g_term_seen = 0;

TEST(Recorder, SigtermDuringAWindowWriteNeverHangs) {
  // Even trials: the job handles SIGTERM the way Python does (the handler only sets a flag, the
  // program exits at its next safe point and memsnap's exit handler closes the window while its
  // writer may be mid-write). Odd trials: SIGTERM's default action kills the job mid-write.
  // (exit() inside the handler itself is not async-signal-safe: glibc's own exit path can then
  // deadlock on malloc's lock, with or without memsnap.)
  for (int trial = 0; trial < 12; ++trial) {
    test::TempDir dir;
    // The child says when it has started recording; the signal comes a trial-dependent time after
    // that. (Timed from fork alone, a slow fork under TSan on a loaded machine let SIGTERM land
    // before the handler was even installed.)
    int started[2];
    ASSERT_EQ(pipe(started), 0);
    const pid_t child = fork();
    if (child == 0) {
      close(started[0]);
      if (trial % 2 == 0) signal(SIGTERM, [](int) { g_term_seen = 1; });
      Config c = config_in(dir);
      c.skip_batches = 0;
      c.interval = 1;
      c.repeat = -1;
      Recorder& r = Recorder::global();
      if (!r.start(c, LaunchInfo{})) _exit(2);
      for (std::uint64_t i = 0;; ++i) {
        r.record_alloc(0, 0x1000 + i * 64, 64, 0);
        if (i % 5000 == 0) {
          r.step();
          if (started[1] >= 0 && i >= 5000) {  // a window is open and being written
            const char one = 1;
            (void)!write(started[1], &one, 1);
            close(started[1]);
            started[1] = -1;
          }
        }
        if (g_term_seen) std::exit(0);
      }
    }
    close(started[1]);
    pollfd ready{started[0], POLLIN, 0};
    ASSERT_EQ(poll(&ready, 1, 10000), 1) << "trial " << trial << ": the child did not start recording within 10 s";
    close(started[0]);
    usleep(trial * 3000);
    kill(child, SIGTERM);
    int status = 0;
    pid_t done = 0;
    for (int waited = 0; waited < 1000 && done == 0; ++waited) {  // 10 s at most
      done = waitpid(child, &status, WNOHANG);
      if (done == 0) usleep(10000);
    }
    if (done == 0) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL() << "trial " << trial << ": the program did not end within 10 s of SIGTERM";
    }
    if (trial % 2 == 0) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "trial " << trial;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "trial " << trial;
    }
    const auto spills = find_spills(dir.path());
    // A kill that lands before the recorder started leaves no spill; anything else leaves one.
    if (trial % 2 == 0) {
      EXPECT_EQ(spills.size(), 1u) << "trial " << trial;
    } else {
      EXPECT_LE(spills.size(), 1u) << "trial " << trial;
    }
    for (const auto& p : spills) {
      RankRecord rec;
      EXPECT_NO_THROW(rec = read_spill(p)) << "trial " << trial;
      EXPECT_NE(rec.status, RecordStatus::corrupt) << rec.status_detail;
      // An orderly exit closes the record; a kill leaves what was written, as a readable prefix.
      EXPECT_EQ(rec.status, trial % 2 == 0 ? RecordStatus::ok : RecordStatus::truncated)
          << "trial " << trial << ": " << rec.status_detail;
    }
  }
}

TEST(Recorder, UnwritableFolderStepsAsideWithoutThrowing) {
  if (geteuid() == 0) {
    // root ignores permissions; a path under a regular file cannot be created by anyone.
    test::TempDir dir;
    test::write_file(dir / "file", "x");
    Config c = config_in(dir);
    c.folder = (dir / "file/sub").string();
    Recorder r;
    EXPECT_FALSE(r.start(c, LaunchInfo{}));
    r.record_alloc(0, 1, 1, 0);
    r.step();
    return;
  }
  test::TempDir dir;
  chmod(dir.path().c_str(), 0500);
  Recorder r;
  EXPECT_FALSE(r.start(config_in(dir), LaunchInfo{}));
}

TEST(Recorder, FullDiskStopsRecordingButNotTheProgram) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  // A spill whose writes fail with ENOSPC: the recorder warns once and steps aside.
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  c.interval = 1;
  c.repeat = -1;
  Recorder r;
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  const std::string spill = r.stats().spill_path;
  std::filesystem::remove(spill);
  ASSERT_EQ(symlink("/dev/full", spill.c_str()), 0);
  // Reopen through the symlink is not possible for the writer; instead redirect its fd.
  const int full = open("/dev/full", O_WRONLY);
  ASSERT_GE(full, 0);
  // The writer's fd is the most recently opened spill descriptor; find it through /proc.
  int spill_fd = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find(std::filesystem::path(spill).filename().string()) != std::string::npos) {
      spill_fd = std::stoi(e.path().filename().string());
    }
  }
  ASSERT_GE(spill_fd, 0);
  ASSERT_GE(dup2(full, spill_fd), 0);
  close(full);
  for (int b = 0; b < 5; ++b) {
    r.record_alloc(0, 0x1000 + b, 8, 0);
    r.step();
  }
  EXPECT_TRUE(within_10s([&] { return !r.active(); }));
  r.stop();
}

TEST(Recorder, ForkChildRecordsNothing) {
  test::TempDir dir;
  Config c = config_in(dir);
  c.skip_batches = 0;
  Recorder& r = Recorder::global();
  ASSERT_TRUE(r.start(c, LaunchInfo{}));
  r.record_alloc(0, 0x1, 8, 0);
  const pid_t child = fork();
  if (child == 0) {
    // The child's copy of the recorder is inert: no lock, no write, normal exit.
    r.record_alloc(0, 0x2, 8, 0);
    r.step();
    r.stop();
    _exit(r.active() ? 3 : 0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  r.step();
  r.stop();
  const RankRecord rec = only_spill(dir);
  ASSERT_EQ(rec.windows.size(), 1u);
  EXPECT_EQ(rec.windows[0].events.size(), 1u) << "the child's event is not in the parent's record";
}

TEST(Recorder, ProcessKilledMidWindowLeavesEveryFlushedBatch) {
  test::TempDir dir;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    Config c = config_in(dir);
    c.skip_batches = 0;
    c.interval = 1000;  // the window is still open when the kill comes
    Recorder r;
    if (!r.start(c, LaunchInfo{})) _exit(2);
    for (int b = 0;; ++b) {
      for (int i = 0; i < 100; ++i) r.record_alloc(0, (std::uint64_t(b) << 20) + i * 64, 64, 0);
      r.step();
      if (b == 4) {
        char x = 'x';
        (void)!write(ready[1], &x, 1);
      }
      if (b >= 4) usleep(1000);
    }
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  // The writer thread writes the batches a moment after their ends (longer on a loaded machine,
  // or under a sanitizer): the kill comes once five batches are on disk, mid-window.
  within_10s([&] {
    const RankRecord now = only_spill(dir);
    return !now.windows.empty() && now.windows[0].events.size() >= 500;
  });
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const RankRecord rec = only_spill(dir);
  EXPECT_EQ(rec.status, RecordStatus::truncated) << rec.status_detail;
  ASSERT_EQ(rec.windows.size(), 1u);
  const auto& w = rec.windows[0];
  EXPECT_FALSE(w.closed);
  EXPECT_EQ(w.status, RecordStatus::truncated);
  // Every batch stepped before the kill is there, whole and in order; of the batch that was
  // running, what had been drained (each drain writes an open window's events).
  ASSERT_GE(w.events.size(), 500u);
  for (std::size_t i = 0; i < w.events.size(); ++i) {
    EXPECT_EQ(w.events[i].addr, ((i / 100) << 20) + (i % 100) * 64) << i;
  }
  EXPECT_GE(w.batches.size(), 5u);
}

}  // namespace
}  // namespace memsnap
