// The cross-rank page's own parts (report/src/cross_rank.cpp): where ranks differ, from /sites;
// the findings come from the store (tests/aggregator/test_findings*.cpp).
#include <gtest/gtest.h>

#include "../test_fixtures.hpp"
#include "memsnap/report.hpp"

namespace memsnap {
namespace {

using test::MiB;

struct FakeRun : test::FakeRunIndex {
  using FakeRunIndex::FakeRunIndex;
  CrossRankResult cross(const std::vector<Finding>& findings = {}) { return cross_rank_analysis(info, sites, findings, {}); }
};

// The page shows the findings it is given, as summary.json does, and each outlier's causes.
TEST(CrossRank, ThePageShowsTheStoresFindings) {
  FakeRun run(5);
  for (int r = 0; r < 4; ++r) run.window(r, MiB, MiB, 1000 * MiB);
  run.window(4, MiB, MiB, 1500 * MiB);
  const Finding f{.kind = "spike",
                  .rank = 4,
                  .window = 0,
                  .has_batch = true,
                  .batch = 3,
                  .bytes = 500 * MiB,
                  .detail = "as the store says"};
  const auto result = run.cross({f});
  EXPECT_DOUBLE_EQ(result.peak_max_over_median, 1.5);
  ASSERT_EQ(result.summary_json["findings"].size(), 1u);
  EXPECT_EQ(result.summary_json["findings"][0]["detail"], "as the store says");
  EXPECT_EQ(result.page["findings"], result.summary_json["findings"]);
  EXPECT_EQ(result.summary_json["imbalance"]["outlier_causes"]["4"], nlohmann::json::array({"spike"}));
}

TEST(CrossRank, WhereRanksDifferListsTheSiteThatDiffers) {
  FakeRun run(3);
  for (int r = 0; r < 3; ++r) run.window(r, MiB, MiB, 100 * MiB);
  for (int r = 0; r < 3; ++r) {
    SiteRow same{{kNoStack, "forward (model.py:10)", Category::activations, 50 * MiB, 1, 0, 0}, r, 0, 4, 0};
    SiteRow differs{
        {kNoStack, "init_params (model.py:3)", Category::parameters, (r == 1 ? 30 : 10) * MiB, 1, 0, 0}, r, 0, 4, 1};
    run.sites.push_back(same);
    run.sites.push_back(differs);
  }
  const auto diffs = run.cross().summary_json["site_diffs"];
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
    run.sites.push_back(SiteRow{{kNoStack, name, Category::parameters, bytes, 1, 0, 0}, r, 0, 4, 0});
  };
  site(0, "init (model.py:3)", 10 * MiB);  // rank 1 has none
  site(2, "init (model.py:3)", 30 * MiB);
  site(3, "init (model.py:3)", 10 * MiB);
  site(0, "cache (model.py:9)", 0);  // a row of 0 before the first rank without one
  site(1, "cache (model.py:9)", 5 * MiB);
  site(3, "cache (model.py:9)", 5 * MiB);
  for (int r = 0; r < 4; ++r) site(r, "forward (model.py:10)", 50 * MiB);  // alike: not listed
  const auto diffs = run.cross().summary_json["site_diffs"];
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

}  // namespace
}  // namespace memsnap
