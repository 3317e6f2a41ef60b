// Tests of the torch snapshot import/export against the real torch 2.11 fixtures, with Python's
// pickle module as the reference reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>

#include "memsnap/spill.hpp"
#include "test_util.hpp"
#include "torch/pickle.hpp"
#include "torch/pickle_writer.hpp"
#include "torch/snapshot.hpp"

using namespace memsnap;
using pickle::Value;
using pickle::ValuePtr;

namespace {

const char* kFixtures[] = {"snap_native.pickle", "snap_exp.pickle", "snap_oom.pickle"};

nlohmann::json python_facts(const std::string& path) {
  auto r = test::run_python(test::quoted(test::script("snapshot_facts.py")) + " " + test::quoted(path));
  EXPECT_EQ(r.status, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

torch::ImportOptions options(std::int64_t batch = 7) {
  torch::ImportOptions opt;
  opt.rank = 3;
  opt.world_size = 8;
  opt.batch = batch;
  opt.run_name = "test";
  return opt;
}

// The snapshot with the first `cut` entries of device trace 0 removed: what a trace that began
// mid-run (or whose ring buffer wrapped) looks like, with the same state at dump.
ValuePtr cut_trace(const Value& root, std::size_t cut) {
  pickle::DictItems items;
  for (const auto& [k, v] : root.dict_items()) {
    if (k->as_string() != "device_traces") {
      items.emplace_back(k, v);
      continue;
    }
    std::vector<ValuePtr> traces = v->items();
    const auto& first = traces[0]->items();
    traces[0] = Value::list(std::vector<ValuePtr>(first.begin() + static_cast<std::ptrdiff_t>(std::min(cut, first.size())), first.end()));
    items.emplace_back(k, Value::list(std::move(traces)));
  }
  return Value::dict(std::move(items));
}

struct Replayed {
  std::map<std::pair<int, std::uint64_t>, std::uint64_t> live;  // (device, addr) -> bytes
  std::int64_t reserved = 0;
};

// Replays a window the way an analysis does: allocations live from alloc to free_completed,
// reserved memory grows with segment_alloc/map and shrinks with segment_free/unmap.
Replayed replay(const WindowRecord& w) {
  Replayed r;
  for (const LiveAlloc& a : w.live_at_start) {
    if (a.is_segment)
      r.reserved += static_cast<std::int64_t>(a.size);
    else
      r.live[{a.device, a.addr}] = a.size;
  }
  for (const Event& e : w.events) {
    switch (e.action) {
      case Action::alloc: r.live[{e.device, e.addr}] = e.size; break;
      case Action::free_completed: r.live.erase({e.device, e.addr}); break;
      case Action::segment_alloc:
      case Action::segment_map: r.reserved += static_cast<std::int64_t>(e.size); break;
      case Action::segment_free:
      case Action::segment_unmap: r.reserved -= static_cast<std::int64_t>(e.size); break;
      default: break;
    }
  }
  return r;
}

std::map<std::pair<int, std::uint64_t>, std::uint64_t> active_blocks(const WindowRecord& w) {
  std::map<std::pair<int, std::uint64_t>, std::uint64_t> out;
  for (const Segment& s : w.segments)
    for (const Block& b : s.blocks)
      if (b.state != 0) out[{s.device, b.addr}] = b.requested_size;
  return out;
}

}  // namespace

TEST(SnapshotTest, CountsMatchPythonPickle) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto facts = python_facts(test::fixture(name));
    auto result = torch::import_snapshot_file(test::fixture(name), options());
    const RankRecord& rec = result.record;
    ASSERT_EQ(rec.windows.size(), 1u);
    const WindowRecord& w = rec.windows[0];
    auto entries = facts["trace_entries"].get<std::vector<std::size_t>>();
    EXPECT_EQ(w.events.size(), std::accumulate(entries.begin(), entries.end(), std::size_t{0}));
    EXPECT_EQ(result.extras["device_count"].get<std::size_t>(), entries.size());
    EXPECT_EQ(w.segments.size(), facts["segments"].get<std::size_t>());
    std::size_t blocks = 0;
    for (const auto& s : w.segments) blocks += s.blocks.size();
    EXPECT_EQ(blocks, facts["blocks"].get<std::size_t>());
    EXPECT_EQ(rec.frames.size(), facts["unique_frames"].get<std::size_t>());
    EXPECT_EQ(rec.stacks.size(), facts["unique_stacks"].get<std::size_t>());
    for (const auto& [action, count] : facts["actions"].items()) {
      auto a = action_from_name(action);
      ASSERT_TRUE(a) << action;
      EXPECT_EQ(std::count_if(w.events.begin(), w.events.end(), [&](const Event& e) { return e.action == *a; }),
                count.get<long>())
          << action;
    }
    EXPECT_EQ(rec.meta.source, "torch");
    EXPECT_EQ(rec.meta.rank, 3);
    EXPECT_EQ(rec.meta.world_size, 8);
    EXPECT_EQ(rec.path, test::fixture(name));
    EXPECT_TRUE(std::is_sorted(w.events.begin(), w.events.end(),
                               [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; }));
    EXPECT_EQ(w.open_time_ns, w.events.front().time_ns);
    EXPECT_EQ(w.close_time_ns, w.events.back().time_ns);
  }
}

