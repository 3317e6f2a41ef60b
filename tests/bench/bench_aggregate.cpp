// memsnap_bench_aggregate: throughput and memory of aggregation on synthetic spills.
//
//   memsnap_bench_aggregate gen DIR RANKS EVENTS     write RANKS spills of EVENTS events each
//   mpirun -np M memsnap_bench_aggregate run DIR     aggregate DIR/spill into DIR/bench.h5
//
// `run` prints the whole run's events/s and MB/s (spill bytes aggregated per second), then for
// every aggregator rank its share: spills, MB/s and events/s over its own time, its CPU seconds,
// compression threads, and its peak RSS (getrusage), which must stay flat as the number of job
// ranks grows: each aggregator rank holds two spills at most (one read while the other is written). MEMSNAP_BENCH_DEFLATE sets the deflate level,
// MEMSNAP_BENCH_THREADS the compression threads per rank (default: the node's cores shared).
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "memsnap/aggregate.hpp"
#include "spill_gen.hpp"

namespace fs = std::filesystem;

static int gen(const fs::path& dir, int ranks, std::size_t events) {
  fs::create_directories(dir / "spill");
  const auto t0 = std::chrono::steady_clock::now();
  std::uintmax_t bytes = 0;
  for (int r = 0; r < ranks; ++r) {
    const auto path = dir / "spill" / memsnap::spill_file_name(r, 1000 + r);
    if (!memsnap::test::write_spill_file(path, memsnap::test::make_bench_record(r, ranks, events), true)) {
      std::cerr << "cannot write " << path << "\n";
      return 1;
    }
    bytes += fs::file_size(path);
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("generated %d spills x %zu events, %.1f MB in %.1f s\n", ranks, events, bytes / 1e6, sec);
  return 0;
}

static int run(const fs::path& dir) {
  MPI_Init(nullptr, nullptr);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const fs::path store = dir / "bench.h5";
  std::uintmax_t bytes = 0;
  std::size_t spills = 0;
  for (const auto& f : memsnap::find_spills(dir)) {
    bytes += fs::file_size(f);
    ++spills;
  }
  memsnap::AggregateOptions o;
  o.run_dir = dir;
  o.output = store;
  o.overwrite = true;
  if (const char* d = std::getenv("MEMSNAP_BENCH_DEFLATE")) o.deflate = std::atoi(d);
  if (const char* t = std::getenv("MEMSNAP_BENCH_THREADS")) o.threads = static_cast<unsigned>(std::atoi(t));
  memsnap::AggregateStats stats;
  o.stats = &stats;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  int rc = 0;
  try {
    memsnap::aggregate(o, MPI_COMM_WORLD);
  } catch (const memsnap::Error& e) {
    if (rank == 0) std::cerr << "bench: " << e.what() << "\n";
    rc = 1;
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  // Per aggregator rank: peak RSS (KiB), spills, spill bytes, events, seconds, threads, CPU seconds.
  constexpr int kStats = 7;
  const double mine[kStats] = {static_cast<double>(ru.ru_maxrss), static_cast<double>(stats.spills),
                               static_cast<double>(stats.spill_bytes), static_cast<double>(stats.events), stats.seconds,
                               static_cast<double>(stats.threads), cpu};
  std::vector<double> all(kStats * static_cast<std::size_t>(size));
  MPI_Gather(mine, kStats, MPI_DOUBLE, all.data(), kStats, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0 && rc == 0) {
    std::uint64_t events = 0;
    for (const auto& row : memsnap::StoreReader(store).summary()) events += row.n_events;
    std::uintmax_t out_bytes = fs::file_size(store);
    for (const auto& f : fs::directory_iterator(memsnap::store_data_dir(store))) out_bytes += fs::file_size(f.path());
    std::printf("np=%d spills=%zu events=%llu in=%.1f MB out=%.1f MB time=%.2f s  %.2f Mevents/s  %.1f MB/s  deflate=%d (%s)\n",
                size, spills, static_cast<unsigned long long>(events), bytes / 1e6, out_bytes / 1e6, sec,
                events / sec / 1e6, bytes / sec / 1e6, o.deflate, memsnap::deflate_implementation());
    for (int r = 0; r < size; ++r) {
      const double* s = &all[kStats * static_cast<std::size_t>(r)];
      const double t = s[4] > 0 ? s[4] : 1e-9;
      std::printf("  aggregator rank %d: %.0f spills, %.1f MB, %.2f s: %.1f MB/s, %.2f Mevents/s; %.2f s CPU (whole process); "
                  "%.0f threads; peak RSS %.1f MiB\n",
                  r, s[1], s[2] / 1e6, s[4], s[2] / t / 1e6, s[3] / t / 1e6, s[6], s[5], s[0] / 1024.0);
    }
  }
  MPI_Finalize();
  return rc;
}

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "gen" && argc == 5) return gen(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  if (cmd == "run" && argc == 3) return run(argv[2]);
  std::cerr << "usage: " << argv[0] << " gen DIR RANKS EVENTS | run DIR\n";
  return 2;
}
