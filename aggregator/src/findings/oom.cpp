// oom: an allocation failed. Named by the batch it failed in (what it asked for, what was
// allocated, where, and whether the job caught it and went on), or, where the window's batches
// do not show it, by the window.
#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::findings {

void oom_findings(Run& run, std::vector<Finding>& out) {
  for (const auto& [r, v] : run.ranks) {
    for (const auto* w : v.windows) {
      if (!w->oom) continue;
      auto d = run.digest_of.find({r, w->batch_end});
      bool named = false;  // by the batch it failed in
      if (d != run.digest_of.end()) {
        std::size_t later = 0;  // batches of the window after the failed one
        for (const auto& b : d->second->batches) {
          later += named ? 1 : 0;
          if (!b.oom || named) continue;
          named = true;
          run.oom_batches.insert({r, b.batch});
          const double others = run.batch_median(r, b.batch);
          Finding f = make_finding(
              "oom", r, w->window, &b.batch, 0, b.oom_site,
              "rank " + std::to_string(r) + " ran out of memory in batch " + std::to_string(b.batch) + " asking for " +
                  human_bytes(b.oom_requested) + " with " + human_bytes(b.live_at_oom) + " allocated" +
                  (b.oom_site.empty() ? "" : ", at " + b.oom_site) +
                  (others > 0 && static_cast<double>(b.peak_allocated) > others
                       ? " (" + human_bytes(bytes_of(static_cast<double>(b.peak_allocated) - others)) +
                             " more than the other ranks' peak in that batch)"
                       : ""));
          f.bytes = b.oom_requested;
          f.method = d->second->batch_method;
          f.oom_in_batch = true;
          f.live = b.live_at_oom;
          f.went_on = b.oom_went_on;
          out.push_back(std::move(f));
        }
        if (named && out.back().went_on) {
          out.back().detail += "; the job caught it and went on" +
                               (later > 0 ? " (" + std::to_string(later) + (later == 1 ? " batch" : " batches") +
                                                " after it in this window)"
                                          : std::string());
        }
      }
      if (named) continue;
      Finding f = make_finding("oom", r, w->window, &w->batch_end, 0, "",
                               "rank " + std::to_string(r) + " ran out of memory in batch " + std::to_string(w->batch_end) +
                                   " asking for " + human_bytes(w->oom_requested) + " (the window peaked at " +
                                   human_bytes(w->peak_allocated) + ")");
      f.bytes = w->oom_requested;
      f.method = w->batch_method;
      out.push_back(std::move(f));
    }
  }
}

}  // namespace memsnap::findings