TEST(SnapshotTest, EventsCarryTorchFieldsAndInnermostFirstFrames) {
  auto rec = torch::import_snapshot_file(test::fixture("snap_oom.pickle"), options()).record;
  const WindowRecord& w = rec.windows[0];
  // First entry, as pickle.load shows it: segment_alloc at 140376383946752, 20 MiB, at
  // time_us 1796204153181157, frames [<module> s.py:20].
  const Event& e = w.events.front();
  EXPECT_EQ(e.action, Action::segment_alloc);
  EXPECT_EQ(e.addr, 140376383946752ull);
  EXPECT_EQ(e.size, 20971520ull);
  EXPECT_EQ(e.time_ns, 1796204153181157000ll);
  EXPECT_EQ(e.device, 0);
  ASSERT_NE(e.stack_id, kNoStack);
  ASSERT_EQ(rec.stacks[e.stack_id].size(), 1u);
  EXPECT_EQ(rec.frames[rec.stacks[e.stack_id][0]], (Frame{"<module>", "s.py", 20}));
  // The stream of the side-stream allocation is kept.
  EXPECT_TRUE(std::any_of(w.events.begin(), w.events.end(), [](const Event& x) { return x.stream == 582198080u; }));
  // The snapshot entry has no frames key: no stack.
  EXPECT_EQ(w.events.back().action, Action::snapshot);
  EXPECT_EQ(w.events.back().stack_id, kNoStack);

  // torch lists frames innermost first: the allocator's own unwinder frame comes first and the
  // script's <module> last; memsnap keeps that order.
  auto native = torch::import_snapshot_file(test::fixture("snap_native.pickle"), options()).record;
  const Event& first = native.windows[0].events.front();
  ASSERT_NE(first.stack_id, kNoStack);
  const Stack& st = native.stacks[first.stack_id];
  EXPECT_EQ(native.frames[st.front()].name, "torch::unwind::unwind()");
  EXPECT_EQ(native.frames[st.back()].name, "<module>");
}

TEST(SnapshotTest, OomFixtureGivesOomEventAndWindowFlag) {
  auto rec = torch::import_snapshot_file(test::fixture("snap_oom.pickle"), options()).record;
  const WindowRecord& w = rec.windows[0];
  EXPECT_TRUE(w.oom);
  auto it = std::find_if(w.events.begin(), w.events.end(), [](const Event& e) { return e.action == Action::oom; });
  ASSERT_NE(it, w.events.end());
  EXPECT_EQ(it->size, 1125899906842624ull);  // requested: 1 PiB
  EXPECT_EQ(it->addr, 149433745408ull);      // device_free
  EXPECT_NE(it->stack_id, kNoStack);
  for (const char* name : {"snap_native.pickle", "snap_exp.pickle"})
    EXPECT_FALSE(torch::import_snapshot_file(test::fixture(name), options()).record.windows[0].oom) << name;
}

TEST(SnapshotTest, SegmentsAndBlocksFromDump) {
  auto result = torch::import_snapshot_file(test::fixture("snap_exp.pickle"), options());
  const WindowRecord& w = result.record.windows[0];
  ASSERT_EQ(w.segments.size(), 2u);
  EXPECT_EQ(w.segments[0].pool, "large");
  EXPECT_EQ(w.segments[1].pool, "small");
  EXPECT_EQ(w.segments[0].size, 251658240u);
  EXPECT_TRUE(result.extras["segments"][0]["is_expandable"].get<bool>());
  EXPECT_TRUE(result.extras["allocator_settings"]["expandable_segments"].get<bool>());
  std::size_t active = 0;
  for (const auto& b : w.segments[0].blocks) {
    if (b.state == 1) {
      ++active;
      EXPECT_NE(b.stack_id, kNoStack);
    }
  }
  EXPECT_EQ(active, 26u);
}

