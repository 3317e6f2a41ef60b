// End-to-end tests of aggregation: real spills (SpillWriter), a real mpirun with 1..7 aggregator
// ranks, the real HDF5 store read back by StoreReader, h5py and h5ls.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memsnap/aggregate.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/store.hpp"
#include "spill_gen.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using test::GenSpec;
using test::TempDir;

using Result = test::SplitResult;
using test::shell_quote;

Result sh(const std::string& cmd) {
  return test::run_shell_split(cmd);
}

// The real `memsnap` binary once the CLI has `aggregate`, else the stand-in driver.
const std::string& cli() {
  static const std::string path = [] {
    if (const char* e = std::getenv("MEMSNAP_TEST_CLI")) return std::string(e);
    const fs::path real = fs::path(MEMSNAP_BIN_DIR) / "memsnap";
    if (fs::exists(real) && sh(shell_quote(real.string()) + " aggregate --help").rc == 0) return real.string();
    return std::string(MEMSNAP_AGGREGATE_DEV);
  }();
  return path;
}

// np 0: run the command directly (a singleton MPI process, no mpirun).
Result aggregate(int np, const fs::path& run_dir, const std::string& flags = "", const std::string& env = "") {
  std::string cmd = env.empty() ? "" : env + " ";
  if (np > 0) cmd += std::string("timeout 120 ") + MEMSNAP_MPIEXEC + " -n " + std::to_string(np) + " --oversubscribe ";
  cmd += shell_quote(cli()) + " aggregate " + flags + " " + shell_quote(run_dir.string());
  return sh(cmd);
}

Result info_cmd(const fs::path& path, bool json = true) {
  return sh(shell_quote(cli()) + " info " + shell_quote(path.string()) + (json ? " --json" : ""));
}

void expect_same_window(const WindowRecord& got, const WindowRecord& want, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(got.batch_start, want.batch_start);
  EXPECT_EQ(got.batch_end, want.batch_end);
  EXPECT_EQ(got.open_time_ns, want.open_time_ns);
  EXPECT_EQ(got.close_time_ns, want.close_time_ns);
  EXPECT_EQ(got.oom, want.oom);
  EXPECT_EQ(got.closed, want.closed);
  EXPECT_EQ(got.dropped, want.dropped);
  EXPECT_EQ(got.status, want.status);
  EXPECT_EQ(got.live_at_start, want.live_at_start);
  EXPECT_EQ(got.batches, want.batches);
  EXPECT_EQ(got.segments, want.segments);
  EXPECT_EQ(got.batch_method, want.batch_method);
  EXPECT_EQ(got.batch_confidence, want.batch_confidence);
  EXPECT_EQ(got.batch_detail, want.batch_detail);
  EXPECT_EQ(got.source_extras, want.source_extras);
  ASSERT_EQ(got.events.size(), want.events.size());
  // Events are trivially copyable without padding: equal bytes are equal events, field by field.
  EXPECT_EQ(0, std::memcmp(got.events.data(), want.events.data(), got.events.size() * sizeof(Event)));
}

void expect_same_rank(const RankRecord& got, const RankRecord& want) {
  SCOPED_TRACE("rank " + std::to_string(want.meta.rank));
  EXPECT_EQ(got.meta.rank, want.meta.rank);
  EXPECT_EQ(got.meta.host, want.meta.host);
  EXPECT_EQ(got.meta.pid, want.meta.pid);
  EXPECT_EQ(got.meta.local_rank, want.meta.local_rank);
  EXPECT_EQ(got.meta.node_rank, want.meta.node_rank);
  EXPECT_EQ(got.meta.world_size, want.meta.world_size);
  EXPECT_EQ(got.meta.run_name, want.meta.run_name);
  EXPECT_EQ(got.meta.device_name, want.meta.device_name);
  EXPECT_EQ(got.meta.config_json, want.meta.config_json);
  EXPECT_EQ(got.meta.start_unix_ns, want.meta.start_unix_ns);
  EXPECT_EQ(got.meta.device_total_bytes, want.meta.device_total_bytes);
  EXPECT_EQ(got.frames, want.frames);
  EXPECT_EQ(got.stacks, want.stacks);
  ASSERT_EQ(got.windows.size(), want.windows.size());
  for (std::size_t w = 0; w < want.windows.size(); ++w) expect_same_window(got.windows[w], want.windows[w], "window " + std::to_string(w));
}

