// shard_imbalance: more memory held at every batch boundary than the median rank, not growing.
// The median leaves the leaking ranks out: their boundary memory says nothing about shards. A
// finding is named by what the rank's lowest boundary holds more of than the other ranks'
// (without boundaries, by what its peak holds).
#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::findings {

void shard_imbalance_findings(const Run& run, std::vector<Finding>& out) {
  std::vector<double> steady;
  for (const auto& [r, v] : run.ranks) {
    if (v.has_data() && !run.leaking.count(r)) steady.push_back(static_cast<double>(v.baseline));
  }
  const double baseline_median = median(steady);
  // What a rank holds at its lowest batch boundary, by site: the window with the lowest one.
  auto lowest = [](const WindowDigest* x) {
    std::uint64_t m = UINT64_MAX;
    for (const auto& b : x->batches) m = std::min(m, b.min_allocated);
    return m;
  };
  std::map<int, const WindowDigest*> low_of;
  for (const auto& [r, list] : run.digests_of) {
    for (const auto* d : list) {
      if (d->batches.empty() || d->sites_at_low.empty()) continue;
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
  for (const auto& [r, v] : run.ranks) {
    if (!v.has_data() || run.leaking.count(r)) continue;
    const double excess = static_cast<double>(v.baseline) - baseline_median;
    if (excess <= threshold(baseline_median, 0.02)) continue;
    // Named by what the boundary holds; without boundaries, by what the peak holds.
    const HeldSite* held = held_excess(r);
    const std::string site = held != nullptr ? held->name : run.site_excess(r, v.windows.front()->batch_end).first;
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
    Finding f = make_finding("shard_imbalance", r, -1, nullptr, excess, site, detail);
    f.category = held != nullptr ? category_name(held->category) : "";
    out.push_back(std::move(f));
  }
}

}  // namespace memsnap::findings
