// What the cross-rank rules share: each rank's view of the run, the window digests by rank and
// batch, and the comparisons every rule makes (the median of the other ranks, the site a rank
// holds most more of). One file per rule beside this one; findings.cpp runs them in order.
//
// Every rule compares a rank with the median of all ranks (robust to the outlier itself):
//   missing/truncated  the rank's record is absent, cut short or damaged          (record_state.cpp)
//   oom              an allocation failed (what it asked for, what was allocated, where)  (oom.cpp)
//   leak             memory held at batch boundaries grows batch after batch     (leak.cpp)
//   shard_imbalance  memory held at every batch boundary is above the median     (shard_imbalance.cpp)
//   spike            one batch's peak is far above that batch's median           (spike.cpp)
//   unexplained      the rank's peak is an outlier and no rule above says why    (unexplained.cpp)
// A rule names a rank only where its own evidence shows the rank's memory to differ: an OOM the
// job caught and went on past is its `oom` finding, and the batch that failed is compared with
// nothing else (its peak is the failed attempt's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memsnap/findings.hpp"

namespace memsnap::findings {

inline constexpr std::uint64_t MiB = 1024 * 1024;

// Bytes above which a difference is worth a finding: `fraction` of the typical value, at least 1 MiB.
inline double threshold(double typical, double fraction) { return std::max(static_cast<double>(MiB), typical * fraction); }

// One site's bytes over the ranks: `zeros` ranks without it, then the others' bytes, sorted.
// The median of "the other ranks" is read off in O(log n) instead of a pass over every rank.
struct Column {
  std::size_t zeros = 0;
  std::vector<double> sorted;
  double at(std::size_t i) const { return i < zeros ? 0.0 : sorted[i - zeros]; }
  std::size_t size() const { return zeros + sorted.size(); }
  // The median without one entry equal to `mine` (the asking rank's own; `counted` false: the
  // rank is not in the column).
  double median_without(double mine, bool counted) const;
};

struct RankView {
  int rank = 0;
  std::string status = "ok";
  std::string detail;
  std::vector<const SummaryRow*> windows;
  std::uint64_t peak = 0, reserved = 0, persistent = 0, baseline = 0;
  double growth_per_batch = 0;
  std::int64_t batches = 0;
  bool has_data() const { return !windows.empty(); }
};

// How a rank's memory at batch boundaries grows (leak.cpp), kept for the spike rule.
struct Growth {
  double per_batch = 0;
  bool monotone = true;
  bool measured = false;
  std::string site;
  const WindowDigest* inferred = nullptr;  // a window whose batches were inferred
  double retained = 0;                     // kept for good per batch: the window that shows it most
  std::string retained_site;
  std::uint32_t retained_times = 0;
  bool regrown = false;                    // some window's rise is held by a regrown tensor
};

struct SiteColumn : Column {  // over the ranks with data; zeros: those without a row
  const std::string* site = nullptr;
  const std::map<int, const SiteRow*>* by_rank = nullptr;
};

// The run as the rules see it; rules later in the order read what earlier ones found (the
// leaking ranks, the OOM batches).
class Run {
 public:
  Run(const StoreInfo& info, const std::vector<SiteRow>& sites, const std::vector<WindowDigest>& digests);

  const StoreInfo& info;
  const std::vector<WindowDigest>& digests;
  std::map<int, RankView> ranks;
  std::map<std::pair<int, std::int64_t>, const WindowDigest*> digest_of;  // (rank, batch_end)
  std::map<int, std::vector<const WindowDigest*>> digests_of;             // by rank
  std::vector<double> peaks;                                              // of the ranks with data
  double peak_median = 0;
  // Each batch's peak on every rank that has it.
  std::map<std::int64_t, std::vector<std::pair<int, std::uint64_t>>> batch_peaks;
  std::map<std::pair<int, std::int64_t>, const WindowDigest*> window_of_batch;
  std::map<std::pair<int, std::int64_t>, const BatchStat*> stat_of_batch;

