// Cross-rank findings from summary rows: each rule fires on the rank that differs, and only there.
#include <gtest/gtest.h>

#include "memsnap/report.hpp"

namespace memsnap {
namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

struct FakeRun {
  StoreInfo info;
  std::vector<SiteRow> sites;
  std::vector<WindowDigest> digests;

  explicit FakeRun(int ranks) {
    info.run_name = "t";
    info.world_size = ranks;
    for (int r = 0; r < ranks; ++r) {
      RankInfo ri;
      ri.rank = r;
      ri.n_windows = 1;
      info.ranks.push_back(ri);
    }
  }
  // One window (batches 2..4) per rank with the given boundary and peak bytes.
  void window(int rank, std::uint64_t open, std::uint64_t close, std::uint64_t peak, std::vector<std::uint64_t> batch_peaks = {}) {
    SummaryRow row;
    row.rank = rank;
    row.window = 0;
    row.batch_start = 2;
    row.batch_end = 4;
    row.live_at_open = open;
    row.live_at_close = close;
    row.persistent = std::min(open, close);
    row.peak_allocated = row.peak_reserved = peak;
    info.rows.push_back(row);
    WindowDigest d;
    d.rank = rank;
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
  nlohmann::json findings() { return cross_rank_analysis(info, sites, digests).summary_json["findings"]; }
};

std::vector<std::pair<std::string, int>> kinds(const nlohmann::json& findings) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& f : findings) out.emplace_back(f["kind"], f["rank"]);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CrossRank, IdenticalRanksHaveNoFindings) {
  FakeRun run(8);
  for (int r = 0; r < 8; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  EXPECT_TRUE(run.findings().empty());
  const auto result = cross_rank_analysis(run.info, run.sites, run.digests);
  EXPECT_DOUBLE_EQ(result.peak_max_over_median, 1.0);
  EXPECT_TRUE(result.summary_json["imbalance"]["outlier_ranks"].empty());
}

TEST(CrossRank, EachRuleNamesItsRank) {
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
    if (x["kind"] == "leak") EXPECT_EQ(x["bytes"], 30 * MiB);
    if (x["kind"] == "shard_imbalance") EXPECT_EQ(x["bytes"], 200 * MiB);
    if (x["kind"] == "spike") {
      EXPECT_EQ(x["batch"], 3);
      // Above batch 3's median over all six ranks: (500 + 590) / 2 = 545 MiB.
      EXPECT_EQ(x["bytes"], 355 * MiB);
    }
    if (x["kind"] == "oom") EXPECT_EQ(x["bytes"], 4096 * MiB);
  }
}

