// What an imported trace says about its window beyond its events: the allocations and reserved
// ranges live before it began (live_at_start), and its batches.
#include "torch/snapshot_window.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_set>

#include "memsnap/batch_inference.hpp"

namespace memsnap::torch::detail {

namespace {

// A set of half-open [start, end) ranges, merged.
class RangeSet {
 public:
  void add(std::uint64_t start, std::uint64_t end) {
    if (start >= end) return;
    auto it = m_ranges.upper_bound(start);
    if (it != m_ranges.begin()) {
      auto prev = std::prev(it);
      if (prev->second >= start) {
        start = prev->first;
        end = std::max(end, prev->second);
        it = m_ranges.erase(prev);
      }
    }
    while (it != m_ranges.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = m_ranges.erase(it);
    }
    m_ranges.emplace(start, end);
  }
  // The parts of [start, end) not in the set.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> uncovered(std::uint64_t start, std::uint64_t end) const {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    std::uint64_t pos = start;
    auto it = m_ranges.upper_bound(start);
    if (it != m_ranges.begin()) --it;
    for (; it != m_ranges.end() && it->first < end && pos < end; ++it) {
      if (it->second <= pos) continue;
      if (it->first > pos) out.emplace_back(pos, std::min(it->first, end));
      pos = std::max(pos, it->second);
    }
    if (pos < end) out.emplace_back(pos, end);
    return out;
  }

 private:
  std::map<std::uint64_t, std::uint64_t> m_ranges;
};

// The trace's external annotations (record_function ranges), for batch inference.
std::vector<Annotation> annotations_of(const Value* annotations) {
  std::vector<Annotation> out;
  if (!annotations || !(annotations->is_list() || annotations->is_tuple())) return out;
  for (const auto& a : annotations->items()) {
    if (!a->is_dict()) continue;
    const Value* t = a->find("time_us");
    if (!t || t->kind() != Kind::integer) continue;
    const std::int64_t time_us = t->as_int64();
    if (time_us > std::numeric_limits<std::int64_t>::max() / 1000 || time_us < std::numeric_limits<std::int64_t>::min() / 1000)
      continue;
    const std::string stage = field_str(*a, "stage");
    if (stage != "START" && stage != "END") continue;
    out.push_back(Annotation{field_str(*a, "name"), stage == "START", time_us * 1000});
  }
  return out;
}

}  // namespace

// Edge cases of the reconstruction (documented here because they are judgement calls):
//  - An allocation is live from alloc to free_completed (free_requested only marks it pending, as
//    the block state active_pending_free does).
//  - The first event seen for an address being a free (requested or completed) means it was
//    allocated before the trace began (or its alloc fell out of torch's bounded ring buffer): it
//    is live at start with the free's size and stream, no stack and time 0.
//  - A block active at dump whose address no trace event touched was allocated before the trace:
//    live at start with its requested_size (trace sizes are requested sizes, not rounded block
//    sizes), its segment's stream and the block's frames.
//  - A block whose last trace event contradicts the dump (freed in the trace, active at dump) is
//    left to the trace: memsnap cannot tell which side is wrong, and the trace is what replays.
//  - Reserved memory: a segment_free/unmap of a range not added earlier in the trace was reserved
//    at start (that range, minus what earlier events covered). A dump segment's range that no
//    segment event touched was reserved at start. Expandable segments grow by segment_map, so
//    only their unmapped-in-trace part is live at start; pieces are kept separate, never merged,
//    so each later segment_free finds its own range.
std::vector<LiveAlloc> reconstruct_live_at_start(const WindowRecord& w,
                                                 const std::vector<std::uint32_t>& segment_stacks) {
  std::vector<LiveAlloc> live;
  std::map<std::int16_t, std::unordered_set<std::uint64_t>> touched;
  std::map<std::int16_t, RangeSet> reserved_touched;

  for (const Event& e : w.events) {
    switch (e.action) {
      case Action::alloc: touched[e.device].insert(e.addr); break;
      case Action::free_requested:
      case Action::free_completed:
        if (touched[e.device].insert(e.addr).second)
          live.push_back(LiveAlloc{e.addr, e.size, e.stream, 0, kNoStack, e.device, 0, 0});
        break;
      case Action::segment_alloc:
      case Action::segment_map: reserved_touched[e.device].add(e.addr, e.addr + e.size); break;
      case Action::segment_free:
      case Action::segment_unmap: {
        auto& set = reserved_touched[e.device];
        for (auto [a, b] : set.uncovered(e.addr, e.addr + e.size))
          live.push_back(LiveAlloc{a, b - a, e.stream, 0, kNoStack, e.device, 1, 0});
        set.add(e.addr, e.addr + e.size);
        break;
      }
      default: break;
    }
  }
  for (std::size_t i = 0; i < w.segments.size(); ++i) {
    const Segment& s = w.segments[i];
    for (auto [a, b] : reserved_touched[s.device].uncovered(s.addr, s.addr + s.size))
      live.push_back(LiveAlloc{a, b - a, s.stream, 0, segment_stacks[i], s.device, 1, 0});
    auto& seen = touched[s.device];
    for (const Block& b : s.blocks)
      if (b.state != 0 && !seen.count(b.addr))
        live.push_back(LiveAlloc{b.addr, b.requested_size, s.stream, 0, b.stack_id, s.device, 0, 0});
  }
  std::sort(live.begin(), live.end(), [](const LiveAlloc& x, const LiveAlloc& y) {
    if (x.is_segment != y.is_segment) return x.is_segment > y.is_segment;  // segments first
    if (x.device != y.device) return x.device < y.device;
    return x.addr < y.addr;
  });
  return live;
}

// Batches: the trace's own marks if it has any, else inferred from its structure; an explicit
// batch_start renumbers them from it.
void find_batches(const RankRecord& rec, const Value* annotations, const ImportOptions& opt, WindowRecord& w) {
  BatchInferenceOptions bo;
  bo.expected_batches = opt.expected_batches;
  const InferredBatches found = infer_batches(rec, w, annotations_of(annotations), bo);
  // A window nothing names (a single pickle without Composer's name, as memsnap view takes it):
  // its batches count from 1 and it is named after its last.
  const bool unnamed = opt.batch < 0;
  if (unnamed) w.batch_end = static_cast<std::int64_t>(std::max<std::size_t>(1, found.starts.size()));
  apply_inferred_batches(found, w);
  if (unnamed && found.numbered && !w.batches.empty()) w.batch_end = w.batches.back().batch;
  if (found.method == "step_annotation") w.batch_method = "recorded";  // the source's own marks
  if (opt.batch_start >= 0 && !w.batches.empty()) {
    const std::int64_t shift = opt.batch_start + (w.batch_start < w.batches.front().batch ? 1 : 0) - w.batches.front().batch;
    for (auto& b : w.batches) b.batch += shift;
    w.batch_start = opt.batch_start;
  } else if (opt.batch_start >= 0) {
    w.batch_start = opt.batch_start;
  }
}

}  // namespace memsnap::torch::detail
