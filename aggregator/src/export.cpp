// `memsnap export`: one stored window as a torch snapshot pickle or a Chrome trace (Perfetto).
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/interop.hpp"
#include "memsnap/store.hpp"
#include "torch/snapshot.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

// Chrome trace event format: counters for allocated and reserved bytes, instants for batch
// starts and OOMs. Timestamps in microseconds from the window's open.
std::string chrome_trace(const RankRecord& rec, const WindowRecord& w) {
  json events = json::array();
  const double t0 = static_cast<double>(w.open_time_ns);
  auto us = [&](std::int64_t t) { return (static_cast<double>(t) - t0) / 1000.0; };
  const Action free_at = free_action(w);
  std::unordered_map<std::uint64_t, std::uint64_t> live, segs;
  std::uint64_t allocated = 0, reserved = 0;
  for (const auto& a : w.live_at_start) {
    if (a.is_segment) {
      if (segs.emplace(live_key(a.device, a.addr), a.size).second) reserved += a.size;
    } else if (live.emplace(live_key(a.device, a.addr), a.size).second) {
      allocated += a.size;
    }
  }
  const bool has_segments = reserved > 0 || std::any_of(w.events.begin(), w.events.end(), [](const Event& e) { return is_segment_action(e.action); });
  auto counter = [&](std::int64_t t) {
    json args = {{"allocated", allocated}};
    if (has_segments) args["reserved"] = reserved;
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", us(t)}, {"pid", rec.meta.rank}, {"tid", 0}, {"args", args}});
  };
  counter(w.open_time_ns);
  for (const auto& b : w.batches) {
    events.push_back({{"name", "batch " + std::to_string(b.batch)}, {"ph", "i"}, {"s", "g"}, {"ts", us(b.time_ns)},
                      {"pid", rec.meta.rank}, {"tid", 0}});
  }
  for (const auto& e : w.events) {
    const auto key = live_key(e.device, e.addr);
    switch (e.action) {
      case Action::alloc:
        if (auto it = live.find(key); it != live.end()) allocated -= it->second;
        live[key] = e.size;
        allocated += e.size;
        break;
      case Action::segment_alloc:
      case Action::segment_map:
        if (segs.emplace(key, e.size).second) reserved += e.size;
        break;
      case Action::segment_free:
      case Action::segment_unmap:
        if (auto it = segs.find(key); it != segs.end()) {
          reserved -= it->second;
          segs.erase(it);
        }
        break;
      case Action::oom:
        events.push_back({{"name", "OOM"}, {"ph", "i"}, {"s", "p"}, {"ts", us(e.time_ns)}, {"pid", rec.meta.rank}, {"tid", 0},
                          {"args", {{"requested", e.size}, {"device_free", e.addr}}}});
        continue;
      default:
        if (e.action == free_at) {
          if (auto it = live.find(key); it != live.end()) {
            allocated -= it->second;
            live.erase(it);
          }
          break;
        }
        continue;
    }
    counter(e.time_ns);
  }
  json meta = json::array({{{"name", "process_name"}, {"ph", "M"}, {"pid", rec.meta.rank},
                            {"args", {{"name", "rank " + std::to_string(rec.meta.rank) + " (" + rec.meta.host + ")"}}}}});
  for (auto& e : events) meta.push_back(std::move(e));
  return json{{"traceEvents", meta}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace

int export_main(const ExportCliOptions& o) {
  try {
    if (o.format != "torch" && o.format != "chrome") {
      std::cerr << "memsnap export: --format must be torch or chrome, not '" << o.format << "'\n";
      return 2;
    }
    std::error_code ec;
    if (std::filesystem::exists(o.output, ec) && !o.overwrite) {
      std::cerr << "memsnap export: " << o.output.string() << " exists; pass --overwrite to replace it\n";
      return 1;
    }
    StoreReader store(o.store);
    RankRecord rec = store.read_rank(o.rank);
    std::size_t index = rec.windows.size();
    for (std::size_t i = 0; i < rec.windows.size(); ++i) {
      if (rec.windows[i].batch_end == o.batch) index = i;
    }
    if (index == rec.windows.size()) {
      std::string have;
      for (const auto& w : rec.windows) have += (have.empty() ? "" : ", ") + std::to_string(w.batch_end);
      std::cerr << "memsnap export: rank " << o.rank << " has no window ending at batch " << o.batch
                << (have.empty() ? " (it recorded none)" : " (it has: " + have + ")") << "\n";
      return 1;
    }
    std::string bytes;
    if (o.format == "torch") {
      // An imported torch snapshot's extras make the export give back what torch wrote.
      json extras;
      if (const std::string& text = rec.windows[index].source_extras; !text.empty()) {
        extras = json::parse(text, nullptr, false);
        if (extras.is_discarded()) {
          std::cerr << "memsnap export: warning: rank " << o.rank << " batch " << o.batch
                    << ": the stored source extras are not valid JSON; exporting without them\n";
          extras = json();
        }
      }
      bytes = torch::export_snapshot(rec, index, extras);
    } else {
      bytes = chrome_trace(rec, rec.windows[index]);
    }
    const auto tmp = o.output.string() + ".partial";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    std::filesystem::rename(tmp, o.output);
    std::cout << "memsnap export: rank " << o.rank << " batch " << o.batch << " -> " << o.output.string() << " ("
              << o.format << ", " << bytes.size() << " bytes)\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "memsnap export: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace memsnap
