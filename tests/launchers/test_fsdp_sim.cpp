// The demo workload under a real mpirun: 4 ranks' spills hold what the options planted.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "memsnap/analysis.hpp"
#include "memsnap/spill.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

struct DemoRun {
  test::TempDir dir;
  std::map<int, RankRecord> ranks;
};

// Runs fsdp_sim under mpirun with `args`, recording every batch from batch 2 on.
void run_demo(DemoRun& run, const std::string& args, const std::string& config_lines) {
  test::write_file(run.dir / "memsnap.yaml", "run_name: t\nskip_batches: 1\ninterval: 3\nrepeat: 1\n" + config_lines);
  // Open MPI refuses root unless told twice; CI runs as root.
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MEMSNAP_MPIRUN) +
                          " --oversubscribe -np 4 env MEMSNAP_FOLDER=" +
                          run.dir.path().string() + " " + MEMSNAP_FSDP_SIM + " --step-us 0 --config " +
                          (run.dir / "memsnap.yaml").string() + " " + args + " > " +
                          (run.dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_file(run.dir / "log.txt");
  for (const auto& p : find_spills(run.dir.path())) {
    RankRecord r = read_spill(p);
    run.ranks[r.meta.rank] = std::move(r);
  }
  ASSERT_EQ(run.ranks.size(), 4u) << test::read_file(run.dir / "log.txt");
}

TEST(FsdpSim, FourRanksUnderMpirunPlantWhatTheOptionsSay) {
  DemoRun run;
  ASSERT_NO_FATAL_FAILURE(run_demo(run, "--batches 8 --layers 4 --hidden 512 --unsharded-rank 1 --leak-rank 2 --leak-mib 16 --spike 3:6", ""));
  for (const auto& [rank, rec] : run.ranks) {
    EXPECT_EQ(rec.status, RecordStatus::ok) << rec.status_detail;
    EXPECT_EQ(rec.meta.world_size, 4);
    ASSERT_EQ(rec.windows.size(), 2u) << "rank " << rank;
    EXPECT_EQ(rec.windows[0].batch_end, 4);
    EXPECT_EQ(rec.windows[1].batch_end, 7);
  }
  auto stats = [&](int rank, int window) { return analyse_window(run.ranks[rank], run.ranks[rank].windows[window]); };

  // Ranks 0 and 2 share the same shards; rank 1 keeps layer 0 whole: 3/4 of a layer more, for good.
  const std::uint64_t layer = 12ull * 512 * 512 * 2;
  const auto base = stats(0, 0), unsharded = stats(1, 0);
  EXPECT_EQ(unsharded.persistent - base.persistent, layer - layer / 4);
  EXPECT_EQ(unsharded.live_at_open - base.live_at_open, layer - layer / 4);

  // Rank 2 retains 16 MiB every batch: live bytes grow by exactly that per batch.
  const auto leak = stats(2, 0);
  ASSERT_EQ(leak.batches.size(), 3u);
  EXPECT_EQ(leak.live_at_close - leak.live_at_open, 3 * 16 * MiB);
  EXPECT_EQ(leak.batches[1].live_at_end - leak.batches[0].live_at_end, 16 * MiB);
  EXPECT_EQ(base.live_at_close, base.live_at_open) << "a healthy rank holds the same after a window";

  // Rank 3 sees a 4x longer sequence on batch 6 only: that batch's peak stands out.
  const auto spike = stats(3, 1);
  ASSERT_EQ(spike.batches.size(), 3u);
  EXPECT_EQ(spike.batches[1].batch, 6);
  EXPECT_GT(spike.batches[1].peak_allocated, spike.batches[0].peak_allocated + 3 * 4 * 1024 * 512 * 2 * 8);
  EXPECT_EQ(spike.batches[0].peak_allocated, spike.batches[2].peak_allocated);
  EXPECT_EQ(stats(0, 1).peak_allocated, stats(3, 0).peak_allocated) << "outside the spike rank 3 is like the others";

  // The caching allocator in the demo reserves segments: reserved >= allocated.
  EXPECT_TRUE(base.reserved_seen);
  EXPECT_GE(base.peak_reserved, base.peak_allocated);
}

TEST(FsdpSim, NativeStacksNameTheFsdpSitesAndCategories) {
  DemoRun run;
  ASSERT_NO_FATAL_FAILURE(run_demo(run, "--batches 4 --layers 2 --hidden 256", "stacks: native\n"));
  const auto s = analyse_window(run.ranks[0], run.ranks[0].windows[0]);
  std::map<std::string, std::uint64_t> by_category;
  bool saw_all_gather_site = false;
  for (const auto& site : s.sites) {
    by_category[category_name(site.category)] += site.bytes_at_peak;
    saw_all_gather_site |= site.name.find("all_gather_params") != std::string::npos;
  }
  EXPECT_TRUE(saw_all_gather_site);
  EXPECT_GT(by_category["parameters"], 0u);
  EXPECT_GT(by_category["optimizer_state"], 0u);
  EXPECT_GT(by_category["all_gather"], 0u);
  EXPECT_GT(by_category["activations"], 0u);
}

TEST(FsdpSim, OomIsRecordedAndTheWindowWrittenFlagged) {
  DemoRun run;
  ASSERT_NO_FATAL_FAILURE(run_demo(run, "--batches 6 --layers 2 --hidden 256 --device-gib 4 --oom 2:3", ""));
  const auto& rec = run.ranks[2];
  ASSERT_GE(rec.windows.size(), 1u);
  EXPECT_TRUE(rec.windows[0].oom);
  EXPECT_EQ(rec.windows[0].batch_end, 3) << "closed at the OOM's batch, not at 4";
  EXPECT_FALSE(run.ranks[1].windows[0].oom);
}

}  // namespace
}  // namespace memsnap
