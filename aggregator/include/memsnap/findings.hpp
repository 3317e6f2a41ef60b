// Findings: what differs between a run's ranks (a leak, a shard imbalance, a spike, an OOM, a
// missing or truncated record, an outlier no rule explains), computed once when a store is
// written (`memsnap aggregate`, `memsnap import`) and kept in it as the /findings table, with the
// cross-rank digest the rules read (/digest/windows, /digest/batches, /digest/held). `memsnap
// report`, `memsnap info` and h5py users read the same findings; the rules are in
// aggregator/src/findings/, one file per rule.
//
//   /findings          one row per finding, in the order the report lists them: kind, rank,
//                      window, has_batch, batch, bytes, site, category, detail, method, and the
//                      evidence (oom_in_batch, live, went_on, batches_inferred); strings are
//                      fixed-width fields as wide as the longest value ("" where none)
//   /digest/windows    one row per (rank, window): how its batches were found and how it grows
//   /digest/batches    one row per (rank, window, batch): peak, low point, boundary levels, OOM
//   /digest/held       what each window's lowest batch low point holds, by site
//
// Stores written before format version 3 have none of these: read_findings computes them from
// the rank files (as `memsnap aggregate` would have).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/codec.hpp"
#include "memsnap/store.hpp"

namespace memsnap {

/// One finding about one rank. `kind` is one of kFindingKinds.
struct Finding {
  std::string kind;
  int rank = 0;
  int window = -1;             // the rank's window it was found in (-1: the rank as a whole)
  bool has_batch = false;      // false: about no one batch (a shard imbalance, a rank without data)
  std::int64_t batch = 0;      // the batch it names: the spike's, the OOM's, the leak's last ...
  std::uint64_t bytes = 0;     // how much: the excess, the kept bytes per batch, what the OOM asked
  std::string site;            // the allocation site it names ("" none)
  std::string category;        // shard_imbalance: the category of what the boundary holds ("" none)
  std::string detail;          // one sentence, as the report shows it
  std::string method;          // how the window's batches were found ("recorded", an inference, "" none)
  // Evidence the pages show.
  bool oom_in_batch = false;   // oom: found in one of the window's batches (live and went_on hold)
  std::uint64_t live = 0;      // oom: allocated bytes when the allocation was refused
  bool went_on = false;        // oom: the job caught it and allocated again
  bool batches_inferred = false;  // leak, spike: its batches were inferred, not recorded
  bool operator==(const Finding&) const = default;
};

inline constexpr const char* kFindingKinds[] = {"missing", "truncated", "oom", "leak", "shard_imbalance", "spike",
                                                "unexplained"};

/// The findings of a store: its /findings table, or, for a store of an earlier format version,
/// computed from its rank files. Throws StoreError naming the file.
std::vector<Finding> read_findings(const std::filesystem::path& store);

/// A finding as summary.json and the report's pages hold it: kind, rank, batch (null where it
/// has none), bytes, site (null where none), detail, and per kind its evidence (oom: live and
/// went_on; leak and spike: batches_inferred; shard_imbalance: category).
nlohmann::json finding_json(const Finding& f);
nlohmann::json findings_json(const std::vector<Finding>& findings);

// --- the cross-rank digest: what each rule reads of a window -----------------------------------

/// /digest/windows: one window of one rank (WindowStats and WindowRecord fields of that name).
struct DigestWindowRow {
  int rank = 0;
  int window = 0;
  std::int64_t batch = 0;  // the window's batch_end
  std::string batch_method = "recorded";
  double batch_confidence = 1.0;
  std::string batch_detail;
  double growth_per_batch = 0;
  bool growth_monotone = false;
  std::string growth_site;
  double growth_site_per_batch = 0;
  double retained_per_batch = 0;
  std::string retained_site;
  std::uint32_t retained_times = 0;
  bool growth_regrown = false;
  bool cut_short = false;  // closed by an OOM or a kill, mid-batch, or damaged
  bool operator==(const DigestWindowRow&) const = default;
};

/// /digest/batches: one batch of a window (BatchStat).
struct DigestBatchRow {
  int rank = 0;
  int window = 0;
  std::int64_t batch = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t live_at_end = 0;
  std::uint64_t live_at_start = 0;
  std::uint64_t min_allocated = 0;
  std::string peak_site;
  std::uint64_t peak_site_excess = 0;
  bool oom = false;
  bool oom_went_on = false;
  std::uint64_t oom_requested = 0;
  std::uint64_t live_at_oom = 0;
  std::string oom_site;
  bool operator==(const DigestBatchRow&) const = default;
};

/// /digest/held: bytes one site holds at the window's lowest batch low point (HeldSite).
struct DigestHeldRow {
  int rank = 0;
  int window = 0;
  std::string site;
  Category category = Category::other;
  std::uint64_t bytes = 0;
  bool operator==(const DigestHeldRow&) const = default;
};

/// One window's digest as the rules read it (the rows above, grouped).
struct WindowDigest {
  int rank = 0;
  int window = 0;
  std::int64_t batch = 0;              // the window's batch_end
  std::vector<BatchStat> batches;
  std::string batch_method = "recorded";
  double batch_confidence = 1.0;
  std::string batch_detail;
  double growth_per_batch = 0;
  bool growth_monotone = false;
  std::string growth_site;
  double growth_site_per_batch = 0;
  double retained_per_batch = 0;
  std::string retained_site;
  std::uint32_t retained_times = 0;
  bool growth_regrown = false;
  std::vector<HeldSite> sites_at_low;
  bool cut_short = false;
};

/// The digest of an analysed window (`window`: its index in the rank's record).
WindowDigest window_digest(const WindowRecord& w, const WindowStats& s, int rank, int window);

/// The store's three digest tables, and the windows they make.
struct DigestTables {
  std::vector<DigestWindowRow> windows;
  std::vector<DigestBatchRow> batches;
  std::vector<DigestHeldRow> held;
  void add(const WindowDigest& d);
  std::vector<WindowDigest> windows_grouped() const;
};

/// What write_root_file adds to a store of format version 3 (StoreIndex::findings).
struct StoreFindings {
  std::vector<Finding> findings;
  DigestTables digest;
};

/// Every rule over a run: `info` its ranks and summary rows, `sites` its /sites rows, `digests`
/// every window's digest. The order is the report's: per rank its record's state and OOMs, then
/// leaks, shard imbalances, spikes, and outliers no rule explains.
std::vector<Finding> compute_findings(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                      const std::vector<WindowDigest>& digests);

/// The imbalance of peak allocated over the ranks with data (the cross page's and summary.json's
/// "imbalance"): max, median, spread, z-scores, outlier ranks and why, and each outlier's causes
/// (the kinds of its findings).
nlohmann::json peak_imbalance(const StoreInfo& info, const std::vector<Finding>& findings);

/// The findings and digest of a store of an earlier format version: every window of every rank
/// analysed again (as `memsnap aggregate` does).
StoreFindings compute_store_findings(const StoreReader& store);

}  // namespace memsnap

