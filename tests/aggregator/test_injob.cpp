// In-job store writing: an MPI program whose ranks hand their own records (or spills) to
// InJobWriter. Run under mpirun; exits non-zero on any failed check (on any rank).
#include <mpi.h>

#include <cstring>
#include <iostream>

#include "memsnap/aggregate.hpp"
#include "memsnap/store.hpp"
#include "spill_gen.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::cerr << "test_injob rank " << rank << ": FAILED: " << what << "\n";
  }
}

bool same_events(const memsnap::WindowRecord& a, const memsnap::WindowRecord& b) {
  return a.events.size() == b.events.size() &&
         std::memcmp(a.events.data(), b.events.data(), a.events.size() * sizeof(memsnap::Event)) == 0 &&
         a.live_at_start == b.live_at_start && a.batches == b.batches && a.segments == b.segments &&
         a.batch_end == b.batch_end && a.status == b.status;
}

memsnap::RankRecord record_of(int rank, int world) {
  memsnap::test::GenSpec s;
  s.rank = rank;
  s.world_size = world;
  s.run_name = "injob";
  s.events_per_window = 300 + 11 * static_cast<std::size_t>(rank);
  return memsnap::test::make_record(s);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // A folder every rank sees: rank 0 makes it.
  char dir[256] = {};
  if (rank == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "memsnap-injob-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) MPI_Abort(MPI_COMM_WORLD, 2);
    std::strncpy(dir, tmpl.c_str(), sizeof dir - 1);
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::filesystem::path root(dir);

  const memsnap::RankRecord mine = record_of(rank, size);
  try {
    memsnap::InJobOptions o;
    o.output = root / "injob.h5";
    memsnap::InJobWriter writer(MPI_COMM_WORLD, o);
    writer.write(&mine);
    if (rank == 0) {
      memsnap::StoreReader store(o.output);
      const auto info = store.info();
      check(info.world_size == size, "world size");
      check(info.run_name == "injob", "run name");
      for (int r = 0; r < size; ++r) {
        const auto want = record_of(r, size);
        const auto got = store.read_rank(r);
        check(got.frames == want.frames && got.stacks == want.stacks, "frames and stacks of rank " + std::to_string(r));
        check(got.windows.size() == want.windows.size(), "windows of rank " + std::to_string(r));
        for (std::size_t w = 0; w < got.windows.size() && w < want.windows.size(); ++w) {
          check(same_events(got.windows[w], want.windows[w]), "window data of rank " + std::to_string(r));
        }
      }
    }

    // A second write to the same store fails on every rank alike and leaves it untouched.
    bool threw = false;
    try {
      writer.write(&mine);
    } catch (const memsnap::AggregateError& e) {
      threw = std::string(e.what()).find("already exists") != std::string::npos;
    }
    check(threw, "a second write must refuse to overwrite, on every rank");
  } catch (const std::exception& e) {
    check(false, std::string("unexpected: ") + e.what());
  }

  // From each rank's own spill; the last rank has none and shows up as missing.
  try {
    const auto spill = root / memsnap::spill_file_name(rank, 1000 + rank);
    check(memsnap::test::write_spill_file(spill, mine, true), "write spill");
    memsnap::InJobOptions o;
    o.output = root / "from_spills.h5";
    memsnap::InJobWriter writer(MPI_COMM_WORLD, o);
    writer.write_spill(rank == size - 1 && size > 1 ? std::filesystem::path() : spill);
    if (rank == 0) {
      memsnap::StoreReader store(o.output);
      const auto ranks = store.ranks();
      check(static_cast<int>(ranks.size()) == size, "ranks in the store from spills");
      if (size > 1) check(ranks.back().status == "missing", "the rank without a spill is missing");
      check(same_events(store.read_rank(0).windows[0], record_of(0, size).windows[0]), "rank 0 from its spill");
    }
  } catch (const std::exception& e) {
    check(false, std::string("unexpected: ") + e.what());
  }

  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
    std::cout << (total == 0 ? "test_injob: all checks passed\n" : "test_injob: failures\n");
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
