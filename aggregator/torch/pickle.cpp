// The safe pickle reader: a stack machine over data opcodes only. Opcodes that import or call
// code are refused by name, and every length is checked against the bytes left before use.
// The values it builds are in pickle_value.cpp.
#include "torch/pickle.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
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

// ---------------------------------------------------------------------------------------------
// Memo references, found before reading

namespace {

// The memo indices that some GET, BINGET or LONG_BINGET names, and the byte of the last GET of
// each. Two passes over the opcodes (lengths only, nothing built) find them, so that the reader
// keeps only those nodes, and only until their last reference: every other node is freed as soon
// as its container is, instead of living in the memo to the end.
class MemoRefs {
 public:
  MemoRefs(std::string_view data, const MappedFile* file) {
    // Indices below this go into a bitmap with a rank per word (a referenced index's slot in a
    // vector); larger ones (explicit PUTs far out) into a hash map. MEMOIZE indices stay below the
    // number of bytes, as each costs one.
    m_limit = static_cast<std::uint64_t>(data.size()) + 1;
    scan(data, file, [this](std::uint64_t i, std::size_t) { note(i); });
    m_rank.resize(m_bits.size());
    std::uint64_t total = 0;
    for (std::size_t w = 0; w < m_bits.size(); ++w) {
      m_rank[w] = total;
      total += static_cast<std::uint64_t>(std::popcount(m_bits[w]));
    }
    m_slots = static_cast<std::size_t>(total);
    m_last.resize(m_slots);
    scan(data, file, [this](std::uint64_t i, std::size_t at) {
      if (dense(i))
        m_last[slot(i)] = at;
      else
        m_sparse[i] = at;
    });
  }

  bool referenced(std::uint64_t i) const {
    if (i < m_limit) {
      const std::size_t w = static_cast<std::size_t>(i >> 6);
      return w < m_bits.size() && ((m_bits[w] >> (i & 63)) & 1) != 0;
    }
    return m_sparse.count(i) != 0;
  }
  // The byte offset of the last GET of a referenced index past the slots' range.
  std::size_t last_far_get(std::uint64_t i) const {
    auto it = m_sparse.find(i);
    return it == m_sparse.end() ? 0 : it->second;
  }
  std::size_t last_get_of_slot(std::size_t slot) const { return m_last[slot]; }
  bool dense(std::uint64_t i) const { return i < m_limit; }
  // The slot of a referenced index below the limit.
  std::size_t slot(std::uint64_t i) const {
    const std::size_t w = static_cast<std::size_t>(i >> 6);
    const std::uint64_t below = m_bits[w] & ((std::uint64_t{1} << (i & 63)) - 1);
    return static_cast<std::size_t>(m_rank[w] + static_cast<std::uint64_t>(std::popcount(below)));
  }
  std::size_t slots() const { return m_slots; }

 private:
  std::uint64_t m_limit = 0;
  std::vector<std::uint64_t> m_bits;
  std::vector<std::uint64_t> m_rank;
  std::unordered_map<std::uint64_t, std::size_t> m_sparse;  // index past the bitmap -> last GET
  std::size_t m_slots = 0;
  std::vector<std::size_t> m_last;  // by slot: byte offset of the last GET

  void note(std::uint64_t i) {
    if (i >= m_limit) {
      m_sparse.emplace(i, 0);
      return;
    }
    const std::size_t w = static_cast<std::size_t>(i >> 6);
    if (w >= m_bits.size()) m_bits.resize(std::max(w + 1, m_bits.size() * 2), 0);
    m_bits[w] |= std::uint64_t{1} << (i & 63);
  }

