// Outliers and unexplained: the imbalance of peak allocated over the ranks (max/median, spread,
// z-scores, and outliers by a robust rule: distance from the median in units of the median
// absolute deviation; with identical peers, more than 5 % above the median), and every outlier
// rank explained by a finding that raises a peak (a leak, a shard imbalance, a spike, an OOM; a
// damaged record) or said to be unexplained: the page marks no rank red without a reason.
#include <cmath>
#include <cstdio>

#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::findings {

using nlohmann::json;

json imbalance_of(const Run& run) {
  const auto& peaks = run.peaks;
  const double peak_median = run.peak_median;
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
  for (const auto& [r, v] : run.ranks) {
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
  return {{"metric", "peak_allocated"},
          {"max", bytes_of(max)},
          {"median", bytes_of(peak_median)},
          {"max_over_median", peak_median > 0 ? max / peak_median : 0.0},
          {"peak_max_over_median", peak_median > 0 ? max / peak_median : 0.0},
          {"spread", bytes_of(max - min)},
          {"zscores", std::move(z)},
          {"outlier_ranks", std::move(outliers)},
          {"outlier_reasons", std::move(reasons)}};
}

void unexplained_findings(const Run& run, const std::vector<int>& outliers, std::vector<Finding>& out) {
  std::set<int> explained;  // one pass: a run may have a finding on most ranks
  for (const auto& f : out) explained.insert(f.rank);
  for (int r : outliers) {
    if (explained.count(r)) continue;
    // Where it peaks: its highest batch (else its highest window), and the site it holds most
    // more of there than the other ranks.
    const RankView& v = run.ranks.at(r);
    const SummaryRow* top = nullptr;
    for (const auto* w : v.windows) {
      if (top == nullptr || w->peak_allocated > top->peak_allocated) top = w;
    }
    std::int64_t batch = top != nullptr ? top->batch_end : 0;
    if (auto d = run.digest_of.find({r, batch}); d != run.digest_of.end()) {
      std::uint64_t high = 0;
      for (const auto& b : d->second->batches) {
        if (b.peak_allocated > high) {
          high = b.peak_allocated;
          batch = b.batch;
        }
      }
    }
    const std::string site = top != nullptr ? run.site_excess(r, top->batch_end).first : std::string();
    const double over = static_cast<double>(v.peak) - run.peak_median;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", run.peak_median > 0 ? static_cast<double>(v.peak) / run.peak_median : 0.0);
    Finding f = make_finding("unexplained", r, top != nullptr ? top->window : -1, &batch, over, site,
                             "rank " + std::to_string(r) + " peaks " + human_bytes(bytes_of(over)) + " above the median rank (" +
                                 ratio + ") in batch " + std::to_string(batch) + (site.empty() ? "" : ", most of it at " + site) +
                                 "; no cause found: no leak, shard imbalance, spike or OOM passes its rule's limit on this rank");
    f.method = top != nullptr ? top->batch_method : "";
    out.push_back(std::move(f));
  }
}

}  // namespace memsnap::findings
