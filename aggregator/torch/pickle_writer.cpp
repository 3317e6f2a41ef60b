// Protocol-4 writer: PROTO, then opcodes grouped into FRAMEs that end only at opcode boundaries
// (Python's pure-Python unpickler rejects an opcode that straddles two frames).
#include "torch/pickle_writer.hpp"

#include <algorithm>
#include <bit>
#include <unordered_map>
#include <vector>

namespace memsnap::pickle {
namespace {

constexpr std::size_t kFrameTarget = 64 * 1024;  // Python's _FRAME_SIZE_TARGET
constexpr std::size_t kBatch = 1000;             // items per APPENDS/SETITEMS, as Python does
constexpr std::uint32_t kMaxDepth = 10000;

bool worth_memoising(Kind k) {
  return k == Kind::string || k == Kind::bytes || k == Kind::big_integer || k == Kind::list || k == Kind::tuple ||
         k == Kind::dict;
}

void put_le(std::string& s, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

// Minimal two's-complement little-endian bytes of v (Python's LONG1 payload).
std::string int_le(std::int64_t v) {
  std::string out;
  put_le(out, static_cast<std::uint64_t>(v), 8);
  while (out.size() > 1) {
    const auto last = static_cast<unsigned char>(out.back());
    const auto prev = static_cast<unsigned char>(out[out.size() - 2]);
    if ((last == 0x00 && (prev & 0x80) == 0) || (last == 0xff && (prev & 0x80) != 0))
      out.pop_back();
    else
      break;
  }
  return out;
}

}  // namespace

// --- Writer --------------------------------------------------------------------------------------

Writer::Writer(ByteSink sink, const WriteOptions& opt) : m_sink(std::move(sink)), m_opt(opt) {
  m_sink(std::string_view("\x80\x04", 2));  // PROTO 4
}

void Writer::commit_frame() {
  if (m_opt.frames && m_frame.size() >= 4) {
    std::string header(1, '\x95');  // FRAME
    put_le(header, m_frame.size(), 8);
    m_sink(header);
  }
  m_sink(m_frame);
  m_frame.clear();
}
void Writer::begin_op() {
  if (m_frame.size() >= kFrameTarget) commit_frame();
}
void Writer::op(char code) {
  begin_op();
  m_frame += code;
}
void Writer::op_sized(char op1, char op4, char op8, std::string_view payload) {
  begin_op();
  const std::uint64_t n = payload.size();
  if (n < 256 && op1) {
    m_frame += op1;
    put_le(m_frame, n, 1);
  } else if (n <= 0xffffffffu) {
    m_frame += op4;
    put_le(m_frame, n, 4);
  } else {
    m_frame += op8;
    put_le(m_frame, n, 8);
  }
  m_frame += payload;
}

void Writer::none() {
  op('N');
}
void Writer::boolean(bool b) {
  op(b ? '\x88' : '\x89');
}
void Writer::integer(std::int64_t i) {
  begin_op();
  if (i >= 0 && i < 256) {
    m_frame += 'K';  // BININT1
    put_le(m_frame, static_cast<std::uint64_t>(i), 1);
  } else if (i >= 0 && i < 65536) {
    m_frame += 'M';  // BININT2
    put_le(m_frame, static_cast<std::uint64_t>(i), 2);
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    m_frame += 'J';  // BININT
    put_le(m_frame, static_cast<std::uint32_t>(static_cast<std::int32_t>(i)), 4);
  } else {
    long_integer(int_le(i));
  }
}
void Writer::unsigned_integer(std::uint64_t u) {
  if (u <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(u));
  std::string bytes;  // above INT64_MAX: eight bytes and a zero sign byte
  put_le(bytes, u, 8);
  bytes += '\0';
  long_integer(bytes);
}
void Writer::long_integer(std::string_view le_bytes) {
  begin_op();
  if (le_bytes.size() < 256) {
    m_frame += '\x8a';  // LONG1
    put_le(m_frame, le_bytes.size(), 1);
  } else {
    m_frame += '\x8b';  // LONG4
    put_le(m_frame, le_bytes.size(), 4);
  }
  m_frame += le_bytes;
}
void Writer::floating(double d) {
  begin_op();
  m_frame += 'G';  // BINFLOAT, big-endian
  const auto bits = std::bit_cast<std::uint64_t>(d);
  for (int i = 7; i >= 0; --i) m_frame += static_cast<char>((bits >> (8 * i)) & 0xff);
}
void Writer::string(std::string_view s) {
  op_sized('\x8c', 'X', '\x8d', s);
}  // SHORT_BINUNICODE...
void Writer::empty_list() {
  op(']');
}
void Writer::empty_dict() {
  op('}');
}

std::uint32_t Writer::memoize() {
  op('\x94');  // MEMOIZE
  return m_memo++;
}
void Writer::get(std::uint32_t index) {
  begin_op();
  if (index < 256) {
    m_frame += 'h';  // BINGET
    put_le(m_frame, index, 1);
  } else {
    m_frame += 'j';  // LONG_BINGET
    put_le(m_frame, index, 4);
  }
}

void Writer::finish() {
  op('.');  // STOP
  commit_frame();
}

void Writer::Batches::begin_item() {
  if (m_done % kBatch != 0) return;
  m_single = std::min(kBatch, m_count - m_done) == 1;
  if (!m_single) m_w.op('(');  // MARK
}
void Writer::Batches::end_item() {
  ++m_done;
  if (m_done % kBatch != 0 && m_done != m_count) return;
  if (m_dict)
    m_w.op(m_single ? 's' : 'u');  // SETITEM, SETITEMS
  else
    m_w.op(m_single ? 'a' : 'e');  // APPEND, APPENDS
}

// --- whole trees -----------------------------------------------------------------------------------

// Writes a value tree. With reference counts, a node reached more than once is memoised where it
// is first written and fetched after; without, every node is written in full.
class TreeEmitter {
 public:
  using Refs = std::unordered_map<const Value*, std::uint32_t>;
  TreeEmitter(Writer& w, const Refs* refs) : m_w(w), m_refs(refs) {}

