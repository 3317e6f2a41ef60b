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
//
// Each part of a window's digest is one struct with one field table (below): WindowFacts (the
// window), BatchStat and HeldSite (memsnap/analysis.hpp). The store's rows are those parts under
// the window's DigestKey (DigestRow), their columns the key's then the part's; WindowDigest is a
// window's row with its batches and held sites grouped under it.

/// The window a digest row belongs to: the rank, and the window's index in the rank's record.
struct DigestKey {
  int rank = 0;
  int window = 0;
  bool operator==(const DigestKey&) const = default;
};

/// What the rules read of one window besides its batches: how its batches were found
/// (WindowRecord's fields of that name), how its low points grow (WindowStats), and whether it
/// was cut short.
struct WindowFacts : WindowGrowth {
  std::int64_t batch = 0;  // the window's batch_end
  std::string batch_method = "recorded";
  double batch_confidence = 1.0;
  std::string batch_detail;
  bool cut_short = false;  // closed by an OOM or a kill, mid-batch, or damaged
  bool operator==(const WindowFacts&) const = default;
};

/// One row of a digest table: a part of one window's digest under the window's key.
template <class Part>
struct DigestRow : DigestKey, Part {
  bool operator==(const DigestRow&) const = default;
};

using DigestWindowRow = DigestRow<WindowFacts>;  // /digest/windows: one per (rank, window)
using DigestBatchRow = DigestRow<BatchStat>;     // /digest/batches: one per batch of a window
using DigestHeldRow = DigestRow<HeldSite>;       // /digest/held: one per site at the lowest low point

/// One window's digest as the rules read it: its row, with its batches and held sites.
struct WindowDigest : DigestWindowRow {
  std::vector<BatchStat> batches;
  std::vector<HeldSite> sites_at_low;
};

/// The digest of an analysed window (`window`: its index in the rank's record).
WindowDigest window_digest(const WindowRecord& w, const WindowStats& s, int rank, int window);

/// The store's three digest tables, and the windows they make.
struct DigestTables {
  std::vector<DigestWindowRow> windows;
  std::vector<DigestBatchRow> batches;
  std::vector<DigestHeldRow> held;
  void add(const WindowDigest& d);
  void append(const DigestTables& more);
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

/// Each window's analysis as a store of format version 3 keeps it (`info`'s /summary rows, the
/// /sites rows, /digest), indexed by rank then window: what analyse_window gave when the store was
/// written, without replaying a window (`memsnap report`). Not kept, so left at their defaults:
/// reserved_seen, and the window's oom_site, live_at_oom and oom_went_on where its first OOM came
/// before its first batch (an OOM in a batch has them in that BatchStat).
std::vector<std::vector<WindowStats>> stored_window_stats(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                                          const DigestTables& digest);
/// The same, read from `store`. Throws StoreError for a store without /digest (has_findings
/// false): analyse_window its windows instead.
std::vector<std::vector<WindowStats>> stored_window_stats(const StoreReader& store);

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
// The digest's field tables: a store column per field, in this order (stores already written
// keep reading); the rows' tables are the key's then the part's.
template <>
struct Fields<DigestKey> {
  static constexpr auto list = std::tuple{field("rank", &DigestKey::rank), field("window", &DigestKey::window)};
};
template <>
struct Fields<WindowGrowth> {
  static constexpr auto list = std::tuple{field("growth_per_batch", &WindowGrowth::growth_per_batch),
                                          field("growth_monotone", &WindowGrowth::growth_monotone),
                                          field("growth_site", &WindowGrowth::growth_site),
                                          field("growth_site_per_batch", &WindowGrowth::growth_site_per_batch),
                                          field("retained_per_batch", &WindowGrowth::retained_per_batch),
                                          field("retained_site", &WindowGrowth::retained_site),
                                          field("retained_times", &WindowGrowth::retained_times),
                                          field("growth_regrown", &WindowGrowth::growth_regrown)};
};
template <>
struct Fields<WindowFacts> {
  static constexpr auto list =
      std::tuple_cat(std::tuple{field("batch", &WindowFacts::batch), field("batch_method", &WindowFacts::batch_method),
                                field("batch_confidence", &WindowFacts::batch_confidence),
                                field("batch_detail", &WindowFacts::batch_detail)},
                     Fields<WindowGrowth>::list, std::tuple{field("cut_short", &WindowFacts::cut_short)});
};
template <>
struct Fields<BatchStat> {
  static constexpr auto list = std::tuple{field("batch", &BatchStat::batch),
                                          field("peak_allocated", &BatchStat::peak_allocated),
                                          field("live_at_end", &BatchStat::live_at_end),
                                          field("live_at_start", &BatchStat::live_at_start),
                                          field("min_allocated", &BatchStat::min_allocated),
                                          field("peak_site", &BatchStat::peak_site),
                                          field("peak_site_excess", &BatchStat::peak_site_excess),
                                          field("oom", &BatchStat::oom),
                                          field("oom_went_on", &BatchStat::oom_went_on),
                                          field("oom_requested", &BatchStat::oom_requested),
                                          field("live_at_oom", &BatchStat::live_at_oom),
                                          field("oom_site", &BatchStat::oom_site)};
};
template <>
struct Fields<HeldSite> {  // the column of the site's name is "site"
  static constexpr auto list = std::tuple{field("site", &HeldSite::name), field("category", &HeldSite::category),
                                          field("bytes", &HeldSite::bytes)};
};
template <class Part>
struct Fields<DigestRow<Part>> {
  static constexpr auto list = std::tuple_cat(Fields<DigestKey>::list, Fields<Part>::list);
};
template <>
struct Fields<DigestTables> {  // how the aggregator's ranks send their windows' digest to rank 0
  static constexpr auto list = std::tuple{field("windows", &DigestTables::windows), field("batches", &DigestTables::batches),
                                          field("held", &DigestTables::held)};
};
}  // namespace memsnap
