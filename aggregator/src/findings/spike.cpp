// spike: one batch's peak far above that batch's median across ranks, and far above the rank's
// own other batches (a rank whose batches all differ in size is not spiking). How far scales
// with how much they vary: where the ranks and batches agree to the byte a small excess stands
// out; where they vary (sequence lengths that change every batch) only a large one does
// (spike_limit). A batch in which an allocation failed is its OOM finding: its peak is the
// failed attempt's, compared with nothing. A leaking rank's peaks rise with its leak: that rise
// is the leak, not a spike.
#include <cmath>

#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::cross_rank_rules {

double robust_spread(std::vector<double> values) {
  if (values.size() < 2) return 0;
  const double mid = median(values);
  for (double& v : values) v = std::fabs(v - mid);
  return 1.4826 * median(values);
}

double spike_limit(double median_peak, double spread) {
  constexpr double MiB = 1024.0 * 1024.0;
  const double scaled = std::min(kSpikeCeiling * median_peak, kSpikeSigmas * spread);
  return std::max({MiB, kSpikeFloor * median_peak, scaled});
}

std::vector<std::pair<std::int64_t, double>> distinct_spikes(const std::vector<std::pair<std::int64_t, double>>& high) {
  std::vector<std::pair<std::int64_t, double>> out;
  for (std::size_t i = 0; i < high.size(); ++i) {
    const bool continues = i > 0 && high[i].first == high[i - 1].first + 1;
    if (!continues) {
      out.push_back(high[i]);
    } else if (high[i].second > out.back().second) {
      out.back() = high[i];
    }
  }
  return out;
}

}  // namespace memsnap::cross_rank_rules

namespace memsnap::findings {

void spike_findings(const Run& run, std::vector<Finding>& out) {
  const bool few_ranks = run.peaks.size() < 3;
  std::map<int, std::vector<std::pair<std::int64_t, double>>> excess_of;  // rank -> (batch, excess)
  std::map<std::int64_t, double> spread_of_batch;                        // the ranks' spread in a batch
  for (const auto& [batch, list] : run.batch_peaks) {
    std::vector<double> values;
    for (const auto& [r, p] : list) values.push_back(static_cast<double>(p));
    const double med = median(values);
    spread_of_batch[batch] = cross_rank_rules::robust_spread(values);
    for (const auto& [r, p] : list) excess_of[r].emplace_back(batch, static_cast<double>(p) - med);
  }
  for (const auto& [rank_key, all] : excess_of) {
    const auto r = rank_key;  // the lambdas below capture it (clang 14 cannot capture a binding)
    std::vector<std::pair<std::int64_t, double>> list;  // the batches that ran to their end
    for (const auto& x : all) {
      if (!run.oom_batches.count({r, x.first})) list.push_back(x);
    }
    if (list.size() < 2) continue;
    const auto growth = run.growth_of.find(r);
    const double trend = run.leaking.count(r) && growth != run.growth_of.end() ? growth->second.per_batch : 0.0;
    const std::int64_t first_batch = list.front().first;
    auto detrended = [&](std::int64_t b) {
      return static_cast<double>(run.stat_of_batch.at({r, b})->peak_allocated) -
             trend * (static_cast<double>(b) - static_cast<double>(first_batch));
    };
    auto own_others = [&](std::int64_t batch) {
      std::vector<double> others;
      for (const auto& [b, e] : list) {
        if (b != batch) others.push_back(detrended(b));
      }
      return others;
    };
    std::vector<std::pair<std::int64_t, double>> high;
    for (const auto& [b, raw] : list) {
      const double e = raw - trend * (static_cast<double>(b) - static_cast<double>(first_batch));
      const std::vector<double> others = own_others(b);
      const double own = detrended(b) - median(others);
      // The spread of the other ranks in this batch (with the rank itself among them, a spike
      // moves the median absolute deviation by at most one place) and of its own other batches.
      const double spread =
          std::max(few_ranks ? 0.0 : spread_of_batch[b], cross_rank_rules::robust_spread(others));
      const double limit = cross_rank_rules::spike_limit(run.peak_median, spread);
      if ((few_ranks || e > limit) && own > limit) high.emplace_back(b, few_ranks ? own : std::min(e, own));
    }
    high = cross_rank_rules::distinct_spikes(high);
    if (high.empty() || high.size() * 3 > list.size()) continue;
    for (const auto& [b, e] : high) {
      const WindowDigest* d = run.window_of_batch.at({r, b});
      std::string site = run.stat_of_batch.at({r, b})->peak_site;
      if (site.empty()) site = run.site_excess(r, d->batch).first;
      const bool inferred = d->batch_method != "recorded";
      Finding f = make_finding("spike", r, d->window, &b, e, site,
                               "rank " + std::to_string(r) + " peaks " + human_bytes(bytes_of(e)) + " above " +
                                   (few_ranks ? "its other batches" : "the other ranks") + " in batch " +
                                   std::to_string(b) + " only" + (site.empty() ? "" : ", at " + site) +
                                   inferred_note(inferred ? d : nullptr));
      f.batches_inferred = inferred;
      f.method = d->batch_method;
      out.push_back(std::move(f));
    }
  }
}

}  // namespace memsnap::findings
