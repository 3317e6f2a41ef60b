// Builds the rank page's data from one recorded window: allocation bands (the largest one by one,
// the rest summed into one band), total allocated/reserved series, allocator state, sites.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "html/html.hpp"
#include "memsnap/report.hpp"
#include "memsnap/window_replay.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

struct Interval {
  std::uint64_t addr = 0, size = 0, stream = 0;
  std::int64_t start = 0, end = -1;  // end -1: live at window end
  std::uint32_t stack = kNoStack;
  std::int16_t device = 0;
  bool in_window = false;  // made by an alloc event of the window, not live at its open
};

// A step series reduced to about `limit` points, keeping each bucket's highest value so that
// peaks survive the reduction.
void downsample(const std::vector<std::int64_t>& t, const std::vector<std::uint64_t>& v, std::size_t limit,
                std::vector<std::int64_t>& out_t, std::vector<std::uint64_t>& out_v) {
  out_t.clear();
  out_v.clear();
  if (t.size() <= limit) {
    out_t = t;
    out_v = v;
    return;
  }
  const std::int64_t t0 = t.front(), t1 = t.back();
  const double width = std::max<double>(1.0, static_cast<double>(t1 - t0) / static_cast<double>(limit));
  std::size_t i = 0;
  while (i < t.size()) {
    const auto bucket = static_cast<std::int64_t>(static_cast<double>(t[i] - t0) / width);
    std::uint64_t top = v[i];
    const std::int64_t first = t[i];
    std::size_t j = i;
    while (j < t.size() && static_cast<std::int64_t>(static_cast<double>(t[j] - t0) / width) == bucket) {
      top = std::max(top, v[j]);
      ++j;
    }
    out_t.push_back(first);
    out_v.push_back(top);
    if (j == t.size() && v.back() != top) {  // the level the window ends at
      out_t.push_back(t.back());
      out_v.push_back(v.back());
    }
    i = j;
  }
}

// The step series (t, v) over [t0, t1] as n levels at equal steps of time, each the highest the
// series reaches in its step (the level it enters the step with included).
std::vector<std::uint64_t> levels_at_equal_steps(const std::vector<std::int64_t>& t,
                                                 const std::vector<std::uint64_t>& v, std::int64_t t0, std::int64_t t1,
                                                 std::size_t n) {
  std::vector<std::uint64_t> out(n, 0);
  if (t.empty() || n == 0) return out;
  const double width = static_cast<double>(t1 - t0) / static_cast<double>(n);
  std::size_t j = 0;
  std::uint64_t level = v.front();
  for (std::size_t b = 0; b < n; ++b) {
    const double end =
        b + 1 == n ? static_cast<double>(t1) + 1 : static_cast<double>(t0) + width * static_cast<double>(b + 1);
    std::uint64_t top = level;
    while (j < t.size() && static_cast<double>(t[j]) < end) {
      level = v[j++];
      top = std::max(top, level);
    }
    out[b] = top;
  }
  return out;
}

}  // namespace

