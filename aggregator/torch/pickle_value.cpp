// The pickle reader's value model: construction, typed access, equality and hashing of the
// values a pickle builds (the reader itself, a stack machine over opcodes, is in pickle_reader.cpp).
#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_set>

#include "torch/pickle.hpp"

namespace memsnap::pickle {

// ---------------------------------------------------------------------------------------------
// Value

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::big_integer: return "int (big)";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
  }
  return "?";
}

Value::~Value() {
  // A long chain of nested containers would otherwise recurse once per level on destruction.
  // Children we hold the last reference to and that have children of their own are unpacked onto
  // a local worklist instead; the others (scalars, empty or still shared containers) go at once,
  // so a container of scalars costs no worklist.
  if (m_items.empty() && m_dict.empty()) return;
  std::vector<ValuePtr> pending;
  auto release = [&pending](ValuePtr& child) {
    if (child && child.use_count() == 1 && (!child->m_items.empty() || !child->m_dict.empty()))
      pending.push_back(std::move(child));
    else
      child.reset();
  };
  auto take_children = [&release](Value& v) {
    for (auto& item : v.m_items) release(item);
    for (auto& [key, value] : v.m_dict) {
      release(key);
      release(value);
    }
    v.m_items.clear();
    v.m_dict.clear();
  };
  take_children(*this);
  while (!pending.empty()) {
    ValuePtr node = std::move(pending.back());
    pending.pop_back();
    // Every Value is created non-const (make_shared<Value>), so unpacking the last owner is fine.
    if (node.use_count() == 1) take_children(const_cast<Value&>(*node));
  }
}

namespace {

[[noreturn]] void wrong_kind(const char* wanted, Kind actual) {
  throw ValueError(std::string("pickle value: expected ") + wanted + ", got " + kind_name(actual));
}

// Minimal two's-complement little-endian form: drop redundant sign bytes.
void minimise_le(std::string& bytes) {
  while (bytes.size() > 1) {
    auto last = static_cast<unsigned char>(bytes.back());
    auto prev = static_cast<unsigned char>(bytes[bytes.size() - 2]);
    if ((last == 0x00 && (prev & 0x80) == 0) || (last == 0xff && (prev & 0x80) != 0))
      bytes.pop_back();
    else
      break;
  }
}

std::string int64_le_bytes(std::int64_t v) {
  std::string out(8, '\0');
  auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  minimise_le(out);
  return out;
}

bool le_is_negative(const std::string& bytes) {
  return !bytes.empty() && (static_cast<unsigned char>(bytes.back()) & 0x80) != 0;
}

// Magnitude of a two's-complement number as little-endian 32-bit limbs.
std::vector<std::uint32_t> le_magnitude(std::string bytes, bool& negative) {
  negative = le_is_negative(bytes);
  if (negative) {  // negate: invert and add one
    unsigned carry = 1;
    for (auto& c : bytes) {
      unsigned v = static_cast<unsigned char>(~static_cast<unsigned char>(c)) + carry;
      c = static_cast<char>(v & 0xff);
      carry = v >> 8;
    }
  }
  std::vector<std::uint32_t> limbs((bytes.size() + 3) / 4, 0);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    limbs[i / 4] |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << (8 * (i % 4));
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  return limbs;
}

}  // namespace

ValuePtr Value::none() {
  return make_node<Value>();  // not one shared node: counts are not atomic (pickle.hpp)
}
ValuePtr Value::boolean(bool b) {
  auto v = make_node<Value>();
  v->m_kind = Kind::boolean;
  v->m_bool = b;
  return v;
}
ValuePtr Value::integer(std::int64_t i) {
  auto v = make_node<Value>();
  v->m_kind = Kind::integer;
  v->m_int = i;
  return v;
}
ValuePtr Value::unsigned_integer(std::uint64_t u) {
  if (u <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(u));
  std::string bytes(9, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return integer_from_le_bytes(bytes);
}
ValuePtr Value::integer_from_le_bytes(std::string_view raw) {
  std::string bytes(raw);
  if (bytes.empty()) return integer(0);
  minimise_le(bytes);
  if (bytes.size() <= 8) {
    std::uint64_t u = le_is_negative(bytes) ? ~std::uint64_t{0} : 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      u &= ~(std::uint64_t{0xff} << (8 * i));
      u |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    }
    return integer(static_cast<std::int64_t>(u));
  }
  auto v = make_node<Value>();
  v->m_kind = Kind::big_integer;
  v->m_text = std::move(bytes);
  return v;
}
ValuePtr Value::floating(double d) {
  auto v = make_node<Value>();
  v->m_kind = Kind::floating;
  v->m_float = d;
  return v;
}
ValuePtr Value::string(std::string s) {
  auto v = make_node<Value>();
  v->m_kind = Kind::string;
  v->m_text = std::move(s);
  return v;
}
ValuePtr Value::bytes(std::string b) {
  auto v = make_node<Value>();
  v->m_kind = Kind::bytes;
  v->m_text = std::move(b);
  return v;
}
namespace {
std::uint32_t child_depth(const ValuePtr& p) { return p ? p->depth() + 1 : 1; }
}  // namespace
ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto v = make_node<Value>();
  v->m_kind = Kind::list;
  v->m_depth = 1;
  for (const auto& i : items) v->m_depth = std::max(v->m_depth, child_depth(i));
  v->m_items = std::move(items);
  return v;
}
ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  auto v = make_node<Value>();
  v->m_kind = Kind::tuple;
  v->m_depth = 1;
  for (const auto& i : items) v->m_depth = std::max(v->m_depth, child_depth(i));
  v->m_items = std::move(items);
  return v;
}
ValuePtr Value::dict(DictItems items) {
  auto v = make_node<Value>();
  v->m_kind = Kind::dict;
  v->m_depth = 1;
  for (const auto& [k, val] : items)
    v->m_depth = std::max({v->m_depth, child_depth(k), child_depth(val)});
  v->m_dict = std::move(items);
  return v;
}

