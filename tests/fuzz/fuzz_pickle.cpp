// Fuzz target: the torch snapshot import as `memsnap import` runs it (a streaming read that imports
// trace entries as it meets them), checked against the safe pickle reader's whole tree and the
// import of that tree; then the analysis of the imported window, and the export of that window
// read back (a round trip).
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "fuzz_common.hpp"
#include "memsnap/analysis.hpp"
#include "torch/pickle.hpp"
#include "torch/snapshot.hpp"

namespace {
constexpr const char* kTarget = "fuzz_pickle";
constexpr const char* kName = "fuzz.pickle";

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// The streaming import and the tree import give the same record and extras.
bool same_import(const memsnap::torch::ImportResult& a, const memsnap::torch::ImportResult& b) {
  const auto& ra = a.record;
  const auto& rb = b.record;
  if (ra.frames != rb.frames || ra.stacks != rb.stacks || ra.windows.size() != rb.windows.size()) return false;
  for (std::size_t i = 0; i < ra.windows.size(); ++i) {
    const auto& wa = ra.windows[i];
    const auto& wb = rb.windows[i];
    if (wa.events.size() != wb.events.size() ||
        (!wa.events.empty() && std::memcmp(wa.events.data(), wb.events.data(), wa.events.size() * sizeof(wa.events[0])) != 0))
      return false;
    if (wa.segments != wb.segments || wa.live_at_start != wb.live_at_start || wa.batches != wb.batches ||
        wa.oom != wb.oom || wa.open_time_ns != wb.open_time_ns || wa.close_time_ns != wb.close_time_ns ||
        wa.batch_method != wb.batch_method || wa.batch_start != wb.batch_start)
      return false;
  }
  return a.extras == b.extras;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memsnap;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::run_guarded(kTarget, [&] {
    torch::ImportOptions opt;
    opt.rank = 0;
    opt.batch = 7;

    // What memsnap import runs.
    std::optional<torch::ImportResult> streamed;
    std::string streamed_error;
    bool streamed_pickle_error = false;
    std::size_t streamed_offset = 0;
    try {
      streamed = torch::import_snapshot_data(bytes, kName, opt);
    } catch (const pickle::PickleError& e) {
      streamed_pickle_error = true;
      streamed_offset = e.offset();
      streamed_error = e.what();
    } catch (const torch::SnapshotError& e) {
      streamed_error = e.what();
    }
    MEMSNAP_FUZZ_CHECK(kTarget, streamed || streamed_error.rfind(std::string(kName) + ": ", 0) == 0,
                       "an import error does not start with the name: " + streamed_error);

    // The same through the whole tree.
    pickle::ValuePtr root;
    try {
      root = pickle::read(bytes);
    } catch (const pickle::PickleError& e) {
      MEMSNAP_FUZZ_CHECK(kTarget, streamed_pickle_error && streamed_offset == e.offset(),
                         std::string("the tree read fails where the streaming import does not: ") + e.what());
      return;  // malformed, or would run code: documented
    }
    MEMSNAP_FUZZ_CHECK(kTarget, root != nullptr, "read returned null");
    MEMSNAP_FUZZ_CHECK(kTarget, !streamed_pickle_error, "the streaming import fails to read: " + streamed_error);
    (void)pickle::tree_stats(root);

    torch::ImportResult imported;
    try {
      imported = torch::import_snapshot_full(*root, opt);
    } catch (const torch::SnapshotError& e) {
      // The same error, prefixed with the name.
      const std::string tree_error = e.what();
      const std::string_view tail = std::string_view(tree_error).substr(tree_error.find(": ") + 2);
      MEMSNAP_FUZZ_CHECK(kTarget, !streamed && ends_with(streamed_error, tail),
                         "the tree import fails with '" + tree_error + "', the streaming one with '" + streamed_error + "'");
      return;  // a pickle, but not a memory snapshot: documented
    }
    MEMSNAP_FUZZ_CHECK(kTarget, streamed.has_value(), "only the streaming import fails: " + streamed_error);
    MEMSNAP_FUZZ_CHECK(kTarget, same_import(*streamed, imported), "the streaming import differs from the tree's");
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
      const torch::ImportResult again_streamed = torch::import_snapshot_data(out, kName, torch::ImportOptions{});
      MEMSNAP_FUZZ_CHECK(kTarget, same_import(again_streamed, torch::import_snapshot_full(*back, torch::ImportOptions{})),
                         "the streaming import of an export differs from the tree's");
    } catch (const torch::SnapshotError& e) {
      fuzz::finding(kTarget, std::string("memsnap cannot import its own export: ") + e.what());
    }
  });
  return 0;
}
