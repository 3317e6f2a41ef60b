#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "crc32c.hpp"  // lib/src: not installed
#include "memsnap/spill.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

Event ev(std::int64_t t, Action a, std::uint64_t addr, std::uint64_t size, std::uint32_t stack = kNoStack) {
  return Event{t, addr, size, 7, stack, 0, a, 0};
}

RankRecord sample() {
  RankRecord r;
  r.meta.rank = 3;
  r.meta.world_size = 8;
  r.meta.host = "node-1";
  r.meta.pid = 4242;
  r.meta.run_name = "run";
  r.meta.config_json = R"({"interval":3})";
  r.meta.device_total_bytes = {80ull << 30};
  r.frames = {{"train_step", "train.py", 12}, {"forward", "model.py", 40}};
  r.stacks = {{1, 0}, {0}};
  WindowRecord w;
  w.batch_start = 2;
  w.batch_end = 4;
  w.open_time_ns = 100;
  w.close_time_ns = 900;
  w.closed = true;
  w.dropped = 5;
  w.live_at_start = {LiveAlloc{0x1000, 64, 7, 50, 1, 0, 0, 0}, LiveAlloc{0x0, 1 << 20, 7, 10, kNoStack, 0, 1, 0}};
  w.events = {ev(110, Action::alloc, 0x2000, 128, 0), ev(120, Action::free_completed, 0x2000, 128),
              ev(130, Action::segment_alloc, 0x100000, 2 << 20)};
  w.batches = {{2, 100}, {3, 300}, {4, 600}};
  Segment s{0x0, 1 << 20, 7, 0, "large", {Block{0x1000, 64, 60, 1, 1}}};
  w.segments = {s};
  r.windows = {w};
  return r;
}

// Writes `r` the way the recorder does and returns the file's bytes.
std::string write_sample(const std::filesystem::path& path, const RankRecord& r, bool end = true) {
  SpillWriter w;
  EXPECT_TRUE(w.open(path)) << w.error();
  EXPECT_TRUE(w.write_meta(r.meta));
  EXPECT_TRUE(w.write_frames(0, r.frames));
  EXPECT_TRUE(w.write_stacks(0, r.stacks));
  const WindowRecord& win = r.windows[0];
  EXPECT_TRUE(w.write_window_open(0, win.batch_start, win.open_time_ns, win.live_at_start));
  EXPECT_TRUE(w.write_batch(0, win.batches[0]));
  EXPECT_TRUE(w.write_events(0, std::span(win.events).subspan(0, 2)));
  EXPECT_TRUE(w.write_batch(0, win.batches[1]));
  EXPECT_TRUE(w.write_batch(0, win.batches[2]));
  EXPECT_TRUE(w.write_events(0, std::span(win.events).subspan(2)));
  EXPECT_TRUE(w.write_segments(0, win.segments));
  EXPECT_TRUE(w.write_window_close(0, win.batch_end, win.close_time_ns, false, win.dropped));
  if (end) {
    EXPECT_TRUE(w.write_end());
  }
  w.close();
  return test::read_file(path);
}

TEST(Spill, RoundTripIsExact) {
  test::TempDir dir;
  const RankRecord r = sample();
  write_sample(dir / "r.spill", r);
  const RankRecord back = read_spill(dir / "r.spill");
  EXPECT_EQ(back.status, RecordStatus::ok) << back.status_detail;
  EXPECT_EQ(back.meta.rank, 3);
  EXPECT_EQ(back.meta.host, "node-1");
  EXPECT_EQ(back.meta.device_total_bytes, r.meta.device_total_bytes);
  EXPECT_EQ(back.frames, r.frames);
  EXPECT_EQ(back.stacks, r.stacks);
  ASSERT_EQ(back.windows.size(), 1u);
  const auto& w = back.windows[0];
  EXPECT_EQ(w.batch_start, 2);
  EXPECT_EQ(w.batch_end, 4);
  EXPECT_TRUE(w.closed);
  EXPECT_EQ(w.status, RecordStatus::ok);
  EXPECT_EQ(w.dropped, 5u);
  EXPECT_EQ(w.live_at_start, r.windows[0].live_at_start);
  ASSERT_EQ(w.events.size(), 3u);
  EXPECT_EQ(std::memcmp(w.events.data(), r.windows[0].events.data(), 3 * sizeof(Event)), 0);
  EXPECT_EQ(w.batches, r.windows[0].batches);
  EXPECT_EQ(w.segments, r.windows[0].segments);
}