// live_at_start plus the trace must replay to exactly the blocks active at dump and the reserved
// bytes of the dump's segments, for traces cut at many points (a trace that began mid-run).
TEST(SnapshotTest, LiveAtStartReplaysToTheDump) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto root = pickle::read_file(test::fixture(name));
    auto facts = python_facts(test::fixture(name));
    std::size_t n = root->at("device_traces").at(0).size();
    for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{2}, n / 7, n / 3, n / 2, n - 2, n - 1, n}) {
      SCOPED_TRACE("cut " + std::to_string(cut));
      auto rec = torch::import_snapshot(*cut_trace(*root, cut), options());
      const WindowRecord& w = rec.windows[0];
      EXPECT_EQ(w.events.size(), n - cut);
      Replayed r = replay(w);
      auto expected = active_blocks(w);
      EXPECT_EQ(r.live, expected);
      std::uint64_t live_bytes = 0;
      for (const auto& [k, v] : r.live) live_bytes += v;
      EXPECT_EQ(live_bytes, facts["active_requested_bytes"].get<std::uint64_t>());
      EXPECT_EQ(r.reserved, facts["reserved_bytes"].get<std::int64_t>());
      if (cut == 0) {
        // These traces were recorded from process start: nothing was live before them.
        EXPECT_TRUE(w.live_at_start.empty());
      }
      if (cut == n) {
        // No trace at all: everything at dump was live at start, with the blocks' stacks.
        EXPECT_EQ(std::count_if(w.live_at_start.begin(), w.live_at_start.end(), [](const LiveAlloc& a) { return !a.is_segment; }),
                  facts["active_blocks"].get<long>());
        for (const LiveAlloc& a : w.live_at_start) {
          if (!a.is_segment) {
            EXPECT_NE(a.stack_id, kNoStack);
          }
        }
      }
    }
  }
}

TEST(SnapshotTest, ExportedSnapshotEqualsOriginalInPython) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto result = torch::import_snapshot_file(test::fixture(name), options());
    std::string path = test::temp_path(std::string("export_") + name);
    test::write_bytes(path, torch::export_snapshot(result.record, 0, result.extras));
    // With the extras: every value, at every level (roundtrip_equal.py).
    auto r = test::run_python(test::quoted(test::script("roundtrip_equal.py")) + " " +
                              test::quoted(test::fixture(name)) + " " + test::quoted(path));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "OK\n");

    // Without extras (a record read back from the store), the core fields still match.
    test::write_bytes(path, torch::export_snapshot(result.record, 0));
    r = test::run_python(test::quoted(test::script("compare_snapshot.py")) + " --core " + test::quoted(test::fixture(name)) + " " +
                         test::quoted(path));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "OK\n");

    // And memsnap reads its own export back to the same record.
    auto again = torch::import_snapshot_file(path, options()).record;
    EXPECT_EQ(again.windows[0].segments, result.record.windows[0].segments);
    ASSERT_EQ(again.windows[0].events.size(), result.record.windows[0].events.size());
    for (std::size_t i = 0; i < again.windows[0].events.size(); ++i) {
      const Event& a = again.windows[0].events[i];
      const Event& b = result.record.windows[0].events[i];
      EXPECT_EQ(std::tie(a.time_ns, a.action, a.addr, a.size, a.stream), std::tie(b.time_ns, b.action, b.addr, b.size, b.stream));
    }
    std::filesystem::remove(path);
  }
}

TEST(SnapshotTest, ExportSharesFrameListsLikeTorch) {
  auto result = torch::import_snapshot_file(test::fixture("snap_native.pickle"), options());
  std::string out = torch::export_snapshot(result.record, 0, result.extras);
  auto original = test::read_bytes(test::fixture("snap_native.pickle"));
  // Stacks and frames are written once each and referenced after, so the export is no bigger
  // than torch's own file.
  EXPECT_LT(out.size(), original.size());
  EXPECT_THROW(torch::export_snapshot(result.record, 1), torch::SnapshotError);
}

TEST(SnapshotTest, BatchMarksFromOptimizerStepAnnotations) {
  auto rec = torch::import_snapshot_file(test::fixture("snap_native.pickle"), options(7)).record;
  const WindowRecord& w = rec.windows[0];
  // Four Optimizer.step ranges, the window opened at a batch start: four batches, 4..7, the
  // trace's first event starting batch 4 and each later one starting after an optimizer step
  // (where the freed gradients bring memory to its low point), before the next step begins.
  EXPECT_EQ(w.batch_method, "recurring_annotation");
  EXPECT_GT(w.batch_confidence, 0.5);
  EXPECT_NE(w.batch_detail.find("Optimizer.step#AdamW.step"), std::string::npos) << w.batch_detail;
  ASSERT_EQ(w.batches.size(), 4u);
  EXPECT_EQ(w.batches.front().batch, 4);
  EXPECT_EQ(w.batches.back().batch, 7);
  EXPECT_EQ(w.batch_start, 4);
  EXPECT_EQ(w.batch_end, 7);
  EXPECT_EQ(w.batches.front().time_ns, w.events.front().time_ns);
  auto root = pickle::read_file(test::fixture("snap_native.pickle"));
  std::vector<std::int64_t> ends, starts;
  for (const auto& a : root->at("external_annotations").items()) {
    if (a->at("name").as_string().rfind("Optimizer.step", 0) != 0) continue;
    (a->at("stage").as_string() == "END" ? ends : starts).push_back(a->at("time_us").as_int64() * 1000);
  }
  ASSERT_EQ(ends.size(), 4u);
  for (std::size_t i = 1; i < 4; ++i) {
    EXPECT_GE(w.batches[i].time_ns, ends[i - 1]) << i;
    EXPECT_LT(w.batches[i].time_ns, starts[i]) << i;
  }

  // An explicit batch_start numbers the marks from it.
  auto opt = options(7);
  opt.batch_start = 2;
  auto rec2 = torch::import_snapshot_file(test::fixture("snap_native.pickle"), opt).record;
  EXPECT_EQ(rec2.windows[0].batch_start, 2);
  EXPECT_EQ(rec2.windows[0].batches.front().batch, 2);

  // A handful of allocations (an OOM repro) is too little to find batches in.
  auto oom = torch::import_snapshot_file(test::fixture("snap_oom.pickle"), options(5)).record;
  EXPECT_TRUE(oom.windows[0].batches.empty());
  EXPECT_EQ(oom.windows[0].batch_method, "none");
  EXPECT_EQ(oom.windows[0].batch_start, 5);
}

