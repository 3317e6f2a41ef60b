// Import and export of PyTorch memory snapshots: trace entries to Events, segments and blocks to
// Segments, and the reconstruction of what was live before the trace began.
#include "torch/snapshot.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "memsnap/batch_inference.hpp"
#include "torch/pickle_writer.hpp"

namespace memsnap::torch {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// --- typed field access with snapshot-level errors -------------------------------------------

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw SnapshotError("torch snapshot: " + where + ": " + what);
}

const Value& require(const Value& dict, std::string_view key, const std::string& where) {
  if (!dict.is_dict()) bad(where, std::string("expected a dict, got ") + pickle::kind_name(dict.kind()));
  const Value* v = dict.find(key);
  if (!v) bad(where, "missing key '" + std::string(key) + "'");
  return *v;
}

// Addresses, sizes and streams: unsigned 64-bit; a negative int keeps its two's-complement bits.
std::uint64_t as_u64(const Value& v, const std::string& where) {
  try {
    if (v.kind() == Kind::integer || v.kind() == Kind::boolean) return static_cast<std::uint64_t>(v.as_int64());
    return v.as_uint64();
  } catch (const pickle::ValueError& e) {
    bad(where, e.what());
  }
}
std::int64_t as_i64(const Value& v, const std::string& where) {
  try {
    return v.as_int64();
  } catch (const pickle::ValueError& e) {
    bad(where, e.what());
  }
}
std::uint64_t field_u64(const Value& dict, std::string_view key, const std::string& where,
                        std::uint64_t fallback = 0) {
  const Value* v = dict.find(key);
  return v && !v->is_none() ? as_u64(*v, where + "." + std::string(key)) : fallback;
}
std::string field_str(const Value& dict, std::string_view key, std::string fallback = {}) {
  const Value* v = dict.find(key);
  return v && v->is_string() ? v->as_string() : fallback;
}

const char* block_state_name(std::uint8_t s) {
  switch (s) {
    case 1: return "active_allocated";
    case 2: return "active_pending_free";
    default: return "inactive";
  }
}
std::optional<std::uint8_t> block_state_from_name(std::string_view s) {
  if (s == "inactive") return 0;
  if (s == "active_allocated") return 1;
  if (s == "active_pending_free") return 2;
  return std::nullopt;
}

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

// --- pickle <-> JSON -------------------------------------------------------------------------

// Extras travel as JSON (the store keeps them as text), and export must give every value back as
// it was: JSON's own types where they fit, else a one-member object with one of these tags.
constexpr const char* kTagTuple = "__tuple__";      // [items]
constexpr const char* kTagBytes = "__bytes_hex__";  // a bytes value, as hex
constexpr const char* kTagStr = "__str_hex__";      // a str whose bytes are not UTF-8, as hex
constexpr const char* kTagInt = "__int_le_hex__";   // an int beyond 64 bits: two's-complement LE, as hex
constexpr const char* kTagFloat = "__float__";      // "nan", "inf" or "-inf"
constexpr const char* kTagDict = "__dict__";        // [[key, value], ...]: a dict with a key that is not a
                                                    // UTF-8 str, or one that would read as a tag
bool is_tag(std::string_view key) {
  return key == kTagTuple || key == kTagBytes || key == kTagStr || key == kTagInt || key == kTagFloat ||
         key == kTagDict;
}