// What import writes (write_spill): how the batches were found and the torch extras, which
// may be larger than one record.
TEST(Spill, BatchMethodAndSourceExtrasRoundTrip) {
  test::TempDir dir;
  RankRecord r = sample();
  r.windows[0].batch_method = "recurring_frame";
  r.windows[0].batch_confidence = 0.625;
  r.windows[0].batch_detail = "frame 'step' of adamw.py, every 412 events";
  std::string extras = R"({"segments":[{"stack":1}],"other_keys":{"k":")";
  extras += std::string(kMaxRecordPayload / 4 * 2 + 123, 'x');  // three records' worth
  extras += "\"}}";
  r.windows[0].source_extras = extras;
  std::string error;
  ASSERT_TRUE(write_spill(r, dir / "r.spill", error)) << error;
  const RankRecord back = read_spill(dir / "r.spill");
  EXPECT_EQ(back.status, RecordStatus::ok) << back.status_detail;
  ASSERT_EQ(back.windows.size(), 1u);
  EXPECT_EQ(back.windows[0].batch_method, "recurring_frame");
  EXPECT_EQ(back.windows[0].batch_confidence, 0.625);
  EXPECT_EQ(back.windows[0].batch_detail, r.windows[0].batch_detail);
  EXPECT_EQ(back.windows[0].source_extras, extras);
  EXPECT_EQ(back.windows[0].events.size(), 3u);

  // A recorded window without extras writes neither record: the defaults come back.
  std::string plain_error;
  ASSERT_TRUE(write_spill(sample(), dir / "p.spill", plain_error)) << plain_error;
  const RankRecord plain = read_spill(dir / "p.spill");
  ASSERT_EQ(plain.windows.size(), 1u);
  EXPECT_EQ(plain.windows[0].batch_method, "recorded");
  EXPECT_EQ(plain.windows[0].batch_confidence, 1.0);
  EXPECT_TRUE(plain.windows[0].batch_detail.empty());
  EXPECT_TRUE(plain.windows[0].source_extras.empty());
}

// A spill of format version 1 (memsnap before batch inference), kept in the fuzz corpus as the
// old recorder wrote it, still reads: every window with the defaults.
// META names the launch that wrote the file; a META of an older memsnap, without the key, reads
// with it empty. read_spill_meta reads it from the file's head.
TEST(Spill, MetaCarriesTheLaunchAndOlderMetaReadsWithoutIt) {
  test::TempDir dir;
  RankRecord r = sample();
  r.meta.launch = "1296957441";
  write_sample(dir / "a.spill", r);
  EXPECT_EQ(read_spill(dir / "a.spill").meta.launch, "1296957441");
  const auto meta = read_spill_meta(dir / "a.spill");
  ASSERT_TRUE(meta.has_value());
  EXPECT_EQ(meta->launch, "1296957441");
  EXPECT_EQ(meta->rank, 3);
  EXPECT_EQ(meta_from_json(R"({"rank": 2, "run_name": "old"})").launch, "");
  test::write_file(dir / "b.spill", "not a spill at all, but long enough for a header");
  EXPECT_FALSE(read_spill_meta(dir / "b.spill").has_value());
  EXPECT_FALSE(read_spill_meta(dir / "none.spill").has_value());
}

