// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot pickles) to memsnap records and back.
//
// Import: one pickle becomes one RankRecord with one WindowRecord holding every device's trace
// (Event::device = index into device_traces), merged by time with each device's order kept.
// Export: one window becomes a protocol-4 pickle with the keys and value types of _dump_snapshot,
// which pickle.load and torch.cuda._memory_viz read.
//
// A round trip (import, then export with the ImportResult::extras, also through the store,
// which keeps them as WindowRecord::source_extras) gives back the same values as pickle.load
// sees them: segments with their blocks, pool ids, expandable flags and frames, every device
// trace entry with its compile_context, user_metadata and unknown keys, entries whose action
// memsnap does not know at their place, allocator_settings, external_annotations and any other
// top-level key, and keys a snapshot lacks stay absent. What it does not give back:
//  - Key order inside dicts (Python's dict equality ignores it), and the memo layout: the bytes
//    are not identical, the values are. Frame lists that torch shared by identity are shared
//    again (one list per interned stack), which may share more.
//  - Frames are kept as (name, filename, line): other keys of a frame dict, a name or filename
//    that is not a str (read as ""), a line outside 0..2^32-1 and a tuple of frames (a list
//    again) are not.
//  - Values nested deeper than 200 containers in the extras come back as a marker string.
//  - Without extras (e.g. a record from a source other than torch, or from a store written
//    before source_extras existed): segment_pool_id is (0, 0), is_expandable is true only when a
//    segment_map/unmap event falls inside the segment, segment frames are [], compile_context is
//    "N/A", user_metadata is "", allocator_settings is {} and external_annotations is absent.
//    allocated/active/requested sizes are derived from the blocks (the same sums torch reports).
//  - Events on device -1 (host memory, from other sources) have no device trace and are left out.
//  - A record changed after import (events dropped, windows merged) keeps its extras by position:
//    notes for entries that no longer exist are ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "memsnap/record.hpp"
#include "torch/pickle.hpp"