TEST(SnapshotTest, NumberedStepAnnotationsGiveTheirBatchNumbers) {
  auto ann = [](const char* stage, const char* name, std::int64_t t) {
    return Value::dict({{Value::string("stage"), Value::string(stage)},
                        {Value::string("name"), Value::string(name)},
                        {Value::string("device"), Value::integer(0)},
                        {Value::string("time_us"), Value::integer(t)}});
  };
  auto root = Value::dict({{Value::string("segments"), Value::list({})},
                           {Value::string("device_traces"), Value::list({Value::list({})})},
                           {Value::string("external_annotations"),
                            Value::list({ann("START", "ProfilerStep#5", 10), ann("END", "ProfilerStep#5", 20),
                                         ann("START", "ProfilerStep#6", 30), ann("END", "ProfilerStep#6", 40)})}});
  auto rec = torch::import_snapshot(*root, options(6));
  ASSERT_EQ(rec.windows[0].batches.size(), 2u);
  EXPECT_EQ(rec.windows[0].batches[0], (BatchMark{5, 10000}));
  EXPECT_EQ(rec.windows[0].batches[1], (BatchMark{6, 30000}));
  EXPECT_EQ(rec.windows[0].batch_method, "recorded");
  EXPECT_EQ(rec.windows[0].batch_start, 5);  // nothing in the trace before the first mark
}

TEST(SnapshotTest, RejectsWhatIsNotASnapshot) {
  EXPECT_THROW(torch::import_snapshot(*Value::list({}), options()), torch::SnapshotError);
  auto no_address = Value::dict({{Value::string("segments"), Value::list({Value::dict({})})}});
  try {
    torch::import_snapshot(*no_address, options());
    ADD_FAILURE();
  } catch (const torch::SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("segments[0]: missing key 'address'"), std::string::npos) << e.what();
  }
  // A pickle that would run code never reaches the importer.
  std::string path = test::temp_path("evil.pickle");
  test::write_bytes(path, "cos\nsystem\n(S'echo pwned'\ntR.");
  EXPECT_THROW(torch::import_snapshot_file(path, options()), pickle::PickleError);
  std::filesystem::remove(path);
}

TEST(SnapshotTest, UnknownActionsAreKeptInTheirPlace) {
  auto entry = [](const char* action) {
    return Value::dict({{Value::string("action"), Value::string(action)},
                        {Value::string("addr"), Value::integer(4096)},
                        {Value::string("size"), Value::integer(512)},
                        {Value::string("stream"), Value::integer(0)},
                        {Value::string("time_us"), Value::integer(1)},
                        {Value::string("compile_context"), Value::string("graph 1")}});
  };
  auto root = Value::dict(
      {{Value::string("device_traces"),
        Value::list({Value::list({}), Value::list({entry("alloc"), entry("future_action"), entry("alloc")})})}});
  auto result = torch::import_snapshot_full(*root, options());
  // No event, so no analysis sees it; counted, and kept with its place for export.
  ASSERT_EQ(result.record.windows[0].events.size(), 2u);
  EXPECT_EQ(result.record.windows[0].events[0].device, 1);
  EXPECT_EQ(result.extras["skipped_entries"].get<int>(), 1);
  ASSERT_EQ(result.extras["unknown_entries"].size(), 1u);
  EXPECT_EQ(result.extras["unknown_entries"][0]["device"], 1);
  EXPECT_EQ(result.extras["unknown_entries"][0]["position"], 1);
  EXPECT_EQ(result.extras["unknown_entries"][0]["entry"]["action"], "future_action");
  EXPECT_EQ(result.extras["trace_extras"][0]["compile_context"].get<std::string>(), "graph 1");
  // The pre-window allocation state: an alloc with no free is just a trace allocation.
  EXPECT_TRUE(result.record.windows[0].live_at_start.empty());
  // Export puts it back between the two allocs, keeps the compile contexts and the empty device 0
  // trace; the store's text form of the extras does the same.
  for (const auto& extras : {result.extras, nlohmann::json::parse(result.extras.dump())}) {
    auto back = pickle::read(torch::export_snapshot(result.record, 0, extras));
    ASSERT_EQ(back->at("device_traces").size(), 2u);
    const auto& trace = back->at("device_traces").at(1);
    ASSERT_EQ(trace.size(), 3u);
    EXPECT_EQ(trace.at(1).at("action").as_string(), "future_action");
    EXPECT_EQ(trace.at(2).at("action").as_string(), "alloc");
    EXPECT_EQ(trace.at(0).at("compile_context").as_string(), "graph 1");
    EXPECT_EQ(trace.at(1).at("compile_context").as_string(), "graph 1");
    EXPECT_TRUE(back->at("device_traces").at(0).items().empty());
  }
}

