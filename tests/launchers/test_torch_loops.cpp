// Real PyTorch snapshots without step marks, as users bring them: memsnap import, then memsnap
// report, must name every planted cause with its kind and rank, its site in the loop's own
// code, and flag no clean rank. The pickles come from tests/gpu/torch_loops.py (torch 2.11 on an
// H200); each loop's manifest.json holds the planted truth.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace memsnap {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kMemsnap = MEMSNAP_CLI;
const fs::path kLoops = fs::path(MEMSNAP_TEST_DATA) / "torch-loops";

using Result = test::ShellResult;

Result sh(const std::string& cmd) {
  return test::run_shell(cmd, "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
}

json read_json(const fs::path& p) { return json::parse(test::read_file(p)); }

std::string pickles(const fs::path& dir, const std::vector<int>& ranks = {}) {
  std::string out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".pickle") continue;
    if (!ranks.empty()) {
      bool wanted = false;
      for (int r : ranks) wanted |= name.rfind("rank" + std::to_string(r) + ".", 0) == 0;
      if (!wanted) continue;
    }
    out += " " + e.path().string();
  }
  return out;
}

// Imports and reports; returns summary.json and the store's info JSON.
std::pair<json, json> import_and_report(const test::TempDir& dir, const std::string& files, const std::string& args) {
  const auto store = (dir / "s.h5").string();
  auto r = sh(kMemsnap + " import" + files + " " + args + " -o " + store);
  EXPECT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " report " + store + " -o " + (dir / "report").string());
  EXPECT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " info " + store + " --json");
  EXPECT_EQ(r.code, 0) << r.out;
  return {read_json(dir / "report/summary.json"), json::parse(r.out)};
}

const char* kind_of(const std::string& role) {
  if (role == "leak") return "leak";
  if (role == "spike") return "spike";
  if (role == "unsharded") return "shard_imbalance";
  if (role == "oom") return "oom";
  return "";
}

// A rank's planted causes: "leak", "spike", "leak+spike", "clean".
std::vector<std::string> kinds_of(const std::string& roles) {
  std::vector<std::string> out;
  std::stringstream in(roles);
  for (std::string role; std::getline(in, role, '+');) {
    if (*kind_of(role)) out.push_back(kind_of(role));
  }
  return out;
}

// Loops whose leak keeps one tensor of the same size every batch: the finding's bytes are what
// one batch keeps (kept_bytes over the batches run). Not cnn_accum (one per micro-batch),
// gan_two_opt (every other batch), lm_autocast (a new length every batch), mlp_sgd (a retained
// graph, which kept_bytes does not count) or amp_cat_metrics (one regrown tensor).
const std::set<std::string> kFixedLeak = {"gpt_adamw", "fsdp2_ring", "lstm_sgd", "vit_adam", "lm_everyrank",
                                          "resnet_eval", "mlp_slow_leak", "compiled_lm", "diffusion_ema"};

struct Case {
  std::string loop;
  bool known_interval;  // --interval given, as from the job's config
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.loop << (c.known_interval ? " --interval" : ""); }
std::string case_name(const testing::TestParamInfo<Case>& c) {
  return c.param.loop + (c.param.known_interval ? "_with_interval" : "_interval_unknown");
}

class TorchLoop : public testing::TestWithParam<Case> {};

