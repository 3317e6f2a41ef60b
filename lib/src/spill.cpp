// Spill writer and reader, side by side; the byte layout is drawn in memsnap/spill.hpp.
#include "memsnap/spill.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "crc32c.hpp"
#include "event_packing.hpp"
#include "memsnap/codec.hpp"
#include "memsnap/record_fields.hpp"

namespace memsnap {
namespace {

std::uint32_t crc(const void* data, std::size_t n, std::uint32_t seed = 0) { return crc32c(data, n, seed); }

template <class T>
std::span<const char> bytes_of(std::span<const T> items) {
  return {reinterpret_cast<const char*>(items.data()), items.size_bytes()};
}

// The fixed parts of the small records (spill.hpp draws them); the others are a u32 prefix and
// one value of the event model, laid out by its table in memsnap/record_fields.hpp.
struct WindowOpenRecord {
  std::uint32_t window = 0;
  std::int64_t batch_start = 0;
  std::int64_t time_ns = 0;
};
struct BatchRecord {
  std::uint32_t window = 0;
  BatchMark mark;
};
struct WindowCloseRecord {
  std::uint32_t window = 0;
  std::int64_t batch_end = 0;
  std::int64_t time_ns = 0;
  bool oom = false;
  std::uint64_t dropped = 0;
};
struct WindowBatchesRecord {
  std::uint32_t window = 0;
  std::string method;
  double confidence = 1.0;
  std::string detail;
};

}  // namespace

template <>
struct Fields<WindowOpenRecord> {
  static constexpr auto list = std::tuple{field("window", &WindowOpenRecord::window),
                                          field("batch_start", &WindowOpenRecord::batch_start),
                                          field("time_ns", &WindowOpenRecord::time_ns)};
};
template <>
struct Fields<BatchRecord> {
  static constexpr auto list = std::tuple{field("window", &BatchRecord::window), field("mark", &BatchRecord::mark)};
};
template <>
struct Fields<WindowCloseRecord> {
  static constexpr auto list = std::tuple{
      field("window", &WindowCloseRecord::window), field("batch_end", &WindowCloseRecord::batch_end),
      field("time_ns", &WindowCloseRecord::time_ns), field("oom", &WindowCloseRecord::oom),
      field("dropped", &WindowCloseRecord::dropped)};
};
template <>
struct Fields<WindowBatchesRecord> {
  static constexpr auto list = std::tuple{
      field("window", &WindowBatchesRecord::window), field("method", &WindowBatchesRecord::method),
      field("confidence", &WindowBatchesRecord::confidence), field("detail", &WindowBatchesRecord::detail)};
};

// ---------------------------------------------------------------------------------------------
// Writer

SpillWriter::~SpillWriter() { close(); }

bool SpillWriter::open(const std::filesystem::path& path) {
  close();
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_APPEND, 0644);
  if (fd_ < 0) {
    error_ = "cannot create " + path.string() + ": " + std::strerror(errno);
    return false;
  }
  char header[kSpillHeaderBytes];
  std::memcpy(header, kSpillMagic, 8);
  const std::uint32_t version = kSpillVersion, header_bytes = kSpillHeaderBytes;
  const std::int64_t created = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &header_bytes, 4);
  std::memcpy(header + 16, &created, 8);
  if (::write(fd_, header, sizeof header) != static_cast<ssize_t>(sizeof header)) {
    error_ = "cannot write " + path.string() + ": " + std::strerror(errno);
    close();
    return false;
  }
  return true;
}

void SpillWriter::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool SpillWriter::write_record(SpillRecord type, std::initializer_list<std::span<const char>> parts) {
  if (fd_ < 0) {
    if (error_.empty()) error_ = "the spill file is not open";
    return false;
  }
  std::size_t length = 0;
  std::uint32_t payload_crc = 0;
  for (const auto& part : parts) {
    length += part.size();
    payload_crc = crc(part.data(), part.size(), payload_crc);
  }
  if (length > kMaxRecordPayload) {
    error_ = "a record of " + std::to_string(length) + " bytes is over the spill's limit";
    return false;
  }
  std::uint32_t head[4] = {static_cast<std::uint32_t>(type), static_cast<std::uint32_t>(length), payload_crc, 0};
  head[3] = crc(head, 12);
  if (buffered_) {
    const auto* h = reinterpret_cast<const char*>(head);
    pending_.insert(pending_.end(), h, h + sizeof head);
    for (const auto& part : parts) pending_.insert(pending_.end(), part.begin(), part.end());
    return true;
  }

  // Header and payload go out with one writev(2) on an O_APPEND descriptor, so a kill leaves
  // either the whole record or a short tail that the reader recognises; no copy of the payload.
  iovec iov[8];
  int n = 0;
  iov[n++] = iovec{head, sizeof head};
  for (const auto& part : parts) {
    if (!part.empty() && n < 8) iov[n++] = iovec{const_cast<char*>(part.data()), part.size()};
  }
  error_ = write_all(iov, n);
  if (!error_.empty()) {
    close();
    return false;
  }
  return true;
}

