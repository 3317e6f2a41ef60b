// memsnap diff on real runs: pairs of the demo workload (fsdp_sim) recorded under a real mpirun
// by `memsnap run`, compared by the real binary; diff.json, the printed lines, the exit code and
// the pages in a real headless Chromium. Each run is recorded once for the whole suite.
#include <gtest/gtest.h>

#include <unistd.h>

#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr std::int64_t MiB = 1024 * 1024;

const std::string kSetup = "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1";

// Runs of fsdp_sim by name, recorded once: 4 ranks, 8 batches, two windows (2-4, 5-7), native stacks.
class Runs {
 public:
  static Runs& get() {
    static Runs runs;
    return runs;
  }
  fs::path run(const std::string& name, const std::string& args) {
    auto it = m_done.find(name);
    if (it != m_done.end()) return it->second;
    const fs::path dir = m_dir / name;
    test::write_file(m_dir / "memsnap.yaml", "run_name: t\nskip_batches: 1\ninterval: 3\nrepeat: 1\nstacks: native\n");
    const auto r = test::run_shell("MEMSNAP_FOLDER=" + dir.string() + " " + MEMSNAP_MPIRUN + " -np 4 " + MEMSNAP_CLI +
                                       " run --config " + (m_dir / "memsnap.yaml").string() + " -- " + MEMSNAP_FSDP_SIM +
                                       " --step-us 0 --batches 8 --layers 2 --hidden 512 " + args,
                                   kSetup);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(dir / "memsnap.h5")) << r.out;
    m_done[name] = dir;
    return dir;
  }
  const test::TempDir& tmp() const { return m_dir; }

 private:
  test::TempDir m_dir;
  std::map<std::string, fs::path> m_done;
};

fs::path leak_run() { return Runs::get().run("leak", "--leak-rank 3 --leak-mib 16"); }
fs::path clean_run() { return Runs::get().run("clean", ""); }
fs::path clean_again() { return Runs::get().run("clean2", ""); }
fs::path unsharded_run() { return Runs::get().run("unsharded", "--unsharded-rank 0"); }
fs::path long_seq_run() { return Runs::get().run("seq2048", "--seq 2048"); }

struct Diff {
  int code = -1;
  std::string out;
  json data;
  fs::path dir;
};

Diff diff(const std::string& args, const std::string& name) {
  Diff d;
  d.dir = Runs::get().tmp() / ("diff-" + name);
  const auto r = test::run_shell(std::string(MEMSNAP_CLI) + " diff " + args + " -o " + d.dir.string() + " --overwrite", kSetup);
  d.code = r.code;
  d.out = r.out;
  if (fs::exists(d.dir / "diff.json")) d.data = json::parse(test::read_file(d.dir / "diff.json"));
  return d;
}

const json& rank_of(const Diff& d, int rank) {
  for (const auto& r : d.data["ranks"])
    if (r["rank"] == rank) return r;
  static const json none;
  ADD_FAILURE() << "no rank " << rank;
  return none;
}
std::int64_t delta(const json& pair) { return pair[1].get<std::int64_t>() - pair[0].get<std::int64_t>(); }

std::vector<json> sites_beyond_noise(const Diff& d) {
  std::vector<json> out;
  for (const auto& s : d.data["sites"])
    if (s["beyond_noise"] == true) out.push_back(s);
  return out;
}

