// Fuzz target: the safe pickle reader, then the torch snapshot import on what it accepted, the
// analysis of the imported window, and the export of that window read back (a round trip).
#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "memsnap/analysis.hpp"
#include "torch/pickle.hpp"
#include "torch/snapshot.hpp"

namespace {
constexpr const char* kTarget = "fuzz_pickle";
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memsnap;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::run_guarded(kTarget, [&] {
    pickle::ValuePtr root;
    try {
      root = pickle::read(bytes);
    } catch (const pickle::PickleError&) {
      return;  // malformed, or would run code: documented
    }
    MEMSNAP_FUZZ_CHECK(kTarget, root != nullptr, "read returned null");
    (void)pickle::tree_stats(root);

    torch::ImportResult imported;
    try {
      torch::ImportOptions opt;
      opt.rank = 0;
      opt.batch = 7;
      imported = torch::import_snapshot_full(*root, opt);
    } catch (const torch::SnapshotError&) {
      return;  // a pickle, but not a memory snapshot: documented
    }
    const RankRecord& rec = imported.record;
    MEMSNAP_FUZZ_CHECK(kTarget, rec.windows.size() == 1, "an import gives one window");
    (void)analyse_window(rec, rec.windows[0]);

    // What import accepted, export writes and the reader and import accept again.
    const std::string out = torch::export_snapshot(rec, 0, imported.extras);
    pickle::ValuePtr back;
    try {
      back = pickle::read(out);
    } catch (const pickle::PickleError& e) {
      fuzz::finding(kTarget, std::string("memsnap cannot read its own export: ") + e.what());
    }
    try {
      const RankRecord again = torch::import_snapshot(*back, torch::ImportOptions{});
      MEMSNAP_FUZZ_CHECK(kTarget, again.windows.size() == 1 && again.windows[0].events.size() == rec.windows[0].events.size(),
                         "the export holds a different number of events");
    } catch (const torch::SnapshotError& e) {
      fuzz::finding(kTarget, std::string("memsnap cannot import its own export: ") + e.what());
    }
  });
  return 0;
}
