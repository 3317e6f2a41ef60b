// One replay of a window (memsnap/window_replay.hpp): what each event does to what is live, and
// the analysis, `memsnap export --format chrome` (through a real store) and the rank page
// agreeing on it where their copies of the replay used not to (a segment_alloc on a live key).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/import_export.hpp"
#include "memsnap/report.hpp"
#include "memsnap/store.hpp"
#include "memsnap/window_replay.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t MiB = 1ull << 20;

Event ev(std::int64_t t, Action a, std::uint64_t addr, std::uint64_t size, std::uint32_t stack = kNoStack) {
  Event e;
  e.time_ns = t;
  e.action = a;
  e.addr = addr;
  e.size = size;
  e.stack_id = stack;
  return e;
}

LiveAlloc live(std::uint64_t addr, std::uint64_t size, bool segment, std::uint32_t stack = kNoStack) {
  return LiveAlloc{addr, size, 0, 10, stack, 0, static_cast<std::uint8_t>(segment ? 1 : 0), 0};
}

WindowRecord window(std::vector<LiveAlloc> at_open, std::vector<Event> events) {
  WindowRecord w;
  w.batch_start = 1;
  w.batch_end = 3;
  w.open_time_ns = 1000;
  w.close_time_ns = 10000;
  w.closed = true;
  w.live_at_start = std::move(at_open);
  w.events = std::move(events);
  return w;
}

TEST(WindowReplayTest, SegmentOnALiveSegmentKeyReplacesIt) {
  // The segment_free of the 1 MiB segment was lost; the address now holds a 4 MiB one.
  const WindowRecord w = window({live(0x100000, MiB, true)}, {ev(2000, Action::segment_alloc, 0x100000, 4 * MiB, 3),
                                                              ev(3000, Action::segment_free, 0x100000, 4 * MiB),
                                                              ev(4000, Action::segment_unmap, 0x100000, 4 * MiB)});
  WindowReplay r(w);
  EXPECT_EQ(r.reserved(), MiB);
  ReplayStep s = r.step();
  EXPECT_EQ(s.kind, ReplayStep::segment_alloc);
  ASSERT_TRUE(s.ended);
  EXPECT_EQ(s.old.size, MiB);
  EXPECT_EQ(r.reserved(), 4 * MiB);
  EXPECT_EQ(r.segments().size(), 1u);
  EXPECT_EQ(r.segments().find(live_key(0, 0x100000))->stack_id, 3u);
  s = r.step();
  EXPECT_EQ(s.kind, ReplayStep::segment_free);
  EXPECT_TRUE(s.ended);
  EXPECT_EQ(s.old.size, 4 * MiB);
  EXPECT_EQ(r.reserved(), 0u);
  s = r.step();  // nothing live there any more
  EXPECT_EQ(s.kind, ReplayStep::segment_free);
  EXPECT_FALSE(s.ended);
  EXPECT_EQ(r.reserved(), 0u);
  EXPECT_TRUE(r.done());
  // A segment and an allocation at one address are both live.
  EXPECT_EQ(r.allocated(), 0u);
}

TEST(WindowReplayTest, AllocOnALiveKeyReplacesItAndSerialsNumberAllocations) {
  const WindowRecord w = window({live(0xa000, 64, false), live(0xa000, 999, false), live(0xb000, 32, false)},
                                {ev(2000, Action::alloc, 0xc000, 100, 1), ev(2100, Action::alloc, 0xc000, 300, 2),
                                 ev(2200, Action::free_completed, 0xc000, 300), ev(2300, Action::free_completed, 0xc000, 300),
                                 ev(2400, Action::free_completed, 0xa000, 64)});
  std::vector<std::uint64_t> opened;
  WindowReplay r(w);
  r.restart([&](const LiveAlloc& a, const LiveBlock& b) {
    EXPECT_EQ(b.serial, opened.size());
    opened.push_back(a.size);
  });
  EXPECT_EQ(opened, (std::vector<std::uint64_t>{64, 32}));  // of a key listed twice the first counts
  EXPECT_EQ(r.allocated(), 96u);
  ReplayStep s = r.step();
  EXPECT_EQ(s.kind, ReplayStep::alloc);
  EXPECT_FALSE(s.ended);
  const LiveBlock* first = r.live().find(live_key(0, 0xc000));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->serial, 2u);
  EXPECT_TRUE(r.made_in_window(*first));
  EXPECT_EQ(first->time_ns, 2000);
  s = r.step();  // the free of the 100 B allocation was lost
  EXPECT_EQ(s.kind, ReplayStep::alloc);
  ASSERT_TRUE(s.ended);
  EXPECT_EQ(s.old.size, 100u);
  EXPECT_EQ(s.old.serial, 2u);
  EXPECT_EQ(r.live().find(live_key(0, 0xc000))->serial, 3u);
  EXPECT_EQ(r.allocated(), 96u + 300u);
  s = r.step();
  EXPECT_EQ(s.kind, ReplayStep::free);
  EXPECT_TRUE(s.ended);
  EXPECT_EQ(s.old.serial, 3u);
  EXPECT_EQ(r.allocated(), 96u);
  s = r.step();  // a second free of it: nothing live
  EXPECT_EQ(s.kind, ReplayStep::free);
  EXPECT_FALSE(s.ended);
  s = r.step();
  EXPECT_TRUE(s.ended);
  EXPECT_FALSE(r.made_in_window(s.old));
  EXPECT_EQ(s.old.time_ns, w.open_time_ns);
  EXPECT_EQ(r.allocated(), 32u);
  // restart() goes back to the open.
  r.restart();
  EXPECT_EQ(r.applied(), 0u);
  EXPECT_EQ(r.allocated(), 96u);
}