json rank_page_data(const RankRecord& rank, const WindowRecord& w, const WindowStats& s, const std::string& run_name,
                    int world_size, std::size_t max_bands, const json& links, PageDigest* digest) {
  const std::int64_t t0 = w.open_time_ns;
  std::int64_t t1 = w.close_time_ns;
  for (const auto& e : w.events) t1 = std::max(t1, e.time_ns);
  for (const auto& b : w.batches) t1 = std::max(t1, b.time_ns);
  if (t1 <= t0) t1 = t0 + 1;

  // Allocation lifetimes, and the allocated/reserved series, in one replay: an allocation's
  // interval is the one its LiveBlock::serial numbers.
  std::vector<Interval> intervals;
  WindowReplay replay(w);
  replay.restart([&](const LiveAlloc& a, const LiveBlock&) {
    intervals.push_back(
        Interval{a.addr, a.size, a.stream, std::min(a.time_ns > 0 ? a.time_ns : t0, t0), -1, a.stack_id, a.device, false});
  });
  std::vector<std::int64_t> series_t{t0};
  std::vector<std::uint64_t> series_alloc{replay.allocated()}, series_res{replay.reserved()};
  json ooms = json::array();
  bool reserved_seen = !replay.segments().empty();  // the source reported segments
  while (!replay.done()) {
    const Event& e = w.events[replay.applied()];
    if (is_segment_action(e.action)) reserved_seen = true;
    const ReplayStep step = replay.step();
    if (step.kind == ReplayStep::oom) {
      ooms.push_back({{"time_ns", e.time_ns}, {"size", e.size}, {"device_free", e.addr}, {"device", e.device}});
      continue;
    }
    if (step.kind == ReplayStep::none) continue;
    if (step.ended && (step.kind == ReplayStep::alloc || step.kind == ReplayStep::free)) intervals[step.old.serial].end = e.time_ns;
    if (step.kind == ReplayStep::alloc) intervals.push_back(Interval{e.addr, e.size, e.stream, e.time_ns, -1, e.stack_id, e.device, true});
    series_t.push_back(e.time_ns);
    series_alloc.push_back(replay.allocated());
    series_res.push_back(replay.reserved());
  }
  if (!reserved_seen) series_res = series_alloc;  // the source saw no segments

  // Level of detail: the largest allocations one by one, the rest as one summed band.
  std::vector<std::size_t> order(intervals.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (order.size() > max_bands) {
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(max_bands), order.end(),
                     [&](std::size_t a, std::size_t b) { return intervals[a].size > intervals[b].size; });
    order.resize(max_bands);
  }
  std::sort(order.begin(), order.end());  // allocation order: how the timeline stacks them
  std::vector<bool> is_band(intervals.size(), false);
  for (auto i : order) is_band[i] = true;

  // Frames and stacks referenced by the page, renumbered compactly. An allocation the autograd
  // engine made without Python frames in a window that has them (made_without_python) gets a
  // page stack of its own, named by the site and category the analysis gives it.
  const bool python_window = python_frames_recorded(rank, w);
  std::unordered_map<std::uint64_t, int> stack_map;
  std::unordered_map<std::uint32_t, int> frame_map;
  std::unordered_map<std::string, int> site_index;
  json site_names = json::array(), stack_sites = json::array();
  json frames_name = json::array(), frames_file = json::array(), frames_line = json::array(), stacks = json::array();
  auto use_stack = [&](std::uint32_t id, bool engine) -> int {
    if (id >= rank.stacks.size() && !engine) return -1;
    const std::uint64_t page_key = (static_cast<std::uint64_t>(engine) << 32) | id;
    if (auto it = stack_map.find(page_key); it != stack_map.end()) return it->second;
    json frames = json::array();
    for (auto f : id < rank.stacks.size() ? rank.stacks[id] : Stack{}) {
      if (f >= rank.frames.size()) continue;
      auto [it, inserted] = frame_map.try_emplace(f, static_cast<int>(frame_map.size()));
      if (inserted) {
        frames_name.push_back(rank.frames[f].name);
        frames_file.push_back(rank.frames[f].file);
        frames_line.push_back(rank.frames[f].line);
      }
      frames.push_back(it->second);
    }
    const int mine = static_cast<int>(stacks.size());
    stacks.push_back(std::move(frames));
    // The stack's site, as the analysis names it (findings name sites): the page finds a
    // finding's allocations by it.
    auto [site, added] = site_index.try_emplace(engine ? std::string(kNoPythonFramesSite) : site_name(rank, id),
                                                static_cast<int>(site_index.size()));
    if (added) site_names.push_back(site->first);
    stack_sites.push_back(site->second);
    stack_map[page_key] = mine;
    return mine;
  };
  std::unordered_map<std::uint32_t, int> category_of_stack;
  auto category = [&](std::uint32_t id, bool engine) {
    if (engine) return static_cast<int>(Category::gradients);
    auto [it, inserted] = category_of_stack.try_emplace(id, 0);
    if (inserted) it->second = static_cast<int>(categorize(rank, id));
    return it->second;
  };

  json a_addr = json::array(), a_size = json::array(), a_start = json::array(), a_end = json::array(),
       a_stream = json::array(), a_device = json::array(), a_stack = json::array(), a_cat = json::array();
  for (auto i : order) {
    const Interval& v = intervals[i];
    a_addr.push_back(v.addr);
    a_size.push_back(v.size);
    a_start.push_back(v.start);
    a_end.push_back(v.end);
    a_stream.push_back(v.stream);
    a_device.push_back(v.device);
    const bool engine = made_without_python(rank, v.stack, v.in_window, python_window);
    a_stack.push_back(use_stack(v.stack, engine));
    a_cat.push_back(category(v.stack, engine));
  }

  // The summed band: bytes held by the allocations not drawn one by one.
  std::vector<std::pair<std::int64_t, std::int64_t>> deltas;
  for (std::size_t i = 0; i < intervals.size(); ++i) {
    if (is_band[i]) continue;
    deltas.emplace_back(std::max(intervals[i].start, t0), static_cast<std::int64_t>(intervals[i].size));
    if (intervals[i].end >= 0) deltas.emplace_back(intervals[i].end, -static_cast<std::int64_t>(intervals[i].size));
  }
  std::stable_sort(deltas.begin(), deltas.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::int64_t> other_t{t0};
  std::vector<std::uint64_t> other_v{0};
  std::vector<std::uint64_t> other_count_v{0};
  std::int64_t level = 0, count = 0;
  for (const auto& [t, d] : deltas) {
    level += d;
    count += d > 0 ? 1 : -1;
    other_t.push_back(t);
    other_v.push_back(static_cast<std::uint64_t>(std::max<std::int64_t>(level, 0)));
    other_count_v.push_back(static_cast<std::uint64_t>(std::max<std::int64_t>(count, 0)));
  }
  std::vector<std::int64_t> ds_t;
  std::vector<std::uint64_t> ds_v;
  downsample(other_t, other_v, 4000, ds_t, ds_v);
  std::vector<std::int64_t> dc_t;
  std::vector<std::uint64_t> dc_v;
  downsample(other_t, other_count_v, 4000, dc_t, dc_v);
  if (dc_v.size() != ds_v.size()) dc_v.resize(ds_v.size(), dc_v.empty() ? 0 : dc_v.back());
  std::vector<std::int64_t> tot_t, tot_t2;
  std::vector<std::uint64_t> tot_a, tot_r;
  downsample(series_t, series_alloc, 4000, tot_t, tot_a);
  downsample(series_t, series_res, 4000, tot_t2, tot_r);
  // Allocated and reserved share one time axis on the page: re-sample reserved on it.
  std::vector<std::uint64_t> res_on_t;
  {
    std::size_t j = 0;
    std::uint64_t current = series_res.empty() ? 0 : series_res.front(), top = current;
    for (std::size_t k = 0; k < tot_t.size(); ++k) {
      const std::int64_t next = k + 1 < tot_t.size() ? tot_t[k + 1] : INT64_MAX;
      top = current;
      while (j < series_t.size() && series_t[j] < next) {
        current = series_res[j];
        top = std::max(top, current);
        ++j;
      }
      res_on_t.push_back(top);
    }
  }

  json segments = json::array();
  for (const auto& seg : w.segments) {
    json blocks = json::array();
    for (const auto& b : seg.blocks) {
      blocks.push_back({{"addr", b.addr}, {"size", b.size}, {"state", b.state}, {"stack", use_stack(b.stack_id, false)}});
    }
    segments.push_back({{"addr", seg.addr}, {"size", seg.size}, {"stream", seg.stream}, {"device", seg.device},
                        {"pool", seg.pool}, {"blocks", std::move(blocks)}});
  }

  json sites = json::array();
  for (const auto& site : s.sites) {
    sites.push_back({{"name", site.name}, {"stack", use_stack(site.stack_id, site.name == kNoPythonFramesSite)}, {"bytes", site.bytes_at_peak},
                     {"count", site.count_at_peak}, {"category", static_cast<int>(site.category)},
                     {"bytes_allocated", site.bytes_allocated}, {"allocations", site.allocations}});
  }
  // The flame graph's data (flame.js): the bytes live at the window's allocated peak by page stack
  // and category, from every allocation live then (those summed into one band too), so that they
  // add up to the peak. A second replay, stopped where the allocated level first reaches its
  // highest (where the analysis puts the peak). Largest first.
  json flame = {{"bytes_total", 0}, {"stack", json::array()}, {"category", json::array()}, {"bytes", json::array()}};
  {
    const std::uint64_t top = series_alloc.empty() ? 0 : *std::max_element(series_alloc.begin(), series_alloc.end());
    WindowReplay at_peak(w);
    while (at_peak.allocated() != top && !at_peak.done()) at_peak.step();
    std::map<std::pair<int, int>, std::uint64_t> by_stack;  // (page stack, category) -> bytes
    at_peak.live().for_each([&](std::uint64_t, const LiveBlock& b) {
      const bool engine = made_without_python(rank, b.stack_id, at_peak.made_in_window(b), python_window);
      by_stack[{use_stack(b.stack_id, engine), category(b.stack_id, engine)}] += b.size;
    });
    std::vector<std::pair<std::pair<int, int>, std::uint64_t>> rows(by_stack.begin(), by_stack.end());
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [key, bytes] : rows) {
      flame["stack"].push_back(key.first);
      flame["category"].push_back(key.second);
      flame["bytes"].push_back(bytes);
    }
    flame["bytes_total"] = at_peak.allocated();
  }

  json categories = json::array();
  for (int c = 0; c < kCategoryCount; ++c) categories.push_back(category_name(static_cast<Category>(c)));

  json batches = json::array();
  for (const auto& b : w.batches) batches.push_back({{"batch", b.batch}, {"time_ns", b.time_ns}});

  // The file an imported window came from, where the import recorded it (source_extras'
  // "source_file"): the page says "imported from NAME".
  std::string source_file;
  if (const auto at = w.source_extras.find("\"source_file\":\""); at != std::string::npos) {
    const auto begin = at + 15;
    const auto end = w.source_extras.find('"', begin);
    if (end != std::string::npos && end - begin < 4096) source_file = w.source_extras.substr(begin, end - begin);
  }

  // Per batch: what the findings speak of (a spike's peak, the low points a leak raises).
  json batch_stats = json::array();
  for (const auto& b : s.batches) {
    batch_stats.push_back({{"batch", b.batch}, {"peak_allocated", b.peak_allocated}, {"min_allocated", b.min_allocated},
                           {"live_at_start", b.live_at_start}, {"live_at_end", b.live_at_end}, {"peak_site", b.peak_site}});
  }

  if (digest != nullptr) {
    digest->rank = rank.meta.rank;
    digest->batch = w.batch_end;
    const auto levels = levels_at_equal_steps(series_t, series_alloc, t0, t1, kSparkPoints);
    digest->spark_max = levels.empty() ? 0 : *std::max_element(levels.begin(), levels.end());
    digest->spark = report::spark_levels(levels, digest->spark_max);
    digest->site_stacks = json::object();
    for (const auto& site : s.sites) {
      json frames = json::array();
      if (site.stack_id < rank.stacks.size()) {
        for (auto f : rank.stacks[site.stack_id]) {
          if (f < rank.frames.size() && frames.size() < 24) {
            frames.push_back({{"name", rank.frames[f].name}, {"file", rank.frames[f].file}, {"line", rank.frames[f].line}});
          }
        }
      }
      digest->site_stacks[site.name] = std::move(frames);
    }
  }

  return json{
      {"format_version", 1},
      {"run_name", run_name},
      {"rank", rank.meta.rank},
      {"world_size", world_size},
      {"host", rank.meta.host},
      {"device", rank.meta.device_name},
      {"source", rank.meta.source},
      {"source_file", source_file},
      {"batch_start", w.batch_start},
      {"batch_end", w.batch_end},
      {"status", status_name(w.status)},
      {"oom", s.oom},
      {"stats",
       {{"peak_allocated", s.peak_allocated},
        {"peak_allocated_time_ns", s.peak_allocated_time_ns},
        {"peak_reserved", s.peak_reserved},
        {"live_at_open", s.live_at_open},
        {"live_at_close", s.live_at_close},
        {"persistent", s.persistent},
        {"n_events", s.n_events},
        {"dropped", s.dropped},
        {"fragmentation_at_peak", s.fragmentation_at_peak}}},
      {"t0_ns", t0},
      {"t1_ns", t1},
      {"batches", std::move(batches)},
      {"batch_method",
       {{"method", w.batch_method}, {"confidence", w.batch_confidence}, {"detail", w.batch_detail}}},
      {"ooms", std::move(ooms)},
      {"frames", {{"name", std::move(frames_name)}, {"file", std::move(frames_file)}, {"line", std::move(frames_line)}}},
      {"stacks", std::move(stacks)},
      {"stack_sites", std::move(stack_sites)},
      {"site_names", std::move(site_names)},
      {"batch_stats", std::move(batch_stats)},
      {"allocs",
       {{"addr", std::move(a_addr)},
        {"size", std::move(a_size)},
        {"start_ns", std::move(a_start)},
        {"end_ns", std::move(a_end)},
        {"stream", std::move(a_stream)},
        {"device", std::move(a_device)},
        {"stack", std::move(a_stack)},
        {"category", std::move(a_cat)}}},
      {"other", {{"time_ns", ds_t}, {"bytes", ds_v}, {"count", dc_v}}},
      {"totals", {{"time_ns", tot_t}, {"allocated", tot_a}, {"reserved", res_on_t}}},
      {"segments", std::move(segments)},
      {"sites", std::move(sites)},
      {"flame", std::move(flame)},
      {"categories", std::move(categories)},
      {"links", links},
  };
}

}  // namespace memsnap
