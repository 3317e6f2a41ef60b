// Export of a RankRecord's window as a PyTorch memory snapshot that torch's own tools read, with
// every value import could not interpret given back from the extras, written as it is made.
#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "torch/snapshot_parts.hpp"
#include "torch/snapshot_export.hpp"

namespace memsnap::torch {

using namespace detail;

// --- export, streamed ------------------------------------------------------------------------------
//
// write_snapshot writes what pickle::write(snapshot_value(...)) writes (the tests' reference
// writer, tests/torch/snapshot_tree.cpp), without the tree. That writer memoises a node when it
// is reached more than once: here those nodes are the pooled
// strings (one node per distinct text, as StringPool gives), the frame dicts (one per frame) and
// the frame lists (one per stack); everything else (entries, blocks, segments, values from the
// extras) is reached once. So a first pass counts, for every pooled string, frame and stack, the
// places the tree would reach it from (dict items that apply_notes keeps; a frame dict from each
// stack list reached, a string of a frame dict once per frame dict reached), and the second
// writes the tree's opcodes in its order, memoising what was counted twice.

namespace {

// The keys and fixed strings, interned first (ids 0..kFixedCount-1).
// clang-format off
enum Fixed : std::uint32_t {
  k_segments, k_device_traces, k_allocator_settings, k_external_annotations, k_device, k_address,
  k_total_size, k_allocated_size, k_active_size, k_requested_size, k_stream, k_segment_type,
  k_segment_pool_id, k_is_expandable, k_frames, k_blocks, k_size, k_state, k_action, k_addr,
  k_device_free, k_time_us, k_compile_context, k_user_metadata, k_name, k_filename, k_line, k_na,
  k_empty, kFixedCount
};
constexpr const char* kFixedText[kFixedCount] = {
    "segments", "device_traces", "allocator_settings", "external_annotations", "device", "address",
    "total_size", "allocated_size", "active_size", "requested_size", "stream", "segment_type",
    "segment_pool_id", "is_expandable", "frames", "blocks", "size", "state", "action", "addr",
    "device_free", "time_us", "compile_context", "user_metadata", "name", "filename", "line", "N/A",
    ""};
// clang-format on

// One item of a dict the tree would hold, with its value as the tree would build it.
struct Item {
  enum Kind : std::uint8_t {
    u64,       // n
    i64,       // n, as a signed value
    boolean,   // n != 0
    pooled,    // the pooled string n
    stack,     // the frame list of stack n (a new empty list when n is no stack)
    value,     // v, reached from here only
    json,      // from_json(*j), reached from here only
    segments,  // the root's segment list
    traces,    // the root's device_traces list
    blocks,    // the block list of segment n
  };
  std::uint32_t key = 0;  // a pooled string, unless fresh_key is set (a key from the extras)
  Kind kind = u64;
  std::uint64_t n = 0;
  ValuePtr fresh_key;
  ValuePtr v;
  const nlohmann::json* j = nullptr;
};
using Items = std::vector<Item>;

Item item(std::uint32_t key, Item::Kind kind, std::uint64_t n) {
  return Item{key, kind, n, nullptr, nullptr, nullptr};
}
Item value_item(std::uint32_t key, ValuePtr v) {
  return Item{key, Item::value, 0, nullptr, std::move(v), nullptr};
}
Item json_item(std::uint32_t key, const nlohmann::json& j) {
  return Item{key, Item::json, 0, nullptr, nullptr, &j};
}

// An entry whose action memsnap does not know, at its place in its device's trace.
struct UnknownEntry {
  std::size_t position = 0;
  const nlohmann::json* entry = nullptr;  // as from_json builds it
  bool has_stack = false;                 // a dict given "frames": the frame list of `stack`
  std::uint32_t stack = 0;
};

class SnapshotStream {
 public:
  SnapshotStream(const RankRecord& rec, const WindowRecord& w, const EventPieces& events, const nlohmann::json& extras)
      : m_rec(rec), m_w(w), m_events(events), m_extras(extras) {
    for (const char* text : kFixedText) intern(text);
    m_action.fill(kNone);
    m_stack_refs.assign(rec.stacks.size(), 0);
    m_stack_memo.assign(rec.stacks.size(), kNone);
    m_frame_refs.assign(rec.frames.size(), 0);
    m_frame_memo.assign(rec.frames.size(), kNone);
    m_frame_text.assign(rec.frames.size(), {0, 0});
    read_extras();
    count();
  }

