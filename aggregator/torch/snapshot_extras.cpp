// The snapshot's values: pickle values <-> JSON, so that every value memsnap does not interpret
// (the extras) travels through the store as text and comes back as it was.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "torch/snapshot_parts.hpp"

namespace memsnap::torch {

using namespace detail;

namespace {

// --- pickle <-> JSON -------------------------------------------------------------------------

// Extras travel as JSON (the store keeps them as text), and export must give every value back as
// it was: JSON's own types where they fit, else a one-member object with one of these tags.
constexpr const char* kTagTuple = "__tuple__";      // [items]
constexpr const char* kTagBytes = "__bytes_hex__";  // a bytes value, as hex
constexpr const char* kTagStr = "__str_hex__";      // a str whose bytes are not UTF-8, as hex
constexpr const char* kTagInt = "__int_le_hex__";   // an int beyond 64 bits: two's-complement LE, as hex
constexpr const char* kTagFloat = "__float__";      // "nan", "inf" or "-inf"
constexpr const char* kTagDict = "__dict__";        // [[key, value], ...]: a dict with a key that is not a
                                                    // UTF-8 str, or one that would read as a tag
bool is_tag(std::string_view key) {
  return key == kTagTuple || key == kTagBytes || key == kTagStr || key == kTagInt || key == kTagFloat ||
         key == kTagDict;
}

// Strict UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF), as JSON text needs:
// Python pickles a str with lone surrogates as the bytes of those surrogates.
bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 4;
    if (extra == 4 || i + extra >= s.size()) return false;  // bad lead byte, or cut short
    std::uint32_t cp = extra == 0 ? c : c & (0x3f >> extra);
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}
}  // namespace