// Every kind of pickled value survives to_json, JSON text and from_json, including those JSON has
// no type for; a dict that looks like one of the tags stays a dict.
TEST(SnapshotTest, ExtrasJsonKeepsEveryValue) {
  auto s = [](const char* t) { return Value::string(t); };
  const std::vector<ValuePtr> values = {
      Value::tuple({Value::integer(1), Value::integer(3)}),
      Value::list({Value::tuple({}), Value::list({})}),
      Value::bytes(std::string("\x00\xff", 2)),
      Value::string("\xed\xb3\xbf"),  // a lone surrogate, as Python pickles "\udcff"
      Value::string("caf\xc3\xa9"),
      Value::integer_from_le_bytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x40", 9)),  // 2^70
      Value::integer_from_le_bytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\xfe", 9)),  // -2^65
      Value::unsigned_integer(~std::uint64_t{0}),
      Value::integer(-5),
      Value::floating(std::numeric_limits<double>::infinity()),
      Value::floating(-std::numeric_limits<double>::infinity()),
      Value::floating(0.1),
      Value::floating(-0.0),
      Value::boolean(true),
      Value::none(),
      Value::dict({{Value::integer(3), s("int key")}, {s("x"), Value::none()}}),
      Value::dict({{s("__tuple__"), s("looks like a tag")}}),
      Value::dict({{s("__tuple__"), Value::list({})}, {s("second"), Value::integer(2)}}),
      Value::dict({{Value::tuple({Value::integer(1)}), Value::bytes("b")}}),
  };
  for (const auto& v : values) {
    const nlohmann::json j = nlohmann::json::parse(torch::to_json(*v).dump());
    const ValuePtr back = torch::from_json(j);
    EXPECT_TRUE(back->equals(*v)) << j.dump();
    EXPECT_EQ(back->kind(), v->kind()) << j.dump();
  }
  const ValuePtr nan = torch::from_json(nlohmann::json::parse(torch::to_json(*Value::floating(std::nan(""))).dump()));
  EXPECT_TRUE(std::isnan(nan->as_double()));
  // Shared references expand on the way to JSON: past the budget it is a SnapshotError, not a
  // machine out of memory.
  ValuePtr bomb = Value::list({Value::integer(0)});
  for (int i = 0; i < 30; ++i) bomb = Value::list({bomb, bomb, bomb, bomb});
  EXPECT_THROW(torch::to_json(*bomb), torch::SnapshotError);
}

// Merging records appends stacks: the extras' stack ids move with them.
TEST(SnapshotTest, ShiftExtrasStacksMovesEveryStackId) {
  auto extras = nlohmann::json::parse(
      R"({"segments":[{"stack":0},{"stack":-1},{"stack":4}],"unknown_entries":[{"device":0,"position":2,"entry":{},"stack":1}]})");
  torch::shift_extras_stacks(extras, 10);
  EXPECT_EQ(extras["segments"][0]["stack"], 10);
  EXPECT_EQ(extras["segments"][1]["stack"], -1);
  EXPECT_EQ(extras["segments"][2]["stack"], 14);
  EXPECT_EQ(extras["unknown_entries"][0]["stack"], 11);
}

