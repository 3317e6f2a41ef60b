// PyTorch interop at the command line: `memsnap import` (snapshot pickles into a store) and
// `memsnap export` (a stored window back out as a torch snapshot or a Chrome/Perfetto trace).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace memsnap {

struct ImportCliOptions {
  std::vector<std::filesystem::path> pickles;
  std::filesystem::path output;                     // the store
  std::string name_template = "rank{rank}.{batch}";  // rank and batch from each file name
  std::optional<int> rank;                          // with batch: for a single file
  std::optional<std::int64_t> batch;
  int world_size = 0;                               // 0: highest rank + 1
  int interval = 0;                                 // batches per window (0: unknown, inferred)
  std::string config;                               // a config file whose interval to use (--config)
  std::string run_name;                             // empty: the store's file name
  bool overwrite = false;
  bool keep_going = false;
  unsigned threads = 0;                             // pickles read at once (0: the CPUs, shared among the node's ranks)
  std::string verb = "memsnap import";             // how its lines start (memsnap view imports too)
  bool suggest_report = true;                       // end with "next: memsnap report STORE"
};

/// The snapshot files `paths` name: a file as it is, a folder as the *.pickle and *.pkl files in
/// it (not its subfolders), in name order. Throws std::runtime_error with one line naming a
/// folder that holds none, or a path that cannot be read.
std::vector<std::filesystem::path> expand_pickle_paths(const std::vector<std::filesystem::path>& paths);

// Rank and batch of a file name under a template such as "rank{rank}.{batch}" (matched against
// the start of the name). nullopt when the name does not fit.
std::optional<std::pair<int, std::int64_t>> parse_rank_batch(const std::string& file_name, const std::string& tmpl);

int import_main(const ImportCliOptions& options);

struct ExportCliOptions {
  std::filesystem::path store;
  int rank = 0;
  std::int64_t batch = 0;
  std::string format = "torch";  // torch | chrome
  std::filesystem::path output;
  bool overwrite = false;
};

int export_main(const ExportCliOptions& options);

}  // namespace memsnap
