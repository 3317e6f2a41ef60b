// `memsnap export`: one stored window as a torch snapshot pickle or a Chrome trace (Perfetto).
#include <algorithm>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memsnap/aggregate.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/import_export.hpp"
#include "memsnap/store.hpp"
#include "memsnap/version.hpp"
#include "memsnap/window_replay.hpp"
#include "output_guard.hpp"
#include "torch/snapshot.hpp"
#include "torch/snapshot_export.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

// Chrome trace event format: counters for allocated and reserved bytes, instants for batch
// starts and OOMs. Timestamps in microseconds from the window's open.
std::string chrome_trace(const RankRecord& rec, const WindowRecord& w) {
  json events = json::array();
  const double t0 = static_cast<double>(w.open_time_ns);
  auto us = [&](std::int64_t t) { return (static_cast<double>(t) - t0) / 1000.0; };
  WindowReplay replay(w);
  const bool has_segments = replay.reserved() > 0 || std::any_of(w.events.begin(), w.events.end(), [](const Event& e) { return is_segment_action(e.action); });
  auto counter = [&](std::int64_t t) {
    json args = {{"allocated", replay.allocated()}};
    if (has_segments) args["reserved"] = replay.reserved();
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", us(t)}, {"pid", rec.meta.rank}, {"tid", 0}, {"args", args}});
  };
  counter(w.open_time_ns);
  for (const auto& b : w.batches) {
    events.push_back({{"name", "batch " + std::to_string(b.batch)}, {"ph", "i"}, {"s", "g"}, {"ts", us(b.time_ns)},
                      {"pid", rec.meta.rank}, {"tid", 0}});
  }
  while (!replay.done()) {
    const Event& e = w.events[replay.applied()];
    const ReplayStep step = replay.step();
    if (step.kind == ReplayStep::oom) {
      events.push_back({{"name", "OOM"}, {"ph", "i"}, {"s", "p"}, {"ts", us(e.time_ns)}, {"pid", rec.meta.rank}, {"tid", 0},
                        {"args", {{"requested", e.size}, {"device_free", e.addr}}}});
      continue;
    }
    if (step.kind != ReplayStep::none) counter(e.time_ns);
  }
  json meta = json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", rec.meta.rank},
                            {"args", {{"name", "rank " + std::to_string(rec.meta.rank) + " (" + rec.meta.host + ")"}}}}});
  for (auto& e : events) meta.push_back(std::move(e));
  // otherData marks the file as memsnap's export (output_guard.hpp: kExportChromePrefix), so a
  // later export may replace it; trace viewers show it as metadata.
  return json{{"traceEvents", meta},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"producer", "memsnap export"}, {"version", kVersion}}}}
             .dump() +
         "\n";
}

}  // namespace

int export_main(const ExportCliOptions& o) {
  try {
    if (o.format != "torch" && o.format != "chrome") {
      std::cerr << "memsnap export: --format must be torch or chrome, not '" << o.format << "'\n";
      return 2;
    }
    // Only a file memsnap exported is ever replaced, and only with --overwrite.
    if (const std::string refusal = output_refusal(inspect_export_output(o.output), o.overwrite, "it");
        !refusal.empty()) {
      std::cerr << "memsnap export: " << refusal << "\n";
      return 1;
    }
    StoreReader store(o.store);
    const std::vector<std::int64_t> have = store.batches(o.rank);
    if (std::find(have.begin(), have.end(), o.batch) == have.end()) {
      std::string names;
      for (const auto b : have) names += (names.empty() ? "" : ", ") + std::to_string(b);
      std::cerr << "memsnap export: " << o.store.string() << ": rank " << o.rank << " has no window ending at batch " << o.batch
                << (names.empty() ? " (it recorded none)" : " (it has: " + names + ")") << "\n";
      return 1;
    }
    // The window's events are read from the store in pieces as they are written, never whole.
    const RankRecord rec = store.read_rank_without_windows(o.rank);
    WindowRecord w = store.read_window_without_events(o.rank, o.batch);
    std::uint64_t size = 0;
    if (o.format == "torch") {
      // An imported torch snapshot's extras make the export give back what torch wrote.
      json extras;
      if (!w.source_extras.empty()) {
        extras = json::parse(w.source_extras, nullptr, false);
        if (extras.is_discarded()) {
          std::cerr << "memsnap export: warning: rank " << o.rank << " batch " << o.batch
                    << ": the stored source extras are not valid JSON; exporting without them\n";
          extras = json();
        }
        std::string().swap(w.source_extras);
      }
      ExportFile out(o.output, o.overwrite);
      struct OutputFailed {};  // out says why
      try {
        torch::write_snapshot(
            rec, w, [&](const auto& piece) { store.read_events(o.rank, o.batch, piece); }, extras,
            [&out](std::string_view bytes) {
              if (!out.write(bytes)) throw OutputFailed();
            });
        out.write(kExportTorchTrailer);  // after STOP: marks the file as memsnap's
      } catch (const OutputFailed&) {
      }
      if (const std::string error = out.commit(); !error.empty()) {
        std::cerr << "memsnap export: " << error << "\n";
        return 1;
      }
      size = out.size();
    } else {
      w = store.read_window(o.rank, o.batch);
      const std::string bytes = chrome_trace(rec, w);
      if (const std::string error = write_export_file(o.output, bytes, o.overwrite); !error.empty()) {
        std::cerr << "memsnap export: " << error << "\n";
        return 1;
      }
      size = bytes.size();
    }
    std::cout << "memsnap export: rank " << o.rank << " batch " << o.batch << " -> " << o.output.string() << " ("
              << o.format << ", " << human_bytes(size) << ")\n";
    if (o.format == "torch") {
      std::cout << "  next: python -m torch.cuda._memory_viz trace_plot " << o.output.string()
                << " -o trace.html, or drop it on https://pytorch.org/memory_viz\n";
    } else {
      std::cout << "  next: open it in https://ui.perfetto.dev or chrome://tracing\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "memsnap export: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace memsnap
