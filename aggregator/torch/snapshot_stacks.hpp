// Frames and stacks of an import interned into the record (snapshot_import.cpp): each distinct
// frame (name, filename, line) and frame list once, found by the pickle's shared nodes first and
// by content after.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memsnap/record.hpp"
#include "torch/snapshot_parts.hpp"

namespace memsnap::torch::detail {

// Pointers are keys, so each table holds a weak reference to its key nodes: that keeps the
// node's memory from being reused for another node (make_shared allocates node and count
// together) without keeping the node, and what it holds, alive. A streamed import frees most
// nodes soon after they are met, so before a table grows it drops the entries whose nodes are
// gone: the memory they pin stays bounded by the nodes still alive, not by every node ever met.
inline bool alive(const Value* node, const WeakValuePtr& pin) { return !node || !pin.expired(); }
// Slots for `live` entries, at most a quarter full: the next sweep is that many inserts away.
inline std::size_t table_size(std::size_t live) {
  std::size_t n = 1024;
  while (n < live * 4) n *= 2;
  return n;
}

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
  void insert(const ValuePtr& v, std::uint32_t id) {
    if ((m_used + 1) * 2 > m_slots.size()) sweep();
    place(Slot{v.get(), id, v});
  }

 private:
  struct Slot {
    const Value* node = nullptr;
    std::uint32_t id = 0;
    WeakValuePtr pin;
  };
  std::vector<Slot> m_slots;
  std::size_t m_used = 0;
  std::size_t slot_of(const Value* v) const {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(v) >> 4) * 0x9e3779b97f4a7c15ull >> 20) &
           (m_slots.size() - 1);
  }
  void place(Slot s) {
    std::size_t i = slot_of(s.node);
    while (m_slots[i].node && m_slots[i].node != s.node) i = (i + 1) & (m_slots.size() - 1);
    if (!m_slots[i].node) ++m_used;
    m_slots[i] = std::move(s);
  }
  // Rebuilds the table with the entries whose nodes are alive.
  void sweep() {
    std::vector<Slot> old = std::move(m_slots);
    std::size_t live = 0;
    for (const Slot& s : old) live += s.node && alive(s.node, s.pin);
    m_slots.assign(table_size(live), Slot{});
    m_used = 0;
    for (Slot& s : old)
      if (s.node && alive(s.node, s.pin)) place(std::move(s));
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
  // `name` and `file` are nullptr for a frame without that key.
  void insert(const ValuePtr* name, const ValuePtr* file, std::uint32_t line, std::uint32_t id) {
    if ((m_used + 1) * 2 > m_slots.size()) sweep();
    Slot s{name ? name->get() : nullptr, file ? file->get() : nullptr, line, id, {}, {}};
    if (name) s.name_pin = *name;
    if (file) s.file_pin = *file;
    place(std::move(s));
  }

 private:
  struct Slot {
    const Value* name = nullptr;
    const Value* file = nullptr;
    std::uint32_t line = 0;
    std::uint32_t id = kNone;
    WeakValuePtr name_pin, file_pin;
  };
  std::vector<Slot> m_slots;
  std::size_t m_used = 0;
  std::size_t slot_of(const Value* name, const Value* file, std::uint32_t line) const {
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(name) * 0x9e3779b97f4a7c15ull;
    h ^= (reinterpret_cast<std::uintptr_t>(file) + (h << 6) + (h >> 2)) * 0xc2b2ae3d27d4eb4full;
    h ^= (line + (h << 6) + (h >> 2)) * 0x165667b19e3779f9ull;
    return static_cast<std::size_t>(h ^ (h >> 29)) & (m_slots.size() - 1);
  }
  void place(Slot s) {
    std::size_t i = slot_of(s.name, s.file, s.line);
    while (m_slots[i].id != kNone) i = (i + 1) & (m_slots.size() - 1);
    m_slots[i] = std::move(s);
    ++m_used;
  }
  static bool live(const Slot& s) { return s.id != kNone && alive(s.name, s.name_pin) && alive(s.file, s.file_pin); }
  void sweep() {
    std::vector<Slot> old = std::move(m_slots);
    std::size_t n = 0;
    for (const Slot& s : old) n += live(s);
    m_slots.assign(table_size(n), Slot{});
    m_used = 0;
    for (Slot& s : old)
      if (live(s)) place(std::move(s));
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
  // `frames` is a ValuePtr or the reader's own node pointer (pickle::FlatEntry::NodeRef's target).
  template <typename Ref, typename Where>
  std::uint32_t intern(const Ref& frames, const Where& where) {
    if (!frames || frames->is_none()) return kNoStack;
    // Fast path: a frames list met before (torch's pickles may reference one from many entries).
    const bool by_node = m_by_any_node || frames->is_shared();
    if (by_node)
      if (std::uint32_t id = m_by_node.find(frames.get()); id != NodeIds::kNone) return id;
    if (!frames->is_list() && !frames->is_tuple()) bad(where(), "frames is not a list");
    m_stack.clear();
    for (const auto& f : frames->items()) m_stack.push_back(frame(f, where));
    const std::uint32_t id = stack_id();
    if (by_node) m_by_node.insert(frames, id);
    return id;
  }
  // The stack id of a frames list the reader did not build (pickle::FlatEntry::frames): its
  // frames, and the node made for it when the pickle names it again (else nullptr). The same id
  // as intern() of that list gives.
  template <typename Ref, typename Where>
  std::uint32_t intern_items(std::span<const Ref* const> frames, const Ref* node, const Where& where) {
    m_stack.clear();
    for (const Ref* f : frames) m_stack.push_back(frame(*f, where));
    const std::uint32_t id = stack_id();
    if (node && (m_by_any_node || (*node)->is_shared())) m_by_node.insert(*node, id);
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
  Stack m_stack;                 // scratch
  std::string m_key;             // scratch

  // The id of m_stack's frames.
  std::uint32_t stack_id() {
    const std::string_view key(reinterpret_cast<const char*>(m_stack.data()), m_stack.size() * sizeof(std::uint32_t));
    if (auto it = m_by_content.find(key); it != m_by_content.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(m_rec.stacks.size());
    m_by_content.emplace(std::string(key), id);
    m_rec.stacks.push_back(m_stack);
    return id;
  }

  template <typename Ref, typename Where>
  std::uint32_t frame(const Ref& f, const Where& where) {
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
        if (by_node) m_frame_by_node.insert(f, id);
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
    if (by_node) m_frame_by_node.insert(f, id);
    if (by_text_nodes) m_frame_by_text_nodes.insert(name, file, line_no, id);
    return id;
  }
};

}  // namespace memsnap::torch::detail