// The hand-made snapshots (tests/torch/make_snapshot.py): what torch 2.11's fixtures never show,
// and what older torch wrote. Import, extras through JSON text, export: Python sees the same values.
TEST(SnapshotTest, HandMadeSnapshotsRoundTripThroughJsonText) {
  for (const char* kind : {"rich", "old"}) {
    SCOPED_TRACE(kind);
    const std::string original = test::temp_path(std::string(kind) + ".pickle");
    auto made =
        test::run_python(test::quoted(test::script("make_snapshot.py")) + " " + kind + " " + test::quoted(original));
    ASSERT_EQ(made.status, 0) << made.output;
    auto result = torch::import_snapshot_file(original, options());
    const auto extras = nlohmann::json::parse(result.extras.dump());
    const std::string exported = test::temp_path(std::string(kind) + "_back.pickle");
    test::write_bytes(exported, torch::export_snapshot(result.record, 0, extras));
    auto r = test::run_python(test::quoted(test::script("roundtrip_equal.py")) + " " + test::quoted(original) + " " +
                              test::quoted(exported));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "OK\n");
    if (std::string(kind) == "rich") {
      EXPECT_EQ(result.extras["skipped_entries"], 4);
      EXPECT_EQ(result.extras["segments"][1]["segment_pool_id"], nlohmann::json::parse(R"({"__tuple__":[1,3]})"));
      EXPECT_TRUE(result.extras.contains("other_keys"));
      // Without the extras it is not the same: the comparison can fail.
      test::write_bytes(exported, torch::export_snapshot(result.record, 0));
      r = test::run_python(test::quoted(test::script("roundtrip_equal.py")) + " " + test::quoted(original) + " " +
                           test::quoted(exported));
      EXPECT_EQ(r.status, 1) << r.output;
    } else {
      EXPECT_EQ(result.extras["trace_absent"], nlohmann::json::parse(R"(["compile_context","user_metadata"])"));
      EXPECT_TRUE(result.extras["trace_extras"].empty()) << "noted once, not per entry";
    }
    std::filesystem::remove(original);
    std::filesystem::remove(exported);
  }
}

// Flipping any single byte of a real snapshot gives a value or a PickleError, and the importer
// then gives a record or a SnapshotError: never a crash (run under MEMSNAP_SANITIZE for UB).
TEST(SnapshotTest, CorruptedBytesNeverCrash) {
  const std::string data = test::read_bytes(test::fixture("snap_oom.pickle"));
  std::size_t parsed = 0, rejected = 0;
  for (std::size_t i = 0; i < data.size(); ++i) {
    for (unsigned char flip : {0xffu, 0x01u, 0x80u}) {
      std::string bad = data;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ flip);
      try {
        auto v = pickle::read(bad);
        ++parsed;
        try {
          torch::import_snapshot(*v, options());
        } catch (const torch::SnapshotError&) {
        }
      } catch (const pickle::PickleError&) {
        ++rejected;
      }
    }
  }
  EXPECT_EQ(parsed + rejected, data.size() * 3);
  EXPECT_GT(rejected, 0u);
}

// What real training loops' spills cost on the node's disk: every fixture and one rank of every
// loop in tests/data/torch-loops, imported and written as the recorder writes (packed events),
// reads back event for event, and its events take a few bytes each instead of the raw 40.
TEST(SnapshotTest, RealLoopsSpillAFewBytesAnEventAndReadBackExactly) {
  std::vector<std::string> pickles;
  for (const char* name : kFixtures) pickles.push_back(test::fixture(name));
  for (const auto& loop : std::filesystem::directory_iterator(std::string(MEMSNAP_TEST_DATA) + "/torch-loops")) {
    for (const auto& f : std::filesystem::directory_iterator(loop.path())) {
      if (f.path().filename().string().rfind("rank0.", 0) == 0) pickles.push_back(f.path().string());
    }
  }
  ASSERT_GE(pickles.size(), 3u + 18u);
  for (const auto& path : pickles) {
    const RankRecord rec = torch::import_snapshot_file(path, options()).record;
    std::size_t events = 0;
    for (const auto& w : rec.windows) events += w.events.size();
    ASSERT_GT(events, 0u) << path;
    const std::string spill = test::temp_path("packed") + ".spill";
    std::string error;
    ASSERT_TRUE(write_spill(rec, spill, error)) << error;
    const RankRecord back = read_spill(spill);
    const std::string bytes = test::read_bytes(spill);
    std::filesystem::remove(spill);
    ASSERT_EQ(back.windows.size(), rec.windows.size()) << path;
    for (std::size_t i = 0; i < rec.windows.size(); ++i) {
      const auto& a = rec.windows[i].events;
      const auto& b = back.windows[i].events;
      ASSERT_EQ(a.size(), b.size()) << path;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Event)), 0) << path;
    }
    // The events' records alone (the rest is frames, stacks and the state at dump).
    std::size_t packed = 0;
    for (std::size_t pos = kSpillHeaderBytes; pos + kRecordHeaderBytes <= bytes.size();) {
      std::uint32_t head[2];
      std::memcpy(head, bytes.data() + pos, sizeof head);
      if (head[0] == static_cast<std::uint32_t>(SpillRecord::events_packed)) packed += kRecordHeaderBytes + head[1];
      pos += kRecordHeaderBytes + head[1];
    }
    const double per_event = static_cast<double>(packed) / static_cast<double>(events);
    std::printf("%-60s %8zu events %6.2f bytes an event\n", (std::filesystem::path(path).parent_path().filename() / std::filesystem::path(path).filename()).c_str(), events, per_event);
    if (events >= 500) {  // a few records' heads aside
      EXPECT_LE(per_event, 12.0) << path;
    }
  }
}

