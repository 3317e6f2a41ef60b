#include "memsnap/analysis.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string_view>
#include <unordered_map>

#include "categories.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/window_replay.hpp"
#include "text.hpp"

namespace memsnap {
namespace {

using text::contains;

// Frames that say how memory was allocated rather than who wanted it.
bool is_plumbing(const Frame& f) {
  static constexpr std::string_view names[] = {
      "memsnap",        "c10::",           "at::",          "cudaMalloc",      "cuMem",
      "CachingAllocator", "std::",     "__libc_start",  "_start",          "operator new",
      "malloc",         "torch::autograd::", "pybind11",    "_PyEval",         "PyObject_",
      "_PyObject",      "_PyFunction",     "THPVariable",   "cfunction_call",  "method_vectorcall",
      "torch::jit::",   "torch::unwind",   "torch::CapturedTraceback", "torch::cuda::", "_call_impl",      "_wrapped_call_impl", "decorate_context", "0x"};
  static constexpr std::string_view files[] = {
      "libc10",          "libtorch",         "libcuda",          "libcudart",    "libpython",
      "torch/nn/modules/module.py", "torch/utils/_contextlib.py", "torch/_tensor.py",
      "torch/autograd/__init__.py", "torch/autograd/graph.py", "torch/_ops.py", "torch/cuda/memory.py",
      "torch/utils/_device.py",     "torch/nn/functional.py",   "torch/_compile.py", "<frozen"};
  for (auto n : names) {
    if (f.name.rfind(n, 0) == 0 || (n.size() > 4 && contains(f.name, n))) return true;
  }
  for (auto p : files) {
    if (contains(f.file, p)) return true;
  }
  return false;
}

bool is_python(const Frame& f) {
  return f.file.size() > 3 && f.file.compare(f.file.size() - 3, 3, ".py") == 0;
}

// Python code installed as a package (torch itself, transformers, ...), not the user's; also the
// code torch.compile generates (Inductor's output modules in its cache folder, FX's
// `<eval_with_key>` graphs): the user's line is the one that called the compiled model.
bool is_installed_library(const Frame& f) {
  static constexpr std::string_view parts[] = {"site-packages/", "dist-packages/", "/lib/python3", "<frozen",
                                               "torchinductor_", "/torch/_inductor/", "<eval_with_key", "/torch/_dynamo/"};
  for (auto p : parts) {
    if (contains(f.file, p)) return true;
  }
  return false;
}

}  // namespace

std::string frame_label(const Frame& f) {
  std::string s = f.name.empty() ? std::string("??") : f.name;
  if (!f.file.empty()) {
    s += " (" + f.file;
    if (f.line > 0) s += ":" + std::to_string(f.line);
    s += ")";
  }
  return s;
}

bool is_user_code(const Frame& f) { return is_python(f) && !is_installed_library(f); }

std::string site_name(const RankRecord& rank, std::uint32_t stack_id) {
  if (!has_frames(rank, stack_id)) return "<no stack>";
  const Stack& stack = rank.stacks[stack_id];
  // The innermost line of the user's own code says where to look; failing that, the innermost
  // Python frame (in a mixed stack, torch's stacks="all", C++ frames come first), then any.
  for (auto id : stack) {
    if (id < rank.frames.size() && is_user_code(rank.frames[id]) && !is_plumbing(rank.frames[id]))
      return frame_label(rank.frames[id]);
  }
  for (auto id : stack) {
    if (id < rank.frames.size() && is_python(rank.frames[id]) && !is_plumbing(rank.frames[id])) return frame_label(rank.frames[id]);
  }
  for (auto id : stack) {
    if (id < rank.frames.size() && !is_plumbing(rank.frames[id])) return frame_label(rank.frames[id]);
  }
  return stack.front() < rank.frames.size() ? frame_label(rank.frames[stack.front()]) : "<no stack>";
}

namespace {

constexpr const char* kNoStackSite = "<no stack>";
// A site without frames names no line of code to look at.
bool frameless_site(const std::string& name) { return name == kNoStackSite || name == kNoPythonFramesSite; }

// Per batch: which site a spike in it is made of; per window: how the batches' low points grow,
// and which site grows with them. One more replay, tallying the live allocations by site at each
// batch's low point and at its peak.
//
// `made`: the allocations made in the window and live at its end, which the first replay leaves
// in the live table. `site_of(stack, made_in_window)`.
template <class SiteOf>
void batch_growth_by_site(const RankRecord& rank, const WindowRecord& w, WindowReplay& replay, SiteOf& site_of,
                          const std::vector<std::ptrdiff_t>& start_index, const std::vector<std::ptrdiff_t>& peak_index,
                          const std::vector<LiveBlock>& made, std::size_t top_sites, WindowStats& s) {
  const std::size_t nb = s.batches.size();
  if (nb == 0) return;
  using Tally = std::unordered_map<std::string, double>;
  // Sites are numbered as first met, so that a tally point costs no string hashing: the replay
  // passes a batch's low point and its peak for each of thousands of batches, with every live
  // allocation counted at each.
  std::vector<const std::pair<std::string, Category>*> sites;
  std::unordered_map<const void*, std::uint32_t> site_by_entry;  // site_of's pair -> site number
  std::unordered_map<std::string_view, std::uint32_t> site_by_name;
  auto site_index = [&](const std::pair<std::string, Category>& entry) {
    auto [it, fresh] = site_by_entry.try_emplace(&entry, 0);
    if (fresh) {
      auto [named, new_name] = site_by_name.try_emplace(entry.first, static_cast<std::uint32_t>(sites.size()));
      if (new_name) sites.push_back(&entry);
      it->second = named->second;
    }
    return it->second;
  };
  // Per point, the bytes of each site some live allocation was counted for (also 0 bytes), by
  // site number; in each site the same additions in the same order as a tally by name.
  using SiteBytes = std::vector<std::pair<std::uint32_t, double>>;
  std::vector<SiteBytes> at_start(nb), at_peak(nb);
  // (event index after which to tally, slot): slot < nb a start, else a peak.
  std::vector<std::pair<std::ptrdiff_t, std::size_t>> points;
  for (std::size_t b = 0; b < nb; ++b) {
    points.emplace_back(start_index[b], b);
    points.emplace_back(peak_index[b], nb + b);
  }
  std::sort(points.begin(), points.end());
  std::vector<double> scratch;
  std::vector<char> counted;
  std::vector<std::uint32_t> touched;
  auto tally = [&](SiteBytes& t) {
    replay.live().for_each([&](std::uint64_t, const LiveBlock& l) {
      const std::uint32_t i = site_index(site_of(l.stack_id, replay.made_in_window(l)));
      if (i >= scratch.size()) {
        scratch.resize(i + 1, 0.0);
        counted.resize(i + 1, 0);
      }
      if (!counted[i]) {
        counted[i] = 1;
        touched.push_back(i);
      }
      scratch[i] += static_cast<double>(l.size);
    });
    std::sort(touched.begin(), touched.end());
    t.reserve(touched.size());
    for (std::uint32_t i : touched) {
      t.emplace_back(i, scratch[i]);
      scratch[i] = 0.0;
      counted[i] = 0;
    }
    touched.clear();
  };
  auto point_tally = [&](std::size_t slot) -> SiteBytes& { return slot < nb ? at_start[slot] : at_peak[slot - nb]; };
  replay.restart();
  std::size_t p = 0;
  while (p < points.size() && points[p].first < 0) {
    tally(point_tally(points[p].second));
    ++p;
  }
  for (std::size_t i = 0; i < w.events.size() && p < points.size(); ++i) {
    replay.step();
    while (p < points.size() && points[p].first == static_cast<std::ptrdiff_t>(i)) {
      tally(point_tally(points[p].second));
      ++p;
    }
  }

  // The lowest low point's sites (the first batch's on a tie).
  std::size_t low = 0;
  for (std::size_t b = 1; b < nb; ++b) {
    if (s.batches[b].min_allocated < s.batches[low].min_allocated) low = b;
  }
  for (const auto& [site, bytes] : at_start[low]) {
    if (bytes > 0) s.sites_at_low.push_back(HeldSite{sites[site]->first, sites[site]->second, bytes_of(bytes)});
  }
  std::sort(s.sites_at_low.begin(), s.sites_at_low.end(), [](const HeldSite& a, const HeldSite& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  if (s.sites_at_low.size() > top_sites) s.sites_at_low.resize(top_sites);

  // Spikes: a site's bytes at this batch's peak against the median of its other batches' peaks.
  if (nb >= 2) {
    // Per site, its peak bytes in every batch (0 where it held nothing) sorted once: the median
    // of the others is that list less one copy of this batch's own value.
    std::vector<std::vector<std::pair<std::size_t, double>>> peaks_of(sites.size());  // (batch, bytes)
    for (std::size_t b = 0; b < nb; ++b) {
      for (const auto& [site, bytes] : at_peak[b]) peaks_of[site].emplace_back(b, bytes);
    }
    std::vector<std::vector<std::pair<std::uint32_t, double>>> excess_in(nb);  // (site, excess)
    std::vector<double> sorted;
    for (std::uint32_t site = 0; site < peaks_of.size(); ++site) {
      if (peaks_of[site].empty()) continue;
      sorted.assign(nb, 0.0);
      for (const auto& [b, bytes] : peaks_of[site]) sorted[b] = bytes;
      std::sort(sorted.begin(), sorted.end());
      const std::size_t m = nb - 1;  // the others
      for (const auto& [b, bytes] : peaks_of[site]) {
        const std::size_t gone = static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), bytes) - sorted.begin());
        auto other = [&](std::size_t k) { return sorted[k < gone ? k : k + 1]; };
        const double median_others = m % 2 ? other(m / 2) : (other(m / 2 - 1) + other(m / 2)) / 2;
        excess_in[b].emplace_back(site, bytes - median_others);
      }
    }
    for (std::size_t b = 0; b < nb; ++b) {
      std::string best;
      double best_excess = 0;
      // Allocations without frames (torch's backward runs on a thread with no Python stack)
      // name no line of code: a site with frames that holds a good part of the excess says more.
      std::string named;
      double named_excess = 0;
      for (const auto& [site, excess] : excess_in[b]) {
        const std::string& name = sites[site]->first;
        // Ties go to the smaller name, whatever order the sites were met in.
        if (excess > best_excess || (excess > 0 && excess == best_excess && name < best)) {
          best_excess = excess;
          best = name;
        }
        if (!frameless_site(name) && (excess > named_excess || (excess > 0 && excess == named_excess && name < named))) {
          named_excess = excess;
          named = name;
        }
      }
      if (frameless_site(best) && !named.empty() && named_excess >= 0.05 * best_excess) {
        best = named;
        best_excess = named_excess;
      }
      s.batches[b].peak_site = best;
      s.batches[b].peak_site_excess = bytes_of(best_excess);
    }
  }

