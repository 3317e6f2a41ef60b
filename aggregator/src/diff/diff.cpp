// memsnap diff's comparison: two sides read from their stores, aligned (ranks, windows, batches,
// sites), compared against the runs' own noise, and written as diff.json and a few lines.
#include "memsnap/diff.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "memsnap/errors.hpp"
#include "memsnap/numeric.hpp"

namespace memsnap::diff {
namespace {

using nlohmann::json;
constexpr std::uint64_t kMiB = 1024 * 1024;

std::uint64_t median_of(std::vector<std::uint64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// 1.4826 x the median absolute deviation: the spread of values that a few outliers do not move.
std::uint64_t robust_spread(const std::vector<std::uint64_t>& v) {
  if (v.size() < 2) return 0;
  const std::uint64_t m = median_of(v);
  std::vector<std::uint64_t> dev;
  dev.reserve(v.size());
  for (auto x : v) dev.push_back(x > m ? x - m : m - x);
  return static_cast<std::uint64_t>(1.4826 * static_cast<double>(median_of(std::move(dev))));
}

// The batches' own variation: the spread of the steps from one batch's peak to the next (over
// sqrt(2), the spread of one batch), so that memory that rises by the same step every batch (a
// leak) is a trend, not noise, while batches of varying sizes are.
std::uint64_t step_spread(const std::vector<std::uint64_t>& peaks) {
  if (peaks.size() < 3) return 0;
  std::vector<double> steps;
  for (std::size_t i = 0; i + 1 < peaks.size(); ++i) steps.push_back(static_cast<double>(peaks[i + 1]) - static_cast<double>(peaks[i]));
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double m = median(steps);
  for (auto& x : steps) x = std::fabs(x - m);
  return bytes_of(1.4826 * median(steps) / std::sqrt(2.0));
}

std::string signed_bytes(std::int64_t d) {
  const std::uint64_t mag = d < 0 ? static_cast<std::uint64_t>(-d) : static_cast<std::uint64_t>(d);
  return std::string(d < 0 ? "-" : "+") + human_bytes(mag);
}

std::string percent(const Pair& p) {
  if (p.base == 0) return p.now == 0 ? "0%" : "new";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * static_cast<double>(p.delta()) / static_cast<double>(p.base));
  return buf;
}

std::uint64_t magnitude(std::int64_t d) { return d < 0 ? static_cast<std::uint64_t>(-d) : static_cast<std::uint64_t>(d); }

// The window of a rank with the highest peak: where "bytes at the peak" are read.
const WindowData* peak_window(const RankData& r) {
  const WindowData* best = nullptr;
  for (const auto& w : r.windows)
    if (!best || w.row.peak_allocated > best->row.peak_allocated) best = &w;
  return best;
}

// A rank's numbers over its windows: the highest peaks, what it held for good at most, what it
// held when its last window closed, and its leak rate at most.
struct RankNumbers {
  std::uint64_t peak_allocated = 0, peak_reserved = 0, persistent = 0, live_at_close = 0, fragmentation = 0;
  std::array<std::uint64_t, kCategoryCount> categories{};
  double kept = 0;
  std::string kept_site;
  std::map<std::string, std::pair<Category, std::uint64_t>> sites;  // site name -> (category, bytes at the peak)
};

std::string frameless_key(Category c) { return std::string("<no stack> [") + category_name(c) + "]"; }

// A site's name as the diff matches it: with its line; a site without frames ("<no stack>",
// "<no Python frames: ...>") by its category as well.
std::string name_of(const SiteRow& s) {
  if (s.name.empty()) return frameless_key(s.category);
  if (s.name[0] == '<') return s.name + " [" + category_name(s.category) + "]";
  return s.name;
}

RankNumbers numbers_of(const RankData& r) {
  RankNumbers n;
  for (const auto& w : r.windows) {
    n.peak_allocated = std::max(n.peak_allocated, w.row.peak_allocated);
    n.peak_reserved = std::max(n.peak_reserved, w.row.peak_reserved);
    n.persistent = std::max(n.persistent, w.row.persistent);
    n.live_at_close = w.row.live_at_close;
    if (w.digest.retained_per_batch > n.kept) {
      n.kept = w.digest.retained_per_batch;
      n.kept_site = w.digest.retained_site;
    }
  }
  if (const WindowData* p = peak_window(r)) {
    n.fragmentation = p->row.fragmentation_at_peak;
    n.categories = p->row.category_bytes;
    for (const auto& s : p->sites) {
      auto& slot = n.sites[name_of(s)];
      slot.first = s.category;
      slot.second += s.bytes_at_peak;
    }
  }
  return n;
}

// Batches of a rank on both sides, by batch number where both sides cover the same batches,
// else by order (two windows of one run, runs of different lengths).
std::vector<BatchPair> pair_batches(const RankData* b, const RankData* n) {
  std::vector<BatchStat> bb, nb;
  if (b)
    for (const auto& w : b->windows) bb.insert(bb.end(), w.digest.batches.begin(), w.digest.batches.end());
  if (n)
    for (const auto& w : n->windows) nb.insert(nb.end(), w.digest.batches.begin(), w.digest.batches.end());
  bool same = bb.size() == nb.size();
  for (std::size_t i = 0; same && i < bb.size(); ++i) same = bb[i].batch == nb[i].batch;
  std::vector<BatchPair> out;
  const std::size_t count = std::max(bb.size(), nb.size());
  for (std::size_t i = 0; i < count; ++i) {
    BatchPair p;
    if (i < bb.size()) p.base_batch = bb[i].batch, p.peak.base = bb[i].peak_allocated, p.low.base = bb[i].min_allocated;
    if (i < nb.size()) p.new_batch = nb[i].batch, p.peak.now = nb[i].peak_allocated, p.low.now = nb[i].min_allocated;
    out.push_back(p);
  }
  (void)same;  // aligned by order either way; batch numbers say which batches met
  return out;
}

// The windows of a rank, paired: by the batch they close at, else by order.
std::vector<std::pair<const WindowData*, const WindowData*>> pair_windows(const RankData& b, const RankData& n) {
  std::vector<std::pair<const WindowData*, const WindowData*>> out;
  bool by_batch = !b.windows.empty();
  for (const auto& w : b.windows) {
    auto it = std::find_if(n.windows.begin(), n.windows.end(),
                           [&](const WindowData& x) { return x.row.batch_end == w.row.batch_end; });
    by_batch &= it != n.windows.end();
  }
  if (by_batch) {
    for (const auto& w : b.windows)
      for (const auto& x : n.windows)
        if (x.row.batch_end == w.row.batch_end) out.emplace_back(&w, &x);
    return out;
  }
  for (std::size_t i = 0; i < std::min(b.windows.size(), n.windows.size()); ++i) out.emplace_back(&b.windows[i], &n.windows[i]);
  return out;
}

// Only the paired windows of a rank take part (a longer run's extra windows have no partner).
RankData only_paired(const RankData& r, const std::vector<const WindowData*>& keep) {
  RankData out;
  out.rank = r.rank;
  out.status = r.status;
  for (const auto* w : keep) out.windows.push_back(*w);
  return out;
}

// Sites of a rank on both sides: the same name (function, file and line) first; then, within one
// function and file, the lines one side lacks paired with those the other side lacks, in line
// order (code above them moved them: "moved"); the rest only on one side.
std::vector<SiteDelta> site_deltas(const RankNumbers& b, const RankNumbers& n, std::uint64_t threshold) {
  std::vector<SiteDelta> out;
  auto add = [&](const std::string* bn, const std::string* nn) {
    SiteDelta d;
    if (bn) {
      const auto& v = b.sites.at(*bn);
      d.base_name = *bn, d.category = v.first, d.bytes.base = v.second;
    }
    if (nn) {
      const auto& v = n.sites.at(*nn);
      d.new_name = *nn, d.category = v.first, d.bytes.now = v.second;
    }
    d.key = nn ? *nn : *bn;
    d.moved = bn && nn && *bn != *nn;
    d.beyond_noise = magnitude(d.bytes.delta()) > threshold;
    out.push_back(std::move(d));
  };
  // Unmatched names by function and file, in line order.
  std::map<std::string, std::vector<std::pair<int, const std::string*>>> only_b, only_n;
  for (const auto& [name, v] : b.sites) {
    if (n.sites.count(name)) {
      add(&name, &name);
    } else {
      const auto [key, line] = site_key(name);
      only_b[key].emplace_back(line, &name);
    }
  }
  for (const auto& [name, v] : n.sites) {
    if (b.sites.count(name)) continue;
    const auto [key, line] = site_key(name);
    only_n[key].emplace_back(line, &name);
  }
  for (auto& [key, lines] : only_b) {
    std::sort(lines.begin(), lines.end());
    auto it = only_n.find(key);
    std::size_t paired = 0;
    if (it != only_n.end() && key.find('(') != std::string::npos && key[0] != '<') {
      std::sort(it->second.begin(), it->second.end());
      for (; paired < lines.size() && paired < it->second.size(); ++paired) add(lines[paired].second, it->second[paired].second);
      it->second.erase(it->second.begin(), it->second.begin() + static_cast<std::ptrdiff_t>(paired));
    }
    for (std::size_t i = paired; i < lines.size(); ++i) add(lines[i].second, nullptr);
  }
  for (const auto& [key, lines] : only_n)
    for (const auto& l : lines) add(nullptr, l.second);
  return out;
}

bool by_change(const SiteDelta& a, const SiteDelta& b) {
  if (a.beyond_noise != b.beyond_noise) return a.beyond_noise;
  const auto ma = magnitude(a.bytes.delta()), mb = magnitude(b.bytes.delta());
  if (ma != mb) return ma > mb;
  return a.key < b.key;
}

std::string finding_key(const Finding& f, bool windows_mode) {
  const std::string site = f.site.empty() || f.site[0] == '<' ? f.site : site_key(f.site).first;
  return f.kind + "|" + (windows_mode ? std::string() : std::to_string(f.rank)) + "|" + site;
}

json pair_json(const Pair& p) { return json::array({p.base, p.now}); }

json site_json(const SiteDelta& s, bool over_ranks) {
  json j = {{"key", s.key},
            {"base_name", s.base_name},
            {"new_name", s.new_name},
            {"category", category_name(s.category)},
            {"bytes", pair_json(s.bytes)},
            {"delta", s.bytes.delta()},
            {"moved", s.moved},
            {"beyond_noise", s.beyond_noise}};
  if (over_ranks) {
    j["top_rank"] = s.top_rank;
    j["top_rank_delta"] = s.top_rank_delta;
    j["ranks_changed"] = s.ranks_changed;
  }
  return j;
}

json finding_or_null(const Finding& f) {
  if (f.kind.empty()) return nullptr;
  return finding_json(f);
}

std::string short_site(const std::string& name) {
  // "(anonymous namespace)::FsdpSim::f() (/long/path/file.cpp:12)" -> "FsdpSim::f() (file.cpp:12)"
  std::string s = name;
  const std::string anon = "(anonymous namespace)::";
  for (std::size_t p; (p = s.find(anon)) != std::string::npos;) s.erase(p, anon.size());
  const auto open = s.rfind(" (");
  if (open != std::string::npos) {
    const auto slash = s.rfind('/');
    if (slash != std::string::npos && slash > open) s.erase(open + 2, slash - open - 1);
  }
  return s;
}

// Adds one side's bytes of a site along its stack (outermost frame first).
void add_path(StackNode& root, const RankRecord& rec, const SiteRow& site, bool is_new) {
  auto add = [&](StackNode& n) { (is_new ? n.bytes.now : n.bytes.base) += site.bytes_at_peak; };
  add(root);
  StackNode* at = &root;
  auto child = [&](const std::string& name, const std::string& file, std::uint32_t line) -> StackNode& {
    for (auto& c : at->children)
      if (c.name == name && c.file == file) {
        if (is_new) c.line = line;
        return c;
      }
    at->children.push_back(StackNode{name, file, line, {}, -1, {}});
    return at->children.back();
  };
  if (has_frames(rec, site.stack_id)) {
    const Stack& stack = rec.stacks[site.stack_id];
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
      if (*it >= rec.frames.size()) continue;
      const Frame& f = rec.frames[*it];
      StackNode& c = child(f.name.empty() ? "??" : f.name, f.file, f.line);
      add(c);
      at = &c;
    }
  } else {
    StackNode& c = child(frameless_key(site.category), "", 0);
    add(c);
    at = &c;
  }
  at->category = static_cast<int>(site.category);
}

json stack_json(const StackNode& n) {
  json j = {{"name", n.name}, {"bytes", std::max(n.bytes.base, n.bytes.now)}, {"base", n.bytes.base}, {"new", n.bytes.now},
            {"delta", n.bytes.delta()}};
  if (!n.file.empty()) j["file"] = n.file;
  if (n.line > 0) j["line"] = n.line;
  if (n.category >= 0) j["category"] = n.category;
  if (!n.children.empty()) {
    json kids = json::array();
    for (const auto& c : n.children) kids.push_back(stack_json(c));
    j["children"] = std::move(kids);
  }
  return j;
}

}  // namespace

