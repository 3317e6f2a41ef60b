// Protocol-4 writer: PROTO, then opcodes grouped into FRAMEs that end only at opcode boundaries
// (Python's pure-Python unpickler rejects an opcode that straddles two frames).
#include "torch/pickle_writer.hpp"

#include <bit>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace memsnap::pickle {
namespace {

constexpr std::size_t kFrameTarget = 64 * 1024;  // Python's _FRAME_SIZE_TARGET
constexpr std::size_t kBatch = 1000;             // items per APPENDS/SETITEMS, as Python does
constexpr std::uint32_t kMaxDepth = 10000;

bool worth_memoising(Kind k) {
  return k == Kind::string || k == Kind::bytes || k == Kind::big_integer || k == Kind::list ||
         k == Kind::tuple || k == Kind::dict;
}

class Emitter {
 public:
  explicit Emitter(const WriteOptions& opt) : m_opt(opt) {}

  std::string run(const ValuePtr& root) {
    if (!root) throw ValueError("pickle write: null value");
    if (root->depth() > kMaxDepth) throw ValueError("pickle write: value nested deeper than 10000 levels");
    count_references(root);
    m_out += '\x80';
    m_out += '\x04';
    emit(root);
    begin_op();
    m_frame += '.';  // STOP
    commit_frame();
    return std::move(m_out);
  }

 private:
  WriteOptions m_opt;
  std::string m_out;
  std::string m_frame;
  std::unordered_map<const Value*, std::uint32_t> m_refs;  // how often each node is reached
  std::unordered_map<const Value*, std::uint32_t> m_memo;  // node -> memo index once written

  void count_references(const ValuePtr& root) {
    std::vector<const Value*> todo{root.get()};
    m_refs[root.get()] = 1;
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      auto visit = [&](const ValuePtr& child) {
        if (!child) throw ValueError("pickle write: null value inside a container");
        if (m_refs[child.get()]++ == 0) todo.push_back(child.get());
      };
      if (v->kind() == Kind::list || v->kind() == Kind::tuple)
        for (const auto& c : v->items()) visit(c);
      else if (v->kind() == Kind::dict)
        for (const auto& [k, val] : v->dict_items()) {
          visit(k);
          visit(val);
        }
    }
  }

  void commit_frame() {
    if (m_opt.frames && m_frame.size() >= 4) {
      m_out += '\x95';
      put_le(m_out, m_frame.size(), 8);
    }
    m_out += m_frame;
    m_frame.clear();
  }
  void begin_op() {
    if (m_frame.size() >= kFrameTarget) commit_frame();
  }
  static void put_le(std::string& s, std::uint64_t v, int width) {
    for (int i = 0; i < width; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void op(char code) {
    begin_op();
    m_frame += code;
  }
  void op_sized(char op1, char op4, char op8, const std::string& payload) {
    begin_op();
    std::uint64_t n = payload.size();
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

  // Returns true when the node was written before and a memo reference was emitted instead.
  bool emit_memo_get(const Value* v) {
    auto it = m_memo.find(v);
    if (it == m_memo.end()) return false;
    begin_op();
    if (it->second < 256) {
      m_frame += 'h';  // BINGET
      put_le(m_frame, it->second, 1);
    } else {
      m_frame += 'j';  // LONG_BINGET
      put_le(m_frame, it->second, 4);
    }
    return true;
  }
  void maybe_memoise(const Value* v) {
    if (m_refs[v] > 1 && worth_memoising(v->kind())) {
      auto index = static_cast<std::uint32_t>(m_memo.size());
      m_memo.emplace(v, index);
      op('\x94');  // MEMOIZE
    }
  }

  void emit_int(const Value& v) {
    if (v.kind() == Kind::integer) {
      std::int64_t i = v.as_int64();
      begin_op();
      if (i >= 0 && i < 256) {
        m_frame += 'K';
        put_le(m_frame, static_cast<std::uint64_t>(i), 1);
        return;
      }
      if (i >= 0 && i < 65536) {
        m_frame += 'M';
        put_le(m_frame, static_cast<std::uint64_t>(i), 2);
        return;
      }
      if (i >= INT32_MIN && i <= INT32_MAX) {
        m_frame += 'J';
        put_le(m_frame, static_cast<std::uint32_t>(static_cast<std::int32_t>(i)), 4);
        return;
      }
    }
    std::string bytes = v.int_le_bytes();
    begin_op();
    if (bytes.size() < 256) {
      m_frame += '\x8a';  // LONG1
      put_le(m_frame, bytes.size(), 1);
    } else {
      m_frame += '\x8b';  // LONG4
      put_le(m_frame, bytes.size(), 4);
    }
    m_frame += bytes;
  }

  void emit(const ValuePtr& node) {
    const Value& v = *node;
    if (emit_memo_get(&v)) return;
    switch (v.kind()) {
      case Kind::none: op('N'); return;
      case Kind::boolean: op(v.as_bool() ? '\x88' : '\x89'); return;
      case Kind::integer:
      case Kind::big_integer: emit_int(v); break;
      case Kind::floating: {
        begin_op();
        m_frame += 'G';
        auto bits = std::bit_cast<std::uint64_t>(v.as_double());
        for (int i = 7; i >= 0; --i) m_frame += static_cast<char>((bits >> (8 * i)) & 0xff);
        return;
      }
      case Kind::string: op_sized('\x8c', 'X', '\x8d', v.as_string()); break;
      case Kind::bytes: op_sized('C', 'B', '\x8e', v.as_bytes()); break;
      case Kind::list: {
        op(']');
        maybe_memoise(&v);
        const auto& items = v.items();
        for (std::size_t start = 0; start < items.size(); start += kBatch) {
          std::size_t end = std::min(items.size(), start + kBatch);
          if (end - start == 1) {
            emit(items[start]);
            op('a');  // APPEND
            continue;
          }
          op('(');
          for (std::size_t i = start; i < end; ++i) emit(items[i]);
          op('e');  // APPENDS
        }
        return;
      }
      case Kind::dict: {
        op('}');
        maybe_memoise(&v);
        const auto& items = v.dict_items();
        for (std::size_t start = 0; start < items.size(); start += kBatch) {
          std::size_t end = std::min(items.size(), start + kBatch);
          if (end - start == 1) {
            emit(items[start].first);
            emit(items[start].second);
            op('s');  // SETITEM
            continue;
          }
          op('(');
          for (std::size_t i = start; i < end; ++i) {
            emit(items[i].first);
            emit(items[i].second);
          }
          op('u');  // SETITEMS
        }
        return;
      }
      case Kind::tuple: {
        const auto& items = v.items();
        if (items.empty()) {
          op(')');
        } else if (items.size() <= 3) {
          for (const auto& i : items) emit(i);
          op(static_cast<char>(0x85 + items.size() - 1));  // TUPLE1..3
        } else {
          op('(');
          for (const auto& i : items) emit(i);
          op('t');
        }
        break;
      }
    }
    maybe_memoise(&v);
  }
};

}  // namespace

std::string write(const ValuePtr& root, const WriteOptions& opt) {
  Emitter emitter(opt);
  return emitter.run(root);
}

}  // namespace memsnap::pickle
