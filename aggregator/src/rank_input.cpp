// One aggregation input through analysis and its rank file; rank 0's decision from the results.
#include "rank_input.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>

#include <nlohmann/json.hpp>

#include "memsnap/analysis.hpp"
#include "memsnap/spill.hpp"

namespace memsnap {

namespace {

namespace fs = std::filesystem;

/// The rank named by a spill file name: rank<R>.pid<P>.spill -> R; -1 when it has no such prefix.
int rank_from_file_name(const std::string& name) {
  if (name.rfind("rank", 0) != 0) return -1;
  std::size_t i = 4;
  long long v = 0;
  while (i < name.size() && i < 14 && std::isdigit(static_cast<unsigned char>(name[i]))) v = v * 10 + (name[i++] - '0');
  if (i == 4 || (i < name.size() && name[i] != '.')) return -1;
  return static_cast<int>(v);
}

/// What `memsnap run` recorded of a process that did not end well (spill/rank<R>.exit.json beside
/// the spill): "rank 5 was killed by SIGKILL ... in batch 7". Empty when it ended with 0 or
/// nothing was recorded.
std::string how_the_process_ended(const fs::path& spill, const RankRecord& r) {
  if (spill.empty() || !r.has_meta) return {};
  const fs::path exit_file = spill.parent_path() / ("rank" + std::to_string(r.meta.rank) + ".exit.json");
  std::ifstream in(exit_file);
  if (!in) return {};
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("pid", 0L) != r.meta.pid) return {};  // another process of that rank
    if (j.value("exit_code", 0) == 0 && j.value("signal", 0) == 0) return {};
    std::int64_t batch = 0;
    for (const auto& w : r.windows) {
      for (const auto& b : w.batches) batch = std::max(batch, b.batch);
    }
    std::string line = "rank " + std::to_string(r.meta.rank) + " " + j.value("how", std::string("ended badly"));
    if (batch > 0) line += " in batch " + std::to_string(batch);
    return line;
  } catch (const std::exception&) {
    return {};
  }
}

SummaryRow status_row(const RankInfo& info) {
  SummaryRow row;
  row.rank = info.rank;
  row.window = -1;
  row.host = info.host;
  row.device = info.device;
  row.status = info.status;
  return row;
}

}  // namespace

std::string part_file_name(std::uint32_t index) { return "part" + std::to_string(index) + ".h5"; }
std::string rank_file_name(int rank) { return "rank" + std::to_string(rank) + ".h5"; }

LoadedItem load_item(const ItemInput& in, const ProcessOptions& o, RankRecord&& reuse) {
  LoadedItem loaded;
  ItemResult& it = loaded.result;
  it.index = in.index;
  std::optional<RankRecord>& owned = loaded.owned;
  const RankRecord* rec = in.record;
  loaded.external = in.record;
  if (rec != nullptr) {
    it.name = "the in-memory record of rank " + std::to_string(rec->meta.rank);
    it.spill = fs::path(rec->path).filename().string();
  } else {
    it.name = in.spill.string();
    it.spill = in.spill.filename().string();
    it.rank = rank_from_file_name(it.spill);
    try {
      owned = read_spill(in.spill, std::move(reuse));
      rec = &*owned;
    } catch (const std::exception& e) {
      it.status = "corrupt";
      it.detail = e.what();
      return loaded;
    } catch (...) {
      it.status = "corrupt";
      it.detail = it.name + ": cannot be read";
      return loaded;
    }
  }
  it.loaded = true;
  const RankRecord& r = *rec;
  const bool has_meta = rec == in.record || r.has_meta;
  if (has_meta) it.rank = r.meta.rank < 0 ? -1 : r.meta.rank;
  it.meta = r.meta;
  it.meta.device_total_bytes.clear();
  it.meta.rank = it.rank;
  it.status = status_name(r.status);
  if (!r.status_detail.empty()) it.detail = it.name + ": " + r.status_detail;
  if (const std::string ended = how_the_process_ended(in.spill, r); !ended.empty()) {
    it.detail = ended + (it.detail.empty() ? "" : "; " + it.detail);
  }
  if (!has_meta && r.status == RecordStatus::ok) {
    it.status = "corrupt";
    it.detail = it.name + ": no metadata record";
  }
  it.n_windows = static_cast<std::uint32_t>(r.windows.size());
  try {
    AnalysisOptions ao;
    ao.top_sites = o.top_sites;
    for (std::size_t i = 0; i < r.windows.size(); ++i) {
      const WindowStats s = analyse_window(r, r.windows[i], ao);
      SummaryRow row = make_summary_row(r, static_cast<int>(i), s);
      row.rank = it.rank;
      it.rows.push_back(std::move(row));
      for (const auto& site : s.sites) {
        SiteRow sr{site};
        sr.rank = it.rank;
        sr.window = static_cast<int>(i);
        sr.batch = s.batch_end;
        it.sites.push_back(std::move(sr));
      }
      it.digest.add(window_digest(r.windows[i], s, it.rank, static_cast<int>(i)));
    }
  } catch (const std::exception& e) {
    it.status = "error";
    it.detail = it.name + ": analysis failed: " + e.what();
    it.rows.clear();
    it.sites.clear();
    it.digest = {};
    return loaded;
  }
  loaded.analysed = true;
  return loaded;
}

