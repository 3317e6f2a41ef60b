// The safe pickle reader: a stack machine over data opcodes only. Opcodes that import or call
// code are refused by name, and every length is checked against the bytes left before use.
// The values it builds are in pickle_value.cpp.
#include "torch/pickle.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace memsnap::pickle {

// ---------------------------------------------------------------------------------------------
// Opcodes

namespace {

// Opcode bytes, as pickletools names them.
enum Op : std::uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I',
  BININT = 'J', BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P',
  BINPERSID = 'Q', REDUCE = 'R', STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U',
  UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b', GLOBAL = 'c', DICT = 'd',
  EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h', INST = 'i', LONG_BINGET = 'j',
  LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q', LONG_BINPUT = 'r',
  SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85,
  TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
  BINBYTES = 'B', SHORT_BINBYTES = 'C', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e, EMPTY_SET = 0x8f, ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92,
  STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95, BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97,
  READONLY_BUFFER = 0x98,
};

}  // namespace

const char* opcode_name(std::uint8_t op) {
  switch (op) {
    case MARK: return "MARK";
    case STOP: return "STOP";
    case POP: return "POP";
    case POP_MARK: return "POP_MARK";
    case DUP: return "DUP";
    case FLOAT: return "FLOAT";
    case INT: return "INT";
    case BININT: return "BININT";
    case BININT1: return "BININT1";
    case LONG: return "LONG";
    case BININT2: return "BININT2";
    case NONE: return "NONE";
    case PERSID: return "PERSID";
    case BINPERSID: return "BINPERSID";
    case REDUCE: return "REDUCE";
    case STRING: return "STRING";
    case BINSTRING: return "BINSTRING";
    case SHORT_BINSTRING: return "SHORT_BINSTRING";
    case UNICODE: return "UNICODE";
    case BINUNICODE: return "BINUNICODE";
    case APPEND: return "APPEND";
    case BUILD: return "BUILD";
    case GLOBAL: return "GLOBAL";
    case DICT: return "DICT";
    case EMPTY_DICT: return "EMPTY_DICT";
    case APPENDS: return "APPENDS";
    case GET: return "GET";
    case BINGET: return "BINGET";
    case INST: return "INST";
    case LONG_BINGET: return "LONG_BINGET";
    case LIST: return "LIST";
    case EMPTY_LIST: return "EMPTY_LIST";
    case OBJ: return "OBJ";
    case PUT: return "PUT";
    case BINPUT: return "BINPUT";
    case LONG_BINPUT: return "LONG_BINPUT";
    case SETITEM: return "SETITEM";
    case TUPLE: return "TUPLE";
    case EMPTY_TUPLE: return "EMPTY_TUPLE";
    case SETITEMS: return "SETITEMS";
    case BINFLOAT: return "BINFLOAT";
    case PROTO: return "PROTO";
    case NEWOBJ: return "NEWOBJ";
    case EXT1: return "EXT1";
    case EXT2: return "EXT2";
    case EXT4: return "EXT4";
    case TUPLE1: return "TUPLE1";
    case TUPLE2: return "TUPLE2";
    case TUPLE3: return "TUPLE3";
    case NEWTRUE: return "NEWTRUE";
    case NEWFALSE: return "NEWFALSE";
    case LONG1: return "LONG1";
    case LONG4: return "LONG4";
    case BINBYTES: return "BINBYTES";
    case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case BINUNICODE8: return "BINUNICODE8";
    case BINBYTES8: return "BINBYTES8";
    case EMPTY_SET: return "EMPTY_SET";
    case ADDITEMS: return "ADDITEMS";
    case FROZENSET: return "FROZENSET";
    case NEWOBJ_EX: return "NEWOBJ_EX";
    case STACK_GLOBAL: return "STACK_GLOBAL";
    case MEMOIZE: return "MEMOIZE";
    case FRAME: return "FRAME";
    case BYTEARRAY8: return "BYTEARRAY8";
    case NEXT_BUFFER: return "NEXT_BUFFER";
    case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

std::string hex_byte(std::uint8_t b) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  s += digits[b >> 4];
  s += digits[b & 15];
  return s;
}

// Decimal text (optional sign) to two's-complement little-endian bytes, for INT/LONG text opcodes.
bool decimal_to_le(std::string_view text, std::string& out) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  std::vector<std::uint32_t> limbs;  // magnitude, little-endian
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    std::uint64_t carry = static_cast<std::uint64_t>(c - '0');
    for (auto& limb : limbs) {
      std::uint64_t cur = static_cast<std::uint64_t>(limb) * 10 + carry;
      limb = static_cast<std::uint32_t>(cur);
      carry = cur >> 32;
    }
    if (carry) limbs.push_back(static_cast<std::uint32_t>(carry));
  }
  out.assign(limbs.size() * 4 + 1, '\0');  // one extra byte keeps the sign bit clear
  for (std::size_t i = 0; i < limbs.size(); ++i)
    for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<char>((limbs[i] >> (8 * b)) & 0xff);
  if (negative) {
    unsigned carry = 1;
    for (auto& c : out) {
      unsigned v = static_cast<unsigned char>(~static_cast<unsigned char>(c)) + carry;
      c = static_cast<char>(v & 0xff);
      carry = v >> 8;
    }
  }
  return true;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

