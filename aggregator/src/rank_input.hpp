// One aggregation input (a spill or an in-memory record) through analysis and its rank file,
// and rank 0's decision from every input's result: the parts of aggregate.cpp that involve no
// MPI, shared with `memsnap info` (info.cpp), which analyses spills without writing a store.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memsnap/findings.hpp"
#include "memsnap/record.hpp"
#include "memsnap/record_fields.hpp"
#include "memsnap/store.hpp"
#include "memsnap/store_rows.hpp"

namespace memsnap {

/// What rank 0 learns about one input, whichever aggregator rank processed it.
struct ItemResult {
  std::uint32_t index = 0;
  std::string name;        // the spill's path (or "in-memory record of rank R")
  std::string spill;       // file name only
  std::int32_t rank = -1;  // -1: unknown (unreadable and not named rank<R>...)
  bool loaded = false;     // a record came out, possibly partial
  bool written = false;    // its part file exists
  std::string status;      // ok | truncated | corrupt | error
  std::string detail;
  RankMeta meta;           // config_json and identity; no device_total_bytes needed
  std::uint32_t n_windows = 0;
  std::vector<SummaryRow> rows;
  std::vector<SiteRow> sites;
  // The cross-rank digest of its windows (memsnap/findings.hpp), for rank 0's findings.
  DigestTables digest;
};

/// Gathered to rank 0 as bytes (memsnap/codec.hpp), field by field.
template <>
struct Fields<ItemResult> {
  static constexpr auto list = std::tuple{
      field("index", &ItemResult::index),   field("name", &ItemResult::name),           field("spill", &ItemResult::spill),
      field("rank", &ItemResult::rank),     field("loaded", &ItemResult::loaded),       field("written", &ItemResult::written),
      field("status", &ItemResult::status), field("detail", &ItemResult::detail),       field("meta", &ItemResult::meta),
      field("n_windows", &ItemResult::n_windows), field("rows", &ItemResult::rows),     field("sites", &ItemResult::sites),
      field("digest", &ItemResult::digest)};
};

struct ItemInput {
  std::uint32_t index = 0;
  std::filesystem::path spill;                      // read from here, unless record is set
  const RankRecord* record = nullptr;  // in-job: the caller's record
};

struct ProcessOptions {
  std::size_t top_sites = 32;
  int deflate = 1;
  unsigned threads = 0;  // that compress the rank file's chunks (StoreWriteOptions::threads)
  std::optional<std::filesystem::path> part_dir;  // where to write the part file; unset: analyse only
};

/// An input read and analysed, its rank file not yet written.
struct LoadedItem {
  ItemResult result;
  std::optional<RankRecord> owned;       // the record read from the spill
  const RankRecord* external = nullptr;  // or the caller's (in-job)
  bool analysed = false;                 // false: it failed to load or analyse, nothing to write
  /// What to write; null when nothing is. (Not a stored pointer: a LoadedItem moves.)
  const RankRecord* record() const {
    if (!analysed) return nullptr;
    return owned ? &*owned : external;
  }
};

/// Loads and analyses one input, reading a spill into the memory of `reuse` (a record done with).
/// Never throws: failures are results. Touches no MPI and no HDF5, so it may run on a thread
/// beside the writer.
LoadedItem load_item(const ItemInput& in, const ProcessOptions& o, RankRecord&& reuse = {});

/// Writes a loaded input's part file into o.part_dir (when set); failures land in its result.
void write_item(LoadedItem& item, const ProcessOptions& o, RankFileWriter& writer);

/// load_item, then write_item with a writer of its own. Never throws: failures are results.
ItemResult process_item(const ItemInput& in, const ProcessOptions& o);

/// The data file names inside STORE.d: a part file while the store is built, renamed to its
/// rank's file once rank 0 has decided.
std::string part_file_name(std::uint32_t index);
std::string rank_file_name(int rank);

struct Resolution {
  int world_size = 0;
  std::string run_name;
  std::string config_json;
  std::vector<RankInfo> ranks;
  std::vector<SummaryRow> rows;
  std::vector<SiteRow> sites;
  DigestTables digest;                        // of the windows of the ranks kept
  std::vector<std::string> problems;          // one line per bad rank or file
  std::map<std::string, int> bad_counts;      // ranks by non-ok status
  std::vector<std::pair<std::uint32_t, int>> keep;  // written parts used: (item index, rank)
  std::vector<std::uint32_t> discard;         // written parts not used
};

/// Decides, from every input's result, what the store holds for each rank 0..world_size-1.
/// `data_dir_name` names the folder of rank files as seen from the root file ("" for info only).
/// Depends only on the inputs (sorted by index), never on which aggregator rank read what.
Resolution resolve(std::vector<ItemResult> items, const std::string& data_dir_name);

/// "2 missing, 1 truncated": the bad ranks by status.
std::string headline_counts(const Resolution& res);

}  // namespace memsnap
