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

#include <nlohmann/json.hpp>

#include "crc32c.hpp"

namespace memsnap {
namespace {

std::uint32_t crc(const void* data, std::size_t n, std::uint32_t seed = 0) { return crc32c(data, n, seed); }

template <class T>
std::span<const char> bytes_of(std::span<const T> items) {
  return {reinterpret_cast<const char*>(items.data()), items.size_bytes()};
}

// Appends plain values to a payload.
class Encoder {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void str(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <class T>
  void array(std::span<const T> items) {
    const char* p = reinterpret_cast<const char*>(items.data());
    out_.insert(out_.end(), p, p + items.size_bytes());
  }
  std::vector<char>& bytes() { return out_; }

 private:
  std::vector<char> out_;
};

// Reads plain values from a payload; every read is bounds-checked and throws Short on overrun.
class Decoder {
 public:
  struct Short {};
  explicit Decoder(std::span<const char> in) : in_(in) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(in_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  // n items of T; the count is checked against the bytes left before anything is allocated.
  template <class T>
  void array(std::uint32_t n, std::vector<T>& out) {
    if (n > remaining() / sizeof(T)) throw Short{};
    if (n == 0) return;  // memcpy may not see a null vector buffer, even for 0 bytes
    const std::size_t old = out.size();
    out.resize(old + n);
    std::memcpy(static_cast<void*>(out.data() + old), in_.data() + pos_, std::size_t{n} * sizeof(T));
    pos_ += std::size_t{n} * sizeof(T);
  }
  std::size_t remaining() const { return in_.size() - pos_; }

 private:
  void need(std::size_t n) const {
    if (n > remaining()) throw Short{};
  }
  std::span<const char> in_;
  std::size_t pos_ = 0;
};

}  // namespace

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