TEST_P(TorchLoop, NamesEveryPlantedCauseAndNoCleanRank) {
  const Case c = GetParam();
  const fs::path data = kLoops / c.loop;
  const json manifest = read_json(data / "manifest.json");
  test::TempDir dir;
  const std::string args = c.known_interval ? "--interval " + std::to_string(manifest["interval"].get<int>()) : "";
  const auto [summary, info] = import_and_report(dir, pickles(data), args);

  // Every window found its batches from the trace itself, with a method and a confidence; where
  // torch.optim's steps anchor them, the window's first batch is the configured one.
  for (const auto& r : info["ranks"]) {
    for (const auto& w : r["windows"]) {
      if (w["batch_method"] == "recurring_annotation" && c.loop != "fsdp2_ring") {  // the ring starts mid-batch
        EXPECT_EQ(w["batch_start"], manifest["skip_batches"]) << "rank " << r["rank"] << ": " << w.dump();
      }
      EXPECT_NE(w["batch_method"], "none") << "rank " << r["rank"];
      EXPECT_NE(w["batch_method"], "recorded") << "rank " << r["rank"] << ": these traces have no step marks";
      EXPECT_GT(w["batch_confidence"].get<double>(), 0.3) << "rank " << r["rank"];
    }
  }

  std::set<std::pair<std::string, int>> expected, found;
  std::size_t planted = 0;
  for (const auto& t : manifest["ranks"]) {
    for (const auto& kind : kinds_of(t["role"])) expected.emplace(kind, t["rank"].get<int>());
    planted += kinds_of(t["role"]).size();
  }
  ASSERT_EQ(expected.size(), planted);
  for (const auto& f : summary["findings"]) {
    found.emplace(f["kind"], f["rank"].get<int>());
    const std::string kind = f["kind"];
    const std::string site = f["site"].is_string() ? f["site"].get<std::string>() : "";
    // The site is the line of the training loop that allocated the memory.
    EXPECT_NE(site.find("torch_loops.py"), std::string::npos) << kind << " rank " << f["rank"] << ": " << f.dump();
    if (kind == "spike") {
      // Where memsnap says it found another number of batches than expected, the batch it names
      // may be one off; otherwise it is the planted one.
      const bool admitted = f["detail"].get<std::string>().find("were expected") != std::string::npos;
      const auto off = std::llabs(f["batch"].get<long long>() - manifest["spike_batch"].get<long long>());
      EXPECT_LE(off, admitted ? 1 : 0) << f.dump();
    }
    if (kind == "oom") {
      // A caught OOM: its batch, what it asked for, what was allocated then, and the job went on.
      EXPECT_EQ(f["batch"], manifest["ranks"][f["rank"].get<int>()]["oom_batch"]) << f.dump();
      EXPECT_GT(f["bytes"].get<double>(), 0) << f.dump();
      EXPECT_GT(f["live"].get<double>(), 0) << f.dump();
      EXPECT_TRUE(f["went_on"].get<bool>()) << f.dump();
    }
    if (kind == "leak" || kind == "spike") {
      EXPECT_TRUE(f["batches_inferred"].get<bool>()) << f.dump();
      EXPECT_NE(f["detail"].get<std::string>().find("inferred"), std::string::npos) << f.dump();
    }
  }
  EXPECT_EQ(found, expected) << summary["findings"].dump(1);
  // Every outlier rank is explained by one of its findings (none is "unexplained" here).
  for (const auto& r : summary["imbalance"]["outlier_ranks"]) {
    const auto& causes = summary["imbalance"]["outlier_causes"][std::to_string(r.get<int>())];
    EXPECT_FALSE(causes.empty()) << "outlier rank " << r << ": " << summary["imbalance"].dump();
    for (const auto& k : causes) EXPECT_NE(k, "unexplained") << "outlier rank " << r << ": " << summary["findings"].dump(1);
  }
  for (const auto& t : manifest["ranks"]) {
    if (!kFixedLeak.count(c.loop) || !t.contains("kept_bytes")) continue;
    const double per_batch = t["kept_bytes"].get<double>() / (manifest["skip_batches"].get<double>() + manifest["interval"].get<double>());
    for (const auto& f : summary["findings"]) {
      if (f["kind"] == "leak" && f["rank"] == t["rank"]) {
        EXPECT_NEAR(f["bytes"].get<double>(), per_batch, 0.1 * per_batch) << f.dump();
      }
    }
  }
  for (const auto& t : manifest["ranks"]) {
    if (t["role"] == "unsharded") {  // the planted copy, to within 10 %
      for (const auto& f : summary["findings"]) {
        if (f["kind"] == "shard_imbalance" && f["rank"] == t["rank"]) {
          EXPECT_NEAR(f["bytes"].get<double>(), t["planted_bytes"].get<double>(), 0.1 * t["planted_bytes"].get<double>());
        }
      }
    }
  }
}

// The rank page says, next to its batch marks, that they were inferred and how; the cross page
// lists the findings. Real Chromium on the real pages.
TEST(TorchLoopPages, RankPageShowsHowBatchesWereFound) {
  test::TempDir dir;
  const auto [summary, info] = import_and_report(dir, pickles(kLoops / "mlp_sgd"), "");
  fs::path page;
  for (const auto& e : fs::directory_iterator(dir / "report")) {
    if (e.path().filename().string().rfind("rank5.", 0) == 0 && e.path().extension() == ".html") page = e.path();
  }
  ASSERT_FALSE(page.empty());
  const auto dom = sh("chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=10000 --dump-dom file://" + page.string());
  ASSERT_EQ(dom.code, 0) << "chromium is needed for this test (ci/setup.sh installs it): " << dom.out;
  EXPECT_NE(dom.out.find("data-ready=\"1\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_EQ(dom.out.find("data-error=\""), std::string::npos) << "a script error on the page";
  EXPECT_NE(dom.out.find("data-batch-method=\"recurring_frame\""), std::string::npos);
  EXPECT_NE(dom.out.find("batches inferred from a recurring frame"), std::string::npos);
  EXPECT_NE(dom.out.find("batch start (inferred: recurring_frame"), std::string::npos);
  const auto index = sh("chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=10000 --dump-dom file://" +
                        (dir / "report/index.html").string());
  ASSERT_EQ(index.code, 0) << index.out;
  for (const char* text : {"leak", "spike", "inferred"}) EXPECT_NE(index.out.find(text), std::string::npos) << text;
}

