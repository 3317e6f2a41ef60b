// Fixtures shared by the findings' and the cross-rank page's tests: a run's index made by hand,
// one window per rank, as the store's /ranks and /summary would hold it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "memsnap/store.hpp"

namespace memsnap::test {

inline constexpr std::uint64_t MiB = 1024 * 1024;

/// A run of `ranks` ranks, each with one window once window() gives it one, and its /sites rows.
struct FakeRunIndex {
  StoreInfo info;
  std::vector<SiteRow> sites;

  explicit FakeRunIndex(int ranks) {
    info.run_name = "t";
    info.world_size = ranks;
    for (int r = 0; r < ranks; ++r) {
      RankInfo ri;
      ri.rank = r;
      ri.n_windows = 1;
      info.ranks.push_back(ri);
    }
  }

  /// The summary row of rank `rank`'s one window (batches 2..4): allocated bytes at its open and
  /// close, and its peak (allocated and reserved).
  void window(int rank, std::uint64_t open, std::uint64_t close, std::uint64_t peak) {
    SummaryRow row;
    row.rank = rank;
    row.window = 0;
    row.batch_start = 2;
    row.batch_end = 4;
    row.live_at_open = open;
    row.live_at_close = close;
    row.persistent = std::min(open, close);
    row.peak_allocated = row.peak_reserved = peak;
    info.rows.push_back(row);
  }
};

}  // namespace memsnap::test