// --- the streaming import ------------------------------------------------------------------------

namespace {

// Two imports agree on everything the store keeps.
void expect_same_import(const torch::ImportResult& a, const torch::ImportResult& b) {
  const auto& ra = a.record;
  const auto& rb = b.record;
  EXPECT_EQ(ra.frames, rb.frames);
  EXPECT_EQ(ra.stacks, rb.stacks);
  ASSERT_EQ(ra.windows.size(), rb.windows.size());
  for (std::size_t i = 0; i < ra.windows.size(); ++i) {
    const auto& wa = ra.windows[i];
    const auto& wb = rb.windows[i];
    ASSERT_EQ(wa.events.size(), wb.events.size());
    for (std::size_t k = 0; k < wa.events.size(); ++k)
      ASSERT_EQ(std::memcmp(&wa.events[k], &wb.events[k], sizeof(Event)), 0) << "event " << k;
    EXPECT_EQ(wa.segments, wb.segments);
    EXPECT_EQ(wa.live_at_start, wb.live_at_start);
    EXPECT_EQ(wa.batches, wb.batches);
    EXPECT_EQ(wa.batch_method, wb.batch_method);
    EXPECT_EQ(wa.oom, wb.oom);
  }
  EXPECT_EQ(a.extras, b.extras);
}

torch::ImportResult tree_import(const std::string& path) {
  return torch::import_snapshot_full(*pickle::read_file(path), options());
}

ValuePtr str(const char* s) { return Value::string(s); }
ValuePtr frame_value(const char* name, std::int64_t line) {
  return Value::dict({{str("name"), str(name)}, {str("filename"), str("train.py")}, {str("line"), Value::integer(line)}});
}
ValuePtr alloc_entry(std::int64_t t, ValuePtr frames) {
  return Value::dict({{str("action"), str("alloc")}, {str("addr"), Value::integer(4096 * t)},
                      {str("size"), Value::integer(512)}, {str("stream"), Value::integer(0)},
                      {str("time_us"), Value::integer(t)}, {str("compile_context"), str("N/A")},
                      {str("user_metadata"), str("")}, {str("frames"), std::move(frames)}});
}
ValuePtr segment_value(ValuePtr frames) {
  return Value::dict({{str("device"), Value::integer(0)}, {str("address"), Value::integer(1 << 20)},
                      {str("total_size"), Value::integer(1 << 20)}, {str("stream"), Value::integer(0)},
                      {str("frames"), std::move(frames)}, {str("blocks"), Value::list({})}});
}

}  // namespace

// What `memsnap import` runs (a streaming read) gives what the whole tree's import gives, on real
// snapshots, the hand-made ones and the repo's other torch data.
TEST(SnapshotTest, StreamedImportEqualsTreeImport) {
  std::vector<std::string> paths;
  for (const char* name : kFixtures) paths.push_back(test::fixture(name));
  for (const char* kind : {"rich", "old"}) {
    const std::string path = test::temp_path(std::string("stream_") + kind + ".pickle");
    auto made = test::run_python(test::quoted(test::script("make_snapshot.py")) + " " + kind + " " + test::quoted(path));
    ASSERT_EQ(made.status, 0) << made.output;
    paths.push_back(path);
  }
  for (const char* rel : {"torch-loops/spike16/rank9.5.pt.trace.memory_snapshot.pickle",
                          "torch-stacks/vit_adam/all/rank0.7.pt.trace.memory_snapshot.pickle",
                          "torch-loops/oom_caught/rank3.5.pt.trace.memory_snapshot.pickle"})
    paths.push_back(std::string(MEMSNAP_TEST_DATA) + "/" + rel);
  for (const auto& path : paths) {
    SCOPED_TRACE(path);
    expect_same_import(torch::import_snapshot_file(path, options()), tree_import(path));
  }
}

