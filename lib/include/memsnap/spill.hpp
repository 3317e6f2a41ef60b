// The spill file: each recording process's durable, append-only record. The writer runs in the
// training process (no MPI, no HDF5); the reader runs in the aggregator and `memsnap info`.
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
//   structs' fields are laid out by their tables in memsnap/record_fields.hpp, see codec.hpp):
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
// Version 2 added records 11 and 12, written only for windows whose values differ from the
// defaults; a version 1 file reads as a version 2 file without them. Version 3 writes events as
// EVENTS_PACKED, never EVENTS; the reader reads both.
// Every record is written whole with one write(2), so a process killed at any moment leaves a file
// whose complete records all read back; the reader reports the cut as `truncated`. A file
// without END was not shut down cleanly (killed, crashed, or still running).
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "memsnap/record.hpp"

struct iovec;  // <sys/uio.h>

namespace memsnap {

class ByteWriter;

inline constexpr char kSpillMagic[8] = {'M', 'S', 'N', 'P', 'S', 'P', 'I', 'L'};
inline constexpr std::uint32_t kSpillVersion = 3;
inline constexpr std::uint32_t kSpillOldestVersion = 1;  // the oldest this reader reads
inline constexpr std::uint32_t kSpillHeaderBytes = 24;
inline constexpr std::uint32_t kRecordHeaderBytes = 16;
inline constexpr std::uint32_t kMaxRecordPayload = 64u << 20;
inline constexpr const char* kSpillSuffix = ".spill";

enum class SpillRecord : std::uint32_t {
  meta = 1,
  frames = 2,
  stacks = 3,
  window_open = 4,
  live = 5,
  events = 6,
  batch = 7,
  segments = 8,
  window_close = 9,
  end = 10,
  window_batches = 11,
  window_extras = 12,
  events_packed = 13,
};

// Appends records to one spill file. Never throws: every call returns false once a write failed,
// and error() says why. Not thread-safe (the Recorder serialises calls).
class SpillWriter {
 public:
  SpillWriter() = default;
  ~SpillWriter();
  SpillWriter(const SpillWriter&) = delete;
  SpillWriter& operator=(const SpillWriter&) = delete;

  // Creates `path` (O_EXCL: never clobbers) and writes the header.
  bool open(const std::filesystem::path& path);
  bool is_open() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }
  const std::filesystem::path& path() const { return path_; }

  bool write_meta(const RankMeta& meta);
  bool write_frames(std::uint32_t first_id, std::span<const Frame> frames);
  bool write_stacks(std::uint32_t first_id, std::span<const Stack> stacks);
  bool write_window_open(std::uint32_t window, std::int64_t batch_start, std::int64_t time_ns,
                         std::span<const LiveAlloc> live);
  bool write_events(std::uint32_t window, std::span<const Event> events);
  bool write_batch(std::uint32_t window, const BatchMark& mark);
  bool write_segments(std::uint32_t window, std::span<const Segment> segments);
  bool write_window_close(std::uint32_t window, std::int64_t batch_end, std::int64_t time_ns,
                          bool oom, std::uint64_t dropped);
  // How the window's batches were found (WindowRecord::batch_method, ...); write it only when
  // they were not recorded by the source: a window without this record reads as "recorded".
  bool write_window_batches(std::uint32_t window, std::string_view method, double confidence, std::string_view detail);
  // The window's source_extras, in as many records as its size needs.
  bool write_window_extras(std::uint32_t window, std::string_view json);
  bool write_end(bool used_mpi = false);
  bool sync();  // fdatasync: called when a window closes (buffered: at the next write_out)
  // False (with error() set) when the file was deleted under us, e.g. its folder removed: writes
  // would still succeed, into a file nobody can read. The file stays open: close() it.
  bool still_linked();
  void close();

  // Buffered: records are appended to memory, in order, and reach the file only through
  // take_pending() and write_out(), which may run on another thread than the one that appends
  // (the recorder's writer thread writes while the job's threads go on recording). The caller
  // orders them: write_out of one take before the next take's, close() after both.
  void set_buffered(bool on) { buffered_ = on; }
  std::size_t pending_bytes() const { return pending_.size(); }
  // Moves the pending records into `into` (its old contents dropped, its memory reused for the
  // next records) and returns whether a sync was asked for since the last take.
  bool take_pending(std::vector<char>& into);
  // Writes bytes of take_pending() to the file, then syncs if asked; "" or what went wrong.
  // Touches neither the pending records nor error(): safe beside the appending thread.
  std::string write_out(std::span<const char> bytes, bool sync) const;
  void set_error(std::string error) { error_ = std::move(error); }

 private:
  bool write_record(SpillRecord type, std::initializer_list<std::span<const char>> parts);
  bool write_record(SpillRecord type, const ByteWriter& payload);
  template <class T>
  bool write_chunked(SpillRecord type, std::uint32_t window, std::span<const T> items);
  std::string sync_error() const;
  // writev(2) of every byte of `iov` (n entries, advanced in place): "" or what went wrong.
  std::string write_all(::iovec* iov, int n) const;
  int fd_ = -1;
  std::filesystem::path path_;
  std::string error_;
  bool buffered_ = false;
  bool sync_wanted_ = false;
  std::vector<char> pending_;
  std::vector<char> packed_;  // write_events' packing space, reused
};

// A spill that cannot be read at all (not a spill, newer version, unreadable).
class SpillError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads a whole spill. Damage is not an exception: the result holds every complete record before
// it, with status truncated or corrupt and status_detail naming the byte offset.
RankRecord read_spill(const std::filesystem::path& path);
// The same, reusing the memory of `reuse`'s event vectors: a reader of spill after spill (the
// aggregator) touches fresh pages, a fault each, only for the first.
RankRecord read_spill(const std::filesystem::path& path, RankRecord&& reuse);
RankRecord read_spill_bytes(std::span<const char> bytes, const std::string& name);

// Writes a whole record as one spill (import, tests): every window closed, an END record.
// Returns false with `error` set when a write fails; never replaces an existing file.
bool write_spill(const RankRecord& record, const std::filesystem::path& path, std::string& error);

// The spill files of a run folder (RUN_DIR/spill/*.spill or RUN_DIR/*.spill), sorted by name.
std::vector<std::filesystem::path> find_spills(const std::filesystem::path& run_dir);

// The spill file name of one process: rank<R>.pid<P>.spill.
std::string spill_file_name(int rank, std::int64_t pid);

// RankMeta <-> JSON (the META record, `memsnap info --json`).
std::string meta_to_json(const RankMeta& meta);
RankMeta meta_from_json(const std::string& text);

}  // namespace memsnap