std::string detail::hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}
namespace {
std::optional<std::string> unhex(const std::string& h) {
  if (h.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(h.size() / 2);
  for (std::size_t i = 0; i < h.size(); i += 2) {
    const int hi = digit(h[i]), lo = digit(h[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}
}  // namespace

nlohmann::json detail::text_json(const std::string& s) {
  if (valid_utf8(s)) return s;
  return nlohmann::json{{kTagStr, hex(s)}};
}

namespace {
// Extras are copied between pickle values and JSON recursively; deeper than this they are cut
// (a marker string), so a hostile pickle cannot overflow the stack on its way through.
constexpr int kMaxExtraDepth = 200;
constexpr const char* kTooDeep = "<nested too deep for memsnap>";
}  // namespace

nlohmann::json to_json(const Value& v) {
  JsonBudget budget;
  return to_json_at(v, 0, budget);
}
ValuePtr from_json(const nlohmann::json& j) { return from_json_at(j, 0); }

nlohmann::json detail::to_json_at(const Value& v, int depth, JsonBudget& budget) {
  if (depth > kMaxExtraDepth) return kTooDeep;
  budget.charge(v);
  switch (v.kind()) {
    case Kind::none: return nullptr;
    case Kind::boolean: return v.as_bool();
    case Kind::integer: return v.as_int64();
    case Kind::big_integer:
      try {
        return v.as_uint64();
      } catch (const pickle::ValueError&) {
        return nlohmann::json{{kTagInt, hex(v.int_le_bytes())}};
      }
    case Kind::floating: {
      const double d = v.as_double();
      if (std::isnan(d)) return nlohmann::json{{kTagFloat, "nan"}};
      if (std::isinf(d)) return nlohmann::json{{kTagFloat, d > 0 ? "inf" : "-inf"}};
      return d;
    }
    case Kind::string: return text_json(v.as_string());
    case Kind::bytes:
      return nlohmann::json{{kTagBytes, hex(v.as_bytes())}};
    case Kind::list:
    case Kind::tuple: {
      auto arr = nlohmann::json::array();
      for (const auto& i : v.items()) arr.push_back(to_json_at(*i, depth + 1, budget));
      if (v.is_tuple()) return nlohmann::json{{kTagTuple, std::move(arr)}};
      return arr;
    }
    case Kind::dict: {
      const auto& items = v.dict_items();
      const bool plain =
          std::all_of(items.begin(), items.end(),
                      [](const auto& kv) { return kv.first->is_string() && valid_utf8(kv.first->as_string()); }) &&
          !(items.size() == 1 && is_tag(items.front().first->as_string()));
      if (plain) {
        auto obj = nlohmann::json::object();
        for (const auto& [k, val] : items) obj[k->as_string()] = to_json_at(*val, depth + 1, budget);
        return obj;
      }
      auto pairs = nlohmann::json::array();
      for (const auto& [k, val] : items)
        pairs.push_back(
            nlohmann::json::array({to_json_at(*k, depth + 1, budget), to_json_at(*val, depth + 1, budget)}));
      return nlohmann::json{{kTagDict, std::move(pairs)}};
    }
  }
  return nullptr;
}

const nlohmann::json* detail::json_find(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

bool detail::json_has_string(const nlohmann::json* list, std::string_view s) {
  if (!list || !list->is_array()) return false;
  return std::any_of(list->begin(), list->end(),
                     [&](const nlohmann::json& k) { return k.is_string() && k.get_ref<const std::string&>() == s; });
}

ValuePtr detail::text_value(const nlohmann::json* v) {
  if (!v || !(v->is_string() || v->is_object())) return nullptr;
  ValuePtr t = from_json(*v);
  return t->is_string() ? t : nullptr;
}

ValuePtr detail::segment_pool_id(const nlohmann::json* segment_extras) {
  const nlohmann::json* p = segment_extras ? json_find(*segment_extras, "segment_pool_id") : nullptr;
  if (!p) return Value::tuple({Value::integer(0), Value::integer(0)});
  if (!p->is_array()) return from_json(*p);
  std::vector<ValuePtr> parts;  // a plain pair (as a person writes it): torch's tuple
  for (const auto& e : *p) parts.push_back(from_json(e));
  return Value::tuple(std::move(parts));
}

namespace {
// The value a one-member tagged object stands for; nullptr when it is not one (an ordinary dict).
ValuePtr from_tag(const nlohmann::json& j, int depth) {
  if (j.size() != 1 || !is_tag(j.begin().key())) return nullptr;
  const std::string& tag = j.begin().key();
  const nlohmann::json& v = j.begin().value();
  if (tag == kTagTuple && v.is_array()) {
    std::vector<ValuePtr> items;
    for (const auto& e : v) items.push_back(from_json_at(e, depth + 1));
    return Value::tuple(std::move(items));
  }
  if (tag == kTagDict && v.is_array()) {
    pickle::DictItems items;
    for (const auto& kv : v) {
      if (!kv.is_array() || kv.size() != 2) return nullptr;
      items.emplace_back(from_json_at(kv[0], depth + 1), from_json_at(kv[1], depth + 1));
    }
    return Value::dict(std::move(items));
  }
  if (tag == kTagFloat && v.is_string()) {
    const std::string& f = v.get_ref<const std::string&>();
    if (f == "nan") return Value::floating(std::numeric_limits<double>::quiet_NaN());
    if (f == "inf") return Value::floating(std::numeric_limits<double>::infinity());
    if (f == "-inf") return Value::floating(-std::numeric_limits<double>::infinity());
    return nullptr;
  }
  if (!v.is_string()) return nullptr;
  const auto raw = unhex(v.get_ref<const std::string&>());
  if (!raw) return nullptr;
  if (tag == kTagBytes) return Value::bytes(*raw);
  if (tag == kTagStr) return Value::string(*raw);
  if (tag == kTagInt && !raw->empty()) return Value::integer_from_le_bytes(*raw);
  return nullptr;
}
}  // namespace

ValuePtr detail::from_json_at(const nlohmann::json& j, int depth) {
  if (depth > kMaxExtraDepth) return Value::string(kTooDeep);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::unsigned_integer(j.get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<ValuePtr> items;
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      if (ValuePtr tagged = from_tag(j, depth)) return tagged;
      pickle::DictItems items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(items));
    }
    default: return Value::none();
  }
}

}  // namespace memsnap::torch
