// The spill writer: appends checksummed records to one file (the recorder's writer thread, import,
// tests). The reader is spill_reader.cpp; what both share is spill_records.hpp.
//
// This is where the spill's byte layout is drawn; memsnap/spill.hpp is the API.
//
// Byte layout (all integers little-endian; x86-64 and aarch64 both are):
//
//   file   := header record*
//   header := magic "MSNPSPIL" (8) | u32 format_version | u32 header_bytes (=24) | i64 created_unix_ns
//   record := u32 type | u32 payload_bytes | u32 payload_crc32 | u32 head_crc32 | payload
//             checksums are CRC-32C; head_crc32 covers the 12 bytes before it, so a damaged length is caught before it is
//             used; payload_bytes <= kMaxRecordPayload.
//
//   payload by type (str := u32 length | bytes; arrays are raw trivially-copyable structs; the
//   structs' fields are laid out by their tables in memsnap/record_fields.hpp, see memsnap/codec.hpp):
//     1 META          JSON text of RankMeta
//     2 FRAMES        u32 first_id | u32 n | n x (str name | str file | u32 line)
//     3 STACKS        u32 first_id | u32 n | n x (u32 depth | depth x u32 frame_id)
//     4 WINDOW_OPEN   u32 window | i64 batch_start | i64 open_time_ns
//     5 LIVE          u32 window | u32 n | n x LiveAlloc (40 bytes)
//     6 EVENTS        u32 window | u32 n | n x Event (40 bytes)
//     7 BATCH         u32 window | i64 batch | i64 time_ns
//     8 SEGMENTS      u32 window | u32 n | n x (u64 addr | u64 size | u64 stream | i16 device |
//                     str pool | u32 nblocks | nblocks x (u64 addr | u64 size | u64 requested |
//                     u8 state | u32 stack_id))
//     9 WINDOW_CLOSE  u32 window | i64 batch_end | i64 close_time_ns | u8 oom | u64 dropped
//    10 END           JSON text (may be empty): how the process ended, e.g. {"used_mpi": true}
//    11 WINDOW_BATCHES  u32 window | str batch_method | f64 batch_confidence | str batch_detail
//                     (version 2; absent: "recorded", 1.0, "")
//    12 WINDOW_EXTRAS u32 window | bytes: a piece of the window's source_extras (JSON text); the
//                     pieces of a window concatenate in file order (version 2; absent: empty)
//    13 EVENTS_PACKED u32 window | u32 n | n packed events: each as its changes from the one
//                     before it in the record, in varints (lib/src/event_packing.hpp draws them;
//                     4-12 bytes an event for a training loop's allocator)
//
// META's JSON keys may grow without a new version: a reader ignores keys it does not know and
// gives a missing key its default ("launch", the launch that recorded the file, came so; older
// files read with it empty).
// Version 2 added records 11 and 12, written only for windows whose values differ from the
// defaults; a version 1 file reads as a version 2 file without them. Version 3 writes events as
// EVENTS_PACKED, never EVENTS; the reader reads both.
// Every record is written whole with one write(2), so a process killed at any moment leaves a file
// whose complete records all read back; the reader reports the cut as `truncated`. A file
// without END was not shut down cleanly (killed, crashed, or still running).
#include "memsnap/spill.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "event_packing.hpp"
#include "spill_records.hpp"

namespace memsnap {

using spill_records::bytes_of;
using spill_records::crc;
using spill_records::BatchRecord;
using spill_records::WindowBatchesRecord;
using spill_records::WindowCloseRecord;
using spill_records::WindowOpenRecord;

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

std::string meta_to_json(const RankMeta& m) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field<RankMeta>([&](const auto& f) { j[f.name] = m.*f.member; });
  return j.dump();
}

}  // namespace memsnap