void write_item(LoadedItem& loaded, const ProcessOptions& o, RankFileWriter& writer) {
  ItemResult& it = loaded.result;
  if (loaded.record() != nullptr && o.part_dir && it.rank >= 0) {
    const RankRecord& r = *loaded.record();
    RankInfo info;
    info.rank = it.rank;
    info.status = it.status;
    info.status_detail = it.detail;
    info.spill = it.spill;
    const fs::path part = *o.part_dir / part_file_name(it.index);
    try {
      writer.write(part, r, info);
      it.written = true;
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove(part, ec);
      it.status = "error";
      it.detail = std::string("cannot write its data: ") + e.what();
    }
  }
}

ItemResult process_item(const ItemInput& in, const ProcessOptions& o) {
  LoadedItem loaded = load_item(in, o);
  if (o.part_dir) {
    StoreWriteOptions wo;
    wo.deflate = o.deflate;
    wo.threads = o.threads;
    RankFileWriter writer(wo);
    write_item(loaded, o, writer);
  }
  return std::move(loaded.result);
}

Resolution resolve(std::vector<ItemResult> items, const std::string& data_dir_name) {
  Resolution res;
  std::sort(items.begin(), items.end(), [](const ItemResult& a, const ItemResult& b) { return a.index < b.index; });
  std::map<int, std::vector<const ItemResult*>> by_rank;
  for (const auto& it : items) {
    if (it.rank < 0) {
      res.problems.push_back(it.name + ": " + it.status + ": " + (it.detail.empty() ? "unreadable" : it.detail) +
                             " (its rank is unknown, so it is left out)");
      res.bad_counts["unplaced"]++;
      if (it.written) res.discard.push_back(it.index);
      continue;
    }
    by_rank[it.rank].push_back(&it);
    res.world_size = std::max(res.world_size, it.rank + 1);
    if (it.loaded) res.world_size = std::max(res.world_size, it.meta.world_size);
  }

  std::map<std::string, int> run_names;
  for (int r = 0; r < res.world_size; ++r) {
    RankInfo info;
    info.rank = r;
    auto found = by_rank.find(r);
    if (found == by_rank.end()) {
      info.status = "missing";
      info.status_detail = "no spill file for this rank (world size " + std::to_string(res.world_size) + ")";
      res.problems.push_back("rank " + std::to_string(r) + ": missing: " + info.status_detail);
      res.bad_counts["missing"]++;
      res.rows.push_back(status_row(info));
      res.ranks.push_back(std::move(info));
      continue;
    }
    auto& cands = found->second;
    // Several spills for one rank (a restarted process): the latest readable one wins.
    const ItemResult* best = cands.front();
    for (const ItemResult* c : cands) {
      auto key = [](const ItemResult* x) { return std::make_tuple(x->loaded, x->meta.start_unix_ns); };
      if (key(c) > key(best)) best = c;
    }
    if (cands.size() > 1) {
      std::string names;
      for (const ItemResult* c : cands) names += (names.empty() ? "" : ", ") + c->spill;
      res.problems.push_back("rank " + std::to_string(r) + ": " + std::to_string(cands.size()) + " spill files (" + names +
                             "); using " + best->spill);
      res.bad_counts["duplicated"]++;
      for (const ItemResult* c : cands) {
        if (c != best && c->written) res.discard.push_back(c->index);
      }
    }
    const ItemResult& it = *best;
    info.status = it.status;
    info.status_detail = it.detail;
    info.spill = it.spill;
    if (it.loaded) {
      info.host = it.meta.host;
      info.device = it.meta.device_name;
      info.pid = it.meta.pid;
      info.local_rank = it.meta.local_rank;
      info.node_rank = it.meta.node_rank;
      info.local_world_size = it.meta.local_world_size;
      info.source = it.meta.source;
      info.n_windows = it.n_windows;
      if (!it.meta.run_name.empty()) run_names[it.meta.run_name]++;
      if (res.config_json.empty()) res.config_json = it.meta.config_json;
    }
    if (it.written && !data_dir_name.empty()) {
      info.data_file = data_dir_name + "/" + rank_file_name(r);
      res.keep.emplace_back(it.index, r);
    }
    if (info.status != "ok") {
      res.problems.push_back("rank " + std::to_string(r) + ": " + info.status + ": " + info.status_detail);
      res.bad_counts[info.status]++;
    }
    if (it.rows.empty()) {
      res.rows.push_back(status_row(info));
    } else {
      res.rows.insert(res.rows.end(), it.rows.begin(), it.rows.end());
    }
    res.sites.insert(res.sites.end(), it.sites.begin(), it.sites.end());
    res.digest.append(it.digest);
    res.ranks.push_back(std::move(info));
  }
  // The run's name: the one most ranks agree on (ties: the smallest name).
  int best_count = 0;
  for (const auto& [name, count] : run_names) {
    if (count > best_count) {
      best_count = count;
      res.run_name = name;
    }
  }
  return res;
}

std::string headline_counts(const Resolution& res) {
  std::string s;
  for (const auto& [status, n] : res.bad_counts) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + status;
  return s;
}

}  // namespace memsnap
