// The HDF5 store: one root file (the index: attributes, /summary, /sites, /ranks) with each rank's
// bulk data in its own file, linked in at /rank/<r> with an HDF5 external link.
//
// What a reader sees through the root file (h5py, h5ls, StoreReader), whatever the physical layout:
//
//   /                         attrs format="memsnap", format_version, run_name, world_size, created,
//                             tool_version, config (JSON text)
//   /ranks                    table, one row per rank 0..world_size-1 (status, host, device, ...)
//   /summary                  table, one row per (rank, window); a rank without windows has one row
//                             with window = -1 carrying its status (missing, corrupt, ...); the
//                             columns batch_method and batch_confidence are absent in stores
//                             written before they existed (read as "recorded", 1.0)
//   /sites                    table, the top allocation sites per (rank, window); names in /site_names
//   /site_names/{blob,offsets}  names packed as UTF-8 bytes; name i is blob[offsets[i]:offsets[i+1]]
//   /findings                 table, the run's findings (memsnap/findings.hpp), from format version 3
//   /digest/{windows,batches,held}  tables, what the cross-rank rules read of each window (version 3)
//   /rank/<r>                 attrs hostname, pid, local_rank, node_rank, world_size, device_name,
//                             source, status, status_detail, run_name, spill, ...
//   /rank/<r>/frames/{names_blob,names_offsets,files_blob,files_offsets,lines}
//   /rank/<r>/stacks/{offsets,frame_ids}        CSR: stack i is frame_ids[offsets[i]:offsets[i+1]]
//   /rank/<r>/device_total_bytes
//   /rank/<r>/batch/<b>       attrs window, batch_start, batch_end, open_time_ns, close_time_ns, oom,
//                             closed, dropped, status, batch_method, batch_confidence (f64),
//                             batch_detail;  <b> is the batch at which the window closed
//   /rank/<r>/batch/<b>/{events,live_at_start,batches,segments,blocks}
//   /rank/<r>/batch/<b>/source_extras  u8: WindowRecord::source_extras, JSON text (what a torch
//                             snapshot held beyond the event model), empty for other sources
//   Stores written before the batch_* attributes and source_extras existed lack them: they read
//   as "recorded", 1.0, "" and no extras.
//
// Physical layout: STORE (root) and STORE.d/rank<r>.h5 (bulk), the links relative to the root
// file's directory so that the pair can be moved together. No variable-length types anywhere:
// strings are fixed-length fields or packed blobs.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memsnap/analysis.hpp"
#include "memsnap/errors.hpp"
#include "memsnap/record.hpp"

namespace memsnap {

namespace h5 {
class ChunkCompressor;  // store_writer's compression threads (src/chunked_write.hpp)
}
struct Finding;        // memsnap/findings.hpp
struct DigestTables;   // memsnap/findings.hpp
struct StoreFindings;  // memsnap/findings.hpp

inline constexpr const char* kStoreFormat = "memsnap";
// Version 2 added /summary's batch_method and batch_confidence columns, the batch_* attributes
// and source_extras of a window (an older memsnap cannot read its /summary); version 1 stores
// still read, with the defaults. Version 3 added /findings and /digest (memsnap/findings.hpp);
// for earlier stores they are computed from the rank files.
inline constexpr int kStoreFormatVersion = 3;
inline constexpr int kStoreOldestFormatVersion = 1;
inline constexpr const char* kDefaultStoreName = "memsnap.h5";

/// The folder beside a store that holds its per-rank files: STORE + ".d".
std::filesystem::path store_data_dir(const std::filesystem::path& store);

/// One row of /ranks: who a rank was and in what state its record reached the store.
struct RankInfo {
  int rank = 0;
  std::string status = "ok";  // ok | truncated | corrupt | missing | error
  std::string status_detail;
  std::string host;
  std::string device;  // device name
  std::int64_t pid = 0;
  int local_rank = 0;
  int node_rank = 0;
  int local_world_size = 1;
  std::string source;
  std::uint32_t n_windows = 0;
  std::string data_file;  // relative to the root file's folder; empty when the rank has no data
  std::string spill;      // the spill file it came from (file name only)
  bool operator==(const RankInfo&) const = default;
};

/// One row of /summary. window >= 0: a recorded window of the rank; window == -1: the rank
/// recorded no window (or has no record), and the row only carries its status. Its events, peaks
/// and levels are the window's WindowSummary.
struct SummaryRow : WindowSummary {
  int rank = 0;
  int window = -1;
  std::int64_t batch_start = 0;
  std::int64_t batch_end = 0;
  std::string host;
  std::string device;
  bool oom = false;
  std::uint64_t oom_requested = 0;
  std::string status = "ok";
  std::array<std::uint64_t, kCategoryCount> category_bytes{};  // at the peak, by Category
  std::string batch_method = "recorded";                       // WindowRecord::batch_method
  double batch_confidence = 1.0;                               // WindowRecord::batch_confidence
  bool operator==(const SummaryRow&) const = default;
};

/// One row of /sites: a window's site (SiteStat, its name resolved from /site_names) under the
/// window's rank, index and batch.
struct SiteRow : SiteStat {
  int rank = 0;
  int window = 0;
  std::int64_t batch = 0;  // the window's batch_end
  std::uint32_t site_id = 0;
  bool operator==(const SiteRow&) const = default;
};

/// The root file's attributes besides format and format_version: the run, and who wrote the store
/// when. Written and read from one table (src/store_layout.hpp, kRootAttrs).
struct StoreAttrs {
  std::string run_name;
  int world_size = 0;
  std::string config_json;
  std::string created;       // ISO 8601 UTC; write_root_file fills it with now when empty
  std::string tool_version;  // write_root_file fills it with memsnap's when empty
};

/// The store's index, everything in the root file.
struct StoreInfo : StoreAttrs {
  int format_version = kStoreFormatVersion;
  std::vector<RankInfo> ranks;     // by rank
  std::vector<SummaryRow> rows;    // by rank, then window
};

/// The summary row of one analysed window.
SummaryRow make_summary_row(const RankRecord& record, int window, const WindowStats& stats);

// --- writing ---------------------------------------------------------------------------------

struct StoreWriteOptions {
  int deflate = 1;       // 0: no compression; 1..9: shuffle + deflate level on bulk datasets
  unsigned threads = 0;  // threads that compress a dataset's chunks; 0: one per core
};

/// The deflate implementation that compresses the store's chunks: "libdeflate" or "zlib"
/// (whichever the build found; the files are the same standard deflate either way).
const char* deflate_implementation();

/// Writes one rank's bulk file (the target of /rank/<r>): its attributes, frames, stacks and each
/// window's events, live allocations, batch marks and segments. `info` supplies the status
/// attributes. Creates `path` exclusively. Throws StoreError.
void write_rank_file(const std::filesystem::path& path, const RankRecord& record, const RankInfo& info,
                     const StoreWriteOptions& options = {});

/// write_rank_file for one file after another (an aggregator rank's share): the compression
/// threads and their buffers are kept from file to file. Not for use by two threads at once.
class RankFileWriter {
 public:
  explicit RankFileWriter(const StoreWriteOptions& options = {});
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;

