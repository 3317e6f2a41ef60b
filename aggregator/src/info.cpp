// `memsnap info`: a store or a spill folder summarised, as a table or as stable JSON, with the
// findings (the store's /findings; a spill folder's computed as `memsnap aggregate` would).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string_view>
#include <type_traits>

#include "rank_input.hpp"
#include "memsnap/aggregate.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/store_rows.hpp"
#include "memsnap/version.hpp"

namespace memsnap {

namespace fs = std::filesystem;

namespace {

// What info shows of a rank (its /ranks row) and of a window (its /summary row): every column of
// the store's table (memsnap/store_rows.hpp) under the column's name, but those named here, so a
// column added to a table shows in info and in summary.json without an edit here.
struct InfoKey {
  std::string_view column;
  std::string_view key;        // "": left out
  bool only_when_set = false;  // text: left out when empty
};

// A rank: rank, status, host, and status_detail where it has one.
constexpr InfoKey kRankKeys[] = {{"status_detail", "status_detail", true},
                                 {"device", ""},
                                 {"pid", ""},
                                 {"local_rank", ""},
                                 {"node_rank", ""},
                                 {"local_world_size", ""},
                                 {"source", ""},
                                 {"n_windows", ""},
                                 {"data_file", ""},
                                 {"spill", ""}};

// A window: named by its last batch, with its event count as "events"; not its times, reserved
// levels and categories (the report shows those).
constexpr InfoKey kWindowKeys[] = {{"batch_end", "batch"},
                                   {"n_events", "events"},
                                   {"rank", ""},
                                   {"window", ""},
                                   {"host", ""},
                                   {"device", ""},
                                   {"peak_allocated_time_ns", ""},
                                   {"peak_reserved_time_ns", ""},
                                   {"reserved_at_open", ""},
                                   {"reserved_at_close", ""},
                                   {"persistent", ""},
                                   {"fragmentation_at_peak", ""},
                                   {"oom_requested", ""},
                                   {"category_bytes", ""}};

/// A row of a store table as info shows it: its field table's columns, as `keys` says.
template <class Row, std::size_t N>
nlohmann::json row_json(const Row& row, const InfoKey (&keys)[N]) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field<Row>([&](const auto& f) {
    const InfoKey* k = std::find_if(keys, keys + N, [&](const InfoKey& x) { return x.column == f.name; });
    const std::string_view key = k == keys + N ? std::string_view(f.name) : k->key;
    if (!f.stored || key.empty()) return;
    const auto& v = row.*f.member;
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      if (k != keys + N && k->only_when_set && v.empty()) return;
    }
    j[std::string(key)] = v;
  });
  return j;
}

nlohmann::json info_json(const std::string& run_name, int world_size, const std::vector<RankInfo>& ranks,
                         std::vector<SummaryRow> rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const SummaryRow& a, const SummaryRow& b) {
    return std::make_pair(a.rank, a.window) < std::make_pair(b.rank, b.window);
  });
  nlohmann::json j;
  j["format_version"] = kFormatVersion;
  j["run_name"] = run_name;
  j["world_size"] = world_size;
  nlohmann::json out_ranks = nlohmann::json::array();
  std::map<int, std::size_t> slot;
  std::vector<RankInfo> sorted = ranks;
  std::sort(sorted.begin(), sorted.end(), [](const RankInfo& a, const RankInfo& b) { return a.rank < b.rank; });
  for (const auto& r : sorted) {
    nlohmann::json jr = row_json(r, kRankKeys);
    jr["windows"] = nlohmann::json::array();
    slot[r.rank] = out_ranks.size();
    out_ranks.push_back(std::move(jr));
  }
  for (const auto& row : rows) {
    if (row.window < 0) continue;
    auto it = slot.find(row.rank);
    if (it != slot.end()) out_ranks[it->second]["windows"].push_back(row_json(row, kWindowKeys));
  }
  j["ranks"] = std::move(out_ranks);
  return j;
}

std::string pad(const std::string& s, std::size_t w, bool right) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

nlohmann::json store_info_json(const StoreReader& store) {
  const StoreInfo info = store.info();
  return info_json(info.run_name, info.world_size, info.ranks, info.rows);
}

