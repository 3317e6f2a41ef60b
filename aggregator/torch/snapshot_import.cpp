// Import of PyTorch memory snapshots: trace entries to Events and segments and blocks to Segments
// (with frames and stacks interned, snapshot_stacks.hpp, and what export needs noted,
// snapshot_shape.hpp), then live_at_start and batches (snapshot_window.cpp). One importer
// (SnapshotImporter) serves both ways in: the walk of a whole tree (import_snapshot_full) and a
// file read as a stream (import_snapshot_file), where each trace entry is converted as the reader
// meets it and then freed (pickle::read_streaming).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <span>

#include "torch/snapshot_parts.hpp"
#include "torch/snapshot_shape.hpp"
#include "torch/snapshot_stacks.hpp"
#include "torch/snapshot_window.hpp"

namespace memsnap::torch {

using namespace detail;

namespace {

// One snapshot's import. The tree walk (import_snapshot_full) and the streaming read
// (import_snapshot_file) share it: segments first, then each trace entry in order (entry), then
// the rest of the root dict (finish).
class SnapshotImporter final : public pickle::TraceSink {
 public:
  // `pickle_bytes`: the size of the pickle, an upper bound on its trace entries (below).
  SnapshotImporter(const ImportOptions& opt, bool streaming, std::size_t pickle_bytes)
      : m_opt(opt), m_stacks(m_result.record, !streaming), m_entries_at_most(pickle_bytes / kLeastEntryBytes) {
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

  // An entry of the common shape, read without a tree: what read_entry makes of it, where it is
  // an entry of a known action whose keys are each known, there once, and of the type export
  // writes (compile_context and user_metadata may be missing). Anything else, read_entry.
  bool flat_entry(std::size_t d, std::size_t i, const pickle::FlatEntry& fe) override {
    using Is = pickle::FlatEntry::Is;
    if (m_error) return false;
    const pickle::FlatEntry::Item* at[kEntryKeyCount] = {};
    for (std::size_t j = 0; j < fe.count; ++j) {
      const auto& item = fe.items[j];
      const auto k = item.key ? static_cast<EntryKey>(by_node(m_key_of, *item.key, [](const Value& key) { return entry_key(key); }))
                              : entry_key_of(item.key_text);
      if (k == kOtherKey || at[k]) return false;
      at[k] = &item;
    }
    // Strs: from a node or inline; false for anything else.
    auto str = [](const pickle::FlatEntry::Item* item, std::string_view& out) {
      if (item->is == Is::text) {
        out = item->text;
        return true;
      }
      if (item->is == Is::node && (*item->node)->is_string()) {
        out = (*item->node)->as_string();
        return true;
      }
      return false;
    };
    // Ints that fit an int64 (and are not negative, for `unsigned_only`).
    auto integer = [](const pickle::FlatEntry::Item* item, bool unsigned_only, std::int64_t& out) {
      if (!item) return false;
      if (item->is == Is::integer) out = item->integer;
      else if (item->is == Is::node && (*item->node)->kind() == Kind::integer) out = (*item->node)->as_int64();
      else return false;
      return !unsigned_only || out >= 0;
    };
    std::string_view text;
    if (!at[kAction] || !str(at[kAction], text)) return false;
    const std::uint32_t code = at[kAction]->is == Is::node
                                   ? by_node(m_action_of, *at[kAction]->node, [](const Value& v) { return action_code(v.as_string()); })
                                   : action_code(text);
    if (code == kUnknownAction) return false;
    Event e;
    e.action = static_cast<Action>(code);
    const bool oom = e.action == Action::oom;
    if (at[oom ? kAddr : kDeviceFree]) return false;  // a key export would not write back
    std::int64_t time_us, size, stream, addr;
    if (!integer(at[kTimeUs], false, time_us) || !integer(at[kSize], true, size) ||
        !integer(at[kStream], true, stream) || !integer(at[oom ? kDeviceFree : kAddr], true, addr))
      return false;
    if (!time_us_fits(time_us)) return false;
    const auto* frames = at[kFrames];
    if (!frames || !(frames->is == Is::frames || (frames->is == Is::node && (*frames->node)->is_list()))) return false;
    // compile_context and user_metadata: strs where they are there.
    EntryText cc, um;
    for (auto [k, t] : {std::pair{kCompileContext, &cc}, std::pair{kUserMetadata, &um}}) {
      if (!at[k]) continue;
      std::string_view v;
      if (!str(at[k], v)) return false;
      *t = EntryText{true, v};
    }

    // Taken: as read_entry.
    e.device = static_cast<std::int16_t>(d);
    e.time_ns = time_us * 1000;
    e.size = static_cast<std::uint64_t>(size);
    e.stream = static_cast<std::uint64_t>(stream);
    e.addr = static_cast<std::uint64_t>(addr);
    guarded(d, [&] {
      auto where = [&] { return "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "].frames"; };
      e.stack_id = frames->is == Is::frames
                       ? m_stacks.intern_items(std::span<const pickle::FlatEntry::NodeRef>(fe.frames), fe.frames_node, where)
                       : m_stacks.intern(*frames->node, where);
    });
    if (m_error) return true;  // as read_entry: the error is kept, the entry is not
    if (oom) m_w.oom = true;
    keep_entry(d, e, cc, um, {});
    ++m_result.flat_entries;
    return true;
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
  // The fewest bytes a trace entry takes in a pickle: a dict of six keys, each key and value a
  // memo reference or a short int, is about 45.
  static constexpr std::size_t kLeastEntryBytes = 40;

  const ImportOptions& m_opt;
  ImportResult m_result;
  StackInterner m_stacks;
  WindowRecord m_w;
  JsonBudget m_budget;  // for all values copied into the extras
  std::vector<std::uint32_t> m_segment_stacks;
  nlohmann::json m_seg_extras = nlohmann::json::array();
  // Device traces, merged by time at the end with each device's own order kept.
  // The first device with entries has its events reserved for as many entries as the pickle
  // can hold: address space only (pages are touched as events come), and no copy or fresh pages
  // each time the vector would have doubled.
  std::vector<std::vector<Event>> m_per_device;
  std::size_t m_entries_at_most;
  // What each key and action string of an entry means, by node (by_node), and the keys of the
  // entry being read.
  NodeIds m_key_of;
  NodeIds m_action_of;
  std::vector<EntryKey> m_keys;
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

  // What `compute` makes of a node, worked out once per memo-shared node: torch pickles each key
  // and action string once and names it by memo reference after, so one node stands for it in
  // every entry. `ids` keeps it by address, as the stack interner keeps frames.
  template <typename Ref, typename Compute>
  static std::uint32_t by_node(NodeIds& ids, const Ref& node, const Compute& compute) {
    if (!node->is_shared()) return compute(*node);
    if (const std::uint32_t id = ids.find(node.get()); id != NodeIds::kNone) return id;
    const std::uint32_t id = compute(*node);
    ids.insert(node, id);
    return id;
  }

  // An action's code, or kUnknownAction for a name memsnap does not know (a newer torch).
  static constexpr std::uint32_t kUnknownAction = 0xff;
  static std::uint32_t action_code(std::string_view name) {
    const auto a = action_from_name(name);
    return a ? static_cast<std::uint32_t>(*a) : kUnknownAction;
  }
  // Whether time_us, in nanoseconds, fits an Event's time.
  static bool time_us_fits(std::int64_t time_us) {
    return time_us <= std::numeric_limits<std::int64_t>::max() / 1000 && time_us >= std::numeric_limits<std::int64_t>::min() / 1000;
  }
  // Device d's events: the first device to have entries gets them reserved for as many as the
  // pickle can hold (m_per_device).
  std::vector<Event>& events_of(std::size_t d) {
    if (m_per_device.size() <= d) m_per_device.resize(d + 1);
    if (m_entries_at_most != 0 && m_per_device[d].capacity() == 0) {
      m_per_device[d].reserve(m_entries_at_most);
      m_entries_at_most = 0;
    }
    return m_per_device[d];
  }

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
    const ValuePtr* at[kEntryKeyCount] = {};
    const auto& items = entry.dict_items();
    m_keys.resize(items.size());
    for (std::size_t j = 0; j < items.size(); ++j) {
      const auto k = static_cast<EntryKey>(by_node(m_key_of, items[j].first, [](const Value& key) { return entry_key(key); }));
      m_keys[j] = k;
      if (k != kOtherKey && !at[k]) at[k] = &items[j].second;
    }
    auto value = [&](EntryKey k) -> const Value* { return at[k] ? at[k]->get() : nullptr; };
    const Value* action_v = value(kAction);
    if (!action_v) bad(where(), "missing key 'action'");
    if (!action_v->is_string()) bad(where() + ".action", "not a str");
    const std::uint32_t code = by_node(m_action_of, *at[kAction], [](const Value& name) { return action_code(name.as_string()); });
    const auto action = code == kUnknownAction ? std::nullopt : std::optional<Action>(static_cast<Action>(code));
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
    if (!time_us_fits(time_us)) bad(where() + ".time_us", "out of range");
    e.time_ns = time_us * 1000;
    e.size = entry_u64(value(kSize), where, "size");
    e.stream = entry_u64(value(kStream), where, "stream");
    // For oom, Event::addr holds the device's free bytes (torch's device_free).
    e.addr = e.action == Action::oom ? entry_u64(value(kDeviceFree), where, "device_free")
                                     : entry_u64(value(kAddr), where, "addr");
    e.stack_id = m_stacks.intern(at[kFrames] ? *at[kFrames] : ValuePtr(), [&] { return where() + ".frames"; });
    if (e.action == Action::oom) m_w.oom = true;

    // The shape notes (note_shape of the keys export writes: those of an entry, with device_free
    // in place of addr for an oom), from the keys found above.
    const EntryKey swapped = e.action == Action::oom ? kAddr : kDeviceFree;  // not written
    const EntryKey spec[] = {kAction, e.action == Action::oom ? kDeviceFree : kAddr, kSize, kStream,
                             kTimeUs, kCompileContext, kUserMetadata, kFrames};
    ShapeNotes notes;
    for (EntryKey k : spec)
      if (const Value* v = value(k); !v || !fits(*v, entry_key_shape(k))) notes.absent.push_back(kEntryKeyNames[k]);
    for (std::size_t j = 0; j < items.size(); ++j) {
      const EntryKey k = m_keys[j];
      if (k == kOtherKey || k == swapped || !fits(*items[j].second, entry_key_shape(k))) notes.other.emplace_back(items[j].first, items[j].second);
    }
    // A missing compile_context or user_metadata is noted by keep_entry; one there of another
    // type is listed here with its value.
    auto text = [&](EntryKey k) {
      const Value* v = value(k);
      return EntryText{v != nullptr, v && v->is_string() ? std::optional<std::string_view>(v->as_string()) : std::nullopt};
    };
    const EntryText cc = text(kCompileContext), um = text(kUserMetadata);
    static constexpr std::string_view kText[] = {"compile_context", "user_metadata"};
    std::span<const std::string_view> skip;
    if (!cc.there && !um.there) skip = std::span<const std::string_view>(kText, 2);
    else if (!cc.there) skip = std::span<const std::string_view>(kText, 1);
    else if (!um.there) skip = std::span<const std::string_view>(kText + 1, 1);
    nlohmann::json x;  // null until something is noted
    if (!notes.absent.empty() || !notes.other.empty()) {
      x = nlohmann::json::object();
      put_notes(notes, x, m_budget, skip);
    }
    keep_entry(d, e, cc, um, std::move(x));
  }

  // An entry's compile_context or user_metadata: whether the key is there, and its text where it
  // is a str.
  struct EntryText {
    bool there = false;
    std::optional<std::string_view> str;
  };
  // An entry's event, taken by read_entry and flat_entry alike, and what is noted beside it: its
  // compile_context and user_metadata where they say something, which of the two it lacks, and
  // `x` (the notes of its shape, or null).
  void keep_entry(std::size_t d, const Event& e, const EntryText& cc, const EntryText& um, nlohmann::json x) {
    std::vector<Event>& events = events_of(d);
    if (cc.str && *cc.str != "N/A") x["compile_context"] = text_json(std::string(*cc.str));
    if (um.str && !um.str->empty()) x["user_metadata"] = text_json(std::string(*um.str));
    const std::uint8_t absent_text = (cc.there ? 0 : 1) | (um.there ? 0 : 2);
    m_absent_everywhere &= absent_text;
    if ((!x.is_null() && !x.empty()) || absent_text != 0)
      m_entry_notes.push_back(EntryNotes{d, events.size(), std::move(x), absent_text});
    events.push_back(e);
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
  SnapshotImporter importer(opt, false, 0);  // a tree: no size to reserve by
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
  auto importer = std::make_unique<SnapshotImporter>(opt, true, data.size());
  pickle::ReadOptions read_options;
  read_options.progress = opt.progress;
  read_options.flat_entries = opt.flat_entries;
  pickle::StreamedRead read = pickle::read_streaming(data, *importer, read_options, file);
  if (read.streamed) return importer->import_streamed(*read.root);
  return SnapshotImporter(opt, false, data.size()).import_tree(*read.root);
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