namespace memsnap::torch {

/// A pickle that parsed but is not a memory snapshot (missing key, wrong type).
class SnapshotError : public Error {
 public:
  using Error::Error;
};

/// Who and when the snapshot belongs to; torch pickles carry neither.
struct ImportOptions {
  int rank = 0;
  int world_size = 0;           // 0: unknown
  std::int64_t batch = 0;       // the window's batch_end (Composer's {batch}); -1: nothing names it,
                                // the trace's batches count from 1 and the window is named after its last
  std::int64_t batch_start = -1;  // -1: derived (see import_snapshot_full)
  int expected_batches = 0;       // batches the window spans when known (the config's interval)
  std::string run_name;
  // Bytes of the pickle read so far, added as the reader passes them (pickle::ReadOptions::
  // progress): for a progress line, read from another thread.
  std::atomic<std::uint64_t>* progress = nullptr;
  // Trace entries of the common shape read without a tree (pickle::ReadOptions::flat_entries);
  // the same result either way: tests and benchmarks turn it off to compare.
  bool flat_entries = true;
};

/// The record plus what has no place in it, as JSON (pickled values as to_json writes them):
///  "allocator_settings", "external_annotations"  as in the pickle
///  "device_count"        number of device traces ("none_traces": those that were None)
///  "segments"            one object per window segment: "stack" (frame stack id, -1 when the
///                        segment has no frames key), "segment_pool_id", "is_expandable",
///                        "allocated_size", "active_size", "requested_size", and where the
///                        segment differs from what export writes from the record: "absent"
///                        (keys it lacks, or holds with another type), "other" (those values and
///                        keys memsnap does not know, as a dict), "blocks_x" ([{"index",
///                        "absent"?, "other"?}] for such blocks)
///  "trace_extras"        [{"device", "index", "compile_context"?, "user_metadata"?, "absent"?,
///                        "other"?}] for entries whose values differ from "N/A" / "" or whose
///                        shape differs; index counts the device's known entries (its events)
///  "trace_absent"        keys no trace entry has (torch before 2.2: compile_context, user_metadata)
///  "unknown_entries"     [{"device", "position", "entry", "stack"?}]: entries whose action memsnap
///                        does not know, at `position` in their device's trace as torch wrote it;
///                        "entry" is the whole entry, less its frames when those are interned
///                        as "stack"
///  "skipped_entries"     how many entries those are: trace entries that are no event, so no
///                        analysis sees them (export still writes them back)
///  "absent"              which of segments, device_traces, allocator_settings the snapshot lacks
///  "other_keys"          top-level keys memsnap does not interpret, as one dict
struct ImportResult {
  RankRecord record;
  nlohmann::json extras;
  // How many trace entries were read without a tree (ImportOptions::flat_entries), for tests and
  // benchmarks; not kept in the store.
  std::size_t flat_entries = 0;
};

/// Imports a parsed snapshot. Frames are interned (name, filename, line) into record.frames and
/// frame lists into record.stacks, innermost first as torch lists them; a frame list shared in the
/// pickle is interned once by pointer before falling back to content.
///
/// live_at_start is reconstructed so that replaying the window's events from it gives the
/// allocator state at dump: allocations (alloc ... free_completed, keyed by device and address)
/// and reserved ranges (segment_alloc/map add, segment_free/unmap remove) that were live before
/// the trace began. See the comment in snapshot_window.cpp for the edge cases.
///
/// Batches: torch records no batch markers. Annotations that name a step or batch
/// ("ProfilerStep#5", "batch 3") are the trace's own marks (batch_method "recorded", numbered
/// from a trailing number in the name when every mark has one); failing those, the boundaries are
/// inferred from the trace (memsnap/batch_inference.hpp: a recurring annotation such as
/// Optimizer.step, a recurring frame, the allocation sequence's period), with the method and its
/// confidence kept in the window. Unnumbered marks end at opt.batch (the window closes with the
/// batch it is named after). opt.batch_start, when given, renumbers them from it.
ImportResult import_snapshot_full(const pickle::Value& root, const ImportOptions& opt);

/// import_snapshot_full without the extras.
RankRecord import_snapshot(const pickle::Value& root, const ImportOptions& opt);

/// Reads and imports a pickle file; record.path is set. PickleError or SnapshotError, whose
/// message starts with the path. The file is mapped, not copied, and read as a stream: trace
/// entries are imported as the reader meets them and not kept as values (pickle::read_streaming),
/// so memory holds the record, the segments and the nodes the pickle refers to more than once.
/// The result is the same as import_snapshot_full of pickle::read_file. Safe to call from several
/// threads at once (on different files or the same).
ImportResult import_snapshot_file(const std::string& path, const ImportOptions& opt);
/// import_snapshot_file of bytes in memory; `name` starts every error message.
ImportResult import_snapshot_data(std::string_view data, const std::string& name, const ImportOptions& opt);

/// One window as protocol-4 pickle bytes in _dump_snapshot's layout. Pass the extras from
/// import_snapshot_full for a faithful round trip. SnapshotError if window_index is out of range.
std::string export_snapshot(const RankRecord& record, std::size_t window_index);
std::string export_snapshot(const RankRecord& record, std::size_t window_index,
                            const nlohmann::json& extras);

/// Converts a pickled value to JSON that from_json turns back into an equal value: None, bools,
/// ints within 64 bits, finite floats, UTF-8 strs, lists and dicts with UTF-8 str keys as JSON's
/// own types; anything else as a one-member object: {"__tuple__": [...]}, {"__bytes_hex__": h},
/// {"__str_hex__": h} (a str that is not UTF-8), {"__int_le_hex__": h} (an int beyond 64 bits,
/// two's-complement little-endian), {"__float__": "nan" | "inf" | "-inf"}, {"__dict__": [[k, v],
/// ...]} (a dict with other keys, or one that would read as such an object). Values nested
/// deeper than 200 containers become a marker string. Shared references are expanded:
/// SnapshotError when that makes more than 2^20 values and 64 times the distinct values read.
nlohmann::json to_json(const pickle::Value& value);
/// The inverse (JSON arrays become lists).
pickle::ValuePtr from_json(const nlohmann::json& json);

/// Adds `stack_base` to every stack id the extras name (segments' and unknown entries' "stack"):
/// when a record's stacks are appended to another's, its extras must follow.
void shift_extras_stacks(nlohmann::json& extras, std::uint32_t stack_base);

}  // namespace memsnap::torch