fs::path spill_path(const fs::path& run, int rank) { return run / "spill" / spill_file_name(rank, 1000 + rank); }

// A clean run of `world` ranks; returns what each rank recorded. With `inferred`, the odd ranks'
// windows say their batches were inferred and carry source extras (as imported torch traces do).
std::vector<RankRecord> make_clean_run(const fs::path& run, int world, std::size_t events = 400,
                                       bool inferred = false) {
  fs::create_directories(run / "spill");
  std::vector<RankRecord> out;
  for (int r = 0; r < world; ++r) {
    GenSpec s;
    s.rank = r;
    s.world_size = world;
    s.inferred_batches = inferred && r % 2 == 1;
    s.events_per_window = events + 37 * static_cast<std::size_t>(r);
    out.push_back(test::make_record(s));
    EXPECT_TRUE(test::write_spill_file(spill_path(run, r), out.back(), true));
  }
  return out;
}

// World 8: ranks 0-3 and 7 fine, 4 killed mid-window (truncated), 5 damaged (corrupt), 6 missing.
void make_dirty_run(const fs::path& run) {
  fs::create_directories(run / "spill");
  for (int r : {0, 1, 2, 3, 4, 5, 7}) {
    GenSpec s;
    s.rank = r;
    s.world_size = 8;
    s.last_window_open = r == 4;
    const RankRecord rec = test::make_record(s);
    ASSERT_TRUE(test::write_spill_file(spill_path(run, r), rec, r != 4));
  }
  test::cut_file(spill_path(run, 4), 5);        // inside the last events record
  test::damage_file(spill_path(run, 5), 2000);  // inside the last window's events
}

bool leftovers(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp-") != std::string::npos || n.rfind("memsnap.h5", 0) == 0) return true;
  }
  return false;
}

TEST(AggregateTest, EventsReadBackExactly) {
  TempDir t;
  const auto want = make_clean_run(t.path(), 4);
  const Result r = aggregate(2, t.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  StoreReader store(t / "memsnap.h5");
  const StoreInfo info = store.info();
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.run_name, "synthetic");
  EXPECT_EQ(info.config_json, want[0].meta.config_json);
  ASSERT_EQ(info.ranks.size(), 4u);
  ASSERT_EQ(info.rows.size(), 8u);
  for (int rank = 0; rank < 4; ++rank) {
    expect_same_rank(store.read_rank(rank), want[rank]);
    EXPECT_EQ(info.ranks[rank].status, "ok");
    EXPECT_EQ(info.ranks[rank].host, want[rank].meta.host);
    EXPECT_EQ(info.ranks[rank].data_file, "memsnap.h5.d/rank" + std::to_string(rank) + ".h5");
    expect_same_window(store.read_window(rank, 4), want[rank].windows[0], "read_window");
  }
  // The summary agrees with the analysis of the recorded windows.
  for (const auto& row : info.rows) {
    const RankRecord& rec = want[row.rank];
    const WindowStats s = analyse_window(rec, rec.windows[row.window]);
    EXPECT_EQ(row.peak_allocated, s.peak_allocated);
    EXPECT_EQ(row.n_events, rec.windows[row.window].events.size());
    EXPECT_EQ(row.live_at_open, s.live_at_open);
    EXPECT_EQ(row.batch_end, test::window_end(row.window));
    EXPECT_EQ(row.status, "ok");
    std::uint64_t cats = 0;
    for (auto b : row.category_bytes) cats += b;
    EXPECT_EQ(cats, s.peak_allocated);
  }
  const auto sites = store.sites();
  EXPECT_FALSE(sites.empty());
  for (const auto& s : sites) EXPECT_FALSE(s.name.empty());
  EXPECT_FALSE(fs::exists(t / "memsnap.h5.d" / "part0.h5"));
}