  void write(const pickle::ByteSink& sink) {
    pickle::Writer out(sink);
    m_out = &out;
    write_dict(m_root);
    out.finish();
    m_out = nullptr;
  }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;

  // --- pooled strings, stacks and frames ---
  std::uint32_t intern(std::string_view s) {
    auto [it, inserted] = m_ids.try_emplace(std::string(s), static_cast<std::uint32_t>(m_text.size()));
    if (inserted) {
      m_text.emplace_back(s);
      m_refs.push_back(0);
      m_memo.push_back(kNone);
    }
    return it->second;
  }
  std::uint32_t action_id(Action a) {
    std::uint32_t& id = m_action[static_cast<std::uint8_t>(a)];
    if (id == kNone) id = intern(action_name(a));
    return id;
  }
  static void reach(std::uint8_t& refs) { refs = static_cast<std::uint8_t>(std::min(refs + 1, 2)); }

  // --- the extras, as snapshot_value reads them ---
  void read_extras() {
    m_seg_x = json_find(m_extras, "segments");
    if (const nlohmann::json* tx = json_find(m_extras, "trace_extras"); tx && tx->is_array())
      for (const auto& x : *tx)
        if (x.contains("device") && x.contains("index") && x["device"].is_number_integer() &&
            x["index"].is_number_integer())
          m_entry_x[{x["device"].get<std::int64_t>(), x["index"].get<std::int64_t>()}] = &x;
    if (const nlohmann::json* absent = json_find(m_extras, "trace_absent"); absent && absent->is_array())
      for (const auto& k : *absent)
        if (k.is_string()) m_trace_absent.push_back(intern(k.get_ref<const std::string&>()));
    m_none_traces = json_find(m_extras, "none_traces");
    if (const nlohmann::json* dc = json_find(m_extras, "device_count"); dc && dc->is_number_integer())
      m_device_count = dc->get<std::size_t>();
    if (const nlohmann::json* ux = json_find(m_extras, "unknown_entries"); ux && ux->is_array()) {
      for (const auto& u : *ux) {
        const nlohmann::json* d = json_find(u, "device");
        const nlohmann::json* pos = json_find(u, "position");
        const nlohmann::json* entry = json_find(u, "entry");
        if (!d || !pos || !entry || !d->is_number_integer() || !pos->is_number_integer() ||
            d->get<std::int64_t>() < 0 || pos->get<std::int64_t>() < 0)
          continue;
        const auto device = d->get<std::size_t>();
        if (device >= static_cast<std::size_t>(std::numeric_limits<std::int16_t>::max())) continue;
        UnknownEntry e{pos->get<std::size_t>(), entry};
        if (const nlohmann::json* st = json_find(u, "stack");
            st && st->is_number_integer() && from_json(*entry)->is_dict()) {
          e.has_stack = true;
          e.stack = static_cast<std::uint32_t>(st->get<std::int64_t>());
        }
        m_unknown[device].push_back(std::move(e));
        m_device_count = std::max(m_device_count, device + 1);
      }
    }
    for (auto& [device, entries] : m_unknown)
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.position < b.position; });

    m_root = {item(k_segments, Item::segments, 0), item(k_device_traces, Item::traces, 0)};
    const nlohmann::json* settings = json_find(m_extras, "allocator_settings");
    m_root.push_back(settings ? json_item(k_allocator_settings, *settings)
                              : value_item(k_allocator_settings, Value::dict({})));
    if (const nlohmann::json* ann = json_find(m_extras, "external_annotations"))
      m_root.push_back(json_item(k_external_annotations, *ann));
    nlohmann::json notes = nlohmann::json::object();
    if (const nlohmann::json* a = json_find(m_extras, "absent")) notes["absent"] = *a;
    if (const nlohmann::json* other = json_find(m_extras, "other_keys")) notes["other"] = *other;
    apply_notes(m_root, &notes);
  }

