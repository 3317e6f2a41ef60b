// Import of PyTorch memory snapshots: trace entries to Events, segments and blocks to Segments,
// the reconstruction of what was live before the trace began, and batches found in the trace.
// One importer (SnapshotImporter) serves both ways in: the walk of a whole tree
// (import_snapshot_full) and a file read as a stream (import_snapshot_file), where each trace
// entry is converted as the reader meets it and then freed (pickle::read_streaming).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <charconv>
#include <exception>
#include <optional>
#include <span>
#include <unordered_map>

#include "memsnap/batch_inference.hpp"
#include "torch/snapshot_detail.hpp"

namespace memsnap::torch {

using namespace detail;

namespace {

// --- frame and stack interning ---------------------------------------------------------------

// Ids of nodes met before, by address: open addressing, as lookups happen once per frame.
class NodeIds {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  std::uint32_t find(const Value* v) const {
    if (m_slots.empty()) return kNone;
    for (std::size_t i = slot_of(v);; i = (i + 1) & (m_slots.size() - 1)) {
      if (m_slots[i].node == v) return m_slots[i].id;
      if (!m_slots[i].node) return kNone;
    }
  }
  void insert(const Value* v, std::uint32_t id) {
    if ((m_used + 1) * 2 > m_slots.size()) grow();
    std::size_t i = slot_of(v);
    while (m_slots[i].node && m_slots[i].node != v) i = (i + 1) & (m_slots.size() - 1);
    if (!m_slots[i].node) ++m_used;
    m_slots[i] = Slot{v, id};
  }

 private:
  struct Slot {
    const Value* node = nullptr;
    std::uint32_t id = 0;
  };
  std::vector<Slot> m_slots;
  std::size_t m_used = 0;
  std::size_t slot_of(const Value* v) const {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(v) >> 4) * 0x9e3779b97f4a7c15ull >> 20) &
           (m_slots.size() - 1);
  }
  void grow() {
    std::vector<Slot> old = std::move(m_slots);
    m_slots.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    m_used = 0;
    for (const Slot& s : old)
      if (s.node) insert(s.node, s.id);
  }
};

// Frame ids by the nodes of a frame's name and filename (shared str nodes, as Python's pickler
// writes a repeated str once) and its line: a frame dict met again as a new dict costs no text.
class FrameNodeIds {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  std::uint32_t find(const Value* name, const Value* file, std::uint32_t line) const {
    if (m_slots.empty()) return kNone;
    for (std::size_t i = slot_of(name, file, line);; i = (i + 1) & (m_slots.size() - 1)) {
      const Slot& s = m_slots[i];
      if (s.id == kNone) return kNone;
      if (s.name == name && s.file == file && s.line == line) return s.id;
    }
  }
  void insert(const Value* name, const Value* file, std::uint32_t line, std::uint32_t id) {
    if ((m_used + 1) * 2 > m_slots.size()) grow();
    std::size_t i = slot_of(name, file, line);
    while (m_slots[i].id != kNone) i = (i + 1) & (m_slots.size() - 1);
    m_slots[i] = Slot{name, file, line, id};
    ++m_used;
  }

 private:
  struct Slot {
    const Value* name = nullptr;
    const Value* file = nullptr;
    std::uint32_t line = 0;
    std::uint32_t id = kNone;
  };
  std::vector<Slot> m_slots;
  std::size_t m_used = 0;
  std::size_t slot_of(const Value* name, const Value* file, std::uint32_t line) const {
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(name) * 0x9e3779b97f4a7c15ull;
    h ^= (reinterpret_cast<std::uintptr_t>(file) + (h << 6) + (h >> 2)) * 0xc2b2ae3d27d4eb4full;
    h ^= (line + (h << 6) + (h >> 2)) * 0x165667b19e3779f9ull;
    return static_cast<std::size_t>(h ^ (h >> 29)) & (m_slots.size() - 1);
  }
  void grow() {
    std::vector<Slot> old = std::move(m_slots);
    m_slots.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
    m_used = 0;
    for (const Slot& s : old)
      if (s.id != kNone) insert(s.name, s.file, s.line, s.id);
  }
};

