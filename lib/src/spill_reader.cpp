// The spill reader: rebuilds a RankRecord from a spill file, keeping every complete record before
// any damage. The byte layout is drawn beside the writer, in spill_writer.cpp.
#include "memsnap/spill.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "event_packing.hpp"
#include "spill_records.hpp"

namespace memsnap {

using spill_records::crc;
using spill_records::BatchRecord;
using spill_records::WindowBatchesRecord;
using spill_records::WindowCloseRecord;
using spill_records::WindowOpenRecord;

namespace {

// Events are most of a spill's bytes: appended by copy alone (ByteReader::items would resize,
// value-initialising every event, then copy over it), into a vector reserved for its window.
void append_events(ByteReader& d, std::span<const char> payload, std::vector<Event>& out) {
  const auto n = d.get<std::uint32_t>();
  if (n > d.remaining() / sizeof(Event)) throw ByteReader::Short{};
  const char* p = payload.data() + (payload.size() - d.remaining());
  for (std::uint32_t i = 0; i < n; ++i, p += sizeof(Event)) {
    Event e;
    std::memcpy(static_cast<void*>(&e), p, sizeof(Event));
    out.push_back(e);
  }
}

// Events each window announces, from the record heads alone (unchecked: only a reservation, at
// most what the file's bytes can hold), so its vector grows once, not by doubling.
std::map<std::uint32_t, std::size_t> announced_events(std::span<const char> bytes) {
  std::map<std::uint32_t, std::size_t> counts;
  for (std::size_t pos = kSpillHeaderBytes; bytes.size() - pos >= kRecordHeaderBytes;) {
    std::uint32_t head[2];
    std::memcpy(head, bytes.data() + pos, sizeof head);
    if (head[1] > bytes.size() - pos - kRecordHeaderBytes) break;
    const auto type = static_cast<SpillRecord>(head[0]);
    if ((type == SpillRecord::events || type == SpillRecord::events_packed) && head[1] >= 8) {
      std::uint32_t prefix[2];
      std::memcpy(prefix, bytes.data() + pos + kRecordHeaderBytes, sizeof prefix);
      const std::size_t least = type == SpillRecord::events ? sizeof(Event) : packing::kMinPackedEventBytes;
      counts[prefix[0]] += std::min<std::size_t>(prefix[1], (head[1] - 8) / least);
    }
    pos += kRecordHeaderBytes + head[1];
  }
  return counts;
}

// What the reader keeps beside the record it rebuilds.
struct ReadState {
  std::map<std::uint32_t, std::size_t> window_index;  // window id -> index in RankRecord::windows
  std::map<std::uint32_t, std::size_t> reserve;       // window id -> events announced
  std::vector<std::vector<Event>> spare;              // event vectors of an earlier record, reused
};

// Applies one record's payload to the record being rebuilt. Throws ByteReader::Short when the
// payload is shorter than its own counts say, and std::runtime_error for inconsistent content.
void apply_record(SpillRecord type, std::span<const char> payload, RankRecord& out, ReadState& state) {
  auto& window_index = state.window_index;
  ByteReader d(payload);
  auto window_of = [&](std::uint32_t id) -> WindowRecord& {
    auto it = window_index.find(id);
    if (it == window_index.end()) throw std::runtime_error("a record for window " + std::to_string(id) + " before that window opened");
    return out.windows[it->second];
  };
  switch (type) {
    case SpillRecord::meta:
      out.meta = meta_from_json(std::string(payload.begin(), payload.end()));
      out.has_meta = true;
      break;
    case SpillRecord::frames: {
      if (d.get<std::uint32_t>() != out.frames.size()) throw std::runtime_error("frames out of sequence");
      d.items(out.frames);
      break;
    }
    case SpillRecord::stacks: {
      if (d.get<std::uint32_t>() != out.stacks.size()) throw std::runtime_error("stacks out of sequence");
      const std::size_t first = out.stacks.size();
      d.items(out.stacks);
      for (std::size_t i = first; i < out.stacks.size(); ++i) {
        for (auto id : out.stacks[i]) {
          if (id >= out.frames.size()) throw std::runtime_error("a stack names frame " + std::to_string(id) + " that was never written");
        }
      }
      break;
    }
    case SpillRecord::window_open: {
      const auto r = d.value<WindowOpenRecord>();
      if (window_index.count(r.window)) throw std::runtime_error("window " + std::to_string(r.window) + " opened twice");
      WindowRecord w;
      w.batch_start = r.batch_start;
      w.batch_end = w.batch_start;
      w.open_time_ns = r.time_ns;
      w.status = RecordStatus::truncated;  // until its close record is read
      if (auto it = state.reserve.find(r.window); it != state.reserve.end()) {
        if (!state.spare.empty()) {
          w.events = std::move(state.spare.back());
          state.spare.pop_back();
          w.events.clear();
        }
        w.events.reserve(it->second);
      }
      window_index[r.window] = out.windows.size();
      out.windows.push_back(std::move(w));
      break;
    }
    case SpillRecord::live:
      d.items(window_of(d.get<std::uint32_t>()).live_at_start);
      break;
    case SpillRecord::events:
      append_events(d, payload, window_of(d.get<std::uint32_t>()).events);
      break;
    case SpillRecord::events_packed: {
      auto& events = window_of(d.get<std::uint32_t>()).events;
      const auto n = d.get<std::uint32_t>();
      packing::unpack(payload.subspan(payload.size() - d.remaining()), n, events);
      break;
    }
    case SpillRecord::batch: {
      const auto r = d.value<BatchRecord>();
      auto& w = window_of(r.window);
      w.batches.push_back(r.mark);
      w.batch_end = std::max(w.batch_end, r.mark.batch);
      break;
    }
    case SpillRecord::segments: {
      auto& w = window_of(d.get<std::uint32_t>());
      w.segments.clear();
      d.items(w.segments);
      break;
    }
    case SpillRecord::window_close: {
      const auto r = d.value<WindowCloseRecord>();
      auto& w = window_of(r.window);
      w.batch_end = r.batch_end;
      w.close_time_ns = r.time_ns;
      w.oom = r.oom;
      w.dropped = r.dropped;
      w.closed = true;
      w.status = RecordStatus::ok;
      break;
    }
    case SpillRecord::window_batches: {
      auto r = d.value<WindowBatchesRecord>();
      auto& w = window_of(r.window);
      w.batch_method = std::move(r.method);
      w.batch_confidence = r.confidence;
      w.batch_detail = std::move(r.detail);
      if (!std::isfinite(w.batch_confidence)) throw std::runtime_error("a batch confidence that is not a number");
      break;
    }
    case SpillRecord::window_extras: {
      auto& w = window_of(d.get<std::uint32_t>());
      w.source_extras.append(payload.data() + sizeof(std::uint32_t), payload.size() - sizeof(std::uint32_t));
      break;
    }
    case SpillRecord::end:
      out.ended = true;
      if (!payload.empty()) {
        try {
          const auto j = nlohmann::json::parse(payload.begin(), payload.end());
          out.used_mpi = j.is_object() && j.value("used_mpi", false);
        } catch (const nlohmann::json::exception&) {
          throw std::runtime_error("the end record is not valid JSON");
        }
      }
      break;
    default:
      throw std::runtime_error("unknown record type " + std::to_string(static_cast<std::uint32_t>(type)));
  }
}

RankRecord read_spill_bytes(std::span<const char> bytes, const std::string& name, ReadState& state) {
  RankRecord out;
  out.path = name;
  const std::size_t magic_bytes = std::min<std::size_t>(bytes.size(), 8);
  if (std::memcmp(bytes.data(), kSpillMagic, magic_bytes) != 0) {
    throw SpillError(name + ": not a memsnap spill file (bad magic)");
  }
  if (bytes.size() < kSpillHeaderBytes) {
    // A process killed while writing its header: nothing recorded, but it was a spill.
    out.status = RecordStatus::truncated;
    out.status_detail = "the file ends inside its header (" + std::to_string(bytes.size()) + " bytes)";
    return out;
  }
  std::uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  if (version < kSpillOldestVersion || version > kSpillVersion) {
    throw SpillError(name + ": spill format version " + std::to_string(version) +
                     " is not supported (this memsnap reads versions " + std::to_string(kSpillOldestVersion) + " to " +
                     std::to_string(kSpillVersion) + ")");
  }

  state.reserve = announced_events(bytes);
  bool ended = false;
  std::size_t pos = kSpillHeaderBytes;
  auto stop = [&](RecordStatus status, const std::string& why) {
    out.status = status;
    out.status_detail = "record at byte " + std::to_string(pos) + ": " + why;
  };
  while (pos < bytes.size()) {
    if (bytes.size() - pos < kRecordHeaderBytes) {
      stop(RecordStatus::truncated, "the file ends inside a record header");
      break;
    }
    std::uint32_t head[4];
    std::memcpy(head, bytes.data() + pos, sizeof head);
    if (crc(head, 12) != head[3]) {
      stop(RecordStatus::corrupt, "damaged record header (checksum mismatch)");
      break;
    }
    const auto type = static_cast<SpillRecord>(head[0]);
    const std::uint32_t length = head[1];
    if (length > kMaxRecordPayload) {
      stop(RecordStatus::corrupt, "record length " + std::to_string(length) + " is over the limit");
      break;
    }
    if (bytes.size() - pos - kRecordHeaderBytes < length) {
      stop(RecordStatus::truncated, "the file ends inside a record (" + std::to_string(length) + " bytes announced)");
      break;
    }
    std::span<const char> payload = bytes.subspan(pos + kRecordHeaderBytes, length);
    if (crc(payload.data(), payload.size()) != head[2]) {
      stop(RecordStatus::corrupt, "damaged record payload (checksum mismatch)");
      break;
    }
    try {
      apply_record(type, payload, out, state);
    } catch (const ByteReader::Short&) {
      stop(RecordStatus::corrupt, "a record shorter than its own counts");
      break;
    } catch (const std::exception& e) {
      stop(RecordStatus::corrupt, e.what());
      break;
    }
    pos += kRecordHeaderBytes + length;
    if (type == SpillRecord::end) {
      ended = true;
      if (pos != bytes.size()) {
        stop(RecordStatus::corrupt, "bytes after the end record");
      }
      break;
    }
  }
  if (out.status == RecordStatus::ok && !ended) {
    out.status = RecordStatus::truncated;
    out.status_detail = "no end record: the process did not shut down cleanly (killed or crashed)";
  }
  // Windows that never closed take the batch of their last mark and the record's status.
  for (auto& w : out.windows) {
    if (!w.closed) w.status = out.status == RecordStatus::corrupt ? RecordStatus::corrupt : RecordStatus::truncated;
  }
  return out;
}

}  // namespace

RankRecord read_spill_bytes(std::span<const char> bytes, const std::string& name) {
  ReadState state;
  return read_spill_bytes(bytes, name, state);
}

RankRecord read_spill(const std::filesystem::path& path) { return read_spill(path, RankRecord{}); }

RankRecord read_spill(const std::filesystem::path& path, RankRecord&& reuse) {
  ReadState state;
  for (auto& w : reuse.windows) {
    if (w.events.capacity() > 0) state.spare.push_back(std::move(w.events));
  }
  std::sort(state.spare.begin(), state.spare.end(),
            [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });  // largest first out
  reuse = RankRecord{};
  // Mapped, not copied: the reader's memory is the record it builds, not twice the file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SpillError(path.string() + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw SpillError(path.string() + ": cannot stat (" + std::strerror(err) + ")");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return read_spill_bytes({}, path.string(), state);
  }
  // Populated: the whole file is read anyway, and one fault per page costs more than the copy.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw SpillError(path.string() + ": cannot map (" + std::strerror(errno) + ")");
  struct Unmap {
    void* p;
    std::size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return read_spill_bytes(std::span(static_cast<const char*>(map), size), path.string(), state);
}

namespace {

// One field of the META record's JSON into `m`, checked: whole numbers only and within the
// field's bounds (a float such as 1e300 converted to an integer is undefined), text as text.
template <class F>
void meta_field_from_json(const nlohmann::json& j, const F& f, RankMeta& m) {
  using M = typename F::Member;
  const auto it = j.find(f.name);
  if (it == j.end()) return;  // the default stays
  const std::string key = f.name;
  if constexpr (std::is_same_v<M, std::string>) {
    if (!it->is_string()) throw std::runtime_error("metadata field " + key + " is not text");
    m.*f.member = it->template get<std::string>();
  } else if constexpr (std::is_same_v<M, std::vector<std::uint64_t>>) {
    if (!it->is_array() || it->size() > 4096) throw std::runtime_error("metadata field " + key + " is not a short list");
    for (const auto& v : *it) {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.template get<std::int64_t>() >= 0)) {
        throw std::runtime_error("metadata field " + key + " holds something other than byte counts");
      }
      (m.*f.member).push_back(v.template get<std::uint64_t>());
    }
  } else {
    static_assert(std::is_integral_v<M>);
    std::int64_t v = 0;
    if (it->is_number_unsigned()) {
      const auto u = it->template get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) throw std::runtime_error("metadata field " + key + " is out of range");
      v = static_cast<std::int64_t>(u);
    } else if (it->is_number_integer()) {
      v = it->template get<std::int64_t>();
    } else {
      throw std::runtime_error("metadata field " + key + " is not a whole number");
    }
    if (v < f.lo || v > f.hi) throw std::runtime_error("metadata field " + key + " is out of range");
    m.*f.member = static_cast<M>(v);
  }
}

}  // namespace

