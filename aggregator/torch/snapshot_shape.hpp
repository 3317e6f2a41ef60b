// What export cannot rebuild from a record, noted at import (snapshot_shape.cpp): the type export
// writes each key of a segment, block and trace entry with, and a dict's keys that are absent,
// of another type, or unknown to memsnap.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "torch/snapshot_parts.hpp"

namespace memsnap::torch::detail {

// The type export writes a key with, from the record.
enum class Shape : std::uint8_t { u64, i64, i16, str, pool, boolean, list, any };

inline bool fits(const Value& v, Shape shape) {
  switch (shape) {
    case Shape::u64:
      if (v.kind() == Kind::integer) return v.as_int64() >= 0;
      if (v.kind() != Kind::big_integer) return false;
      try {
        (void)v.as_uint64();
        return true;
      } catch (const pickle::ValueError&) {
        return false;
      }
    case Shape::i64:
      return v.kind() == Kind::integer;
    case Shape::i16:
      return v.kind() == Kind::integer && v.as_int64() >= std::numeric_limits<std::int16_t>::min() &&
             v.as_int64() <= std::numeric_limits<std::int16_t>::max();
    case Shape::str:
      return v.is_string();
    case Shape::pool:
      return v.is_string() && v.as_string().size() < 32;  // the store keeps 31 bytes
    case Shape::boolean:
      return v.kind() == Kind::boolean;
    case Shape::list:
      return v.is_list();
    case Shape::any:
      return true;
  }
  return false;
}

struct KeySpec {
  std::string_view key;
  Shape shape;
};
inline constexpr KeySpec kSegmentKeys[] = {{"device", Shape::i16},          {"address", Shape::u64},
                                           {"total_size", Shape::u64},      {"allocated_size", Shape::u64},
                                           {"active_size", Shape::u64},     {"requested_size", Shape::u64},
                                           {"stream", Shape::u64},          {"segment_type", Shape::pool},
                                           {"segment_pool_id", Shape::any}, {"is_expandable", Shape::boolean},
                                           {"frames", Shape::list},         {"blocks", Shape::list}};
inline constexpr KeySpec kBlockKeys[] = {{"address", Shape::u64},
                                         {"size", Shape::u64},
                                         {"requested_size", Shape::u64},
                                         {"state", Shape::str},
                                         {"frames", Shape::list}};

// What a dict (segment, block, trace entry) holds beyond what export writes back from the record:
// "absent", the keys of `written` that it lacks or holds with another type (export leaves them
// out), and "other", those values and the keys memsnap does not know (export writes them as they
// were). Empty for the dicts torch 2.11 writes.
struct ShapeNotes {
  std::vector<std::string_view> absent;
  pickle::DictItems other;
};
ShapeNotes note_shape(const Value& dict, std::span<const KeySpec> written);
// Writes the notes into x; `skip` names absent keys that x need not list (noted elsewhere).
void put_notes(const ShapeNotes& n, nlohmann::json& x, JsonBudget& budget,
               std::span<const std::string_view> skip = {});
// Frame lists are interned into the record when they are lists (each frame as name, filename,
// line); anything else stays in the extras as it was.
bool internable_frames(const ValuePtr& frames);

// Where an entry's keys are, found in one pass over its items (the first of a repeated key).
enum EntryKey : std::uint8_t {
  kAction, kAddr, kSize, kStream, kTimeUs, kCompileContext, kUserMetadata, kFrames, kDeviceFree, kEntryKeyCount,
  kOtherKey = kEntryKeyCount,
};
inline constexpr std::string_view kEntryKeyNames[] = {"action",          "addr",          "size",   "stream",
                                                      "time_us",         "compile_context", "user_metadata",
                                                      "frames",          "device_free"};
inline EntryKey entry_key_of(std::string_view k) {
  for (std::uint8_t i = 0; i < kEntryKeyCount; ++i)
    if (k == kEntryKeyNames[i]) return static_cast<EntryKey>(i);
  return kOtherKey;
}
inline EntryKey entry_key(const Value& key) { return key.is_string() ? entry_key_of(key.as_string()) : kOtherKey; }
// The type export writes each key with (the Shape of note_shape's KeySpec).
inline Shape entry_key_shape(EntryKey k) {
  switch (k) {
    case kTimeUs: return Shape::i64;
    case kAction: case kCompileContext: case kUserMetadata: return Shape::str;
    case kFrames: return Shape::list;
    default: return Shape::u64;
  }
}

// Field access that formats the place only on error.
template <typename Where>
std::uint64_t entry_u64(const Value* v, const Where& where, std::string_view key) {
  if (!v || v->is_none()) return 0;
  if (v->kind() == Kind::integer) return static_cast<std::uint64_t>(v->as_int64());
  return as_u64(*v, where() + "." + std::string(key));
}

}  // namespace memsnap::torch::detail