// Hash and equality that look std::string keys up by string_view, without building a string.
struct TextHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class StackInterner {
 public:
  // by_any_node: every node outlives the import (a whole tree), so any node's address is a key.
  // Otherwise only shared nodes are (streaming frees the others, and their addresses come back).
  StackInterner(RankRecord& rec, bool by_any_node) : m_rec(rec), m_by_any_node(by_any_node) {}

  // The stack id of a frames list; kNoStack for a missing or None value. `where` names it in errors.
  template <typename Where>
  std::uint32_t intern(const ValuePtr& frames, const Where& where) {
    if (!frames || frames->is_none()) return kNoStack;
    // Fast path: a frames list met before (torch's pickles may reference one from many entries).
    const bool by_node = m_by_any_node || frames->is_shared();
    if (by_node)
      if (std::uint32_t id = m_by_node.find(frames.get()); id != NodeIds::kNone) return id;
    if (!frames->is_list() && !frames->is_tuple()) bad(where(), "frames is not a list");
    m_stack.clear();
    for (const auto& f : frames->items()) m_stack.push_back(frame(f, where));
    const std::string_view key(reinterpret_cast<const char*>(m_stack.data()), m_stack.size() * sizeof(std::uint32_t));
    std::uint32_t id;
    if (auto it = m_by_content.find(key); it != m_by_content.end()) {
      id = it->second;
    } else {
      id = static_cast<std::uint32_t>(m_rec.stacks.size());
      m_by_content.emplace(std::string(key), id);
      m_rec.stacks.push_back(m_stack);
    }
    if (by_node) keep(frames, m_by_node, id);
    return id;
  }

 private:
  RankRecord& m_rec;
  bool m_by_any_node;
  NodeIds m_by_node;
  std::unordered_map<std::string, std::uint32_t, TextHash, std::equal_to<>> m_by_content;
  NodeIds m_frame_by_node;
  FrameNodeIds m_frame_by_text_nodes;
  std::unordered_map<std::string, std::uint32_t, TextHash, std::equal_to<>> m_frame_by_content;
  // Pointers are keys: a weak reference keeps each one's memory from being reused (make_shared
  // allocates node and count together) without keeping the node, and what it holds, alive.
  std::vector<std::weak_ptr<const Value>> m_pins;
  Stack m_stack;                 // scratch
  std::string m_key;             // scratch

  void keep(const ValuePtr& node, NodeIds& ids, std::uint32_t id) {
    ids.insert(node.get(), id);
    m_pins.emplace_back(node);
  }