  // Growth from the first batch start to the last.
  if (nb >= 2) {
    const double spans = static_cast<double>(nb - 1);
    s.growth_per_batch =
        (static_cast<double>(s.batches.back().min_allocated) - static_cast<double>(s.batches.front().min_allocated)) / spans;
    s.growth_monotone = true;
    for (std::size_t b = 1; b < nb; ++b) s.growth_monotone &= s.batches[b].min_allocated >= s.batches[b - 1].min_allocated;
    // The site of what leaks: allocations made from the first batch on, before the last batch
    // began, and never freed by the window's end. A batch's own tensors are gone a batch later
    // (gradients at the next zero_grad, outputs when their names are rebound); these are not.
    std::vector<std::int64_t> starts;
    for (const auto& m : w.batches) starts.push_back(m.time_ns);
    std::sort(starts.begin(), starts.end());
    // Optimizer state created in these batches (a parameter's first gradient: mixture of
    // experts, sparse embeddings) raises the low points too, but stops once every parameter has
    // its state: growth, but no leak. Taken out of the growth and never its site.
    Tally kept;
    double state_made = 0;
    for (const auto& e : made) {
      if (e.time_ns < starts.front() || e.time_ns >= starts.back()) continue;
      const auto& [name, category] = site_of(e.stack_id, true);
      if (category == Category::optimizer_state) state_made += static_cast<double>(e.size);
      else kept[name] += static_cast<double>(e.size);
    }
    s.growth_per_batch -= state_made / spans;
    double best = 0;
    for (const auto& [name, bytes] : kept) {
      if (bytes / spans > best || (bytes > 0 && bytes / spans == best && name < s.growth_site)) {
        best = bytes / spans;
        s.growth_site = name;
      }
    }
    s.growth_site_per_batch = best;

    // What the batches keep for good. An allocation made in the window and live at its end is
    // either the last batch's own (its inputs, outputs and gradients, freed when the next batch
    // rebinds them) or kept. A code path (one stack) whose live allocations were made at two or
    // more separate times, more than a quarter of a batch apart, keeps memory batch after batch,
    // wherever the batch boundaries fell. Grouped by stack, not by site: two views through one
    // model, or a GAN's two backward passes, allocate what the last batch holds at two times
    // but from two stacks. Allocations without a stack (autograd's backward thread, or every
    // allocation of a source recorded without stacks) are grouped by size instead and need
    // three times: the last batch's own tensors come at several times but rarely in one size.
    // What all times but the last made, per time: independent of the batches' low points (which
    // vary with the batches' sizes), and the same on every rank that runs the same leaking code.
    // In double: a hostile record's times may be anywhere in int64 (their difference overflows).
    const double period = (static_cast<double>(starts.back()) - static_cast<double>(starts.front())) / spans;
    using Times = std::vector<std::pair<std::int64_t, std::uint64_t>>;  // (time, size), by time
    std::map<std::pair<std::uint32_t, std::uint64_t>, Times> kept_by_path;
    for (const auto& e : made) kept_by_path[{e.stack_id, has_frames(rank, e.stack_id) ? 0 : e.size}].emplace_back(e.time_ns, e.size);
    // Consecutive allocations more than a quarter of a batch apart start a new time, and so do
    // two with a recorded batch mark between them (marks from the job itself are exact; a batch
    // can be far shorter than the window's mean, the first one holding the window's opening):
    // each time's first allocation and its bytes.
    const bool recorded = w.batch_method == "recorded";
    auto mark_between = [&](std::int64_t a, std::int64_t b) {
      auto it = std::upper_bound(starts.begin(), starts.end(), a);
      return it != starts.end() && *it <= b;
    };
    auto times_of = [&](Times& list) {
      std::sort(list.begin(), list.end());
      Times out;
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (i == 0 || static_cast<double>(list[i].first) - static_cast<double>(list[i - 1].first) > period / 4 ||
            (recorded && mark_between(list[i - 1].first, list[i].first))) {
          out.emplace_back(list[i].first, 0);
        }
        out.back().second += list[i].second;
      }
      return out;
    };
    // Per time, or per batch where it kept less often than every batch (a sample grid every
    // other batch); batch durations vary too much (a spike batch is slow) to count by time.
    auto per_batch_of = [&](double bytes, const Times& times) {
      const auto crossed = std::count_if(starts.begin(), starts.end(), [&](std::int64_t t) {
        return t > times.front().first && t <= times.back().first;
      });
      return bytes / static_cast<double>(std::max<std::int64_t>(static_cast<std::int64_t>(times.size()) - 1, crossed));
    };
    double total = 0, top = 0;
    auto count = [&](double per_batch, std::uint32_t stack, std::size_t times) {
      total += per_batch;
      const std::string& name = site_of(stack, true).first;
      if (per_batch > top || (per_batch == top && name < s.retained_site)) {
        top = per_batch;
        s.retained_site = name;
        s.retained_times = static_cast<std::uint32_t>(times);
      }
    };
    // Optimizer state is created when a parameter first gets a gradient: in a mixture of
    // experts, or with sparse embeddings, that is at any step, for a few parameters at a time,
    // and it stops when every parameter has its state. Not what a batch keeps.
    auto optimizer_state = [&](std::uint32_t stack) { return site_of(stack, true).second == Category::optimizer_state; };
    for (auto& [path, list] : kept_by_path) {
      if (optimizer_state(path.first)) continue;
      const Times times = times_of(list);
      if (times.size() < (has_frames(rank, path.first) ? 2u : 3u)) continue;
      double kept_bytes = 0;
      for (std::size_t t = 0; t + 1 < times.size(); ++t) kept_bytes += static_cast<double>(times[t].second);
      count(per_batch_of(kept_bytes, times), path.first, times.size());
    }
    // Kept by regrowing one tensor: `all = torch.cat([all, new])` frees the last result each
    // time, so nothing from earlier times is still held, but the code path's allocations grow
    // by the same amount every time (within 10 %), at three times or more, and the last is
    // held at the window's end. Inputs whose sizes vary (a run of longer batches) do not grow
    // by equal steps.
    std::unordered_map<std::uint32_t, Times> allocs_of;
    for (const auto& e : made) {
      if (has_frames(rank, e.stack_id) && !optimizer_state(e.stack_id)) allocs_of.try_emplace(e.stack_id);
    }
    if (!allocs_of.empty()) {
      for (const Event& e : w.events) {
        if (e.action != Action::alloc) continue;
        if (auto it = allocs_of.find(e.stack_id); it != allocs_of.end()) it->second.emplace_back(e.time_ns, e.size);
      }
    }
    for (auto& [stack, list] : allocs_of) {
      if (kept_by_path.at({stack, 0}).size() != 1) continue;  // only the last result is held
      Times times = times_of(list);
      if (times.size() < 3) continue;
      std::vector<double> steps;
      for (std::size_t t = 1; t < times.size(); ++t) {
        steps.push_back(static_cast<double>(times[t].second) - static_cast<double>(times[t - 1].second));
      }
      const double step = median(steps);
      if (step <= 0) continue;
      const bool larger = std::all_of(steps.begin(), steps.end(), [](double d) { return d > 0; });
      s.growth_regrown |= larger;
      const bool even = std::all_of(steps.begin(), steps.end(), [&](double d) { return std::fabs(d - step) <= 0.1 * step; });
      if (!even) continue;
      count(per_batch_of(step * static_cast<double>(times.size() - 1), times), stack, times.size());
    }
    s.retained_per_batch = total;
    // Without a stack anywhere there is no code path to tell a regrown tensor by.
    s.growth_regrown |= std::none_of(made.begin(), made.end(), [&](const auto& e) { return has_frames(rank, e.stack_id); });
  }
}

}  // namespace