RankMeta meta_from_json(const std::string& text) {
  RankMeta m;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error("metadata is not valid JSON");
  }
  if (!j.is_object()) throw std::runtime_error("metadata is not a JSON object");
  for_each_field<RankMeta>([&](const auto& f) { meta_field_from_json(j, f, m); });
  return m;
}

std::optional<RankMeta> read_spill_meta(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  char head[kSpillHeaderBytes + kRecordHeaderBytes];
  if (::pread(fd, head, sizeof head, 0) != static_cast<ssize_t>(sizeof head)) return std::nullopt;
  std::uint32_t version = 0;
  std::memcpy(&version, head + 8, 4);
  if (std::memcmp(head, kSpillMagic, 8) != 0 || version < kSpillOldestVersion || version > kSpillVersion) return std::nullopt;
  std::uint32_t record[4];
  std::memcpy(record, head + kSpillHeaderBytes, sizeof record);
  // META is the first record the recorder writes; a few KiB of JSON.
  if (crc(record, 12) != record[3] || record[0] != static_cast<std::uint32_t>(SpillRecord::meta) || record[1] > (1u << 20)) {
    return std::nullopt;
  }
  std::string payload(record[1], '\0');
  if (::pread(fd, payload.data(), payload.size(), sizeof head) != static_cast<ssize_t>(payload.size()) ||
      crc(payload.data(), payload.size()) != record[2]) {
    return std::nullopt;
  }
  try {
    return meta_from_json(payload);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace memsnap
