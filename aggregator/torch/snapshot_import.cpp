// Import of PyTorch memory snapshots: trace entries to Events, segments and blocks to Segments,
// the reconstruction of what was live before the trace began, and batches found in the trace.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>

#include "memsnap/batch_inference.hpp"
#include "torch/snapshot_detail.hpp"

namespace memsnap::torch {

using namespace detail;

namespace {

// --- frame and stack interning ---------------------------------------------------------------

class StackInterner {
 public:
  explicit StackInterner(RankRecord& rec) : m_rec(rec) {}

  // The stack id of a frames list; kNoStack for a missing or None value.
  std::uint32_t intern(const ValuePtr& frames, const std::string& where) {
    if (!frames || frames->is_none()) return kNoStack;
    // Fast path: torch's pickles reference one frames list from many entries (memo sharing).
    if (auto it = m_by_node.find(frames.get()); it != m_by_node.end()) return it->second;
    if (!frames->is_list() && !frames->is_tuple()) bad(where, "frames is not a list");
    Stack stack;
    stack.reserve(frames->size());
    for (const auto& f : frames->items()) stack.push_back(frame(f, where));
    std::string key(reinterpret_cast<const char*>(stack.data()), stack.size() * sizeof(std::uint32_t));
    auto [it, inserted] = m_by_content.try_emplace(std::move(key), static_cast<std::uint32_t>(m_rec.stacks.size()));
    if (inserted) m_rec.stacks.push_back(std::move(stack));
    m_by_node.emplace(frames.get(), it->second);
    m_keep.push_back(frames);  // pointers are keys: keep the nodes alive while interning
    return it->second;
  }

 private:
  RankRecord& m_rec;
  std::unordered_map<const Value*, std::uint32_t> m_by_node;
  std::unordered_map<std::string, std::uint32_t> m_by_content;
  std::unordered_map<const Value*, std::uint32_t> m_frame_by_node;
  std::unordered_map<std::string, std::uint32_t> m_frame_by_content;
  std::vector<ValuePtr> m_keep;