  template <typename Where>
  std::uint32_t frame(const ValuePtr& f, const Where& where) {
    const bool by_node = m_by_any_node || f->is_shared();
    if (by_node)
      if (std::uint32_t id = m_frame_by_node.find(f.get()); id != NodeIds::kNone) return id;
    if (!f->is_dict()) bad(where(), "frame is not a dict");
    const ValuePtr* name = nullptr;
    const ValuePtr* file = nullptr;
    const Value* line = nullptr;
    for (const auto& [k, v] : f->dict_items()) {
      if (!k->is_string()) continue;
      const std::string& key = k->as_string();
      if (!name && key == "name") name = &v;
      else if (!file && key == "filename") file = &v;
      else if (!line && key == "line") line = v.get();
    }
    std::uint32_t line_no = 0;
    if (line && line->is_int())
      line_no = static_cast<std::uint32_t>(line->kind() == Kind::integer ? line->as_int64() : as_i64(*line, where() + ".line"));
    // By the name and filename nodes, where those outlive the import.
    const Value* name_node = name ? name->get() : nullptr;
    const Value* file_node = file ? file->get() : nullptr;
    const bool by_text_nodes = (!name_node || m_by_any_node || name_node->is_shared()) &&
                               (!file_node || m_by_any_node || file_node->is_shared());
    if (by_text_nodes)
      if (std::uint32_t id = m_frame_by_text_nodes.find(name_node, file_node, line_no); id != FrameNodeIds::kNone) {
        if (by_node) keep(f, m_frame_by_node, id);
        return id;
      }
    static const std::string kEmpty;
    const std::string& name_s = name_node && name_node->is_string() ? name_node->as_string() : kEmpty;
    const std::string& file_s = file_node && file_node->is_string() ? file_node->as_string() : kEmpty;
    m_key.assign(name_s);
    m_key += '\0';
    m_key += file_s;
    m_key += '\0';
    char digits[16];
    auto [end, ec] = std::to_chars(digits, digits + sizeof digits, line_no);
    m_key.append(digits, end);
    std::uint32_t id;
    if (auto it = m_frame_by_content.find(std::string_view(m_key)); it != m_frame_by_content.end()) {
      id = it->second;
    } else {
      id = static_cast<std::uint32_t>(m_rec.frames.size());
      m_frame_by_content.emplace(m_key, id);
      m_rec.frames.push_back(Frame{name_s, file_s, line_no});
    }
    if (by_node) keep(f, m_frame_by_node, id);
    if (by_text_nodes) {
      m_frame_by_text_nodes.insert(name_node, file_node, line_no, id);
      if (name) m_pins.emplace_back(*name);
      if (file) m_pins.emplace_back(*file);
    }
    return id;
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

namespace {

// Where an entry's keys are, found in one pass over its items (the first of a repeated key).
enum EntryKey : std::uint8_t {
  kAction, kAddr, kSize, kStream, kTimeUs, kCompileContext, kUserMetadata, kFrames, kDeviceFree, kEntryKeyCount,
  kOtherKey = kEntryKeyCount,
};
constexpr std::string_view kEntryKeyNames[] = {"action",          "addr",          "size",   "stream",     "time_us",
                                               "compile_context", "user_metadata", "frames", "device_free"};
EntryKey entry_key(const Value& key) {
  if (!key.is_string()) return kOtherKey;
  const std::string& k = key.as_string();
  for (std::uint8_t i = 0; i < kEntryKeyCount; ++i)
    if (k == kEntryKeyNames[i]) return static_cast<EntryKey>(i);
  return kOtherKey;
}
// The type export writes each key with (the Shape of note_shape's KeySpec).
Shape entry_key_shape(EntryKey k) {
  switch (k) {
    case kTimeUs: return Shape::i64;
    case kAction: case kCompileContext: case kUserMetadata: return Shape::str;
    case kFrames: return Shape::list;
    default: return Shape::u64;
  }
}

// Field access that formats the place only on error.
template <typename Where>
std::uint64_t entry_u64(const Value* v, const Where& where, std::string_view key) {
  if (!v || v->is_none()) return 0;
  if (v->kind() == Kind::integer) return static_cast<std::uint64_t>(v->as_int64());
  return as_u64(*v, where() + "." + std::string(key));
}

// One snapshot's import. The tree walk (import_snapshot_full) and the streaming read
// (import_snapshot_file) share it: segments first, then each trace entry in order (entry), then
// the rest of the root dict (finish).
class SnapshotImporter final : public pickle::TraceSink {
 public:
  SnapshotImporter(const ImportOptions& opt, bool streaming)
      : m_opt(opt), m_streaming(streaming), m_stacks(m_result.record, !streaming) {
    m_result.extras = nlohmann::json::object();
    RankRecord& rec = m_result.record;
    rec.meta.rank = opt.rank;
    rec.meta.world_size = opt.world_size;
    rec.meta.run_name = opt.run_name;
    rec.meta.source = "torch";
    m_w.batch_end = opt.batch;
    m_w.closed = true;
  }

  // Streaming: errors wait until the read is done, so that a malformed pickle is reported as such
  // and errors come in the order the tree walk meets them.
  bool begin(const ValuePtr& segments) override {
    if (!segments) return false;
    guarded(kSegmentsFailed, [&] { read_segments(segments.get()); });
    return true;
  }
  void entry(std::size_t device, std::size_t position, const ValuePtr& entry) override {
    if (m_error) return;
    guarded(device, [&] { read_entry(device, position, *entry); });
  }

  // The whole import from a tree: nothing was streamed.
  ImportResult import_tree(const Value& root) {
    check_root(root);
    read_segments(root.find("segments"));
    read_traces(root, false);
    return finish(root);
  }
  // After a streaming read: the segments and entries have been seen.
  ImportResult import_streamed(const Value& root) {
    check_root(root);
    if (m_error && m_error_device == kSegmentsFailed) std::rethrow_exception(m_error);
    read_traces(root, true);
    return finish(root);
  }

 private:
  static constexpr std::size_t kSegmentsFailed = std::numeric_limits<std::size_t>::max();

  const ImportOptions& m_opt;
  bool m_streaming;
  ImportResult m_result;
  StackInterner m_stacks;
  WindowRecord m_w;
  JsonBudget m_budget;  // for all values copied into the extras
  std::vector<std::uint32_t> m_segment_stacks;
  nlohmann::json m_seg_extras = nlohmann::json::array();
  // Device traces, merged by time at the end with each device's own order kept.
  std::vector<std::vector<Event>> m_per_device;
  // Entries whose values differ from what export writes by default. compile_context and
  // user_metadata missing from every entry (torch before 2.2 wrote neither) are noted once, in
  // "trace_absent", not per entry.
  struct EntryNotes {
    std::size_t device, index;
    nlohmann::json x;
    std::uint8_t absent_text;  // bit 0: compile_context absent, bit 1: user_metadata absent
  };
  std::vector<EntryNotes> m_entry_notes;
  std::uint8_t m_absent_everywhere = 3;
  nlohmann::json m_unknown = nlohmann::json::array();
  std::uint64_t m_skipped = 0;
  std::exception_ptr m_error;  // streaming: the first error, and the device (or kSegmentsFailed)
  std::size_t m_error_device = 0;

  template <typename F>
  void guarded(std::size_t device, const F& f) {
    try {
      f();
    } catch (const SnapshotError&) {
      m_error = std::current_exception();
      m_error_device = device;
    } catch (const pickle::ValueError&) {
      m_error = std::current_exception();
      m_error_device = device;
    }
  }

  static void check_root(const Value& root) {
    if (!root.is_dict()) bad("top level", std::string("expected a dict, got ") + pickle::kind_name(root.kind()));
  }

  // Segments and blocks: the allocator state at dump.
  void read_segments(const Value* segs) {
    if (!segs || segs->is_none()) return;
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
          blk.stack_id = m_stacks.intern(b.find_ptr("frames"), [&] { return bw + ".frames"; });
          seg.blocks.push_back(blk);
          nlohmann::json bx = nlohmann::json::object();
          put_notes(note_shape(b, kBlockKeys), bx, m_budget);
          if (!bx.empty()) {
            bx["index"] = j;
            blocks_x.push_back(std::move(bx));
          }
        }
      }
      std::uint32_t seg_stack = m_stacks.intern(s.find_ptr("frames"), [&] { return where + ".frames"; });
      m_segment_stacks.push_back(seg_stack);
      sx["stack"] = seg_stack == kNoStack ? -1 : static_cast<std::int64_t>(seg_stack);
      if (const Value* pid = s.find("segment_pool_id")) sx["segment_pool_id"] = to_json_at(*pid, 0, m_budget);
      if (const Value* ex = s.find("is_expandable"); ex && ex->kind() == Kind::boolean) sx["is_expandable"] = ex->as_bool();
      for (const char* k : {"allocated_size", "active_size", "requested_size"})
        if (const Value* n = s.find(k); n && fits(*n, Shape::u64)) sx[k] = n->as_uint64();
      // A segment without frames says so with stack -1; "absent" need not repeat it.
      static constexpr std::string_view kFrames[] = {"frames"};
      put_notes(note_shape(s, kSegmentKeys), sx, m_budget,
                seg_stack == kNoStack && !s.find("frames") ? std::span<const std::string_view>(kFrames)
                                                           : std::span<const std::string_view>());
      if (!blocks_x.empty()) sx["blocks_x"] = std::move(blocks_x);
      m_seg_extras.push_back(std::move(sx));
      m_w.segments.push_back(std::move(seg));
    }
  }

