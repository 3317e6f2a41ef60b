// Tests of the streamed torch snapshot export (torch/snapshot_export.hpp): its bytes are those of
// the value tree written whole (snapshot_value, pickle::write), for the real fixtures, the
// hand-made snapshots and a large window with every shape the extras can give, however the
// events come in pieces; and it hands its output out a frame at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "test_util.hpp"
#include "torch/pickle.hpp"
#include "torch/pickle_writer.hpp"
#include "torch/snapshot.hpp"
#include "torch/snapshot_export.hpp"
#include "snapshot_tree.hpp"

using namespace memsnap;

namespace {

torch::ImportOptions options() {
  torch::ImportOptions opt;
  opt.rank = 0;
  opt.batch = 5;
  return opt;
}

// The tree's bytes: what the export wrote before it was streamed.
std::string tree_bytes(const RankRecord& rec, const nlohmann::json& extras) {
  return pickle::write(torch::snapshot_value(rec, 0, extras));
}

// write_snapshot with the events handed out `piece` at a time.
std::string streamed_bytes(const RankRecord& rec, const nlohmann::json& extras, std::size_t piece) {
  const std::vector<Event>& events = rec.windows[0].events;
  std::string out;
  torch::write_snapshot(
      rec, rec.windows[0],
      [&](const auto& take) {
        for (std::size_t i = 0; i < events.size(); i += piece)
          if (!take(std::span<const Event>(events).subspan(i, std::min(piece, events.size() - i)))) return;
      },
      extras, [&out](std::string_view bytes) { out += bytes; });
  return out;
}

void expect_streamed_equals_tree(const RankRecord& rec, const nlohmann::json& extras) {
  const std::string tree = tree_bytes(rec, extras);
  EXPECT_TRUE(torch::export_snapshot(rec, 0, extras) == tree) << "export_snapshot differs from the tree";
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{4096}})
    EXPECT_TRUE(streamed_bytes(rec, extras, piece) == tree) << "events in pieces of " << piece;
}

// A window the fixtures do not have: two devices with entries and one that was None, 6000
// events, stacks past 256 memo entries (LONG_BINGET), a segment of 1500 blocks (several
// SETITEMS/APPENDS batches), stack and frame ids that name nothing, addresses past INT64_MAX,
// negative times, OOMs, and segment_map events inside a segment whose extras do not say whether
// it is expandable.
RankRecord large_record() {
  RankRecord rec;
  for (std::uint32_t i = 0; i < 600; ++i)
    rec.frames.push_back(Frame{"f" + std::to_string(i % 50), "file" + std::to_string(i % 7) + ".py", i});
  for (std::uint32_t s = 0; s < 400; ++s) {
    Stack st;
    for (std::uint32_t k = 0; k < s % 5; ++k) st.push_back((s * 3 + k) % 600);
    if (s % 37 == 0) st.push_back(100000);  // no such frame
    rec.stacks.push_back(st);
  }
  WindowRecord w;
  Segment big{0x10000000, 1500 * 4096, 0, 0, "large", {}};
  for (std::uint32_t j = 0; j < 1500; ++j)
    big.blocks.push_back(
        Block{big.addr + j * 4096ull, 4096, 4000, static_cast<std::uint8_t>(j % 3), j % 4 ? j % 450 : kNoStack});
  w.segments.push_back(big);
  w.segments.push_back(Segment{
      0x20000000, 8192, 7, 0, "small", {Block{0x20000000, 4096, 4096, 1, 3}, Block{0x20001000, 4096, 0, 0, kNoStack}}});
  w.segments.push_back(Segment{0x30000000, 1 << 21, 0, 2, "", {}});
  const Action actions[] = {Action::alloc, Action::free_requested, Action::free_completed, Action::segment_map,
                            Action::oom};
  for (std::uint32_t i = 0; i < 6000; ++i) {
    Event e;
    e.time_ns = static_cast<std::int64_t>(i) * 1500 - 3000;
    e.action = actions[i % 5];
    e.device = i % 6 == 5 ? 2 : 0;
    e.addr = e.action == Action::segment_map ? 0x30000000 + (i % 8) * 4096ull
                                             : (i % 11 == 0 ? ~0ull - i : 0x10000000 + i * 64ull);
    e.size = i % 9 == 0 ? (1ull << 40) : 512 + i;
    e.stream = i % 3;
    e.stack_id = i % 13 == 0 ? kNoStack : i % 450;
    w.events.push_back(e);
  }
  rec.windows.push_back(std::move(w));
  return rec;
}

