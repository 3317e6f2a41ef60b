// Inside the snapshot interop, shared by its parts: snapshot_extras.cpp (typed field access, and
// pickle values <-> JSON for the extras), snapshot_import.cpp (a snapshot into a RankRecord),
// snapshot_export.cpp and the tests' reference writer, tests/torch/snapshot_tree.cpp (a RankRecord's window back into a snapshot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "torch/pickle.hpp"
#include "torch/snapshot.hpp"

namespace memsnap::torch::detail {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using pickle::WeakValuePtr;

// --- typed field access with snapshot-level errors -------------------------------------------

[[noreturn]] inline void bad(const std::string& where, const std::string& what) {
  throw SnapshotError("torch snapshot: " + where + ": " + what);
}

inline const Value& require(const Value& dict, std::string_view key, const std::string& where) {
  if (!dict.is_dict()) bad(where, std::string("expected a dict, got ") + pickle::kind_name(dict.kind()));
  const Value* v = dict.find(key);
  if (!v) bad(where, "missing key '" + std::string(key) + "'");
  return *v;
}

// Addresses, sizes and streams: unsigned 64-bit; a negative int keeps its two's-complement bits.
inline std::uint64_t as_u64(const Value& v, const std::string& where) {
  try {
    if (v.kind() == Kind::integer || v.kind() == Kind::boolean) return static_cast<std::uint64_t>(v.as_int64());
    return v.as_uint64();
  } catch (const pickle::ValueError& e) {
    bad(where, e.what());
  }
}
inline std::int64_t as_i64(const Value& v, const std::string& where) {
  try {
    return v.as_int64();
  } catch (const pickle::ValueError& e) {
    bad(where, e.what());
  }
}
inline std::uint64_t field_u64(const Value& dict, std::string_view key, const std::string& where,
                        std::uint64_t fallback = 0) {
  const Value* v = dict.find(key);
  return v && !v->is_none() ? as_u64(*v, where + "." + std::string(key)) : fallback;
}
inline std::string field_str(const Value& dict, std::string_view key, std::string fallback = {}) {
  const Value* v = dict.find(key);
  return v && v->is_string() ? v->as_string() : fallback;
}

inline const char* block_state_name(std::uint8_t s) {
  switch (s) {
    case 1: return "active_allocated";
    case 2: return "active_pending_free";
    default: return "inactive";
  }
}
inline std::optional<std::uint8_t> block_state_from_name(std::string_view s) {
  if (s == "inactive") return 0;
  if (s == "active_allocated") return 1;
  if (s == "active_pending_free") return 2;
  return std::nullopt;
}

// --- extras as JSON --------------------------------------------------------------------------

// Lowercase hex of a string's bytes.
std::string hex(const std::string& s);
// A str as JSON: text where it is UTF-8, else a tagged hex object that export turns back.
nlohmann::json text_json(const std::string& s);

// Shared references are expanded on the way to JSON, so a small pickle whose references nest (a
// list holding the same list four times, thirty deep) would fill memory: past a floor, the values
// written may be at most kMaxExpansion times the distinct values read.
constexpr std::size_t kExtraValuesFloor = std::size_t{1} << 20;
constexpr std::size_t kMaxExpansion = 64;

class JsonBudget {
 public:
  void charge(const Value& v) {
    m_seen.insert(&v);
    if (++m_written > kExtraValuesFloor + kMaxExpansion * m_seen.size())
      bad("extras", "shared references expand to more than " + std::to_string(m_written) + " values");
  }
  // A value built for the extras (not read from the pickle) stays alive, so that its address is
  // not taken by another one while counted.
  const Value& keep(ValuePtr v) { return *m_kept.emplace_back(std::move(v)); }

 private:
  std::size_t m_written = 0;
  std::unordered_set<const Value*> m_seen;
  std::vector<ValuePtr> m_kept;
};

nlohmann::json to_json_at(const Value& v, int depth, JsonBudget& budget);
// from_json of `j` found `depth` containers deep (the depth limit counts from the top).
ValuePtr from_json_at(const nlohmann::json& j, int depth);

// --- reading the extras back (export) --------------------------------------------------------

// j[key] when j is an object that has it; nullptr otherwise.
const nlohmann::json* json_find(const nlohmann::json& j, const char* key);
// Whether `list` is an array holding the string s.
bool json_has_string(const nlohmann::json* list, std::string_view s);
// A str kept as to_json writes it (text, or hex for bytes that are not UTF-8); nullptr otherwise.
ValuePtr text_value(const nlohmann::json* v);
// A segment's segment_pool_id from its kept extras (`segment_extras` may be null): (0, 0) when
// none was kept; a plain pair, as a person writes it, becomes torch's tuple.
ValuePtr segment_pool_id(const nlohmann::json* segment_extras);

}  // namespace memsnap::torch::detail