TEST(AggregateTest, SameStoreWhateverTheNumberOfAggregatorRanks) {
  TempDir t;
  const auto want = make_clean_run(t / "run", 5);
  std::string json1;
  std::vector<std::vector<SummaryRow>> summaries;
  // Then with the compression threads set by hand (kept inside mpirun's binding), one and three.
  for (const auto& [np, threads] : std::vector<std::pair<int, int>>{{1, 0}, {2, 0}, {4, 0}, {7, 0}, {2, 1}, {1, 3}}) {
    SCOPED_TRACE("np " + std::to_string(np) + " threads " + std::to_string(threads));
    const fs::path store = t / ("store" + std::to_string(np) + "t" + std::to_string(threads) + ".h5");
    const std::string flags = threads ? " --threads " + std::to_string(threads) : "";
    const Result r = aggregate(np, t / "run", "-o " + shell_quote(store.string()) + flags);
    ASSERT_EQ(r.rc, 0) << r.err;
    const Result i = info_cmd(store);
    ASSERT_EQ(i.rc, 0) << i.err;
    if (json1.empty()) json1 = i.out;
    EXPECT_EQ(i.out, json1);  // byte-identical
    StoreReader reader(store);
    for (int rank = 0; rank < 5; ++rank) expect_same_rank(reader.read_rank(rank), want[rank]);
    EXPECT_EQ(reader.sites(), StoreReader(t / "store1t0.h5").sites());
    EXPECT_EQ(reader.summary(), StoreReader(t / "store1t0.h5").summary());
  }
  // --threads is checked: a count of 0 is refused with one line and no store.
  const Result bad = aggregate(0, t / "run", "-o " + shell_quote((t / "bad.h5").string()) + " --threads 0");
  EXPECT_EQ(bad.rc, 2) << bad.err;
  EXPECT_NE(bad.err.find("--threads"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(t / "bad.h5"));
  // The spill folder summarised directly says the same.
  const Result s = info_cmd(t / "run");
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(s.out, json1);
  const auto j = nlohmann::json::parse(json1);
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["world_size"], 5);
  EXPECT_EQ(j["ranks"].size(), 5u);
  EXPECT_EQ(j["ranks"][1]["windows"][0]["batch"], 4);
  EXPECT_EQ(j["ranks"][1]["windows"][0]["batch_start"], 2);
  EXPECT_EQ(j["ranks"][1]["windows"][0]["events"], want[1].windows[0].events.size());
  // Exactly the keys store_info_json documents (memsnap/aggregate.hpp), and the findings; a column
  // added to /ranks or /summary shows too (info.cpp), and belongs in that list.
  auto keys = [](const nlohmann::json& o) {
    std::set<std::string> out;
    for (const auto& item : o.items()) out.insert(item.key());
    return out;
  };
  EXPECT_EQ(keys(j), (std::set<std::string>{"format_version", "run_name", "world_size", "ranks", "findings"}));
  EXPECT_EQ(keys(j["ranks"][0]), (std::set<std::string>{"rank", "status", "host", "windows"}));
  EXPECT_EQ(
      keys(j["ranks"][0]["windows"][0]),
      (std::set<std::string>{"batch", "batch_start", "events", "dropped", "peak_allocated", "peak_reserved",
                             "live_at_open", "live_at_close", "oom", "status", "batch_method", "batch_confidence"}));
}

