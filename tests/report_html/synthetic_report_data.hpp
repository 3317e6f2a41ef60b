// Realistic synthetic report data (FSDP-like training ranks) for the HTML report tests.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace memsnap::test {

struct RankPageSpec {
  int rank = 0;
  int world_size = 4;
  int batch_end = 4;            // the window covers batches batch_end-2 .. batch_end
  int n_allocs = 2000;          // allocations listed one by one
  std::int64_t other_allocs = 20000;  // allocations summarised in the "other" band
  int layers = 24;
  double shard_scale = 1.0;     // > 1: this rank holds a larger parameter shard
  bool leak = false;            // 64 MiB per batch never freed
  bool oom = false;             // the window ends in an out-of-memory error
  bool hostile = false;         // strings that try to break out of the page
  std::uint64_t seed = 1;
};

/// A rank page object as report/ builds it from the store (see report/html/html.hpp).
nlohmann::json synthetic_rank_page(const RankPageSpec& spec);

struct CrossPageSpec {
  int world_size = 4;
  int windows = 3;
  int leak_rank = 3;        // -1: none
  int imbalance_rank = 1;   // -1: none
  int spike_rank = -1;
  int oom_rank = -1;
  int missing_rank = -1;
  int truncated_rank = -1;
  int n_site_diffs = 40;
  bool hostile = false;
  std::uint64_t seed = 7;
};

/// A cross-rank page object as report/ builds it from the gathered summaries.
nlohmann::json synthetic_cross_page(const CrossPageSpec& spec);

}  // namespace memsnap::test