TEST(DiffTest, LeakFixedNamesTheLeakSiteAndRank3AndNothingElse) {
  const Diff d = diff(leak_run().string() + " " + clean_run().string(), "leak-fixed");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(d.data["ranks_changed"], 1) << d.out;
  const json& r3 = rank_of(d, 3);
  EXPECT_TRUE(r3["changed"].get<bool>());
  EXPECT_EQ(delta(r3["peak_allocated"]), -6 * 16 * MiB) << "the leak kept 16 MiB a batch, 6 batches by the last peak";
  EXPECT_EQ(delta(r3["live_at_close"]), -7 * 16 * MiB) << "and 7 batches by the end";
  EXPECT_EQ(r3["page"], "rank3.html");
  for (int r : {0, 1, 2}) EXPECT_FALSE(rank_of(d, r)["changed"].get<bool>()) << "rank " << r;
  const auto sites = sites_beyond_noise(d);
  ASSERT_EQ(sites.size(), 1u) << d.data["sites"].dump(1);
  EXPECT_NE(sites[0]["key"].get<std::string>().find("cache_batch_metrics"), std::string::npos);
  EXPECT_EQ(sites[0]["bytes"][1], 0) << "the leak's site is gone";
  EXPECT_EQ(sites[0]["top_rank"], 3);
  ASSERT_EQ(d.data["findings"].size(), 1u) << d.data["findings"].dump(1);
  EXPECT_EQ(d.data["findings"][0]["state"], "resolved");
  EXPECT_EQ(d.data["findings"][0]["base"]["kind"], "leak");
  EXPECT_EQ(d.data["findings"][0]["base"]["rank"], 3);
  EXPECT_NE(d.out.find("finding resolved: leak on rank 3"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("site shrank: FsdpSim::cache_batch_metrics()"), std::string::npos) << d.out;
  EXPECT_EQ(d.out.find("site grew"), std::string::npos) << d.out;
  EXPECT_TRUE(fs::exists(d.dir / "rank3.html"));
  EXPECT_FALSE(fs::exists(d.dir / "rank0.html"));
  // The differential flame graph's tree: the leak's path shrank by its bytes, the rest did not.
  const json& stacks = r3["stacks"];
  EXPECT_EQ(stacks["delta"], -6 * 16 * MiB);
  std::function<const json*(const json&)> leak_leaf = [&](const json& n) -> const json* {
    if (n.value("name", "").find("cache_batch_metrics") != std::string::npos) return &n;
    if (n.contains("children"))
      for (const auto& c : n["children"])
        if (const json* f = leak_leaf(c)) return f;
    return nullptr;
  };
  const json* leaf = leak_leaf(stacks);
  ASSERT_NE(leaf, nullptr) << stacks.dump(1);
  EXPECT_EQ((*leaf)["delta"], -6 * 16 * MiB);
  EXPECT_FALSE(rank_of(d, 0).contains("stacks")) << "stacks only for the ranks that changed";
}

TEST(DiffTest, SameLoopTwiceIsNoChangeBeyondNoise) {
  const Diff d = diff(clean_run().string() + " " + clean_again().string(), "same");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(d.data["no_change"].get<bool>()) << d.out;
  EXPECT_EQ(d.data["ranks_changed"], 0);
  EXPECT_TRUE(sites_beyond_noise(d).empty());
  EXPECT_TRUE(d.data["findings"].empty());
  EXPECT_NE(d.out.find("memsnap diff: no change in memory beyond noise"), std::string::npos) << d.out;
  EXPECT_GE(d.data["noise"]["threshold"].get<std::int64_t>(), MiB) << "the page says the noise level it used";
  EXPECT_TRUE(fs::exists(d.dir / "index.html"));
  for (const auto& e : fs::directory_iterator(d.dir)) EXPECT_NE(e.path().filename().string().substr(0, 4), "rank");
}

TEST(DiffTest, UnshardedRankFixedFallsToTheOtherRanksPersistent) {
  const Diff d = diff(unsharded_run().string() + " " + clean_run().string(), "unsharded-fixed");
  ASSERT_EQ(d.code, 0) << d.out;
  const json& r0 = rank_of(d, 0);
  const json& r1 = rank_of(d, 1);
  EXPECT_GT(r0["persistent"][0].get<std::int64_t>(), r1["persistent"][0].get<std::int64_t>());
  EXPECT_EQ(r0["persistent"][1], r1["persistent"][1]) << "rank 0 now holds what the others hold";
  EXPECT_LT(delta(r0["persistent"]), 0);
  EXPECT_TRUE(r0["changed"].get<bool>());
  EXPECT_EQ(d.data["ranks_changed"], 1) << d.out;
  bool resolved = false;
  for (const auto& f : d.data["findings"]) {
    EXPECT_NE(f["state"], "new") << f.dump();
    resolved |= f["state"] == "resolved" && f["base"]["kind"] == "shard_imbalance" && f["base"]["rank"] == 0;
  }
  EXPECT_TRUE(resolved) << d.data["findings"].dump(1);
}

TEST(DiffTest, LongerSequenceGrowsActivationsTwiceAndLeavesParametersAndOptimizer) {
  const Diff d = diff(clean_run().string() + " " + long_seq_run().string(), "seq-x2");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(d.data["ranks_changed"], 4) << d.out;
  const json& cats = d.data["categories"];
  const double ratio = cats["activations"][1].get<double>() / cats["activations"][0].get<double>();
  EXPECT_NEAR(ratio, 2.0, 0.2) << cats.dump();
  EXPECT_EQ(delta(cats["parameters"]), 0);
  EXPECT_EQ(delta(cats["optimizer_state"]), 0);
  EXPECT_EQ(delta(cats["gradients"]), 0);
  for (const auto& s : sites_beyond_noise(d)) EXPECT_EQ(s["category"], "activations") << s.dump();
  EXPECT_NE(d.out.find("site grew: FsdpSim::forward_activations"), std::string::npos) << d.out;
}

TEST(DiffTest, FailOnGrowthExitsThreeNamingTheRankAndTheSite) {
  const Diff d = diff(clean_run().string() + " " + leak_run().string() + " --fail-on-growth 0.1", "gate");
  EXPECT_EQ(d.code, 3) << d.out;
  EXPECT_NE(d.out.find("memsnap diff: rank 3's peak allocated grew"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("most at FsdpSim::cache_batch_metrics() (fsdp_sim.cpp:206)"), std::string::npos) << d.out;
  EXPECT_TRUE(d.data["fail_on_growth"]["failed"].get<bool>());
  // Growth under the gate, and the same loop twice, pass.
  EXPECT_EQ(diff(clean_run().string() + " " + leak_run().string() + " --fail-on-growth 5", "gate-high").code, 0);
  EXPECT_EQ(diff(clean_run().string() + " " + clean_again().string() + " --fail-on-growth 0", "gate-same").code, 0);
}

TEST(DiffTest, TwoWindowsOfOneRun) {
  const fs::path store = leak_run() / "memsnap.h5";
  const Diff d = diff(store.string() + " --rank 3 --batch 4 " + store.string() + " --rank 3 --batch 7", "windows");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(d.data["windows_mode"].get<bool>());
  ASSERT_EQ(d.data["ranks"].size(), 1u);
  EXPECT_EQ(delta(d.data["ranks"][0]["peak_allocated"]), 3 * 16 * MiB) << "three more batches' leak";
  const Diff same = diff(store.string() + " --rank 0 --batch 4 " + store.string() + " --rank 0 --batch 7", "windows-same");
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_TRUE(same.data["no_change"].get<bool>()) << same.out;
  const Diff bad = diff(store.string() + " --rank 0 --batch 5 " + store.string(), "windows-bad");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("rank 0 has no window closing at batch 5 (its windows: 4, 7)"), std::string::npos) << bad.out;
}

TEST(DiffTest, OutputFolderReplacesOnlyAnEarlierDiff) {
  const fs::path dir = Runs::get().tmp() / "guard";
  fs::create_directories(dir);
  test::write_file(dir / "notes.txt", "mine");
  const std::string args = " diff " + clean_run().string() + " " + clean_again().string() + " -o " + dir.string();
  auto r = test::run_shell(MEMSNAP_CLI + args + " --overwrite", kSetup);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("holds files that memsnap diff did not write"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "index.html"));
  EXPECT_EQ(test::read_file(dir / "notes.txt"), "mine");
  fs::remove(dir / "notes.txt");
  r = test::run_shell(MEMSNAP_CLI + args, kSetup);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / ".memsnap-diff"));
  r = test::run_shell(MEMSNAP_CLI + args, kSetup);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("already holds a memsnap diff; pass --overwrite"), std::string::npos) << r.out;
  // A leak diff's rank page, then a diff without one: the stale page goes.
  r = test::run_shell(std::string(MEMSNAP_CLI) + " diff " + leak_run().string() + " " + clean_run().string() + " -o " + dir.string() + " --overwrite", kSetup);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "rank3.html"));
  r = test::run_shell(MEMSNAP_CLI + args + " --overwrite", kSetup);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir / "rank3.html"));
  EXPECT_FALSE(fs::exists(dir / ".memsnap-diff.partial"));
}

