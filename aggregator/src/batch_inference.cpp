// Batch boundaries from a trace's own structure (see batch_inference.hpp for the order of trust).
#include "memsnap/batch_inference.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "memsnap/analysis.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/window_replay.hpp"
#include "text.hpp"

namespace memsnap {
namespace {

using text::lower;

std::optional<std::int64_t> trailing_number(const std::string& s) {
  std::size_t begin = s.size();
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(s[begin - 1]))) --begin;
  if (begin == s.size() || s.size() - begin > 15) return std::nullopt;
  return std::stoll(s.substr(begin));
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Coefficient of variation (spread over mean) of the gaps between ascending positions.
double gap_cv(const std::vector<double>& pos, double* mean_gap = nullptr) {
  std::vector<double> gaps;
  for (std::size_t i = 1; i < pos.size(); ++i) gaps.push_back(pos[i] - pos[i - 1]);
  const double m = mean_of(gaps);
  if (mean_gap) *mean_gap = m;
  if (gaps.empty() || m <= 0) return 1e9;
  double sq = 0;
  for (double g : gaps) sq += (g - m) * (g - m);
  return std::sqrt(sq / static_cast<double>(gaps.size())) / m;
}

// Allocated bytes just before each event (index i) and after the last (index n).
std::vector<std::uint64_t> levels_before(const WindowRecord& w) {
  WindowReplay replay(w);
  std::vector<std::uint64_t> out;
  out.reserve(w.events.size() + 1);
  while (!replay.done()) {
    out.push_back(replay.allocated());
    replay.step();
  }
  out.push_back(replay.allocated());
  return out;
}

// A recurring token (a frame, a stack, a size) split into bursts: occurrences closer together
// than the largest jump in its sorted gaps belong to one burst. Evenly spread occurrences
// (no jump of 3x or more) are each a burst of their own.
std::vector<std::size_t> burst_starts(const std::vector<std::size_t>& pos) {
  if (pos.size() < 2) return pos;
  std::vector<std::size_t> gaps;
  for (std::size_t i = 1; i < pos.size(); ++i) gaps.push_back(pos[i] - pos[i - 1]);
  std::vector<std::size_t> sorted = gaps;
  std::sort(sorted.begin(), sorted.end());
  std::size_t split = 0;  // gaps >= split separate bursts; 0: every gap does
  double best_ratio = 3.0;
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    const double ratio = static_cast<double>(sorted[i]) / static_cast<double>(std::max<std::size_t>(1, sorted[i - 1]));
    if (ratio >= best_ratio) {
      best_ratio = ratio;
      split = sorted[i];
    }
  }
  std::vector<std::size_t> starts{pos[0]};
  for (std::size_t i = 1; i < pos.size(); ++i) {
    if (gaps[i - 1] >= split) starts.push_back(pos[i]);
  }
  return starts;
}

// A candidate anchor: where in the event sequence it recurs, and how regularly.
struct Anchor {
  std::vector<std::size_t> events;  // event index of each occurrence (burst start)
  double cv = 1e9;
  std::size_t occurrences = 0;
  std::string what;
  bool user = false;  // a frame of the user's code, not of the framework
  std::size_t multiple = 1;  // occurrences a batch (torch.optim steps of several optimizers)
  bool start = true;         // a range's start (else its end)
};

// Burst-start positions that recur once per period over the whole sequence: evenly spaced and
// reaching both ends (within one and a half periods, for windows that begin or end mid-batch).
bool regular(const std::vector<std::size_t>& starts, std::size_t length, double* cv_out) {
  if (starts.size() < 2) return false;
  std::vector<double> pos(starts.begin(), starts.end());
  double gap = 0;
  const double cv = gap_cv(pos, &gap);
  *cv_out = cv;
  if (cv > 0.25 || gap <= 0) return false;
  return pos.front() <= 1.5 * gap && static_cast<double>(length) - 1 - pos.back() <= 1.5 * gap;
}