  // The device_traces list: its shape, and (from a tree) every entry.
  void read_traces(const Value& root, bool streamed) {
    auto none_traces = nlohmann::json::array();
    if (const Value* traces = root.find("device_traces"); traces && !traces->is_none()) {
      if (!traces->is_list()) bad("device_traces", "not a list");
      if (traces->size() > static_cast<std::size_t>(std::numeric_limits<std::int16_t>::max()))
        bad("device_traces", "more device traces than memsnap's device id can hold");
      if (m_per_device.size() < traces->size()) m_per_device.resize(traces->size());
      for (std::size_t d = 0; d < traces->size(); ++d) {
        if (m_error && m_error_device == d) std::rethrow_exception(m_error);
        const Value& trace = *traces->items()[d];
        if (trace.is_none()) {
          none_traces.push_back(d);
          continue;
        }
        if (!trace.is_list()) bad("device_traces[" + std::to_string(d) + "]", "not a list");
        if (!streamed)
          for (std::size_t i = 0; i < trace.size(); ++i) read_entry(d, i, *trace.items()[i]);
      }
    }
    if (m_error) std::rethrow_exception(m_error);  // not reached: an entry's device is a trace
    auto& extras = m_result.extras;
    auto trace_extras = nlohmann::json::array();
    for (auto& n : m_entry_notes) {
      static const char* kTextKeys[] = {"compile_context", "user_metadata"};
      for (int bit = 0; bit < 2; ++bit)
        if ((n.absent_text & ~m_absent_everywhere) & (1u << bit)) {
          if (!n.x.contains("absent")) n.x["absent"] = nlohmann::json::array();
          n.x["absent"].push_back(kTextKeys[bit]);
        }
      if (n.x.empty()) continue;
      n.x["device"] = n.device;
      n.x["index"] = n.index;
      trace_extras.push_back(std::move(n.x));
    }
    m_entry_notes.clear();
    extras["device_count"] = m_per_device.size();
    extras["trace_extras"] = std::move(trace_extras);
    if (!m_per_device.empty() &&
        std::any_of(m_per_device.begin(), m_per_device.end(), [](const auto& t) { return !t.empty(); })) {
      auto absent = nlohmann::json::array();
      if (m_absent_everywhere & 1) absent.push_back("compile_context");
      if (m_absent_everywhere & 2) absent.push_back("user_metadata");
      if (!absent.empty()) extras["trace_absent"] = std::move(absent);
    }
    if (!m_unknown.empty()) extras["unknown_entries"] = std::move(m_unknown);
    if (!none_traces.empty()) extras["none_traces"] = std::move(none_traces);
    extras["skipped_entries"] = m_skipped;
  }