  // Stops where the reader would stop (STOP) or fail (a bad length, an opcode it refuses): past
  // that point no reference matters.
  template <typename OnGet>
  void scan(std::string_view data, const MappedFile* file, const OnGet& on_get) {
    const std::size_t n = data.size();
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    std::size_t pos = 0;
    constexpr std::size_t kReleaseStep = std::size_t{16} << 20;
    std::size_t released = 0;
    auto le = [&](std::size_t at, int width) {
      std::uint64_t v = 0;
      for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(p[at + static_cast<std::size_t>(i)]) << (8 * i);
      return v;
    };
    // Skips `width` length bytes and the payload they announce; false when it does not fit.
    auto counted = [&](int width, bool is_signed) {
      if (n - pos < static_cast<std::size_t>(width)) return false;
      std::uint64_t len = le(pos, width);
      if (is_signed && (len & 0x80000000u)) return false;
      pos += static_cast<std::size_t>(width);
      if (len > n - pos) return false;
      pos += static_cast<std::size_t>(len);
      return true;
    };
    auto fixed = [&](std::size_t width) {
      if (n - pos < width) return false;
      pos += width;
      return true;
    };
    auto line = [&](std::string_view* text) {
      const void* end = std::memchr(p + pos, '\n', n - pos);
      if (!end) return false;
      const std::size_t e = static_cast<std::size_t>(static_cast<const unsigned char*>(end) - p);
      if (text) *text = data.substr(pos, e - pos);
      pos = e + 1;
      return true;
    };
    while (pos < n) {
      if (file && pos - released >= kReleaseStep) {
        file->release(released, pos);
        released = pos;
      }
      const std::size_t at = pos;
      const std::uint8_t op = p[pos++];
      bool ok = true;
      switch (op) {
        case STOP: return;
        case MARK: case POP: case POP_MARK: case DUP: case NONE: case NEWTRUE: case NEWFALSE:
        case EMPTY_LIST: case EMPTY_DICT: case EMPTY_TUPLE: case LIST: case TUPLE: case TUPLE1:
        case TUPLE2: case TUPLE3: case DICT: case APPEND: case APPENDS: case SETITEM: case SETITEMS:
        case MEMOIZE: break;
        case PROTO: case BININT1: case BINPUT: ok = fixed(1); break;
        case BININT2: ok = fixed(2); break;
        case BININT: case LONG_BINPUT: ok = fixed(4); break;
        case BINFLOAT: ok = fixed(8); break;
        case FRAME:
          ok = n - pos >= 8 && le(pos, 8) <= n - pos - 8;
          pos += ok ? 8 : 0;
          break;
        case BINGET:
          ok = fixed(1);
          if (ok) on_get(p[pos - 1], at);
          break;
        case LONG_BINGET:
          ok = fixed(4);
          if (ok) on_get(le(pos - 4, 4), at);
          break;
        case GET: {
          std::string_view text;
          std::uint64_t v = 0;
          ok = line(&text);
          if (ok) {
            auto [q, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            ok = ec == std::errc() && q == text.data() + text.size();
          }
          if (ok) on_get(v, at);
          break;
        }
        case FLOAT: case INT: case LONG: case STRING: case UNICODE: case PUT: ok = line(nullptr); break;
        case LONG1: case SHORT_BINUNICODE: case SHORT_BINSTRING: case SHORT_BINBYTES: ok = counted(1, false); break;
        case LONG4: case BINSTRING: ok = counted(4, true); break;
        case BINUNICODE: case BINBYTES: ok = counted(4, false); break;
        case BINUNICODE8: case BINBYTES8: case BYTEARRAY8: ok = counted(8, false); break;
        default: return;  // refused or unknown: the reader fails here
      }
      if (!ok) return;
    }
  }
};

// Python's memo length (what MEMOIZE stores at), without a set entry per index: indices
// [0, m_dense) are all present, and m_above holds those past it (explicit PUTs out of order).
class MemoLength {
 public:
  void insert(std::uint64_t i) {
    if (i < m_dense) return;
    if (i > m_dense) {
      m_above.insert(i);
      return;
    }
    ++m_dense;
    while (!m_above.empty() && m_above.erase(m_dense)) ++m_dense;
  }
  std::uint64_t size() const { return m_dense + m_above.size(); }