  // Found by the rules, for those after them.
  std::set<std::pair<int, std::int64_t>> oom_batches;  // (rank, batch) where an allocation failed
  std::set<int> leaking;
  std::map<int, Growth> growth_of;

  // A summary row of a window cut short (an OOM the job did not go on past, a damaged record).
  bool row_cut_short(const SummaryRow* w) const;
  bool digest_cut_short(const WindowDigest* d) const;
  // The median of the other ranks' peaks in a batch (0 where no other rank has it).
  double batch_median(int rank, std::int64_t batch) const;
  // The site a rank holds most more of at the peak than the median of the other ranks, in one
  // batch (a window's batch_end, as /sites names it), and by how much.
  std::pair<std::string, double> site_excess(int rank, std::int64_t batch) const;

 private:
  std::map<std::pair<std::int64_t, std::string>, std::map<int, const SiteRow*>> m_site_table;
  std::size_t m_ranks_with_data = 0;
  mutable std::map<std::int64_t, std::vector<SiteColumn>> m_columns_of_batch;
  const std::vector<SiteColumn>& columns(std::int64_t batch) const;
};

// A finding with its common fields; batch < 0 ... see has_batch.
Finding make_finding(const char* kind, int rank, int window, const std::int64_t* batch, double bytes,
                     const std::string& site, std::string detail);
// "; batch boundaries inferred (METHOD: DETAIL, confidence C)" for a window whose batches were
// inferred (d non-null), else "".
std::string inferred_note(const WindowDigest* d);
// The batch method of a rank's window ("" where there is none).
std::string method_of(const Run& run, int rank, int window);

// The rules, in the report's order.
void record_state_findings(const Run& run, std::vector<Finding>& out);
void oom_findings(Run& run, std::vector<Finding>& out);
void leak_findings(Run& run, std::vector<Finding>& out);
void shard_imbalance_findings(const Run& run, std::vector<Finding>& out);
void spike_findings(const Run& run, std::vector<Finding>& out);
void unexplained_findings(const Run& run, const std::vector<int>& outliers, std::vector<Finding>& out);

// The outlier ranks by peak allocated, with the imbalance metrics (outliers.cpp).
nlohmann::json imbalance_of(const Run& run);

}  // namespace memsnap::findings

// Small pieces of the spike rule (spike.cpp), kept apart so that tests can reach them: how far a
// batch's peak must stand out to be a spike, given how much the ranks and batches around it
// vary, and which of a rank's high batches are spikes of their own.
namespace memsnap::cross_rank_rules {

// Where ranks and batches agree to the byte, a spike is an excess of this fraction of the median
// peak (the spike16 loop's longer sequence lifts one batch 16 %; a batch's random variation in
// the real loops is 0 there). Where they vary, the limit grows with that variation (kSpikeSigmas
// robust standard deviations) up to the fixed ceiling that keeps variable-length loops quiet.
inline constexpr double kSpikeFloor = 0.05;
inline constexpr double kSpikeCeiling = 0.25;
inline constexpr double kSpikeSigmas = 10.0;

// A robust spread: 1.4826 x the median absolute deviation from the median (the standard deviation
// for normal data; 0 when more than half the values are equal). 0 for fewer than two values.
double robust_spread(std::vector<double> values);

// The bytes a batch's peak must exceed both the other ranks' peaks in that batch and the rank's
// own other batches by: max(1 MiB, kSpikeFloor x median peak, min(kSpikeCeiling x median peak,
// kSpikeSigmas x spread)), `spread` the larger of the two robust spreads (other ranks in that
// batch; the rank's other batches).
double spike_limit(double median_peak, double spread);

// Of a rank's high batches (batch number, excess), ascending by batch, those that are spikes of
// their own: in a run of consecutive batches only the highest. The batch after a spike holds the
// spike's outputs until the loop rebinds their names, so it stands out less, for the same cause.
std::vector<std::pair<std::int64_t, double>> distinct_spikes(const std::vector<std::pair<std::int64_t, double>>& high);

}  // namespace memsnap::cross_rank_rules
