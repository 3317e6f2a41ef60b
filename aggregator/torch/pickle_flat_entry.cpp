// Trace entries read without a tree: the common shape of a torch snapshot's entries decoded
// straight from the bytes into a FlatEntry for TraceSink::flat_entry. It is what the reader spends
// most of a snapshot on, so it builds no node for the entry, its keys, ints and strs, or the list of
// its frames (unless a later GET names that list).
//
// The shape (what torch 2.11's pickler writes, protocols 2 to 5):
//   entry  := EMPTY_DICT put? MARK (key value put?)+ SETITEMS
//   key    := GET (of a str) | str put?
//   value  := GET | BININT1 | BININT2 | BININT | LONG1 (8 bytes at most) | NONE | str | frames
//   frames := EMPTY_LIST put? (MARK GET+ APPENDS | GET APPEND)*    (one per entry; each GET a dict)
//   put    := MEMOIZE, or BINPUT / LONG_BINPUT of the next index; no GET may name it, but for the
//             frames list's
// Anything else, or an entry the sink does not take, leaves everything as it was and the entry is
// read by the stack machine (pickle_reader.cpp). Nothing is changed until the sink has taken the
// entry: then the memo is brought to where the stack machine would have left it.
#include <algorithm>

#include "torch/pickle_builder.hpp"