// Builds values on a stack. Containers are mutable while the pickle fills them; once a container
// is placed inside another it is frozen, which rules out reference cycles (a container can only
// come to contain itself by being modified after it was nested, or by a direct self-insert).
class Builder {
 public:
  using Node = std::shared_ptr<Value>;

  Builder(std::string_view data, const ReadOptions& opt) : m_data(data), m_opt(opt) {}

  ValuePtr run() {
    while (m_pos < m_data.size()) {
      m_op_offset = m_pos;
      m_op = static_cast<std::uint8_t>(m_data[m_pos++]);
      if (m_op == STOP) return stop();
      step();
    }
    throw PickleError("pickle: data ends at byte " + std::to_string(m_data.size()) +
                          " before STOP (truncated)",
                      m_data.size());
  }

 private:
  std::string_view m_data;
  ReadOptions m_opt;
  std::size_t m_pos = 0;
  std::size_t m_op_offset = 0;
  std::uint8_t m_op = 0;
  std::vector<Node> m_stack;
  std::vector<std::size_t> m_marks;  // stack heights at each open MARK
  std::unordered_map<std::uint64_t, Node> m_memo;
  // Index of big dicts under construction, so that duplicate keys stay linear to merge.
  // The entry keeps its dict alive so that a popped dict's address cannot be reused meanwhile.
  struct DictIndex {
    Node keep;
    std::unordered_multimap<std::size_t, std::size_t> positions;
  };
  std::unordered_map<const Value*, DictIndex> m_dict_index;
  Node m_none, m_true, m_false;

  std::string where() const {
    const char* name = opcode_name(m_op);
    return std::string("pickle: opcode ") + (name ? name : "?") + " (" + hex_byte(m_op) +
           ") at byte " + std::to_string(m_op_offset);
  }
  [[noreturn]] void fail(const std::string& problem) const {
    throw PickleError(where() + ": " + problem, m_op_offset);
  }

  // --- raw input -----------------------------------------------------------------------------
  std::size_t left() const { return m_data.size() - m_pos; }
  std::string_view take(std::uint64_t n) {
    if (n > left())
      fail("needs " + std::to_string(n) + " bytes, only " + std::to_string(left()) +
           " bytes left (truncated or corrupt length)");
    auto s = m_data.substr(m_pos, static_cast<std::size_t>(n));
    m_pos += static_cast<std::size_t>(n);
    return s;
  }
  std::uint64_t take_le(int width) {
    auto s = take(static_cast<std::uint64_t>(width));
    std::uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }
  std::string_view take_line() {
    auto end = m_data.find('\n', m_pos);
    if (end == std::string_view::npos) fail("line has no end (truncated)");
    auto s = m_data.substr(m_pos, end - m_pos);
    m_pos = end + 1;
    return s;
  }

  // --- stack ---------------------------------------------------------------------------------
  std::size_t frame_base() const { return m_marks.empty() ? 0 : m_marks.back(); }
  std::size_t available() const { return m_stack.size() - frame_base(); }
  void need(std::size_t n) const {
    if (available() < n)
      fail("stack underflow (needs " + std::to_string(n) + " value" + (n == 1 ? "" : "s") +
           ", has " + std::to_string(available()) + (m_marks.empty() ? "" : " above the MARK") + ")");
  }
  Node pop() {
    need(1);
    Node n = std::move(m_stack.back());
    m_stack.pop_back();
    return n;
  }
  Node& top() {
    need(1);
    return m_stack.back();
  }
  std::vector<Node> pop_mark() {
    if (m_marks.empty()) fail("no MARK before it");
    std::size_t base = m_marks.back();
    m_marks.pop_back();
    std::vector<Node> items(std::make_move_iterator(m_stack.begin() + static_cast<std::ptrdiff_t>(base)),
                            std::make_move_iterator(m_stack.end()));
    m_stack.resize(base);
    return items;
  }
  void push(Node n) { m_stack.push_back(std::move(n)); }

