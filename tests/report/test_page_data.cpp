// The rank page's data on real torch 2.11 pickles: the page colours each allocation by the
// category the analysis counts it in, so the page and the findings never disagree about what
// memory is for (tests/data/torch-stacks, recorded with stacks="python" and stacks="all").
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "memsnap/analysis.hpp"
#include "memsnap/report.hpp"
#include "torch/snapshot.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
const fs::path kStacks = fs::path(MEMSNAP_TEST_DATA) / "torch-stacks";

RankRecord import_rank0(const std::string& loop, const std::string& stacks) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kStacks / loop / stacks)) {
    if (e.path().extension() == ".pickle") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error("no pickle in " + (kStacks / loop / stacks).string());
  return torch::import_snapshot_file(files.front().string(), {}).record;
}

// Bytes live at the allocated peak by the page's own category of each allocation.
std::vector<std::uint64_t> page_bytes_at_peak(const nlohmann::json& page, std::int64_t peak_ns) {
  std::vector<std::uint64_t> out(kCategoryCount, 0);
  const auto& a = page["allocs"];
  for (std::size_t i = 0; i < a["size"].size(); ++i) {
    const auto start = a["start_ns"][i].get<std::int64_t>(), end = a["end_ns"][i].get<std::int64_t>();
    if (start <= peak_ns && (end < 0 || end > peak_ns)) out[a["category"][i].get<int>()] += a["size"][i].get<std::uint64_t>();
  }
  return out;
}

class PageCategories : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(PageCategories, ThePageColoursEachAllocationAsTheAnalysisCountsIt) {
  const auto [loop, stacks] = GetParam();
  const RankRecord r = import_rank0(loop, stacks);
  ASSERT_EQ(r.windows.size(), 1u);
  const WindowRecord& w = r.windows.front();
  const WindowStats s = analyse_window(r, w);
  // Every allocation drawn one by one (no summed band), so every byte has the page's category.
  const auto page = rank_page_data(r, w, s, "t", 1, std::size_t{1} << 30, nlohmann::json::object(), nullptr);
  const auto bytes = page_bytes_at_peak(page, s.peak_allocated_time_ns);
  std::uint64_t total = 0;
  for (int c = 0; c < kCategoryCount; ++c) total += s.category_bytes_at_peak[c];
  for (int c = 0; c < kCategoryCount; ++c) {
    // Events that share the peak's timestamp (torch's clock is in microseconds) may fall either
    // side of it on the page: 1 % of the peak.
    EXPECT_NEAR(static_cast<double>(bytes[c]), static_cast<double>(s.category_bytes_at_peak[c]), 0.01 * total)
        << loop << "/" << stacks << ": " << category_name(static_cast<Category>(c));
  }
  EXPECT_GT(s.category_bytes_at_peak[static_cast<int>(Category::gradients)], 0u) << loop << "/" << stacks;

  // Under stacks="python" torch records the backward without frames: the page names that memory
  // by the analysis' site for it, so a finding at that site finds its allocations on the page.
  const auto& names = page["site_names"];
  const bool engine_site = std::find(names.begin(), names.end(), kNoPythonFramesSite) != names.end();
  EXPECT_EQ(engine_site, std::string(stacks) == "python") << loop << "/" << stacks;
}

INSTANTIATE_TEST_SUITE_P(RealLoops, PageCategories,
                         ::testing::Values(std::make_pair("mlp_sgd", "python"), std::make_pair("mlp_sgd", "all"),
                                           std::make_pair("gpt_adamw", "python"), std::make_pair("gpt_adamw", "all"),
                                           std::make_pair("vit_adam", "python")),
                         [](const auto& info) { return std::string(info.param.first) + "_" + info.param.second; });

}  // namespace
}  // namespace memsnap