// The batch count from the job's own training YAML (Composer's callbacks: memory_snapshot:):
// gradient accumulation's micro-batches are then grouped into batches on every rank.
TEST(TorchLoopConfig, TheTrainingConfigsIntervalGroupsMicroBatches) {
  test::TempDir dir;
  test::write_file(dir / "train.yaml", "callbacks:\n  memory_snapshot:\n    skip_batches: 2\n    interval: 4\n");
  const auto [summary, info] = import_and_report(dir, pickles(kLoops / "cnn_accum"), "--config " + (dir / "train.yaml").string());
  for (const auto& r : info["ranks"]) {
    ASSERT_EQ(r["windows"].size(), 1u);
    EXPECT_EQ(r["windows"][0]["batch_start"], 2) << r.dump();
  }
  const auto bad = sh(kMemsnap + " import" + pickles(kLoops / "cnn_accum") + " --config /nonexistent.yaml -o " + (dir / "b.h5").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_FALSE(fs::exists(dir / "b.h5"));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* loop : {"mlp_sgd", "gpt_adamw", "fsdp2_ring", "cnn_accum", "lm_autocast", "lstm_sgd", "vit_adam",
                           "lm_everyrank", "resnet_eval", "gan_two_opt", "mlp_slow_leak", "compiled_lm",
                           "amp_cat_metrics", "diffusion_ema", "gru_seq2seq", "everyrank_cat", "oom_caught", "spike16"}) {
    out.push_back({loop, true});
    out.push_back({loop, false});
  }
  return out;
}

// Held out, run once after the rules: a mixture of experts whose experts get a different share of
// tokens every batch, so Adam's state appears whenever an expert first gets a gradient and each
// rank holds a different amount of it. The leak and the spike are found and no clean rank leaks.
// Known: rank 1, whose experts all had their state before the window, holds 17 MiB more Adam
// state at every boundary than the median rank and is named for it (shard_imbalance).
TEST(TorchLoopHeldOut, AMixtureOfExpertsLeakAndSpikeAndNoFalseLeak) {
  for (const std::string args : {"", "--interval 3"}) {
    test::TempDir dir;
    const auto [summary, info] = import_and_report(dir, pickles(kLoops / "moe_routing"), args);
    std::set<std::pair<std::string, int>> found;
    for (const auto& f : summary["findings"]) found.emplace(f["kind"], f["rank"].get<int>());
    EXPECT_TRUE(found.count({"leak", 2})) << summary["findings"].dump(1);
    EXPECT_TRUE(found.count({"spike", 0})) << summary["findings"].dump(1);
    for (int r : {0, 1, 3}) EXPECT_FALSE(found.count({"leak", r})) << r << ": " << summary["findings"].dump(1);
    for (const auto& f : summary["findings"]) {
      if (f["kind"] == "spike") {
        EXPECT_EQ(f["batch"], 2) << f.dump();
      }
    }
  }
}

// Held out: recorded with context=None, so no allocation has a frame. What a rank keeps is
// still found (grouped by size), the spike too, and no clean rank is named; sites are "<no stack>".
TEST(TorchLoopHeldOut, WithoutAnyFramesTheLeakAndTheSpikeAreStillFound) {
  for (const std::string args : {"", "--interval 4"}) {
    test::TempDir dir;
    const auto [summary, info] = import_and_report(dir, pickles(kLoops / "stackless_mlp"), args);
    ASSERT_EQ(summary["findings"].size(), 2u) << summary["findings"].dump(1);
    for (const auto& f : summary["findings"]) {
      EXPECT_EQ(f["site"], "<no stack>");
      if (f["kind"] == "leak") {
        EXPECT_EQ(f["rank"], 0);
        EXPECT_EQ(f["bytes"], 256 * 2048 * 4) << "one batch's reconstruction";
      } else {
        EXPECT_EQ(f["kind"], "spike");
        EXPECT_EQ(f["rank"], 2);
        EXPECT_EQ(f["batch"], 4);
      }
    }
  }
}