  // --- node construction ---------------------------------------------------------------------
  Node scalar(Kind kind) {
    auto n = std::make_shared<Value>();
    n->m_kind = kind;
    return n;
  }
  Node make_int(std::int64_t v) {
    auto n = scalar(Kind::integer);
    n->m_int = v;
    return n;
  }
  Node make_text(Kind kind, std::string_view s) {
    auto n = scalar(kind);
    n->m_text.assign(s.data(), s.size());
    return n;
  }
  Node make_le_int(std::string_view bytes) {
    // Reuse the public factory's normalisation; it returns a fresh non-const-created node.
    return std::const_pointer_cast<Value>(Value::integer_from_le_bytes(bytes));
  }
  Node make_decimal(std::string_view text) {
    std::string le;
    if (!decimal_to_le(text, le)) fail("bad integer text '" + std::string(text.substr(0, 40)) + "'");
    return make_le_int(le);
  }
  Node make_container(Kind kind) {
    auto n = scalar(kind);
    n->m_depth = 1;
    return n;
  }

  // Puts `child` inside `parent`: checks the shape rules and the depth limit.
  void adopt(Value& parent, const Node& child) {
    if (parent.m_nested)
      fail(std::string("modifies a ") + kind_name(parent.m_kind) +
           " that is already nested inside another container; memsnap reads tree-shaped data only");
    if (child.get() == &parent) fail("would make a container contain itself");
    if (child->m_kind == Kind::list || child->m_kind == Kind::dict || child->m_kind == Kind::tuple) {
      child->m_nested = true;
      m_dict_index.erase(child.get());
    }
    std::uint32_t d = child->m_depth + 1;
    if (d > m_opt.max_depth)
      fail("nesting deeper than " + std::to_string(m_opt.max_depth) + " levels");
    parent.m_depth = std::max(parent.m_depth, d);
  }

  Node make_sequence(Kind kind, std::vector<Node> items) {
    Node n = make_container(kind);
    n->m_items.reserve(items.size());
    for (auto& item : items) {
      adopt(*n, item);
      n->m_items.push_back(std::move(item));
    }
    return n;
  }

  void list_append(Value& list, std::vector<Node> items) {
    if (list.m_kind != Kind::list)
      fail(std::string("appends to a ") + kind_name(list.m_kind) + ", not a list");
    for (auto& item : items) {
      adopt(list, item);
      list.m_items.push_back(std::move(item));
    }
  }