TEST(DiffTest, BadInputIsOneLineNamingIt) {
  auto r = test::run_shell(std::string(MEMSNAP_CLI) + " diff /nonexistent/x " + clean_run().string() + " -o " +
                               (Runs::get().tmp() / "bad").string(), kSetup);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("memsnap diff: /nonexistent/x: no such file or folder"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(Runs::get().tmp() / "bad"));
  r = test::run_shell(std::string(MEMSNAP_CLI) + " diff " + clean_run().string(), kSetup);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("give two sides, BASE and NEW (got 1)"), std::string::npos) << r.out;
}

// --- real torch pairs (tests/data/torch-diff, recorded on an H100; see its MANIFEST.json) ---------

const json& manifest() {
  static const json m = json::parse(test::read_file(fs::path(MEMSNAP_TEST_DATA) / "torch-diff" / "MANIFEST.json"));
  return m;
}

// memsnap diff of a pair's two sets of pickles (imported on the fly).
Diff torch_pair(const std::string& pair) {
  const fs::path dir = fs::path(MEMSNAP_TEST_DATA) / "torch-diff" / pair;
  return diff((dir / "base").string() + " " + (dir / "new").string(), "torch-" + pair);
}

std::vector<int> changed_ranks(const Diff& d) {
  std::vector<int> out;
  for (const auto& r : d.data["ranks"])
    if (r["changed"].get<bool>()) out.push_back(r["rank"]);
  return out;
}