std::string SpillWriter::write_all(iovec* next, int n) const {
  while (n > 0) {
    const ssize_t written = ::writev(fd_, next, n);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return "cannot write " + path_.string() + ": " + std::strerror(written < 0 ? errno : EIO);
    // A short write (a signal, a full pipe): go on from where it stopped.
    std::size_t done = static_cast<std::size_t>(written);
    while (n > 0 && done >= next->iov_len) {
      done -= next->iov_len;
      ++next;
      --n;
    }
    if (n > 0) {
      next->iov_base = static_cast<char*>(next->iov_base) + done;
      next->iov_len -= done;
    }
  }
  return {};
}

bool SpillWriter::write_record(SpillRecord type, const ByteWriter& payload) {
  if (payload.overflowed()) {
    error_ = "a string or list too long for the spill";
    return false;
  }
  return write_record(type, {std::span<const char>(payload.bytes())});
}

bool SpillWriter::write_meta(const RankMeta& meta) {
  const std::string text = meta_to_json(meta);
  return write_record(SpillRecord::meta, {std::span<const char>(text.data(), text.size())});
}

bool SpillWriter::write_frames(std::uint32_t first_id, std::span<const Frame> frames) {
  ByteWriter e;
  e.put(first_id);
  e.items(frames);
  return write_record(SpillRecord::frames, e);
}

bool SpillWriter::write_stacks(std::uint32_t first_id, std::span<const Stack> stacks) {
  ByteWriter e;
  e.put(first_id);
  e.items(stacks);
  return write_record(SpillRecord::stacks, e);
}

bool SpillWriter::write_window_open(std::uint32_t window, std::int64_t batch_start, std::int64_t time_ns,
                                    std::span<const LiveAlloc> live) {
  ByteWriter e;
  e.value(WindowOpenRecord{window, batch_start, time_ns});
  if (!write_record(SpillRecord::window_open, e)) return false;
  return write_chunked(SpillRecord::live, window, live);
}

bool SpillWriter::write_events(std::uint32_t window, std::span<const Event> events) {
  // Records of at most 4,096 events: the packing space stays in the cache, and a record packs
  // on its own (its first event against zeros).
  constexpr std::size_t chunk = 4096;
  packed_.resize(std::min(chunk, events.size()) * packing::kMaxPackedEventBytes);
  for (std::size_t i = 0; i < events.size(); i += chunk) {
    const auto part = events.subspan(i, std::min(chunk, events.size() - i));
    const std::size_t n = packing::pack(part, packed_.data());
    const std::uint32_t prefix[2] = {window, static_cast<std::uint32_t>(part.size())};
    if (!write_record(SpillRecord::events_packed,
                      {bytes_of(std::span<const std::uint32_t>(prefix)), std::span<const char>(packed_.data(), n)})) {
      return false;
    }
  }
  return true;
}

template <class T>
bool SpillWriter::write_chunked(SpillRecord type, std::uint32_t window, std::span<const T> items) {
  // Raw arrays in chunks that each fit a record, written from the caller's memory (no copy).
  static_assert(kWireAsBytes<T>);
  constexpr std::size_t chunk = kMaxRecordPayload / sizeof(T) / 2;
  for (std::size_t i = 0; i < items.size(); i += chunk) {
    auto part = items.subspan(i, std::min(chunk, items.size() - i));
    const std::uint32_t prefix[2] = {window, static_cast<std::uint32_t>(part.size())};
    if (!write_record(type, {bytes_of(std::span<const std::uint32_t>(prefix)), bytes_of(part)})) return false;
  }
  return true;
}

bool SpillWriter::write_batch(std::uint32_t window, const BatchMark& mark) {
  ByteWriter e;
  e.value(BatchRecord{window, mark});
  return write_record(SpillRecord::batch, e);
}

bool SpillWriter::write_segments(std::uint32_t window, std::span<const Segment> segments) {
  ByteWriter e;
  e.put(window);
  e.items(segments);
  return write_record(SpillRecord::segments, e);
}

