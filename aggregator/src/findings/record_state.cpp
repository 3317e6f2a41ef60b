// missing / truncated: a rank whose record is absent, cut short or damaged (its /ranks status).
#include "rules.hpp"

namespace memsnap::findings {

void record_state_findings(const Run& run, std::vector<Finding>& out) {
  for (const auto& [r, v] : run.ranks) {
    if (v.status == "ok") continue;
    const bool missing = v.status == "missing";
    const std::int64_t* batch = v.windows.empty() ? nullptr : &v.windows.back()->batch_end;
    Finding f = make_finding(missing ? "missing" : "truncated", r, v.windows.empty() ? -1 : v.windows.back()->window, batch, 0,
                             "",
                             missing ? "rank " + std::to_string(r) + " left no record (no spill file)"
                                     : "rank " + std::to_string(r) + "'s record is " + v.status +
                                           (v.detail.empty() ? "" : ": " + v.detail));
    f.method = f.window >= 0 ? v.windows.back()->batch_method : "";
    out.push_back(std::move(f));
  }
}

}  // namespace memsnap::findings