WindowStats analyse_window(const RankRecord& rank, const WindowRecord& w, const AnalysisOptions& options) {
  WindowStats s;
  s.batch_start = w.batch_start;
  s.batch_end = w.batch_end;
  s.n_events = w.events.size();
  s.dropped = w.dropped;
  s.oom = w.oom;
  s.status = w.status;

  WindowReplay replay(w);
  s.reserved_seen = !replay.segments().empty();
  s.live_at_open = replay.allocated();
  s.reserved_at_open = replay.reserved();
  s.peak_allocated = replay.allocated();
  s.peak_reserved = replay.reserved();
  s.peak_allocated_time_ns = w.open_time_ns;
  s.peak_reserved_time_ns = w.open_time_ns;
  std::uint64_t reserved_at_peak = replay.reserved();
  std::ptrdiff_t peak_index = -1;  // events applied before the peak: [0, peak_index]

  // Batch of each event, from the batch marks (by time). Events before the first mark (a window
  // that opened mid-batch) belong to no batch of the window.
  const std::vector<BatchMark>& marks = replay.marks();
  for (const auto& m : marks) {
    const std::uint64_t a = replay.allocated();
    s.batches.push_back(BatchStat{m.batch, a, a, a, a, {}, 0});
  }
  std::vector<std::ptrdiff_t> batch_peak_index(marks.size(), -1);  // -1: the level it began with
  std::vector<std::ptrdiff_t> batch_start_index(marks.size(), -1);  // events applied at its low point
  std::ptrdiff_t oom_index = -1;                                     // the window's first OOM event
  bool oom_pending = false;                                          // an OOM with no allocation after it yet
  std::vector<std::pair<std::size_t, std::uint32_t>> oom_batch_stack;  // (batch, stack of its OOM)
  // A batch begins with the level before the event it begins before (`i`: that event's index).
  auto begin_batch = [&](std::size_t m, std::ptrdiff_t i) {
    BatchStat& b = s.batches[m];
    b.peak_allocated = b.live_at_end = b.live_at_start = b.min_allocated = replay.allocated();
    batch_start_index[m] = i - 1;
    batch_peak_index[m] = i - 1;
  };

  while (!replay.done()) {
    const auto i = static_cast<std::ptrdiff_t>(replay.applied());
    for (std::ptrdiff_t m; (m = replay.begin_mark()) >= 0;) begin_batch(static_cast<std::size_t>(m), i);
    const std::size_t current = replay.marks_begun();  // its batch + 1; 0: none
    BatchStat* b = current == 0 ? nullptr : &s.batches[current - 1];
    const Event& e = w.events[static_cast<std::size_t>(i)];
    if (is_segment_action(e.action)) s.reserved_seen = true;
    if (e.action == Action::oom) {
      if (oom_index < 0) {  // the window's first OOM
        s.oom_requested = e.size;
        s.live_at_oom = replay.allocated();
        oom_index = i;
      }
      s.oom = true;
      if (b != nullptr && !b->oom) {
        b->oom = true;
        b->oom_requested = e.size;
        b->live_at_oom = replay.allocated();
        oom_batch_stack.emplace_back(current - 1, e.stack_id);
      }
      oom_pending = true;
    } else if (e.action == Action::alloc && oom_pending) {
      // An allocation after the OOM: the job caught it and went on.
      s.oom_went_on = true;
      for (const auto& [ob, stack] : oom_batch_stack) s.batches[ob].oom_went_on = true;
      oom_pending = false;
    }
    replay.step();
    const std::uint64_t allocated = replay.allocated(), reserved = replay.reserved();
    if (allocated > s.peak_allocated) {
      s.peak_allocated = allocated;
      s.peak_allocated_time_ns = e.time_ns;
      peak_index = i;
      reserved_at_peak = reserved;
    }
    if (reserved > s.peak_reserved) {
      s.peak_reserved = reserved;
      s.peak_reserved_time_ns = e.time_ns;
    }
    if (b != nullptr) {
      if (allocated > b->peak_allocated) batch_peak_index[current - 1] = i;
      if (allocated < b->min_allocated) batch_start_index[current - 1] = i;
      b->peak_allocated = std::max(b->peak_allocated, allocated);
      b->min_allocated = std::min(b->min_allocated, allocated);
      b->live_at_end = allocated;
    }
  }
  // Batches with no events after their start keep the level they started with.
  for (std::ptrdiff_t m; (m = replay.begin_remaining_mark()) >= 0;) {
    begin_batch(static_cast<std::size_t>(m), static_cast<std::ptrdiff_t>(w.events.size()));
  }
  s.live_at_close = replay.allocated();
  s.reserved_at_close = replay.reserved();
  std::vector<LiveBlock> made;  // allocated in the window, live at its end
  replay.live().for_each([&](std::uint64_t, const LiveBlock& l) {
    if (!replay.made_in_window(l)) s.persistent += l.size;
    else made.push_back(l);
  });
  if (!s.reserved_seen) {
    // The source saw no segments (CUPTI without a caching allocator, the C API): every
    // allocation is device memory of its own.
    s.peak_reserved = s.peak_allocated;
    s.peak_reserved_time_ns = s.peak_allocated_time_ns;
    s.reserved_at_open = s.live_at_open;
    s.reserved_at_close = s.live_at_close;
  } else {
    s.fragmentation_at_peak = reserved_at_peak > s.peak_allocated ? reserved_at_peak - s.peak_allocated : 0;
  }

  // Second pass: what was live at the peak, by site.
  replay.restart();
  while (static_cast<std::ptrdiff_t>(replay.applied()) <= peak_index) replay.step();
  std::unordered_map<std::uint32_t, std::pair<std::string, Category>> stack_site;  // memo per stack
  // Made in the window without frames where the window's allocations carry Python frames:
  // the autograd engine's backward (analysis.hpp, kNoPythonFramesSite).
  const bool python_window = python_frames_recorded(rank, w);
  const std::pair<std::string, Category> engine_site{kNoPythonFramesSite, Category::gradients};
  auto site_of = [&](std::uint32_t stack, bool made_in_window) -> const std::pair<std::string, Category>& {
    if (made_without_python(rank, stack, made_in_window, python_window)) return engine_site;
    auto it = stack_site.find(stack);
    if (it == stack_site.end()) it = stack_site.emplace(stack, std::make_pair(site_name(rank, stack), categorize(rank, stack))).first;
    return it->second;
  };
  // Tallied by stack id first (one array slot per stack, every id out of range in the last),
  // then folded by site name in stack order: a name's representative stack is its smallest id.
  // Allocations made without Python frames (made_without_python) take one more slot, the last.
  struct StackTally {
    std::uint64_t bytes_at_peak = 0, count_at_peak = 0, bytes_allocated = 0, allocations = 0;
    bool seen = false;
  };
  const std::size_t n_stacks = rank.stacks.size();
  std::vector<StackTally> per_stack(n_stacks + 2);
  std::uint32_t engine_stack = kNoStack;  // the stack id those allocations have (empty, or none)
  auto stack_slot = [&](std::uint32_t id, bool made_in_window) -> StackTally& {
    if (made_without_python(rank, id, made_in_window, python_window)) {
      engine_stack = std::min(engine_stack, id);
      return per_stack[n_stacks + 1];
    }
    return per_stack[id < n_stacks ? id : n_stacks];
  };
  replay.live().for_each([&](std::uint64_t, const LiveBlock& l) {
    StackTally& t = stack_slot(l.stack_id, replay.made_in_window(l));
    t.bytes_at_peak += l.size;
    t.count_at_peak += 1;
    t.seen = true;
  });
  for (const auto& e : w.events) {
    if (e.action != Action::alloc) continue;
    StackTally& t = stack_slot(e.stack_id, true);
    t.bytes_allocated += e.size;
    t.allocations += 1;
    t.seen = true;
  }
  std::unordered_map<std::string, SiteStat> by_site;
  for (std::size_t id = 0; id <= n_stacks + 1; ++id) {
    const StackTally& t = per_stack[id];
    if (!t.seen) continue;
    const bool engine = id == n_stacks + 1;
    const auto stack = id < n_stacks ? static_cast<std::uint32_t>(id) : engine ? engine_stack : kNoStack;
    const auto& [name, category] = site_of(stack, engine);
    SiteStat& site = by_site[name];
    if (site.name.empty()) {
      site.name = name;
      site.stack_id = stack;
      site.category = category;
    }
    site.bytes_at_peak += t.bytes_at_peak;
    site.count_at_peak += t.count_at_peak;
    site.bytes_allocated += t.bytes_allocated;
    site.allocations += t.allocations;
    s.category_bytes_at_peak[static_cast<int>(category)] += t.bytes_at_peak;
  }
  batch_growth_by_site(rank, w, replay, site_of, batch_start_index, batch_peak_index, made, options.top_sites, s);
  // Where an allocation failed: the OOM's own stack, else what its batch's peak holds more of.
  for (const auto& [b, stack] : oom_batch_stack) {
    BatchStat& bs = s.batches[b];
    bs.oom_site = has_frames(rank, stack) ? site_of(stack, true).first : bs.peak_site;
    if (s.oom_site.empty()) s.oom_site = bs.oom_site;
  }
  for (auto& [name, site] : by_site) s.sites.push_back(std::move(site));
  std::sort(s.sites.begin(), s.sites.end(), [](const SiteStat& a, const SiteStat& b) {
    return a.bytes_at_peak != b.bytes_at_peak ? a.bytes_at_peak > b.bytes_at_peak : a.name < b.name;
  });
  if (s.sites.size() > options.top_sites) s.sites.resize(options.top_sites);
  return s;
}

}  // namespace memsnap