// The rank's site named "function (...file:line)", or null.
json site_on(const json& rank, const std::string& function, int line) {
  for (const auto& s : rank["sites"]) {
    const std::string name = s["new_name"].get<std::string>().empty() ? s["base_name"] : s["new_name"];
    if (name.rfind(function + " (", 0) == 0 && name.size() > 4 &&
        name.find("diff_loops.py:" + std::to_string(line) + ")") != std::string::npos)
      return s;
  }
  return nullptr;
}

// What every pair must say: the manifest's changed ranks and no other, each rank's peak moved by
// what the trace replay of the manifest says (to the byte where `exact`, else within 1 % + 1 MiB:
// the manifest notes 917504 bytes of block rounding in batch_doubled), the
// findings resolved and new as the manifest says, and every site it names with a line.
void check_pair(const std::string& pair, const Diff& d, bool exact) {
  const json& m = manifest()["pairs"][pair];
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(changed_ranks(d), m["ranks_changed"].get<std::vector<int>>()) << d.out;
  for (int r = 0; r < 4; ++r) {
    const std::int64_t want = m["from_pickles"]["new"][r]["peak_allocated"].get<std::int64_t>() -
                              m["from_pickles"]["base"][r]["peak_allocated"].get<std::int64_t>();
    const std::int64_t got = delta(rank_of(d, r)["peak_allocated"]);
    if (exact) {
      EXPECT_EQ(got, want) << pair << " rank " << r;
    } else {
      EXPECT_NEAR(static_cast<double>(got), static_cast<double>(want), std::abs(want) * 0.01 + MiB) << pair << " rank " << r;
    }
  }
  int resolved = 0, added = 0;
  for (const auto& f : d.data["findings"]) resolved += f["state"] == "resolved", added += f["state"] == "new";
  EXPECT_EQ(added, 0) << pair << ": " << d.data["findings"].dump(1);
  EXPECT_EQ(resolved, m["findings"]["base"] == "none" ? 0 : 1) << pair << ": " << d.data["findings"].dump(1);
}