  std::uint32_t frame(const ValuePtr& f, const std::string& where) {
    if (auto it = m_frame_by_node.find(f.get()); it != m_frame_by_node.end()) return it->second;
    if (!f->is_dict()) bad(where, "frame is not a dict");
    Frame fr;
    fr.name = field_str(*f, "name");
    fr.file = field_str(*f, "filename");
    if (const Value* line = f->find("line"); line && line->is_int())
      fr.line = static_cast<std::uint32_t>(as_i64(*line, where + ".line"));
    std::string key = fr.name;
    key += '\0';
    key += fr.file;
    key += '\0';
    key += std::to_string(fr.line);
    auto [it, inserted] = m_frame_by_content.try_emplace(std::move(key), static_cast<std::uint32_t>(m_rec.frames.size()));
    if (inserted) m_rec.frames.push_back(std::move(fr));
    m_frame_by_node.emplace(f.get(), it->second);
    m_keep.push_back(f);
    return it->second;
  }
};

// --- reserved address ranges, for live_at_start of segments ---------------------------------

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

// --- batches ----------------------------------------------------------------------------------

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

// Batches: the trace's own marks if it has any, else inferred from its structure; an explicit
// batch_start renumbers them from it.
void find_batches(const RankRecord& rec, const Value* annotations, const ImportOptions& opt, WindowRecord& w) {
  BatchInferenceOptions bo;
  bo.expected_batches = opt.expected_batches;
  const InferredBatches found = infer_batches(rec, w, annotations_of(annotations), bo);
  apply_inferred_batches(found, w);
  if (found.method == "step_annotation") w.batch_method = "recorded";  // the source's own marks
  if (opt.batch_start >= 0 && !w.batches.empty()) {
    const std::int64_t shift = opt.batch_start + (w.batch_start < w.batches.front().batch ? 1 : 0) - w.batches.front().batch;
    for (auto& b : w.batches) b.batch += shift;
    w.batch_start = opt.batch_start;
  } else if (opt.batch_start >= 0) {
    w.batch_start = opt.batch_start;
  }
}

}  // namespace

namespace {
// --- what export cannot rebuild from the record ------------------------------------------------

// The type export writes a key with, from the record.
enum class Shape : std::uint8_t { u64, i64, i16, str, pool, boolean, list, any };

bool fits(const Value& v, Shape shape) {
  switch (shape) {
    case Shape::u64:
      if (v.kind() == Kind::integer) return v.as_int64() >= 0;
      if (v.kind() != Kind::big_integer) return false;
      try {
        (void)v.as_uint64();
        return true;
      } catch (const pickle::ValueError&) {
        return false;
      }
    case Shape::i64:
      return v.kind() == Kind::integer;
    case Shape::i16:
      return v.kind() == Kind::integer && v.as_int64() >= std::numeric_limits<std::int16_t>::min() &&
             v.as_int64() <= std::numeric_limits<std::int16_t>::max();
    case Shape::str:
      return v.is_string();
    case Shape::pool:
      return v.is_string() && v.as_string().size() < 32;  // the store keeps 31 bytes
    case Shape::boolean:
      return v.kind() == Kind::boolean;
    case Shape::list:
      return v.is_list();
    case Shape::any:
      return true;
  }
  return false;
}

struct KeySpec {
  std::string_view key;
  Shape shape;
};
constexpr KeySpec kSegmentKeys[] = {{"device", Shape::i16},          {"address", Shape::u64},
                                    {"total_size", Shape::u64},      {"allocated_size", Shape::u64},
                                    {"active_size", Shape::u64},     {"requested_size", Shape::u64},
                                    {"stream", Shape::u64},          {"segment_type", Shape::pool},
                                    {"segment_pool_id", Shape::any}, {"is_expandable", Shape::boolean},
                                    {"frames", Shape::list},         {"blocks", Shape::list}};
constexpr KeySpec kBlockKeys[] = {{"address", Shape::u64},
                                  {"size", Shape::u64},
                                  {"requested_size", Shape::u64},
                                  {"state", Shape::str},
                                  {"frames", Shape::list}};
constexpr KeySpec kEntryKeys[] = {{"action", Shape::str},        {"addr", Shape::u64},
                                  {"size", Shape::u64},          {"stream", Shape::u64},
                                  {"time_us", Shape::i64},       {"compile_context", Shape::str},
                                  {"user_metadata", Shape::str}, {"frames", Shape::list}};
constexpr KeySpec kOomEntryKeys[] = {
    {"action", Shape::str},  {"device_free", Shape::u64},     {"size", Shape::u64},          {"stream", Shape::u64},
    {"time_us", Shape::i64}, {"compile_context", Shape::str}, {"user_metadata", Shape::str}, {"frames", Shape::list}};

// What a dict (segment, block, trace entry) holds beyond what export writes back from the record:
// "absent", the keys of `written` that it lacks or holds with another type (export leaves them
// out), and "other", those values and the keys memsnap does not know (export writes them as they
// were). Empty for the dicts torch 2.11 writes.
struct ShapeNotes {
  std::vector<std::string_view> absent;
  pickle::DictItems other;
};
ShapeNotes note_shape(const Value& dict, std::span<const KeySpec> written) {
  ShapeNotes n;
  for (const auto& spec : written) {
    const Value* v = dict.find(spec.key);
    if (!v || !fits(*v, spec.shape)) n.absent.push_back(spec.key);
  }
  for (const auto& item : dict.dict_items()) {
    // Named copies: clang 14 cannot capture structured bindings in a lambda.
    const auto& k = item.first;
    const auto& v = item.second;
    const bool known = k->is_string() && std::any_of(written.begin(), written.end(), [&](const KeySpec& spec) {
                         return spec.key == k->as_string() && fits(*v, spec.shape);
                       });
    if (!known) n.other.emplace_back(k, v);
  }
  return n;
}

// Writes the notes into x; `skip` names absent keys that x need not list (noted elsewhere).
void put_notes(const ShapeNotes& n, nlohmann::json& x, JsonBudget& budget,
               std::span<const std::string_view> skip = {}) {
  auto absent = nlohmann::json::array();
  for (auto key : n.absent)
    if (std::find(skip.begin(), skip.end(), key) == skip.end()) absent.push_back(std::string(key));
  if (!absent.empty()) x["absent"] = std::move(absent);
  if (!n.other.empty()) x["other"] = to_json_at(budget.keep(Value::dict(n.other)), 0, budget);
}

// Frame lists are interned into the record when they are lists (each frame as name, filename,
// line); anything else stays in the extras as it was.
bool internable_frames(const ValuePtr& frames) {
  return frames && frames->is_list() &&
         std::all_of(frames->items().begin(), frames->items().end(), [](const ValuePtr& f) { return f->is_dict(); });
}
}  // namespace

ImportResult import_snapshot_full(const Value& root, const ImportOptions& opt) {
  if (!root.is_dict()) bad("top level", std::string("expected a dict, got ") + pickle::kind_name(root.kind()));
  ImportResult result;
  RankRecord& rec = result.record;
  nlohmann::json& extras = result.extras;
  extras = nlohmann::json::object();
  rec.meta.rank = opt.rank;
  rec.meta.world_size = opt.world_size;
  rec.meta.run_name = opt.run_name;
  rec.meta.source = "torch";
  StackInterner stacks(rec);

  WindowRecord w;
  w.batch_end = opt.batch;
  w.closed = true;

  // Segments and blocks: the allocator state at dump.
  JsonBudget budget;  // for all values copied into the extras
  std::vector<std::uint32_t> segment_stacks;
  auto seg_extras = nlohmann::json::array();
  if (const Value* segs = root.find("segments"); segs && !segs->is_none()) {
    if (!segs->is_list()) bad("segments", "not a list");
    for (std::size_t i = 0; i < segs->size(); ++i) {
      const Value& s = *segs->items()[i];
      std::string where = "segments[" + std::to_string(i) + "]";
      Segment seg;
      seg.addr = as_u64(require(s, "address", where), where + ".address");
      seg.size = as_u64(require(s, "total_size", where), where + ".total_size");
      seg.stream = field_u64(s, "stream", where);
      seg.device = static_cast<std::int16_t>(field_u64(s, "device", where));
      seg.pool = field_str(s, "segment_type");
      nlohmann::json sx = nlohmann::json::object();
      auto blocks_x = nlohmann::json::array();
      if (const Value* blocks = s.find("blocks"); blocks && !blocks->is_none()) {
        if (!blocks->is_list()) bad(where + ".blocks", "not a list");
        for (std::size_t j = 0; j < blocks->size(); ++j) {
          const Value& b = *blocks->items()[j];
          std::string bw = where + ".blocks[" + std::to_string(j) + "]";
          Block blk;
          blk.addr = as_u64(require(b, "address", bw), bw + ".address");
          blk.size = as_u64(require(b, "size", bw), bw + ".size");
          blk.requested_size = field_u64(b, "requested_size", bw, blk.size);
          std::string state = field_str(b, "state", "inactive");
          auto st = block_state_from_name(state);
          if (!st) bad(bw + ".state", "unknown block state '" + state + "'");
          blk.state = *st;
          blk.stack_id = stacks.intern(b.find_ptr("frames"), bw + ".frames");
          seg.blocks.push_back(blk);
          nlohmann::json bx = nlohmann::json::object();
          put_notes(note_shape(b, kBlockKeys), bx, budget);
          if (!bx.empty()) {
            bx["index"] = j;
            blocks_x.push_back(std::move(bx));
          }
        }
      }
      std::uint32_t seg_stack = stacks.intern(s.find_ptr("frames"), where + ".frames");
      segment_stacks.push_back(seg_stack);
      sx["stack"] = seg_stack == kNoStack ? -1 : static_cast<std::int64_t>(seg_stack);
      if (const Value* pid = s.find("segment_pool_id")) sx["segment_pool_id"] = to_json_at(*pid, 0, budget);
      if (const Value* ex = s.find("is_expandable"); ex && ex->kind() == Kind::boolean) sx["is_expandable"] = ex->as_bool();
      for (const char* k : {"allocated_size", "active_size", "requested_size"})
        if (const Value* n = s.find(k); n && fits(*n, Shape::u64)) sx[k] = n->as_uint64();
      // A segment without frames says so with stack -1; "absent" need not repeat it.
      static constexpr std::string_view kFrames[] = {"frames"};
      put_notes(note_shape(s, kSegmentKeys), sx, budget,
                seg_stack == kNoStack && !s.find("frames") ? std::span<const std::string_view>(kFrames)
                                                           : std::span<const std::string_view>());
      if (!blocks_x.empty()) sx["blocks_x"] = std::move(blocks_x);
      seg_extras.push_back(std::move(sx));
      w.segments.push_back(std::move(seg));
    }
  }
  extras["segments"] = std::move(seg_extras);

  // Device traces, merged by time with each device's own order kept (a k-way merge, not a sort,
  // so that export gives every device's entries back in their original order).
  std::vector<std::vector<Event>> per_device;
  // Entries whose values differ from what export writes by default. compile_context and
  // user_metadata missing from every entry (torch before 2.2 wrote neither) are noted once, in
  // "trace_absent", not per entry.
  struct EntryNotes {
    std::size_t device, index;
    nlohmann::json x;
    std::uint8_t absent_text;  // bit 0: compile_context absent, bit 1: user_metadata absent
  };
  std::vector<EntryNotes> entry_notes;
  std::uint8_t absent_everywhere = 3;
  auto unknown = nlohmann::json::array();
  auto none_traces = nlohmann::json::array();
  std::uint64_t skipped = 0;
  if (const Value* traces = root.find("device_traces"); traces && !traces->is_none()) {
    if (!traces->is_list()) bad("device_traces", "not a list");
    if (traces->size() > static_cast<std::size_t>(std::numeric_limits<std::int16_t>::max()))
      bad("device_traces", "more device traces than memsnap's device id can hold");
    for (std::size_t d = 0; d < traces->size(); ++d) {
      const Value& trace = *traces->items()[d];
      per_device.emplace_back();
      if (trace.is_none()) {
        none_traces.push_back(d);
        continue;
      }
      if (!trace.is_list()) bad("device_traces[" + std::to_string(d) + "]", "not a list");
      std::size_t kept_index = 0;
      for (std::size_t i = 0; i < trace.size(); ++i) {
        const Value& entry = *trace.items()[i];
        std::string where = "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "]";
        const Value& action_v = require(entry, "action", where);
        if (!action_v.is_string()) bad(where + ".action", "not a str");
        auto action = action_from_name(action_v.as_string());
        if (!action) {
          // An action this memsnap does not know (a newer torch): no event, so no analysis sees
          // it, but the extras keep the entry where it was, for export.
          ++skipped;
          nlohmann::json u = {{"device", d}, {"position", i}};
          const ValuePtr frames = entry.find_ptr("frames");
          const bool intern = internable_frames(frames);
          if (intern) {
            const std::uint32_t id = stacks.intern(frames, where + ".frames");
            u["stack"] = static_cast<std::int64_t>(id);
          }
          pickle::DictItems rest;
          for (const auto& [k, v] : entry.dict_items())
            if (!(intern && k->is_string() && k->as_string() == "frames")) rest.emplace_back(k, v);
          u["entry"] = to_json_at(budget.keep(Value::dict(std::move(rest))), 0, budget);
          unknown.push_back(std::move(u));
          continue;
        }
        Event e;
        e.action = *action;
        e.device = static_cast<std::int16_t>(d);
        std::int64_t time_us = as_i64(require(entry, "time_us", where), where + ".time_us");
        if (time_us > std::numeric_limits<std::int64_t>::max() / 1000 || time_us < std::numeric_limits<std::int64_t>::min() / 1000)
          bad(where + ".time_us", "out of range");
        e.time_ns = time_us * 1000;
        e.size = field_u64(entry, "size", where);
        e.stream = field_u64(entry, "stream", where);
        // For oom, Event::addr holds the device's free bytes (torch's device_free).
        e.addr = e.action == Action::oom ? field_u64(entry, "device_free", where) : field_u64(entry, "addr", where);
        e.stack_id = stacks.intern(entry.find_ptr("frames"), where + ".frames");
        if (e.action == Action::oom) w.oom = true;

        nlohmann::json x = nlohmann::json::object();
        if (const Value* cc = entry.find("compile_context"); cc && cc->is_string() && cc->as_string() != "N/A")
          x["compile_context"] = text_json(cc->as_string());
        if (const Value* um = entry.find("user_metadata"); um && um->is_string() && !um->as_string().empty())
          x["user_metadata"] = text_json(um->as_string());
        const ShapeNotes notes = note_shape(entry, e.action == Action::oom ? std::span<const KeySpec>(kOomEntryKeys)
                                                                           : std::span<const KeySpec>(kEntryKeys));
        static constexpr std::string_view kText[] = {"compile_context", "user_metadata"};
        std::uint8_t absent_text = 0;
        for (auto key : notes.absent) {
          if (key == kText[0] && !entry.find(key)) absent_text |= 1;
          if (key == kText[1] && !entry.find(key)) absent_text |= 2;
        }
        absent_everywhere &= absent_text;
        // A missing compile_context or user_metadata is noted below; one there of another type
        // is listed here with its value.
        std::vector<std::string_view> skip;
        if (absent_text & 1) skip.push_back(kText[0]);
        if (absent_text & 2) skip.push_back(kText[1]);
        put_notes(notes, x, budget, skip);
        if (!x.empty() || absent_text != 0) entry_notes.push_back(EntryNotes{d, kept_index, std::move(x), absent_text});
        per_device.back().push_back(e);
        ++kept_index;
      }
    }
  }
  auto trace_extras = nlohmann::json::array();
  for (auto& n : entry_notes) {
    static const char* kTextKeys[] = {"compile_context", "user_metadata"};
    for (int bit = 0; bit < 2; ++bit)
      if ((n.absent_text & ~absent_everywhere) & (1u << bit)) {
        if (!n.x.contains("absent")) n.x["absent"] = nlohmann::json::array();
        n.x["absent"].push_back(kTextKeys[bit]);
      }
    if (n.x.empty()) continue;
    n.x["device"] = n.device;
    n.x["index"] = n.index;
    trace_extras.push_back(std::move(n.x));
  }
  entry_notes.clear();
  extras["device_count"] = per_device.size();
  extras["trace_extras"] = std::move(trace_extras);
  if (!per_device.empty() &&
      std::any_of(per_device.begin(), per_device.end(), [](const auto& t) { return !t.empty(); })) {
    auto absent = nlohmann::json::array();
    if (absent_everywhere & 1) absent.push_back("compile_context");
    if (absent_everywhere & 2) absent.push_back("user_metadata");
    if (!absent.empty()) extras["trace_absent"] = std::move(absent);
  }
  if (!unknown.empty()) extras["unknown_entries"] = std::move(unknown);
  if (!none_traces.empty()) extras["none_traces"] = std::move(none_traces);
  extras["skipped_entries"] = skipped;