// How each window's batches were found, and the torch extras, reach the store, its summary and
// `memsnap info --json` alike from the store and from the spills.
TEST(AggregateTest, BatchMethodAndSourceExtrasReachTheStore) {
  TempDir t;
  const auto want = make_clean_run(t / "run", 4, 400, true);
  ASSERT_EQ(aggregate(2, t / "run").rc, 0);
  StoreReader store(t / "run/memsnap.h5");
  for (int rank = 0; rank < 4; ++rank) expect_same_rank(store.read_rank(rank), want[rank]);
  EXPECT_EQ(store.read_window(1, 8).batch_method, "periodicity");
  EXPECT_EQ(store.read_window(1, 8).source_extras, want[1].windows[1].source_extras);
  for (const auto& row : store.summary()) {
    const WindowRecord& w = want[row.rank].windows[row.window];
    EXPECT_EQ(row.batch_method, w.batch_method);
    EXPECT_EQ(row.batch_confidence, w.batch_confidence);
  }
  const Result i = info_cmd(t / "run/memsnap.h5");
  ASSERT_EQ(i.rc, 0) << i.err;
  const Result s = info_cmd(t / "run");
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(i.out, s.out);
  const auto j = nlohmann::json::parse(i.out);
  EXPECT_EQ(j["ranks"][0]["windows"][0]["batch_method"], "recorded");
  EXPECT_EQ(j["ranks"][0]["windows"][0]["batch_confidence"], 1.0);
  EXPECT_EQ(j["ranks"][3]["windows"][0]["batch_method"], "recurring_annotation");
  EXPECT_EQ(j["ranks"][3]["windows"][1]["batch_confidence"], 0.625);
  // The human table says which windows' boundaries were inferred.
  const Result table = info_cmd(t / "run/memsnap.h5", false);
  EXPECT_NE(table.out.find("rank 3 batch 8: batch boundaries inferred (periodicity, confidence 0.62)"),
            std::string::npos)
      << table.out;
  EXPECT_EQ(table.out.find("rank 0 batch"), std::string::npos) << table.out;
}

// A store of format version 1 (written before batch_method and source_extras existed; kept in
// the fuzz corpus as root file and rank 0 file) still reads, with the defaults.
TEST(StoreTest, Version1StoresStillRead) {
  TempDir t;
  const std::string raw =
      test::read_file(fs::path(MEMSNAP_SOURCE_DIR) / "tests/fuzz/corpus/store_raw/aggregate_fsdp_sim.bin");
  ASSERT_GT(raw.size(), 4u);
  std::uint32_t n = 0;
  std::memcpy(&n, raw.data(), 4);
  ASSERT_LE(n, raw.size() - 4);
  fs::create_directories(t / "memsnap.h5.d");
  test::write_file(t / "memsnap.h5", raw.substr(4, n));
  test::write_file(t / "memsnap.h5.d/rank0.h5", raw.substr(4 + n));
  StoreReader store(t / "memsnap.h5");
  const StoreInfo info = store.info();
  EXPECT_EQ(info.format_version, 1);
  ASSERT_FALSE(info.rows.empty());
  for (const auto& row : info.rows) {
    EXPECT_EQ(row.batch_method, "recorded");
    EXPECT_EQ(row.batch_confidence, 1.0);
  }
  const RankRecord r = store.read_rank(0);
  ASSERT_FALSE(r.windows.empty());
  for (const auto& w : r.windows) {
    EXPECT_EQ(w.batch_method, "recorded");
    EXPECT_EQ(w.batch_confidence, 1.0);
    EXPECT_TRUE(w.batch_detail.empty());
    EXPECT_TRUE(w.source_extras.empty());
    EXPECT_FALSE(w.events.empty());
  }
  const Result i = info_cmd(t / "memsnap.h5");
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_EQ(nlohmann::json::parse(i.out)["ranks"][0]["windows"][0]["batch_method"], "recorded");
}