TEST(WindowReplayTest, FreeActionDecidesWhichActionFrees) {
  // A source that never reports completion frees at the request.
  const WindowRecord requested = window({}, {ev(2000, Action::alloc, 0xc000, 100), ev(2100, Action::free_requested, 0xc000, 100)});
  WindowReplay a(requested);
  EXPECT_EQ(a.free_action(), Action::free_requested);
  a.step();
  EXPECT_EQ(a.step().kind, ReplayStep::free);
  EXPECT_EQ(a.allocated(), 0u);
  // With completions, the request frees nothing: the block is live until its completion.
  const WindowRecord completed = window({}, {ev(2000, Action::alloc, 0xc000, 100), ev(2100, Action::free_requested, 0xc000, 100),
                                             ev(2200, Action::free_completed, 0xc000, 100)});
  WindowReplay b(completed);
  EXPECT_EQ(b.free_action(), Action::free_completed);
  b.step();
  EXPECT_EQ(b.step().kind, ReplayStep::none);
  EXPECT_EQ(b.allocated(), 100u);
  EXPECT_EQ(b.step().kind, ReplayStep::free);
  EXPECT_EQ(b.allocated(), 0u);
}

TEST(WindowReplayTest, MarksBeginBeforeTheFirstEventAtOrAfterTheirTime) {
  WindowRecord w = window({}, {ev(2000, Action::alloc, 0xc000, 100), ev(3000, Action::alloc, 0xd000, 100)});
  w.batches = {BatchMark{3, 9000}, BatchMark{2, 3000}, BatchMark{1, 1500}};
  WindowReplay r(w);
  ASSERT_EQ(r.marks().size(), 3u);
  EXPECT_EQ(r.marks()[0].batch, 1);  // by time
  EXPECT_EQ(r.begin_mark(), 0);
  EXPECT_EQ(r.begin_mark(), -1);
  r.step();
  EXPECT_EQ(r.begin_mark(), 1);  // at the event's own time: before it
  EXPECT_EQ(r.begin_mark(), -1);
  r.step();
  EXPECT_EQ(r.begin_mark(), -1);  // no event left
  EXPECT_EQ(r.begin_remaining_mark(), 2);
  EXPECT_EQ(r.begin_remaining_mark(), -1);
  EXPECT_EQ(r.marks_begun(), 3u);
}

