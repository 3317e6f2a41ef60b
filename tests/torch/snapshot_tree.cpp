// The snapshot of a window as one pickle value tree: the reference that the streamed export
// (aggregator/torch/snapshot_export.cpp) is tested against, byte for byte. It was the export
// until the export streamed; it lives with the tests, built the plain way (the whole tree in
// memory), so that the two writers share no more than the snapshot's parts (snapshot_parts.hpp).
#include "snapshot_tree.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

#include "torch/snapshot_parts.hpp"

namespace memsnap::torch {

using namespace detail;

namespace {

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
    ValuePtr pool_id = segment_pool_id(sx);
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

}  // namespace memsnap::torch