  std::vector<std::size_t> heads(per_device.size(), 0);
  while (true) {
    std::size_t best = per_device.size();
    for (std::size_t d = 0; d < per_device.size(); ++d)
      if (heads[d] < per_device[d].size() &&
          (best == per_device.size() || per_device[d][heads[d]].time_ns < per_device[best][heads[best]].time_ns))
        best = d;
    if (best == per_device.size()) break;
    w.events.push_back(per_device[best][heads[best]++]);
  }
  if (!w.events.empty()) {
    w.open_time_ns = w.events.front().time_ns;
    w.close_time_ns = w.events.back().time_ns;
  }

  w.live_at_start = reconstruct_live_at_start(w, segment_stacks);

  const Value* annotations = root.find("external_annotations");
  find_batches(rec, annotations, opt, w);
  if (annotations) extras["external_annotations"] = to_json_at(*annotations, 0, budget);
  if (const Value* settings = root.find("allocator_settings"))
    extras["allocator_settings"] = to_json_at(*settings, 0, budget);
  // Export writes segments, device_traces and allocator_settings whatever the snapshot had.
  auto absent = nlohmann::json::array();
  for (const char* key : {"segments", "device_traces", "allocator_settings"})
    if (const Value* v = root.find(key); !v || (v->is_none() && std::string_view(key) != "allocator_settings"))
      absent.push_back(key);
  if (!absent.empty()) extras["absent"] = std::move(absent);
  pickle::DictItems other;
  for (const auto& [k, v] : root.dict_items()) {
    const std::string_view key = k->is_string() ? std::string_view(k->as_string()) : std::string_view();
    const bool known = k->is_string() && (key == "external_annotations" || key == "allocator_settings" ||
                                          ((key == "segments" || key == "device_traces") && !v->is_none()));
    if (!known) other.emplace_back(k, v);
  }
  if (!other.empty()) extras["other_keys"] = to_json_at(budget.keep(Value::dict(std::move(other))), 0, budget);