void add_stacks(DiffResult& result, const SideData& base, const SideData& now, std::size_t max_ranks) {
  std::vector<RankDiff*> changed;
  for (auto& d : result.ranks)
    if (d.changed) changed.push_back(&d);
  std::stable_sort(changed.begin(), changed.end(), [](const RankDiff* a, const RankDiff* b) {
    return magnitude(a->peak_allocated.delta()) > magnitude(b->peak_allocated.delta());
  });
  if (changed.size() > max_ranks) changed.resize(max_ranks);
  if (changed.empty()) return;
  const StoreReader bs(base.spec.store), ns(now.spec.store);
  auto side_of = [](const SideData& side, int rank) -> const RankData* {
    for (const auto& r : side.ranks)
      if (r.rank == rank) return &r;
    return nullptr;
  };
  for (RankDiff* d : changed) {
    StackNode root{"all bytes at the peak", "", 0, {}, -1, {}};
    const std::pair<const SideData*, int> sides[] = {{&base, d->base_rank}, {&now, d->new_rank}};
    for (const auto& [side, rank] : sides) {
      const RankData* r = side_of(*side, rank);
      const WindowData* w = r ? peak_window(*r) : nullptr;
      if (!w) continue;
      const RankRecord rec = (side == &base ? bs : ns).read_rank(rank);
      for (const auto& s : w->sites) add_path(root, rec, s, side == &now);
    }
    d->stacks = std::move(root);
  }
}