  void dict_set(const Node& dict_node, Node key, Node value) {
    Value& dict = *dict_node;
    if (dict.m_kind != Kind::dict)
      fail(std::string("sets an item on a ") + kind_name(dict.m_kind) + ", not a dict");
    if (!key->is_hashable()) fail(std::string("dict key of type ") + kind_name(key->m_kind) + " is unhashable");
    adopt(dict, key);
    adopt(dict, value);
    // Python keeps the first position of a repeated key and the last value.
    auto& entries = dict.m_dict;
    constexpr std::size_t kIndexFrom = 16;
    std::size_t h = key->hash();
    if (entries.size() < kIndexFrom) {
      for (auto& [k, v] : entries)
        if (k->equals(*key)) {
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

  void dict_set_items(const Node& dict, std::vector<Node> items) {
    if (items.size() % 2 != 0) fail("odd number of values for key/value pairs");
    for (std::size_t i = 0; i < items.size(); i += 2) dict_set(dict, std::move(items[i]), std::move(items[i + 1]));
  }

  // --- memo ----------------------------------------------------------------------------------
  void memo_put(std::uint64_t index) {
    need(1);
    m_memo[index] = m_stack.back();
  }
  void memo_get(std::uint64_t index) {
    auto it = m_memo.find(index);
    if (it == m_memo.end()) fail("memo index " + std::to_string(index) + " was never stored");
    push(it->second);  // the same node: memo sharing is kept
  }
  std::uint64_t line_index() {
    auto line = take_line();
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (ec != std::errc() || p != line.data() + line.size()) fail("bad memo index text");
    return v;
  }

  // --- text-protocol strings -------------------------------------------------------------------
  std::string decode_string_literal(std::string_view s) {
    // STRING holds a Python 2 repr: quoted, with backslash escapes.
    if (s.size() < 2 || (s.front() != '\'' && s.front() != '"') || s.back() != s.front())
      fail("STRING argument is not quoted");
    s = s.substr(1, s.size() - 2);
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (c != '\\' || i + 1 >= s.size()) {
        out += c;
        continue;
      }
      char e = s[++i];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x': {
          if (i + 2 >= s.size() || hex_value(s[i + 1]) < 0 || hex_value(s[i + 2]) < 0)
            fail("bad \\x escape in STRING");
          out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
          i += 2;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) v = v * 8 + (s[++i] - '0');
            out += static_cast<char>(v & 0xff);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }
  std::string decode_raw_unicode_escape(std::string_view s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      auto c = static_cast<unsigned char>(s[i]);
      if (c == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
        int digits = s[i + 1] == 'u' ? 4 : 8;
        if (i + 1 + static_cast<std::size_t>(digits) >= s.size()) fail("bad \\u escape in UNICODE");
        std::uint32_t cp = 0;
        for (int k = 0; k < digits; ++k) {
          int h = hex_value(s[i + 2 + k]);
          if (h < 0) fail("bad \\u escape in UNICODE");
          cp = cp * 16 + static_cast<std::uint32_t>(h);
        }
        if (cp > 0x10ffff) fail("code point out of range in UNICODE");
        append_utf8(out, cp);
        i += 1 + digits;
      } else {
        append_utf8(out, c);  // raw-unicode-escape: other bytes are Latin-1
      }
    }
    return out;
  }

  // --- the opcodes ---------------------------------------------------------------------------
  ValuePtr stop() {
    if (!m_marks.empty()) fail("a MARK is still open");
    if (m_stack.size() != 1)
      fail("stack holds " + std::to_string(m_stack.size()) + " values, expected exactly 1");
    m_dict_index.clear();
    return std::move(m_stack.back());
  }

  [[noreturn]] void refuse_code() const {
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

  void step() {
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
      case POP_MARK: pop_mark(); return;
      case DUP: push(top()); return;

      case NONE:
        if (!m_none) m_none = std::const_pointer_cast<Value>(Value::none());
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
      case STRING: push(make_text(Kind::string, decode_string_literal(take_line()))); return;
      case UNICODE: push(make_text(Kind::string, decode_raw_unicode_escape(take_line()))); return;
      case SHORT_BINBYTES: push(make_text(Kind::bytes, take(take_le(1)))); return;
      case BINBYTES: push(make_text(Kind::bytes, take(take_le(4)))); return;
      case BINBYTES8:
      case BYTEARRAY8: push(make_text(Kind::bytes, take(take_le(8)))); return;

      case EMPTY_LIST: push(make_container(Kind::list)); return;
      case EMPTY_DICT: push(make_container(Kind::dict)); return;
      case EMPTY_TUPLE: push(make_container(Kind::tuple)); return;
      case LIST: push(make_sequence(Kind::list, pop_mark())); return;
      case TUPLE: push(make_sequence(Kind::tuple, pop_mark())); return;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        std::size_t n = static_cast<std::size_t>(m_op - TUPLE1 + 1);
        need(n);
        std::vector<Node> items(std::make_move_iterator(m_stack.end() - static_cast<std::ptrdiff_t>(n)),
                                std::make_move_iterator(m_stack.end()));
        m_stack.resize(m_stack.size() - n);
        push(make_sequence(Kind::tuple, std::move(items)));
        return;
      }
      case DICT: {
        auto items = pop_mark();
        Node d = make_container(Kind::dict);
        dict_set_items(d, std::move(items));
        m_dict_index.erase(d.get());
        push(d);
        return;
      }
      case APPEND: {
        need(2);
        Node item = pop();
        std::vector<Node> one;
        one.push_back(std::move(item));
        list_append(*top(), std::move(one));
        return;
      }
      case APPENDS: {
        auto items = pop_mark();
        list_append(*top(), std::move(items));
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
        auto items = pop_mark();
        dict_set_items(top(), std::move(items));
        return;
      }

      case MEMOIZE: memo_put(m_memo.size()); return;
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
};

ValuePtr read(std::string_view data, const ReadOptions& opt) {
  Builder builder(data, opt);
  return builder.run();
}

ValuePtr read_file(const std::string& path, const ReadOptions& opt) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PickleError("pickle: cannot open " + path + ": " + std::strerror(errno), 0);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw PickleError("pickle: cannot read " + path, 0);
  return read(buffer.str(), opt);
}

}  // namespace memsnap::pickle