TEST(AggregateTest, RunsWithoutMpirun) {
  TempDir t;
  const auto want = make_clean_run(t.path(), 3);
  const Result r = aggregate(0, t.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  StoreReader store(t / "memsnap.h5");
  expect_same_rank(store.read_rank(2), want[2]);
}

TEST(AggregateTest, BadRanksFailByDefaultAndAreNamed) {
  for (int np : {1, 3}) {
    SCOPED_TRACE("np " + std::to_string(np));
    TempDir t;
    make_dirty_run(t.path());
    const Result r = aggregate(np, t.path());
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("rank 4: truncated: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(spill_path(t.path(), 4).string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 5: corrupt: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 6: missing: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--keep-going"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("rank 3:"), std::string::npos) << r.err;
    EXPECT_FALSE(leftovers(t.path())) << "a failed run left files behind";
  }
}

TEST(AggregateTest, KeepGoingWritesAndMarksBadRanks) {
  TempDir t;
  make_dirty_run(t.path());
  const Result r = aggregate(3, t.path(), "--keep-going");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warning: rank 6: missing"), std::string::npos) << r.err;
  StoreReader store(t / "memsnap.h5");
  const StoreInfo info = store.info();
  ASSERT_EQ(info.world_size, 8);
  ASSERT_EQ(info.ranks.size(), 8u);
  EXPECT_EQ(info.ranks[4].status, "truncated");
  EXPECT_EQ(info.ranks[5].status, "corrupt");
  EXPECT_EQ(info.ranks[6].status, "missing");
  EXPECT_EQ(info.ranks[6].data_file, "");
  for (int ok : {0, 1, 2, 3, 7}) EXPECT_EQ(info.ranks[ok].status, "ok");

  // Truncated and corrupt ranks hold what their spills had up to the cut, exactly.
  for (int rank : {4, 5}) {
    const RankRecord want = read_spill(spill_path(t.path(), rank));
    expect_same_rank(store.read_rank(rank), want);
    ASSERT_EQ(want.windows.size(), 2u);
    EXPECT_EQ(want.windows[0].status, RecordStatus::ok);
    EXPECT_FALSE(want.windows[1].closed);
  }
  const RankRecord r4 = store.read_rank(4);
  EXPECT_EQ(r4.status, RecordStatus::truncated);
  EXPECT_EQ(r4.windows[1].status, RecordStatus::truncated);
  EXPECT_EQ(store.read_rank(5).windows[1].status, RecordStatus::corrupt);
  const RankRecord r6 = store.read_rank(6);
  EXPECT_EQ(r6.status, RecordStatus::missing);
  EXPECT_TRUE(r6.windows.empty());

  // The missing rank has its summary row; the truncated rank's open window is marked.
  bool missing_row = false, open_row = false;
  for (const auto& row : info.rows) {
    if (row.rank == 6) missing_row = row.window == -1 && row.status == "missing";
    if (row.rank == 4 && row.window == 1) open_row = row.status == "truncated";
  }
  EXPECT_TRUE(missing_row);
  EXPECT_TRUE(open_row);

  const Result i = info_cmd(t / "memsnap.h5");
  ASSERT_EQ(i.rc, 0) << i.err;
  const auto j = nlohmann::json::parse(i.out);
  EXPECT_EQ(j["ranks"][6]["status"], "missing");
  EXPECT_TRUE(j["ranks"][6]["windows"].empty());
  EXPECT_EQ(j["ranks"][4]["windows"][1]["status"], "truncated");
  // Same content whether read from the store or straight from the spills.
  const Result s = info_cmd(t.path() / "spill");
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(s.out, i.out);

  const Result table = info_cmd(t / "memsnap.h5", false);
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("MiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("missing"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("PEAK ALLOC"), std::string::npos) << table.out;
}

TEST(AggregateTest, UnreadableSpillIsNamed) {
  TempDir t;
  make_clean_run(t.path(), 2);
  test::write_file(t / "spill" / "rank2.pid9.spill", "this is not a spill file at all");
  test::write_file(t / "spill" / "junk.spill", "nor is this");
  const Result r = aggregate(2, t.path());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("rank2.pid9.spill: not a memsnap spill file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("junk.spill"), std::string::npos) << r.err;
  EXPECT_FALSE(leftovers(t.path()));

  const Result k = aggregate(2, t.path(), "--keep-going");
  ASSERT_EQ(k.rc, 0) << k.err;
  StoreReader store(t / "memsnap.h5");
  const auto ranks = store.ranks();
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2].status, "corrupt");
  EXPECT_NE(ranks[2].status_detail.find("bad magic"), std::string::npos);
  EXPECT_EQ(store.read_rank(2).status, RecordStatus::corrupt);
  EXPECT_EQ(store.read_rank(1).windows.size(), 2u);
}

TEST(AggregateTest, ExistingStoreIsNotOverwritten) {
  TempDir t;
  make_clean_run(t / "run", 2);
  const fs::path store = t / "out.h5";
  ASSERT_EQ(aggregate(1, t / "run", "-o " + shell_quote(store.string())).rc, 0);
  const std::string before = test::read_file(store);
  const std::string before_rank = test::read_file(store_data_dir(store) / "rank1.h5");

  // A different run aimed at the same store.
  make_clean_run(t / "run2", 3);
  const Result again = aggregate(2, t / "run2", "-o " + shell_quote(store.string()));
  EXPECT_NE(again.rc, 0);
  EXPECT_NE(again.err.find("already exists"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(test::read_file(store), before);
  EXPECT_EQ(test::read_file(store_data_dir(store) / "rank1.h5"), before_rank);

  const Result over = aggregate(2, t / "run2", "--overwrite -o " + shell_quote(store.string()));
  ASSERT_EQ(over.rc, 0) << over.err;
  EXPECT_EQ(StoreReader(store).info().world_size, 3);
  EXPECT_FALSE(leftovers(t.path()) && fs::exists(t / ".out.h5.tmp-"));
  for (const auto& e : fs::directory_iterator(t.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(AggregateTest, FailingAggregatorRankDoesNotHangTheOthers) {
  TempDir t;
  make_clean_run(t.path(), 4);
  for (int bad : {0, 2}) {
    const Result r = aggregate(3, t.path(), "", "MEMSNAP_AGGREGATE_TEST_FAULT=" + std::to_string(bad));
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.rc, 124) << "timed out: a rank hung";
    EXPECT_NE(r.err.find("aggregator rank " + std::to_string(bad) + " failed"), std::string::npos) << r.err;
    EXPECT_FALSE(leftovers(t.path()));
  }
}

TEST(AggregateTest, MissingRunDirAndEmptyRunDir) {
  TempDir t;
  const Result r = aggregate(1, t / "nope");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("memsnap aggregate: "), std::string::npos);
  EXPECT_NE(r.err.find("nope: no such folder"), std::string::npos) << r.err;
  const Result e = aggregate(2, t.path());
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(e.err.find("no spill files"), std::string::npos) << e.err;
}

TEST(AggregateTest, H5pyReadsThroughTheExternalLinksFromAnyFolder) {
  if (sh("/usr/bin/python3 -c 'import h5py'").rc != 0) GTEST_SKIP() << "no h5py for /usr/bin/python3";
  TempDir t;
  const auto want = make_clean_run(t / "run", 3);
  ASSERT_EQ(aggregate(2, t / "run").rc, 0);
  const std::string script =
      "import h5py, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "assert f.attrs['format'] == b'memsnap', f.attrs['format']\n"
      "s = f['/summary'][:]\n"
      "ev = f['/rank/1/batch/4/events'][:]\n"
      "names = bytes(f['/site_names/blob'][:]).decode()\n"
      "print(len(s), int(s['peak_allocated'][2]), len(ev), int(ev['time_ns'][0]), int(ev['size'][-1]),"
      " f['/rank/1'].attrs['hostname'].decode(), len(names) > 0)\n";
  test::write_file(t / "check.py", script);
  const RankRecord& r1 = want[1];
  std::ostringstream expect;
  expect << 6 << " " << analyse_window(r1, r1.windows[0]).peak_allocated << " " << r1.windows[0].events.size() << " "
         << r1.windows[0].events.front().time_ns << " " << r1.windows[0].events.back().size << " " << r1.meta.host
         << " True\n";
  // From an unrelated folder with an absolute path, and from the parent with a relative one.
  const Result a = sh("cd / && /usr/bin/python3 " + shell_quote((t / "check.py").string()) + " " +
                      shell_quote((t / "run/memsnap.h5").string()));
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, expect.str());
  const Result b = sh("cd " + shell_quote(t.path().string()) + " && /usr/bin/python3 check.py run/memsnap.h5");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.out, expect.str());
  // The store moves as a pair (root + .d folder) and still reads.
  fs::create_directories(t / "moved");
  fs::rename(t / "run/memsnap.h5", t / "moved/memsnap.h5");
  fs::rename(t / "run/memsnap.h5.d", t / "moved/memsnap.h5.d");
  const Result c = sh("cd /tmp && /usr/bin/python3 " + shell_quote((t / "check.py").string()) + " " +
                      shell_quote((t / "moved/memsnap.h5").string()));
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(c.out, expect.str());
}

TEST(AggregateTest, H5lsListsTheStore) {
  if (sh("command -v h5ls").rc != 0) GTEST_SKIP() << "no h5ls";
  TempDir t;
  make_clean_run(t.path(), 2);
  ASSERT_EQ(aggregate(1, t.path()).rc, 0);
  const Result l = sh("cd / && h5ls -r --follow-symlinks " + shell_quote((t / "memsnap.h5").string()));
  ASSERT_EQ(l.rc, 0) << l.err;
  for (const char* p : {"/summary", "/sites", "/ranks", "/rank/0/batch/4/events", "/rank/0/frames/names_blob",
                        "/rank/0/stacks/frame_ids", "/rank/0/batch/8/segments", "External Link {memsnap.h5.d/rank1.h5//}"}) {
    EXPECT_NE(l.out.find(p), std::string::npos) << p << "\n" << l.out;
  }
  // h5ls -r marks rank 1's root "Already Visited" (same address as rank 0's, in another file):
  // list it through the link directly.
  const Result one = sh("cd / && h5ls " + shell_quote((t / "memsnap.h5").string()) + "/rank/1/batch/4");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_NE(one.out.find("events"), std::string::npos) << one.out;
  const Result ev = sh("cd / && h5dump -H -d /rank/1/batch/4/events " + shell_quote((t / "memsnap.h5").string()));
  ASSERT_EQ(ev.rc, 0) << ev.err;
  EXPECT_NE(ev.out.find("\"time_ns\""), std::string::npos) << ev.out;
  EXPECT_NE(ev.out.find("\"free_completed\""), std::string::npos) << ev.out;
  const Result d = sh("h5dump -a /format " + shell_quote((t / "memsnap.h5").string()));
  EXPECT_NE(d.out.find("\"memsnap\""), std::string::npos) << d.out;
}

TEST(StoreTest, RootFileSurvivesABadRankFile) {
  TempDir t;
  make_clean_run(t.path(), 3);
  ASSERT_EQ(aggregate(1, t.path()).rc, 0);
  test::write_file(t / "memsnap.h5.d" / "rank1.h5", "garbage");
  StoreReader store(t / "memsnap.h5");
  EXPECT_EQ(store.info().world_size, 3);
  EXPECT_EQ(store.summary().size(), 6u);
  EXPECT_EQ(store.read_rank(2).windows.size(), 2u);
  try {
    store.read_rank(1);
    FAIL() << "read_rank(1) should fail";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("memsnap.h5.d/rank1.h5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(info_cmd(t / "memsnap.h5").rc, 0);
}

// Every store memsnap wrote names a rank's host "hostname" (the field tables say "host"): a rank
// group that says "host" reads too.
TEST(StoreTest, RankHostReadsUnderEitherName) {
  TempDir t;
  const auto want = make_clean_run(t.path(), 2);
  ASSERT_EQ(aggregate(0, t.path()).rc, 0);
  ASSERT_FALSE(want[1].meta.host.empty());
  const hid_t f = H5Fopen((t / "memsnap.h5.d" / "rank1.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_GE(H5Arename(f, "hostname", "host"), 0);
  H5Fclose(f);
  StoreReader store(t / "memsnap.h5");
  EXPECT_EQ(store.read_rank(0).meta.host, want[0].meta.host);
  EXPECT_EQ(store.read_rank(1).meta.host, want[1].meta.host);
}

TEST(StoreTest, ReaderRejectsWhatIsNotAStore) {
  TempDir t;
  test::write_file(t / "x.h5", "not hdf5");
  EXPECT_THROW(StoreReader(t / "x.h5"), StoreError);
  EXPECT_THROW(StoreReader(t / "none.h5"), StoreError);
  const Result r = info_cmd(t / "x.h5");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("memsnap info: "), std::string::npos);
  EXPECT_NE(r.err.find("not an HDF5 file"), std::string::npos) << r.err;
}

TEST(StoreTest, HumanBytes) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(80ULL << 30), "80.0 GiB");
  EXPECT_EQ(human_bytes(300ULL << 20), "300 MiB");
}

}  // namespace
}  // namespace memsnap
