// The spill file: each recording process's durable, append-only record. The writer runs in the
// training process (no MPI, no HDF5); the reader runs in the aggregator and `memsnap info`.
//
// One append-only file of checksummed records (a magic and a version at its head); a process killed
// at any moment leaves a file whose complete records all read back. The byte layout of the file and
// of every record is drawn once, beside the writer: lib/src/spill_writer.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
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

// The first META record of a spill, read from the file's head only (cheap for a file of any
// size); std::nullopt when the file is not a spill or holds no readable META record yet.
std::optional<RankMeta> read_spill_meta(const std::filesystem::path& path);

/// The records of one launch in a run folder.
struct SpillLaunch {
  std::string id;                 // RankMeta::launch; empty: no launch named (see kUnnamedLaunch)
  std::int64_t start_unix_ns = 0; // when its first rank began recording (0: unknown)
  std::vector<int> ranks;         // sorted
  std::vector<std::filesystem::path> files;
};
inline constexpr const char* kUnnamedLaunch = "unnamed";  // how --launch names records of no named launch

/// `spills` (find_spills) grouped by the launch that wrote them, oldest first. A spill whose META
/// cannot be read goes with the newest launch that has no record of its rank, else on its own.
std::vector<SpillLaunch> spill_launches(const std::vector<std::filesystem::path>& spills);

/// Which spills of a run folder make one store: those of `launch` (an id, or kUnnamedLaunch), or
/// with `launch` empty those of the newest launch. `note` is one line for the user when the folder
/// holds records of other launches that were left out; `error` when `launch` has no record there.
struct LaunchChoice {
  std::vector<std::filesystem::path> files;
  std::string note;
  std::string error;
};
LaunchChoice choose_launch(const std::filesystem::path& run_dir, const std::string& launch);

/// "2025-01-31 14:02:07" (local time) for a launch's start; "an unknown time" for 0.
std::string launch_time_text(std::int64_t unix_ns);

// The spill file name of one process: rank<R>.pid<P>.spill.
std::string spill_file_name(int rank, std::int64_t pid);

// RankMeta <-> JSON (the META record, `memsnap info --json`).
std::string meta_to_json(const RankMeta& meta);
RankMeta meta_from_json(const std::string& text);

}  // namespace memsnap