  // apply_notes on items: drops the keys x["absent"] (or `absent`) names, appends x["other"]'s.
  void apply_notes(Items& items, const nlohmann::json* x, const std::vector<std::uint32_t>* absent = nullptr) {
    const nlohmann::json* own = x ? json_find(*x, "absent") : nullptr;
    if (own || (absent && !absent->empty()))
      std::erase_if(items, [&](const Item& it) {
        return (absent && std::find(absent->begin(), absent->end(), it.key) != absent->end()) ||
               json_has_string(own, m_text[it.key]);
      });
    if (const nlohmann::json* other = x ? json_find(*x, "other") : nullptr) {
      ValuePtr v = from_json(*other);
      if (v->is_dict())
        for (const auto& [k, val] : v->dict_items()) items.push_back(Item{0, Item::value, 0, k, val, nullptr});
    }
  }

  const nlohmann::json* segment_x(std::size_t i) const {
    return m_seg_x && m_seg_x->is_array() && i < m_seg_x->size() ? &(*m_seg_x)[i] : nullptr;
  }
  const nlohmann::json* entry_x(std::int64_t device, std::size_t index) const {
    if (m_entry_x.empty()) return nullptr;
    auto it = m_entry_x.find({device, static_cast<std::int64_t>(index)});
    return it == m_entry_x.end() ? nullptr : it->second;
  }
  bool kept(Item::Kind k) const {
    return std::any_of(m_root.begin(), m_root.end(), [k](const Item& it) { return !it.fresh_key && it.kind == k; });
  }

  // --- the dicts' items, as snapshot_value builds them ---
  void entry_items(const Event& e, const nlohmann::json* x, Items& ed) {
    ed.clear();
    // Floor division, so that negative times (never seen) still round-trip.
    const std::int64_t time_us = e.time_ns / 1000 - ((e.time_ns % 1000 != 0 && e.time_ns < 0) ? 1 : 0);
    ed.push_back(item(k_action, Item::pooled, action_id(e.action)));
    ed.push_back(item(e.action == Action::oom ? k_device_free : k_addr, Item::u64, e.addr));
    ed.push_back(item(k_size, Item::u64, e.size));
    ed.push_back(item(k_stream, Item::u64, e.stream));
    ed.push_back(item(k_time_us, Item::i64, static_cast<std::uint64_t>(time_us)));
    ValuePtr cc = x ? text_value(json_find(*x, "compile_context")) : nullptr;
    ValuePtr um = x ? text_value(json_find(*x, "user_metadata")) : nullptr;
    ed.push_back(cc ? value_item(k_compile_context, std::move(cc)) : item(k_compile_context, Item::pooled, k_na));
    ed.push_back(um ? value_item(k_user_metadata, std::move(um)) : item(k_user_metadata, Item::pooled, k_empty));
    if (e.stack_id != kNoStack) ed.push_back(item(k_frames, Item::stack, e.stack_id));
    if (x || !m_trace_absent.empty()) apply_notes(ed, x, &m_trace_absent);
  }