// A leak in the code every rank runs: every rank keeps memory for good, the median rank too.
// Each rank gets its finding, with what one batch keeps and the code path that keeps it, and the
// finding says the leak is shared. Rising low points alone would find none of them.
TEST(CrossRank, MemoryEveryRankKeepsIsALeakOnEveryRank) {
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

TEST(CrossRank, AWindowCutShortByOomIsNotALeak) {
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

TEST(CrossRank, MissingAndTruncatedRanksAreFindings) {
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

TEST(CrossRank, SmallDifferencesAreNotFindings) {
  FakeRun run(4);
  run.window(0, 100 * MiB, 100 * MiB, 500 * MiB);
  run.window(1, 100 * MiB + 512 * 1024, 100 * MiB + 512 * 1024, 500 * MiB);  // half a MiB: noise
  run.window(2, 100 * MiB, 100 * MiB, 510 * MiB);                           // 2 % peak: noise
  run.window(3, 100 * MiB, 100 * MiB, 500 * MiB);
  EXPECT_TRUE(run.findings().empty()) << run.findings().dump(2);
}

TEST(CrossRank, OutliersAndTheImbalanceRatio) {
  FakeRun run(5);
  for (int r = 0; r < 4; ++r) run.window(r, MiB, MiB, 1000 * MiB);
  run.window(4, MiB, MiB, 1500 * MiB);
  const auto result = cross_rank_analysis(run.info, run.sites, run.digests);
  EXPECT_DOUBLE_EQ(result.peak_max_over_median, 1.5);
  EXPECT_EQ(result.summary_json["imbalance"]["outlier_ranks"], nlohmann::json::array({4}));
}

TEST(CrossRank, WhereRanksDifferListsTheSiteThatDiffers) {
  FakeRun run(3);
  for (int r = 0; r < 3; ++r) run.window(r, MiB, MiB, 100 * MiB);
  for (int r = 0; r < 3; ++r) {
    SiteRow same{r, 0, 4, 0, "forward (model.py:10)", Category::activations, 50 * MiB, 1, 0, 0, kNoStack};
    SiteRow differs{r, 0, 4, 1, "init_params (model.py:3)", Category::parameters, (r == 1 ? 30 : 10) * MiB, 1, 0, 0, kNoStack};
    run.sites.push_back(same);
    run.sites.push_back(differs);
  }
  const auto diffs = cross_rank_analysis(run.info, run.sites, run.digests).summary_json["site_diffs"];
  ASSERT_EQ(diffs.size(), 1u) << diffs.dump(2);
  EXPECT_EQ(diffs[0]["site"], "init_params (model.py:3)");
  EXPECT_EQ(diffs[0]["max_rank"], 1);
  EXPECT_EQ(diffs[0]["delta"], 20 * MiB);
  EXPECT_EQ(diffs[0]["category"], "parameters");
}

// A rank without a row for a site holds none of it; a rank without data is left out.
TEST(CrossRank, WhereRanksDifferCountsARankWithoutTheSiteAsZero) {
  FakeRun run(5);  // rank 4 left no record
  for (int r = 0; r < 4; ++r) run.window(r, MiB, MiB, 100 * MiB);
  run.info.ranks[4].status = "missing";
  run.info.ranks[4].n_windows = 0;
  auto site = [&](int r, const char* name, std::uint64_t bytes) {
    run.sites.push_back(SiteRow{r, 0, 4, 0, name, Category::parameters, bytes, 1, 0, 0, kNoStack});
  };
  site(0, "init (model.py:3)", 10 * MiB);  // rank 1 has none
  site(2, "init (model.py:3)", 30 * MiB);
  site(3, "init (model.py:3)", 10 * MiB);
  site(0, "cache (model.py:9)", 0);  // a row of 0 before the first rank without one
  site(1, "cache (model.py:9)", 5 * MiB);
  site(3, "cache (model.py:9)", 5 * MiB);
  for (int r = 0; r < 4; ++r) site(r, "forward (model.py:10)", 50 * MiB);  // alike: not listed
  const auto diffs = cross_rank_analysis(run.info, run.sites, run.digests).summary_json["site_diffs"];
  ASSERT_EQ(diffs.size(), 2u) << diffs.dump(2);
  EXPECT_EQ(diffs[0]["site"], "init (model.py:3)");
  EXPECT_EQ(diffs[0]["max_rank"], 2);
  EXPECT_EQ(diffs[0]["min_rank"], 1);
  EXPECT_EQ(diffs[0]["delta"], 30 * MiB);
  EXPECT_EQ(diffs[0]["bytes_by_rank"], nlohmann::json::array({10 * MiB, 0, 30 * MiB, 10 * MiB, 0}));
  EXPECT_EQ(diffs[1]["site"], "cache (model.py:9)");
  EXPECT_EQ(diffs[1]["max_rank"], 1);
  EXPECT_EQ(diffs[1]["min_rank"], 0);
  EXPECT_EQ(diffs[1]["delta"], 5 * MiB);
}

// The site named by a finding is the one the rank holds most more of than the median of the
// other ranks (those without a row for it count as holding 0; ranks without data not at all).
TEST(CrossRank, AFindingNamesTheSiteHeldMostAboveTheOtherRanksMedian) {
  FakeRun run(7);  // rank 6 left no record
  for (int r = 0; r < 6; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  run.info.rows[2].live_at_open = run.info.rows[2].live_at_close = run.info.rows[2].persistent = 300 * MiB;
  for (auto& b : run.digests[2].batches) b.min_allocated = b.live_at_start = b.live_at_end = 300 * MiB;
  run.info.ranks[6].status = "missing";
  run.info.ranks[6].n_windows = 0;
  auto site = [&](int r, const char* name, std::uint64_t bytes) {
    run.sites.push_back(SiteRow{r, 0, 4, 0, name, Category::other, bytes, 1, 0, 0, kNoStack});
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
TEST(CrossRank, MoreHeldAtEveryBoundaryIsNamedByWhatTheBoundaryHolds) {
  FakeRun run(4);
  for (int r = 0; r < 4; ++r) run.window(r, 100 * MiB, 100 * MiB, 500 * MiB);
  run.info.rows[1].live_at_open = run.info.rows[1].live_at_close = run.info.rows[1].persistent = 118 * MiB;
  for (auto& b : run.digests[1].batches) b.min_allocated = b.live_at_start = b.live_at_end = 118 * MiB;
  for (int r = 0; r < 4; ++r) {
    run.digests[r].sites_at_low = {HeldSite{"weights (model.py:5)", Category::parameters, 80 * MiB},
                                   HeldSite{"_init_group (adam.py:1)", Category::optimizer_state, (r == 1 ? 38 : 20) * MiB}};
    // The peak's sites: activations, the most above the others on rank 1.
    run.sites.push_back(SiteRow{r, 0, 4, 0, "loss = head(y) (train.py:9)", Category::activations,
                                (r == 1 ? 300 : 250) * MiB, 1, 0, 0, kNoStack});
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
