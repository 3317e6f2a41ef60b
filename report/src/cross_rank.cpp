// The cross-rank page and summary.json from the store: the findings (computed when the store was
// written, aggregator/src/findings/), the imbalance of peak allocated, where ranks differ (the
// sites whose bytes at the peak differ most between ranks), bytes by category, and each rank's
// windows with their pages and sparklines (from the per-rank pass).
#include <algorithm>
#include <map>

#include "memsnap/numeric.hpp"
#include "memsnap/report.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

struct RankView {
  std::vector<const SummaryRow*> windows;
  bool has_data() const { return !windows.empty(); }
};

}  // namespace

CrossRankResult cross_rank_analysis(const StoreInfo& info, const std::vector<SiteRow>& sites,
                                    const std::vector<Finding>& found, const std::vector<PageDigest>& digests) {
  std::map<int, RankView> ranks;
  for (const auto& r : info.ranks) ranks[r.rank];
  for (const auto& row : info.rows) {
    auto& v = ranks[row.rank];
    if (row.window >= 0) v.windows.push_back(&row);
  }
  std::map<std::pair<int, std::int64_t>, const PageDigest*> digest_of;
  for (const auto& d : digests) digest_of[{d.rank, d.batch}] = &d;
  std::map<std::pair<std::int64_t, std::string>, std::map<int, const SiteRow*>> site_table;
  for (const auto& s : sites) site_table[{s.batch, s.name}][s.rank] = &s;
  json imbalance = peak_imbalance(info, found);
  const json findings = findings_json(found);

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