nlohmann::json large_extras() {
  return nlohmann::json::parse(R"({
    "device_count": 4,
    "none_traces": [1],
    "segments": [
      {"stack": 3, "segment_pool_id": {"__tuple__": [1, 2]}, "is_expandable": false, "allocated_size": 5,
       "blocks_x": [{"index": 0, "absent": ["requested_size"], "other": {"extra": [1, {"__bytes_hex__": "00ff"}]}},
                    {"index": 1200, "other": {"note": "x"}}]},
      {"stack": -1, "segment_pool_id": [0, 7], "is_expandable": true, "other": {"frames": "a str now"}, "absent": ["frames"]}
    ],
    "trace_extras": [
      {"device": 0, "index": 5, "compile_context": "graph A", "other": {"seq": 7}},
      {"device": 0, "index": 999, "absent": ["stream"]},
      {"device": 2, "index": 0, "user_metadata": {"__str_hex__": "edb3bf"}}
    ],
    "unknown_entries": [
      {"device": 0, "position": 0, "entry": {"action": "future", "size": 1}},
      {"device": 0, "position": 1000, "entry": {"action": "future", "n": 2}, "stack": 7},
      {"device": 0, "position": 1000, "entry": {"action": "same place"}, "stack": 7},
      {"device": 0, "position": 1000000, "entry": {"action": "last"}},
      {"device": 3, "position": 0, "entry": {"action": "lonely"}, "stack": 400000}
    ],
    "allocator_settings": {"expandable_segments": true},
    "external_annotations": [{"name": "a"}],
    "other_keys": {"custom": [1, 2, 3], "frames": "a key the tree does not pool"}
  })");
}

}  // namespace

// The real snapshots and the hand-made ones, imported, with their extras as the store keeps
// them (JSON text) and without: the streamed export writes the tree's bytes.
TEST(SnapshotExportTest, StreamedExportEqualsTreeExport) {
  std::vector<std::string> pickles;
  for (const char* name : {"snap_native.pickle", "snap_exp.pickle", "snap_oom.pickle"})
    pickles.push_back(test::fixture(name));
  for (const char* kind : {"rich", "old"}) {
    pickles.push_back(test::temp_path(std::string("export_") + kind + ".pickle"));
    auto made = test::run_python(test::quoted(test::script("make_snapshot.py")) + " " + kind + " " +
                                 test::quoted(pickles.back()));
    ASSERT_EQ(made.status, 0) << made.output;
  }
  for (const auto& path : pickles) {
    SCOPED_TRACE(path);
    const auto result = torch::import_snapshot_file(path, options());
    expect_streamed_equals_tree(result.record, nlohmann::json::parse(result.extras.dump()));
    expect_streamed_equals_tree(result.record, nlohmann::json());
  }
  for (std::size_t i = 3; i < pickles.size(); ++i) std::filesystem::remove(pickles[i]);
}

// A large window, with extras that keep, drop and add keys at every level: the same bytes as the
// tree, and Python reads them.
TEST(SnapshotExportTest, LargeWindowStreamsTheTreeBytes) {
  const RankRecord rec = large_record();
  const nlohmann::json extras = large_extras();
  expect_streamed_equals_tree(rec, extras);
  expect_streamed_equals_tree(rec, nlohmann::json());
  // Keys dropped where the tree drops them: what is then reached once is not memoised.
  for (const char* absent : {R"({"absent": ["segments"]})", R"({"absent": ["device_traces", "allocator_settings"]})",
                             R"({"trace_absent": ["compile_context", "user_metadata", "frames"]})"}) {
    SCOPED_TRACE(absent);
    nlohmann::json x = extras;
    x.update(nlohmann::json::parse(absent));
    expect_streamed_equals_tree(rec, x);
  }
  // Annotations are written one at a time: cut where the whole list would be cut (200 deep).
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 205; ++i) deep = nlohmann::json::array({deep, i});
  nlohmann::json x = extras;
  x["external_annotations"].push_back(deep);
  expect_streamed_equals_tree(rec, x);
  x["external_annotations"] = nlohmann::json::parse(R"({"__tuple__": [1, "a"]})");
  expect_streamed_equals_tree(rec, x);
  const std::string path = test::temp_path("export_large.pickle");
  test::write_bytes(path, torch::export_snapshot(rec, 0, extras));
  const auto r = test::run_python(
      "-c \"import pickle, sys; s = pickle.load(open(sys.argv[1], 'rb')); "
      "print(len(s['segments'][0]['blocks']), [None if t is None else len(t) for t in s['device_traces']])\" " +
      test::quoted(path));
  EXPECT_EQ(r.output, "1500 [5004, None, 1000, 1]\n");
  std::filesystem::remove(path);
}

// The output leaves as it is made, a frame (about 64 KiB) at a time, never as one string.
TEST(SnapshotExportTest, OutputLeavesAFrameAtATime) {
  const RankRecord rec = large_record();
  std::size_t total = 0, largest = 0, pieces = 0;
  torch::write_snapshot(
      rec, rec.windows[0], [&rec](const auto& take) { take(std::span<const Event>(rec.windows[0].events)); },
      large_extras(),
      [&](std::string_view bytes) {
        total += bytes.size();
        largest = std::max(largest, bytes.size());
        ++pieces;
      });
  EXPECT_EQ(total, tree_bytes(rec, large_extras()).size());
  EXPECT_GT(pieces, 4u);
  EXPECT_LE(largest, 65u * 1024);
}

TEST(SnapshotExportTest, NoSuchWindowIsASnapshotError) {
  const RankRecord rec = large_record();
  EXPECT_THROW(torch::export_snapshot(rec, 1), torch::SnapshotError);
  EXPECT_THROW(torch::snapshot_value(rec, 1), torch::SnapshotError);
}