  // Header and payload go out with one writev(2) on an O_APPEND descriptor, so a kill leaves
  // either the whole record or a short tail that the reader recognises; no copy of the payload.
  iovec iov[8];
  int n = 0;
  iov[n++] = iovec{head, sizeof head};
  for (const auto& part : parts) {
    if (!part.empty() && n < 8) iov[n++] = iovec{const_cast<char*>(part.data()), part.size()};
  }
  iovec* next = iov;
  while (n > 0) {
    const ssize_t written = ::writev(fd_, next, n);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error_ = "cannot write " + path_.string() + ": " + std::strerror(written < 0 ? errno : EIO);
      close();
      return false;
    }
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
  return true;
}

bool SpillWriter::write_record(SpillRecord type, const std::vector<char>& payload) {
  return write_record(type, {std::span<const char>(payload)});
}

bool SpillWriter::write_meta(const RankMeta& meta) {
  const std::string text = meta_to_json(meta);
  return write_record(SpillRecord::meta, std::vector<char>(text.begin(), text.end()));
}

bool SpillWriter::write_frames(std::uint32_t first_id, std::span<const Frame> frames) {
  Encoder e;
  e.put(first_id);
  e.put(static_cast<std::uint32_t>(frames.size()));
  for (const auto& f : frames) {
    e.str(f.name);
    e.str(f.file);
    e.put(f.line);
  }
  return write_record(SpillRecord::frames, e.bytes());
}

bool SpillWriter::write_stacks(std::uint32_t first_id, std::span<const Stack> stacks) {
  Encoder e;
  e.put(first_id);
  e.put(static_cast<std::uint32_t>(stacks.size()));
  for (const auto& s : stacks) {
    e.put(static_cast<std::uint32_t>(s.size()));
    e.array(std::span<const std::uint32_t>(s));
  }
  return write_record(SpillRecord::stacks, e.bytes());
}

bool SpillWriter::write_window_open(std::uint32_t window, std::int64_t batch_start, std::int64_t time_ns,
                                    std::span<const LiveAlloc> live) {
  Encoder e;
  e.put(window);
  e.put(batch_start);
  e.put(time_ns);
  if (!write_record(SpillRecord::window_open, e.bytes())) return false;
  // Live allocations in chunks that each fit a record.
  constexpr std::size_t chunk = kMaxRecordPayload / sizeof(LiveAlloc) / 2;
  for (std::size_t i = 0; i < live.size(); i += chunk) {
    auto part = live.subspan(i, std::min(chunk, live.size() - i));
    const std::uint32_t prefix[2] = {window, static_cast<std::uint32_t>(part.size())};
    if (!write_record(SpillRecord::live, {bytes_of(std::span<const std::uint32_t>(prefix)), bytes_of(part)})) return false;
  }
  return true;
}

bool SpillWriter::write_events(std::uint32_t window, std::span<const Event> events) {
  constexpr std::size_t chunk = kMaxRecordPayload / sizeof(Event) / 2;
  for (std::size_t i = 0; i < events.size(); i += chunk) {
    auto part = events.subspan(i, std::min(chunk, events.size() - i));
    const std::uint32_t prefix[2] = {window, static_cast<std::uint32_t>(part.size())};
    if (!write_record(SpillRecord::events, {bytes_of(std::span<const std::uint32_t>(prefix)), bytes_of(part)})) return false;
  }
  return true;
}

bool SpillWriter::write_batch(std::uint32_t window, const BatchMark& mark) {
  Encoder e;
  e.put(window);
  e.put(mark.batch);
  e.put(mark.time_ns);
  return write_record(SpillRecord::batch, e.bytes());
}

bool SpillWriter::write_segments(std::uint32_t window, std::span<const Segment> segments) {
  Encoder e;
  e.put(window);
  e.put(static_cast<std::uint32_t>(segments.size()));
  for (const auto& s : segments) {
    e.put(s.addr);
    e.put(s.size);
    e.put(s.stream);
    e.put(s.device);
    e.str(s.pool);
    e.put(static_cast<std::uint32_t>(s.blocks.size()));
    for (const auto& b : s.blocks) {
      e.put(b.addr);
      e.put(b.size);
      e.put(b.requested_size);
      e.put(b.state);
      e.put(b.stack_id);
    }
  }
  return write_record(SpillRecord::segments, e.bytes());
}

bool SpillWriter::write_window_close(std::uint32_t window, std::int64_t batch_end, std::int64_t time_ns,
                                     bool oom, std::uint64_t dropped) {
  Encoder e;
  e.put(window);
  e.put(batch_end);
  e.put(time_ns);
  e.put(static_cast<std::uint8_t>(oom ? 1 : 0));
  e.put(dropped);
  return write_record(SpillRecord::window_close, e.bytes());
}

bool SpillWriter::write_window_batches(std::uint32_t window, std::string_view method, double confidence,
                                       std::string_view detail) {
  Encoder e;
  e.put(window);
  e.str(method);
  e.put(confidence);
  e.str(detail);
  return write_record(SpillRecord::window_batches, e.bytes());
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
  const std::string text = used_mpi ? R"({"used_mpi":true})" : R"({"used_mpi":false})";
  return write_record(SpillRecord::end, std::vector<char>(text.begin(), text.end()));
}

bool SpillWriter::still_linked() {
  if (fd_ < 0) return false;
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && st.st_nlink == 0) {
    error_ = path_.string() + " was deleted while recording (its folder removed?)";
    close();
    return false;
  }
  return true;
}

bool SpillWriter::sync() {
  if (fd_ < 0) return false;
  if (::fdatasync(fd_) != 0 && errno != EINVAL && errno != EROFS) {
    error_ = "cannot sync " + path_.string() + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// Applies one record's payload to the record being rebuilt. Throws Decoder::Short when the
// payload is shorter than its own counts say, and std::runtime_error for inconsistent content.
void apply_record(SpillRecord type, std::span<const char> payload, RankRecord& out,
                  std::map<std::uint32_t, std::size_t>& window_index) {
  Decoder d(payload);
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
      const auto first = d.get<std::uint32_t>();
      const auto n = d.get<std::uint32_t>();
      if (first != out.frames.size()) throw std::runtime_error("frames out of sequence");
      for (std::uint32_t i = 0; i < n; ++i) {
        Frame f;
        f.name = d.str();
        f.file = d.str();
        f.line = d.get<std::uint32_t>();
        out.frames.push_back(std::move(f));
      }
      break;
    }
    case SpillRecord::stacks: {
      const auto first = d.get<std::uint32_t>();
      const auto n = d.get<std::uint32_t>();
      if (first != out.stacks.size()) throw std::runtime_error("stacks out of sequence");
      for (std::uint32_t i = 0; i < n; ++i) {
        Stack s;
        d.array(d.get<std::uint32_t>(), s);
        for (auto id : s) {
          if (id >= out.frames.size()) throw std::runtime_error("a stack names frame " + std::to_string(id) + " that was never written");
        }
        out.stacks.push_back(std::move(s));
      }
      break;
    }
    case SpillRecord::window_open: {
      const auto id = d.get<std::uint32_t>();
      if (window_index.count(id)) throw std::runtime_error("window " + std::to_string(id) + " opened twice");
      WindowRecord w;
      w.batch_start = d.get<std::int64_t>();
      w.batch_end = w.batch_start;
      w.open_time_ns = d.get<std::int64_t>();
      w.status = RecordStatus::truncated;  // until its close record is read
      window_index[id] = out.windows.size();
      out.windows.push_back(std::move(w));
      break;
    }
    case SpillRecord::live: {
      auto& w = window_of(d.get<std::uint32_t>());
      d.array(d.get<std::uint32_t>(), w.live_at_start);
      break;
    }
    case SpillRecord::events: {
      auto& w = window_of(d.get<std::uint32_t>());
      d.array(d.get<std::uint32_t>(), w.events);
      break;
    }
    case SpillRecord::batch: {
      auto& w = window_of(d.get<std::uint32_t>());
      BatchMark m;
      m.batch = d.get<std::int64_t>();
      m.time_ns = d.get<std::int64_t>();
      w.batches.push_back(m);
      w.batch_end = std::max(w.batch_end, m.batch);
      break;
    }
    case SpillRecord::segments: {
      auto& w = window_of(d.get<std::uint32_t>());
      const auto n = d.get<std::uint32_t>();
      w.segments.clear();
      for (std::uint32_t i = 0; i < n; ++i) {
        Segment s;
        s.addr = d.get<std::uint64_t>();
        s.size = d.get<std::uint64_t>();
        s.stream = d.get<std::uint64_t>();
        s.device = d.get<std::int16_t>();
        s.pool = d.str();
        const auto nb = d.get<std::uint32_t>();
        if (nb > d.remaining() / 29) throw Decoder::Short{};
        for (std::uint32_t b = 0; b < nb; ++b) {
          Block blk;
          blk.addr = d.get<std::uint64_t>();
          blk.size = d.get<std::uint64_t>();
          blk.requested_size = d.get<std::uint64_t>();
          blk.state = d.get<std::uint8_t>();
          blk.stack_id = d.get<std::uint32_t>();
          s.blocks.push_back(blk);
        }
        w.segments.push_back(std::move(s));
      }
      break;
    }
    case SpillRecord::window_close: {
      auto& w = window_of(d.get<std::uint32_t>());
      w.batch_end = d.get<std::int64_t>();
      w.close_time_ns = d.get<std::int64_t>();
      w.oom = d.get<std::uint8_t>() != 0;
      w.dropped = d.get<std::uint64_t>();
      w.closed = true;
      w.status = RecordStatus::ok;
      break;
    }
    case SpillRecord::window_batches: {
      auto& w = window_of(d.get<std::uint32_t>());
      w.batch_method = d.str();
      w.batch_confidence = d.get<double>();
      w.batch_detail = d.str();
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

}  // namespace

RankRecord read_spill_bytes(std::span<const char> bytes, const std::string& name) {
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

  std::map<std::uint32_t, std::size_t> window_index;
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
      apply_record(type, payload, out, window_index);
    } catch (const Decoder::Short&) {
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

RankRecord read_spill(const std::filesystem::path& path) {
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
    return read_spill_bytes({}, path.string());
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw SpillError(path.string() + ": cannot map (" + std::strerror(errno) + ")");
  struct Unmap {
    void* p;
    std::size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return read_spill_bytes(std::span(static_cast<const char*>(map), size), path.string());
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
  nlohmann::json j{{"rank", m.rank},
                   {"local_rank", m.local_rank},
                   {"world_size", m.world_size},
                   {"local_world_size", m.local_world_size},
                   {"node_rank", m.node_rank},
                   {"host", m.host},
                   {"pid", m.pid},
                   {"run_name", m.run_name},
                   {"source", m.source},
                   {"device_name", m.device_name},
                   {"config", m.config_json},
                   {"tool_version", m.tool_version},
                   {"start_unix_ns", m.start_unix_ns},
                   {"clock_offset_ns", m.clock_offset_ns},
                   {"device_total_bytes", m.device_total_bytes}};
  return j.dump();
}

RankMeta meta_from_json(const std::string& text) {
  RankMeta m;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error("metadata is not valid JSON");
  }
  if (!j.is_object()) throw std::runtime_error("metadata is not a JSON object");
  // Whole numbers only, in range: a float such as 1e300 converted to an integer is undefined.
  auto integer = [&](const char* key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) -> std::int64_t {
    const auto it = j.find(key);
    if (it == j.end()) return fallback;
    std::int64_t v = 0;
    if (it->is_number_unsigned()) {
      const auto u = it->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) throw std::runtime_error(std::string("metadata field ") + key + " is out of range");
      v = static_cast<std::int64_t>(u);
    } else if (it->is_number_integer()) {
      v = it->get<std::int64_t>();
    } else {
      throw std::runtime_error(std::string("metadata field ") + key + " is not a whole number");
    }
    if (v < lo || v > hi) throw std::runtime_error(std::string("metadata field ") + key + " is out of range");
    return v;
  };
  auto text_of = [&](const char* key, const char* fallback) -> std::string {
    const auto it = j.find(key);
    if (it == j.end()) return fallback;
    if (!it->is_string()) throw std::runtime_error(std::string("metadata field ") + key + " is not text");
    return it->get<std::string>();
  };
  constexpr std::int64_t kMaxRanks = 1 << 24;
  m.rank = static_cast<int>(integer("rank", 0, 0, kMaxRanks - 1));
  m.local_rank = static_cast<int>(integer("local_rank", 0, 0, kMaxRanks - 1));
  m.world_size = static_cast<int>(integer("world_size", 1, 1, kMaxRanks));
  m.local_world_size = static_cast<int>(integer("local_world_size", 1, 1, kMaxRanks));
  m.node_rank = static_cast<int>(integer("node_rank", 0, 0, kMaxRanks - 1));
  m.host = text_of("host", "");
  m.pid = integer("pid", 0, 0, INT64_MAX);
  m.run_name = text_of("run_name", "");
  m.source = text_of("source", "api");
  m.device_name = text_of("device_name", "");
  m.config_json = text_of("config", "");
  m.tool_version = text_of("tool_version", "");
  m.start_unix_ns = integer("start_unix_ns", 0, INT64_MIN, INT64_MAX);
  m.clock_offset_ns = integer("clock_offset_ns", 0, INT64_MIN, INT64_MAX);
  if (const auto it = j.find("device_total_bytes"); it != j.end()) {
    if (!it->is_array() || it->size() > 4096) throw std::runtime_error("metadata field device_total_bytes is not a short list");
    for (const auto& v : *it) {
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
        throw std::runtime_error("metadata field device_total_bytes holds something other than byte counts");
      }
      m.device_total_bytes.push_back(v.get<std::uint64_t>());
    }
  }
  return m;
}

}  // namespace memsnap
