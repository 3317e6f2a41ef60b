// Batch inference on traces made to a plan: each method is reached when (and only when) the
// evidence it trusts is there, and the boundaries land where the plan put them.
#include <gtest/gtest.h>

#include "memsnap/analysis.hpp"
#include "memsnap/batch_inference.hpp"

namespace memsnap {
namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

// A loop of `batches` batches, each: `micro` forward passes allocating `layers` activations
// (freed after their backward), each micro-batch's gradients (kept until the optimizer step at the
// batch's end). `stacks` false: no frames anywhere. Returns each batch's first event index.
struct Trace {
  RankRecord rank;
  WindowRecord w;
  std::vector<std::size_t> batch_first_event;
};

Trace make_trace(int batches, int micro, int layers, bool stacks, std::uint64_t leak = 0) {
  Trace t;
  RankRecord& r = t.rank;
  if (stacks) {
    r.frames = {{"forward", "model.py", 10}, {"backward", "train.py", 42}, {"step", "train.py", 50}, {"train", "train.py", 30}};
    r.stacks = {{0, 3}, {1, 3}, {2, 3}};
  }
  std::int64_t now = 1000;
  std::uint64_t addr = 0x10000;
  auto ev = [&](Action a, std::uint64_t at, std::uint64_t size, std::uint32_t stack) {
    Event e;
    e.time_ns = now += 1000;
    e.action = a;
    e.addr = at;
    e.size = size;
    e.stack_id = stacks ? stack : kNoStack;
    t.w.events.push_back(e);
  };
  for (int b = 0; b < batches; ++b) {
    t.batch_first_event.push_back(t.w.events.size());
    std::vector<std::uint64_t> grads;
    for (int m = 0; m < micro; ++m) {
      std::vector<std::uint64_t> acts;
      for (int l = 0; l < layers; ++l) {
        acts.push_back(addr += 0x100000);
        ev(Action::alloc, acts.back(), (8 + l) * MiB, 0);
      }
      for (int l = layers - 1; l >= 0; --l) {
        if (m == 0) {
          grads.push_back(addr += 0x100000);
          ev(Action::alloc, grads.back(), MiB + l * 4096, 1);
        } else {  // accumulated: computed into a temporary, added in place, freed
          const std::uint64_t tmp = addr += 0x100000;
          ev(Action::alloc, tmp, MiB + l * 4096, 1);
          ev(Action::free_requested, tmp, MiB + l * 4096, 1);
          ev(Action::free_completed, tmp, MiB + l * 4096, 1);
        }
        ev(Action::free_requested, acts[l], (8 + l) * MiB, 0);
        ev(Action::free_completed, acts[l], (8 + l) * MiB, 0);
      }
    }
    if (leak) ev(Action::alloc, addr += 0x100000, leak, 2);
    for (auto g : grads) {
      ev(Action::free_requested, g, 0, 1);
      ev(Action::free_completed, g, 0, 1);
    }
  }
  t.w.batch_end = 10;
  t.w.open_time_ns = 1000;
  t.w.close_time_ns = now + 1;
  t.w.closed = true;
  return t;
}

TEST(BatchInference, RecurringFrameFindsEveryBatchStart) {
  Trace t = make_trace(5, 1, 6, true);
  const auto found = infer_batches(t.rank, t.w, {});
  EXPECT_EQ(found.method, "recurring_frame");
  ASSERT_EQ(found.starts.size(), 5u) << found.detail;
  EXPECT_EQ(found.starts[0], t.w.open_time_ns);  // the window opened at a batch start
  for (std::size_t b = 1; b < 5; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
  EXPECT_GT(found.confidence, 0.8);
}

TEST(BatchInference, WithoutFramesThePeriodOfSizesFindsThem) {
  Trace t = make_trace(6, 1, 5, false);
  const auto found = infer_batches(t.rank, t.w, {});
  EXPECT_EQ(found.method, "periodicity") << found.detail;
  ASSERT_EQ(found.starts.size(), 6u) << found.detail;
  for (std::size_t b = 1; b < 6; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
}

TEST(BatchInference, RecurringAnnotationWinsOverFrames) {
  Trace t = make_trace(4, 1, 6, true);
  std::vector<Annotation> ann;
  for (std::size_t b = 1; b < 4; ++b) {
    const auto t_step = t.w.events[t.batch_first_event[b] - 1].time_ns;  // the step ends each batch
    ann.push_back({"Optimizer.step#SGD.step", true, t_step - 500});
    ann.push_back({"Optimizer.step#SGD.step", false, t_step + 1});
  }
  ann.push_back({"Optimizer.step#SGD.step", true, t.w.close_time_ns - 2});
  ann.push_back({"Optimizer.step#SGD.step", false, t.w.close_time_ns - 1});
  ann.push_back({"Optimizer.step#SGD.step", true, t.w.close_time_ns + 1'000'000});  // after the trace: ignored
  const auto found = infer_batches(t.rank, t.w, ann);
  EXPECT_EQ(found.method, "recurring_annotation") << found.detail;
  ASSERT_EQ(found.starts.size(), 4u) << found.detail;
  for (std::size_t b = 1; b < 4; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
}

TEST(BatchInference, StepAnnotationsAreTheTracesOwnMarks) {
  Trace t = make_trace(3, 1, 4, true);
  std::vector<Annotation> ann = {{"ProfilerStep#7", true, t.w.events[0].time_ns}, {"ProfilerStep#8", true, t.w.events[t.batch_first_event[1]].time_ns}};
  const auto found = infer_batches(t.rank, t.w, ann);
  EXPECT_EQ(found.method, "step_annotation");
  EXPECT_TRUE(found.numbered);
  EXPECT_EQ(found.numbers, (std::vector<std::int64_t>{7, 8}));
}

TEST(BatchInference, MicroBatchesAreGroupedIntoBatches) {
  // Gradient accumulation: every forward allocation recurs twice a batch.
  Trace t = make_trace(4, 2, 6, true);
  BatchInferenceOptions known;
  known.expected_batches = 4;
  for (const auto& opt : {known, BatchInferenceOptions{}}) {
    const auto found = infer_batches(t.rank, t.w, {}, opt);
    ASSERT_EQ(found.starts.size(), 4u) << opt.expected_batches << ": " << found.detail;
    for (std::size_t b = 1; b < 4; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
    EXPECT_NE(found.detail.find("micro-batches"), std::string::npos) << found.detail;
  }
}

TEST(BatchInference, NoStructureNoBatches) {
  Trace t;
  std::uint64_t x = 12345;
  for (int i = 0; i < 200; ++i) {  // sizes from a generator with no period
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    Event e;
    e.time_ns = 1000 + i * 1000;
    e.action = Action::alloc;
    e.addr = 0x1000 * (i + 1);
    e.size = (x >> 20) % 100000 + 1;
    t.w.events.push_back(e);
  }
  t.w.batch_end = 3;
  const auto found = infer_batches(t.rank, t.w, {});
  EXPECT_EQ(found.method, "none") << found.detail;
  EXPECT_TRUE(found.starts.empty());
  apply_inferred_batches(found, t.w);
  EXPECT_EQ(t.w.batch_start, 3);
  EXPECT_TRUE(t.w.batches.empty());
}

TEST(BatchInference, AppliedBatchesGiveALeakItsGrowthAndSite) {
  Trace t = make_trace(5, 1, 6, true, 3 * MiB);
  const auto found = infer_batches(t.rank, t.w, {});
  apply_inferred_batches(found, t.w);
  EXPECT_EQ(t.w.batch_method, "recurring_frame");
  EXPECT_EQ(t.w.batch_start, 6);
  ASSERT_EQ(t.w.batches.size(), 5u);
  EXPECT_EQ(t.w.batches.back().batch, 10);
  const WindowStats s = analyse_window(t.rank, t.w);
  EXPECT_TRUE(s.growth_monotone);
  EXPECT_NEAR(s.growth_per_batch, 3.0 * MiB, 1.0);
  EXPECT_EQ(s.growth_site, "step (train.py:50)");
  EXPECT_NEAR(s.growth_site_per_batch, 3.0 * MiB, 1.0);
  // Kept for good: one code path allocated at 5 separate times, all still held.
  EXPECT_NEAR(s.retained_per_batch, 3.0 * MiB, 1.0);
  EXPECT_EQ(s.retained_site, "step (train.py:50)");
  EXPECT_EQ(s.retained_times, 5u);

  Trace clean = make_trace(5, 1, 6, true);
  apply_inferred_batches(infer_batches(clean.rank, clean.w, {}), clean.w);
  EXPECT_EQ(analyse_window(clean.rank, clean.w).retained_per_batch, 0.0);
}

// What the last batch holds from two code paths at two times (two views through one model, a
// GAN's two backward passes) is the batch's own, not kept: the same site, but two stacks.
TEST(BatchInference, KeptMemoryIsCountedByCodePathNotBySite) {
  for (bool one_path : {false, true}) {
    Trace t = make_trace(4, 1, 4, true);
    t.rank.frames.push_back({"encode", "train.py", 60});
    t.rank.frames.push_back({"encode", "train.py", 61});
    t.rank.stacks.push_back({0, 4});  // forward (model.py:10) called from line 60
    t.rank.stacks.push_back({0, 5});  // ... from line 61
    // Both from line 60 (one interned stack), or one from each line.
    const auto second = static_cast<std::uint32_t>(t.rank.stacks.size() - (one_path ? 2 : 1));
    std::int64_t now = t.w.events.back().time_ns;
    const std::int64_t batch_ns = t.w.events[t.batch_first_event[1]].time_ns - t.w.events[0].time_ns;
    auto alloc = [&](std::uint64_t addr, std::uint32_t stack) {
      Event e;
      e.time_ns = now += batch_ns / 2;  // half a batch apart: separate times
      e.action = Action::alloc;
      e.addr = addr;
      e.size = 5 * MiB;
      e.stack_id = stack;
      t.w.events.push_back(e);
    };
    alloc(0x7000000000, static_cast<std::uint32_t>(t.rank.stacks.size() - 2));
    alloc(0x7100000000, second);
    t.w.close_time_ns = now + 1;
    apply_inferred_batches(infer_batches(t.rank, t.w, {}), t.w);
    const WindowStats s = analyse_window(t.rank, t.w);
    if (one_path) {
      EXPECT_NEAR(s.retained_per_batch, 5.0 * MiB, 1.0);
    } else {
      EXPECT_EQ(s.retained_per_batch, 0.0) << s.retained_site;
    }
  }
}

// Appended to each batch of a trace: at its end, one allocation of `sizes[b]` from `stack`,
// freeing the one before (a tensor regrown each batch, or an input rebound); the last is held.
void regrow(Trace& t, const std::vector<std::uint64_t>& sizes, std::uint32_t stack) {
  std::vector<Event> out;
  std::uint64_t last = 0;
  std::size_t b = 0;
  for (std::size_t i = 0; i < t.w.events.size(); ++i) {
    out.push_back(t.w.events[i]);
    const bool batch_ends = b + 1 < t.batch_first_event.size() ? i + 1 == t.batch_first_event[b + 1] : i + 1 == t.w.events.size();
    if (!batch_ends) continue;
    Event e = t.w.events[i];
    e.time_ns += 1;
    e.action = Action::alloc;
    e.addr = 0x9000000000 + b * 0x10000000;
    e.size = sizes[b];
    e.stack_id = stack;
    out.push_back(e);
    if (last) {
      e.action = Action::free_completed;
      e.addr = last;
      e.time_ns += 1;
      out.push_back(e);
    }
    last = 0x9000000000 + b * 0x10000000;
    ++b;
  }
  t.w.events = std::move(out);
}

// `all = torch.cat([all, new])` keeps every batch's results in one tensor and frees the last
// one each time: nothing from earlier times is held, but the code path grows by the same amount
// every batch. Inputs whose sizes happen to rise (160, 192, 256, 320 rows) are not that.
TEST(BatchInference, ATensorRegrownByEqualStepsIsKept) {
  for (bool equal_steps : {true, false}) {
    Trace t = make_trace(4, 1, 4, true);
    const std::vector<std::uint64_t> sizes =
        equal_steps ? std::vector<std::uint64_t>{8 * MiB, 12 * MiB, 16 * MiB, 20 * MiB}
                    : std::vector<std::uint64_t>{160 * MiB / 32, 192 * MiB / 32, 256 * MiB / 32, 320 * MiB / 32};
    regrow(t, sizes, 2);
    apply_inferred_batches(infer_batches(t.rank, t.w, {}), t.w);
    const WindowStats s = analyse_window(t.rank, t.w);
    if (equal_steps) {
      EXPECT_NEAR(s.retained_per_batch, 4.0 * MiB, 1.0);
      EXPECT_EQ(s.retained_site, "step (train.py:50)");
    } else {
      EXPECT_EQ(s.retained_per_batch, 0.0);
    }
  }
}

// Recorded without stacks (the C API, CUPTI, the PyTorch attachment's default): what the last
// batch holds comes at several times but in several sizes; what a leak keeps comes in one.
TEST(BatchInference, WithoutStacksKeptMemoryIsGroupedBySize) {
  Trace t = make_trace(5, 1, 6, false, 3 * MiB);
  apply_inferred_batches(infer_batches(t.rank, t.w, {}), t.w);
  EXPECT_NEAR(analyse_window(t.rank, t.w).retained_per_batch, 3.0 * MiB, 1.0);
  Trace clean = make_trace(5, 1, 6, false);
  regrow(clean, {1 * MiB, 3 * MiB, 2 * MiB, 5 * MiB, 4 * MiB}, kNoStack);  // the last batch's input
  // ... and outputs of other sizes held from other times of the last batch.
  for (std::uint64_t k = 0; k < 3; ++k) {
    Event e = clean.w.events.back();
    e.time_ns += 1'000'000 * (k + 1);
    e.action = Action::alloc;
    e.addr = 0xA000000000 + k * 0x1000000;
    e.size = (7 + k) * MiB;
    clean.w.events.push_back(e);
  }
  clean.w.close_time_ns = clean.w.events.back().time_ns + 1;
  apply_inferred_batches(infer_batches(clean.rank, clean.w, {}), clean.w);
  EXPECT_EQ(analyse_window(clean.rank, clean.w).retained_per_batch, 0.0);
}

// torch.optim's step ends a batch however unevenly the steps come: a slow batch (a spike, a
// recompilation) does not make them irregular enough to be dropped, with the count known or not.
TEST(BatchInference, OptimizerStepsCountHoweverUnevenlyTheyCome) {
  Trace t = make_trace(4, 1, 6, true);
  for (std::size_t i = t.batch_first_event[2]; i < t.w.events.size(); ++i) t.w.events[i].time_ns += 50'000'000;
  t.w.close_time_ns += 50'000'000;
  std::vector<Annotation> ann;
  for (std::size_t b = 1; b <= 4; ++b) {
    const auto t_step = b < 4 ? t.w.events[t.batch_first_event[b] - 1].time_ns : t.w.close_time_ns - 2;
    ann.push_back({"Optimizer.step#AdamW.step", true, t_step - 500});
  }
  BatchInferenceOptions known;
  known.expected_batches = 4;
  for (const auto& opt : {known, BatchInferenceOptions{}}) {
    const auto found = infer_batches(t.rank, t.w, ann, opt);
    EXPECT_EQ(found.method, "recurring_annotation") << found.detail;
    ASSERT_EQ(found.starts.size(), 4u) << found.detail;
    for (std::size_t b = 1; b < 4; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
    EXPECT_GE(found.confidence, 0.8);
  }
}

// Issue #27: the loop catches torch's OutOfMemoryError in batch 2 and goes on. That batch never
// reached its optimizer step, so the steps mark 4 of the 5 batches; the caught OOM ends its own
// batch where memory falls back after it. The batch then carries the OOM: what it asked for,
// what was allocated, the line that asked, and that the job went on.
TEST(BatchInference, ACaughtOomEndsItsBatch) {
  Trace t = make_trace(5, 1, 6, true);
  const std::size_t first = t.batch_first_event[2], next = t.batch_first_event[3];
  std::vector<Event> aborted(t.w.events.begin() + static_cast<std::ptrdiff_t>(first),
                             t.w.events.begin() + static_cast<std::ptrdiff_t>(first + 3));  // 3 activations
  Event oom = aborted.back();
  oom.action = Action::oom;
  oom.size = 64 * MiB;
  oom.addr = 0;  // torch's device_free
  aborted.push_back(oom);
  for (std::size_t i = 0; i < 3; ++i) {
    Event f = aborted[i];
    f.action = Action::free_requested;
    aborted.push_back(f);
    f.action = Action::free_completed;
    aborted.push_back(f);
  }
  for (std::size_t i = 0; i < aborted.size(); ++i) aborted[i].time_ns = t.w.events[first + i].time_ns;
  t.w.events.erase(t.w.events.begin() + static_cast<std::ptrdiff_t>(first + aborted.size()),
                   t.w.events.begin() + static_cast<std::ptrdiff_t>(next));
  std::copy(aborted.begin(), aborted.end(), t.w.events.begin() + static_cast<std::ptrdiff_t>(first));
  const std::ptrdiff_t removed = static_cast<std::ptrdiff_t>(next - first - aborted.size());
  for (std::size_t b = 3; b < 5; ++b) t.batch_first_event[b] -= static_cast<std::size_t>(removed);
  std::vector<Annotation> ann;
  for (std::size_t b : {1, 2, 4}) {  // the steps ending batches 0, 1 and 3
    const auto t_step = t.w.events[t.batch_first_event[b] - 1].time_ns;
    ann.push_back({"Optimizer.step#Adam.step", true, t_step - 500});
    ann.push_back({"Optimizer.step#Adam.step", false, t_step + 1});
  }
  ann.push_back({"Optimizer.step#Adam.step", true, t.w.close_time_ns - 2});
  ann.push_back({"Optimizer.step#Adam.step", false, t.w.close_time_ns - 1});
  BatchInferenceOptions known;
  known.expected_batches = 5;
  for (const auto& opt : {known, BatchInferenceOptions{}}) {
    const auto found = infer_batches(t.rank, t.w, ann, opt);
    EXPECT_EQ(found.method, "recurring_annotation") << found.detail;
    ASSERT_EQ(found.starts.size(), 5u) << found.detail;
    for (std::size_t b = 1; b < 5; ++b) EXPECT_EQ(found.starts[b], t.w.events[t.batch_first_event[b]].time_ns) << b;
    EXPECT_NE(found.detail.find("OOM"), std::string::npos) << found.detail;
    EXPECT_EQ(found.detail.find("were expected"), std::string::npos) << found.detail;
  }
  apply_inferred_batches(infer_batches(t.rank, t.w, ann, known), t.w);
  t.w.oom = true;
  const WindowStats s = analyse_window(t.rank, t.w);
  ASSERT_EQ(s.batches.size(), 5u);
  for (std::size_t b = 0; b < 5; ++b) EXPECT_EQ(s.batches[b].oom, b == 2) << b;
  const BatchStat& failed = s.batches[2];
  EXPECT_EQ(failed.batch, 8);
  EXPECT_TRUE(failed.oom_went_on);
  EXPECT_EQ(failed.oom_requested, 64 * MiB);
  EXPECT_EQ(failed.live_at_oom, (8 + 9 + 10) * MiB);
  EXPECT_EQ(failed.oom_site, "forward (model.py:10)");
  EXPECT_EQ(failed.min_allocated, s.batches[3].min_allocated) << "it began and ended as low as the next";
  EXPECT_TRUE(s.oom && s.oom_went_on);
  EXPECT_EQ(s.live_at_oom, failed.live_at_oom);
  EXPECT_EQ(s.oom_site, failed.oom_site);
}

// A GAN steps two optimizers of one class each batch; their annotations name the class only.
// What each step allocates next comes from its own code (A B A B): one batch per two steps.
TEST(BatchInference, TwoOptimizersOfOneClassCountOnceABatch) {
  Trace t = make_trace(4, 1, 6, true);
  std::vector<Annotation> ann;
  for (std::size_t b = 0; b < 4; ++b) {
    const std::size_t first = t.batch_first_event[b];
    // Mid-batch, the discriminator's step: its first allocation is a gradient's (stack 1). At the
    // batch end, the generator's: the next forward's (stack 0) comes inside it here.
    const auto mid = t.w.events[first + 5].time_ns + 1;
    ann.push_back({"Optimizer.step#Adam.step", true, mid});
    ann.push_back({"Optimizer.step#Adam.step", false, t.w.events[first + 6].time_ns + 1});
    const auto end = b < 3 ? t.w.events[t.batch_first_event[b + 1] - 1].time_ns : t.w.close_time_ns - 2;
    ann.push_back({"Optimizer.step#Adam.step", true, end - 1});
    ann.push_back({"Optimizer.step#Adam.step", false, b < 3 ? t.w.events[t.batch_first_event[b + 1]].time_ns + 1 : t.w.close_time_ns - 1});
  }
  const auto found = infer_batches(t.rank, t.w, ann);
  EXPECT_EQ(found.method, "recurring_annotation") << found.detail;
  EXPECT_NE(found.detail.find("2 optimizers step in each batch"), std::string::npos) << found.detail;
  EXPECT_EQ(found.starts.size(), 4u) << found.detail;
}

// What the lowest batch boundary holds, by site and largest first, adds up to that low point:
// what a rank holding more at every boundary than the others is named by.
TEST(BatchInference, TheLowestBoundaryIsHeldBySite) {
  Trace t = make_trace(5, 1, 6, true);
  // Held from before the window: 7 MiB from the step's code path, 5 MiB from the forward's.
  t.w.live_at_start.push_back(LiveAlloc{0x1000, 7 * MiB, 0, 0, 2, 0, 0, 0});
  t.w.live_at_start.push_back(LiveAlloc{0x2000, 5 * MiB, 0, 0, 0, 0, 0, 0});
  apply_inferred_batches(infer_batches(t.rank, t.w, {}), t.w);
  const WindowStats s = analyse_window(t.rank, t.w);
  ASSERT_GE(s.batches.size(), 2u);
  std::uint64_t lowest = UINT64_MAX, held = 0;
  for (const auto& b : s.batches) lowest = std::min(lowest, b.min_allocated);
  ASSERT_EQ(s.sites_at_low.size(), 2u);
  EXPECT_EQ(s.sites_at_low[0].name, "step (train.py:50)");
  EXPECT_EQ(s.sites_at_low[0].bytes, 7 * MiB);
  EXPECT_EQ(s.sites_at_low[1].name, "forward (model.py:10)");
  for (const auto& h : s.sites_at_low) held += h.bytes;
  EXPECT_EQ(held, lowest);
}

// Categories come from the innermost frame that says what the memory is for. FSDP's unshard
// all-gathers; a module kept "unsharded" holds parameters, not an all-gather's buffer.
TEST(Categories, UnshardIsAnAllGatherAndUnshardedIsNot) {
  RankRecord r;
  r.frames = {{"unshard", "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 300},
              {"init_unsharded_module", "train.py", 12},
              {"_init_group", "torch/optim/adam.py", 150},
              {"main", "train.py", 40}};
  r.stacks = {{0, 3}, {1, 3}, {2, 3}, {1, 0, 3}};
  EXPECT_EQ(categorize(r, 0), Category::all_gather);
  EXPECT_NE(categorize(r, 1), Category::all_gather);
  EXPECT_EQ(categorize(r, 2), Category::optimizer_state);
  EXPECT_EQ(categorize(r, 3), Category::all_gather) << "the next frame out still decides";
}

}  // namespace
}  // namespace memsnap
