// What one rank recorded, as read back from its spill (or imported from a torch snapshot):
// the unit the aggregator analyses and the store keeps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memsnap/event.hpp"

namespace memsnap {

// Who recorded: filled from the launcher's environment and the process.
struct RankMeta {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  std::string host;
  std::int64_t pid = 0;
  std::string run_name;
  std::string source = "api";        // api | cupti | torch
  std::string device_name;           // e.g. "NVIDIA H200" (empty when unknown)
  std::string config_json;           // the effective configuration, as JSON text
  std::string tool_version;
  std::int64_t start_unix_ns = 0;    // wall clock when recording began
  std::int64_t clock_offset_ns = 0;  // wall clock minus event clock, to line up nodes roughly
  std::vector<std::uint64_t> device_total_bytes;  // by device index; 0 when unknown
  // The launch that recorded it (`memsnap run` passes its launch identity as MEMSNAP_LAUNCH):
  // a run folder may hold records of several launches, and one store is made of one. Empty when
  // nobody named the launch (a recorder started by hand, spills of memsnap before this field).
  std::string launch;
};

// Why a window or a record ended where it did.
enum class RecordStatus : std::uint8_t {
  ok = 0,         // complete
  truncated = 1,  // the process stopped mid-record (killed, crashed): a readable prefix
  corrupt = 2,    // damaged bytes: read up to the damage
  missing = 3,    // no record for a rank that the others say exists
};
const char* status_name(RecordStatus s);
/// status_name's inverse; a name it does not give reads as corrupt.
RecordStatus status_from_name(const std::string& name);

// One recorded window of batches [batch_start, batch_end]. Named by batch_end (Composer's {batch}).
struct WindowRecord {
  std::int64_t batch_start = 0;
  std::int64_t batch_end = 0;
  std::int64_t open_time_ns = 0;
  std::int64_t close_time_ns = 0;  // 0 when the window never closed (truncated)
  bool oom = false;                // closed by an out-of-memory event
  bool closed = false;             // a window-end record was read
  std::uint64_t dropped = 0;       // events dropped by the bounded history
  std::vector<LiveAlloc> live_at_start;  // allocations (and segments) live when it opened
  std::vector<Event> events;             // in time order
  std::vector<BatchMark> batches;        // batch starts inside the window
  std::vector<Segment> segments;         // allocator state at window end (may be empty)
  RecordStatus status = RecordStatus::ok;
  // How `batches` were found: "recorded" (the source marked them: NVTX, the C API, step-like
  // annotations in a torch trace), or inferred from the trace by "recurring_annotation",
  // "recurring_frame" or "periodicity"; "none" when a trace without marks yielded none.
  std::string batch_method = "recorded";
  double batch_confidence = 1.0;  // 0..1: how well the inferred boundaries fit (1 for recorded)
  std::string batch_detail;       // human words: which annotation or frame, the period, ...
  // What a torch snapshot held that the event model has no place for (see
  // torch::ImportResult::extras), as JSON text; empty for other sources. Kept so that export
  // gives the pickle back.
  std::string source_extras;
};

// Everything one rank (one process) recorded.
struct RankRecord {
  RankMeta meta;
  std::vector<Frame> frames;   // interned; ids index this vector
  std::vector<Stack> stacks;   // interned; Event::stack_id indexes this vector
  std::vector<WindowRecord> windows;
  RecordStatus status = RecordStatus::ok;
  std::string status_detail;   // human words for a non-ok status ("stops at byte 1234: ...")
  std::string path;            // file it was read from
  bool has_meta = false;       // the META record was read (else meta holds defaults)
  bool ended = false;          // the process shut down cleanly (the END record)
  bool used_mpi = false;       // the process had initialised MPI itself (from the END record)
};

}  // namespace memsnap
