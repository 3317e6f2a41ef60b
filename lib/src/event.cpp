#include "memsnap/event.hpp"
#include "memsnap/record.hpp"

namespace memsnap {

namespace {
constexpr std::string_view kActionNames[kActionCount] = {
    "alloc",       "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap",  "snapshot",       "oom"};
}

std::string_view action_name(Action a) {
  const auto i = static_cast<std::size_t>(a);
  return i < kActionCount ? kActionNames[i] : std::string_view("unknown");
}

std::optional<Action> action_from_name(std::string_view name) {
  for (int i = 0; i < kActionCount; ++i) {
    if (kActionNames[i] == name) return static_cast<Action>(i);
  }
  return std::nullopt;
}

const char* status_name(RecordStatus s) {
  switch (s) {
    case RecordStatus::ok: return "ok";
    case RecordStatus::truncated: return "truncated";
    case RecordStatus::corrupt: return "corrupt";
    case RecordStatus::missing: return "missing";
  }
  return "unknown";
}

RecordStatus status_from_name(const std::string& name) {
  for (auto s : {RecordStatus::ok, RecordStatus::truncated, RecordStatus::missing}) {
    if (name == status_name(s)) return s;
  }
  return RecordStatus::corrupt;
}

}  // namespace memsnap