  rec.windows.push_back(std::move(w));
  return result;
}

RankRecord import_snapshot(const Value& root, const ImportOptions& opt) {
  return import_snapshot_full(root, opt).record;
}

namespace {
/// `message` without its leading "pickle: " / "torch snapshot: " (the file name replaces it).
std::string without_prefix(std::string message) {
  for (const char* prefix : {"pickle: ", "torch snapshot: ", "pickle value: "}) {
    if (message.rfind(prefix, 0) == 0) return message.substr(std::strlen(prefix));
  }
  return message;
}
}  // namespace

ImportResult import_snapshot_file(const std::string& path, const ImportOptions& opt) {
  // Every error names the file: "X.pickle: not a PyTorch snapshot: opcode BINGET (0x68) at byte 0 ...".
  if (std::ifstream probe(path, std::ios::binary); !probe) {
    throw pickle::PickleError(path + ": cannot read it: " + std::strerror(errno), 0);
  }
  try {
    auto root = pickle::read_file(path);
    auto result = import_snapshot_full(*root, opt);
    result.record.path = path;
    return result;
  } catch (const pickle::PickleError& e) {
    throw pickle::PickleError(path + ": not a PyTorch snapshot: " + without_prefix(e.what()), e.offset());
  } catch (const SnapshotError& e) {
    throw SnapshotError(path + ": not a PyTorch snapshot: " + without_prefix(e.what()));
  } catch (const pickle::ValueError& e) {
    throw SnapshotError(path + ": not a PyTorch snapshot: " + without_prefix(e.what()));
  }
}

}  // namespace memsnap::torch