// The window of the agreement test: a 1 MiB segment live at the open, replaced by a 4 MiB
// segment at its address (its segment_free lost), and an allocation that replaces another.
RankRecord replaced_segment_record() {
  RankRecord r;
  r.meta.rank = 0;
  r.meta.world_size = 1;
  r.meta.host = "node0";
  r.meta.run_name = "replay";
  r.meta.source = "api";
  r.meta.device_name = "Synthetic GPU";
  r.meta.config_json = "{}";
  r.meta.tool_version = "test";
  r.frames = {{"train_step", "train.py", 12}};
  r.stacks = {{0}};
  WindowRecord w = window({live(0x100000, MiB, true), live(0x100000, 4096, false, 0)},
                          {ev(2000, Action::segment_alloc, 0x100000, 4 * MiB, 0), ev(2100, Action::alloc, 0x200000, 512, 0),
                           ev(2200, Action::alloc, 0x200000, 1024, 0), ev(2300, Action::free_completed, 0x200000, 1024),
                           ev(2400, Action::free_completed, 0x100000, 4096)});
  w.batches = {BatchMark{2, 1500}, BatchMark{3, 2150}};
  r.windows.push_back(std::move(w));
  r.status = RecordStatus::ok;
  return r;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("memsnap_test_window_replay." + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The chrome trace `memsnap export` writes for rank 0's window, through a real store.
nlohmann::json exported_chrome_trace(const RankRecord& rec) {
  const fs::path dir = scratch("store");
  fs::create_directories(dir / "memsnap.h5.d");
  RankInfo info;
  info.rank = 0;
  info.host = rec.meta.host;
  info.device = rec.meta.device_name;
  info.source = rec.meta.source;
  info.n_windows = 1;
  info.data_file = "memsnap.h5.d/rank0.h5";
  info.spill = "rank0.pid1.spill";
  write_rank_file(dir / info.data_file, rec, info);
  StoreIndex index;
  index.run_name = rec.meta.run_name;
  index.world_size = 1;
  index.config_json = "{}";
  index.ranks = {info};
  index.rows.push_back(make_summary_row(rec, 0, analyse_window(rec, rec.windows[0])));
  write_root_file(dir / "memsnap.h5", index);
  ExportCliOptions o;
  o.store = dir / "memsnap.h5";
  o.rank = 0;
  o.batch = rec.windows[0].batch_end;
  o.format = "chrome";
  o.output = dir / "trace.json";
  EXPECT_EQ(export_main(o), 0);
  std::ifstream in(o.output);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(WindowReplayTest, AnalysisExportAndRankPageAgreeOnASegmentReplacedOnItsKey) {
  const RankRecord rec = replaced_segment_record();
  const WindowRecord& w = rec.windows[0];
  const WindowStats s = analyse_window(rec, w);
  // Reserved: 1 MiB at the open, 4 MiB once the new segment replaced the old (not 1 + 4, not 1).
  EXPECT_EQ(s.reserved_at_open, MiB);
  EXPECT_EQ(s.peak_reserved, 4 * MiB);
  EXPECT_EQ(s.reserved_at_close, 4 * MiB);
  EXPECT_EQ(s.peak_allocated, 4096u + 1024u);  // the 512 B allocation was replaced, not added to

  // The export's counters: the level after each event, as the analysis replays it.
  std::vector<std::uint64_t> reserved, allocated;
  const nlohmann::json trace = exported_chrome_trace(rec);
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "C") continue;
    reserved.push_back(e["args"]["reserved"].get<std::uint64_t>());
    allocated.push_back(e["args"]["allocated"].get<std::uint64_t>());
  }
  EXPECT_EQ(reserved, (std::vector<std::uint64_t>{MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB}));
  EXPECT_EQ(allocated, (std::vector<std::uint64_t>{4096, 4096, 4096 + 512, 4096 + 1024, 4096, 0}));

  // The rank page's totals and allocation intervals.
  const nlohmann::json page = rank_page_data(rec, w, s, "replay", 1, 100, nlohmann::json::object(), nullptr);
  const auto page_reserved = page["totals"]["reserved"].get<std::vector<std::uint64_t>>();
  const auto page_allocated = page["totals"]["allocated"].get<std::vector<std::uint64_t>>();
  EXPECT_EQ(page_reserved, reserved);
  EXPECT_EQ(page_allocated, allocated);
  EXPECT_EQ(*std::max_element(page_reserved.begin(), page_reserved.end()), s.peak_reserved);
  // The 512 B allocation ends where the 1 KiB one replaced it.
  const auto& a = page["allocs"];
  ASSERT_EQ(a["size"].size(), 3u);
  EXPECT_EQ(a["size"][1].get<std::uint64_t>(), 512u);
  EXPECT_EQ(a["end_ns"][1].get<std::int64_t>(), 2200);
  EXPECT_EQ(a["end_ns"][2].get<std::int64_t>(), 2300);
  EXPECT_EQ(a["end_ns"][0].get<std::int64_t>(), 2400);
  fs::remove_all(fs::temp_directory_path() / ("memsnap_test_window_replay." + std::to_string(getpid())));
}

}  // namespace
}  // namespace memsnap
