// leak: memory a rank keeps batch after batch. Two kinds of evidence. Memory kept for good (a
// site whose allocations from separate times of the window are all still held at its end) is
// judged on its own, not against the other ranks: a leak in the code every rank runs is on every
// rank. Low points that rise faster than the median rank's catch what is kept by regrowing one
// tensor (torch.cat onto a running result frees the last one), which keeps nothing from earlier
// times.
//
// Growth is measured from one batch start to the next inside each window that closed at a batch
// boundary (a window cut short by an OOM or a kill holds that batch's working memory); windows
// without batches inside fall back to open-to-close over their batch range.
#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::findings {

namespace {

Growth growth_of_rank(const Run& run, const RankView& v) {
  Growth g;
  double sum = 0, spans = 0;
  const auto list = run.digests_of.find(v.rank);
  if (list == run.digests_of.end() && v.batches < 2) return g;
  static const std::vector<const WindowDigest*> none;
  const auto& digests = list == run.digests_of.end() ? none : list->second;
  for (const auto* d : digests) {
    if (run.digest_cut_short(d) || d->batches.size() < 2) continue;
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
  }
  if (spans > 0) {
    g.per_batch = sum / spans;
    g.measured = true;
  } else if (v.batches >= 2) {
    g.per_batch = v.growth_per_batch;
    g.measured = true;
    for (const auto* d : digests) {
      if (run.digest_cut_short(d)) continue;
      for (std::size_t i = 1; i < d->batches.size(); ++i) g.monotone &= d->batches[i].live_at_end >= d->batches[i - 1].live_at_end;
    }
  }
  return g;
}

}  // namespace

void leak_findings(Run& run, std::vector<Finding>& out) {
  for (const auto& [r, v] : run.ranks) run.growth_of[r] = growth_of_rank(run, v);
  std::vector<double> measured_growths;
  for (const auto& [r, g] : run.growth_of) {
    if (g.measured) measured_growths.push_back(g.per_batch);
  }
  // With fewer than three ranks there is no majority to call normal: growth itself is the excess.
  const double growth_norm = measured_growths.size() >= 3 ? median(measured_growths) : 0.0;
  const double keep_floor = threshold(run.peak_median, 0.0002);
  std::size_t keeping_ranks = 0;
  for (const auto& [r, g] : run.growth_of) keeping_ranks += g.measured && g.retained > keep_floor;
  for (const auto& [r, v] : run.ranks) {
    const Growth& g = run.growth_of[r];
    if (!v.has_data() || !g.measured) continue;
    const double excess = g.per_batch - growth_norm;
    // Rising low points alone are a leak where a code path regrows a tensor: they also rise
    // with the batches' own inputs (a run of longer batches, a mixture of experts' routing).
    const bool rising = g.monotone && excess > threshold(run.peak_median, 0.002) && g.regrown;
    const bool keeping = g.retained > keep_floor;
    if (!rising && !keeping) continue;
    run.leaking.insert(r);
    const double bytes = keeping ? g.retained : excess;
    std::string site = keeping && !g.retained_site.empty() ? g.retained_site : g.site;
    if (site.empty()) site = run.site_excess(r, v.windows.back()->batch_end).first;
    std::string detail = "rank " + std::to_string(r) + " keeps " + human_bytes(bytes_of(bytes)) + " more after every batch";
    if (keeping) {
      detail += (site.empty() ? std::string(": memory") : ", held by " + site + ": memory") + " allocated at " +
                std::to_string(g.retained_times) + " separate times of the window is all still held at its end";
      if (keeping_ranks >= 3 && keeping_ranks * 2 > measured_growths.size()) {
        detail += "; " + std::to_string(keeping_ranks - 1) + " other ranks do the same, so the leak is in code every rank runs";
      }
    } else {
      detail += std::string(" than ") + (measured_growths.size() >= 3 ? "the other ranks" : "it started the batch before with") +
                (site.empty() ? "" : ", held by " + site);
    }
    const SummaryRow* last = v.windows.back();
    Finding f = make_finding("leak", r, last->window, &last->batch_end, bytes, site, detail + inferred_note(g.inferred));
    f.batches_inferred = g.inferred != nullptr;
    f.method = g.inferred != nullptr ? g.inferred->batch_method : last->batch_method;
    out.push_back(std::move(f));
  }
}

}  // namespace memsnap::findings