  // One trace entry: an event, or an entry whose action memsnap does not know.
  void read_entry(std::size_t d, std::size_t i, const Value& entry) {
    auto where = [&] { return "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "]"; };
    if (!entry.is_dict()) bad(where(), std::string("expected a dict, got ") + pickle::kind_name(entry.kind()));
    if (m_per_device.size() <= d) m_per_device.resize(d + 1);
    const ValuePtr* at[kEntryKeyCount] = {};
    for (const auto& item : entry.dict_items()) {
      const EntryKey k = entry_key(*item.first);
      if (k != kOtherKey && !at[k]) at[k] = &item.second;
    }
    auto value = [&](EntryKey k) -> const Value* { return at[k] ? at[k]->get() : nullptr; };
    const Value* action_v = value(kAction);
    if (!action_v) bad(where(), "missing key 'action'");
    if (!action_v->is_string()) bad(where() + ".action", "not a str");
    auto action = action_from_name(action_v->as_string());
    if (!action) {
      read_unknown_entry(d, i, entry, at[kFrames] ? *at[kFrames] : ValuePtr(), where);
      return;
    }
    Event e;
    e.action = *action;
    e.device = static_cast<std::int16_t>(d);
    const Value* time_v = value(kTimeUs);
    if (!time_v) bad(where(), "missing key 'time_us'");
    std::int64_t time_us = time_v->kind() == Kind::integer ? time_v->as_int64() : as_i64(*time_v, where() + ".time_us");
    if (time_us > std::numeric_limits<std::int64_t>::max() / 1000 || time_us < std::numeric_limits<std::int64_t>::min() / 1000)
      bad(where() + ".time_us", "out of range");
    e.time_ns = time_us * 1000;
    e.size = entry_u64(value(kSize), where, "size");
    e.stream = entry_u64(value(kStream), where, "stream");
    // For oom, Event::addr holds the device's free bytes (torch's device_free).
    e.addr = e.action == Action::oom ? entry_u64(value(kDeviceFree), where, "device_free")
                                     : entry_u64(value(kAddr), where, "addr");
    e.stack_id = m_stacks.intern(at[kFrames] ? *at[kFrames] : ValuePtr(), [&] { return where() + ".frames"; });
    if (e.action == Action::oom) m_w.oom = true;

    nlohmann::json x;  // null until something is noted
    if (const Value* cc = value(kCompileContext); cc && cc->is_string() && cc->as_string() != "N/A")
      x["compile_context"] = text_json(cc->as_string());
    if (const Value* um = value(kUserMetadata); um && um->is_string() && !um->as_string().empty())
      x["user_metadata"] = text_json(um->as_string());
    // The shape notes (note_shape of the keys export writes: those of an entry, with device_free
    // in place of addr for an oom), from the keys found above.
    const EntryKey swapped = e.action == Action::oom ? kAddr : kDeviceFree;  // not written
    const EntryKey spec[] = {kAction, e.action == Action::oom ? kDeviceFree : kAddr, kSize, kStream,
                             kTimeUs, kCompileContext, kUserMetadata, kFrames};
    ShapeNotes notes;
    for (EntryKey k : spec)
      if (const Value* v = value(k); !v || !fits(*v, entry_key_shape(k))) notes.absent.push_back(kEntryKeyNames[k]);
    for (const auto& item : entry.dict_items()) {
      const EntryKey k = entry_key(*item.first);
      if (k == kOtherKey || k == swapped || !fits(*item.second, entry_key_shape(k))) notes.other.emplace_back(item.first, item.second);
    }
    std::uint8_t absent_text = 0;
    if (!value(kCompileContext)) absent_text |= 1;
    if (!value(kUserMetadata)) absent_text |= 2;
    m_absent_everywhere &= absent_text;
    // A missing compile_context or user_metadata is noted below; one there of another type
    // is listed here with its value.
    static constexpr std::string_view kText[] = {"compile_context", "user_metadata"};
    std::span<const std::string_view> skip;
    if (absent_text == 3) skip = std::span<const std::string_view>(kText, 2);
    else if (absent_text == 1) skip = std::span<const std::string_view>(kText, 1);
    else if (absent_text == 2) skip = std::span<const std::string_view>(kText + 1, 1);
    if (!notes.absent.empty() || !notes.other.empty()) {
      if (x.is_null()) x = nlohmann::json::object();
      put_notes(notes, x, m_budget, skip);
    }
    if ((!x.is_null() && !x.empty()) || absent_text != 0)
      m_entry_notes.push_back(EntryNotes{d, m_per_device[d].size(), std::move(x), absent_text});
    m_per_device[d].push_back(e);
  }