nlohmann::json spill_info_json(const std::filesystem::path& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw Error(run_dir.string() + ": no such folder");
  // Absolute names, as the aggregator records them, so both summaries say the same.
  const auto spills = find_spills(fs::absolute(run_dir, ec).lexically_normal());
  if (spills.empty()) throw Error(run_dir.string() + ": no spill files (looked for spill/*.spill and *.spill)");
  std::vector<ItemResult> items;
  ProcessOptions po;  // analyse only
  for (std::uint32_t i = 0; i < spills.size(); ++i) items.push_back(process_item(ItemInput{i, spills[i], nullptr}, po));
  Resolution res = resolve(std::move(items), "");
  StoreInfo run;
  run.run_name = res.run_name;
  run.world_size = res.world_size;
  run.ranks = res.ranks;
  run.rows = res.rows;
  nlohmann::json j = info_json(res.run_name, res.world_size, res.ranks, res.rows);
  j["findings"] = findings_json(compute_findings(run, res.sites, res.digest.windows_grouped()));
  return j;
}

void print_info_table(const nlohmann::json& info, std::ostream& out) {
  out << "run " << info.value("run_name", std::string()) << ", world size " << info.value("world_size", 0) << "\n";
  std::vector<std::vector<std::string>> table;
  table.push_back({"RANK", "STATUS", "HOST", "BATCHES", "EVENTS", "DROPPED", "PEAK ALLOC", "PEAK RESERVED", "LIVE OPEN",
                   "LIVE CLOSE", "OOM"});
  std::vector<std::string> notes;
  for (const auto& r : info.at("ranks")) {
    const std::string rank = std::to_string(r.at("rank").get<int>());
    const std::string status = r.at("status").get<std::string>();
    const std::string host = r.value("host", std::string());
    if (r.contains("status_detail")) notes.push_back("rank " + rank + ": " + status + ": " + r.at("status_detail").get<std::string>());
    if (r.at("windows").empty()) {
      table.push_back({rank, status, host, "-", "-", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    for (const auto& w : r.at("windows")) {
      const std::string ws = w.at("status").get<std::string>();
      if (const std::string method = w.value("batch_method", std::string("recorded")); method != "recorded") {
        char confidence[16];
        std::snprintf(confidence, sizeof confidence, "%.2f", w.value("batch_confidence", 0.0));
        const std::string where = "rank " + rank + " batch " + std::to_string(w.at("batch").get<std::int64_t>()) + ": ";
        notes.push_back(where + (method == "none"
                                     ? std::string("no batch boundaries found in the trace")
                                     : "batch boundaries inferred (" + method + ", confidence " + confidence + ")"));
      }
      table.push_back({rank, ws != "ok" || status == "ok" ? ws : status, host,
                       std::to_string(w.at("batch_start").get<std::int64_t>()) + "-" + std::to_string(w.at("batch").get<std::int64_t>()),
                       std::to_string(w.at("events").get<std::uint64_t>()), std::to_string(w.at("dropped").get<std::uint64_t>()),
                       human_bytes(w.at("peak_allocated").get<std::uint64_t>()),
                       human_bytes(w.at("peak_reserved").get<std::uint64_t>()),
                       human_bytes(w.at("live_at_open").get<std::uint64_t>()),
                       human_bytes(w.at("live_at_close").get<std::uint64_t>()), w.at("oom").get<bool>() ? "OOM" : "-"});
    }
  }
  std::vector<std::size_t> widths(table.front().size(), 0);
  for (const auto& row : table) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : table) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const bool right = c == 0 || (c >= 4 && c <= 9);
      line += pad(row[c], widths[c], right);
      if (c + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  for (const auto& n : notes) out << n << "\n";
  if (info.contains("findings") && !info["findings"].empty()) {
    const auto& found = info["findings"];
    out << found.size() << (found.size() == 1 ? " finding:\n" : " findings:\n");
    for (const auto& f : found) out << "  " << f.value("kind", "") << ": " << f.value("detail", "") << "\n";
  }
}

int info_main(const std::string& path, bool json, std::ostream& out) {
  try {
    std::error_code ec;
    nlohmann::json info;
    fs::path p(path);
    if (fs::is_directory(p, ec)) {
      if (find_spills(p).empty() && fs::is_regular_file(p / kDefaultStoreName, ec)) {
        info = store_info_json(StoreReader(p / kDefaultStoreName));
        info["findings"] = findings_json(read_findings(p / kDefaultStoreName));
      } else {
        info = spill_info_json(p);
      }
    } else if (fs::exists(p, ec)) {
      info = store_info_json(StoreReader(p));
      info["findings"] = findings_json(read_findings(p));
    } else {
      throw Error(path + ": no such file or folder");
    }
    if (json) {
      out << info.dump() << "\n";
    } else {
      print_info_table(info, out);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "memsnap info: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace memsnap
