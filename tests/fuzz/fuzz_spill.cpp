// Fuzz target: the spill reader (read_spill_bytes), then the analysis the aggregator runs on
// every window it read, as `memsnap aggregate` does with a spill from a crashed or hostile rank.
#include <cstdint>
#include <span>

#include "fuzz_common.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/spill.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memsnap::fuzz::run_guarded("fuzz_spill", [&] {
    memsnap::RankRecord record;
    try {
      record = memsnap::read_spill_bytes(std::span<const char>(reinterpret_cast<const char*>(data), size), "fuzz.spill");
    } catch (const memsnap::SpillError&) {
      return;  // not a spill, or a version this reader does not know: documented
    }
    for (const auto& w : record.windows) {
      const memsnap::WindowStats stats = memsnap::analyse_window(record, w);
      (void)stats;
    }
    for (std::uint32_t s = 0; s < record.stacks.size() && s < 64; ++s) {
      (void)memsnap::site_name(record, s);
      (void)memsnap::categorize(record, s);
    }
  });
  return 0;
}