 private:
  std::uint64_t m_dense = 0;
  std::unordered_set<std::uint64_t> m_above;
};

// Thrown inside the reader when a streamed pickle turns out to use a streamed node in a way the
// sink cannot follow: it is then read again without streaming.
struct ReadAgainWhole {};

}  // namespace

// Builds values on a stack. Containers are mutable while the pickle fills them; once a container
// is placed inside another it is frozen, which rules out reference cycles (a container can only
// come to contain itself by being modified after it was nested, or by a direct self-insert).
//
// Streaming (with a TraceSink): torch's _dump_snapshot pickles its root dict as EMPTY_DICT MARK
// key value ... SETITEMS and each list as EMPTY_LIST MARK items APPENDS (batches of 1000), so
// while a trace fills, the stack holds [root, MARK, "segments", segments, "device_traces",
// traces, MARK, trace_0, ..., trace_d, MARK, entries...]. The list pushed as the value of
// "device_traces" in the root dict, and each list pushed right above it, are recognised when
// pushed; entries appended to those go to the sink and are not stored. Whatever would let the
// tree see a streamed list again (a memo reference kept or a DUP of the root, of the traces
// list or of a trace list) stops streaming, and at STOP the tree must hold the streamed lists
// where they were assumed to go; if either fails after entries went out, the pickle is read again
// without streaming.
class Builder {
 public:
  using Node = std::shared_ptr<Value>;

  Builder(std::string_view data, const ReadOptions& opt, const MemoRefs& refs, const MappedFile* file,
          TraceSink* sink)
      : m_data(data), m_opt(opt), m_refs(refs), m_file(file), m_sink(sink), m_streaming(sink != nullptr) {
    m_slots.resize(refs.slots());
  }

