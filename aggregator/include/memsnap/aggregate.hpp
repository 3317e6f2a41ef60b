// Aggregation: every rank's spill (or in-memory record) analysed and written into one HDF5 store,
// in parallel over MPI; plus `memsnap info` for stores and spill folders.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "memsnap/errors.hpp"
#include "memsnap/numeric.hpp"  // human_bytes, for code that found it here
#include "memsnap/record.hpp"
#include "memsnap/store.hpp"

namespace memsnap {

/// What one aggregator rank did: its spills, their bytes and events, and how long it took from
/// the shared plan to its last rank file written (what the aggregation benchmark prints).
struct AggregateStats {
  std::size_t spills = 0;
  std::uint64_t spill_bytes = 0;
  std::uint64_t events = 0;
  double seconds = 0;
  unsigned threads = 0;  // compression threads it used
};

/// What a successful aggregation wrote (filled on rank 0), for the command's closing line.
struct AggregateDone {
  bool filled = false;            // set on rank 0 once the store is in place
  int ranks = 0;                  // the store's world size
  std::size_t windows = 0;        // recorded windows of all ranks
  std::size_t marked = 0;         // ranks marked missing, truncated, corrupt or failed (--keep-going)
};

struct AggregateOptions {
  std::filesystem::path run_dir;  // holds spill/*.spill (or *.spill)
  std::filesystem::path output;   // the store; empty: RUN_DIR/memsnap.h5
  std::string launch;             // whose records: a launch id (RankMeta::launch); empty: the newest
                                  // launch's, with a line naming those left out (choose_launch)
  bool keep_going = false;        // write the store even with missing/truncated/corrupt ranks, marked
  bool overwrite = false;         // replace an existing store
  bool progress = false;          // "ranks done / total" on rank 0's stderr (in place on a terminal)
  std::size_t top_sites = 32;     // allocation sites kept per window in /sites
  int deflate = 1;                // compression of the bulk datasets (0: none)
  unsigned threads = 0;           // compression threads per aggregator rank; 0: the node's cores
                                  // shared out among the aggregator ranks on it
  std::ostream* log = nullptr;    // warnings (keep_going) from rank 0; nullptr: std::cerr
  AggregateStats* stats = nullptr;  // filled with this rank's share of the work (benchmarks)
  AggregateDone* done = nullptr;  // rank 0: filled with what the store holds once it is in place
  std::string verb = "memsnap aggregate";  // labels warnings and progress ("memsnap import" for import)
};

/// Aggregates RUN_DIR's spills into the store. Collective over `comm` (any size; ranks beyond
/// the number of spills idle). The store is built under a temporary name and renamed into place,
/// so a failed run leaves nothing behind and an existing store is only replaced with overwrite.
/// Returns 0. Throws AggregateError on every rank alike (what() is one line; details() names
/// each bad rank or file): no rank hangs when another fails.
int aggregate(const AggregateOptions& options, MPI_Comm comm);

/// The `memsnap aggregate` command: initialises MPI if nobody did (and finalises it then),
/// aggregates over MPI_COMM_WORLD, prints errors on rank 0 as "memsnap aggregate: ..." lines
/// and returns the exit code (0 ok, 1 failed).
int aggregate_main(const AggregateOptions& options);

/// Writes a store from inside an MPI program that links memsnap: each rank hands its own record
/// (e.g. read back from its spill after a window closed) and the ranks write collectively, each
/// its own rank file, rank 0 the root. The communicator is duplicated and freed with the writer.
struct InJobOptions {
  std::filesystem::path output;  // the store
  bool overwrite = false;
  bool keep_going = true;        // a rank with a truncated/corrupt record is marked, not fatal
  std::size_t top_sites = 32;
  int deflate = 1;
};

class InJobWriter {
 public:
  /// Throws AggregateError when MPI is not initialised or already finalized.
  InJobWriter(MPI_Comm comm, InJobOptions options);
  ~InJobWriter();
  InJobWriter(const InJobWriter&) = delete;
  InJobWriter& operator=(const InJobWriter&) = delete;

  /// Collective: every rank calls it, with its record or nullptr when it has none. Throws
  /// AggregateError on every rank alike.
  void write(const RankRecord* record);
  /// Collective: every rank calls it with its own spill file (empty path: none).
  void write_spill(const std::filesystem::path& spill);

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

/// `memsnap info STORE --json`: {"format_version":1,"run_name","world_size","ranks":[{"rank",
/// "status","host","windows":[{"batch","batch_start","events","dropped","peak_allocated",
/// "peak_reserved","live_at_open","live_at_close","oom","status","batch_method",
/// "batch_confidence"}]}]}: batch_method is how the window's batch boundaries were found
/// (WindowRecord::batch_method: "recorded" or an inference method), batch_confidence 0..1.
/// Depends only on the recorded data, never on how (or by how many ranks) it was aggregated.
nlohmann::json store_info_json(const StoreReader& store);

/// The same, computed from a run folder's spill files directly (each window analysed).
nlohmann::json spill_info_json(const std::filesystem::path& run_dir);

/// A human table of an info JSON: per rank and window, sizes in KiB/MiB/GiB.
void print_info_table(const nlohmann::json& info, std::ostream& out);

/// `memsnap info PATH [--json]` for a store file or a spill folder; errors go to stderr as
/// "memsnap info: ..." lines. Returns the exit code.
int info_main(const std::string& path, bool json, std::ostream& out);

}  // namespace memsnap