// A folder with the records of two launches: a store is made of one. The newest by default, with
// one line naming the one left out; another by its id; an unknown id is an error naming those
// there. A spill whose META is not written yet goes with the newest launch lacking its rank.
TEST(Spill, ChooseLaunchTakesTheNewestAndNamesTheOthers) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "spill");
  auto put = [&](int rank, int pid, const std::string& launch, std::int64_t start) {
    RankRecord r = sample();
    r.meta.rank = rank;
    r.meta.world_size = 3;
    r.meta.pid = pid;
    r.meta.launch = launch;
    r.meta.start_unix_ns = start;
    write_sample(dir / "spill" / spill_file_name(rank, pid), r);
  };
  for (int rank = 0; rank < 3; ++rank) put(rank, 10 + rank, "A", 1'000'000'000'000'000'000 + rank);
  put(0, 20, "B", 1'700'000'000'000'000'000);
  put(1, 21, "B", 1'700'000'000'000'000'001);
  {
    SpillWriter w;  // rank 2 of B, killed before its META
    ASSERT_TRUE(w.open(dir / "spill" / spill_file_name(2, 22)));
  }
  const auto launches = spill_launches(find_spills(dir.path()));
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].id, "A");
  EXPECT_EQ(launches[1].id, "B");
  EXPECT_EQ(launches[1].ranks, (std::vector<int>{0, 1, 2}));

  const LaunchChoice newest = choose_launch(dir.path(), "");
  EXPECT_EQ(newest.error, "");
  ASSERT_EQ(newest.files.size(), 3u);
  for (const auto& f : newest.files) EXPECT_NE(f.filename().string().find(".pid2"), std::string::npos) << f;
  EXPECT_NE(newest.note.find("2 launches"), std::string::npos) << newest.note;
  EXPECT_NE(newest.note.find("newest, launch B (3 ranks"), std::string::npos) << newest.note;
  EXPECT_NE(newest.note.find("leaves out launch A (3 ranks"), std::string::npos) << newest.note;
  EXPECT_NE(newest.note.find("--launch A"), std::string::npos) << newest.note;
  EXPECT_EQ(newest.note.find('\n'), std::string::npos) << "one line";

  const LaunchChoice a = choose_launch(dir.path(), "A");
  EXPECT_EQ(a.files.size(), 3u);
  EXPECT_EQ(a.note, "");
  const LaunchChoice c = choose_launch(dir.path(), "C");
  EXPECT_TRUE(c.files.empty());
  EXPECT_NE(c.error.find("no record of launch C"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("launch A"), std::string::npos) << c.error;

  // Spills of one launch, or of a memsnap that named none: all of them, nothing to say.
  test::TempDir one;
  RankRecord r = sample();
  write_sample(one / "rank3.pid1.spill", r);
  const LaunchChoice only = choose_launch(one.path(), "");
  EXPECT_EQ(only.files.size(), 1u);
  EXPECT_EQ(only.note, "");
  EXPECT_EQ(choose_launch(one.path(), kUnnamedLaunch).files.size(), 1u);
}

TEST(Spill, Version1FilesStillRead) {
  const auto path = std::filesystem::path(MEMSNAP_SOURCE_DIR) / "tests/fuzz/corpus/spill/fsdp_sim_a.spill";
  const std::string bytes = test::read_file(path);
  ASSERT_GE(bytes.size(), kSpillHeaderBytes);
  std::uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  ASSERT_EQ(version, 1u) << "the fixture is a version 1 file";
  const RankRecord r = read_spill(path);
  ASSERT_FALSE(r.windows.empty()) << r.status_detail;
  for (const auto& w : r.windows) {
    EXPECT_EQ(w.batch_method, "recorded");
    EXPECT_EQ(w.batch_confidence, 1.0);
    EXPECT_TRUE(w.source_extras.empty());
    EXPECT_FALSE(w.events.empty());
  }
  // And a file this memsnap writes says version 3.
  test::TempDir dir;
  const std::string now = write_sample(dir / "n.spill", sample());
  std::memcpy(&version, now.data() + 8, 4);
  EXPECT_EQ(version, kSpillVersion);
  EXPECT_EQ(kSpillVersion, 3u);
}

// Packed events (record 13) come back bit for bit, whatever each field holds: times that go
// back, addresses that wrap, the host device, no stack and the largest stack id, flags and an
// action past the packing's 4 bits, and more events than one record holds.
TEST(Spill, PackedEventsRoundTripEveryFieldExactly) {
  std::vector<Event> events = {
      Event{0, 0, 0, 0, kNoStack, 0, Action::alloc, 0},
      Event{std::numeric_limits<std::int64_t>::max(), ~0ull, ~0ull, ~0ull, 0xfffffffeu, 32767, Action::segment_map, 0},
      Event{std::numeric_limits<std::int64_t>::min(), 1, 1, 1, 0, -32768, Action::free_completed, 0},
      Event{-5, 0x7f0000000000, 512, 0, 0, -1, Action::free_requested, 0xff},
      Event{-6, 0x10, 512, 0, 1, -1, static_cast<Action>(200), 0},
      Event{-6, 0x10, 512, 0, 1, -1, static_cast<Action>(14), 3},
      Event{100, 0x20, 0, 9, kNoStack, 3, Action::oom, 0},
  };
  for (int i = 0; i < 10000; ++i) {
    const auto a = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    events.push_back(Event{1'000'000 + i * 37 - (i % 7 == 0 ? 500 : 0), 0x7f0000000000 + (a >> 40) * 512, (a >> 50) * 512,
                           static_cast<std::uint64_t>(i % 3), i % 5 == 0 ? kNoStack : static_cast<std::uint32_t>(i % 11),
                           static_cast<std::int16_t>(i % 2), static_cast<Action>(i % kActionCount), 0});
  }
  test::TempDir dir;
  SpillWriter w;
  ASSERT_TRUE(w.open(dir / "p.spill")) << w.error();
  ASSERT_TRUE(w.write_window_open(0, 1, 0, {}));
  ASSERT_TRUE(w.write_events(0, events));
  ASSERT_TRUE(w.write_window_close(0, 1, 1, false, 0));
  w.close();
  const RankRecord r = read_spill(dir / "p.spill");
  ASSERT_EQ(r.status, RecordStatus::truncated) << "no END record, every window whole: " << r.status_detail;
  ASSERT_EQ(r.windows.size(), 1u);
  ASSERT_EQ(r.windows[0].events.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(std::memcmp(&r.windows[0].events[i], &events[i], sizeof(Event)), 0) << "event " << i;
  }
}

