// The safe pickle reader: a stack machine over data opcodes only. Opcodes that import or call
// code are refused by name, and every length is checked against the bytes left before use.
// The memo entries worth keeping are found first (pickle_memo_refs.cpp); the values it builds are
// in pickle_value.cpp, the streaming of trace entries in pickle_streaming.cpp.
#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>

#include "torch/pickle_builder.hpp"
#include "torch/pickle_text.hpp"

namespace memsnap::pickle {

using namespace opcodes;

ValuePtr Builder::run() {
  while (m_pos < m_data.size()) {
    if (m_pos >= m_release_at) release_behind();
    m_op_offset = m_pos;
    m_op = static_cast<std::uint8_t>(m_data[m_pos++]);
    if (m_early_end) guard_placeholders();
    if (m_op == STOP) return stop();
    step();
  }
  throw PickleError("pickle: data ends at byte " + std::to_string(m_data.size()) +
                        " before STOP (truncated)",
                    m_data.size());
}

// --- raw input ----------------------------------------------------------------------------------

void Builder::release_behind() {
  if (m_file) m_file->release(m_released, m_pos);
  if (m_opt.progress) m_opt.progress->fetch_add(m_pos - m_released, std::memory_order_relaxed);
  m_released = m_pos;
  m_release_at = m_pos + MappedFile::kReleaseStep;
}

std::string Builder::where() const {
  const char* name = opcode_name(m_op);
  return std::string("pickle: opcode ") + (name ? name : "?") + " (" + hex_byte(m_op) +
         ") at byte " + std::to_string(m_op_offset);
}

void Builder::fail(const std::string& problem) const {
  throw PickleError(where() + ": " + problem, m_op_offset);
}

std::string_view Builder::take(std::uint64_t n) {
  if (n > left())
    fail("needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) +
         " bytes left (truncated or corrupt length)");
  auto s = m_data.substr(m_pos, static_cast<std::size_t>(n));
  m_pos += static_cast<std::size_t>(n);
  return s;
}

std::uint64_t Builder::take_le(int width) {
  const auto* p = reinterpret_cast<const unsigned char*>(take(static_cast<std::uint64_t>(width)).data());
  if (width == 1) return p[0];  // BINGET, BININT1: most of a snapshot's arguments
  return le_uint(p, width);
}

std::string_view Builder::take_line() {
  auto end = m_data.find('\n', m_pos);
  if (end == std::string_view::npos) fail("line has no end (truncated)");
  auto s = m_data.substr(m_pos, end - m_pos);
  m_pos = end + 1;
  return s;
}

// --- stack --------------------------------------------------------------------------------------

void Builder::underflow(std::size_t n, std::size_t has) const {
  fail("stack underflow (needs " + std::to_string(n) + " value" + (n == 1 ? "" : "s") + ", has " +
       std::to_string(has) + (m_marks.empty() ? "" : " above the MARK") + ")");
}

void Builder::need(std::size_t n) const {
  if (available() < n) underflow(n, available());
}

Builder::Node Builder::pop() {
  need(1);
  Node n = std::move(m_stack.back());
  m_stack.pop_back();
  return n;
}

Builder::Node& Builder::top() {
  need(1);
  return m_stack.back();
}

// Closes the innermost MARK: the values above it are m_stack[base, end), left in place for the
// caller to move out and then drop with m_stack.resize(base).
std::size_t Builder::close_mark() {
  if (m_marks.empty()) fail("no MARK before it");
  std::size_t base = m_marks.back();
  m_marks.pop_back();
  return base;
}

// The value right below a closed MARK at `base` (what APPENDS and SETITEMS modify).
Builder::Node& Builder::below(std::size_t base) {
  const std::size_t floor = frame_base();
  if (base <= floor) underflow(1, 0);
  return m_stack[base - 1];
}

// --- values -------------------------------------------------------------------------------------

Builder::Node Builder::scalar(Kind kind) {
  auto n = make_node<Value>();
  n->m_kind = kind;
  return n;
}

Builder::Node Builder::make_int(std::int64_t v) {
  if (v >= 0 && v < kSmallInts) {
    const auto i = static_cast<std::size_t>(v);
    if (i >= m_small_ints.size()) m_small_ints.resize(std::min<std::size_t>(std::max<std::size_t>(i + 1, 2 * m_small_ints.size()), kSmallInts));
    Node& shared = m_small_ints[i];
    if (!shared) {
      shared = scalar(Kind::integer);
      shared->m_int = v;
    }
    return shared;
  }
  auto n = scalar(Kind::integer);
  n->m_int = v;
  return n;
}

Builder::Node Builder::make_text(Kind kind, std::string_view s) {
  auto n = scalar(kind);
  n->m_text.assign(s.data(), s.size());
  return n;
}

Builder::Node Builder::make_le_int(std::string_view bytes) {
  // Small positive values of LONG1 (addresses, times) skip the public factory's string copy.
  if (!bytes.empty() && bytes.size() <= 8 && (static_cast<unsigned char>(bytes.back()) & 0x80) == 0) {
    const std::uint64_t u = le_uint(reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    return make_int(static_cast<std::int64_t>(u));
  }
  // Reuse the public factory's normalisation; it returns a fresh non-const-created node.
  return std::const_pointer_cast<Value>(Value::integer_from_le_bytes(bytes));
}

Builder::Node Builder::make_decimal(std::string_view text) {
  std::string le;
  if (!decimal_to_le(text, le)) fail("bad integer text '" + std::string(text.substr(0, 40)) + "'");
  return make_le_int(le);
}

Builder::Node Builder::make_container(Kind kind) {
  auto n = scalar(kind);
  n->m_depth = 1;
  return n;
}

// Puts `child` inside `parent`: checks the shape rules and the depth limit.
void Builder::adopt(Value& parent, const Node& child) {
  if (parent.m_nested)
    fail(std::string("modifies a ") + kind_name(parent.m_kind) +
         " that is already nested inside another container; memsnap reads tree-shaped data only");
  if (child.get() == &parent) fail("would make a container contain itself");
  if (child->m_kind == Kind::list || child->m_kind == Kind::dict || child->m_kind == Kind::tuple) {
    child->m_nested = true;
    if (!m_dict_index.empty()) m_dict_index.erase(child.get());
  }
  std::uint32_t d = child->m_depth + 1;
  if (d > m_opt.max_depth)
    fail("nesting deeper than " + std::to_string(m_opt.max_depth) + " levels");
  parent.m_depth = std::max(parent.m_depth, d);
}

// A list or tuple of m_stack[base, end).
Builder::Node Builder::make_sequence(Kind kind, std::size_t base) {
  Node n = make_container(kind);
  n->m_items.reserve(m_stack.size() - base);
  for (std::size_t i = base; i < m_stack.size(); ++i) {
    adopt(*n, m_stack[i]);
    n->m_items.push_back(std::move(m_stack[i]));
  }
  m_stack.resize(base);
  return n;
}

// Appends m_stack[base, end) to `list`.
void Builder::list_append(Value& list, std::size_t base) {
  if (list.m_kind != Kind::list)
    fail(std::string("appends to a ") + kind_name(list.m_kind) + ", not a list");
  if (list.m_streamed && m_streaming) {
    stream_entries(list, base);
  } else {
    list.m_items.reserve(list.m_items.size() + (m_stack.size() - base));
    for (std::size_t i = base; i < m_stack.size(); ++i) {
      adopt(list, m_stack[i]);
      list.m_items.push_back(std::move(m_stack[i]));
    }
  }
  m_stack.resize(base);
}

void Builder::dict_set(const Node& dict_node, Node key, Node value) {
  Value& dict = *dict_node;
  if (dict.m_kind != Kind::dict)
    fail(std::string("sets an item on a ") + kind_name(dict.m_kind) + ", not a dict");
  if (!key->is_hashable()) fail(std::string("dict key of type ") + kind_name(key->m_kind) + " is unhashable");
  adopt(dict, key);
  adopt(dict, value);
  // Python keeps the first position of a repeated key and the last value.
  auto& entries = dict.m_dict;
  constexpr std::size_t kIndexFrom = 16;
  if (entries.size() < kIndexFrom) {
    for (auto& [k, v] : entries)
      if (k == key || k->equals(*key)) {
        v = std::move(value);
        return;
      }
    entries.emplace_back(std::move(key), std::move(value));
    if (entries.size() == kIndexFrom) {
      auto& slot = m_dict_index[&dict];
      slot.keep = dict_node;
      auto& index = slot.positions;
      for (std::size_t i = 0; i < entries.size(); ++i) index.emplace(entries[i].first->hash(), i);
    }
    return;
  }
  std::size_t h = key->hash();
  auto& index = m_dict_index[&dict].positions;
  auto [lo, hi] = index.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (entries[it->second].first->equals(*key)) {
      entries[it->second].second = std::move(value);
      return;
    }
  index.emplace(h, entries.size());
  entries.emplace_back(std::move(key), std::move(value));
}

// Sets the key/value pairs m_stack[base, end) on `dict_node`.
void Builder::dict_set_items(const Node& dict_node, std::size_t base) {
  if ((m_stack.size() - base) % 2 != 0) fail("odd number of values for key/value pairs");
  if (dict_node->m_kind == Kind::dict) dict_node->m_dict.reserve(dict_node->m_dict.size() + (m_stack.size() - base) / 2);
  for (std::size_t i = base; i < m_stack.size(); i += 2) dict_set(dict_node, std::move(m_stack[i]), std::move(m_stack[i + 1]));
  m_stack.resize(base);
}

// --- memo ---------------------------------------------------------------------------------------

void Builder::memo_put(std::uint64_t index) {
  need(1);
  m_memo_length.insert(index);
  if (!m_refs.referenced(index)) return;  // no GET names it
  const Node& node = m_stack.back();
  share(node);
  memo_store(index, node);
}

// Keeps `node` for the GETs of a referenced index.
void Builder::memo_store(std::uint64_t index, Node node) {
  if (const std::size_t slot = m_refs.slot(index); slot != MemoRefs::kNone)
    m_slots[slot].node = std::move(node);
  else
    m_far_memo[index] = std::move(node);
}

void Builder::memo_get(std::uint64_t index) {
  std::size_t last = 0;
  Node* found = memo_find(index, last);
  if (!found) fail("memo index " + std::to_string(index) + " was never stored");
  // The same node: memo sharing is kept. After its last GET the memo lets go of it.
  if (last == m_op_offset)
    push(std::move(*found));
  else
    push(*found);
}

std::uint64_t Builder::line_index() {
  auto line = take_line();
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
  if (ec != std::errc() || p != line.data() + line.size()) fail("bad memo index text");
  return v;
}

// A node that more than one place will hold.
void Builder::share(const Node& node) {
  node->m_shared = true;
  if (m_streaming && (node == m_root || node == m_traces || node->m_streamed)) stop_streaming();
}

// --- opcodes ------------------------------------------------------------------------------------

ValuePtr Builder::stop() {
  if (!m_marks.empty()) fail("a MARK is still open");
  if (m_stack.size() != 1)
    fail("stack holds " + std::to_string(m_stack.size()) + " values, expected exactly 1");
  m_dict_index.clear();
  if (m_began) check_streamed();
  return std::move(m_stack.back());
}

void Builder::refuse_code() const {
  bool imports = m_op == GLOBAL || m_op == STACK_GLOBAL || m_op == INST || m_op == EXT1 ||
                 m_op == EXT2 || m_op == EXT4;
  bool persistent = m_op == PERSID || m_op == BINPERSID;
  bool buffers = m_op == NEXT_BUFFER || m_op == READONLY_BUFFER;
  std::string what = imports ? "would import code" : persistent ? "would call a persistent-id loader"
                     : buffers ? "needs out-of-band buffers" : "would call code";
  throw PickleError(std::string("pickle: opcode ") + opcode_name(m_op) + " (" + hex_byte(m_op) +
                        ") at byte " + std::to_string(m_op_offset) + " " + what +
                        "; memsnap reads data only",
                    m_op_offset);
}

void Builder::step() {
  switch (m_op) {
    case PROTO: {
      auto proto = take_le(1);
      if (proto > 5) fail("unsupported protocol " + std::to_string(proto));
      return;
    }
    case FRAME: {
      // Framing is advisory for us; a frame longer than the data means truncation.
      auto len = take_le(8);
      if (len > left())
        fail("frame of " + std::to_string(len) + " bytes, only " + std::to_string(left()) + " left (truncated)");
      return;
    }
    case MARK: m_marks.push_back(m_stack.size()); return;
    case POP:
      if (available() == 0 && !m_marks.empty()) {
        m_marks.pop_back();  // Python pops the mark when the frame above it is empty
        return;
      }
      pop();
      return;
    case POP_MARK: m_stack.resize(close_mark()); return;
    case DUP:
      share(top());
      push(top());
      return;

    case NONE:
      if (!m_none) m_none = scalar(Kind::none);
      push(m_none);
      return;
    case NEWTRUE:
    case NEWFALSE: {
      Node& shared = m_op == NEWTRUE ? m_true : m_false;
      if (!shared) {
        shared = scalar(Kind::boolean);
        shared->m_bool = m_op == NEWTRUE;
      }
      push(shared);
      return;
    }
    case BININT1: push(make_int(static_cast<std::int64_t>(take_le(1)))); return;
    case BININT2: push(make_int(static_cast<std::int64_t>(take_le(2)))); return;
    case BININT: push(make_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4))))); return;
    case LONG1: {
      auto n = take_le(1);
      push(make_le_int(take(n)));
      return;
    }
    case LONG4: {
      auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4)));
      if (n < 0) fail("negative length " + std::to_string(n));
      push(make_le_int(take(static_cast<std::uint64_t>(n))));
      return;
    }
    case INT: {
      auto line = take_line();
      if (line == "01" || line == "00") {
        auto b = scalar(Kind::boolean);
        b->m_bool = line == "01";
        push(b);
      } else {
        push(make_decimal(line));
      }
      return;
    }
    case LONG: {
      auto line = take_line();
      if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
      push(make_decimal(line));
      return;
    }
    case BINFLOAT: {
      auto s = take(8);
      std::uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(s[i]);  // big-endian
      auto n = scalar(Kind::floating);
      n->m_float = std::bit_cast<double>(bits);
      push(n);
      return;
    }
    case FLOAT: {
      auto line = take_line();
      double d = 0;
      auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), d);
      if (ec != std::errc() || p != line.data() + line.size()) fail("bad float text");
      auto n = scalar(Kind::floating);
      n->m_float = d;
      push(n);
      return;
    }

    case SHORT_BINUNICODE: push(make_text(Kind::string, take(take_le(1)))); return;
    case BINUNICODE: push(make_text(Kind::string, take(take_le(4)))); return;
    case BINUNICODE8: push(make_text(Kind::string, take(take_le(8)))); return;
    // Python 3 reads protocol 0-2 byte strings as str (ASCII by default); keep their bytes.
    case SHORT_BINSTRING: push(make_text(Kind::string, take(take_le(1)))); return;
    case BINSTRING: {
      auto n = static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4)));
      if (n < 0) fail("negative length " + std::to_string(n));
      push(make_text(Kind::string, take(static_cast<std::uint64_t>(n))));
      return;
    }
    case STRING: {
      std::string text;
      const char* problem = nullptr;
      if (!decode_string_literal(take_line(), text, problem)) fail(problem);
      push(make_text(Kind::string, text));
      return;
    }
    case UNICODE: {
      std::string text;
      const char* problem = nullptr;
      if (!decode_raw_unicode_escape(take_line(), text, problem)) fail(problem);
      push(make_text(Kind::string, text));
      return;
    }
    case SHORT_BINBYTES: push(make_text(Kind::bytes, take(take_le(1)))); return;
    case BINBYTES: push(make_text(Kind::bytes, take(take_le(4)))); return;
    case BINBYTES8:
    case BYTEARRAY8: push(make_text(Kind::bytes, take(take_le(8)))); return;

    case EMPTY_LIST:
      push(make_container(Kind::list));
      if (m_streaming) recognise_list();
      return;
    case EMPTY_DICT:
      if (m_streaming && !m_marks.empty()) {
        stream_early();
        if (m_streaming && m_opt.flat_entries && flat_ready() && began() && flat_entry()) return;
      }
      push(make_container(Kind::dict));
      if (m_streaming && !m_root && m_stack.size() == 1 && m_marks.empty()) m_root = m_stack.back();
      return;
    case EMPTY_TUPLE: push(make_container(Kind::tuple)); return;
    case LIST: push(make_sequence(Kind::list, close_mark())); return;
    case TUPLE: push(make_sequence(Kind::tuple, close_mark())); return;
    case TUPLE1:
    case TUPLE2:
    case TUPLE3: {
      std::size_t n = static_cast<std::size_t>(m_op - TUPLE1 + 1);
      need(n);
      push(make_sequence(Kind::tuple, m_stack.size() - n));
      return;
    }
    case DICT: {
      const std::size_t base = close_mark();
      Node d = make_container(Kind::dict);
      dict_set_items(d, base);
      m_dict_index.erase(d.get());
      push(d);
      return;
    }
    case APPEND: {
      need(2);
      list_append(*m_stack[m_stack.size() - 2], m_stack.size() - 1);
      return;
    }
    case APPENDS: {
      const std::size_t base = close_mark();
      list_append(*below(base), base);
      return;
    }
    case SETITEM: {
      need(3);
      Node value = pop();
      Node key = pop();
      dict_set(top(), std::move(key), std::move(value));
      return;
    }
    case SETITEMS: {
      const std::size_t base = close_mark();
      const Node dict = below(base);
      dict_set_items(dict, base);
      return;
    }

    case MEMOIZE: memo_put(m_memo_length.size()); return;
    case PUT: memo_put(line_index()); return;
    case BINPUT: memo_put(take_le(1)); return;
    case LONG_BINPUT: memo_put(take_le(4)); return;
    case GET: memo_get(line_index()); return;
    case BINGET: memo_get(take_le(1)); return;
    case LONG_BINGET: memo_get(take_le(4)); return;

    case EMPTY_SET:
    case ADDITEMS:
    case FROZENSET: fail("sets are not supported (no PyTorch snapshot holds one)");

    case GLOBAL:
    case STACK_GLOBAL:
    case REDUCE:
    case BUILD:
    case INST:
    case OBJ:
    case NEWOBJ:
    case NEWOBJ_EX:
    case PERSID:
    case BINPERSID:
    case EXT1:
    case EXT2:
    case EXT4:
    case NEXT_BUFFER:
    case READONLY_BUFFER: refuse_code();

    default:
      throw PickleError("pickle: unknown opcode " + hex_byte(m_op) + " at byte " +
                            std::to_string(m_op_offset) + " (not a pickle, or corrupt)",
                        m_op_offset);
  }
}

// --- entry points -------------------------------------------------------------------------------

ValuePtr read(std::string_view data, const ReadOptions& opt) {
  const MemoRefs refs(data, nullptr);
  Builder builder(data, opt, refs, nullptr, nullptr);
  return builder.run();
}

ValuePtr read_file(const std::string& path, const ReadOptions& opt) {
  const MappedFile file(path);
  const MemoRefs refs(file.data(), &file);
  Builder builder(file.data(), opt, refs, &file, nullptr);
  return builder.run();
}

StreamedRead read_streaming(std::string_view data, TraceSink& sink, const ReadOptions& opt, const MappedFile* file) {
  const MemoRefs refs(data, file);
  StreamedRead out;
  try {
    Builder builder(data, opt, refs, file, &sink);
    out.root = builder.run();
    out.streamed = builder.streamed();
  } catch (const ReadAgainWhole&) {
    Builder builder(data, opt, refs, file, nullptr);
    out.root = builder.run();
    out.streamed = false;
  }
  return out;
}

}  // namespace memsnap::pickle