  std::map<std::int64_t, const nlohmann::json*> blocks_x(const nlohmann::json* sx) const {
    std::map<std::int64_t, const nlohmann::json*> out;
    if (const nlohmann::json* bx = sx ? json_find(*sx, "blocks_x") : nullptr; bx && bx->is_array())
      for (const auto& x : *bx)
        if (const nlohmann::json* j = json_find(x, "index"); j && j->is_number_integer())
          out[j->get<std::int64_t>()] = &x;
    return out;
  }
  void block_items(const Block& b, const nlohmann::json* x, Items& bd) {
    bd = {item(k_address, Item::u64, b.addr), item(k_size, Item::u64, b.size),
          item(k_requested_size, Item::u64, b.requested_size),
          item(k_state, Item::pooled, intern(block_state_name(b.state)))};
    if (b.stack_id != kNoStack) bd.push_back(item(k_frames, Item::stack, b.stack_id));
    apply_notes(bd, x);
  }
  void segment_items(std::size_t i, Items& sd) {
    const Segment& s = m_w.segments[i];
    const nlohmann::json* sx = segment_x(i);
    std::uint64_t allocated = 0, active = 0, requested = 0;
    for (const Block& b : s.blocks) {
      if (b.state == 1) allocated += b.size;
      if (b.state != 0) {
        active += b.size;
        requested += b.requested_size;
      }
    }
    auto size_field = [&](std::uint32_t key, std::uint64_t derived) {
      const nlohmann::json* v = sx ? json_find(*sx, kFixedText[key]) : nullptr;
      return item(key, Item::u64, v && v->is_number_integer() ? v->get<std::uint64_t>() : derived);
    };
    ValuePtr pool_id = segment_pool_id(sx);
    bool expandable = false;
    if (const nlohmann::json* e = sx ? json_find(*sx, "is_expandable") : nullptr; e && e->is_boolean())
      expandable = e->get<bool>();
    else
      expandable = mapped_inside(s);
    sd = {item(k_device, Item::i64, static_cast<std::uint64_t>(static_cast<std::int64_t>(s.device))),
          item(k_address, Item::u64, s.addr),
          item(k_total_size, Item::u64, s.size),
          size_field(k_allocated_size, allocated),
          size_field(k_active_size, active),
          size_field(k_requested_size, requested),
          item(k_stream, Item::u64, s.stream),
          item(k_segment_type, Item::pooled, intern(s.pool)),
          value_item(k_segment_pool_id, std::move(pool_id)),
          item(k_is_expandable, Item::boolean, expandable ? 1 : 0)};
    std::int64_t seg_stack = -2;  // -2: no extras, -1: no frames key, else a stack id
    if (const nlohmann::json* st = sx ? json_find(*sx, "stack") : nullptr; st && st->is_number_integer())
      seg_stack = st->get<std::int64_t>();
    if (seg_stack >= 0)
      sd.push_back(item(k_frames, Item::stack, static_cast<std::uint32_t>(seg_stack)));
    else if (seg_stack == -2)
      sd.push_back(value_item(k_frames, Value::list({})));
    sd.push_back(item(k_blocks, Item::blocks, i));
    apply_notes(sd, sx);
  }
  // Whether a segment_map or segment_unmap event fell inside the segment (is_expandable without extras).
  bool mapped_inside(const Segment& s) const {
    auto it = m_mapped.find(s.device);
    if (it == m_mapped.end()) return false;
    auto a = std::lower_bound(it->second.begin(), it->second.end(), s.addr);
    return a != it->second.end() && *a < s.addr + s.size;
  }