// The spill's records, each as (offset of its payload, type, payload bytes).
struct RawRecord {
  std::size_t at;
  std::uint32_t type, length;
};
std::vector<RawRecord> records_of(const std::string& bytes) {
  std::vector<RawRecord> out;
  for (std::size_t pos = kSpillHeaderBytes; pos + kRecordHeaderBytes <= bytes.size();) {
    std::uint32_t head[2];
    std::memcpy(head, bytes.data() + pos, sizeof head);
    out.push_back({pos + kRecordHeaderBytes, head[0], head[1]});
    pos += kRecordHeaderBytes + head[1];
  }
  return out;
}

// A packed record damaged in a way its checksums cannot catch (rewritten with fresh ones, as a
// writer with a bug would) is named, and the window keeps only the records before it.
TEST(Spill, DamagedPackedEventsAreNamedAndNoneOfThemKept) {
  test::TempDir dir;
  const std::string good = write_sample(dir / "g.spill", sample());
  const auto recs = records_of(good);
  std::vector<RawRecord> packed;
  for (const auto& r : recs) {
    if (r.type == static_cast<std::uint32_t>(SpillRecord::events_packed)) packed.push_back(r);
  }
  ASSERT_EQ(packed.size(), 2u) << "the sample writes its events in two records";
  const RawRecord second = packed[1];  // one event: the segment
  auto rewrite = [&](std::string payload) {
    std::string bytes = good.substr(0, second.at - kRecordHeaderBytes);
    std::uint32_t head[4] = {second.type, static_cast<std::uint32_t>(payload.size()), crc32c(payload.data(), payload.size()), 0};
    head[3] = crc32c(head, 12);
    bytes.append(reinterpret_cast<const char*>(head), sizeof head);
    bytes += payload;
    bytes += good.substr(second.at + second.length);
    return read_spill_bytes(std::span(bytes.data(), bytes.size()), "d.spill");
  };
  const std::string payload = good.substr(second.at, second.length);
  ASSERT_EQ(rewrite(payload).status, RecordStatus::ok);

  struct Case {
    const char* what;
    std::string payload;
    const char* named;
  };
  std::string more = payload;
  more[4] = 2;  // two events announced, one written
  std::string overlong = payload.substr(0, 8) + std::string(1, '\x03') + std::string(10, '\xff') + '\x01' + '\x00';
  const std::vector<Case> cases = {
      {"cut inside an event", payload.substr(0, payload.size() - 1), "packed event 0: cut short"},
      {"a byte after the last event", payload + '\x00', "1 bytes after the last packed event"},
      {"more events announced than written", more, "packed event 1: cut short"},
      {"a number past 64 bits", overlong, "packed event 0: a number past 64 bits"},
      {"a count no bytes could hold", payload.substr(0, 4) + std::string("\xff\xff\xff\x0f", 4) + payload.substr(8),
       "packed events announced in"},
  };
  for (const auto& c : cases) {
    const RankRecord r = rewrite(c.payload);
    EXPECT_EQ(r.status, RecordStatus::corrupt) << c.what;
    EXPECT_NE(r.status_detail.find(c.named), std::string::npos) << c.what << ": " << r.status_detail;
    ASSERT_EQ(r.windows.size(), 1u) << c.what;
    EXPECT_EQ(r.windows[0].events.size(), 2u) << c.what << ": the first record's events, none of the damaged one's";
  }
}

