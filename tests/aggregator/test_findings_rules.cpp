// The findings' rules (aggregator/src/findings/) on summary rows and window digests: each rule
// fires on the rank that differs, and only there.
#include <gtest/gtest.h>

#include "../../aggregator/src/findings/rules.hpp"
#include "memsnap/findings.hpp"
#include "test_fixtures.hpp"

namespace memsnap {
namespace {

using test::MiB;

struct FakeRun : test::FakeRunIndex {
  std::vector<WindowDigest> digests;

  using FakeRunIndex::FakeRunIndex;
  // One window (batches 2..4) per rank with the given boundary and peak bytes, and its digest.
  void window(int rank, std::uint64_t open, std::uint64_t close, std::uint64_t peak, std::vector<std::uint64_t> batch_peaks = {}) {
    FakeRunIndex::window(rank, open, close, peak);
    WindowDigest d;
    d.rank = rank;
    d.window = 0;
    d.batch = 4;
    if (batch_peaks.empty()) batch_peaks = {peak, peak, peak};
    // Each batch starts (and is lowest) where the one before ended, as analyse_window sees it.
    const std::size_t n = batch_peaks.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t start = open + (close - open) * i / n;
      const std::uint64_t end = open + (close - open) * (i + 1) / n;
      d.batches.push_back(BatchStat{static_cast<std::int64_t>(2 + i), batch_peaks[i], end, start, start, {}, 0});
    }
    if (n >= 2) {
      d.growth_per_batch = (static_cast<double>(d.batches.back().min_allocated) - static_cast<double>(d.batches.front().min_allocated)) /
                           static_cast<double>(n - 1);
      d.growth_monotone = close >= open;
    }
    digests.push_back(d);
  }
  nlohmann::json findings() { return findings_json(compute_findings(info, sites, digests)); }
  // As summary.json holds them: the findings and the imbalance of the peaks.
  nlohmann::json summary() {
    const auto found = compute_findings(info, sites, digests);
    return {{"findings", findings_json(found)}, {"imbalance", peak_imbalance(info, found)}};
  }
};

std::vector<std::pair<std::string, int>> kinds(const nlohmann::json& findings) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& f : findings) out.emplace_back(f["kind"], f["rank"]);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Findings, IdenticalRanksHaveNoFindings) {
  FakeRun run(8);
  for (int r = 0; r < 8; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  EXPECT_TRUE(run.findings().empty());
  const auto result = run.summary();
  EXPECT_DOUBLE_EQ(result["imbalance"]["max_over_median"].get<double>(), 1.0);
  EXPECT_TRUE(result["imbalance"]["outlier_ranks"].empty());
}

TEST(Findings, EachRuleNamesItsRank) {
  FakeRun run(6);
  run.window(0, 100 * MiB, 100 * MiB, 500 * MiB);
  run.window(1, 300 * MiB, 300 * MiB, 700 * MiB);                      // holds 200 MiB more, steadily
  run.window(2, 100 * MiB, 190 * MiB, 590 * MiB);                      // +30 MiB every batch
  run.window(3, 100 * MiB, 100 * MiB, 900 * MiB, {500 * MiB, 900 * MiB, 500 * MiB});  // batch 3 only
  run.window(4, 100 * MiB, 100 * MiB, 500 * MiB);
  run.window(5, 100 * MiB, 100 * MiB, 500 * MiB);
  run.info.rows[5].oom = true;
  run.info.rows[5].oom_requested = 4096 * MiB;
  // Rising low points are a leak where a code path regrows a tensor; without that they may be a
  // run of ever larger inputs, and no finding.
  EXPECT_EQ(kinds(run.findings()), (std::vector<std::pair<std::string, int>>{{"oom", 5}, {"shard_imbalance", 1}, {"spike", 3}}));
  run.digests[2].growth_regrown = true;
  const auto f = run.findings();
  const std::vector<std::pair<std::string, int>> expected = {
      {"leak", 2}, {"oom", 5}, {"shard_imbalance", 1}, {"spike", 3}};
  EXPECT_EQ(kinds(f), expected) << f.dump(2);
  for (const auto& x : f) {
    if (x["kind"] == "leak") {
      EXPECT_EQ(x["bytes"], 30 * MiB);
    }
    if (x["kind"] == "shard_imbalance") {
      EXPECT_EQ(x["bytes"], 200 * MiB);
    }
    if (x["kind"] == "spike") {
      EXPECT_EQ(x["batch"], 3);
      // Above batch 3's median over all six ranks: (500 + 590) / 2 = 545 MiB.
      EXPECT_EQ(x["bytes"], 355 * MiB);
    }
    if (x["kind"] == "oom") {
      EXPECT_EQ(x["bytes"], 4096 * MiB);
    }
  }
}

// A leak in the code every rank runs: every rank keeps memory for good, the median rank too.
// Each rank gets its finding, with what one batch keeps and the code path that keeps it, and the
// finding says the leak is shared. Rising low points alone would find none of them.
TEST(Findings, MemoryEveryRankKeepsIsALeakOnEveryRank) {
  FakeRun run(4);
  for (int r = 0; r < 4; ++r) {
    run.window(r, 100 * MiB, 148 * MiB, 500 * MiB);
    run.digests[r].retained_per_batch = 24.0 * MiB;
    run.digests[r].retained_site = "train (train.py:88)";
    run.digests[r].retained_times = 3;
  }
  const auto f = run.findings();
  const std::vector<std::pair<std::string, int>> expected = {{"leak", 0}, {"leak", 1}, {"leak", 2}, {"leak", 3}};
  EXPECT_EQ(kinds(f), expected) << f.dump(2);
  for (const auto& x : f) {
    EXPECT_EQ(x["bytes"], 24 * MiB);
    EXPECT_EQ(x["site"], "train (train.py:88)");
    EXPECT_NE(x["detail"].get<std::string>().find("3 other ranks do the same"), std::string::npos) << x.dump();
  }
  // One rank alone keeping memory is a leak on that rank only, not said to be shared.
  for (int r = 1; r < 4; ++r) run.digests[r].retained_per_batch = 0;
  const auto one = run.findings();
  ASSERT_EQ(kinds(one), (std::vector<std::pair<std::string, int>>{{"leak", 0}})) << one.dump(2);
  EXPECT_EQ(one[0]["detail"].get<std::string>().find("other ranks do the same"), std::string::npos);
  // Below max(1 MiB, 0.02 % of the median peak) a batch: not a finding.
  run.digests[0].retained_per_batch = 0.5 * MiB;
  EXPECT_TRUE(run.findings().empty()) << run.findings().dump(2);
}

TEST(Findings, AWindowCutShortByOomIsNotALeak) {
  FakeRun run(4);
  for (int r = 0; r < 4; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  // Rank 1's window closed at its OOM, mid-batch, holding that batch's activations.
  run.info.rows[1].live_at_close = 300 * MiB;
  run.info.rows[1].oom = true;
  run.info.rows[1].oom_requested = 8192 * MiB;
  run.digests[1].batches.back().live_at_end = 300 * MiB;
  const std::vector<std::pair<std::string, int>> expected = {{"oom", 1}};
  EXPECT_EQ(kinds(run.findings()), expected) << run.findings().dump(2);
}

// Issue #27: a rank catches an OOM in batch 3 and goes on; at the window's open and close it
// holds what every other rank holds. The window opens holding the last batch's outputs (80 MiB
// above the batches' low points, on every rank). Its one finding is the OOM (the batch it failed
// in, what it asked for, what was allocated, where), not a shard imbalance measured at its open
// against the others' low points, and not a spike made of the failed attempt's peak.
TEST(Findings, ACaughtOomIsItsOomFindingAlone) {
  FakeRun run(8);
  for (int r = 0; r < 8; ++r) {
    run.window(r, 385 * MiB, 385 * MiB, (r == 3 ? 1377 : 897) * MiB, {897 * MiB, (r == 3 ? 1377 : 897) * MiB, 897 * MiB});
    for (auto& b : run.digests[r].batches) b.min_allocated = 305 * MiB;
  }
  run.info.rows[3].oom = true;
  run.info.rows[3].oom_requested = 256 * MiB;
  run.digests[3].cut_short = true;  // as the rank pass marks any window with an OOM
  BatchStat& failed = run.digests[3].batches[1];
  failed.oom = failed.oom_went_on = true;
  failed.oom_requested = 256 * MiB;
  failed.live_at_oom = 1121 * MiB;
  failed.oom_site = "train (train.py:645)";
  const auto result = run.summary();
  const auto& f = result["findings"];
  ASSERT_EQ(kinds(f), (std::vector<std::pair<std::string, int>>{{"oom", 3}})) << f.dump(2);
  EXPECT_EQ(f[0]["batch"], 3);
  EXPECT_EQ(f[0]["bytes"], 256 * MiB);
  EXPECT_EQ(f[0]["live"], 1121 * MiB);
  EXPECT_EQ(f[0]["site"], "train (train.py:645)");
  EXPECT_EQ(f[0]["went_on"], true);
  EXPECT_NE(f[0]["detail"].get<std::string>().find("480 MiB more than the other ranks' peak in that batch"), std::string::npos)
      << f[0].dump();
  EXPECT_EQ(result["imbalance"]["outlier_ranks"], nlohmann::json::array({3}));
  EXPECT_EQ(result["imbalance"]["outlier_causes"]["3"], nlohmann::json::array({"oom"}));
  // A window that ended at its OOM (the job died there) measures its low points like the others.
  failed.oom_went_on = false;
  EXPECT_EQ(kinds(run.findings()), (std::vector<std::pair<std::string, int>>{{"oom", 3}})) << run.findings().dump(2);
}

// Issue #27: 16 ranks equal to the byte; one batch of rank 9 peaks 16 % above (a longer
// sequence), and the batch after it holds a little of it still. Where ranks and batches agree
// this closely, that is a spike, one finding: not hidden by a fixed 25 % limit.
TEST(Findings, ASmallSpikeAmongIdenticalRanksIsFound) {
  FakeRun run(16);
  for (int r = 0; r < 16; ++r) {
    std::vector<std::uint64_t> peaks(4, 660 * MiB);
    if (r == 9) {
      peaks[2] = 766 * MiB;
      peaks[3] = 700 * MiB;
    }
    run.window(r, 100 * MiB, 100 * MiB, peaks[2], peaks);
  }
  const auto result = run.summary();
  const auto& f = result["findings"];
  ASSERT_EQ(kinds(f), (std::vector<std::pair<std::string, int>>{{"spike", 9}})) << f.dump(2);
  EXPECT_EQ(f[0]["batch"], 4);
  EXPECT_EQ(f[0]["bytes"], 106 * MiB);
  EXPECT_EQ(result["imbalance"]["outlier_causes"]["9"], nlohmann::json::array({"spike"}));
}

// Where the ranks' batches vary (a new sequence length every batch, differently on every rank),
// the same 16 % is within their variation: no spike.
TEST(Findings, WhereBatchesVaryTheSpikeLimitStaysHigh) {
  FakeRun run(8);
  for (int r = 0; r < 8; ++r) {
    std::vector<std::uint64_t> peaks;
    for (int b = 0; b < 4; ++b) peaks.push_back((600 + ((r * 37 + b * 53) % 7 - 3) * 30) * MiB);  // 510..690 MiB
    if (r == 5) peaks[1] = 720 * MiB;  // about 16 % above the median
    run.window(r, 100 * MiB, 100 * MiB, *std::max_element(peaks.begin(), peaks.end()), peaks);
  }
  const auto f = run.findings();
  for (const auto& x : f) EXPECT_NE(x["kind"], "spike") << f.dump(2);
}

// A rank whose every batch peaks 30 % higher than the others' while it holds no more at its low
// points is an outlier that no rule explains: said so, not left as a red bar without a reason.
TEST(Findings, AnOutlierNoRuleExplainsIsSaidToBeUnexplained) {
  FakeRun run(8);
  for (int r = 0; r < 8; ++r) run.window(r, 100 * MiB, 100 * MiB, (r == 5 ? 650 : 500) * MiB);
  const auto result = run.summary();
  const auto& f = result["findings"];
  ASSERT_EQ(kinds(f), (std::vector<std::pair<std::string, int>>{{"unexplained", 5}})) << f.dump(2);
  EXPECT_EQ(f[0]["bytes"], 150 * MiB);
  EXPECT_NE(f[0]["detail"].get<std::string>().find("no cause found"), std::string::npos) << f[0].dump();
  EXPECT_EQ(result["imbalance"]["outlier_ranks"], nlohmann::json::array({5}));
  EXPECT_EQ(result["imbalance"]["outlier_causes"]["5"], nlohmann::json::array({"unexplained"}));
}

TEST(FindingsRules, TheSpikeLimitScalesWithTheSpreadBetweenAFloorAndACeiling) {
  using namespace cross_rank_rules;
  EXPECT_DOUBLE_EQ(robust_spread({5, 5, 5, 9}), 0.0);
  EXPECT_DOUBLE_EQ(robust_spread({1, 2, 3}), 1.4826);
  EXPECT_DOUBLE_EQ(spike_limit(1000 * MiB, 0), 50.0 * MiB);           // agreeing to the byte: 5 %
  EXPECT_DOUBLE_EQ(spike_limit(1000 * MiB, 12 * MiB), 120.0 * MiB);   // 10 spreads
  EXPECT_DOUBLE_EQ(spike_limit(1000 * MiB, 40 * MiB), 250.0 * MiB);   // varying: 25 %, as before
  EXPECT_DOUBLE_EQ(spike_limit(4 * MiB, 0), 1.0 * MiB);               // never below 1 MiB
  const std::vector<std::pair<std::int64_t, double>> high = {{2, 10}, {4, 50}, {5, 8}, {7, 3}};
  EXPECT_EQ(distinct_spikes(high), (std::vector<std::pair<std::int64_t, double>>{{2, 10}, {4, 50}, {7, 3}}));
}

TEST(Findings, MissingAndTruncatedRanksAreFindings) {
  FakeRun run(4);
  run.window(0, MiB, MiB, 10 * MiB);
  run.window(1, MiB, MiB, 10 * MiB);
  run.info.ranks[2].status = "missing";
  run.info.ranks[2].n_windows = 0;
  run.window(3, MiB, MiB, 10 * MiB);
  run.info.ranks[3].status = "truncated";
  run.info.ranks[3].status_detail = "record at byte 4096: the file ends inside a record";
  const auto f = run.findings();
  const std::vector<std::pair<std::string, int>> expected = {{"missing", 2}, {"truncated", 3}};
  EXPECT_EQ(kinds(f), expected) << f.dump(2);
  EXPECT_NE(f[1]["detail"].get<std::string>().find("byte 4096"), std::string::npos);
}

TEST(Findings, SmallDifferencesAreNotFindings) {
  FakeRun run(4);
  run.window(0, 100 * MiB, 100 * MiB, 500 * MiB);
  run.window(1, 100 * MiB + 512 * 1024, 100 * MiB + 512 * 1024, 500 * MiB);  // half a MiB: noise
  run.window(2, 100 * MiB, 100 * MiB, 510 * MiB);                           // 2 % peak: noise
  run.window(3, 100 * MiB, 100 * MiB, 500 * MiB);
  EXPECT_TRUE(run.findings().empty()) << run.findings().dump(2);
}

TEST(Findings, OutliersAndTheImbalanceRatio) {
  FakeRun run(5);
  for (int r = 0; r < 4; ++r) run.window(r, MiB, MiB, 1000 * MiB);
  run.window(4, MiB, MiB, 1500 * MiB);
  const auto result = run.summary();
  EXPECT_DOUBLE_EQ(result["imbalance"]["max_over_median"].get<double>(), 1.5);
  EXPECT_EQ(result["imbalance"]["outlier_ranks"], nlohmann::json::array({4}));
}

// The site named by a finding is the one the rank holds most more of than the median of the
// other ranks (those without a row for it count as holding 0; ranks without data not at all).
TEST(Findings, AFindingNamesTheSiteHeldMostAboveTheOtherRanksMedian) {
  FakeRun run(7);  // rank 6 left no record
  for (int r = 0; r < 6; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  run.info.rows[2].live_at_open = run.info.rows[2].live_at_close = run.info.rows[2].persistent = 300 * MiB;
  for (auto& b : run.digests[2].batches) b.min_allocated = b.live_at_start = b.live_at_end = 300 * MiB;
  run.info.ranks[6].status = "missing";
  run.info.ranks[6].n_windows = 0;
  auto site = [&](int r, const char* name, std::uint64_t bytes) {
    run.sites.push_back(SiteRow{{kNoStack, name, Category::other, bytes, 1, 0, 0}, r, 0, 4, 0});
  };
  // Rank 2 above the median of the others: params 250 - 100 (rank 4 has none: 0, 100, 100, 100,
  // 100), only_here 120 - 0, buffers 100 - 40 (10, 20, 40, 50, 60).
  site(2, "only_here (model.py:1)", 120 * MiB);
  for (int r : {0, 1, 3, 5}) site(r, "params (model.py:3)", 100 * MiB);
  site(2, "params (model.py:3)", 250 * MiB);
  for (int r : {0, 1, 3, 4, 5}) site(r, "buffers (model.py:7)", (10 + 10 * r) * MiB);
  site(2, "buffers (model.py:7)", 100 * MiB);
  const auto f = run.findings();
  const std::vector<std::pair<std::string, int>> expected = {{"missing", 6}, {"shard_imbalance", 2}};
  ASSERT_EQ(kinds(f), expected) << f.dump(2);
  EXPECT_EQ(f[1]["site"], "params (model.py:3)") << f.dump(2);
}

// A rank that holds more at every batch boundary is named by what the boundary holds, not by what
// its peak holds: a mixture of experts' rank whose tokens reached more experts holds their Adam
// state (made at each expert's first gradient) at every boundary, while its peak is activations.
TEST(Findings, MoreHeldAtEveryBoundaryIsNamedByWhatTheBoundaryHolds) {
  FakeRun run(4);
  for (int r = 0; r < 4; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  run.info.rows[1].live_at_open = run.info.rows[1].live_at_close = run.info.rows[1].persistent = 118 * MiB;
  for (auto& b : run.digests[1].batches) b.min_allocated = b.live_at_start = b.live_at_end = 118 * MiB;
  for (int r = 0; r < 4; ++r) {
    run.digests[r].sites_at_low = {HeldSite{"weights (model.py:5)", Category::parameters, 80 * MiB},
                                   HeldSite{"_init_group (adam.py:1)", Category::optimizer_state, (r == 1 ? 38 : 20) * MiB}};
    // The peak's sites: activations, the most above the others on rank 1.
    run.sites.push_back(
        SiteRow{{kNoStack, "loss = head(y) (train.py:9)", Category::activations, (r == 1 ? 300 : 250) * MiB, 1, 0, 0}, r, 0, 4, 0});
  }
  auto f = run.findings();
  ASSERT_EQ(kinds(f), (std::vector<std::pair<std::string, int>>{{"shard_imbalance", 1}})) << f.dump(2);
  EXPECT_EQ(f[0]["bytes"], 18 * MiB);
  EXPECT_EQ(f[0]["site"], "_init_group (adam.py:1)") << f.dump(2);
  EXPECT_EQ(f[0]["category"], "optimizer_state");
  EXPECT_NE(f[0]["detail"].get<std::string>().find("optimizer state"), std::string::npos) << f.dump(2);
  // Parameters held above the others: the sharding words, and that site.
  for (int r = 0; r < 4; ++r) {
    run.digests[r].sites_at_low = {HeldSite{"weights (model.py:5)", Category::parameters, (r == 1 ? 98 : 80) * MiB},
                                   HeldSite{"_init_group (adam.py:1)", Category::optimizer_state, 20 * MiB}};
  }
  f = run.findings();
  ASSERT_EQ(f.size(), 1u) << f.dump(2);
  EXPECT_EQ(f[0]["site"], "weights (model.py:5)");
  EXPECT_NE(f[0]["detail"].get<std::string>().find("sharded state should be equal"), std::string::npos) << f.dump(2);
  // Without the boundary's sites (an older digest, no batches): the peak's site, as before.
  for (auto& d : run.digests) d.sites_at_low.clear();
  f = run.findings();
  ASSERT_EQ(f.size(), 1u) << f.dump(2);
  EXPECT_EQ(f[0]["site"], "loss = head(y) (train.py:9)");
}

}  // namespace
}  // namespace memsnap
