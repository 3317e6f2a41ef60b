// The findings of a run, rule after rule (rules.hpp), and how a finding and a window's digest
// are written down: summary.json's objects and the store's digest rows.
#include <algorithm>
#include <map>
#include <set>

#include "rules.hpp"

namespace memsnap {

using nlohmann::json;

std::vector<Finding> compute_findings(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                      const std::vector<WindowDigest>& digests) {
  findings::Run run(info, sites, digests);
  // Per rank, the state of its record, then its OOMs.
  std::vector<Finding> state, ooms;
  findings::record_state_findings(run, state);
  findings::oom_findings(run, ooms);
  std::vector<Finding> out;
  out.reserve(state.size() + ooms.size());
  std::size_t i = 0, j = 0;
  while (i < state.size() || j < ooms.size()) {
    if (j == ooms.size() || (i < state.size() && state[i].rank <= ooms[j].rank)) {
      out.push_back(std::move(state[i++]));
    } else {
      out.push_back(std::move(ooms[j++]));
    }
  }
  findings::leak_findings(run, out);
  findings::shard_imbalance_findings(run, out);
  findings::spike_findings(run, out);
  std::vector<int> outliers;
  const json imbalance = findings::imbalance_of(run);
  for (const auto& r : imbalance["outlier_ranks"]) outliers.push_back(r.get<int>());
  findings::unexplained_findings(run, outliers, out);
  return out;
}

json peak_imbalance(const StoreInfo& info, const std::vector<Finding>& found) {
  const std::vector<SiteRow> no_sites;
  const std::vector<WindowDigest> no_digests;
  const findings::Run run(info, no_sites, no_digests);
  json imbalance = findings::imbalance_of(run);
  // Each outlier rank's causes: the kinds of its findings, in order (one pass over them).
  std::map<int, std::vector<std::string>> kinds_of;
  for (const auto& f : found) {
    auto& k = kinds_of[f.rank];
    if (std::find(k.begin(), k.end(), f.kind) == k.end()) k.push_back(f.kind);
  }
  json causes = json::object();
  for (const auto& o : imbalance["outlier_ranks"]) {
    const int r = o.get<int>();
    json kinds = json::array();
    for (const auto& kind : kinds_of[r]) kinds.push_back(kind);
    causes[std::to_string(r)] = std::move(kinds);
  }
  imbalance["outlier_causes"] = std::move(causes);
  return imbalance;
}

json finding_json(const Finding& f) {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json j = {{"kind", f.kind},
            {"rank", f.rank},
            {"batch", f.has_batch ? json(f.batch) : json(nullptr)},
            {"bytes", f.bytes},
            {"site", or_null(f.site)},
            {"detail", f.detail}};
  if (f.kind == "oom" && f.oom_in_batch) {
    j["live"] = f.live;
    j["went_on"] = f.went_on;
  }
  if (f.kind == "leak" || f.kind == "spike") j["batches_inferred"] = f.batches_inferred;
  if (f.kind == "shard_imbalance") j["category"] = or_null(f.category);
  return j;
}

json findings_json(const std::vector<Finding>& found) {
  json out = json::array();
  for (const auto& f : found) out.push_back(finding_json(f));
  return out;
}

WindowDigest window_digest(const WindowRecord& w, const WindowStats& s, int rank, int window) {
  WindowDigest d;
  d.rank = rank;
  d.window = window;
  d.batch = w.batch_end;
  d.batch_method = w.batch_method;
  d.batch_confidence = w.batch_confidence;
  d.batch_detail = w.batch_detail;
  static_cast<WindowGrowth&>(d) = s;
  d.cut_short = s.oom || w.status != RecordStatus::ok || !w.closed;
  d.batches = s.batches;
  d.sites_at_low = s.sites_at_low;
  return d;
}

void DigestTables::add(const WindowDigest& d) {
  const DigestKey& key = d;
  windows.push_back(static_cast<const DigestWindowRow&>(d));
  for (const auto& b : d.batches) batches.push_back(DigestBatchRow{key, b});
  for (const auto& h : d.sites_at_low) held.push_back(DigestHeldRow{key, h});
}

void DigestTables::append(const DigestTables& more) {
  windows.insert(windows.end(), more.windows.begin(), more.windows.end());
  batches.insert(batches.end(), more.batches.begin(), more.batches.end());
  held.insert(held.end(), more.held.begin(), more.held.end());
}

std::vector<WindowDigest> DigestTables::windows_grouped() const {
  std::vector<WindowDigest> out;
  out.reserve(windows.size());
  std::map<std::pair<int, int>, std::size_t> at;
  for (const auto& w : windows) {
    at[{w.rank, w.window}] = out.size();
    out.push_back(WindowDigest{w, {}, {}});
  }
  for (const auto& b : batches) {
    auto it = at.find({b.rank, b.window});
    if (it != at.end()) out[it->second].batches.push_back(static_cast<const BatchStat&>(b));
  }
  for (const auto& h : held) {
    auto it = at.find({h.rank, h.window});
    if (it != at.end()) out[it->second].sites_at_low.push_back(static_cast<const HeldSite&>(h));
  }
  return out;
}

StoreFindings compute_store_findings(const StoreReader& store) {
  const StoreInfo info = store.info();
  StoreFindings out;
  std::vector<WindowDigest> digests;
  for (const auto& r : info.ranks) {
    if (r.n_windows == 0) continue;
    const RankRecord record = store.read_rank(r.rank);
    for (std::size_t i = 0; i < record.windows.size(); ++i) {
      const WindowStats s = analyse_window(record, record.windows[i]);
      digests.push_back(window_digest(record.windows[i], s, r.rank, static_cast<int>(i)));
      out.digest.add(digests.back());
    }
  }
  out.findings = compute_findings(info, store.sites(), digests);
  return out;
}

std::vector<std::vector<WindowStats>> stored_window_stats(const StoreReader& store) {
  if (!store.has_findings()) {
    throw StoreError(store.path().string() + ": no /digest (a store of format version 2 or earlier): its windows must be analysed");
  }
  return stored_window_stats(store.info(), store.sites(), store.digest());
}

std::vector<std::vector<WindowStats>> stored_window_stats(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                                          const DigestTables& digest) {
  std::vector<std::vector<WindowStats>> out(static_cast<std::size_t>(std::max(info.world_size, 0)));
  auto at = [&](int rank, int window) -> WindowStats* {
    if (rank < 0 || static_cast<std::size_t>(rank) >= out.size() || window < 0) return nullptr;
    auto& windows = out[static_cast<std::size_t>(rank)];
    return static_cast<std::size_t>(window) < windows.size() ? &windows[static_cast<std::size_t>(window)] : nullptr;
  };
  for (const auto& row : info.rows) {
    if (row.window < 0 || row.rank < 0 || static_cast<std::size_t>(row.rank) >= out.size()) continue;
    auto& windows = out[static_cast<std::size_t>(row.rank)];
    if (windows.size() <= static_cast<std::size_t>(row.window)) windows.resize(static_cast<std::size_t>(row.window) + 1);
    WindowStats& s = windows[static_cast<std::size_t>(row.window)];
    static_cast<WindowSummary&>(s) = row;
    s.batch_start = row.batch_start;
    s.batch_end = row.batch_end;
    s.oom = row.oom;
    s.oom_requested = row.oom_requested;
    s.status = status_from_name(row.status);
    for (int c = 0; c < kCategoryCount; ++c) s.category_bytes_at_peak[c] = row.category_bytes[static_cast<std::size_t>(c)];
  }
  // /sites: each window's top sites, largest first, as the writer kept them.
  for (const auto& site : sites) {
    if (WindowStats* s = at(site.rank, site.window)) s->sites.push_back(static_cast<const SiteStat&>(site));
  }
  for (const auto& row : digest.windows) {
    if (WindowStats* s = at(row.rank, row.window)) static_cast<WindowGrowth&>(*s) = row;
  }
  std::set<std::pair<int, int>> oom_seen;  // windows whose first OOM in a batch was met
  for (const auto& row : digest.batches) {
    WindowStats* s = at(row.rank, row.window);
    if (s == nullptr) continue;
    const BatchStat& b = s->batches.emplace_back(static_cast<const BatchStat&>(row));
    if (b.oom && oom_seen.insert({row.rank, row.window}).second) {
      s->oom_site = b.oom_site;
      s->live_at_oom = b.live_at_oom;
    }
    s->oom_went_on = s->oom_went_on || b.oom_went_on;
  }
  for (const auto& row : digest.held) {
    if (WindowStats* s = at(row.rank, row.window)) s->sites_at_low.push_back(static_cast<const HeldSite&>(row));
  }
  return out;
}

std::vector<Finding> read_findings(const std::filesystem::path& path) {
  const StoreReader store(path);
  if (store.has_findings()) return store.findings();
  return compute_store_findings(store).findings;
}

}  // namespace memsnap