// Trace entries read without a tree change nothing: every real pickle in the repo (torch 2.11's
// fixtures, 20 training loops on every rank, their stacks="all" and "python" variants, the diff
// pairs) imports the same with and without, and most of each trace is read that way.
TEST(SnapshotTest, FlatEntriesImportAsTheStackMachineDoes) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::recursive_directory_iterator(MEMSNAP_TEST_DATA))
    if (e.path().extension() == ".pickle") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  ASSERT_GE(paths.size(), 100u);
  torch::ImportOptions off = options();
  off.flat_entries = false;
  std::size_t flat = 0, events = 0;
  for (const auto& path : paths) {
    SCOPED_TRACE(path);
    const auto with = torch::import_snapshot_file(path, options());
    const auto without = torch::import_snapshot_file(path, off);
    expect_same_import(with, without);
    EXPECT_EQ(without.flat_entries, 0u);
    const std::size_t n = with.record.windows.at(0).events.size();
    // All but the first entries of each key, action and frame.
    if (n >= 1000) {
      EXPECT_GE(with.flat_entries, n * 8 / 10) << n;
    }
    flat += with.flat_entries;
    events += n;
  }
  EXPECT_GE(flat, events * 9 / 10);
  std::printf("%zu pickles: %zu of %zu entries read flat\n", paths.size(), flat, events);
}

// Stack and frame ids come out as the tree walk gives them (segments first, then the entries in
// trace order), whatever the pickle shares: frames shared between a segment and entries, entries
// that appear twice, a trace list also held under another key (not streamable), and segments
// written after the traces.
TEST(SnapshotTest, StreamedImportKeepsIdsAndFallsBackWhereItMust) {
  auto seg_frames = Value::list({frame_value("malloc", 1), frame_value("main", 2)});
  auto shared_frame = frame_value("forward", 10);
  auto e1 = alloc_entry(1, Value::list({shared_frame, frame_value("main", 2)}));
  auto e2 = alloc_entry(2, Value::list({frame_value("step", 20), shared_frame}));
  auto trace = Value::list({e1, e2, e1, alloc_entry(3, seg_frames)});
  auto segments = Value::list({segment_value(seg_frames)});
  const std::vector<std::pair<const char*, ValuePtr>> cases = {
      {"torch order", Value::dict({{str("segments"), segments}, {str("device_traces"), Value::list({trace, Value::list({e2})})}})},
      {"trace referenced again",
       Value::dict({{str("segments"), segments}, {str("device_traces"), Value::list({trace})}, {str("copy"), trace}})},
      {"segments last", Value::dict({{str("device_traces"), Value::list({trace})}, {str("segments"), segments}})},
  };
  for (const auto& [name, root] : cases) {
    SCOPED_TRACE(name);
    const std::string path = test::temp_path("stream_case.pickle");
    test::write_bytes(path, pickle::write(root));
    const auto streamed = torch::import_snapshot_file(path, options());
    expect_same_import(streamed, tree_import(path));
    // The segment's stack is id 0 and its frames come first.
    ASSERT_FALSE(streamed.record.stacks.empty());
    EXPECT_EQ(streamed.extras["segments"][0]["stack"], 0);
    EXPECT_EQ(streamed.record.frames[0].name, "malloc");
    const auto& events = streamed.record.windows[0].events;
    auto last = std::find_if(events.begin(), events.end(), [](const Event& e) { return e.time_ns == 3000; });
    ASSERT_NE(last, events.end());
    EXPECT_EQ(last->stack_id, 0u);
    std::filesystem::remove(path);
  }
}

// A stream cut short is a pickle error naming the file and the byte, even where the entries read
// before the cut were not a snapshot's (the pickle's fault comes first, as for the tree).
TEST(SnapshotTest, TruncatedStreamNamesFileAndByte) {
  const std::string data = test::read_bytes(test::fixture("snap_native.pickle"));
  const std::string path = test::temp_path("cut.pickle");
  for (std::size_t cut : {data.size() / 3, data.size() / 2, data.size() - 2}) {
    SCOPED_TRACE(cut);
    test::write_bytes(path, data.substr(0, cut));
    try {
      torch::import_snapshot_file(path, options());
      ADD_FAILURE() << "no error";
    } catch (const pickle::PickleError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": not a PyTorch snapshot: ", 0), 0u) << msg;
      EXPECT_NE(msg.find("at byte"), std::string::npos) << msg;
      EXPECT_LE(e.offset(), cut);
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  // An entry without time_us, then a cut: the truncation is what is reported.
  auto bad_entry = Value::dict({{str("action"), str("alloc")}, {str("addr"), Value::integer(1)}});
  auto root = Value::dict({{str("segments"), Value::list({})},
                           {str("device_traces"), Value::list({Value::list({bad_entry, alloc_entry(1, Value::list({}))})})},
                           {str("allocator_settings"), Value::dict({})}});
  const std::string whole = pickle::write(root, {.frames = false});
  test::write_bytes(path, whole);
  try {
    torch::import_snapshot_file(path, options());
    ADD_FAILURE() << "no error";
  } catch (const torch::SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("device_traces[0][0]: missing key 'time_us'"), std::string::npos) << e.what();
  }
  test::write_bytes(path, whole.substr(0, whole.size() - 3));
  EXPECT_THROW(torch::import_snapshot_file(path, options()), pickle::PickleError);
  std::filesystem::remove(path);
}