bool Value::as_bool() const {
  if (m_kind != Kind::boolean) wrong_kind("bool", m_kind);
  return m_bool;
}
std::int64_t Value::as_int64() const {
  if (m_kind == Kind::integer) return m_int;
  if (m_kind == Kind::boolean) return m_bool ? 1 : 0;
  if (m_kind == Kind::big_integer)
    throw ValueError("pickle value: integer " + int_decimal() + " does not fit in int64");
  wrong_kind("int", m_kind);
}
std::uint64_t Value::as_uint64() const {
  if (m_kind == Kind::integer || m_kind == Kind::boolean) {
    std::int64_t v = as_int64();
    if (v < 0) throw ValueError("pickle value: integer " + std::to_string(v) + " is negative");
    return static_cast<std::uint64_t>(v);
  }
  if (m_kind == Kind::big_integer) {
    // Minimal form of a value in (INT64_MAX, UINT64_MAX] is 8 bytes plus a 0x00 sign byte.
    if (m_text.size() == 9 && m_text[8] == '\0') {
      std::uint64_t u = 0;
      for (int i = 0; i < 8; ++i)
        u |= static_cast<std::uint64_t>(static_cast<unsigned char>(m_text[i])) << (8 * i);
      return u;
    }
    throw ValueError("pickle value: integer " + int_decimal() + " does not fit in uint64");
  }
  wrong_kind("int", m_kind);
}
double Value::as_double() const {
  if (m_kind == Kind::floating) return m_float;
  if (m_kind == Kind::integer) return static_cast<double>(m_int);
  if (m_kind == Kind::boolean) return m_bool ? 1.0 : 0.0;
  wrong_kind("float", m_kind);
}
const std::string& Value::as_string() const {
  if (m_kind != Kind::string) wrong_kind("str", m_kind);
  return m_text;
}
const std::string& Value::as_bytes() const {
  if (m_kind != Kind::bytes) wrong_kind("bytes", m_kind);
  return m_text;
}
std::string Value::int_le_bytes() const {
  if (m_kind == Kind::big_integer) return m_text;
  return int64_le_bytes(as_int64());
}
std::string Value::int_decimal() const {
  if (m_kind != Kind::big_integer) return std::to_string(as_int64());
  bool negative = false;
  auto limbs = le_magnitude(m_text, negative);
  std::string digits;
  while (!limbs.empty()) {  // repeated division by 10^9
    std::uint64_t rem = 0;
    for (std::size_t i = limbs.size(); i-- > 0;) {
      std::uint64_t cur = (rem << 32) | limbs[i];
      limbs[i] = static_cast<std::uint32_t>(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
    std::string chunk = std::to_string(rem);
    if (!limbs.empty()) chunk.insert(0, 9 - chunk.size(), '0');
    digits.insert(0, chunk);
  }
  if (digits.empty()) digits = "0";
  return negative ? "-" + digits : digits;
}
const std::vector<ValuePtr>& Value::items() const {
  if (m_kind != Kind::list && m_kind != Kind::tuple) wrong_kind("list or tuple", m_kind);
  return m_items;
}
const DictItems& Value::dict_items() const {
  if (m_kind != Kind::dict) wrong_kind("dict", m_kind);
  return m_dict;
}
std::size_t Value::size() const {
  if (m_kind == Kind::dict) return m_dict.size();
  if (m_kind == Kind::list || m_kind == Kind::tuple) return m_items.size();
  return 0;
}
const Value* Value::find(std::string_view key) const {
  if (m_kind != Kind::dict) return nullptr;
  // Snapshot dicts have about a dozen keys: a linear scan beats hashing.
  for (const auto& [k, v] : m_dict)
    if (k->m_kind == Kind::string && k->m_text == key) return v.get();
  return nullptr;
}
ValuePtr Value::find_ptr(std::string_view key) const {
  if (m_kind != Kind::dict) return nullptr;
  for (const auto& [k, v] : m_dict)
    if (k->m_kind == Kind::string && k->m_text == key) return v;
  return nullptr;
}
const Value& Value::at(std::string_view key) const {
  if (m_kind != Kind::dict) wrong_kind("dict", m_kind);
  const Value* v = find(key);
  if (!v) throw ValueError("pickle value: dict has no key '" + std::string(key) + "'");
  return *v;
}
const Value& Value::at(std::size_t index) const {
  const auto& all = items();
  if (index >= all.size())
    throw ValueError("pickle value: index " + std::to_string(index) + " past the end (size " +
                     std::to_string(all.size()) + ")");
  return *all[index];
}

namespace {
bool is_numeric(Kind k) {
  return k == Kind::boolean || k == Kind::integer || k == Kind::floating;
}
}  // namespace

bool Value::equals(const Value& o) const {
  if (this == &o) return true;
  if (is_numeric(m_kind) && is_numeric(o.m_kind)) {
    if (m_kind == Kind::floating || o.m_kind == Kind::floating) return as_double() == o.as_double();
    return as_int64() == o.as_int64();
  }
  if (m_kind != o.m_kind) return false;
  switch (m_kind) {
    case Kind::none: return true;
    case Kind::big_integer:
    case Kind::string:
    case Kind::bytes: return m_text == o.m_text;
    case Kind::list:
    case Kind::tuple:
      if (m_items.size() != o.m_items.size()) return false;
      for (std::size_t i = 0; i < m_items.size(); ++i)
        if (!m_items[i]->equals(*o.m_items[i])) return false;
      return true;
    case Kind::dict:
      if (m_dict.size() != o.m_dict.size()) return false;
      for (const auto& [k, v] : m_dict) {
        bool found = false;
        for (const auto& [ok, ov] : o.m_dict) {
          if (k->equals(*ok)) {
            found = v->equals(*ov);
            break;
          }
        }
        if (!found) return false;
      }
      return true;
    default: return false;
  }
}

bool Value::is_hashable() const {
  switch (m_kind) {
    case Kind::list:
    case Kind::dict: return false;
    case Kind::tuple:
      return std::all_of(m_items.begin(), m_items.end(), [](const ValuePtr& i) { return i->is_hashable(); });
    default: return true;
  }
}

std::size_t Value::hash() const {
  switch (m_kind) {
    case Kind::none: return 0x9e3779b9u;
    case Kind::boolean:
    case Kind::integer: return std::hash<std::int64_t>{}(as_int64());
    case Kind::floating: {
      // Integral floats hash like the equal int, as 1.0 == 1 in Python.
      double d = m_float;
      if (d >= -9.2e18 && d <= 9.2e18 && d == static_cast<double>(static_cast<std::int64_t>(d)))
        return std::hash<std::int64_t>{}(static_cast<std::int64_t>(d));
      return std::hash<double>{}(d);
    }
    case Kind::big_integer: return std::hash<std::string>{}(m_text) ^ 0x51;
    case Kind::string: return std::hash<std::string>{}(m_text);
    case Kind::bytes: return std::hash<std::string>{}(m_text) ^ 0xb7;
    case Kind::tuple: {
      std::size_t h = 0x345678;
      for (const auto& i : m_items) h = h * 1000003u ^ i->hash();
      return h;
    }
    default: return 0;
  }
}

TreeStats tree_stats(const ValuePtr& root) {
  TreeStats stats;
  if (!root) return stats;
  std::unordered_set<const Value*> seen;
  std::vector<const Value*> todo{root.get()};
  seen.insert(root.get());
  stats.references = 1;
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    auto visit = [&](const ValuePtr& child) {
      ++stats.references;
      if (seen.insert(child.get()).second) todo.push_back(child.get());
    };
    if (v->kind() == Kind::list || v->kind() == Kind::tuple)
      for (const auto& c : v->items()) visit(c);
    if (v->kind() == Kind::dict)
      for (const auto& [k, val] : v->dict_items()) {
        visit(k);
        visit(val);
      }
  }
  stats.unique_nodes = seen.size();
  return stats;
}

}  // namespace memsnap::pickle
