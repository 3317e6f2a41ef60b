// Where ranks differ: imbalance metrics and the findings of the cross-rank page and summary.json.
//
// Every rule compares a rank with the median of all ranks (robust to the outlier itself):
//   shard_imbalance  memory held at every batch boundary is above the median, and does not grow
//   leak             memory held at batch boundaries grows batch after batch, faster than the median
//   spike            one batch's peak is far above that batch's median while its other batches are not
//   oom              an allocation failed
//   missing/truncated  the rank's record is absent, cut short or damaged
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "memsnap/aggregate.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/report.hpp"

namespace memsnap {
namespace {

using nlohmann::json;
constexpr std::uint64_t MiB = 1024 * 1024;

// Bytes above which a difference is worth a finding: `fraction` of the typical value, at least 1 MiB.
double threshold(double typical, double fraction) { return std::max(static_cast<double>(MiB), typical * fraction); }

// One site's bytes over the ranks: `zeros` ranks without it, then the others' bytes, sorted.
// The median of "the other ranks" is read off in O(log n) instead of a pass over every rank.
struct Column {
  std::size_t zeros = 0;
  std::vector<double> sorted;
  double at(std::size_t i) const { return i < zeros ? 0.0 : sorted[i - zeros]; }
  std::size_t size() const { return zeros + sorted.size(); }
  // The median without one entry equal to `mine` (the asking rank's own; `counted` false: the
  // rank is not in the column).
  double median_without(double mine, bool counted) const {
    std::size_t skip = size();
    if (counted && mine == 0 && zeros > 0) {
      skip = 0;
    } else if (counted) {
      skip = zeros + static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), mine) - sorted.begin());
    }
    const std::size_t n = size() - (counted ? 1 : 0);
    auto nth = [&](std::size_t i) { return at(i < skip ? i : i + 1); };
    return n == 0 ? 0 : n % 2 ? nth(n / 2) : (nth(n / 2 - 1) + nth(n / 2)) / 2;
  }
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

}  // namespace