// Among anchors of several counts, the batch count: the expected one (or one off, for windows
// that begin or end mid-batch) when known, else the smallest count that several anchors agree
// on (the batch is the longest unit that repeats; layers and micro-batches repeat within it).
// When nothing recurs once per batch but something recurs m times per batch (gradient
// accumulation: every allocation happens once per micro-batch), `multiple` is m.
struct Count {
  std::size_t bursts = 0;
  std::size_t multiple = 1;
};
std::optional<Count> choose_count(const std::map<std::size_t, std::vector<Anchor>>& by_count, int expected,
                                  std::size_t min_support) {
  std::size_t most = 0;
  for (const auto& [k, list] : by_count) most = std::max(most, list.size());
  const std::size_t support = std::max<std::size_t>(min_support, most / 10);
  if (expected > 0) {
    for (std::size_t m = 1; m <= 8; ++m) {
      std::optional<Count> best;
      std::size_t best_n = 0;
      const std::size_t e = static_cast<std::size_t>(expected) * m;
      for (std::size_t k : {e, e + 1, e > 2 ? e - 1 : e}) {
        auto it = by_count.find(k);
        if (it != by_count.end() && it->second.size() >= min_support && it->second.size() > best_n) {
          best = Count{k, m};
          best_n = it->second.size();
        }
      }
      if (best) return best;
    }
    return std::nullopt;
  }
  for (const auto& [k, list] : by_count) {
    if (k >= 2 && list.size() >= support) return Count{k, 1};
  }
  return std::nullopt;
}

// The first event in [lo, hi] at the lowest level there.
std::size_t first_lowest(const std::vector<std::uint64_t>& level, std::size_t lo, std::size_t hi) {
  std::size_t best = lo;
  for (std::size_t j = lo; j <= hi; ++j) {
    if (level[j] < level[best]) best = j;
  }
  return best;
}

// Boundaries from anchors: the offset from the anchors at which allocated memory is lowest on
// average, then each batch's own low point near it: the first event at the lowest level, so
// that the frees ending a batch stay in it and the batch starts with the next allocation.
// `after`: the anchors end their batches (torch.optim's steps), so each boundary comes at or after
// its anchor, never before it (where memory may be as low, with the step still to come).
std::vector<std::size_t> place_boundaries(const std::vector<std::size_t>& anchors, const std::vector<std::uint64_t>& level,
                                          bool after = false) {
  const std::size_t n = level.size() - 1;  // events
  std::vector<double> pos(anchors.begin(), anchors.end());
  double period = 0;
  gap_cv(pos, &period);
  const auto half = static_cast<std::int64_t>(std::max(1.0, period / 2));
  const std::int64_t step = std::max<std::int64_t>(1, half / 2048);
  std::int64_t best_phase = 0;
  double best_cost = -1;
  for (std::int64_t phase = after ? 0 : -half; phase < (after ? 2 * half : half); phase += step) {
    double cost = 0;
    std::size_t used = 0;
    for (std::size_t a : anchors) {
      const std::int64_t j = static_cast<std::int64_t>(a) + phase;
      if (j < 0 || j > static_cast<std::int64_t>(n)) continue;
      cost += static_cast<double>(level[static_cast<std::size_t>(j)]);
      ++used;
    }
    if (used + 1 < anchors.size() || used == 0) continue;
    cost /= static_cast<double>(used);
    if (best_cost < 0 || cost < best_cost || (cost == best_cost && std::llabs(phase) < std::llabs(best_phase))) {
      best_cost = cost;
      best_phase = phase;
    }
  }
  const auto reach = static_cast<std::int64_t>(std::max(1.0, period / 4));
  std::vector<std::size_t> out;
  for (std::size_t a : anchors) {
    const std::int64_t centre = static_cast<std::int64_t>(a) + best_phase;
    const std::int64_t lo = std::max<std::int64_t>(after ? static_cast<std::int64_t>(a) : 0, centre - reach);
    const std::int64_t hi = std::min<std::int64_t>(static_cast<std::int64_t>(n), centre + reach);
    if (lo > hi) continue;
    const std::size_t best = first_lowest(level, static_cast<std::size_t>(lo), static_cast<std::size_t>(hi));
    if (out.empty() || best > out.back()) out.push_back(best);
  }
  return out;
}

// The lowest level from each anchor to the next (its first event there).
std::vector<std::size_t> lowest_between(const std::vector<std::size_t>& anchors, const std::vector<std::uint64_t>& level) {
  const std::size_t n = level.size() - 1;  // events
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < anchors.size(); ++k) {
    const std::size_t lo = std::min(anchors[k], n), hi = k + 1 < anchors.size() ? std::min(anchors[k + 1], n) : n;
    const std::size_t best = first_lowest(level, lo, hi);
    if (out.empty() || best > out.back()) out.push_back(best);
  }
  return out;
}