namespace memsnap::pickle {

using namespace opcodes;

bool Builder::flat_ready() const {
  if (m_marks.empty() || !m_dict_index.empty() || !m_memo_length.dense_only()) return false;
  const std::size_t base = m_marks.back();
  if (base == 0 || !m_stack[base - 1]) return false;
  const Value& list = *m_stack[base - 1];
  if (!list.m_streamed || list.m_nested) return false;
  // Every item above the MARK went to the sink already (placeholders), or there is none.
  return m_stack.size() == base || (m_early_base == base && m_early_end == m_stack.size());
}

// The memo's node at `index` for the GET at byte `at`, as memo_get finds it; nullptr when never
// stored. A last GET is noted, so that the memo lets the node go once the entry is done.
const Builder::Node* Builder::flat_get(std::uint64_t index, std::size_t at) {
  std::size_t last = 0;
  Node* found = memo_find(index, last);
  if (found && last == at) m_flat_last.push_back(found);
  return found;
}

bool Builder::flat_entry() {
  const auto* d = reinterpret_cast<const unsigned char*>(m_data.data());
  const std::size_t end = m_data.size();
  std::size_t p = m_pos;  // past the EMPTY_DICT
  FlatEntry& fe = m_flat;
  fe.count = 0;
  fe.frames.clear();
  fe.frames_node = nullptr;
  m_flat_last.clear();
  const std::uint64_t memo_first = m_memo_length.size();
  std::uint64_t memo_next = memo_first;
  constexpr std::uint64_t kNoIndex = ~std::uint64_t{0};
  std::uint64_t frames_put = kNoIndex;  // the frames list's memo index, when a GET names it
  std::uint32_t deepest = 0;            // of the entry's keys and values

  // Whether byte p starts an opcode with `n` argument bytes inside the data.
  auto has = [&](std::size_t n) { return p < end && end - p > n; };
  // A put at p, if there is one: 0 none, 1 read (its index in `index`), -1 not of the shape.
  auto put = [&](std::uint64_t& index) -> int {
    if (p >= end) return -1;
    std::size_t len;
    switch (d[p]) {
      case MEMOIZE: index = memo_next; len = 1; break;
      case BINPUT: if (!has(1)) return -1; index = d[p + 1]; len = 2; break;
      case LONG_BINPUT: if (!has(4)) return -1; index = le_uint(d + p + 1, 4); len = 5; break;
      default: return 0;
    }
    if (index != memo_next) return -1;  // out of order: the stack machine keeps the memo's length
    ++memo_next;
    p += len;
    return 1;
  };
  // A put that no GET names, or none.
  auto unreferenced_put = [&]() {
    std::uint64_t index;
    const int r = put(index);
    return r == 0 || (r == 1 && !m_refs.referenced(index));
  };
  // A GET at p: its node, or nullptr (not a GET, or of nothing stored).
  auto get = [&]() -> const Node* {
    if (!has(1)) return nullptr;
    const std::size_t at = p;
    std::uint64_t index;
    if (d[p] == BINGET) {
      index = d[p + 1];
      p += 2;
    } else if (d[p] == LONG_BINGET && has(4)) {
      index = le_uint(d + p + 1, 4);
      p += 5;
    } else {
      return nullptr;
    }
    return flat_get(index, at);
  };
  // A str inline (SHORT_BINUNICODE, BINUNICODE): its bytes, or false.
  auto text = [&](std::string_view& out) {
    std::size_t len, head;
    if (d[p] == SHORT_BINUNICODE && has(1)) {
      len = d[p + 1];
      head = 2;
    } else if (d[p] == BINUNICODE && has(4)) {
      len = le_uint(d + p + 1, 4);
      head = 5;
    } else {
      return false;
    }
    if (len > end - p - head) return false;
    out = std::string_view(m_data.data() + p + head, len);
    p += head + len;
    return true;
  };
  // The frames list, past its EMPTY_LIST.
  auto frames = [&]() {
    std::uint64_t index;
    const int r = put(index);
    if (r < 0) return false;
    if (r == 1 && m_refs.referenced(index)) frames_put = index;
    std::uint32_t list_depth = 1;
    auto frame = [&]() {
      const Node* f = get();
      if (!f || (*f)->m_kind != Kind::dict) return false;
      fe.frames.push_back(f);
      list_depth = std::max(list_depth, (*f)->m_depth + 1);
      return true;
    };
    while (p < end) {
      if (d[p] == MARK) {
        ++p;
        do {
          if (!frame()) return false;
        } while (p < end && d[p] != APPENDS);
        if (p >= end) return false;
        ++p;
      } else if (d[p] == BINGET || d[p] == LONG_BINGET) {
        if (!frame() || p >= end || d[p] != APPEND) return false;
        ++p;
      } else {
        break;
      }
    }
    deepest = std::max(deepest, list_depth);
    return true;
  };

  if (!unreferenced_put() || p >= end || d[p] != MARK) return false;
  ++p;
  bool has_frames = false;
  while (true) {
    if (p >= end) return false;
    if (d[p] == SETITEMS) {
      ++p;
      break;
    }
    if (fe.count == FlatEntry::kMaxItems) return false;
    FlatEntry::Item& item = fe.items[fe.count++];
    item = FlatEntry::Item{};
    // The key.
    if (d[p] == BINGET || d[p] == LONG_BINGET) {
      item.key = get();
      if (!item.key || (*item.key)->m_kind != Kind::string) return false;
    } else if (!text(item.key_text) || !unreferenced_put()) {
      return false;
    }
    // The value.
    if (p >= end) return false;
    switch (d[p]) {
      case BININT1:
        if (!has(1)) return false;
        item.is = FlatEntry::Is::integer;
        item.integer = d[p + 1];
        p += 2;
        break;
      case BININT2:
        if (!has(2)) return false;
        item.is = FlatEntry::Is::integer;
        item.integer = static_cast<std::int64_t>(le_uint(d + p + 1, 2));
        p += 3;
        break;
      case BININT:
        if (!has(4)) return false;
        item.is = FlatEntry::Is::integer;
        item.integer = static_cast<std::int32_t>(static_cast<std::uint32_t>(le_uint(d + p + 1, 4)));
        p += 5;
        break;
      case LONG1: {
        if (!has(1)) return false;
        const std::size_t len = d[p + 1];
        if (len > 8 || !has(1 + len)) return false;
        std::uint64_t u = le_uint(d + p + 2, static_cast<int>(len));
        if (len > 0 && len < 8 && (d[p + 1 + len] & 0x80)) u |= ~std::uint64_t{0} << (8 * len);  // negative
        item.is = FlatEntry::Is::integer;
        item.integer = static_cast<std::int64_t>(u);
        p += 2 + len;
        break;
      }
      case NONE:
        item.is = FlatEntry::Is::none;
        ++p;
        break;
      case SHORT_BINUNICODE:
      case BINUNICODE:
        item.is = FlatEntry::Is::text;
        if (!text(item.text)) return false;
        break;
      case BINGET:
      case LONG_BINGET:
        item.is = FlatEntry::Is::node;
        item.node = get();
        if (!item.node) return false;
        deepest = std::max(deepest, (*item.node)->m_depth);
        break;
      case EMPTY_LIST:
        if (has_frames) return false;
        has_frames = true;
        item.is = FlatEntry::Is::frames;
        ++p;
        if (!frames()) return false;
        continue;  // its put came before its items
      default:
        return false;
    }
    if (!unreferenced_put()) return false;
  }
  const std::uint32_t entry_depth = deepest + 1;
  // The stack machine reports a nesting too deep (and where) as it meets it.
  if (entry_depth + 1 > m_opt.max_depth) return false;

  // The frames list, made a node only for the GET that names it later.
  Node list;
  if (frames_put != kNoIndex) {
    list = make_container(Kind::list);
    list->m_items.reserve(fe.frames.size());
    for (const Node* f : fe.frames) {
      list->m_items.push_back(*f);
      list->m_depth = std::max(list->m_depth, (*f)->m_depth + 1);
    }
    list->m_shared = true;
    list->m_nested = true;  // in the entry
    fe.frames_node = &list;
  }

  Value& trace = *m_stack[m_marks.back() - 1];
  StreamedList& s = streamed_list(trace);
  if (!m_sink->flat_entry(s.device, s.count, fe)) {
    m_flat_last.clear();
    return false;
  }
  ++s.count;

  // Done: the memo and the nodes as the stack machine leaves them once the entry has gone.
  for (std::uint64_t i = memo_first; i < memo_next; ++i) m_memo_length.insert(i);
  if (list) memo_store(frames_put, std::move(list));
  for (const Node* f : fe.frames) (*f)->m_nested = true;
  for (std::size_t i = 0; i < fe.count; ++i)
    if (const Node* n = fe.items[i].node;
        n && ((*n)->m_kind == Kind::list || (*n)->m_kind == Kind::dict || (*n)->m_kind == Kind::tuple))
      (*n)->m_nested = true;
  for (Node* n : m_flat_last) n->reset();
  m_flat_last.clear();
  trace.m_depth = std::max(trace.m_depth, entry_depth + 1);
  m_pos = p;
  const std::size_t base = m_marks.back();
  push(Node());  // a placeholder, as stream_early leaves
  m_early_base = base;
  m_early_end = m_stack.size();
  return true;
}

}  // namespace memsnap::pickle
