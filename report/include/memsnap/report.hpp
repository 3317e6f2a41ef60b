// The report stage: a store in, self-contained HTML pages and summary.json out.
//
//   DIR/index.html                          the cross-rank page (rank 0 writes it)
//   DIR/<filename template>                 one page per rank and window (their owners write them)
//   DIR/summary.json                        the findings, for machines
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/record.hpp"
#include "memsnap/store.hpp"

namespace memsnap {

struct ReportOptions {
  std::filesystem::path store;
  std::filesystem::path out_dir;             // empty: beside the store, "report/"
  std::optional<double> fail_on_imbalance;   // exit 3 when max/median peak - 1 exceeds it
  bool overwrite = false;                    // replace an existing report folder's pages
  std::size_t max_bands = 20000;             // allocations drawn one by one per page
  bool quiet = false;
  bool upload = true;                        // upload to the config's remote_file_name (exit 4 on failure)
};

// What the per-rank pass learns of one window's page and sends to rank 0 for the cross-rank page.
// (What the findings' rules read of a window is in the store: memsnap/findings.hpp.)
struct PageDigest {
  int rank = 0;
  std::int64_t batch = 0;
  std::string page;                           // relative href of its page
  // Allocated memory over the window for the cross page's sparkline: kSparkPoints levels at equal
  // steps of time, each the highest in its step, as text (report::spark_levels in html.hpp).
  std::string spark;
  std::uint64_t spark_max = 0;                // the level that "__" (4095) stands for
  nlohmann::json site_stacks;                 // site name -> [{name,file,line}...]
};

/// Points of a window's sparkline on the cross page.
inline constexpr std::size_t kSparkPoints = 128;

// The rank page's data (the contract in report/html/html.cpp) for one window. `stats` is the
// window's analysis as the store keeps it (stored_window_stats) or analyse_window's; the page
// replays the window for its timeline and flame graph, not for these numbers.
nlohmann::json rank_page_data(const RankRecord& rank, const WindowRecord& window, const WindowStats& stats,
                              const std::string& run_name, int world_size, std::size_t max_bands,
                              const nlohmann::json& links, PageDigest* digest);

// The cross-rank page and summary.json: imbalance metrics, the findings (computed when the store
// was written: memsnap/findings.hpp) and where ranks differ. `summary_json` is what summary.json
// holds.
struct CrossRankResult {
  nlohmann::json page;          // the cross page's data
  nlohmann::json summary_json;  // summary.json
  double peak_max_over_median = 0;
};
CrossRankResult cross_rank_analysis(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                    const std::vector<Finding>& findings, const std::vector<PageDigest>& pages);

// `memsnap report`: MPI-aware (ranks share the per-rank pages; rank 0 writes the cross page).
// Returns the exit code: 0, 1 (error, one line on stderr), 3 (imbalance over the threshold),
// 4 (an upload to remote_file_name failed or was refused; the report is written).
int report_main(const ReportOptions& options);

/// Why report_main would refuse to write its pages into `dir` ("" when it may): `dir` is absent,
/// empty, or an earlier memsnap report (its marker) and `overwrite` is set. For callers that
/// must know before they do other work (memsnap view checks before it imports).
std::string report_folder_refusal(const std::filesystem::path& dir, bool overwrite);

// The page name of a rank's window from the config's `filename` template.
std::string page_name(const std::string& filename_template, const std::string& run_name, const RankInfo& rank,
                      int world_size, std::int64_t batch);

}  // namespace memsnap