  void write(const std::filesystem::path& path, const RankRecord& record, const RankInfo& info);
  /// Threads that compress (1: the caller's own).
  unsigned threads() const;

 private:
  int m_deflate;
  std::unique_ptr<h5::ChunkCompressor> m_compressor;  // null without compression
};

/// Everything the root file holds.
struct StoreIndex : StoreAttrs {
  std::vector<RankInfo> ranks;    // one per rank 0..world_size-1
  std::vector<SummaryRow> rows;
  std::vector<SiteRow> sites;     // site_id is assigned by the writer (sorted unique names)
  const StoreFindings* findings = nullptr;  // /findings and /digest (absent when null)
};

/// Writes the root file: attributes, /ranks, /summary, /sites, /site_names, and /rank/<r> as an
/// external link to RankInfo::data_file (or a plain group with the status attributes when the
/// rank has no data). Creates `path` exclusively. Throws StoreError.
void write_root_file(const std::filesystem::path& path, const StoreIndex& index);

// --- reading ---------------------------------------------------------------------------------

/// Reads a store through its root file. Methods throw StoreError naming the file and object.
class StoreReader {
 public:
  explicit StoreReader(const std::filesystem::path& path);
  ~StoreReader();
  StoreReader(StoreReader&&) noexcept;
  StoreReader& operator=(StoreReader&&) noexcept;
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  const std::filesystem::path& path() const;
  /// Root attributes, /ranks and /summary (never touches a rank's data file).
  StoreInfo info() const;
  std::vector<RankInfo> ranks() const;
  std::vector<SummaryRow> summary() const;
  std::vector<SiteRow> sites() const;
  /// Whether the store holds /findings (format version 3 on); /findings and /digest's rows.
  bool has_findings() const;
  std::vector<Finding> findings() const;
  DigestTables digest() const;
  /// A rank's whole record: metadata, frames, stacks and every window with its bulk data.
  /// A rank without data (missing, unreadable) comes back with its status and no windows.
  RankRecord read_rank(int rank) const;
  /// One window of a rank, named by the batch at which it closed.
  WindowRecord read_window(int rank, std::int64_t batch) const;
  /// read_rank less the windows (metadata, frames, stacks), and read_window less the events: with
  /// read_events, a long window is read without holding its events whole (`memsnap export`).
  RankRecord read_rank_without_windows(int rank) const;
  WindowRecord read_window_without_events(int rank, std::int64_t batch) const;
  /// A window's events in order, handed to `piece` one storage chunk (65536 events) at a time;
  /// `piece` returns false to stop there.
  void read_events(int rank, std::int64_t batch, const std::function<bool(std::span<const Event>)>& piece) const;
  /// The batches (window names) stored for a rank, ascending by window index.
  std::vector<std::int64_t> batches(int rank) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace memsnap