bool SpillWriter::write_window_close(std::uint32_t window, std::int64_t batch_end, std::int64_t time_ns,
                                     bool oom, std::uint64_t dropped) {
  ByteWriter e;
  e.value(WindowCloseRecord{window, batch_end, time_ns, oom, dropped});
  return write_record(SpillRecord::window_close, e);
}

bool SpillWriter::write_window_batches(std::uint32_t window, std::string_view method, double confidence,
                                       std::string_view detail) {
  ByteWriter e;
  e.value(WindowBatchesRecord{window, std::string(method), confidence, std::string(detail)});
  return write_record(SpillRecord::window_batches, e);
}

bool SpillWriter::write_window_extras(std::uint32_t window, std::string_view json) {
  // Pieces well under the record limit; the reader concatenates them.
  constexpr std::size_t piece = kMaxRecordPayload / 4;
  for (std::size_t i = 0; i < json.size(); i += piece) {
    const std::string_view part = json.substr(i, piece);
    if (!write_record(SpillRecord::window_extras, {bytes_of(std::span<const std::uint32_t>(&window, 1)),
                                                   std::span<const char>(part.data(), part.size())}))
      return false;
  }
  return true;
}

bool SpillWriter::write_end(bool used_mpi) {
  const std::string_view text = used_mpi ? R"({"used_mpi":true})" : R"({"used_mpi":false})";
  return write_record(SpillRecord::end, {std::span<const char>(text.data(), text.size())});
}

bool SpillWriter::still_linked() {
  if (fd_ < 0) return false;
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && st.st_nlink == 0) {
    error_ = path_.string() + " was deleted while recording (its folder removed?)";
    return false;
  }
  return true;
}

std::string SpillWriter::sync_error() const {
  if (::fdatasync(fd_) != 0 && errno != EINVAL && errno != EROFS) {
    return "cannot sync " + path_.string() + ": " + std::strerror(errno);
  }
  return {};
}

bool SpillWriter::sync() {
  if (fd_ < 0) return false;
  if (buffered_) {
    sync_wanted_ = true;
    return true;
  }
  error_ = sync_error();
  return error_.empty();
}

bool SpillWriter::take_pending(std::vector<char>& into) {
  into.clear();
  pending_.swap(into);
  return std::exchange(sync_wanted_, false);
}

std::string SpillWriter::write_out(std::span<const char> bytes, bool sync) const {
  if (fd_ < 0) return "the spill file is not open";
  // Whole records, in order, on an O_APPEND descriptor: a kill mid-write leaves a short tail
  // that the reader recognises.
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  std::string error = write_all(&iov, bytes.empty() ? 0 : 1);
  if (error.empty() && sync) error = sync_error();
  return error;
}

// ---------------------------------------------------------------------------------------------
// Reader

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

bool write_spill(const RankRecord& r, const std::filesystem::path& path, std::string& error) {
  SpillWriter w;
  bool ok = w.open(path) && w.write_meta(r.meta) && w.write_frames(0, r.frames) && w.write_stacks(0, r.stacks);
  for (std::size_t i = 0; ok && i < r.windows.size(); ++i) {
    const WindowRecord& win = r.windows[i];
    const auto id = static_cast<std::uint32_t>(i);
    ok = w.write_window_open(id, win.batch_start, win.open_time_ns, win.live_at_start);
    for (const auto& b : win.batches) ok = ok && w.write_batch(id, b);
    ok = ok && w.write_events(id, win.events) && w.write_segments(id, win.segments);
    if (win.batch_method != "recorded" || win.batch_confidence != 1.0 || !win.batch_detail.empty())
      ok = ok && w.write_window_batches(id, win.batch_method, win.batch_confidence, win.batch_detail);
    ok = ok && w.write_window_extras(id, win.source_extras) &&
         w.write_window_close(id, win.batch_end, win.close_time_ns, win.oom, win.dropped);
  }
  ok = ok && w.write_end(r.used_mpi);
  if (!ok) error = w.error();
  return ok;
}

std::vector<std::filesystem::path> find_spills(const std::filesystem::path& run_dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& dir : {run_dir / "spill", run_dir}) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == kSpillSuffix) out.push_back(entry.path());
    }
    if (!out.empty()) break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string spill_file_name(int rank, std::int64_t pid) {
  return "rank" + std::to_string(rank) + ".pid" + std::to_string(pid) + kSpillSuffix;
}

std::string meta_to_json(const RankMeta& m) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field<RankMeta>([&](const auto& f) { j[f.name] = m.*f.member; });
  return j.dump();
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

}  // namespace memsnap