TEST(DiffTorchTest, LeakFixed) {
  const Diff d = torch_pair("leak_fixed");
  ASSERT_NO_FATAL_FAILURE(check_pair("leak_fixed", d, true));
  const json& site = manifest()["pairs"]["leak_fixed"]["sites"][0];
  const auto named = sites_beyond_noise(d);
  ASSERT_EQ(named.size(), 1u) << "nothing else: " << d.data["sites"].dump(1);
  const json s = site_on(rank_of(d, 1), site["function"], site["line"]);
  ASSERT_FALSE(s.is_null()) << rank_of(d, 1)["sites"].dump(1);
  EXPECT_EQ(s["bytes"][0], site["base_bytes_at_peak"]);
  EXPECT_EQ(s["bytes"][1], 0) << "the leak's site and its bytes are gone";
  EXPECT_EQ(named[0]["key"], s["key"]);
  EXPECT_EQ(delta(rank_of(d, 1)["persistent"]), -manifest()["pairs"]["leak_fixed"]["planted_bytes"]["at_batch_start"][1].get<std::int64_t>());
  EXPECT_EQ(d.data["findings"][0]["base"]["kind"], "leak");
  EXPECT_EQ(d.data["findings"][0]["base"]["rank"], 1);
}

TEST(DiffTorchTest, SameLoopTwice) {
  const Diff d = torch_pair("same_twice");
  ASSERT_NO_FATAL_FAILURE(check_pair("same_twice", d, true));
  EXPECT_TRUE(d.data["no_change"].get<bool>()) << d.out;
  EXPECT_NE(d.out.find("no change in memory beyond noise"), std::string::npos) << d.out;
  EXPECT_TRUE(sites_beyond_noise(d).empty());
}

TEST(DiffTorchTest, UnshardedRankFixed) {
  const Diff d = torch_pair("unsharded_fixed");
  ASSERT_NO_FATAL_FAILURE(check_pair("unsharded_fixed", d, true));
  const json& m = manifest()["pairs"]["unsharded_fixed"];
  const json& r2 = rank_of(d, 2);
  EXPECT_EQ(delta(r2["persistent"]), -m["planted_bytes"]["persistent_extra"].get<std::int64_t>());
  EXPECT_EQ(r2["persistent"][1], rank_of(d, 0)["persistent"][1]) << "its persistent memory falls to the other ranks'";
  std::size_t named_on_rank2 = 0;
  for (const auto& s : r2["sites"]) named_on_rank2 += s["beyond_noise"].get<bool>();
  EXPECT_EQ(named_on_rank2, m["sites"].size()) << "nothing beyond the manifest's sites: " << r2["sites"].dump(1);
  for (const auto& want : m["sites"]) {
    const json s = site_on(r2, want["function"], want["line"]);
    ASSERT_FALSE(s.is_null()) << want.dump();
    const std::int64_t base = want.contains("base_bytes") ? want["base_bytes"] : want["base_bytes_at_peak"];
    const std::int64_t now = want.contains("new_bytes") ? want["new_bytes"] : want["new_bytes_at_peak"];
    EXPECT_EQ(delta(s["bytes"]), now - base) << want.dump() << "\n" << s.dump();
    EXPECT_TRUE(s["beyond_noise"].get<bool>()) << s.dump();
  }
  EXPECT_EQ(d.data["findings"][0]["base"]["kind"], "shard_imbalance");
  EXPECT_EQ(d.data["findings"][0]["base"]["rank"], 2);
}

TEST(DiffTorchTest, BatchDoubled) {
  const Diff d = torch_pair("batch_doubled");
  ASSERT_NO_FATAL_FAILURE(check_pair("batch_doubled", d, false));
  const json& cats = d.data["categories"];
  EXPECT_EQ(delta(cats["optimizer_state"]), 0) << "optimizer state unchanged";
  EXPECT_EQ(delta(cats["parameters"]), 0);
  EXPECT_GT(delta(cats["activations"]), 0);
  EXPECT_GT(delta(cats["gradients"]), 0) << "activation gradients scale with the batch";
  for (const auto& s : sites_beyond_noise(d)) {
    EXPECT_GT(delta(s["bytes"]), 0) << s.dump();
    EXPECT_TRUE(s["category"] == "activations" || s["category"] == "gradients") << s.dump();
  }
  EXPECT_FALSE(site_on(rank_of(d, 0), "step", 116).is_null());
  EXPECT_TRUE(site_on(rank_of(d, 0), "step", 116)["beyond_noise"].get<bool>());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(delta(rank_of(d, r)["persistent"]), 0) << "parameters and momentum kept";
}