  // --- the first pass: what the tree reaches, and from how many places ---
  void count_items(const Items& items) {
    for (const Item& it : items) {
      if (!it.fresh_key) reach(m_refs[it.key]);
      if (it.kind == Item::pooled) reach(m_refs[it.n]);
      if (it.kind == Item::stack && it.n < m_stack_refs.size()) reach(m_stack_refs[it.n]);
    }
  }
  void count() {
    const bool segments = kept(Item::segments), traces = kept(Item::traces);
    bool need_mapped = false;
    for (std::size_t i = 0; segments && i < m_w.segments.size(); ++i) {
      const nlohmann::json* e = segment_x(i) ? json_find(*segment_x(i), "is_expandable") : nullptr;
      need_mapped |= !(e && e->is_boolean());
    }
    // The events: each device's known entries, where its last one is, the mapped addresses.
    std::vector<std::unordered_set<std::uint64_t>> mapped;
    std::size_t index = 0;
    m_events([&](std::span<const Event> piece) {
      for (const Event& e : piece) {
        ++index;
        if (e.device < 0) continue;
        const auto d = static_cast<std::size_t>(e.device);
        if (d >= m_known.size()) {
          m_known.resize(d + 1, 0);
          m_end.resize(d + 1, 0);
        }
        if (traces) {
          entry_items(e, entry_x(e.device, m_known[d]), m_items);
          count_items(m_items);
        }
        ++m_known[d];
        m_end[d] = index;
        if (need_mapped && (e.action == Action::segment_map || e.action == Action::segment_unmap)) {
          if (d >= mapped.size()) mapped.resize(d + 1);
          mapped[d].insert(e.addr);
        }
      }
      return true;
    });
    for (std::size_t d = 0; d < mapped.size(); ++d) {
      if (mapped[d].empty()) continue;
      auto& sorted = m_mapped[static_cast<std::int64_t>(d)];
      sorted.assign(mapped[d].begin(), mapped[d].end());
      std::sort(sorted.begin(), sorted.end());
    }
    m_device_count = std::max(m_device_count, m_known.size());
    m_known.resize(m_device_count, 0);
    m_end.resize(m_device_count, 0);
    if (traces)
      for (const auto& [device, entries] : m_unknown)
        for (const UnknownEntry& u : entries)
          if (u.has_stack) count_items({item(k_frames, Item::stack, u.stack)});
    Items sd, bd;
    for (std::size_t i = 0; segments && i < m_w.segments.size(); ++i) {
      segment_items(i, sd);
      count_items(sd);
      const auto bx = blocks_x(segment_x(i));
      for (std::size_t j = 0; j < m_w.segments[i].blocks.size(); ++j) {
        auto it = bx.find(static_cast<std::int64_t>(j));
        block_items(m_w.segments[i].blocks[j], it == bx.end() ? nullptr : it->second, bd);
        count_items(bd);
      }
    }
    count_items(m_root);
    // Frame dicts from the stack lists reached, their strings from the frame dicts reached.
    for (std::size_t s = 0; s < m_stack_refs.size(); ++s)
      if (m_stack_refs[s] > 0)
        for (std::uint32_t fid : m_rec.stacks[s])
          if (fid < m_frame_refs.size()) reach(m_frame_refs[fid]);
    for (std::size_t f = 0; f < m_frame_refs.size(); ++f) {
      if (m_frame_refs[f] == 0) continue;
      m_frame_text[f] = {intern(m_rec.frames[f].name), intern(m_rec.frames[f].file)};
      for (std::uint32_t id : {std::uint32_t{k_name}, m_frame_text[f][0], std::uint32_t{k_filename}, m_frame_text[f][1],
                               std::uint32_t{k_line}})
        reach(m_refs[id]);
    }
  }