namespace memsnap {
template <>
struct Fields<Finding> {
  static constexpr auto list = std::tuple{
      field("kind", &Finding::kind),           field("rank", &Finding::rank),
      field("window", &Finding::window),       field("has_batch", &Finding::has_batch),
      field("batch", &Finding::batch),         field("bytes", &Finding::bytes),
      field("site", &Finding::site),           field("category", &Finding::category),
      field("detail", &Finding::detail),       field("method", &Finding::method),
      field("oom_in_batch", &Finding::oom_in_batch), field("live", &Finding::live),
      field("went_on", &Finding::went_on),     field("batches_inferred", &Finding::batches_inferred)};
};
template <>
struct Fields<DigestWindowRow> {
  static constexpr auto list = std::tuple{
      field("rank", &DigestWindowRow::rank),
      field("window", &DigestWindowRow::window),
      field("batch", &DigestWindowRow::batch),
      field("batch_method", &DigestWindowRow::batch_method),
      field("batch_confidence", &DigestWindowRow::batch_confidence),
      field("batch_detail", &DigestWindowRow::batch_detail),
      field("growth_per_batch", &DigestWindowRow::growth_per_batch),
      field("growth_monotone", &DigestWindowRow::growth_monotone),
      field("growth_site", &DigestWindowRow::growth_site),
      field("growth_site_per_batch", &DigestWindowRow::growth_site_per_batch),
      field("retained_per_batch", &DigestWindowRow::retained_per_batch),
      field("retained_site", &DigestWindowRow::retained_site),
      field("retained_times", &DigestWindowRow::retained_times),
      field("growth_regrown", &DigestWindowRow::growth_regrown),
      field("cut_short", &DigestWindowRow::cut_short)};
};
template <>
struct Fields<DigestBatchRow> {
  static constexpr auto list = std::tuple{
      field("rank", &DigestBatchRow::rank),
      field("window", &DigestBatchRow::window),
      field("batch", &DigestBatchRow::batch),
      field("peak_allocated", &DigestBatchRow::peak_allocated),
      field("live_at_end", &DigestBatchRow::live_at_end),
      field("live_at_start", &DigestBatchRow::live_at_start),
      field("min_allocated", &DigestBatchRow::min_allocated),
      field("peak_site", &DigestBatchRow::peak_site),
      field("peak_site_excess", &DigestBatchRow::peak_site_excess),
      field("oom", &DigestBatchRow::oom),
      field("oom_went_on", &DigestBatchRow::oom_went_on),
      field("oom_requested", &DigestBatchRow::oom_requested),
      field("live_at_oom", &DigestBatchRow::live_at_oom),
      field("oom_site", &DigestBatchRow::oom_site)};
};
template <>
struct Fields<DigestHeldRow> {
  static constexpr auto list = std::tuple{
      field("rank", &DigestHeldRow::rank), field("window", &DigestHeldRow::window), field("site", &DigestHeldRow::site),
      field("category", &DigestHeldRow::category), field("bytes", &DigestHeldRow::bytes)};
};
}  // namespace memsnap