  void emit(const Value& v) {
    if (m_refs) {
      if (auto it = m_memo.find(&v); it != m_memo.end()) return m_w.get(it->second);
    }
    switch (v.kind()) {
      case Kind::none:
        return m_w.none();
      case Kind::boolean:
        return m_w.boolean(v.as_bool());
      case Kind::integer:
        m_w.integer(v.as_int64());
        break;
      case Kind::big_integer:
        m_w.long_integer(v.int_le_bytes());
        break;
      case Kind::floating:
        return m_w.floating(v.as_double());
      case Kind::string:
        m_w.string(v.as_string());
        break;
      case Kind::bytes:
        m_w.op_sized('C', 'B', '\x8e', v.as_bytes());
        break;  // SHORT_BINBYTES...
      case Kind::list: {
        m_w.empty_list();
        maybe_memoise(v);
        Writer::Batches batches(m_w, v.items().size(), false);
        for (const auto& item : v.items()) {
          batches.begin_item();
          emit(deref(item));
          batches.end_item();
        }
        return;
      }
      case Kind::dict: {
        m_w.empty_dict();
        maybe_memoise(v);
        Writer::Batches batches(m_w, v.dict_items().size(), true);
        for (const auto& [key, value] : v.dict_items()) {
          batches.begin_item();
          emit(deref(key));
          emit(deref(value));
          batches.end_item();
        }
        return;
      }
      case Kind::tuple: {
        const auto& items = v.items();
        if (items.empty()) {
          m_w.op(')');  // EMPTY_TUPLE
        } else if (items.size() <= 3) {
          for (const auto& i : items) emit(deref(i));
          m_w.op(static_cast<char>(0x85 + items.size() - 1));  // TUPLE1..3
        } else {
          m_w.op('(');
          for (const auto& i : items) emit(deref(i));
          m_w.op('t');  // TUPLE
        }
        break;
      }
    }
    maybe_memoise(v);
  }

 private:
  static const Value& deref(const ValuePtr& p) {
    if (!p) throw ValueError("pickle write: null value inside a container");
    return *p;
  }
  void maybe_memoise(const Value& v) {
    if (!m_refs || !worth_memoising(v.kind())) return;
    if (auto it = m_refs->find(&v); it != m_refs->end() && it->second > 1) m_memo.emplace(&v, m_w.memoize());
  }

  Writer& m_w;
  const Refs* m_refs;
  std::unordered_map<const Value*, std::uint32_t> m_memo;  // node -> memo index once written
};

void Writer::value(const Value& v) {
  if (v.depth() > kMaxDepth) throw ValueError("pickle write: value nested deeper than 10000 levels");
  TreeEmitter(*this, nullptr).emit(v);
}

namespace {

// How often each node is reached (each container's children counted once, however often the
// container itself is reached).
TreeEmitter::Refs count_references(const ValuePtr& root) {
  TreeEmitter::Refs refs;
  std::vector<const Value*> todo{root.get()};
  refs[root.get()] = 1;
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    auto visit = [&](const ValuePtr& child) {
      if (!child) throw ValueError("pickle write: null value inside a container");
      if (refs[child.get()]++ == 0) todo.push_back(child.get());
    };
    if (v->kind() == Kind::list || v->kind() == Kind::tuple)
      for (const auto& c : v->items()) visit(c);
    else if (v->kind() == Kind::dict)
      for (const auto& [k, val] : v->dict_items()) {
        visit(k);
        visit(val);
      }
  }
  return refs;
}

}  // namespace

std::string write(const ValuePtr& root, const WriteOptions& opt) {
  if (!root) throw ValueError("pickle write: null value");
  if (root->depth() > kMaxDepth) throw ValueError("pickle write: value nested deeper than 10000 levels");
  const TreeEmitter::Refs refs = count_references(root);
  std::string out;
  Writer w([&out](std::string_view bytes) { out += bytes; }, opt);
  TreeEmitter(w, &refs).emit(*root);
  w.finish();
  return out;
}

}  // namespace memsnap::pickle