  // --- the second pass: the tree's opcodes ---
  void write_pooled(std::uint32_t id) {
    if (m_memo[id] != kNone) return m_out->get(m_memo[id]);
    m_out->string(m_text[id]);
    if (m_refs[id] > 1) m_memo[id] = m_out->memoize();
  }
  void write_frame(std::uint32_t fid) {
    if (m_frame_memo[fid] != kNone) return m_out->get(m_frame_memo[fid]);
    m_out->empty_dict();
    if (m_frame_refs[fid] > 1) m_frame_memo[fid] = m_out->memoize();
    pickle::Writer::Batches batches(*m_out, 3, true);
    const std::uint32_t keys[] = {k_name, k_filename};
    for (int i = 0; i < 2; ++i) {
      batches.begin_item();
      write_pooled(keys[i]);
      write_pooled(m_frame_text[fid][i]);
      batches.end_item();
    }
    batches.begin_item();
    write_pooled(k_line);
    m_out->integer(m_rec.frames[fid].line);
    batches.end_item();
  }
  void write_stack(std::uint64_t stack) {
    if (stack >= m_rec.stacks.size()) return m_out->empty_list();
    if (m_stack_memo[stack] != kNone) return m_out->get(m_stack_memo[stack]);
    m_out->empty_list();
    if (m_stack_refs[stack] > 1) m_stack_memo[stack] = m_out->memoize();
    const Stack& frames = m_rec.stacks[stack];
    const auto n = static_cast<std::size_t>(
        std::count_if(frames.begin(), frames.end(), [&](std::uint32_t f) { return f < m_rec.frames.size(); }));
    pickle::Writer::Batches batches(*m_out, n, false);
    for (std::uint32_t fid : frames) {
      if (fid >= m_rec.frames.size()) continue;
      batches.begin_item();
      write_frame(fid);
      batches.end_item();
    }
  }
  void write_dict(const Items& items) {
    m_out->empty_dict();
    pickle::Writer::Batches batches(*m_out, items.size(), true);
    for (const Item& it : items) {
      batches.begin_item();
      if (it.fresh_key)
        m_out->value(*it.fresh_key);
      else
        write_pooled(it.key);
      switch (it.kind) {
        case Item::u64:
          m_out->unsigned_integer(it.n);
          break;
        case Item::i64:
          m_out->integer(static_cast<std::int64_t>(it.n));
          break;
        case Item::boolean:
          m_out->boolean(it.n != 0);
          break;
        case Item::pooled:
          write_pooled(static_cast<std::uint32_t>(it.n));
          break;
        case Item::stack:
          write_stack(it.n);
          break;
        case Item::value:
          m_out->value(*it.v);
          break;
        case Item::json:
          write_json(*it.j);
          break;
        case Item::segments:
          write_segments();
          break;
        case Item::traces:
          write_traces();
          break;
        case Item::blocks:
          write_blocks(it.n);
          break;
      }
      batches.end_item();
    }
  }
  void write_segments() {
    m_out->empty_list();
    pickle::Writer::Batches batches(*m_out, m_w.segments.size(), false);
    Items sd;
    for (std::size_t i = 0; i < m_w.segments.size(); ++i) {
      batches.begin_item();
      segment_items(i, sd);
      write_dict(sd);
      batches.end_item();
    }
  }
  void write_blocks(std::size_t i) {
    const Segment& s = m_w.segments[i];
    const auto bx = blocks_x(segment_x(i));
    m_out->empty_list();
    pickle::Writer::Batches batches(*m_out, s.blocks.size(), false);
    Items bd;
    for (std::size_t j = 0; j < s.blocks.size(); ++j) {
      batches.begin_item();
      auto it = bx.find(static_cast<std::int64_t>(j));
      block_items(s.blocks[j], it == bx.end() ? nullptr : it->second, bd);
      write_dict(bd);
      batches.end_item();
    }
  }
  // m_out->value(*from_json(j)), a list an item at a time: the largest of the extras
  // (external_annotations, a few per step) are never values whole.
  void write_json(const nlohmann::json& j) {
    if (!j.is_array()) return m_out->value(*from_json(j));
    m_out->empty_list();
    pickle::Writer::Batches batches(*m_out, j.size(), false);
    for (const auto& e : j) {
      batches.begin_item();
      m_out->value(*from_json_at(e, 1));
      batches.end_item();
    }
  }
  void write_unknown(const UnknownEntry& u) {
    const ValuePtr entry = from_json(*u.entry);
    if (!u.has_stack) return m_out->value(*entry);
    const auto& items = entry->dict_items();
    m_out->empty_dict();
    pickle::Writer::Batches batches(*m_out, items.size() + 1, true);
    for (const auto& [k, v] : items) {
      batches.begin_item();
      m_out->value(*k);
      m_out->value(*v);
      batches.end_item();
    }
    batches.begin_item();
    write_pooled(k_frames);
    write_stack(u.stack);
    batches.end_item();
  }
  bool none_trace(std::size_t d) const {
    return m_none_traces && m_none_traces->is_array() &&
           std::any_of(m_none_traces->begin(), m_none_traces->end(), [&](const nlohmann::json& n) {
             return n.is_number_integer() && n.get<std::int64_t>() == static_cast<std::int64_t>(d);
           });
  }
  void write_traces() {
    m_out->empty_list();
    pickle::Writer::Batches devices(*m_out, m_device_count, false);
    static const std::vector<UnknownEntry> kNoUnknown;
    for (std::size_t d = 0; d < m_device_count; ++d) {
      devices.begin_item();
      auto u = m_unknown.find(d);
      const std::vector<UnknownEntry>& unknown = u == m_unknown.end() ? kNoUnknown : u->second;
      const std::size_t total = m_known[d] + unknown.size();
      if (total == 0 && none_trace(d)) {
        m_out->none();
        devices.end_item();
        continue;
      }
      m_out->empty_list();
      pickle::Writer::Batches entries(*m_out, total, false);
      std::size_t written = 0, next_unknown = 0;
      // The unknown entries go where snapshot_value merges them: each at its position, or after
      // the known entries when there are fewer.
      auto unknown_up_to = [&](std::size_t limit) {
        while (next_unknown < unknown.size() && unknown[next_unknown].position <= limit) {
          entries.begin_item();
          write_unknown(unknown[next_unknown++]);
          entries.end_item();
          ++written;
        }
      };
      if (m_known[d] > 0) {
        std::size_t index = 0, known = 0;
        m_events([&](std::span<const Event> piece) {
          for (const Event& e : piece) {
            if (index++ >= m_end[d]) return false;
            if (e.device != static_cast<std::int64_t>(d)) continue;
            unknown_up_to(written);
            entry_items(e, entry_x(e.device, known++), m_items);
            entries.begin_item();
            write_dict(m_items);
            entries.end_item();
            ++written;
          }
          return index < m_end[d];
        });
      }
      unknown_up_to(std::numeric_limits<std::size_t>::max());
      devices.end_item();
    }
  }