TEST(Spill, NeverClobbersAnExistingFile) {
  test::TempDir dir;
  test::write_file(dir / "r.spill", "precious");
  SpillWriter w;
  EXPECT_FALSE(w.open(dir / "r.spill"));
  EXPECT_NE(w.error().find("r.spill"), std::string::npos);
  EXPECT_EQ(test::read_file(dir / "r.spill"), "precious");
}

TEST(Spill, EveryTruncationReadsBackItsCompletePrefix) {
  test::TempDir dir;
  const std::string bytes = write_sample(dir / "r.spill", sample());
  std::size_t last_events = 0;
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    RankRecord r;
    ASSERT_NO_THROW(r = read_spill_bytes(std::span(bytes.data(), cut), "cut")) << "cut at " << cut;
    EXPECT_EQ(r.status, RecordStatus::truncated) << "cut at " << cut;
    std::size_t events = r.windows.empty() ? 0 : r.windows[0].events.size();
    EXPECT_GE(events, last_events) << "a longer prefix never has fewer events";
    last_events = events;
    if (!r.windows.empty() && !r.windows[0].closed) {
      EXPECT_EQ(r.windows[0].status, RecordStatus::truncated);
    }
  }
  EXPECT_EQ(last_events, 3u);
}

TEST(Spill, DamagedBytesAreCorruptNotACrash) {
  test::TempDir dir;
  const std::string bytes = write_sample(dir / "r.spill", sample());
  int corrupt = 0;
  for (std::size_t i = kSpillHeaderBytes; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    RankRecord r;
    ASSERT_NO_THROW(r = read_spill_bytes(std::span(bad.data(), bad.size()), "bad")) << "flip at " << i;
    EXPECT_NE(r.status, RecordStatus::ok) << "flip at " << i;
    corrupt += r.status == RecordStatus::corrupt;
  }
  EXPECT_GT(corrupt, 0);
}

TEST(Spill, NotASpillIsOneClearError) {
  test::TempDir dir;
  test::write_file(dir / "x.spill", "hello, this is not a spill file at all");
  try {
    read_spill(dir / "x.spill");
    FAIL();
  } catch (const SpillError& e) {
    EXPECT_NE(std::string(e.what()).find("not a memsnap spill"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("x.spill"), std::string::npos);
  }
  std::string future = write_sample(dir / "f.spill", sample());
  future[8] = 99;
  try {
    read_spill_bytes(std::span(future.data(), future.size()), "f");
    FAIL();
  } catch (const SpillError& e) {
    EXPECT_NE(std::string(e.what()).find("version 99 is not supported (this memsnap reads versions 1 to 3)"),
              std::string::npos)
        << e.what();
  }
  future[8] = 0;
  EXPECT_THROW(read_spill_bytes(std::span(future.data(), future.size()), "f"), SpillError);
}

TEST(Spill, KilledWriterLeavesAReadablePrefix) {
  test::TempDir dir;
  const auto path = dir / "k.spill";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    SpillWriter w;
    if (!w.open(path)) _exit(2);
    RankMeta m;
    m.rank = 1;
    w.write_meta(m);
    w.write_window_open(0, 2, 10, {});
    std::vector<Event> batch;
    for (int i = 0; i < 1000; ++i) batch.push_back(ev(20 + i, Action::alloc, 0x1000 + 64 * i, 64));
    w.write_events(0, batch);
    char c = 'x';
    (void)!write(ready[1], &c, 1);
    // Keep writing until killed: the kill lands mid-stream.
    for (std::int64_t t = 0;; ++t) {
      Event one = ev(5000 + t, Action::alloc, 0x900000 + t, 8);
      w.write_events(0, std::span(&one, 1));
    }
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  usleep(20000);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const RankRecord r = read_spill(path);
  EXPECT_EQ(r.status, RecordStatus::truncated) << r.status_detail;
  EXPECT_EQ(r.meta.rank, 1);
  ASSERT_EQ(r.windows.size(), 1u);
  EXPECT_FALSE(r.windows[0].closed);
  ASSERT_GE(r.windows[0].events.size(), 1000u) << "every record written before the kill";
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(r.windows[0].events[i].addr, 0x1000u + 64 * i);
}

}  // namespace
}  // namespace memsnap
