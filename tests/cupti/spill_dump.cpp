// Prints a run folder's spills as JSON lines, one per window event, for the GPU checks
// (tests/gpu/check_pattern.py): exact event counts, sizes and native stack frames.
//   spill_dump RUN_DIR
// {"kind":"meta","rank":0,"source":"cupti","device_name":"...","ended":true,"status":"ok"}
// {"kind":"window","batch_start":1,"batch_end":3,"oom":false,"events":21,"dropped":0}
// {"kind":"event","window":3,"action":"alloc","device":0,"addr":..,"size":..,"stream":..,"frames":["f", ...]}
#include <cstdio>
#include <exception>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memsnap/spill.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: spill_dump RUN_DIR\n";
    return 2;
  }
  try {
    const auto spills = memsnap::find_spills(argv[1]);
    if (spills.empty()) {
      std::cerr << "spill_dump: no spill in " << argv[1] << "\n";
      return 1;
    }
    for (const auto& path : spills) {
      const memsnap::RankRecord r = memsnap::read_spill(path);
      nlohmann::json meta = {{"kind", "meta"},        {"path", path.string()},         {"rank", r.meta.rank},
                             {"pid", r.meta.pid},     {"source", r.meta.source},       {"device_name", r.meta.device_name},
                             {"ended", r.ended},      {"status", memsnap::status_name(r.status)},
                             {"windows", r.windows.size()}, {"device_total_bytes", r.meta.device_total_bytes}};
      std::cout << meta.dump() << "\n";
      for (const auto& w : r.windows) {
        std::cout << nlohmann::json{{"kind", "window"},       {"batch_start", w.batch_start}, {"batch_end", w.batch_end},
                                    {"oom", w.oom},           {"closed", w.closed},           {"events", w.events.size()},
                                    {"dropped", w.dropped},   {"batches", w.batches.size()},
                                    {"live_at_start", w.live_at_start.size()}}
                         .dump()
                  << "\n";
        for (const auto& e : w.events) {
          nlohmann::json frames = nlohmann::json::array();
          if (e.stack_id < r.stacks.size()) {
            for (auto id : r.stacks[e.stack_id]) {
              if (id < r.frames.size()) frames.push_back(r.frames[id].name);
            }
          }
          std::cout << nlohmann::json{{"kind", "event"},   {"window", w.batch_end},
                                      {"action", std::string(memsnap::action_name(e.action))},
                                      {"device", e.device}, {"addr", e.addr},  {"size", e.size},
                                      {"stream", e.stream}, {"time_ns", e.time_ns}, {"frames", frames}}
                           .dump()
                    << "\n";
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "spill_dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
