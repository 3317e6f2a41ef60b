// memsnap_bench_diff_gen: the synthetic run of bench_scale.sh (tests/aggregator/spill_gen.hpp),
// optionally with a planted change on a few ranks, for tests/bench/bench_diff.sh.
//
//   memsnap_bench_diff_gen DIR RANKS EVENTS [R1,R2,...]
//
// A planted rank allocates 512 MiB in the middle of its window at a site of its own
// (cache_activations, model.py:77) and keeps it to the end: its peak grows by that much.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include "aggregator/spill_gen.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " DIR RANKS EVENTS [R1,R2,...]\n";
    return 2;
  }
  const fs::path dir = argv[1];
  const int ranks = std::atoi(argv[2]);
  const std::size_t events = std::strtoull(argv[3], nullptr, 10);
  std::set<int> planted;
  if (argc > 4) {
    std::stringstream list(argv[4]);
    for (std::string r; std::getline(list, r, ',');) planted.insert(std::atoi(r.c_str()));
  }
  fs::create_directories(dir / "spill");
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < ranks; ++r) {
    memsnap::RankRecord rec = memsnap::test::make_bench_record(r, ranks, events);
    if (planted.count(r)) {
      rec.frames.push_back({"cache_activations", "model.py", 77});
      rec.stacks.push_back({0, static_cast<std::uint32_t>(rec.frames.size() - 1), 1});
      auto& w = rec.windows.front();
      const std::size_t mid = w.events.size() / 2;
      memsnap::Event e = w.events[mid];
      e.action = memsnap::Action::alloc;
      e.addr = 0x7e00'0000'0000ULL;
      e.size = 512ULL << 20;
      e.stack_id = static_cast<std::uint32_t>(rec.stacks.size() - 1);
      w.events.insert(w.events.begin() + static_cast<std::ptrdiff_t>(mid), e);
    }
    const auto path = dir / "spill" / memsnap::spill_file_name(r, 1000 + r);
    if (!memsnap::test::write_spill_file(path, rec, true)) {
      std::cerr << "cannot write " << path << "\n";
      return 1;
    }
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("generated %d spills x %zu events (%zu planted) in %.1f s\n", ranks, events, planted.size(), sec);
  return 0;
}