CrossRankResult cross_rank_analysis(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                    const std::vector<WindowDigest>& digests) {
  std::map<int, RankView> ranks;
  for (const auto& r : info.ranks) {
    ranks[r.rank].rank = r.rank;
    ranks[r.rank].status = r.status;
    ranks[r.rank].detail = r.status_detail;
  }
  for (const auto& row : info.rows) {
    auto& v = ranks[row.rank];
    v.rank = row.rank;
    if (row.window >= 0) v.windows.push_back(&row);
  }
  for (auto& [r, v] : ranks) {
    v.baseline = UINT64_MAX;
    v.persistent = UINT64_MAX;
    std::int64_t growth = 0;
    for (const auto* w : v.windows) {
      v.peak = std::max(v.peak, w->peak_allocated);
      v.reserved = std::max(v.reserved, w->peak_reserved);
      v.persistent = std::min(v.persistent, w->persistent);
      v.baseline = std::min(v.baseline, w->live_at_open);
      // Growth counts only windows that closed at a batch boundary: one cut short by an OOM or
      // a kill closed mid-batch, holding that batch's working memory.
      if (w->oom || w->status != "ok") continue;
      growth += static_cast<std::int64_t>(w->live_at_close) - static_cast<std::int64_t>(w->live_at_open);
      v.batches += w->batch_end - w->batch_start + 1;
    }
    if (v.windows.empty()) v.baseline = v.persistent = 0;
    v.growth_per_batch = v.batches > 0 ? static_cast<double>(growth) / static_cast<double>(v.batches) : 0;
  }

  std::vector<double> peaks;
  for (const auto& [r, v] : ranks) {
    if (!v.has_data()) continue;
    peaks.push_back(static_cast<double>(v.peak));
  }
  const double peak_median = median(peaks);

  // Imbalance of peak allocated: max/median, spread, z-scores, and outliers by a robust rule
  // (distance from the median in units of the median absolute deviation; with identical peers,
  // more than 5 % above the median).
  json imbalance;
  {
    double mean = 0, sq = 0, max = 0, min = peaks.empty() ? 0 : peaks.front();
    for (double p : peaks) {
      mean += p;
      max = std::max(max, p);
      min = std::min(min, p);
    }
    mean = peaks.empty() ? 0 : mean / static_cast<double>(peaks.size());
    for (double p : peaks) sq += (p - mean) * (p - mean);
    const double sd = peaks.size() > 1 ? std::sqrt(sq / static_cast<double>(peaks.size())) : 0;
    std::vector<double> dev;
    for (double p : peaks) dev.push_back(std::fabs(p - peak_median));
    const double mad = median(dev) * 1.4826;
    json z = json::array(), outliers = json::array(), reasons = json::object();
    for (const auto& [r, v] : ranks) {
      if (!v.has_data()) {
        z.push_back(nullptr);
        continue;
      }
      const double p = static_cast<double>(v.peak);
      z.push_back(sd > 0 ? (p - mean) / sd : 0.0);
      const bool far = mad > 0 ? (p - peak_median) / mad > 3.5 : p > peak_median * 1.05;
      if (far && p - peak_median > static_cast<double>(MiB)) {
        outliers.push_back(r);
        char why[160];
        std::snprintf(why, sizeof why, "peak %.2fx the median (%s over)", peak_median > 0 ? p / peak_median : 0.0,
                      human_bytes(bytes_of(p - peak_median)).c_str());
        reasons[std::to_string(r)] = why;
      }
    }
    imbalance = {{"metric", "peak_allocated"},
                 {"max", bytes_of(max)},
                 {"median", bytes_of(peak_median)},
                 {"max_over_median", peak_median > 0 ? max / peak_median : 0.0},
                 {"peak_max_over_median", peak_median > 0 ? max / peak_median : 0.0},
                 {"spread", bytes_of(max - min)},
                 {"zscores", std::move(z)},
                 {"outlier_ranks", std::move(outliers)},
                 {"outlier_reasons", std::move(reasons)}};
  }

  // Sites at the peak, by (batch, site) then rank.
  std::map<std::pair<std::int64_t, std::string>, std::map<int, const SiteRow*>> site_table;
  for (const auto& s : sites) site_table[{s.batch, s.site}][s.rank] = &s;
  // The site a rank holds most more of than the median of the other ranks, in one batch. Asked
  // once per finding, and a run can have a finding on most of its ranks: each (batch, site) is a
  // Column over the ranks with data (ranks without a row count as 0).
  struct SiteColumn : Column {  // over the ranks with data; zeros: those without a row
    const std::string* site = nullptr;
    const std::map<int, const SiteRow*>* by_rank = nullptr;
  };
  std::size_t ranks_with_data = 0;
  for (const auto& [r, v] : ranks) ranks_with_data += v.has_data() ? 1 : 0;
  std::map<std::int64_t, std::vector<SiteColumn>> columns_of_batch;
  auto columns = [&](std::int64_t batch) -> const std::vector<SiteColumn>& {
    auto [it, inserted] = columns_of_batch.try_emplace(batch);
    if (!inserted) return it->second;
    const auto first = site_table.lower_bound({batch, std::string()});
    for (auto k = first; k != site_table.end() && k->first.first == batch; ++k) {
      SiteColumn col;
      col.site = &k->first.second;
      col.by_rank = &k->second;
      for (const auto& [r, row] : k->second) {
        auto v = ranks.find(r);
        if (v != ranks.end() && v->second.has_data()) col.sorted.push_back(static_cast<double>(row->bytes_at_peak));
      }
      std::sort(col.sorted.begin(), col.sorted.end());
      col.zeros = ranks_with_data - col.sorted.size();
      it->second.push_back(std::move(col));
    }
    return it->second;
  };
  auto site_excess = [&](int rank, std::int64_t batch) -> std::pair<std::string, double> {
    std::string best;
    double best_excess = 0;
    auto self = ranks.find(rank);
    const bool counted = self != ranks.end() && self->second.has_data();
    for (const SiteColumn& col : columns(batch)) {
      auto it = col.by_rank->find(rank);
      const double mine = it == col.by_rank->end() ? 0 : static_cast<double>(it->second->bytes_at_peak);
      const double excess = mine - col.median_without(mine, counted);
      if (excess > best_excess) {
        best_excess = excess;
        best = *col.site;
      }
    }
    return {best, best_excess};
  };
  auto site_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };

  json findings = json::array();
  std::set<int> leaking;
  for (const auto& [r, v] : ranks) {
    if (v.status != "ok") {
      const bool missing = v.status == "missing";
      findings.push_back({{"kind", missing ? "missing" : "truncated"},
                          {"rank", r},
                          {"batch", v.windows.empty() ? json(nullptr) : json(v.windows.back()->batch_end)},
                          {"bytes", 0},
                          {"site", nullptr},
                          {"detail", missing ? "rank " + std::to_string(r) + " left no record (no spill file)"
                                             : "rank " + std::to_string(r) + "'s record is " + v.status +
                                                   (v.detail.empty() ? "" : ": " + v.detail)}});
    }
    for (const auto* w : v.windows) {
      if (!w->oom) continue;
      findings.push_back({{"kind", "oom"},
                          {"rank", r},
                          {"batch", w->batch_end},
                          {"bytes", w->oom_requested},
                          {"site", nullptr},
                          {"detail", "rank " + std::to_string(r) + " ran out of memory in batch " +
                                         std::to_string(w->batch_end) + " asking for " + human_bytes(w->oom_requested) +
                                         " with " + human_bytes(w->peak_allocated) + " allocated"}});
    }
  }

  // Leak: growth per batch above the median's, held batch after batch (never released).
  // Growth is measured from one batch start to the next inside each window that closed at a
  // batch boundary (a window cut short by an OOM or a kill holds that batch's working memory);
  // windows without batches inside fall back to open-to-close over their batch range.
  std::map<int, std::vector<const WindowDigest*>> digests_of;
  for (const auto& d : digests) digests_of[d.rank].push_back(&d);
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
  std::map<int, Growth> growth_of;
  for (auto& [r, v] : ranks) {
    Growth g;
    double sum = 0, spans = 0;
    for (const auto* d : digests_of[r]) {
      if (d->cut_short || d->batches.size() < 2) continue;
      const double n = static_cast<double>(d->batches.size() - 1);
      sum += d->growth_per_batch * n;
      spans += n;
      g.monotone &= d->growth_monotone;
      if (!d->growth_site.empty()) g.site = d->growth_site;
      if (d->batch_method != "recorded") g.inferred = d;
      // The window that shows it keeping the most: a window too short to see a code path allocate
      // twice shows nothing, which is no evidence that it keeps nothing.
      g.regrown |= d->growth_regrown;
      if (d->retained_per_batch > g.retained) {
        g.retained = d->retained_per_batch;
        g.retained_site = d->retained_site;
        g.retained_times = d->retained_times;
      }
      for (const auto& b : d->batches) v.baseline = std::min<std::uint64_t>(v.baseline, b.min_allocated);
    }
    if (spans > 0) {
      g.per_batch = sum / spans;
      g.measured = true;
    } else if (v.batches >= 2) {
      g.per_batch = v.growth_per_batch;
      g.measured = true;
      for (const auto* d : digests_of[r]) {
        if (d->cut_short) continue;
        for (std::size_t i = 1; i < d->batches.size(); ++i) g.monotone &= d->batches[i].live_at_end >= d->batches[i - 1].live_at_end;
      }
    }
    growth_of[r] = g;
  }
  std::vector<double> measured_growths;
  for (const auto& [r, g] : growth_of) {
    if (g.measured) measured_growths.push_back(g.per_batch);
  }
  // With fewer than three ranks there is no majority to call normal: growth itself is the excess.
  const double growth_norm = measured_growths.size() >= 3 ? median(measured_growths) : 0.0;
  auto inferred_note = [](const WindowDigest* d) -> std::string {
    if (d == nullptr) return "";
    char c[48];
    std::snprintf(c, sizeof c, "%.2f", d->batch_confidence);
    return "; batch boundaries inferred (" + d->batch_method + ": " + d->batch_detail + ", confidence " + c + ")";
  };
  // Two kinds of evidence. Memory kept for good (a site whose allocations from separate times
  // of the window are all still held at its end) is judged on its own, not against the other
  // ranks: a leak in the code every rank runs is on every rank. Low points that rise faster than
  // the median rank's catch what is kept by regrowing one tensor (torch.cat onto a running
  // result frees the last one), which keeps nothing from earlier times.
  const double keep_floor = threshold(peak_median, 0.0002);
  std::size_t keeping_ranks = 0;
  for (const auto& [r, g] : growth_of) keeping_ranks += g.measured && g.retained > keep_floor;
  for (const auto& [r, v] : ranks) {
    const Growth& g = growth_of[r];
    if (!v.has_data() || !g.measured) continue;
    const double excess = g.per_batch - growth_norm;
    // Rising low points alone are a leak where a code path regrows a tensor: they also rise
    // with the batches' own inputs (a run of longer batches, a mixture of experts' routing).
    const bool rising = g.monotone && excess > threshold(peak_median, 0.002) && g.regrown;
    const bool keeping = g.retained > keep_floor;
    if (!rising && !keeping) continue;
    leaking.insert(r);
    const double bytes = keeping ? g.retained : excess;
    std::string site = keeping && !g.retained_site.empty() ? g.retained_site : g.site;
    if (site.empty()) site = site_excess(r, v.windows.back()->batch_end).first;
    std::string detail = "rank " + std::to_string(r) + " keeps " + human_bytes(bytes_of(bytes)) + " more after every batch";
    if (keeping) {
      detail += (site.empty() ? std::string(": memory") : ", held by " + site + ": memory") + " allocated at " +
                std::to_string(g.retained_times) + " separate times of the window is all still held at its end";
      if (keeping_ranks >= 3 && keeping_ranks * 2 > measured_growths.size()) {
        detail += "; " + std::to_string(keeping_ranks - 1) + " other ranks do the same, so the leak is in code every rank runs";
      }
    } else {
      detail += std::string(" than ") +
                (measured_growths.size() >= 3 ? "the other ranks" : "it started the batch before with") +
                (site.empty() ? "" : ", held by " + site);
    }
    findings.push_back({{"kind", "leak"},
                        {"rank", r},
                        {"batch", v.windows.back()->batch_end},
                        {"bytes", bytes_of(bytes)},
                        {"site", site_or_null(site)},
                        {"batches_inferred", g.inferred != nullptr},
                        {"detail", detail + inferred_note(g.inferred)}});
  }

  // Shard imbalance: more memory held at every batch boundary than the median, not growing.
  // The median leaves the leaking ranks out: their boundary memory says nothing about shards.
  std::vector<double> steady;
  for (const auto& [r, v] : ranks) {
    if (v.has_data() && !leaking.count(r)) steady.push_back(static_cast<double>(v.baseline));
  }
  const double baseline_median = median(steady);
  // What a rank holds at its lowest batch boundary, by site: the window with the lowest one.
  std::map<int, const WindowDigest*> low_of;
  for (const auto& [r, list] : digests_of) {
    for (const auto* d : list) {
      if (d->batches.empty() || d->sites_at_low.empty()) continue;
      auto lowest = [](const WindowDigest* x) {
        std::uint64_t m = UINT64_MAX;
        for (const auto& b : x->batches) m = std::min(m, b.min_allocated);
        return m;
      };
      if (!low_of.count(r) || lowest(d) < lowest(low_of[r])) low_of[r] = d;
    }
  }
  // Each site's bytes there over those ranks.
  std::map<std::string, Column> held_columns;
  for (const auto& [r, d] : low_of) {
    for (const auto& h : d->sites_at_low) held_columns[h.name].sorted.push_back(static_cast<double>(h.bytes));
  }
  for (auto& [name, col] : held_columns) {
    std::sort(col.sorted.begin(), col.sorted.end());
    col.zeros = low_of.size() - col.sorted.size();
  }
  // The site a rank holds most more of there than the median of the other ranks.
  auto held_excess = [&](int rank) -> const HeldSite* {
    auto self = low_of.find(rank);
    if (self == low_of.end()) return nullptr;
    const HeldSite* best = nullptr;
    double best_excess = 0;
    for (const auto& h : self->second->sites_at_low) {
      const double mine = static_cast<double>(h.bytes);
      const double excess = mine - held_columns[h.name].median_without(mine, true);
      if (excess > best_excess) {
        best_excess = excess;
        best = &h;
      }
    }
    return best;
  };
  for (const auto& [r, v] : ranks) {
    if (!v.has_data() || leaking.count(r)) continue;
    const double excess = static_cast<double>(v.baseline) - baseline_median;
    if (excess <= threshold(baseline_median, 0.02)) continue;
    // Named by what the boundary holds; without boundaries, by what the peak holds.
    const HeldSite* held = held_excess(r);
    const std::string site = held != nullptr ? held->name : site_excess(r, v.windows.front()->batch_end).first;
    std::string detail = "rank " + std::to_string(r) + " holds " + human_bytes(bytes_of(excess)) +
                         " more than the median rank at every batch boundary";
    if (held != nullptr && held->category == Category::optimizer_state) {
      // Lazy optimizer state (Adam's moments) appears at a parameter's first gradient.
      detail += ", most of it optimizer state at " + site +
                ": an optimizer makes a parameter's state at its first gradient, so this rank has trained "
                "parameters the median rank has not yet (experts its tokens were routed to, rows of an "
                "embedding), or holds more of a sharded optimizer's state";
    } else {
      detail += (site.empty() ? "" : ", most of it at " + site) + "; sharded state should be equal across ranks" +
                (site == "<no stack>" ? " (allocated before recording began, so without frames: start "
                                        "recording earlier to see where)"
                                      : "");
    }
    findings.push_back({{"kind", "shard_imbalance"},
                        {"rank", r},
                        {"batch", nullptr},
                        {"bytes", bytes_of(excess)},
                        {"site", site_or_null(site)},
                        {"category", held != nullptr ? json(category_name(held->category)) : json(nullptr)},
                        {"detail", detail}});
  }

  // Spike: one batch's peak far above that batch's median across ranks, and far above the
  // rank's own other batches (a rank whose batches all differ in size is not spiking).
  std::map<std::int64_t, std::vector<std::pair<int, std::uint64_t>>> batch_peaks;
  std::map<std::pair<int, std::int64_t>, const WindowDigest*> window_of_batch;
  std::map<std::pair<int, std::int64_t>, const BatchStat*> stat_of_batch;
  for (const auto& d : digests) {
    for (const auto& b : d.batches) {
      batch_peaks[b.batch].emplace_back(d.rank, b.peak_allocated);
      window_of_batch[{d.rank, b.batch}] = &d;
      stat_of_batch[{d.rank, b.batch}] = &b;
    }
  }
  const bool few_ranks = peaks.size() < 3;
  std::map<int, std::vector<std::pair<std::int64_t, double>>> excess_of;  // rank -> (batch, excess)
  for (const auto& [batch, list] : batch_peaks) {
    std::vector<double> values;
    for (const auto& [r, p] : list) values.push_back(static_cast<double>(p));
    const double med = median(values);
    for (const auto& [r, p] : list) excess_of[r].emplace_back(batch, static_cast<double>(p) - med);
  }
  for (const auto& [r, list] : excess_of) {
    if (list.size() < 2) continue;
    const double limit = threshold(peak_median, 0.25);
    // A leaking rank's peaks rise with its leak: that rise is the leak, not a spike.
    const double trend = leaking.count(r) ? growth_of[r].per_batch : 0.0;
    const std::int64_t first_batch = list.front().first;
    auto detrended = [&](std::int64_t b) {
      return static_cast<double>(stat_of_batch[{r, b}]->peak_allocated) -
             trend * (static_cast<double>(b) - static_cast<double>(first_batch));
    };
    auto own_excess = [&](std::int64_t batch) {
      std::vector<double> others;
      for (const auto& [b, e] : list) {
        if (b != batch) others.push_back(detrended(b));
      }
      return detrended(batch) - median(others);
    };
    std::vector<std::pair<std::int64_t, double>> high;
    for (const auto& [b, raw] : list) {
      const double e = raw - trend * (static_cast<double>(b) - static_cast<double>(first_batch));
      const double own = own_excess(b);
      if ((few_ranks || e > limit) && own > limit) high.emplace_back(b, few_ranks ? own : std::min(e, own));
    }
    if (high.empty() || high.size() * 3 > list.size()) continue;
    for (const auto& [b, e] : high) {
      const WindowDigest* d = window_of_batch[{r, b}];
      std::string site = stat_of_batch[{r, b}]->peak_site;
      if (site.empty()) site = site_excess(r, d->batch).first;
      findings.push_back({{"kind", "spike"},
                          {"rank", r},
                          {"batch", b},
                          {"bytes", bytes_of(e)},
                          {"site", site_or_null(site)},
                          {"batches_inferred", d->batch_method != "recorded"},
                          {"detail", "rank " + std::to_string(r) + " peaks " + human_bytes(bytes_of(e)) +
                                         " above " + (few_ranks ? "its other batches" : "the other ranks") + " in batch " +
                                         std::to_string(b) + " only" + (site.empty() ? "" : ", at " + site) +
                                         inferred_note(d->batch_method != "recorded" ? d : nullptr)}});
    }
  }

  // Where ranks differ: per site, bytes at the peak by rank, in the batch most ranks recorded.
  std::map<std::int64_t, int> batch_count;
  for (const auto& row : info.rows) {
    if (row.window >= 0) ++batch_count[row.batch_end];
  }
  std::int64_t common_batch = 0;
  int best = -1;
  for (const auto& [b, n] : batch_count) {
    if (n > best) {
      best = n;
      common_batch = b;
    }
  }
  json site_stack_of = json::object();
  for (const auto& d : digests) {
    for (const auto& [name, frames] : d.site_stacks.items()) {
      if (!site_stack_of.contains(name)) site_stack_of[name] = frames;
    }
  }
  // Max and min over the ranks with data (0 where a rank has no row), without a vector of every
  // rank per site: a run whose ranks each name their own sites has about sites x ranks of them.
  struct Diff {
    const std::string* site = nullptr;
    const std::map<int, const SiteRow*>* by_rank = nullptr;
    int max_rank = 0, min_rank = 0;
    std::uint64_t delta = 0;
    Category category = Category::other;
  };
  std::vector<Diff> diffs;
  const int world = std::max(info.world_size, ranks.empty() ? 0 : ranks.rbegin()->first + 1);
  std::vector<int> data_ranks;  // ascending
  for (const auto& [r, v] : ranks) {
    if (v.has_data() && r < world) data_ranks.push_back(r);
  }
  const auto first_site = site_table.lower_bound({common_batch, std::string()});
  for (auto k = first_site; k != site_table.end() && k->first.first == common_batch; ++k) {
    const auto& by_rank = k->second;
    Diff d;
    d.site = &k->first.second;
    d.by_rank = &by_rank;
    std::uint64_t hi = 0, row_lo = UINT64_MAX;
    int row_lo_rank = 0;
    std::size_t rows = 0;
    for (const auto& [r, row] : by_rank) {
      d.category = row->category;
      auto v = ranks.find(r);
      if (r >= world || v == ranks.end() || !v->second.has_data()) continue;
      ++rows;
      if (row->bytes_at_peak > hi) {
        hi = row->bytes_at_peak;
        d.max_rank = r;
      }
      if (row->bytes_at_peak < row_lo) {
        row_lo = row->bytes_at_peak;
        row_lo_rank = r;
      }
    }
    // The first rank with data and no row holds 0 of it: found within rows + 1 steps.
    int first_without = -1;
    if (rows < data_ranks.size()) {
      for (int r : data_ranks) {
        if (!by_rank.count(r)) {
          first_without = r;
          break;
        }
      }
    }
    std::uint64_t lo = row_lo;
    d.min_rank = row_lo_rank;
    if (first_without >= 0) {
      lo = 0;
      if (!(row_lo == 0 && row_lo_rank < first_without)) d.min_rank = first_without;
    }
    if (lo == UINT64_MAX || hi <= lo) continue;
    d.delta = hi - lo;
    diffs.push_back(d);
  }
  std::sort(diffs.begin(), diffs.end(), [](const Diff& a, const Diff& b) { return a.delta > b.delta; });
  if (diffs.size() > 25) diffs.resize(25);
  json site_diffs = json::array();
  for (const auto& d : diffs) {
    std::vector<std::uint64_t> bytes_by_rank(static_cast<std::size_t>(world), 0);
    for (const auto& [r, row] : *d.by_rank) {
      if (r >= 0 && r < world) bytes_by_rank[static_cast<std::size_t>(r)] = row->bytes_at_peak;
    }
    site_diffs.push_back({{"site", *d.site},
                          {"batch", common_batch},
                          {"stack", site_stack_of.contains(*d.site) ? site_stack_of[*d.site] : json::array()},
                          {"bytes_by_rank", std::move(bytes_by_rank)},
                          {"max_rank", d.max_rank},
                          {"min_rank", d.min_rank},
                          {"delta", d.delta},
                          {"category", category_name(d.category)}});
  }

  // Bytes at the peak by category per rank (the window of the rank's highest peak).
  json cat_names = json::array();
  for (int c = 0; c < kCategoryCount; ++c) cat_names.push_back(category_name(static_cast<Category>(c)));
  json cat_bytes = json::array();
  for (int r = 0; r < world; ++r) {
    json row = json::array();
    const SummaryRow* top = nullptr;
    if (auto it = ranks.find(r); it != ranks.end()) {
      for (const auto* w : it->second.windows) {
        if (top == nullptr || w->peak_allocated > top->peak_allocated) top = w;
      }
    }
    for (int c = 0; c < kCategoryCount; ++c) row.push_back(top ? top->category_bytes[c] : 0);
    cat_bytes.push_back(std::move(row));
  }

  // Rank rows of the page.
  std::map<std::pair<int, std::int64_t>, const WindowDigest*> digest_of;
  for (const auto& d : digests) digest_of[{d.rank, d.batch}] = &d;
  json page_ranks = json::array();
  for (const auto& r : info.ranks) {
    json windows = json::array();
    for (const auto* w : ranks[r.rank].windows) {
      json win = {{"batch", w->batch_end},         {"batch_start", w->batch_start},
                  {"peak_allocated", w->peak_allocated}, {"peak_reserved", w->peak_reserved},
                  {"live_at_open", w->live_at_open}, {"live_at_close", w->live_at_close},
                  {"persistent", w->persistent},     {"oom", w->oom},
                  {"status", w->status},             {"page", nullptr}};
      if (auto it = digest_of.find({r.rank, w->batch_end}); it != digest_of.end()) {
        win["page"] = it->second->page;
        win["spark"] = {{"max", it->second->spark_max}, {"levels", it->second->spark}};
      }
      windows.push_back(std::move(win));
    }
    page_ranks.push_back({{"rank", r.rank}, {"status", r.status}, {"host", r.host}, {"device", r.device}, {"windows", std::move(windows)}});
  }

  CrossRankResult out;
  out.peak_max_over_median = imbalance["max_over_median"].get<double>();
  out.page = {{"format_version", 1},
              {"run_name", info.run_name},
              {"world_size", info.world_size},
              {"created", info.created},
              {"ranks", page_ranks},
              {"imbalance", imbalance},
              {"findings", findings},
              {"site_diffs", site_diffs},
              {"categories", {{"names", cat_names}, {"bytes_by_rank", cat_bytes}}}};
  out.summary_json = {{"imbalance", imbalance}, {"findings", findings}, {"site_diffs", site_diffs},
                      {"categories", {{"names", cat_names}, {"bytes_by_rank", cat_bytes}}}};
  return out;
}

}  // namespace memsnap