  // An action this memsnap does not know (a newer torch): no event, so no analysis sees it, but
  // the extras keep the entry where it was, for export.
  template <typename Where>
  void read_unknown_entry(std::size_t d, std::size_t i, const Value& entry, const ValuePtr& frames, const Where& where) {
    ++m_skipped;
    nlohmann::json u = {{"device", d}, {"position", i}};
    const bool intern = internable_frames(frames);
    if (intern) {
      const std::uint32_t id = m_stacks.intern(frames, [&] { return where() + ".frames"; });
      u["stack"] = static_cast<std::int64_t>(id);
    }
    pickle::DictItems rest;
    for (const auto& [k, v] : entry.dict_items())
      if (!(intern && k->is_string() && k->as_string() == "frames")) rest.emplace_back(k, v);
    u["entry"] = to_json_at(m_budget.keep(Value::dict(std::move(rest))), 0, m_budget);
    m_unknown.push_back(std::move(u));
  }

  // Merges the traces by time, rebuilds the state at start, finds batches, and keeps the rest of
  // the root dict in the extras.
  ImportResult finish(const Value& root) {
    RankRecord& rec = m_result.record;
    nlohmann::json& extras = m_result.extras;
    extras["segments"] = std::move(m_seg_extras);
    WindowRecord& w = m_w;
    // A k-way merge, not a sort, so that export gives every device's entries back in their
    // original order.
    if (m_per_device.size() == 1) {
      w.events = std::move(m_per_device[0]);
    } else {
      std::size_t total = 0;
      for (const auto& t : m_per_device) total += t.size();
      w.events.reserve(total);
      std::vector<std::size_t> heads(m_per_device.size(), 0);
      while (true) {
        std::size_t best = m_per_device.size();
        for (std::size_t d = 0; d < m_per_device.size(); ++d)
          if (heads[d] < m_per_device[d].size() &&
              (best == m_per_device.size() || m_per_device[d][heads[d]].time_ns < m_per_device[best][heads[best]].time_ns))
            best = d;
        if (best == m_per_device.size()) break;
        w.events.push_back(m_per_device[best][heads[best]++]);
      }
    }
    m_per_device.clear();
    if (!w.events.empty()) {
      w.open_time_ns = w.events.front().time_ns;
      w.close_time_ns = w.events.back().time_ns;
    }

    w.live_at_start = reconstruct_live_at_start(w, m_segment_stacks);

    const Value* annotations = root.find("external_annotations");
    find_batches(rec, annotations, m_opt, w);
    if (annotations) extras["external_annotations"] = to_json_at(*annotations, 0, m_budget);
    if (const Value* settings = root.find("allocator_settings"))
      extras["allocator_settings"] = to_json_at(*settings, 0, m_budget);
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
    if (!other.empty()) extras["other_keys"] = to_json_at(m_budget.keep(Value::dict(std::move(other))), 0, m_budget);

    rec.windows.push_back(std::move(w));
    return std::move(m_result);
  }
};

}  // namespace