// Strict UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF), as JSON text needs:
// Python pickles a str with lone surrogates as the bytes of those surrogates.
bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 4;
    if (extra == 4 || i + extra >= s.size()) return false;  // bad lead byte, or cut short
    std::uint32_t cp = extra == 0 ? c : c & (0x3f >> extra);
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}
std::optional<std::string> unhex(const std::string& h) {
  if (h.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(h.size() / 2);
  for (std::size_t i = 0; i < h.size(); i += 2) {
    const int hi = digit(h[i]), lo = digit(h[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}
nlohmann::json text_json(const std::string& s) {
  if (valid_utf8(s)) return s;
  return nlohmann::json{{kTagStr, hex(s)}};
}

// --- export helpers ----------------------------------------------------------------------------

// Shared strings so the writer memoises each key once, as Python's pickler does for interned keys.
class StringPool {
 public:
  ValuePtr operator()(const std::string& s) {
    auto [it, inserted] = m_pool.try_emplace(s);
    if (inserted) it->second = Value::string(s);
    return it->second;
  }

 private:
  std::unordered_map<std::string, ValuePtr> m_pool;
};

const nlohmann::json* json_find(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

namespace {
// Extras are copied between pickle values and JSON recursively; deeper than this they are cut
// (a marker string), so a hostile pickle cannot overflow the stack on its way through. Shared
// references are expanded on the way to JSON, so a small pickle whose references nest (a list
// holding the same list four times, thirty deep) would fill memory: past a floor, the values
// written may be at most kMaxExpansion times the distinct values read.
constexpr int kMaxExtraDepth = 200;
constexpr const char* kTooDeep = "<nested too deep for memsnap>";
constexpr std::size_t kExtraValuesFloor = std::size_t{1} << 20;
constexpr std::size_t kMaxExpansion = 64;

class JsonBudget {
 public:
  void charge(const Value& v) {
    m_seen.insert(&v);
    if (++m_written > kExtraValuesFloor + kMaxExpansion * m_seen.size())
      bad("extras", "shared references expand to more than " + std::to_string(m_written) + " values");
  }
  // A value built for the extras (not read from the pickle) stays alive, so that its address is
  // not taken by another one while counted.
  const Value& keep(ValuePtr v) { return *m_kept.emplace_back(std::move(v)); }

 private:
  std::size_t m_written = 0;
  std::unordered_set<const Value*> m_seen;
  std::vector<ValuePtr> m_kept;
};

nlohmann::json to_json_at(const Value& v, int depth, JsonBudget& budget);
ValuePtr from_json_at(const nlohmann::json& j, int depth);
}  // namespace

nlohmann::json to_json(const Value& v) {
  JsonBudget budget;
  return to_json_at(v, 0, budget);
}
ValuePtr from_json(const nlohmann::json& j) { return from_json_at(j, 0); }

namespace {
nlohmann::json to_json_at(const Value& v, int depth, JsonBudget& budget) {
  if (depth > kMaxExtraDepth) return kTooDeep;
  budget.charge(v);
  switch (v.kind()) {
    case Kind::none: return nullptr;
    case Kind::boolean: return v.as_bool();
    case Kind::integer: return v.as_int64();
    case Kind::big_integer:
      try {
        return v.as_uint64();
      } catch (const pickle::ValueError&) {
        return nlohmann::json{{kTagInt, hex(v.int_le_bytes())}};
      }
    case Kind::floating: {
      const double d = v.as_double();
      if (std::isnan(d)) return nlohmann::json{{kTagFloat, "nan"}};
      if (std::isinf(d)) return nlohmann::json{{kTagFloat, d > 0 ? "inf" : "-inf"}};
      return d;
    }
    case Kind::string: return text_json(v.as_string());
    case Kind::bytes:
      return nlohmann::json{{kTagBytes, hex(v.as_bytes())}};
    case Kind::list:
    case Kind::tuple: {
      auto arr = nlohmann::json::array();
      for (const auto& i : v.items()) arr.push_back(to_json_at(*i, depth + 1, budget));
      if (v.is_tuple()) return nlohmann::json{{kTagTuple, std::move(arr)}};
      return arr;
    }
    case Kind::dict: {
      const auto& items = v.dict_items();
      const bool plain =
          std::all_of(items.begin(), items.end(),
                      [](const auto& kv) { return kv.first->is_string() && valid_utf8(kv.first->as_string()); }) &&
          !(items.size() == 1 && is_tag(items.front().first->as_string()));
      if (plain) {
        auto obj = nlohmann::json::object();
        for (const auto& [k, val] : items) obj[k->as_string()] = to_json_at(*val, depth + 1, budget);
        return obj;
      }
      auto pairs = nlohmann::json::array();
      for (const auto& [k, val] : items)
        pairs.push_back(
            nlohmann::json::array({to_json_at(*k, depth + 1, budget), to_json_at(*val, depth + 1, budget)}));
      return nlohmann::json{{kTagDict, std::move(pairs)}};
    }
  }
  return nullptr;
}

// The value a one-member tagged object stands for; nullptr when it is not one (an ordinary dict).
ValuePtr from_tag(const nlohmann::json& j, int depth) {
  if (j.size() != 1 || !is_tag(j.begin().key())) return nullptr;
  const std::string& tag = j.begin().key();
  const nlohmann::json& v = j.begin().value();
  if (tag == kTagTuple && v.is_array()) {
    std::vector<ValuePtr> items;
    for (const auto& e : v) items.push_back(from_json_at(e, depth + 1));
    return Value::tuple(std::move(items));
  }
  if (tag == kTagDict && v.is_array()) {
    pickle::DictItems items;
    for (const auto& kv : v) {
      if (!kv.is_array() || kv.size() != 2) return nullptr;
      items.emplace_back(from_json_at(kv[0], depth + 1), from_json_at(kv[1], depth + 1));
    }
    return Value::dict(std::move(items));
  }
  if (tag == kTagFloat && v.is_string()) {
    const std::string& f = v.get_ref<const std::string&>();
    if (f == "nan") return Value::floating(std::numeric_limits<double>::quiet_NaN());
    if (f == "inf") return Value::floating(std::numeric_limits<double>::infinity());
    if (f == "-inf") return Value::floating(-std::numeric_limits<double>::infinity());
    return nullptr;
  }
  if (!v.is_string()) return nullptr;
  const auto raw = unhex(v.get_ref<const std::string&>());
  if (!raw) return nullptr;
  if (tag == kTagBytes) return Value::bytes(*raw);
  if (tag == kTagStr) return Value::string(*raw);
  if (tag == kTagInt && !raw->empty()) return Value::integer_from_le_bytes(*raw);
  return nullptr;
}

ValuePtr from_json_at(const nlohmann::json& j, int depth) {
  if (depth > kMaxExtraDepth) return Value::string(kTooDeep);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::unsigned_integer(j.get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<ValuePtr> items;
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      if (ValuePtr tagged = from_tag(j, depth)) return tagged;
      pickle::DictItems items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(items));
    }
    default: return Value::none();
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

ImportResult import_snapshot_file(const std::string& path, const ImportOptions& opt) {
  auto root = pickle::read_file(path);
  auto result = import_snapshot_full(*root, opt);
  result.record.path = path;
  return result;
}

namespace {
// --- export: the extras' notes back into dicts ---------------------------------------------------

bool json_has_string(const nlohmann::json* list, std::string_view s) {
  if (!list || !list->is_array()) return false;
  return std::any_of(list->begin(), list->end(),
                     [&](const nlohmann::json& k) { return k.is_string() && k.get_ref<const std::string&>() == s; });
}

// Drops the keys x["absent"] (or `absent`) names from items and appends x["other"]'s.
void apply_notes(pickle::DictItems& items, const nlohmann::json* x, const nlohmann::json* absent = nullptr) {
  const nlohmann::json* own = x ? json_find(*x, "absent") : nullptr;
  if (own || absent)
    std::erase_if(items, [&](const auto& kv) {
      const std::string& key = kv.first->as_string();
      return json_has_string(own, key) || json_has_string(absent, key);
    });
  if (const nlohmann::json* other = x ? json_find(*x, "other") : nullptr) {
    ValuePtr v = from_json(*other);
    if (v->is_dict())
      for (const auto& kv : v->dict_items()) items.push_back(kv);
  }
}

// A str kept as to_json writes it (text, or hex for bytes that are not UTF-8); nullptr otherwise.
ValuePtr text_value(const nlohmann::json* v) {
  if (!v || !(v->is_string() || v->is_object())) return nullptr;
  ValuePtr t = from_json(*v);
  return t->is_string() ? t : nullptr;
}
}  // namespace

ValuePtr snapshot_value(const RankRecord& rec, std::size_t window_index, const nlohmann::json& extras) {
  if (window_index >= rec.windows.size())
    throw SnapshotError("torch snapshot export: window " + std::to_string(window_index) + " does not exist (" +
                        std::to_string(rec.windows.size()) + " windows)");
  const WindowRecord& w = rec.windows[window_index];
  StringPool str;

  // One frame dict per frame id and one list per stack id, shared by every reference.
  std::vector<ValuePtr> frame_values(rec.frames.size());
  std::unordered_map<std::uint32_t, ValuePtr> stack_values;
  auto frames_of = [&](std::uint32_t stack_id) -> ValuePtr {
    if (stack_id >= rec.stacks.size()) return Value::list({});
    auto it = stack_values.find(stack_id);
    if (it != stack_values.end()) return it->second;
    std::vector<ValuePtr> items;
    for (std::uint32_t fid : rec.stacks[stack_id]) {
      if (fid >= rec.frames.size()) continue;
      if (!frame_values[fid]) {
        const Frame& f = rec.frames[fid];
        frame_values[fid] = Value::dict({{str("name"), str(f.name)},
                                         {str("filename"), str(f.file)},
                                         {str("line"), Value::integer(f.line)}});
      }
      items.push_back(frame_values[fid]);
    }
    auto list = Value::list(std::move(items));
    stack_values.emplace(stack_id, list);
    return list;
  };
  auto u64 = [](std::uint64_t v) { return Value::unsigned_integer(v); };

  const nlohmann::json* seg_x = json_find(extras, "segments");
  std::vector<ValuePtr> segments;
  for (std::size_t i = 0; i < w.segments.size(); ++i) {
    const Segment& s = w.segments[i];
    const nlohmann::json* sx = seg_x && seg_x->is_array() && i < seg_x->size() ? &(*seg_x)[i] : nullptr;
    std::map<std::int64_t, const nlohmann::json*> block_x;
    if (const nlohmann::json* bx = sx ? json_find(*sx, "blocks_x") : nullptr; bx && bx->is_array())
      for (const auto& x : *bx)
        if (const nlohmann::json* j = json_find(x, "index"); j && j->is_number_integer())
          block_x[j->get<std::int64_t>()] = &x;
    std::uint64_t allocated = 0, active = 0, requested = 0;
    std::vector<ValuePtr> blocks;
    for (std::size_t j = 0; j < s.blocks.size(); ++j) {
      const Block& b = s.blocks[j];
      if (b.state == 1) allocated += b.size;
      if (b.state != 0) {
        active += b.size;
        requested += b.requested_size;
      }
      pickle::DictItems bd{{str("address"), u64(b.addr)},
                           {str("size"), u64(b.size)},
                           {str("requested_size"), u64(b.requested_size)},
                           {str("state"), str(block_state_name(b.state))}};
      if (b.stack_id != kNoStack) bd.emplace_back(str("frames"), frames_of(b.stack_id));
      auto it = block_x.find(static_cast<std::int64_t>(j));
      apply_notes(bd, it == block_x.end() ? nullptr : it->second);
      blocks.push_back(Value::dict(std::move(bd)));
    }
    auto size_field = [&](const char* key, std::uint64_t derived) {
      const nlohmann::json* v = sx ? json_find(*sx, key) : nullptr;
      return v && v->is_number_integer() ? u64(v->get<std::uint64_t>()) : u64(derived);
    };
    ValuePtr pool_id = Value::tuple({Value::integer(0), Value::integer(0)});
    if (const nlohmann::json* p = sx ? json_find(*sx, "segment_pool_id") : nullptr) {
      if (p->is_array()) {  // a plain pair (as a person writes it): torch's tuple
        std::vector<ValuePtr> parts;
        for (const auto& e : *p) parts.push_back(from_json(e));
        pool_id = Value::tuple(std::move(parts));
      } else {
        pool_id = from_json(*p);
      }
    }
    bool expandable = false;
    if (const nlohmann::json* e = sx ? json_find(*sx, "is_expandable") : nullptr; e && e->is_boolean()) {
      expandable = e->get<bool>();
    } else {
      for (const Event& ev : w.events)
        if ((ev.action == Action::segment_map || ev.action == Action::segment_unmap) && ev.device == s.device &&
            ev.addr >= s.addr && ev.addr < s.addr + s.size)
          expandable = true;
    }
    pickle::DictItems sd{{str("device"), Value::integer(s.device)},
                         {str("address"), u64(s.addr)},
                         {str("total_size"), u64(s.size)},
                         {str("allocated_size"), size_field("allocated_size", allocated)},
                         {str("active_size"), size_field("active_size", active)},
                         {str("requested_size"), size_field("requested_size", requested)},
                         {str("stream"), u64(s.stream)},
                         {str("segment_type"), str(s.pool)},
                         {str("segment_pool_id"), pool_id},
                         {str("is_expandable"), Value::boolean(expandable)}};
    std::int64_t seg_stack = -2;  // -2: no extras, -1: no frames key, else a stack id
    if (const nlohmann::json* st = sx ? json_find(*sx, "stack") : nullptr; st && st->is_number_integer())
      seg_stack = st->get<std::int64_t>();
    if (seg_stack >= 0)
      sd.emplace_back(str("frames"), frames_of(static_cast<std::uint32_t>(seg_stack)));
    else if (seg_stack == -2)
      sd.emplace_back(str("frames"), Value::list({}));
    sd.emplace_back(str("blocks"), Value::list(std::move(blocks)));
    apply_notes(sd, sx);
    segments.push_back(Value::dict(std::move(sd)));
  }

  // Per-entry extras by (device, index within the device's trace).
  std::map<std::pair<std::int64_t, std::int64_t>, const nlohmann::json*> entry_x;
  if (const nlohmann::json* tx = json_find(extras, "trace_extras"); tx && tx->is_array())
    for (const auto& x : *tx)
      if (x.contains("device") && x.contains("index") && x["device"].is_number_integer() && x["index"].is_number_integer())
        entry_x[{x["device"].get<std::int64_t>(), x["index"].get<std::int64_t>()}] = &x;
  const nlohmann::json* trace_absent = json_find(extras, "trace_absent");

  std::size_t device_count = 0;
  if (const nlohmann::json* dc = json_find(extras, "device_count"); dc && dc->is_number_integer())
    device_count = dc->get<std::size_t>();
  for (const Event& e : w.events)
    if (e.device >= 0) device_count = std::max(device_count, static_cast<std::size_t>(e.device) + 1);
  // Entries with actions memsnap does not know, by device, at their place in the original trace.
  std::map<std::size_t, std::vector<std::pair<std::size_t, ValuePtr>>> unknown;
  if (const nlohmann::json* ux = json_find(extras, "unknown_entries"); ux && ux->is_array()) {
    for (const auto& u : *ux) {
      const nlohmann::json* d = json_find(u, "device");
      const nlohmann::json* pos = json_find(u, "position");
      const nlohmann::json* entry = json_find(u, "entry");
      if (!d || !pos || !entry || !d->is_number_integer() || !pos->is_number_integer() || d->get<std::int64_t>() < 0 ||
          pos->get<std::int64_t>() < 0)
        continue;
      const auto device = d->get<std::size_t>();
      if (device >= static_cast<std::size_t>(std::numeric_limits<std::int16_t>::max())) continue;
      ValuePtr v = from_json(*entry);
      if (const nlohmann::json* st = json_find(u, "stack"); st && st->is_number_integer() && v->is_dict()) {
        pickle::DictItems items = v->dict_items();
        items.emplace_back(str("frames"), frames_of(static_cast<std::uint32_t>(st->get<std::int64_t>())));
        v = Value::dict(std::move(items));
      }
      unknown[device].emplace_back(pos->get<std::size_t>(), std::move(v));
      device_count = std::max(device_count, device + 1);
    }
  }
  std::vector<std::vector<ValuePtr>> traces(device_count);
  ValuePtr na = str("N/A"), empty = str("");
  for (const Event& e : w.events) {
    if (e.device < 0) continue;
    auto& trace = traces[static_cast<std::size_t>(e.device)];
    const nlohmann::json* x = nullptr;
    if (auto it = entry_x.find({e.device, static_cast<std::int64_t>(trace.size())}); it != entry_x.end()) x = it->second;
    // Floor division, so that negative times (never seen) still round-trip.
    std::int64_t time_us = e.time_ns / 1000 - ((e.time_ns % 1000 != 0 && e.time_ns < 0) ? 1 : 0);
    pickle::DictItems ed{{str("action"), str(std::string(action_name(e.action)))}};
    if (e.action == Action::oom)
      ed.emplace_back(str("device_free"), u64(e.addr));
    else
      ed.emplace_back(str("addr"), u64(e.addr));
    ed.emplace_back(str("size"), u64(e.size));
    ed.emplace_back(str("stream"), u64(e.stream));
    ed.emplace_back(str("time_us"), Value::integer(time_us));
    ValuePtr cc = text_value(x ? json_find(*x, "compile_context") : nullptr);
    ValuePtr um = text_value(x ? json_find(*x, "user_metadata") : nullptr);
    ed.emplace_back(str("compile_context"), cc ? cc : na);
    ed.emplace_back(str("user_metadata"), um ? um : empty);
    if (e.stack_id != kNoStack) ed.emplace_back(str("frames"), frames_of(e.stack_id));
    apply_notes(ed, x, trace_absent);
    trace.push_back(Value::dict(std::move(ed)));
  }
  for (auto& [device, entries] : unknown) {
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<ValuePtr> known = std::move(traces[device]), merged;
    merged.reserve(known.size() + entries.size());
    std::size_t k = 0;
    for (auto& [pos, v] : entries) {
      while (merged.size() < pos && k < known.size()) merged.push_back(known[k++]);
      merged.push_back(std::move(v));
    }
    while (k < known.size()) merged.push_back(known[k++]);
    traces[device] = std::move(merged);
  }
  const nlohmann::json* none_traces = json_find(extras, "none_traces");
  std::vector<ValuePtr> trace_values;
  for (std::size_t d = 0; d < traces.size(); ++d) {
    const bool none = traces[d].empty() && none_traces && none_traces->is_array() &&
                      std::any_of(none_traces->begin(), none_traces->end(), [&](const nlohmann::json& n) {
                        return n.is_number_integer() && n.get<std::int64_t>() == static_cast<std::int64_t>(d);
                      });
    trace_values.push_back(none ? Value::none() : Value::list(std::move(traces[d])));
  }

  pickle::DictItems root{{str("segments"), Value::list(std::move(segments))},
                         {str("device_traces"), Value::list(std::move(trace_values))}};
  const nlohmann::json* settings = json_find(extras, "allocator_settings");
  root.emplace_back(str("allocator_settings"), settings ? from_json(*settings) : Value::dict({}));
  if (const nlohmann::json* ann = json_find(extras, "external_annotations"))
    root.emplace_back(str("external_annotations"), from_json(*ann));
  // Top-level keys memsnap does not interpret, as one dict (to_json's form).
  nlohmann::json notes = nlohmann::json::object();
  if (const nlohmann::json* a = json_find(extras, "absent")) notes["absent"] = *a;
  if (const nlohmann::json* other = json_find(extras, "other_keys")) notes["other"] = *other;
  apply_notes(root, &notes);
  return Value::dict(std::move(root));
}

std::string export_snapshot(const RankRecord& rec, std::size_t window_index, const nlohmann::json& extras) {
  return pickle::write(snapshot_value(rec, window_index, extras));
}

void shift_extras_stacks(nlohmann::json& extras, std::uint32_t stack_base) {
  auto shift = [&](nlohmann::json& holder) {
    if (!holder.is_object()) return;
    auto it = holder.find("stack");
    if (it == holder.end() || !it->is_number_integer() || it->get<std::int64_t>() < 0) return;
    *it = it->get<std::int64_t>() + static_cast<std::int64_t>(stack_base);
  };
  for (const char* list : {"segments", "unknown_entries"}) {
    auto it = extras.is_object() ? extras.find(list) : extras.end();
    if (it == extras.end() || !it->is_array()) continue;
    for (auto& x : *it) shift(x);
  }
}

std::string export_snapshot(const RankRecord& rec, std::size_t window_index) {
  return export_snapshot(rec, window_index, nlohmann::json());
}

}  // namespace memsnap::torch
