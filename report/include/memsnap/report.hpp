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

// What the per-rank pass learns of one window and sends to rank 0 for the cross-rank page.
struct WindowDigest {
  int rank = 0;
  std::int64_t batch = 0;
  std::string page;                           // relative href of its page
  std::vector<BatchStat> batches;             // per-batch peak and live bytes
  // Allocated memory over the window for the cross page's sparkline: kSparkPoints levels at equal
  // steps of time, each the highest in its step, as text (report::spark_levels in html.hpp).
  std::string spark;
  std::uint64_t spark_max = 0;                // the level that "__" (4095) stands for
  nlohmann::json site_stacks;                 // site name -> [{name,file,line}...]
  // How the window's batches were found (WindowRecord::batch_method ...) and how it grows.
  std::string batch_method = "recorded";
  double batch_confidence = 1.0;
  std::string batch_detail;
  double growth_per_batch = 0;
  bool growth_monotone = false;
  std::string growth_site;
  double growth_site_per_batch = 0;
  double retained_per_batch = 0;              // WindowStats::retained_per_batch ...
  std::string retained_site;
  std::uint32_t retained_times = 0;
  bool growth_regrown = false;                // WindowStats::growth_regrown
  std::vector<HeldSite> sites_at_low;         // WindowStats::sites_at_low
  bool cut_short = false;                     // closed by an OOM or a kill, mid-batch
};

/// Points of a window's sparkline on the cross page.
inline constexpr std::size_t kSparkPoints = 128;

// The rank page's data (the contract in report/html/html.cpp) for one window.
nlohmann::json rank_page_data(const RankRecord& rank, const WindowRecord& window, const WindowStats& stats,
                              const std::string& run_name, int world_size, std::size_t max_bands,
                              const nlohmann::json& links, WindowDigest* digest);

// Cross-rank analysis: imbalance metrics, findings (leak, shard imbalance, spike, oom, missing,
// truncated) and where ranks differ. `summary_json` is what summary.json holds.
struct CrossRankResult {
  nlohmann::json page;          // the cross page's data
  nlohmann::json summary_json;  // summary.json
  double peak_max_over_median = 0;
};
CrossRankResult cross_rank_analysis(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                    const std::vector<WindowDigest>& digests);

// `memsnap report`: MPI-aware (ranks share the per-rank pages; rank 0 writes the cross page).
// Returns the exit code: 0, 1 (error, one line on stderr), 3 (imbalance over the threshold),
// 4 (an upload to remote_file_name failed or was refused; the report is written).
int report_main(const ReportOptions& options);

// The page name of a rank's window from the config's `filename` template.
std::string page_name(const std::string& filename_template, const std::string& run_name, const RankInfo& rank,
                      int world_size, std::int64_t batch);

}  // namespace memsnap