ImportResult import_snapshot_full(const Value& root, const ImportOptions& opt) {
  SnapshotImporter importer(opt, false);
  return importer.import_tree(root);
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

namespace {
// A streaming read, and the import of what it gave; read again whole when it could not stream.
ImportResult import_bytes(std::string_view data, const pickle::MappedFile* file, const ImportOptions& opt) {
  auto importer = std::make_unique<SnapshotImporter>(opt, true);
  pickle::StreamedRead read = pickle::read_streaming(data, *importer, {}, file);
  if (read.streamed) return importer->import_streamed(*read.root);
  return SnapshotImporter(opt, false).import_tree(*read.root);
}

// Every error names its source: "X.pickle: not a PyTorch snapshot: opcode BINGET (0x68) at byte 0 ...".
template <typename F>
ImportResult named(const std::string& name, const F& f) {
  try {
    return f();
  } catch (const pickle::PickleError& e) {
    throw pickle::PickleError(name + ": not a PyTorch snapshot: " + without_prefix(e.what()), e.offset());
  } catch (const SnapshotError& e) {
    throw SnapshotError(name + ": not a PyTorch snapshot: " + without_prefix(e.what()));
  } catch (const pickle::ValueError& e) {
    throw SnapshotError(name + ": not a PyTorch snapshot: " + without_prefix(e.what()));
  }
}
}  // namespace

ImportResult import_snapshot_data(std::string_view data, const std::string& name, const ImportOptions& opt) {
  return named(name, [&] { return import_bytes(data, nullptr, opt); });
}

ImportResult import_snapshot_file(const std::string& path, const ImportOptions& opt) {
  if (std::ifstream probe(path, std::ios::binary); !probe) {
    throw pickle::PickleError(path + ": cannot read it: " + std::strerror(errno), 0);
  }
  auto result = named(path, [&] {
    const pickle::MappedFile file(path);
    return import_bytes(file.data(), &file, opt);
  });
  result.record.path = path;
  return result;
}

}  // namespace memsnap::torch