// A leak in the code every rank runs is found on every rank, and said to be in code every rank
// runs: judged by what each rank keeps, not against the median rank (which leaks too).
TEST(TorchLoopEveryRank, ALeakOnEveryRankIsFoundOnEachAndSaidToBeShared) {
  test::TempDir dir;
  const auto [summary, info] = import_and_report(dir, pickles(kLoops / "lm_everyrank"), "");
  int leaks = 0;
  for (const auto& f : summary["findings"]) {
    if (f["kind"] != "leak") continue;
    ++leaks;
    EXPECT_NE(f["detail"].get<std::string>().find("3 other ranks do the same, so the leak is in code every rank runs"),
              std::string::npos)
        << f.dump();
  }
  EXPECT_EQ(leaks, 4) << summary["findings"].dump(1);
}
// Issue #27: a rank catches torch's OutOfMemoryError on batch 4 and goes on; its memory before
// and after equals every other rank's. Its one finding is the OOM: the batch it failed in (its
// batches found from the optimizer's steps, the failed batch having none), the 256 MiB it asked
// for, what was allocated then, the line that asked; no shard imbalance and no spike made of the
// failed batch. The outlier it is (its peak is the failed attempt's) is explained by it.
TEST(TorchLoopOom, ACaughtOomIsTheRanksOnlyFinding) {
  for (const std::string args : {"", "--interval 4"}) {
    test::TempDir dir;
    const auto [summary, info] = import_and_report(dir, pickles(kLoops / "oom_caught"), args);
    ASSERT_EQ(summary["findings"].size(), 1u) << summary["findings"].dump(1);
    const auto& f = summary["findings"][0];
    EXPECT_EQ(f["kind"], "oom");
    EXPECT_EQ(f["rank"], 3);
    EXPECT_EQ(f["batch"], 4);
    EXPECT_EQ(f["bytes"], 256 * 1024 * 1024);
    EXPECT_NEAR(f["live"].get<double>(), 1444036612.0, 1024 * 1024) << "the allocated bytes when it was refused";
    EXPECT_NE(f["site"].get<std::string>().find("torch_loops.py:645"), std::string::npos) << "loss = model(x)...";
    EXPECT_NE(f["detail"].get<std::string>().find("went on"), std::string::npos) << f.dump();
    EXPECT_EQ(summary["imbalance"]["outlier_causes"]["3"], json::array({"oom"}));
    for (const auto& r : info["ranks"]) EXPECT_EQ(r["windows"][0]["batch_start"], 2) << r.dump();
  }
}

// Issue #27: 16 ranks equal to the byte; rank 9's batch 4 has a 1.31x longer sequence, a peak
// 16.7 % above the others'. Where the ranks agree this closely that is a spike (the rule's
// limit scales with how much ranks and batches vary), of the bytes torch measured.
TEST(TorchLoopSpike, ASixteenPercentSpikeAmongIdenticalRanksIsFound) {
  const json manifest = read_json(kLoops / "spike16/manifest.json");
  const auto& peaks = manifest["ranks"][9]["batch_peaks"];
  const double planted = peaks[4].get<double>() - peaks[3].get<double>();
  test::TempDir dir;
  const auto [summary, info] = import_and_report(dir, pickles(kLoops / "spike16"), "");
  ASSERT_EQ(summary["findings"].size(), 1u) << summary["findings"].dump(1);
  const auto& f = summary["findings"][0];
  EXPECT_EQ(f["kind"], "spike");
  EXPECT_EQ(f["rank"], 9);
  EXPECT_EQ(f["batch"], 4);
  EXPECT_NEAR(f["bytes"].get<double>(), planted, 0.1 * planted) << f.dump();
  EXPECT_EQ(summary["imbalance"]["outlier_ranks"], json::array({9}));
  EXPECT_EQ(summary["imbalance"]["outlier_causes"]["9"], json::array({"spike"}));
}
INSTANTIATE_TEST_SUITE_P(RealSnapshots, TorchLoop, testing::ValuesIn(cases()), case_name);

// One pickle alone, as a user with one rank's snapshot has it: there is no other rank to compare
// with, so the rank is judged against its own batches.
TEST(TorchLoopAlone, ALeakAndASpikeAreFoundInOneRanksSnapshot) {
  const json manifest = read_json(kLoops / "gpt_adamw/manifest.json");
  for (const auto& t : manifest["ranks"]) {
    test::TempDir dir;
    const int rank = t["rank"];
    const auto [summary, info] = import_and_report(dir, pickles(kLoops / "gpt_adamw", {rank}), "--rank 0 --batch 5");
    std::set<std::string> kinds;
    for (const auto& f : summary["findings"]) kinds.insert(f["kind"]);
    const std::string want = kind_of(t["role"]);
    if (want.empty()) {
      EXPECT_TRUE(kinds.empty()) << "clean rank " << rank << ": " << summary["findings"].dump(1);
    } else {
      EXPECT_EQ(kinds, std::set<std::string>{want}) << "rank " << rank << ": " << summary["findings"].dump(1);
    }
  }
}

}  // namespace
}  // namespace memsnap