// Step-like annotation names ("ProfilerStep#5", "train_batch 3"); the optimizer's own step
// annotations are recurring ones, not step marks.
bool step_like(const std::string& name) {
  const std::string l = lower(name);
  if (l.rfind("optimizer.", 0) == 0) return false;
  return l.find("step") != std::string::npos || l.find("batch") != std::string::npos;
}

}  // namespace

InferredBatches infer_batches(const RankRecord& rank, const WindowRecord& w, const std::vector<Annotation>& annotations,
                              const BatchInferenceOptions& options) {
  InferredBatches out;
  const int expected = options.expected_batches;
  // Annotations outside the trace's time span say nothing about its batches (torch keeps every
  // annotation while its trace is a bounded ring that lost its oldest entries).
  std::vector<Annotation> in_trace;
  if (w.events.empty()) {
    in_trace = annotations;  // nothing to judge them by
  } else {
    const std::int64_t lo = std::min(w.open_time_ns, w.events.front().time_ns);
    const std::int64_t hi = std::max(w.close_time_ns, w.events.back().time_ns);
    for (const auto& a : annotations) {
      if (a.time_ns >= lo && a.time_ns <= hi) in_trace.push_back(a);
    }
  }

  // 1. Annotations that name a step or a batch: the source's own marks.
  {
    std::vector<const Annotation*> marks;
    for (const auto& a : in_trace) {
      if (a.start && step_like(a.name)) marks.push_back(&a);
    }
    if (!marks.empty()) {
      std::stable_sort(marks.begin(), marks.end(), [](auto* a, auto* b) { return a->time_ns < b->time_ns; });
      out.method = "step_annotation";
      out.confidence = 1.0;
      out.detail = "'" + marks.front()->name + "' and " + std::to_string(marks.size() - 1) + " more";
      out.numbered = std::all_of(marks.begin(), marks.end(), [](auto* m) { return trailing_number(m->name).has_value(); });
      for (auto* m : marks) {
        out.starts.push_back(m->time_ns);
        if (out.numbered) out.numbers.push_back(*trailing_number(m->name));
      }
      return out;
    }
  }

  const auto level = levels_before(w);
  // OOM events the job went on past (an allocation follows): each ends a batch (see finish).
  std::vector<std::size_t> caught_ooms;
  for (std::size_t i = 0, pending = SIZE_MAX; i < w.events.size(); ++i) {
    if (w.events[i].action == Action::oom) {
      if (pending == SIZE_MAX) pending = i;
    } else if (w.events[i].action == Action::alloc && pending != SIZE_MAX) {
      caught_ooms.push_back(pending);
      pending = SIZE_MAX;
    }
  }
  // Anchors that end a batch however their batches' lengths vary (torch.optim's steps), spaced
  // too unevenly in events for one offset to fit them all (a recompilation's thousands of
  // allocations inside one batch): each boundary goes to the lowest level from its anchor to
  // the next.
  auto uneven = [&](const std::vector<std::size_t>& anchors, bool ends_a_batch) {
    std::vector<double> pos(anchors.begin(), anchors.end());
    return ends_a_batch && gap_cv(pos) > 0.5;
  };
  auto finish = [&](const std::vector<std::size_t>& all_anchors, const std::string& method, double confidence,
                    std::string detail, std::size_t multiple = 1, bool may_be_micro_batches = true) {
    // m anchors a batch: of the m ways to take every m-th, the one whose boundaries sit lowest
    // (between micro-batches the accumulated gradients are still held; between batches not).
    std::vector<std::size_t> anchors = all_anchors, bounds;
    double best_cost = -1;
    for (std::size_t offset = 0; offset < multiple; ++offset) {
      std::vector<std::size_t> every;
      for (std::size_t i = offset; i < all_anchors.size(); i += multiple) every.push_back(all_anchors[i]);
      if (every.size() < 2) continue;
      auto b = uneven(every, !may_be_micro_batches) ? lowest_between(every, level)
                                                    : place_boundaries(every, level, !may_be_micro_batches);
      double cost = 0;
      for (std::size_t j : b) cost += static_cast<double>(level[j]);
      cost /= static_cast<double>(std::max<std::size_t>(1, b.size()));
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        anchors = std::move(every);
        bounds = std::move(b);
      }
    }
    if (multiple > 1 && may_be_micro_batches)
      detail += "; every " + std::to_string(multiple) + "th burst (" + std::to_string(multiple) + " micro-batches a batch)";
    const bool between = uneven(anchors, !may_be_micro_batches);
    if (multiple == 1) bounds = between ? lowest_between(anchors, level) : place_boundaries(anchors, level, !may_be_micro_batches);
    // Count unknown: micro-batches of gradient accumulation look like batches, but every m-th
    // boundary sits lower than all the others (the accumulated gradients are freed only there).
    if (expected == 0 && multiple == 1 && may_be_micro_batches) {
      for (std::size_t m = 2; m <= 4 && bounds.size() >= 2 * m; ++m) {
        for (std::size_t c = 0; c < m; ++c) {
          std::uint64_t low_max = 0, other_min = UINT64_MAX;
          for (std::size_t i = 0; i < bounds.size(); ++i) {
            if (i % m == c) low_max = std::max(low_max, level[bounds[i]]);
            else other_min = std::min(other_min, level[bounds[i]]);
          }
          if (low_max < other_min) {
            std::vector<std::size_t> kept, kept_anchors;
            for (std::size_t i = c; i < bounds.size(); i += m) kept.push_back(bounds[i]);
            for (std::size_t i = c; i < anchors.size(); i += m) kept_anchors.push_back(anchors[i]);
            bounds = std::move(kept);
            anchors = std::move(kept_anchors);
            detail += "; every " + std::to_string(m) + "th boundary (" + std::to_string(m) +
                      " micro-batches a batch: only there does memory drop to its lowest)";
            m = 5;
            break;
          }
        }
      }
    }
    const std::size_t n = w.events.size();
    std::vector<double> pos(anchors.begin(), anchors.end());
    double period = 0;
    gap_cv(pos, &period);
    // The typical batch, not the mean: one batch of a recompilation's thousands of allocations
    // must not make the last batch look empty.
    if (pos.size() >= 3) {
      std::vector<double> gaps;
      for (std::size_t i = 1; i < pos.size(); ++i) gaps.push_back(pos[i] - pos[i - 1]);
      period = std::min(period, upper_median(std::move(gaps)));
    }
    // A caught OOM ends its batch: torch raised, the loop dropped what the batch held and began
    // the next one, and the batch's anchor never came (its optimizer step never ran). Its end is
    // the first lowest level after the OOM before the next boundary, where at least half a
    // batch's events follow (a loop that steps anyway after catching it has only its step there).
    for (std::size_t o : caught_ooms) {
      const auto next = std::upper_bound(bounds.begin(), bounds.end(), o);
      const std::size_t hi = next == bounds.end() ? n : *next;
      if (hi < o + 2) continue;
      const std::size_t cut = first_lowest(level, o + 1, hi - 1);
      if (static_cast<double>(hi - cut) < std::max(1.0, period / 2)) continue;
      bounds.insert(std::upper_bound(bounds.begin(), bounds.end(), cut), cut);
      detail += "; a batch ends at the OOM its loop caught";
    }
    // The window opened at a batch start when it opened as low as the batches' low points.
    if (!bounds.empty() && bounds.front() > 0 && static_cast<double>(bounds.front()) >= period / 2) {
      std::vector<double> lows;
      std::uint64_t peak = 0;
      for (std::size_t b : bounds) lows.push_back(static_cast<double>(level[b]));
      for (auto v : level) peak = std::max(peak, v);
      const double low = upper_median(std::move(lows));
      if (static_cast<double>(level[0]) <= low + 0.1 * std::max(0.0, static_cast<double>(peak) - low)) bounds.insert(bounds.begin(), 0);
    }
    // A boundary with (almost) nothing after it starts no batch of this window; but one placed
    // between two steps has the later step's batch after it, however low it lies before it.
    while (!bounds.empty() && static_cast<double>(n - bounds.back()) < std::max(1.0, period / 4) &&
           !(between && !anchors.empty() && bounds.back() <= anchors.back()))
      bounds.pop_back();
    if (bounds.size() < 2) return false;
    out.method = method;
    out.confidence = std::clamp(confidence, 0.0, 1.0);
    out.detail = detail;
    for (std::size_t b : bounds) out.starts.push_back(b == 0 ? std::min(w.open_time_ns, w.events.front().time_ns) : w.events[b].time_ns);
    if (expected > 0 && static_cast<int>(out.starts.size()) != expected) {
      out.confidence *= 0.8;
      out.detail += "; " + std::to_string(out.starts.size()) + " batches found where " + std::to_string(expected) +
                    " were expected";
    }
    return true;
  };
  if (w.events.size() < 4) return out;
  auto first_event_at = [&](std::int64_t t) {
    auto it = std::lower_bound(w.events.begin(), w.events.end(), t, [](const Event& e, std::int64_t v) { return e.time_ns < v; });
    return static_cast<std::size_t>(it - w.events.begin());
  };

  // Several optimizers of one class step in every batch (a GAN's generator and discriminator):
  // the steps' annotations name the class only, but what each step allocates inside it comes
  // from its own line. m when the stacks of the first allocation inside each step (from its
  // START to its END) repeat with period m (A B A B ...), else 1. Inside, not after: what comes
  // after a step differs every other batch in a loop that evaluates every other batch.
  auto optimizers_per_batch = [&](const std::vector<std::size_t>& steps, const std::vector<std::size_t>& ends) -> std::size_t {
    std::vector<std::uint32_t> stack_inside;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      auto next_end = std::lower_bound(ends.begin(), ends.end(), steps[i]);  // this step's END
      const std::size_t end = next_end == ends.end() ? w.events.size() : std::min(*next_end, w.events.size());
      std::uint32_t sid = kNoStack;
      for (std::size_t e = steps[i]; e < end; ++e) {
        const Event& ev = w.events[e];
        if (ev.action == Action::alloc && has_frames(rank, ev.stack_id)) {
          sid = ev.stack_id;
          break;
        }
      }
      stack_inside.push_back(sid);
    }
    // A step that allocated nothing with a stack (the last one, cut by the dump) matches any.
    for (std::size_t m = 2; m <= 4 && 2 * m <= stack_inside.size(); ++m) {
      bool periodic = true, differ = false;
      for (std::size_t i = 0; i < stack_inside.size() && periodic; ++i) {
        if (i < m) periodic = stack_inside[i] != kNoStack;
        else periodic = stack_inside[i] == kNoStack || stack_inside[i] == stack_inside[i % m];
        differ |= stack_inside[i] != kNoStack && stack_inside[i] != stack_inside[0];
      }
      if (periodic && differ) return m;
    }
    return 1;
  };

  // 2. An annotation that recurs once per batch (torch.optim's Optimizer.step#..., zero_grad).
  {
    std::map<std::pair<std::string, bool>, std::vector<std::int64_t>> groups;
    for (const auto& a : in_trace) groups[{a.name, a.start}].push_back(a.time_ns);
    const Anchor* best = nullptr;
    std::vector<Anchor> found;
    for (auto& [key, times] : groups) {
      std::sort(times.begin(), times.end());
      if (times.size() < 2) continue;
      Anchor a;
      for (auto t : times) a.events.push_back(first_event_at(t));
      std::vector<double> pos(times.begin(), times.end());
      a.cv = gap_cv(pos);
      a.occurrences = times.size();
      a.what = key.first + (key.second ? " START" : " END");
      a.start = key.second;
      // torch.optim's step ends a batch, however uneven the batches' lengths (an evaluation
      // pass between two, a slow spike batch, a recompilation); with several optimizers of one
      // class (a GAN's two Adams) it comes several times a batch. Preferred to any other.
      a.user = lower(key.first).rfind("optimizer.step", 0) == 0;
      if (a.user) {
        if (expected == 0) {
          // Both the START and the END group of a step take the steps' own count a batch.
          std::vector<std::size_t> start_events, end_events;
          for (bool start : {true, false}) {
            auto it = groups.find({key.first, start});
            if (it == groups.end()) continue;
            for (auto t : it->second) (start ? start_events : end_events).push_back(first_event_at(t));
          }
          std::sort(start_events.begin(), start_events.end());
          std::sort(end_events.begin(), end_events.end());
          a.multiple = optimizers_per_batch(start_events, end_events);
        } else {
          a.multiple = 0;
        }
        for (std::size_t m = 1; m <= 4 && expected > 0; ++m) {
          const long long off = std::llabs(static_cast<long long>(times.size()) - static_cast<long long>(m) * expected);
          if (off <= (m == 1 ? 1 : 0)) {
            a.multiple = m;
            break;
          }
        }
        if (a.multiple == 0) continue;
      } else {
        if (expected > 0 && std::llabs(static_cast<long long>(times.size()) - expected) > 1) continue;
        if (a.cv > 0.5) continue;
      }
      found.push_back(std::move(a));
    }
    for (const auto& a : found) {
      auto rank_of = [&](const Anchor& x) {
        const long long off =
            expected > 0 ? std::llabs(static_cast<long long>(x.occurrences / x.multiple) - expected) : 0;
        // A step's end, not its start: the step's own allocations (foreach temporaries) belong
        // to the batch it ends, and after the last step's end only the dump's tail remains.
        return std::make_tuple(off, !x.user, x.user && x.start, x.cv);
      };
      if (!best || rank_of(a) < rank_of(*best)) best = &a;
    }
    if (best) {
      char d[96];
      std::snprintf(d, sizeof d, ", %zu times (gap spread %.0f %%)", best->occurrences, best->cv * 100);
      std::string detail = "'" + best->what + "'" + d;
      if (best->multiple > 1) detail += "; " + std::to_string(best->multiple) + " optimizers step in each batch";
      // An optimizer's step is a batch end by what it is, not by how evenly it recurs; it is
      // never a micro-batch's (the optimizer steps once per accumulated batch).
      const double confidence = best->user ? std::max(0.8, 1.0 - best->cv) : 1.0 - best->cv;
      if (finish(best->events, "recurring_annotation", confidence, detail, best->multiple, !best->user)) return out;
    }
  }

  // Allocation events, in order: the sequence the remaining methods look at.
  std::vector<std::size_t> allocs;
  for (std::size_t i = 0; i < w.events.size(); ++i) {
    if (w.events[i].action == Action::alloc) allocs.push_back(i);
  }
  // Too few allocations for a pattern to mean anything (a handful of events, an OOM repro).
  if (allocs.size() < 16) {
    out.detail = "too few allocations (" + std::to_string(allocs.size()) + ") to find batches in";
    return out;
  }

  // Tokens -> their anchors, grouped by how many bursts they make.
  auto anchors_by_count = [&](const std::vector<std::vector<std::size_t>>& positions, auto&& describe) {
    std::map<std::size_t, std::vector<Anchor>> by_count;
    for (std::size_t t = 0; t < positions.size(); ++t) {
      const auto& p = positions[t];
      if (p.size() < 2) continue;
      auto starts = burst_starts(p);
      if (allocs.size() < 4 * starts.size()) continue;  // a "batch" of a few allocations is no batch
      double cv = 0;
      if (!regular(starts, allocs.size(), &cv)) continue;
      Anchor a;
      for (auto s : starts) a.events.push_back(allocs[s]);
      a.cv = cv;
      a.occurrences = p.size();
      describe(t, a);
      by_count[starts.size()].push_back(std::move(a));
    }
    return by_count;
  };
  auto pick = [](std::vector<Anchor>& list) -> const Anchor& {
    // The most regular; near-ties go to the user's own code, then to the rarer token (a line
    // that allocates once a batch says more than one inside every layer).
    std::sort(list.begin(), list.end(), [](const Anchor& a, const Anchor& b) {
      const int qa = static_cast<int>(std::min(a.cv, 10.0) * 20), qb = static_cast<int>(std::min(b.cv, 10.0) * 20);
      if (qa != qb) return qa < qb;
      if (a.user != b.user) return a.user;
      return a.occurrences < b.occurrences;
    });
    return list.front();
  };
  auto agreement = [](const std::map<std::size_t, std::vector<Anchor>>& by_count, std::size_t k) {
    std::size_t all = 0;
    for (const auto& [c, list] : by_count) all += list.size();
    return all ? static_cast<double>(by_count.at(k).size()) / static_cast<double>(all) : 0.0;
  };

  // 3. A frame that allocates in one burst per batch.
  {
    std::vector<std::vector<std::size_t>> positions(rank.frames.size());
    std::vector<std::uint32_t> seen(rank.frames.size(), UINT32_MAX);
    for (std::size_t i = 0; i < allocs.size(); ++i) {
      const auto sid = w.events[allocs[i]].stack_id;
      if (sid >= rank.stacks.size()) continue;
      for (auto f : rank.stacks[sid]) {
        if (f >= rank.frames.size() || seen[f] == i) continue;
        seen[f] = static_cast<std::uint32_t>(i);
        positions[f].push_back(i);
      }
    }
    auto by_count = anchors_by_count(positions, [&](std::size_t f, Anchor& a) {
      a.what = frame_label(rank.frames[f]);
      a.user = is_user_code(rank.frames[f]);
    });
    if (auto k = choose_count(by_count, expected, 1)) {
      const Anchor& best = pick(by_count[k->bursts]);
      const double agree = agreement(by_count, k->bursts);
      char d[96];
      std::snprintf(d, sizeof d, ", %zu bursts (gap spread %.0f %%; %zu frames agree)", best.events.size(), best.cv * 100,
                    by_count[k->bursts].size());
      if (finish(best.events, "recurring_frame", (1.0 - best.cv) * (0.5 + 0.5 * agree) / static_cast<double>(k->multiple),
                 best.what + d, k->multiple))
        return out;
    }
  }

  // 4. The allocation sequence's own period: sizes (and stacks) that recur once per batch.
  {
    std::unordered_map<std::uint64_t, std::size_t> token_of;
    std::vector<std::vector<std::size_t>> positions;
    std::vector<std::uint64_t> sizes;
    for (std::size_t i = 0; i < allocs.size(); ++i) {
      const Event& e = w.events[allocs[i]];
      const std::uint64_t token = e.size * 1000003u ^ e.stack_id;
      auto [it, inserted] = token_of.try_emplace(token, positions.size());
      if (inserted) {
        positions.emplace_back();
        sizes.push_back(e.size);
      }
      positions[it->second].push_back(i);
    }
    auto by_count = anchors_by_count(positions, [&](std::size_t t, Anchor& a) { a.what = std::to_string(sizes[t]) + " B"; });
    if (auto k = choose_count(by_count, expected, 2)) {
      const Anchor& best = pick(by_count[k->bursts]);
      const double agree = agreement(by_count, k->bursts);
      char d[160];
      std::snprintf(d, sizeof d, "%zu allocation sizes recur %zu times in step (one of %s, gap spread %.0f %%)",
                    by_count[k->bursts].size(), k->bursts, best.what.c_str(), best.cv * 100);
      if (finish(best.events, "periodicity", (1.0 - best.cv) * (0.4 + 0.5 * agree) / static_cast<double>(k->multiple), d,
                 k->multiple))
        return out;
    }
  }
  out.detail = "no step annotation, recurring annotation, frame or allocation pattern fits";
  return out;
}