  ValuePtr run() {
    while (m_pos < m_data.size()) {
      if (m_file && m_pos >= m_release_at) release_behind();
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

  // The sink saw every entry (the tree's trace lists are empty).
  bool streamed() const { return m_began; }

 private:
  std::string_view m_data;
  ReadOptions m_opt;
  const MemoRefs& m_refs;
  const MappedFile* m_file;
  std::size_t m_pos = 0;
  std::size_t m_op_offset = 0;
  std::uint8_t m_op = 0;
  std::vector<Node> m_stack;
  std::vector<std::size_t> m_marks;  // stack heights at each open MARK
  std::vector<Node> m_slots;  // referenced memo entries, by MemoRefs::slot
  std::unordered_map<std::uint64_t, Node> m_far_memo;  // referenced entries past the slots' range
  MemoLength m_memo_length;
  // Index of big dicts under construction, so that duplicate keys stay linear to merge.
  // The entry keeps its dict alive so that a popped dict's address cannot be reused meanwhile.
  struct DictIndex {
    Node keep;
    std::unordered_multimap<std::size_t, std::size_t> positions;
  };
  std::unordered_map<const Value*, DictIndex> m_dict_index;
  Node m_none, m_true, m_false;
  // Ints below 2^16 (BININT1, BININT2: sizes, line numbers), one node each, made when first met.
  std::vector<Node> m_small_ints;
  static constexpr std::int64_t kSmallInts = 1 << 16;

  // Page release of a mapped file behind the reader.
  static constexpr std::size_t kReleaseStep = std::size_t{16} << 20;
  std::size_t m_release_at = kReleaseStep;
  std::size_t m_released = 0;

  // Streaming.
  struct StreamedList {
    Value* list;
    std::size_t device;
    std::size_t count;
  };
  TraceSink* m_sink;
  bool m_streaming;
  bool m_began = false;
  // Placeholders of entries streamed early: m_stack[m_early_base, m_early_end) (0: none).
  std::size_t m_early_base = 0;
  std::size_t m_early_end = 0;
  Node m_root, m_traces;
  ValuePtr m_segments;
  std::vector<StreamedList> m_lists;

  void release_behind() {
    m_file->release(m_released, m_pos);
    m_released = m_pos;
    m_release_at = m_pos + kReleaseStep;
  }

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
  [[noreturn]] void underflow(std::size_t n, std::size_t has) const {
    fail("stack underflow (needs " + std::to_string(n) + " value" + (n == 1 ? "" : "s") + ", has " +
         std::to_string(has) + (m_marks.empty() ? "" : " above the MARK") + ")");
  }
  void need(std::size_t n) const {
    if (available() < n) underflow(n, available());
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
  // Closes the innermost MARK: the values above it are m_stack[base, end), left in place for the
  // caller to move out and then drop with m_stack.resize(base).
  std::size_t close_mark() {
    if (m_marks.empty()) fail("no MARK before it");
    std::size_t base = m_marks.back();
    m_marks.pop_back();
    return base;
  }
  // The value right below a closed MARK at `base` (what APPENDS and SETITEMS modify).
  Node& below(std::size_t base) {
    const std::size_t floor = frame_base();
    if (base <= floor) underflow(1, 0);
    return m_stack[base - 1];
  }
  void push(Node n) { m_stack.push_back(std::move(n)); }

  // --- node construction ---------------------------------------------------------------------
  Node scalar(Kind kind) {
    auto n = std::make_shared<Value>();
    n->m_kind = kind;
    return n;
  }
  Node make_int(std::int64_t v) {
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
  Node make_text(Kind kind, std::string_view s) {
    auto n = scalar(kind);
    n->m_text.assign(s.data(), s.size());
    return n;
  }
  Node make_le_int(std::string_view bytes) {
    // Small positive values of LONG1 (addresses, times) skip the public factory's string copy.
    if (!bytes.empty() && bytes.size() <= 8 && (static_cast<unsigned char>(bytes.back()) & 0x80) == 0) {
      std::uint64_t u = 0;
      for (std::size_t i = 0; i < bytes.size(); ++i)
        u |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
      return make_int(static_cast<std::int64_t>(u));
    }
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
      if (!m_dict_index.empty()) m_dict_index.erase(child.get());
    }
    std::uint32_t d = child->m_depth + 1;
    if (d > m_opt.max_depth)
      fail("nesting deeper than " + std::to_string(m_opt.max_depth) + " levels");
    parent.m_depth = std::max(parent.m_depth, d);
  }

  // A list or tuple of m_stack[base, end).
  Node make_sequence(Kind kind, std::size_t base) {
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
  void list_append(Value& list, std::size_t base) {
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
  void dict_set_items(const Node& dict_node, std::size_t base) {
    if ((m_stack.size() - base) % 2 != 0) fail("odd number of values for key/value pairs");
    if (dict_node->m_kind == Kind::dict) dict_node->m_dict.reserve(dict_node->m_dict.size() + (m_stack.size() - base) / 2);
    for (std::size_t i = base; i < m_stack.size(); i += 2) dict_set(dict_node, std::move(m_stack[i]), std::move(m_stack[i + 1]));
    m_stack.resize(base);
  }

  // --- memo ----------------------------------------------------------------------------------
  void memo_put(std::uint64_t index) {
    need(1);
    m_memo_length.insert(index);
    if (!m_refs.referenced(index)) return;  // no GET names it: nothing to keep
    const Node& node = m_stack.back();
    share(node);
    if (m_refs.dense(index))
      m_slots[m_refs.slot(index)] = node;
    else
      m_far_memo[index] = node;
  }
  void memo_get(std::uint64_t index) {
    Node* found = nullptr;
    std::size_t last = 0;
    if (m_refs.referenced(index)) {
      if (m_refs.dense(index)) {
        const std::size_t slot = m_refs.slot(index);
        if (m_slots[slot]) found = &m_slots[slot];
        last = m_refs.last_get_of_slot(slot);
      } else if (auto it = m_far_memo.find(index); it != m_far_memo.end()) {
        found = &it->second;
        last = m_refs.last_far_get(index);
      }
    }
    if (!found) fail("memo index " + std::to_string(index) + " was never stored");
    // The same node: memo sharing is kept. After its last GET the memo lets go of it.
    if (last == m_op_offset)
      push(std::move(*found));
    else
      push(*found);
  }
  std::uint64_t line_index() {
    auto line = take_line();
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (ec != std::errc() || p != line.data() + line.size()) fail("bad memo index text");
    return v;
  }
  // A node that more than one place will hold.
  void share(const Node& node) {
    node->m_shared = true;
    if (m_streaming && (node == m_root || node == m_traces || node->m_streamed)) stop_streaming();
  }

  // --- streaming -----------------------------------------------------------------------------
  // An EMPTY_LIST just pushed: is it the traces list, or a trace list inside it?
  void recognise_list() {
    const Node& list = m_stack.back();
    const std::size_t below = m_stack.size() - 1;  // values under the new list
    if (!m_root || below == 0 || m_stack[0] != m_root) return;
    if (!m_traces) {
      // The value of "device_traces" in the root dict: [root, MARK?, k, v, ..., "device_traces", list].
      const std::size_t base = m_marks.empty() ? 1 : m_marks.back();
      if (base != 1 || m_marks.size() > 1 || (below - base) % 2 != 1) return;
      const Value& key = *m_stack[below - 1];
      if (key.m_kind != Kind::string || key.m_text != "device_traces") return;
      m_traces = list;
      return;
    }
    // A trace: pushed right above the traces list (APPEND), or above a MARK right above it (APPENDS).
    std::size_t device;
    if (m_stack[below - 1] == m_traces && (m_marks.empty() || m_marks.back() < below)) {
      device = m_traces->m_items.size();
    } else if (!m_marks.empty() && m_marks.back() >= 1 && m_marks.back() <= below &&
               m_stack[m_marks.back() - 1] == m_traces) {
      device = m_traces->m_items.size() + (below - m_marks.back());
    } else {
      return;
    }
    list->m_streamed = true;
    m_lists.push_back(StreamedList{list.get(), device, 0});
  }

  // The values m_stack[base, end) appended to a streamed trace list: checked as if stored, then
  // given to the sink.
  void stream_entries(Value& list, std::size_t base) {
    if (!began()) {
      list_append(list, base);
      return;
    }
    StreamedList& s = streamed_list(list);
    for (std::size_t i = base; i < m_stack.size(); ++i) {
      if (!m_stack[i]) continue;  // went to the sink early
      adopt(list, m_stack[i]);
      m_sink->entry(s.device, s.count++, m_stack[i]);
    }
    m_early_end = 0;
  }

  // Asks the sink to begin, once; false when streaming is off.
  bool began() {
    if (!m_began && m_streaming) {
      m_began = m_sink->begin(segments_so_far());
      if (!m_began) stop_streaming();
    }
    return m_began;
  }
  StreamedList& streamed_list(const Value& list) {
    for (auto& l : m_lists)
      if (l.list == &list) return l;
    fail("internal: a streamed list that is not known");
  }

  // Early streaming: an entry is complete once the next one starts above the same MARK (torch's
  // entries are dicts, so at EMPTY_DICT). Handed to the sink then, it need not wait for the
  // APPENDS of its batch of 1000, so one entry at a time is in memory. Its stack slot is left empty
  // (a placeholder that APPENDS skips). Only an entry nothing else refers to (not shared), after
  // which every earlier one went too, so the order stays.
  void stream_early() {
    const std::size_t base = m_marks.back();
    if (base == 0 || m_stack.size() <= base || !m_stack[base - 1]) return;
    Value& list = *m_stack[base - 1];
    if (!list.m_streamed || list.m_nested) return;
    const std::size_t last = m_stack.size() - 1;
    if (last != base && m_stack[last - 1]) return;
    const Node& item = m_stack[last];
    if (!item || item->m_shared || item->m_depth + 1 > m_opt.max_depth) return;  // APPENDS reports depth
    if (!began()) return;
    StreamedList& s = streamed_list(list);
    adopt(list, item);
    m_sink->entry(s.device, s.count++, item);
    m_stack[last].reset();
    m_early_base = base;
    m_early_end = last + 1;
  }

  // With placeholders on the stack, an opcode that would read one (anything but the APPENDS that
  // ends their list's batch) means the pickle does what streaming cannot follow: read it whole.
  void guard_placeholders() const {
    std::size_t reach = 0;
    switch (m_op) {
      case APPENDS:
      case SETITEMS:
        // These read the values above the MARK and modify the one below it.
        if (!m_marks.empty() && m_marks.back() <= m_early_end && !(m_op == APPENDS && m_marks.back() == m_early_base))
          throw ReadAgainWhole{};
        return;
      case LIST: case TUPLE: case DICT: case POP_MARK:
        if (!m_marks.empty() && m_marks.back() < m_early_end) throw ReadAgainWhole{};
        return;
      case POP: case DUP: case TUPLE1: case MEMOIZE: case PUT: case BINPUT: case LONG_BINPUT: reach = 1; break;
      case APPEND: case TUPLE2: reach = 2; break;
      case SETITEM: case TUPLE3: reach = 3; break;
      default: return;
    }
    if (m_stack.size() < m_early_end + reach) throw ReadAgainWhole{};
  }

  // The root's "segments" value so far: set in the dict, or waiting above its MARK. nullptr when
  // there is none yet, or when it could still be changed (it is shared and not yet nested).
  ValuePtr segments_so_far() {
    ValuePtr found;
    for (const auto& [k, v] : m_root->m_dict)
      if (k->m_kind == Kind::string && k->m_text == "segments") found = v;
    const std::size_t base = m_marks.empty() || m_marks.front() != 1 ? m_stack.size() : 1;
    for (std::size_t i = base; i + 1 < m_stack.size() && m_stack[i + 1] != m_traces; i += 2) {
      const Value& k = *m_stack[i];
      if (k.m_kind == Kind::string && k.m_text == "segments") found = m_stack[i + 1];
    }
    if (found && found->m_shared && !found->m_nested) found = nullptr;
    m_segments = found;
    return found;
  }

  void stop_streaming() {
    if (m_began) throw ReadAgainWhole{};
    m_streaming = false;
    for (auto& l : m_lists) l.list->m_streamed = false;
    m_lists.clear();
    m_root.reset();
    m_traces.reset();
  }

  // At STOP: the tree holds every streamed list where the sink was told it is, and every list in
  // the traces is one of them; root["segments"] is what begin saw.
  void check_streamed() const {
    bool ok = m_stack.back() == m_root && m_root->find_ptr("device_traces") == m_traces &&
              m_root->find_ptr("segments") == m_segments;
    const auto& traces = m_traces->m_items;
    for (std::size_t d = 0; ok && d < traces.size(); ++d)
      if (traces[d]->m_kind == Kind::list) {
        const Value* t = traces[d].get();
        ok = t->m_streamed && std::any_of(m_lists.begin(), m_lists.end(), [&](const StreamedList& l) {
               return l.list == t && l.device == d;
             });
      }
    for (const auto& l : m_lists)
      if (ok && l.count > 0) ok = l.device < traces.size() && traces[l.device].get() == l.list;
    if (!ok) throw ReadAgainWhole{};
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
    if (m_began) check_streamed();
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
      case POP_MARK: m_stack.resize(close_mark()); return;
      case DUP:
        share(top());
        push(top());
        return;

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

      case EMPTY_LIST:
        push(make_container(Kind::list));
        if (m_streaming) recognise_list();
        return;
      case EMPTY_DICT:
        if (m_streaming && !m_marks.empty()) stream_early();
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
};

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

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw PickleError("pickle: cannot open " + path + ": " + std::strerror(errno), 0);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      ::madvise(map, size, MADV_SEQUENTIAL);
      ::close(fd);
      m_map = map;
      m_map_size = size;
      m_data = std::string_view(static_cast<const char*>(map), size);
      return;
    }
  }
  // Not a regular file (a pipe, a device), empty, or not mappable: read it.
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw PickleError("pickle: cannot read " + path + ": " + std::strerror(err), 0);
    }
    m_buffer.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  m_data = m_buffer;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this == &other) return *this;
  unmap();
  m_map = std::exchange(other.m_map, nullptr);
  m_map_size = std::exchange(other.m_map_size, 0);
  const bool buffered = other.m_data.data() == other.m_buffer.data();
  m_buffer = std::move(other.m_buffer);
  m_data = buffered ? std::string_view(m_buffer) : other.m_data;
  other.m_data = {};
  return *this;
}

MappedFile::~MappedFile() { unmap(); }

void MappedFile::unmap() noexcept {
  if (m_map) ::munmap(m_map, m_map_size);
  m_map = nullptr;
  m_map_size = 0;
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  if (!m_map) return;
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;
  end = std::min(end, m_map_size) / page * page;
  if (begin < end) ::madvise(static_cast<char*>(m_map) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace memsnap::pickle