std::pair<std::string, int> site_key(const std::string& name) {
  // "function (file:line)": the line is the digits after the last ':' before the closing ')'.
  if (name.size() < 4 || name.back() != ')') return {name, 0};
  const auto colon = name.rfind(':');
  const auto open = name.rfind(" (");
  if (colon == std::string::npos || open == std::string::npos || colon < open) return {name, 0};
  const std::string digits = name.substr(colon + 1, name.size() - colon - 2);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {name, 0};
  return {name.substr(0, colon) + ")", std::atoi(digits.c_str())};
}

SideData load_side(const SideSpec& spec) {
  SideData side;
  side.spec = spec;
  StoreReader store(spec.store);
  side.info = store.info();
  if (spec.rank && (*spec.rank < 0 || *spec.rank >= side.info.world_size))
    throw Error(spec.store.string() + ": no rank " + std::to_string(*spec.rank) + " (world size " +
                std::to_string(side.info.world_size) + ")");
  std::vector<SiteRow> sites = store.sites();
  std::map<std::pair<int, int>, std::vector<SiteRow>> sites_of;
  for (auto& s : sites) sites_of[{s.rank, s.window}].push_back(std::move(s));

  bool found_batch = !spec.batch.has_value();
  for (const auto& info : side.info.ranks) {
    if (spec.rank && info.rank != *spec.rank) continue;
    RankData r;
    r.rank = info.rank;
    r.status = info.status;
    for (const auto& row : side.info.rows) {
      if (row.rank != info.rank || row.window < 0) continue;
      if (spec.batch && row.batch_end != *spec.batch) continue;
      found_batch = true;
      WindowData w;
      w.row = row;
      if (auto it = sites_of.find({row.rank, row.window}); it != sites_of.end()) w.sites = std::move(it->second);
      r.windows.push_back(std::move(w));
    }
    side.ranks.push_back(std::move(r));
  }
  if (!found_batch) {
    std::string have;
    for (auto b : store.batches(*spec.rank)) have += (have.empty() ? "" : ", ") + std::to_string(b);
    throw Error(spec.store.string() + ": rank " + std::to_string(*spec.rank) + " has no window closing at batch " +
                std::to_string(*spec.batch) + " (its windows: " + (have.empty() ? "none" : have) + ")");
  }

  // Each window's digest and the run's findings: kept in the store since format version 3;
  // for an older store, every (selected) window analysed again. HDF5 reads stay on this thread
  // (the library is not thread-safe); the analysis of the ranks read so far runs on all cores.
  auto window_of = [&](int rank, std::int64_t batch_end) -> WindowData* {
    for (auto& r : side.ranks)
      if (r.rank == rank)
        for (auto& w : r.windows)
          if (w.row.batch_end == batch_end) return &w;
    return nullptr;
  };
  // Two windows of one run: the findings about the selected rank, as a whole or in that window.
  auto narrow_findings = [&] {
    if (!spec.rank) return;
    std::erase_if(side.findings, [&](const Finding& f) {
      if (f.rank != *spec.rank) return true;
      if (f.window < 0) return false;
      for (const auto& row : side.info.rows)
        if (row.rank == f.rank && row.window == f.window) return row.batch_end != *spec.batch;
      return false;
    });
  };
  if (store.has_findings()) {
    for (auto& d : store.digest().windows_grouped())
      if (WindowData* w = window_of(d.rank, d.batch)) w->digest = std::move(d);
    side.findings = store.findings();
    narrow_findings();
    return side;
  }
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<RankRecord> records;
  std::vector<WindowDigest> digests;
  auto analyse = [&] {
    std::vector<std::pair<std::size_t, std::size_t>> jobs;  // (record, window)
    for (std::size_t i = 0; i < records.size(); ++i)
      for (std::size_t k = 0; k < records[i].windows.size(); ++k)
        if (!spec.batch || records[i].windows[k].batch_end == *spec.batch) jobs.emplace_back(i, k);
    std::vector<WindowDigest> done(jobs.size());
    std::atomic<std::size_t> next{0};
    std::mutex error_mutex;
    std::string error;
    auto work = [&] {
      for (std::size_t j; (j = next++) < jobs.size();) {
        const auto [i, k] = jobs[j];
        try {
          const WindowRecord& w = records[i].windows[k];
          done[j] = window_digest(w, analyse_window(records[i], w), records[i].meta.rank, static_cast<int>(k));
        } catch (const std::exception& e) {
          std::lock_guard lock(error_mutex);
          error = e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    records.clear();
    if (!error.empty()) throw Error(spec.store.string() + ": " + error);
    for (auto& d : done) {
      if (WindowData* w = window_of(d.rank, d.batch)) w->digest = d;
      digests.push_back(std::move(d));
    }
  };
  for (auto& r : side.ranks) {
    if (r.windows.empty()) continue;
    RankRecord rec = store.read_rank(r.rank);
    rec.meta.rank = r.rank;
    records.push_back(std::move(rec));
    if (records.size() >= 4 * threads) analyse();
  }
  analyse();
  StoreInfo info = side.info;
  if (spec.rank) {
    std::erase_if(info.ranks, [&](const RankInfo& r) { return r.rank != *spec.rank; });
    std::erase_if(info.rows, [&](const SummaryRow& r) { return r.rank != *spec.rank || (spec.batch && r.batch_end != *spec.batch); });
  }
  std::vector<SiteRow> kept;
  for (const auto& r : side.ranks)
    for (const auto& w : r.windows) kept.insert(kept.end(), w.sites.begin(), w.sites.end());
  side.findings = compute_findings(info, kept, digests);
  narrow_findings();
  return side;
}

DiffResult compare(const SideData& base, const SideData& now, const DiffOptions& options) {
  DiffResult out;
  out.base_label = base.spec.label.empty() ? base.spec.store.string() : base.spec.label;
  out.new_label = now.spec.label.empty() ? now.spec.store.string() : now.spec.label;
  out.base_run = base.info.run_name;
  out.new_run = now.info.run_name;
  out.base_world = base.info.world_size;
  out.new_world = now.info.world_size;
  out.windows_mode = base.spec.rank.has_value() || now.spec.rank.has_value();

  // Ranks: by number (two windows: the one selected rank on each side).
  std::vector<std::pair<const RankData*, const RankData*>> pairs;
  if (out.windows_mode) {
    if (!base.ranks.empty() && !now.ranks.empty()) pairs.emplace_back(&base.ranks.front(), &now.ranks.front());
  } else {
    std::map<int, const RankData*> by_rank;
    for (const auto& r : now.ranks) by_rank[r.rank] = &r;
    for (const auto& r : base.ranks) {
      auto it = by_rank.find(r.rank);
      if (it == by_rank.end()) {
        out.ranks_only_base.push_back(r.rank);
        continue;
      }
      pairs.emplace_back(&r, it->second);
      by_rank.erase(it);
    }
    for (const auto& [r, d] : by_rank) out.ranks_only_new.push_back(r);
  }

  // Each rank's numbers over its paired windows.
  std::vector<std::pair<RankData, RankData>> paired;
  for (const auto& [b, n] : pairs) {
    std::vector<const WindowData*> bk, nk;
    for (const auto& [bw, nw] : pair_windows(*b, *n)) bk.push_back(bw), nk.push_back(nw);
    paired.emplace_back(only_paired(*b, bk), only_paired(*n, nk));
  }
  std::vector<std::pair<RankNumbers, RankNumbers>> numbers;
  for (const auto& [b, n] : paired) numbers.emplace_back(numbers_of(b), numbers_of(n));

  // Noise: the ranks' and the batches' own variation, on either side.
  {
    std::vector<std::uint64_t> bp, np, bspread, nspread;
    for (const auto& [b, n] : numbers) bp.push_back(b.peak_allocated), np.push_back(n.peak_allocated);
    auto batch_spread_of = [](const RankData& r) {
      std::vector<std::uint64_t> peaks;
      for (const auto& w : r.windows)
        for (const auto& s : w.digest.batches) peaks.push_back(s.peak_allocated);
      return step_spread(peaks);
    };
    for (const auto& [b, n] : paired) bspread.push_back(batch_spread_of(b)), nspread.push_back(batch_spread_of(n));
    Noise& z = out.noise;
    z.rank_spread = out.windows_mode ? 0 : std::max(robust_spread(bp), robust_spread(np));
    z.batch_spread = std::max(median_of(bspread), median_of(nspread));
    out.median_peak = {median_of(bp), median_of(np)};
    out.max_peak = {bp.empty() ? 0 : *std::max_element(bp.begin(), bp.end()), np.empty() ? 0 : *std::max_element(np.begin(), np.end())};
    z.floor = std::max<std::uint64_t>(kMiB, std::max(out.median_peak.base, out.median_peak.now) / 100);
    z.threshold = std::max(z.floor, 3 * std::max(z.rank_spread, z.batch_spread));
    z.how = "a change counts beyond " + human_bytes(z.threshold) + ": 3 x the larger of the ranks' spread of peaks (" +
            human_bytes(z.rank_spread) + ") and the batches' spread (batch to batch, a steady rise left out: " + human_bytes(z.batch_spread) +
            "), at least max(1 MiB, 1% of the median peak) = " + human_bytes(z.floor);
  }
  const std::uint64_t threshold = out.noise.threshold;

  // Per rank.
  std::map<std::string, SiteDelta> over;
  for (std::size_t i = 0; i < paired.size(); ++i) {
    const auto& [b, n] = paired[i];
    const auto& [bn, nn] = numbers[i];
    RankDiff d;
    d.base_rank = b.rank;
    d.new_rank = n.rank;
    d.base_status = b.status;
    d.new_status = n.status;
    d.peak_allocated = {bn.peak_allocated, nn.peak_allocated};
    d.peak_reserved = {bn.peak_reserved, nn.peak_reserved};
    d.persistent = {bn.persistent, nn.persistent};
    d.live_at_close = {bn.live_at_close, nn.live_at_close};
    d.fragmentation = {bn.fragmentation, nn.fragmentation};
    for (int c = 0; c < kCategoryCount; ++c) {
      d.categories[c] = {bn.categories[c], nn.categories[c]};
      out.categories[c].base += bn.categories[c];
      out.categories[c].now += nn.categories[c];
    }
    d.kept_per_batch = {bytes_of(bn.kept), bytes_of(nn.kept)};
    d.kept_site_base = bn.kept_site;
    d.kept_site_new = nn.kept_site;
    d.batches = pair_batches(&b, &n);
    d.sites = site_deltas(bn, nn, threshold);
    std::sort(d.sites.begin(), d.sites.end(), by_change);
    for (const auto& s : d.sites) {
      SiteDelta& o = over[s.key];
      if (o.key.empty()) o.key = s.key, o.category = s.category;
      if (o.base_name.empty()) o.base_name = s.base_name;
      if (o.new_name.empty()) o.new_name = s.new_name;
      o.moved |= s.moved;
      o.bytes.base += s.bytes.base;
      o.bytes.now += s.bytes.now;
      if (o.top_rank < 0 || magnitude(s.bytes.delta()) > magnitude(o.top_rank_delta)) {
        o.top_rank = d.base_rank;
        o.top_rank_delta = s.bytes.delta();
      }
      if (s.beyond_noise) ++o.ranks_changed, o.beyond_noise = true;
    }
    if (d.sites.size() > options.top_sites) d.sites.resize(options.top_sites);
    // Reserved memory is the allocator's cache, much of it reserved before the window opened
    // (the same loop run twice can differ there by what warm-up left behind): said, never named
    // as a change of memory on its own.
    d.reserved_changed = magnitude(d.peak_reserved.delta()) > threshold;
    const std::pair<const char*, const Pair*> checks[] = {{"peak allocated", &d.peak_allocated},
                                                          {"persistent", &d.persistent},
                                                          {"held at the end", &d.live_at_close},
                                                          {"kept a batch", &d.kept_per_batch}};
    for (const auto& [what, p] : checks) {
      if (magnitude(p->delta()) <= threshold) continue;
      d.changed = true;
      d.what_changed += (d.what_changed.empty() ? "" : ", ") + std::string(what);
    }
    if (d.changed) ++out.ranks_changed;
    out.ranks.push_back(std::move(d));
  }
  for (auto& [k, s] : over) out.sites.push_back(std::move(s));
  std::sort(out.sites.begin(), out.sites.end(), by_change);
  if (out.sites.size() > options.top_sites) out.sites.resize(options.top_sites);

  // Findings: by kind, rank (not in a two-window diff) and code path.
  {
    auto keep = [](const SideData&, const Finding&) { return true; };
    std::map<std::string, const Finding*> in_new;
    for (const auto& f : now.findings)
      if (keep(now, f)) in_new.emplace(finding_key(f, out.windows_mode), &f);
    for (const auto& f : base.findings) {
      if (!keep(base, f)) continue;
      FindingChange c;
      c.base = f;
      auto it = in_new.find(finding_key(f, out.windows_mode));
      if (it != in_new.end()) {
        c.state = "still";
        c.now = *it->second;
        in_new.erase(it);
      } else {
        c.state = "resolved";
      }
      out.findings.push_back(std::move(c));
    }
    for (const auto& f : now.findings) {
      if (!keep(now, f) || !in_new.count(finding_key(f, out.windows_mode))) continue;
      in_new.erase(finding_key(f, out.windows_mode));
      out.findings.push_back({"new", {}, f});
    }
  }

  // The headline.
  const bool findings_changed = std::any_of(out.findings.begin(), out.findings.end(), [](const FindingChange& c) { return c.state != "still"; });
  const bool sites_changed = std::any_of(out.sites.begin(), out.sites.end(), [](const SiteDelta& s) { return s.beyond_noise; });
  out.no_change = out.ranks_changed == 0 && !findings_changed && !sites_changed && out.ranks_only_base.empty() &&
                  out.ranks_only_new.empty();
  const std::string of = std::to_string(out.ranks.size());
  if (out.no_change) {
    out.headline = "no change in memory beyond noise (" + human_bytes(threshold) + ") on " + of + (out.ranks.size() == 1 ? " rank" : " ranks");
  } else {
    out.headline = std::to_string(out.ranks_changed) + " of " + of + (out.ranks.size() == 1 ? " rank" : " ranks") +
                   " changed beyond noise (" + human_bytes(threshold) + "); peak allocated, median rank " +
                   human_bytes(out.median_peak.base) + " -> " + human_bytes(out.median_peak.now) + " (" +
                   percent(out.median_peak) + "), highest rank " + human_bytes(out.max_peak.base) + " -> " +
                   human_bytes(out.max_peak.now) + " (" + percent(out.max_peak) + ")";
  }

  // The CI gate: the rank whose peak grew most beyond noise, as a fraction of its base peak.
  if (options.fail_on_growth) {
    const RankDiff* worst = nullptr;
    double worst_frac = 0;
    for (const auto& d : out.ranks) {
      if (d.peak_allocated.delta() <= 0 || magnitude(d.peak_allocated.delta()) <= threshold) continue;
      const double frac = d.peak_allocated.base == 0 ? INFINITY
                                                     : static_cast<double>(d.peak_allocated.delta()) / static_cast<double>(d.peak_allocated.base);
      if (frac > *options.fail_on_growth && (!worst || frac > worst_frac)) worst = &d, worst_frac = frac;
    }
    if (worst) {
      out.growth_failed = true;
      const SiteDelta* grew = nullptr;
      for (const auto& s : worst->sites)
        if (s.bytes.delta() > 0 && (!grew || s.bytes.delta() > grew->bytes.delta())) grew = &s;
      char frac[32];
      std::snprintf(frac, sizeof frac, "%.3g", *options.fail_on_growth);
      out.growth_line = "rank " + std::to_string(worst->new_rank) + "'s peak allocated grew " +
                        human_bytes(worst->peak_allocated.base) + " -> " + human_bytes(worst->peak_allocated.now) + " (" +
                        percent(worst->peak_allocated) + ", over --fail-on-growth " + frac + ")" +
                        (grew ? ", most at " + short_site(grew->new_name.empty() ? grew->key : grew->new_name) + " (" +
                                    signed_bytes(grew->bytes.delta()) + ")"
                              : std::string());
    }
  }
  return out;
}

json to_json(const DiffResult& r, const std::vector<std::pair<int, std::string>>& pages) {
  std::map<int, std::string> page_of(pages.begin(), pages.end());
  json ranks = json::array();
  for (const auto& d : r.ranks) {
    json cats = json::object();
    for (int c = 0; c < kCategoryCount; ++c) cats[category_name(static_cast<Category>(c))] = pair_json(d.categories[c]);
    json batches = json::array();
    for (const auto& b : d.batches)
      batches.push_back({{"batch", json::array({b.base_batch, b.new_batch})}, {"peak", pair_json(b.peak)}, {"low", pair_json(b.low)}});
    json sites = json::array();
    for (const auto& s : d.sites) sites.push_back(site_json(s, false));
    json j = {{"rank", d.base_rank},
              {"new_rank", d.new_rank},
              {"status", json::array({d.base_status, d.new_status})},
              {"changed", d.changed},
              {"reserved_changed", d.reserved_changed},
              {"what_changed", d.what_changed},
              {"peak_allocated", pair_json(d.peak_allocated)},
              {"peak_reserved", pair_json(d.peak_reserved)},
              {"persistent", pair_json(d.persistent)},
              {"live_at_close", pair_json(d.live_at_close)},
              {"fragmentation", pair_json(d.fragmentation)},
              {"kept_per_batch", pair_json(d.kept_per_batch)},
              {"kept_site", json::array({d.kept_site_base, d.kept_site_new})},
              {"categories", cats},
              {"batches", batches},
              {"sites", sites}};
    if (auto it = page_of.find(d.base_rank); it != page_of.end()) j["page"] = it->second;
    if (d.stacks) j["stacks"] = stack_json(*d.stacks);
    ranks.push_back(std::move(j));
  }
  json sites = json::array();
  for (const auto& s : r.sites) sites.push_back(site_json(s, true));
  json cats = json::object();
  for (int c = 0; c < kCategoryCount; ++c) cats[category_name(static_cast<Category>(c))] = pair_json(r.categories[c]);
  json findings = json::array();
  for (const auto& f : r.findings)
    findings.push_back({{"state", f.state}, {"base", finding_or_null(f.base)}, {"new", finding_or_null(f.now)}});
  return {{"format_version", kDiffFormatVersion},
          {"base", {{"label", r.base_label}, {"run_name", r.base_run}, {"world_size", r.base_world}}},
          {"new", {{"label", r.new_label}, {"run_name", r.new_run}, {"world_size", r.new_world}}},
          {"windows_mode", r.windows_mode},
          {"headline", r.headline},
          {"no_change", r.no_change},
          {"ranks_changed", r.ranks_changed},
          {"ranks_only_base", r.ranks_only_base},
          {"ranks_only_new", r.ranks_only_new},
          {"noise",
           {{"threshold", r.noise.threshold},
            {"rank_spread", r.noise.rank_spread},
            {"batch_spread", r.noise.batch_spread},
            {"floor", r.noise.floor},
            {"how", r.noise.how}}},
          {"median_peak", pair_json(r.median_peak)},
          {"max_peak", pair_json(r.max_peak)},
          {"categories", cats},
          {"sites", sites},
          {"findings", findings},
          {"fail_on_growth", {{"failed", r.growth_failed}, {"line", r.growth_line}}},
          {"ranks", ranks}};
}

std::vector<std::string> summary_lines(const DiffResult& r) {
  std::vector<std::string> lines;
  lines.push_back(r.headline);
  if (!r.ranks_only_base.empty() || !r.ranks_only_new.empty())
    lines.push_back("  world size " + std::to_string(r.base_world) + " -> " + std::to_string(r.new_world) + ": " +
                    std::to_string(r.ranks_only_base.size()) + " ranks only in base, " +
                    std::to_string(r.ranks_only_new.size()) + " only in new");
  // The ranks that changed most (by their largest change beyond noise).
  std::vector<const RankDiff*> changed;
  for (const auto& d : r.ranks)
    if (d.changed) changed.push_back(&d);
  auto biggest = [](const RankDiff& d) {
    return std::max({magnitude(d.peak_allocated.delta()), magnitude(d.persistent.delta()), magnitude(d.live_at_close.delta()),
                     magnitude(d.peak_reserved.delta())});
  };
  std::stable_sort(changed.begin(), changed.end(), [&](const RankDiff* a, const RankDiff* b) { return biggest(*a) > biggest(*b); });
  for (std::size_t i = 0; i < changed.size() && i < 3; ++i) {
    const RankDiff& d = *changed[i];
    std::string who = r.windows_mode ? "rank " + std::to_string(d.base_rank) + " -> rank " + std::to_string(d.new_rank)
                                     : "rank " + std::to_string(d.base_rank);
    lines.push_back("  " + who + ": peak " + human_bytes(d.peak_allocated.base) + " -> " + human_bytes(d.peak_allocated.now) +
                    " (" + signed_bytes(d.peak_allocated.delta()) + "), persistent " + human_bytes(d.persistent.base) +
                    " -> " + human_bytes(d.persistent.now) + ", held at the end " + human_bytes(d.live_at_close.base) +
                    " -> " + human_bytes(d.live_at_close.now) + " [" + d.what_changed + "]");
  }
  if (changed.size() > 3) lines.push_back("  ... and " + std::to_string(changed.size() - 3) + " more ranks (diff.json)");
  // Sites that grew and shrank most.
  int grew = 0, shrank = 0;
  for (const auto& s : r.sites) {
    if (!s.beyond_noise) continue;
    const bool up = s.bytes.delta() > 0;
    if ((up ? grew : shrank) >= 3) continue;
    (up ? grew : shrank)++;
    const std::string name = short_site(!s.new_name.empty() ? s.new_name : s.base_name);
    const bool tagged = !name.empty() && name[0] == '<';  // "<no stack> [category]" says its category
    std::string line = std::string("  site ") + (up ? "grew: " : "shrank: ") + name +
                       (tagged ? std::string(" ") : " [" + std::string(category_name(s.category)) + "] ") +
                       human_bytes(s.bytes.base) + " -> " + human_bytes(s.bytes.now) + " at the peak over " +
                       std::to_string(s.ranks_changed) + (s.ranks_changed == 1 ? " rank" : " ranks") + " (most on rank " +
                       std::to_string(s.top_rank) + ": " + signed_bytes(s.top_rank_delta) + ")";
    if (s.moved) line += ", moved from " + short_site(s.base_name);
    lines.push_back(line);
  }
  int shown = 0;
  for (const auto& f : r.findings) {
    if (f.state == "still" || shown >= 6) continue;
    ++shown;
    const Finding& x = f.state == "resolved" ? f.base : f.now;
    lines.push_back("  finding " + f.state + ": " + x.kind + " on rank " + std::to_string(x.rank) +
                    (x.bytes ? " (" + human_bytes(x.bytes) + ")" : std::string()) +
                    (x.site.empty() ? std::string() : " at " + short_site(x.site)));
  }
  lines.push_back("  noise: " + r.noise.how);
  return lines;
}

}  // namespace memsnap::diff