TEST(DiffTorchTest, CheckpointingTurnedOn) {
  const Diff d = torch_pair("checkpointing");
  ASSERT_NO_FATAL_FAILURE(check_pair("checkpointing", d, false));
  const json& cats = d.data["categories"];
  EXPECT_LT(delta(cats["activations"]), 0);
  EXPECT_EQ(delta(cats["optimizer_state"]), 0);
  const json s = site_on(rank_of(d, 0), "step", 94);
  ASSERT_FALSE(s.is_null());
  EXPECT_LT(delta(s["bytes"]), 0) << "the forward's activations shrink at the peak";
  for (int r = 0; r < 4; ++r) EXPECT_EQ(delta(rank_of(d, r)["persistent"]), 0);
}

TEST(DiffTorchTest, PicklesImportedOnTheFlyLeaveNothingBehind) {
  const auto before = test::run_shell("ls -d " + fs::temp_directory_path().string() + "/memsnap-diff-* 2>/dev/null | wc -l");
  const Diff d = torch_pair("same_twice");
  ASSERT_EQ(d.code, 0) << d.out;
  const auto after = test::run_shell("ls -d " + fs::temp_directory_path().string() + "/memsnap-diff-* 2>/dev/null | wc -l");
  EXPECT_EQ(before.out, after.out) << "the temporary stores are removed";
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const auto r = test::run_shell(std::string("command -v ") + name);
    if (r.code == 0 && !r.out.empty()) return r.out.substr(0, r.out.find('\n'));
  }
  return "";
}

// Loads a page in headless Chromium with the network off; returns the DOM after its scripts ran.
std::string load_page(const fs::path& page) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    ADD_FAILURE() << "Chromium is required (Debian's 'chromium')";
    return "";
  }
  const fs::path profile = Runs::get().tmp() / ".chromium";
  const auto r = test::run_shell("timeout 120 " + chromium +
                                 " --headless=new --no-sandbox --disable-gpu --no-first-run --no-default-browser-check"
                                 " --proxy-server=127.0.0.1:9 --proxy-bypass-list='<-loopback>' --user-data-dir=" +
                                 profile.string() + " --virtual-time-budget=10000 --window-size=1400,1000 --dump-dom file://" +
                                 page.string() + " 2>/dev/null");
  return r.out;
}

TEST(DiffTest, PagesDrawInHeadlessChromiumWithoutNetwork) {
  const Diff d = diff(leak_run().string() + " " + clean_run().string(), "pages");
  ASSERT_EQ(d.code, 0) << d.out;
  const std::string index = load_page(d.dir / "index.html");
  EXPECT_NE(index.find("data-ready=\"1\""), std::string::npos) << index.substr(0, 2000);
  EXPECT_EQ(index.find("data-error="), std::string::npos) << index.substr(0, 4000);
  EXPECT_NE(index.find("data-changed=\"1\""), std::string::npos);
  EXPECT_NE(index.find("data-state=\"resolved\""), std::string::npos) << "the findings table shows the resolved leak";
  EXPECT_NE(index.find("cache_batch_metrics"), std::string::npos);
  EXPECT_NE(index.find("href=\"rank3.html\""), std::string::npos);
  const std::string rank = load_page(d.dir / "rank3.html");
  EXPECT_NE(rank.find("data-ready=\"1\""), std::string::npos) << rank.substr(0, 2000);
  EXPECT_EQ(rank.find("data-error="), std::string::npos) << rank.substr(0, 4000);
  EXPECT_NE(rank.find("data-batches=\"6\""), std::string::npos) << "both windows' batches, aligned";
  EXPECT_NE(rank.find("data-flame=\"1\""), std::string::npos) << "the differential flame graph is drawn";
  // Self-contained: nothing is loaded from anywhere.
  const std::string html = test::read_file(d.dir / "index.html");
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_NE(html.find("Content-Security-Policy"), std::string::npos);
}

}  // namespace
}  // namespace memsnap
