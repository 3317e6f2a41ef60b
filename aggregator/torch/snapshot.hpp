// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot pickles) to memsnap records and back.
//
// Import: one pickle becomes one RankRecord with one WindowRecord holding every device's trace
// (Event::device = index into device_traces), merged by time with each device's order kept.
// Export: one window becomes a protocol-4 pickle with the keys and value types of _dump_snapshot,
// which pickle.load and torch.cuda._memory_viz read.
//
// What a round trip (import, then export with the ImportResult::extras) does not give back:
//  - Key order inside segment dicts is always device, address, total_size, allocated_size,
//    active_size, requested_size, stream, segment_type, segment_pool_id, is_expandable, frames,
//    blocks (torch 2.11 itself writes frames and blocks in either order). Dict equality in Python
//    ignores key order.
//  - Memo layout differs: the bytes are not identical, the values are. Frame lists that torch
//    shared by identity are shared again (one list per interned stack), which may share more.
//  - Trace entries whose action memsnap does not know are skipped (counted in
//    extras["skipped_entries"]); entries on device traces are exported in their original order.
//  - Integers are read as unsigned 64-bit for addr/size/stream/device_free: a negative value there
//    (never seen in torch output) comes back as its two's-complement unsigned value.
//  - Frame line numbers are kept as 32-bit unsigned.
//  - Without extras (e.g. a record read back from the store): segment_pool_id is (0, 0),
//    is_expandable is true only when a segment_map/unmap event falls inside the segment, segment
//    frames are [], compile_context is "N/A", user_metadata is "", allocator_settings is {} and
//    external_annotations is absent. allocated/active/requested sizes are derived from the blocks
//    (the same sums torch reports).
//  - Events on device -1 (host memory, from other sources) have no device trace and are left out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "memsnap/record.hpp"
#include "torch/pickle.hpp"

namespace memsnap::torch {

/// A pickle that parsed but is not a memory snapshot (missing key, wrong type).
class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Who and when the snapshot belongs to; torch pickles carry neither.
struct ImportOptions {
  int rank = 0;
  int world_size = 0;           // 0: unknown
  std::int64_t batch = 0;       // the window's batch_end (Composer's {batch})
  std::int64_t batch_start = -1;  // -1: derived (see import_snapshot_full)
  std::string run_name;
};

/// The record plus what has no place in it, as JSON:
///  "allocator_settings", "external_annotations"  (as in the pickle; tuples become arrays)
///  "device_count"        number of device traces
///  "segments"            one object per window segment: "stack" (frame stack id, -1 when the
///                        segment has no frames key), "segment_pool_id" [a, b], "is_expandable",
///                        "allocated_size", "active_size", "requested_size"
///  "trace_extras"        [{"device", "index", "compile_context"?, "user_metadata"?, "other"?}]
///                        only for entries whose values differ from "N/A" / "" or carry other keys
///  "skipped_entries"     trace entries with an unknown action
///  "other_keys"          top-level keys memsnap does not interpret
struct ImportResult {
  RankRecord record;
  nlohmann::json extras;
};

/// Imports a parsed snapshot. Frames are interned (name, filename, line) into record.frames and
/// frame lists into record.stacks, innermost first as torch lists them; a frame list shared in the
/// pickle is interned once by pointer before falling back to content.
///
/// live_at_start is reconstructed so that replaying the window's events from it gives the
/// allocator state at dump: allocations (alloc ... free_completed, keyed by device and address)
/// and reserved ranges (segment_alloc/map add, segment_free/unmap remove) that were live before
/// the trace began. See the comment in snapshot.cpp for the edge cases.
///
/// Batches: torch records no batch markers. External annotations that name a step or batch
/// ("ProfilerStep#5", "batch 3", any name with "step"/"batch") start a batch at their START;
/// failing those, each END of "Optimizer.step..." starts the next batch. Marks are numbered from
/// a trailing number in the name when every mark has one, else so that the last is opt.batch.
/// batch_start is opt.batch_start when given, else the batch before the first mark, else
/// opt.batch.
ImportResult import_snapshot_full(const pickle::Value& root, const ImportOptions& opt);

/// import_snapshot_full without the extras.
RankRecord import_snapshot(const pickle::Value& root, const ImportOptions& opt);

/// Reads and imports a pickle file; record.path is set. PickleError or SnapshotError.
ImportResult import_snapshot_file(const std::string& path, const ImportOptions& opt);

/// Builds the snapshot value of one window (what export_snapshot pickles).
pickle::ValuePtr snapshot_value(const RankRecord& record, std::size_t window_index,
                                const nlohmann::json& extras = nlohmann::json());

/// One window as protocol-4 pickle bytes in _dump_snapshot's layout. Pass the extras from
/// import_snapshot_full for a faithful round trip. SnapshotError if window_index is out of range.
std::string export_snapshot(const RankRecord& record, std::size_t window_index);
std::string export_snapshot(const RankRecord& record, std::size_t window_index,
                            const nlohmann::json& extras);

/// Converts a pickled value to JSON (tuples to arrays, bytes to {"__bytes_hex__": ...}, ints
/// beyond 64 bits to their decimal text, non-str dict keys to their decimal/text form).
nlohmann::json to_json(const pickle::Value& value);
/// The inverse for JSON types (arrays become lists).
pickle::ValuePtr from_json(const nlohmann::json& json);

}  // namespace memsnap::torch
