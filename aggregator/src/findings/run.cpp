// The run as the cross-rank rules see it (rules.hpp): ranks, digests, and the comparisons.
#include <cstdio>

#include "memsnap/numeric.hpp"
#include "rules.hpp"

namespace memsnap::findings {

double Column::median_without(double mine, bool counted) const {
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

namespace {

// A window with an OOM that the job caught and went on past (it allocated again after each)
// closed at a batch boundary like any other; one that ended at its OOM was cut short mid-batch.
bool went_on(const WindowDigest* d) {
  if (d == nullptr) return false;
  bool any = false;
  for (const auto& b : d->batches) {
    if (!b.oom) continue;
    if (!b.oom_went_on) return false;
    any = true;
  }
  return any;
}

}  // namespace

Run::Run(const StoreInfo& info_, const std::vector<SiteRow>& sites, const std::vector<WindowDigest>& digests_)
    : info(info_), digests(digests_) {
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
  for (const auto& d : digests) {
    digest_of[{d.rank, d.batch}] = &d;
    digests_of[d.rank].push_back(&d);
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
      if (row_cut_short(w)) continue;
      growth += static_cast<std::int64_t>(w->live_at_close) - static_cast<std::int64_t>(w->live_at_open);
      v.batches += w->batch_end - w->batch_start + 1;
    }
    if (v.windows.empty()) v.baseline = v.persistent = 0;
    v.growth_per_batch = v.batches > 0 ? static_cast<double>(growth) / static_cast<double>(v.batches) : 0;
    // The lowest level of every batch, of every window: what the rank holds for good, measured
    // alike on every rank (a window cut short by an OOM holds batches that began and sank like
    // anyone's; only its last, unfinished one is cut).
    if (auto it = digests_of.find(r); it != digests_of.end()) {
      for (const auto* d : it->second) {
        for (const auto& b : d->batches) v.baseline = std::min<std::uint64_t>(v.baseline, b.min_allocated);
      }
    }
  }
  for (const auto& [r, v] : ranks) {
    if (!v.has_data()) continue;
    peaks.push_back(static_cast<double>(v.peak));
    ++m_ranks_with_data;
  }
  peak_median = median(peaks);
  for (const auto& s : sites) m_site_table[{s.batch, s.name}][s.rank] = &s;
  for (const auto& d : digests) {
    for (const auto& b : d.batches) {
      batch_peaks[b.batch].emplace_back(d.rank, b.peak_allocated);
      window_of_batch[{d.rank, b.batch}] = &d;
      stat_of_batch[{d.rank, b.batch}] = &b;
    }
  }
}

bool Run::row_cut_short(const SummaryRow* w) const {
  if (w->status != "ok") return true;
  if (!w->oom) return false;
  auto it = digest_of.find({w->rank, w->batch_end});
  return !went_on(it == digest_of.end() ? nullptr : it->second);
}

bool Run::digest_cut_short(const WindowDigest* d) const {
  if (!d->cut_short) return false;
  if (!went_on(d)) return true;
  // cut_short also marks a window that is damaged or never closed: its row says so.
  if (auto v = ranks.find(d->rank); v != ranks.end()) {
    for (const auto* w : v->second.windows) {
      if (w->batch_end == d->batch) return w->status != "ok";
    }
  }
  return false;
}

double Run::batch_median(int rank, std::int64_t batch) const {
  std::vector<double> values;
  if (auto it = batch_peaks.find(batch); it != batch_peaks.end()) {
    for (const auto& [r, p] : it->second) {
      if (r != rank) values.push_back(static_cast<double>(p));
    }
  }
  return median(values);
}

// Each (batch, site) is a Column over the ranks with data (ranks without a row count as 0): a
// run can have a finding on most of its ranks, each asking.
const std::vector<SiteColumn>& Run::columns(std::int64_t batch) const {
  auto [it, inserted] = m_columns_of_batch.try_emplace(batch);
  if (!inserted) return it->second;
  const auto first = m_site_table.lower_bound({batch, std::string()});
  for (auto k = first; k != m_site_table.end() && k->first.first == batch; ++k) {
    SiteColumn col;
    col.site = &k->first.second;
    col.by_rank = &k->second;
    for (const auto& [r, row] : k->second) {
      auto v = ranks.find(r);
      if (v != ranks.end() && v->second.has_data()) col.sorted.push_back(static_cast<double>(row->bytes_at_peak));
    }
    std::sort(col.sorted.begin(), col.sorted.end());
    col.zeros = m_ranks_with_data - col.sorted.size();
    it->second.push_back(std::move(col));
  }
  return it->second;
}

std::pair<std::string, double> Run::site_excess(int rank, std::int64_t batch) const {
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
}

Finding make_finding(const char* kind, int rank, int window, const std::int64_t* batch, double bytes,
                     const std::string& site, std::string detail) {
  Finding f;
  f.kind = kind;
  f.rank = rank;
  f.window = window;
  f.has_batch = batch != nullptr;
  f.batch = batch != nullptr ? *batch : 0;
  f.bytes = bytes_of(bytes);
  f.site = site;
  f.detail = std::move(detail);
  return f;
}

std::string inferred_note(const WindowDigest* d) {
  if (d == nullptr) return "";
  char c[48];
  std::snprintf(c, sizeof c, "%.2f", d->batch_confidence);
  return "; batch boundaries inferred (" + d->batch_method + ": " + d->batch_detail + ", confidence " + c + ")";
}

std::string method_of(const Run& run, int rank, int window) {
  auto v = run.ranks.find(rank);
  if (v == run.ranks.end()) return "";
  for (const auto* w : v->second.windows) {
    if (w->window == window) return w->batch_method;
  }
  return "";
}

}  // namespace memsnap::findings