  const RankRecord& m_rec;
  const WindowRecord& m_w;
  const EventPieces& m_events;
  const nlohmann::json& m_extras;
  pickle::Writer* m_out = nullptr;

  std::unordered_map<std::string, std::uint32_t> m_ids;  // pooled strings
  std::vector<std::string> m_text;
  std::vector<std::uint8_t> m_refs;  // places the tree reaches each from: 0, 1, 2 (or more)
  std::vector<std::uint32_t> m_memo;
  std::array<std::uint32_t, 256> m_action{};
  std::vector<std::uint8_t> m_stack_refs, m_frame_refs;
  std::vector<std::uint32_t> m_stack_memo, m_frame_memo;
  std::vector<std::array<std::uint32_t, 2>> m_frame_text;  // a reached frame's name and file

  const nlohmann::json* m_seg_x = nullptr;
  std::map<std::pair<std::int64_t, std::int64_t>, const nlohmann::json*> m_entry_x;
  std::vector<std::uint32_t> m_trace_absent;
  const nlohmann::json* m_none_traces = nullptr;
  std::map<std::size_t, std::vector<UnknownEntry>> m_unknown;
  std::size_t m_device_count = 0;
  std::vector<std::size_t> m_known;                             // per device: its known entries (events)
  std::vector<std::size_t> m_end;                               // per device: 1 + the index of its last event
  std::map<std::int64_t, std::vector<std::uint64_t>> m_mapped;  // per device: segment_map/unmap addresses
  Items m_root;
  Items m_items;  // the entry being counted or written
};

}  // namespace

void write_snapshot(const RankRecord& record, const WindowRecord& window, const EventPieces& events,
                    const nlohmann::json& extras, const pickle::ByteSink& sink) {
  SnapshotStream(record, window, events, extras).write(sink);
}

std::string export_snapshot(const RankRecord& rec, std::size_t window_index, const nlohmann::json& extras) {
  if (window_index >= rec.windows.size())
    throw SnapshotError("torch snapshot export: window " + std::to_string(window_index) + " does not exist (" +
                        std::to_string(rec.windows.size()) + " windows)");
  const WindowRecord& w = rec.windows[window_index];
  std::string out;
  write_snapshot(
      rec, w, [&w](const auto& piece) { piece(std::span<const Event>(w.events)); }, extras,
      [&out](std::string_view bytes) { out += bytes; });
  return out;
}

std::string export_snapshot(const RankRecord& rec, std::size_t window_index) {
  return export_snapshot(rec, window_index, nlohmann::json());
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

}  // namespace memsnap::torch
