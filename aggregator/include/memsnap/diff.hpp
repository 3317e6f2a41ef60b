// `memsnap diff`: what changed in memory between two runs (or two windows of one run), on every
// rank, at which line. The comparison is data: typed results here, `diff.json` written from them;
// the pages (report/) and the command (launchers/) only read them.
//
// Alignment: ranks by rank number; a rank's windows by the batch they close at, else by order;
// sites by code path: the same function, file and line, else the same function and file at
// another line (a fix moves lines: the site is then said to have "moved"); allocations without
// frames by their category.
// Noise: a change is named only beyond the runs' own variation: the larger of the ranks' spread
// of peaks (1.4826 x MAD over ranks) and the batches' spread (the median rank's 1.4826 x MAD of the
// steps from one batch peak to the next, over sqrt 2: a steady rise, a leak, is not noise), on
// either side, times 3, and never less than max(1 MiB, 1 % of the median peak). The same loop run twice reads "no change in memory beyond noise".
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/store.hpp"

namespace memsnap::diff {

/// diff.json's format version.
inline constexpr int kDiffFormatVersion = 1;

/// One side of a diff: a store, optionally narrowed to one window of one rank (two windows of
/// one run: "batch 40 against batch 4").
struct SideSpec {
  std::filesystem::path store;
  std::string label;                    // what the user named (a run folder, pickles, a store)
  std::optional<int> rank;              // with batch: only this rank's window
  std::optional<std::int64_t> batch;    // the window, named by the batch it closed at
};

/// One window of a side: its /summary row, its /sites rows, and its digest (each batch's peak
/// and low point, kept memory, growth: the store's /digest, else the window analysed again).
struct WindowData {
  SummaryRow row;
  std::vector<SiteRow> sites;  // bytes at the peak by site
  WindowDigest digest;
};

struct RankData {
  int rank = 0;
  std::string status = "ok";
  std::vector<WindowData> windows;
};

/// Everything one side of the diff reads from its store.
struct SideData {
  SideSpec spec;
  StoreInfo info;               // the whole run's index
  std::vector<RankData> ranks;  // by rank; only the selected rank with SideSpec::rank
  std::vector<Finding> findings;  // the store's (read_findings), or computed for an older store
};

/// Reads a side: the store's index, sites, digest and findings (memsnap/findings.hpp). A store
/// written before /findings existed has its (selected) windows analysed again, on every core.
/// Throws memsnap::Error naming the store and what is wrong.
SideData load_side(const SideSpec& spec);

/// A number on both sides.
struct Pair {
  std::uint64_t base = 0;
  std::uint64_t now = 0;
  std::int64_t delta() const { return static_cast<std::int64_t>(now) - static_cast<std::int64_t>(base); }
};

/// A site (code path) on one rank, or summed over the ranks.
struct SiteDelta {
  std::string key;          // the site's name on the new side, else the base's ("<no stack> [category]" without frames)
  std::string base_name;    // the site's full name on each side ("" where the side lacks it)
  std::string new_name;
  Category category = Category::other;
  Pair bytes;               // at the peak
  bool moved = false;       // the same function and file at another line
  // Over the ranks only: the rank whose bytes changed most, by how much, and how many ranks'
  // bytes changed beyond noise.
  int top_rank = -1;
  std::int64_t top_rank_delta = 0;
  int ranks_changed = 0;
  bool beyond_noise = false;
};

/// One batch of a rank on both sides (aligned by batch number, else by order).
struct BatchPair {
  std::int64_t base_batch = -1, new_batch = -1;  // -1: the side has no such batch
  Pair peak;
  Pair low;                 // the batch's low point (what it holds on to)
};

/// Bytes at the peak by stack, both sides in one tree (the differential flame graph): frames from
/// the outermost down, matched by function and file (a line may move); a leaf's category is its
/// site's. Built from each site's representative stack (SiteRow::stack_id).
struct StackNode {
  std::string name, file;
  std::uint32_t line = 0;
  Pair bytes;
  int category = -1;  // at a site's own node, else -1
  std::vector<StackNode> children;
};

struct RankDiff {
  int base_rank = 0, new_rank = 0;
  std::string base_status = "ok", new_status = "ok";
  Pair peak_allocated, peak_reserved, persistent, live_at_close, fragmentation;
  std::array<Pair, kCategoryCount> categories{};  // bytes at the peak
  Pair kept_per_batch;                             // leaked bytes a batch (WindowStats::retained_per_batch)
  std::string kept_site_base, kept_site_new;
  std::vector<BatchPair> batches;
  std::vector<SiteDelta> sites;  // beyond noise first, by |delta|
  std::optional<StackNode> stacks;  // add_stacks: ranks that changed only
  bool changed = false;          // an allocated number above (not reserved) is beyond noise
  bool reserved_changed = false; // peak reserved is: the allocator's cache, partly from before the window
  std::string what_changed;      // "peak allocated", "persistent", ...
};

struct FindingChange {
  std::string state;        // resolved | new | still
  Finding base, now;        // the side that lacks it holds kind "" there
};

struct Noise {
  std::uint64_t rank_spread = 0;   // bytes
  std::uint64_t batch_spread = 0;  // bytes
  std::uint64_t floor = 0;         // max(1 MiB, 1 % of the median peak)
  std::uint64_t threshold = 0;     // what a change must exceed
  std::string how;                 // in words, for the page and diff.json
};

struct DiffOptions {
  std::size_t top_sites = 50;      // sites kept in the result, over the ranks and per rank
  std::optional<double> fail_on_growth;
};

struct DiffResult {
  std::string base_label, new_label;
  std::string base_run, new_run;
  int base_world = 0, new_world = 0;
  bool windows_mode = false;       // two windows (SideSpec::rank on a side)
  Noise noise;
  std::vector<RankDiff> ranks;     // every aligned rank
  std::vector<int> ranks_only_base, ranks_only_new;
  Pair median_peak, max_peak;      // over the ranks, each side's own
  std::array<Pair, kCategoryCount> categories{};  // summed over the ranks
  std::vector<SiteDelta> sites;    // over the ranks, beyond noise first, by |delta|
  std::vector<FindingChange> findings;
  int ranks_changed = 0;
  bool no_change = true;           // nothing beyond noise, no finding resolved or new
  std::string headline;
  // --fail-on-growth: the rank whose peak grew most beyond noise (as a fraction of its base peak)
  // when that is over the gate, and the site that grew most on it.
  bool growth_failed = false;
  std::string growth_line;
};

/// Compares two sides.
DiffResult compare(const SideData& base, const SideData& now, const DiffOptions& options = {});

/// Reads the stacks of the sites at the peak of the ranks that changed (at most `max_ranks`, the
/// largest changes first) from both stores and fills RankDiff::stacks. Throws memsnap::Error.
void add_stacks(DiffResult& result, const SideData& base, const SideData& now, std::size_t max_ranks = 64);

/// diff.json: every number the pages show. `pages` maps base rank -> the rank page's file name.
nlohmann::json to_json(const DiffResult& result, const std::vector<std::pair<int, std::string>>& pages = {});

/// The lines `memsnap diff` prints: the headline, the ranks that changed most, the sites that
/// grew and shrank most, the findings resolved and new (the caller adds where the pages are).
std::vector<std::string> summary_lines(const DiffResult& result);

/// A site's code path: "f (file:12)" -> "f (file)", its line 12; a name without a line as is, 0.
std::pair<std::string, int> site_key(const std::string& site_name);

}  // namespace memsnap::diff