void apply_inferred_batches(const InferredBatches& found, WindowRecord& w) {
  w.batch_method = found.method;
  w.batch_confidence = found.confidence;
  w.batch_detail = found.detail;
  w.batches.clear();
  const auto n = static_cast<std::int64_t>(found.starts.size());
  // Counted back from the batch the window is named after, never below batch 0 (more batches
  // found than that: the count was not known, and micro-batches may have been taken for batches).
  const std::int64_t first = std::max<std::int64_t>(0, w.batch_end - (n - 1));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t number = found.numbered ? found.numbers[static_cast<std::size_t>(i)] : first + i;
    w.batches.push_back(BatchMark{number, found.starts[static_cast<std::size_t>(i)]});
  }
  if (n == 0) {
    w.batch_start = w.batch_end;
    return;
  }
  // Events before the first batch start belong to the batch before it (a window that opened
  // mid-batch); a window that opened at the first start holds whole batches only.
  bool opened_at_start = true;  // no allocation before the first start (frees may end the batch before)
  for (const Event& e : w.events) {
    if (e.time_ns >= found.starts.front()) break;
    if (e.action == Action::alloc) opened_at_start = false;
  }
  w.batch_start = std::max<std::int64_t>(0, w.batches.front().batch - (opened_at_start ? 0 : 1));
}

}  // namespace memsnap
