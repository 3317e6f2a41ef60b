// diff::compare on sides built in memory: how sites are matched (a moved line), frameless
// allocations by category, and the noise a change must exceed.
#include <gtest/gtest.h>

#include "memsnap/diff.hpp"

namespace memsnap::diff {
namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

// One rank, one window whose peak holds `sites` (name, category, bytes); batches' peaks `batches`.
SideData side(const std::vector<std::tuple<std::string, Category, std::uint64_t>>& sites,
              const std::vector<std::uint64_t>& batches = {100 * MiB, 100 * MiB, 100 * MiB}, int ranks = 1) {
  SideData s;
  s.info.world_size = ranks;
  for (int r = 0; r < ranks; ++r) {
    RankData rd;
    rd.rank = r;
    WindowData w;
    w.row.rank = r;
    w.row.window = 0;
    w.row.batch_end = 4;
    for (const auto& [name, cat, bytes] : sites) {
      SiteRow row;
      row.rank = r;
      row.name = name;
      row.category = cat;
      row.bytes_at_peak = bytes;
      w.sites.push_back(row);
      w.row.peak_allocated += bytes;
      w.row.category_bytes[static_cast<int>(cat)] += bytes;
    }
    std::int64_t b = 2;
    for (auto peak : batches) {
      BatchStat st;
      st.batch = b++;
      st.peak_allocated = peak;
      w.digest.batches.push_back(st);
    }
    rd.windows.push_back(std::move(w));
    s.ranks.push_back(std::move(rd));
  }
  return s;
}

const SiteDelta* find(const DiffResult& r, const std::string& key) {
  for (const auto& s : r.sites)
    if (s.key == key) return &s;
  return nullptr;
}

TEST(DiffCompareTest, SiteKeySplitsTheLine) {
  EXPECT_EQ(site_key("step (train.py:72)"), std::make_pair(std::string("step (train.py)"), 72));
  EXPECT_EQ(site_key("f(int) (/a/b.cpp:9)"), std::make_pair(std::string("f(int) (/a/b.cpp)"), 9));
  EXPECT_EQ(site_key("<no stack>"), std::make_pair(std::string("<no stack>"), 0));
  EXPECT_EQ(site_key("g (x.py)"), std::make_pair(std::string("g (x.py)"), 0));
}

TEST(DiffCompareTest, AMovedLineIsTheSameSiteSaidToHaveMoved) {
  const auto base = side({{"step (train.py:66)", Category::activations, 40 * MiB}, {"step (train.py:72)", Category::other, 8 * MiB}});
  const auto now = side({{"step (train.py:70)", Category::activations, 40 * MiB}, {"step (train.py:76)", Category::other, 8 * MiB}});
  const DiffResult r = compare(base, now);
  EXPECT_TRUE(r.no_change) << r.headline;
  const SiteDelta* s = find(r, "step (train.py:70)");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->moved);
  EXPECT_EQ(s->base_name, "step (train.py:66)");
  EXPECT_EQ(s->bytes.delta(), 0);
  const SiteDelta* t = find(r, "step (train.py:76)");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->base_name, "step (train.py:72)") << "lines pair in order";
}

TEST(DiffCompareTest, ALineGoneIsNotMergedIntoItsFunction) {
  const auto base = side({{"step (train.py:66)", Category::activations, 40 * MiB}, {"step (train.py:72)", Category::other, 24 * MiB}});
  const auto now = side({{"step (train.py:66)", Category::activations, 40 * MiB}});
  const DiffResult r = compare(base, now);
  const SiteDelta* gone = find(r, "step (train.py:72)");
  ASSERT_NE(gone, nullptr);
  EXPECT_TRUE(gone->beyond_noise);
  EXPECT_EQ(gone->bytes.now, 0u);
  EXPECT_FALSE(gone->moved);
  EXPECT_FALSE(find(r, "step (train.py:66)")->beyond_noise);
}

TEST(DiffCompareTest, AllocationsWithoutFramesMatchByCategory) {
  const auto base = side({{"<no stack>", Category::gradients, 10 * MiB}, {"<no stack>", Category::other, 5 * MiB}});
  const auto now = side({{"<no stack>", Category::gradients, 30 * MiB}, {"<no stack>", Category::other, 5 * MiB}});
  const DiffResult r = compare(base, now);
  const SiteDelta* g = find(r, "<no stack> [gradients]");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->bytes.delta(), static_cast<std::int64_t>(20 * MiB));
  EXPECT_FALSE(find(r, "<no stack> [other]")->beyond_noise);
}

TEST(DiffCompareTest, BatchesThatVaryRaiseTheNoiseALeakDoesNot) {
  // Batches of varying sizes: a 5 MiB change is within their own variation.
  const std::vector<std::uint64_t> varying = {100 * MiB, 110 * MiB, 95 * MiB, 108 * MiB, 97 * MiB};
  const auto base = side({{"f (a.py:1)", Category::activations, 100 * MiB}}, varying);
  const auto now = side({{"f (a.py:1)", Category::activations, 105 * MiB}}, varying);
  const DiffResult r = compare(base, now);
  EXPECT_GT(r.noise.batch_spread, 3 * MiB);
  EXPECT_TRUE(r.no_change) << r.headline;
  // Batches that rise by the same step (a leak) are a trend, not noise: the same 5 MiB is a change.
  const std::vector<std::uint64_t> rising = {100 * MiB, 116 * MiB, 132 * MiB, 148 * MiB, 164 * MiB};
  const DiffResult l = compare(side({{"f (a.py:1)", Category::activations, 100 * MiB}}, rising),
                               side({{"f (a.py:1)", Category::activations, 105 * MiB}}, rising));
  EXPECT_EQ(l.noise.batch_spread, 0u);
  EXPECT_FALSE(l.no_change);
}

TEST(DiffCompareTest, FailOnGrowthNamesTheRankAndTheSiteThatGrewMost) {
  DiffOptions o;
  o.fail_on_growth = 0.1;
  const auto base = side({{"f (a.py:1)", Category::activations, 100 * MiB}, {"g (a.py:9)", Category::other, 10 * MiB}});
  const auto now = side({{"f (a.py:1)", Category::activations, 130 * MiB}, {"g (a.py:9)", Category::other, 12 * MiB}});
  const DiffResult r = compare(base, now, o);
  EXPECT_TRUE(r.growth_failed);
  EXPECT_NE(r.growth_line.find("rank 0's peak allocated grew"), std::string::npos) << r.growth_line;
  EXPECT_NE(r.growth_line.find("most at f (a.py:1) (+30.0 MiB)"), std::string::npos) << r.growth_line;
  o.fail_on_growth = 0.5;
  EXPECT_FALSE(compare(base, now, o).growth_failed);
}

}  // namespace
}  // namespace memsnap::diff
