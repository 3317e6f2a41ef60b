// Aggregation over MPI: share the spills out, analyse and write each rank's file in parallel,
// gather the metadata to rank 0, which decides, writes the root file and renames the store into
// place. Also `memsnap info` for stores and spill folders.
//
// Every rank goes through the same collectives in the same order whatever fails locally:
//
//   rank 0: plan (find spills, check the output, make the temp folder)  --Bcast plan-->  all
//   all:    load + analyse + write each spill of its share (errors become item results)
//   all:    --Gather(v) serialized item results-->  rank 0
//   rank 0: resolve ranks, write the root, rename      --Bcast decision-->  all
//   all:    return, or throw the same AggregateError
//
// The optional progress counter is point-to-point (workers -> rank 0, one message per finished
// spill, the counts of a share always summing to its size), drained by rank 0 between its own
// spills and before the gather.
#include "memsnap/aggregate.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "hdf5_util.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/version.hpp"
#include "mpi_util.hpp"

namespace memsnap {

namespace {

namespace fs = std::filesystem;

constexpr int kProgressTag = 7781;

// --- wire format for gathered metadata -------------------------------------------------------

class Encoder {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    m_out.insert(m_out.end(), p, p + sizeof v);
  }
  void str(const std::string& s) {
    put(static_cast<std::uint64_t>(s.size()));
    m_out.insert(m_out.end(), s.begin(), s.end());
  }
  std::vector<char>& bytes() { return m_out; }

 private:
  std::vector<char> m_out;
};

class Decoder {
 public:
  explicit Decoder(const std::vector<char>& in) : m_in(in) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, m_in.data() + m_pos, sizeof v);
    m_pos += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s(m_in.data() + m_pos, n);
    m_pos += n;
    return s;
  }
  bool done() const { return m_pos == m_in.size(); }

 private:
  void need(std::uint64_t n) const {
    if (n > m_in.size() - m_pos) throw AggregateError("internal: gathered metadata is shorter than announced");
  }
  const std::vector<char>& m_in;
  std::size_t m_pos = 0;
};

// --- one spill (or in-memory record) through analysis and its rank file ------------------------

/// What rank 0 learns about one input, whichever aggregator rank processed it.
struct ItemResult {
  std::uint32_t index = 0;
  std::string name;        // the spill's path (or "in-memory record of rank R")
  std::string spill;       // file name only
  std::int32_t rank = -1;  // -1: unknown (unreadable and not named rank<R>...)
  bool loaded = false;     // a record came out, possibly partial
  bool written = false;    // its part file exists
  std::string status;      // ok | truncated | corrupt | error
  std::string detail;
  RankMeta meta;           // config_json and identity; no device_total_bytes needed
  std::uint32_t n_windows = 0;
  std::vector<SummaryRow> rows;
  std::vector<SiteRow> sites;
};

void encode(Encoder& e, const SummaryRow& r) {
  e.put(r.rank);
  e.put(r.window);
  e.put(r.batch_start);
  e.put(r.batch_end);
  e.str(r.host);
  e.str(r.device);
  e.put(r.n_events);
  e.put(r.dropped);
  e.put(r.peak_allocated);
  e.put(r.peak_allocated_time_ns);
  e.put(r.peak_reserved);
  e.put(r.peak_reserved_time_ns);
  e.put(r.live_at_open);
  e.put(r.live_at_close);
  e.put(r.reserved_at_open);
  e.put(r.reserved_at_close);
  e.put(r.persistent);
  e.put(r.fragmentation_at_peak);
  e.put(static_cast<std::uint8_t>(r.oom));
  e.put(r.oom_requested);
  e.str(r.status);
  e.put(r.category_bytes);
  e.str(r.batch_method);
  e.put(r.batch_confidence);
}

SummaryRow decode_row(Decoder& d) {
  SummaryRow r;
  r.rank = d.get<int>();
  r.window = d.get<int>();
  r.batch_start = d.get<std::int64_t>();
  r.batch_end = d.get<std::int64_t>();
  r.host = d.str();
  r.device = d.str();
  r.n_events = d.get<std::uint64_t>();
  r.dropped = d.get<std::uint64_t>();
  r.peak_allocated = d.get<std::uint64_t>();
  r.peak_allocated_time_ns = d.get<std::int64_t>();
  r.peak_reserved = d.get<std::uint64_t>();
  r.peak_reserved_time_ns = d.get<std::int64_t>();
  r.live_at_open = d.get<std::uint64_t>();
  r.live_at_close = d.get<std::uint64_t>();
  r.reserved_at_open = d.get<std::uint64_t>();
  r.reserved_at_close = d.get<std::uint64_t>();
  r.persistent = d.get<std::uint64_t>();
  r.fragmentation_at_peak = d.get<std::uint64_t>();
  r.oom = d.get<std::uint8_t>() != 0;
  r.oom_requested = d.get<std::uint64_t>();
  r.status = d.str();
  r.category_bytes = d.get<std::array<std::uint64_t, kCategoryCount>>();
  r.batch_method = d.str();
  r.batch_confidence = d.get<double>();
  return r;
}

void encode(Encoder& e, const ItemResult& it) {
  e.put(it.index);
  e.str(it.name);
  e.str(it.spill);
  e.put(it.rank);
  e.put(static_cast<std::uint8_t>(it.loaded));
  e.put(static_cast<std::uint8_t>(it.written));
  e.str(it.status);
  e.str(it.detail);
  const RankMeta& m = it.meta;
  e.put(m.rank);
  e.put(m.local_rank);
  e.put(m.world_size);
  e.put(m.local_world_size);
  e.put(m.node_rank);
  e.str(m.host);
  e.put(m.pid);
  e.str(m.run_name);
  e.str(m.source);
  e.str(m.device_name);
  e.str(m.config_json);
  e.str(m.tool_version);
  e.put(m.start_unix_ns);
  e.put(it.n_windows);
  e.put(static_cast<std::uint64_t>(it.rows.size()));
  for (const auto& r : it.rows) encode(e, r);
  e.put(static_cast<std::uint64_t>(it.sites.size()));
  for (const auto& s : it.sites) {
    e.put(s.rank);
    e.put(s.window);
    e.put(s.batch);
    e.str(s.site);
    e.put(static_cast<std::uint8_t>(s.category));
    e.put(s.bytes_at_peak);
    e.put(s.count);
    e.put(s.bytes_allocated);
    e.put(s.allocations);
    e.put(s.stack_id);
  }
}

ItemResult decode_item(Decoder& d) {
  ItemResult it;
  it.index = d.get<std::uint32_t>();
  it.name = d.str();
  it.spill = d.str();
  it.rank = d.get<std::int32_t>();
  it.loaded = d.get<std::uint8_t>() != 0;
  it.written = d.get<std::uint8_t>() != 0;
  it.status = d.str();
  it.detail = d.str();
  RankMeta& m = it.meta;
  m.rank = d.get<int>();
  m.local_rank = d.get<int>();
  m.world_size = d.get<int>();
  m.local_world_size = d.get<int>();
  m.node_rank = d.get<int>();
  m.host = d.str();
  m.pid = d.get<std::int64_t>();
  m.run_name = d.str();
  m.source = d.str();
  m.device_name = d.str();
  m.config_json = d.str();
  m.tool_version = d.str();
  m.start_unix_ns = d.get<std::int64_t>();
  it.n_windows = d.get<std::uint32_t>();
  const auto nrows = d.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < nrows; ++i) it.rows.push_back(decode_row(d));
  const auto nsites = d.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < nsites; ++i) {
    SiteRow s;
    s.rank = d.get<int>();
    s.window = d.get<int>();
    s.batch = d.get<std::int64_t>();
    s.site = d.str();
    s.category = static_cast<Category>(d.get<std::uint8_t>());
    s.bytes_at_peak = d.get<std::uint64_t>();
    s.count = d.get<std::uint64_t>();
    s.bytes_allocated = d.get<std::uint64_t>();
    s.allocations = d.get<std::uint64_t>();
    s.stack_id = d.get<std::uint32_t>();
    it.sites.push_back(std::move(s));
  }
  return it;
}

/// The rank named by a spill file name: rank<R>.pid<P>.spill -> R; -1 when it has no such prefix.
int rank_from_file_name(const std::string& name) {
  if (name.rfind("rank", 0) != 0) return -1;
  std::size_t i = 4;
  long long v = 0;
  while (i < name.size() && i < 14 && std::isdigit(static_cast<unsigned char>(name[i]))) v = v * 10 + (name[i++] - '0');
  if (i == 4 || (i < name.size() && name[i] != '.')) return -1;
  return static_cast<int>(v);
}

// A spill cut before its META record leaves the defaults in RankMeta.

std::string part_file_name(std::uint32_t index) { return "part" + std::to_string(index) + ".h5"; }
std::string rank_file_name(int rank) { return "rank" + std::to_string(rank) + ".h5"; }

struct ItemInput {
  std::uint32_t index = 0;
  fs::path spill;                      // read from here, unless record is set
  const RankRecord* record = nullptr;  // in-job: the caller's record
};

struct ProcessOptions {
  std::size_t top_sites = 32;
  int deflate = 1;
  std::optional<fs::path> part_dir;  // where to write the part file; unset: analyse only
};

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

/// Loads, analyses and (optionally) writes one input. Never throws: failures are results.
ItemResult process_item(const ItemInput& in, const ProcessOptions& o) {
  ItemResult it;
  it.index = in.index;
  std::optional<RankRecord> owned;
  const RankRecord* rec = in.record;
  if (rec != nullptr) {
    it.name = "the in-memory record of rank " + std::to_string(rec->meta.rank);
    it.spill = fs::path(rec->path).filename().string();
  } else {
    it.name = in.spill.string();
    it.spill = in.spill.filename().string();
    it.rank = rank_from_file_name(it.spill);
    try {
      owned = read_spill(in.spill);
      rec = &*owned;
    } catch (const std::exception& e) {
      it.status = "corrupt";
      it.detail = e.what();
      return it;
    } catch (...) {
      it.status = "corrupt";
      it.detail = it.name + ": cannot be read";
      return it;
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
        SiteRow sr;
        sr.rank = it.rank;
        sr.window = static_cast<int>(i);
        sr.batch = s.batch_end;
        sr.site = site.name;
        sr.category = site.category;
        sr.bytes_at_peak = site.bytes_at_peak;
        sr.count = site.count_at_peak;
        sr.bytes_allocated = site.bytes_allocated;
        sr.allocations = site.allocations;
        sr.stack_id = site.stack_id;
        it.sites.push_back(std::move(sr));
      }
    }
  } catch (const std::exception& e) {
    it.status = "error";
    it.detail = it.name + ": analysis failed: " + e.what();
    it.rows.clear();
    it.sites.clear();
    return it;
  }
  if (o.part_dir && it.rank >= 0) {
    RankInfo info;
    info.rank = it.rank;
    info.status = it.status;
    info.status_detail = it.detail;
    info.spill = it.spill;
    const fs::path part = *o.part_dir / part_file_name(it.index);
    try {
      StoreWriteOptions wo;
      wo.deflate = o.deflate;
      write_rank_file(part, r, info, wo);
      it.written = true;
    } catch (const std::exception& e) {
      std::error_code ec;
      fs::remove(part, ec);
      it.status = "error";
      it.detail = std::string("cannot write its data: ") + e.what();
    }
  }
  return it;
}

// --- rank 0: from item results to the store's index ---------------------------------------------

struct Resolution {
  int world_size = 0;
  std::string run_name;
  std::string config_json;
  std::vector<RankInfo> ranks;
  std::vector<SummaryRow> rows;
  std::vector<SiteRow> sites;
  std::vector<std::string> problems;          // one line per bad rank or file
  std::map<std::string, int> bad_counts;      // ranks by non-ok status
  std::vector<std::pair<std::uint32_t, int>> keep;  // written parts used: (item index, rank)
  std::vector<std::uint32_t> discard;         // written parts not used
};

SummaryRow status_row(const RankInfo& info) {
  SummaryRow row;
  row.rank = info.rank;
  row.window = -1;
  row.host = info.host;
  row.device = info.device;
  row.status = info.status;
  return row;
}

/// Decides, from every input's result, what the store holds for each rank 0..world_size-1.
/// `data_dir_name` names the folder of rank files as seen from the root file ("" for info only).
/// Depends only on the inputs (sorted by index), never on which aggregator rank read what.
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

// --- the collective driver ---------------------------------------------------------------------

/// Rank 0's plan, broadcast to all.
struct Plan {
  std::string error;
  fs::path output;  // absolute
  fs::path tmp;     // absolute temp folder beside the output
  bool progress = false;
  std::vector<std::pair<std::string, std::uint64_t>> files;  // aggregate mode: spills and sizes
};

std::vector<char> encode_plan(const Plan& p) {
  Encoder e;
  e.str(p.error);
  e.str(p.output.string());
  e.str(p.tmp.string());
  e.put(static_cast<std::uint8_t>(p.progress));
  e.put(static_cast<std::uint64_t>(p.files.size()));
  for (const auto& [f, s] : p.files) {
    e.str(f);
    e.put(s);
  }
  return std::move(e.bytes());
}

Plan decode_plan(const std::vector<char>& bytes) {
  Decoder d(bytes);
  Plan p;
  p.error = d.str();
  p.output = d.str();
  p.tmp = d.str();
  p.progress = d.get<std::uint8_t>() != 0;
  const auto n = d.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string f = d.str();
    p.files.emplace_back(std::move(f), d.get<std::uint64_t>());
  }
  return p;
}

/// Broadcasts rank 0's plan; every rank throws the same AggregateError when it carries one.
Plan share_plan(const mpi::Comm& comm, Plan plan) {
  std::vector<char> bytes;
  if (comm.rank() == 0) bytes = encode_plan(plan);
  mpi::bcast_bytes(comm, bytes, 0);
  Plan p = comm.rank() == 0 ? std::move(plan) : decode_plan(bytes);
  if (!p.error.empty()) throw AggregateError(p.error);
  return p;
}

/// Checks the output and makes the temporary folder (rank 0). Returns an error line or "".
std::string prepare_output(Plan& plan, const fs::path& output, bool overwrite) {
  std::error_code ec;
  plan.output = fs::absolute(output, ec).lexically_normal();
  if (ec) return output.string() + ": " + ec.message();
  const fs::path data = store_data_dir(plan.output);
  const fs::path parent = plan.output.parent_path();
  if (!fs::is_directory(parent, ec)) return plan.output.string() + ": the folder " + parent.string() + " does not exist";
  if (!overwrite) {
    for (const auto& p : {plan.output, data}) {
      if (fs::exists(fs::symlink_status(p, ec))) return p.string() + " already exists (use --overwrite to replace it)";
    }
  }
  std::random_device rd;
  std::ostringstream name;
  name << "." << plan.output.filename().string() << ".tmp-" << ::getpid() << "-" << std::hex << rd();
  plan.tmp = parent / name.str();
  if (!fs::create_directory(plan.tmp, ec) || ec) return plan.tmp.string() + ": cannot create the temporary folder: " + ec.message();
  if (!fs::create_directory(plan.tmp / store_data_dir(plan.output).filename(), ec) || ec) {
    fs::remove_all(plan.tmp, ec);
    return plan.tmp.string() + ": cannot create the temporary folder";
  }
  return "";
}

/// Moves the finished store from the temp folder into place: the old root goes first (so it
/// never points at new rank files), the new root comes last (its appearance commits the store).
void install_store(const Plan& plan, bool overwrite) {
  const fs::path data = store_data_dir(plan.output);
  const fs::path new_root = plan.tmp / plan.output.filename();
  const fs::path new_data = plan.tmp / data.filename();
  std::vector<std::pair<fs::path, fs::path>> done;  // (from, to), to undo on failure
  auto move = [&](const fs::path& from, const fs::path& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) throw AggregateError("cannot move " + from.string() + " to " + to.string() + ": " + ec.message());
    done.emplace_back(from, to);
  };
  try {
    for (const auto& p : {plan.output, data}) {
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(p, ec))) continue;
      if (!overwrite) throw AggregateError(p.string() + " already exists (use --overwrite to replace it)");
      move(p, plan.tmp / ("old." + p.filename().string()));
    }
    move(new_data, data);
    move(new_root, plan.output);
  } catch (...) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      std::error_code ec;
      fs::rename(it->second, it->first, ec);
    }
    throw;
  }
}

/// Counts finished inputs across ranks for the progress line (rank 0 prints).
class Progress {
 public:
  Progress(const mpi::Comm& comm, bool on, std::size_t total) : m_comm(comm), m_on(on), m_total(total) {}
  void add(std::size_t n) {
    if (!m_on || n == 0) return;
    if (m_comm.rank() != 0) {
      const std::uint64_t v = n;
      mpi::check(MPI_Send(&v, 1, MPI_UINT64_T, 0, kProgressTag, m_comm.get()), "MPI_Send");
      return;
    }
    m_done += n;
    drain(false);
    print();
  }
  /// Rank 0: waits for the other ranks' counts to reach the total.
  void finish() {
    if (!m_on || m_comm.rank() != 0) return;
    drain(true);
    print();
    if (m_inplace) std::fputc('\n', stderr);
  }

 private:
  void drain(bool wait) {
    while (m_done < m_total) {
      int flag = 1;
      MPI_Status st;
      if (!wait) {
        mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kProgressTag, m_comm.get(), &flag, &st), "MPI_Iprobe");
        if (!flag) return;
      }
      std::uint64_t v = 0;
      mpi::check(MPI_Recv(&v, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kProgressTag, m_comm.get(), &st), "MPI_Recv");
      m_done += v;
      if (wait) print();
    }
  }
  // On a terminal the line updates in place; elsewhere (mpirun hands its ranks a pipe for stderr)
  // a plain line at most every 5 s and at the end, readable in a log.
  void print() {
    if (m_inplace) {
      std::fprintf(stderr, "\rmemsnap aggregate: %zu/%zu ranks done", m_done, m_total);
    } else {
      const auto now = std::chrono::steady_clock::now();
      if (m_done < m_total && now - m_last < std::chrono::seconds(5)) return;
      if (m_done == m_total && m_printed_total) return;
      m_last = now;
      m_printed_total = m_done == m_total;
      std::fprintf(stderr, "memsnap aggregate: %zu/%zu ranks done\n", m_done, m_total);
    }
    std::fflush(stderr);
  }
  const mpi::Comm& m_comm;
  bool m_on;
  std::size_t m_total;
  std::size_t m_done = 0;
  bool m_inplace = ::isatty(STDERR_FILENO) != 0;
  bool m_printed_total = false;
  std::chrono::steady_clock::time_point m_last{};
};

struct CoreOptions {
  bool keep_going = false;
  bool overwrite = false;
  std::size_t top_sites = 32;
  int deflate = 1;
  std::ostream* log = nullptr;
  const char* verb = "memsnap aggregate";
};

/// Everything after the plan: local work, gather, rank 0's decision, broadcast of the outcome.
void run_collective(const mpi::Comm& comm, const Plan& plan, const std::vector<ItemInput>& mine, std::size_t total,
                    const CoreOptions& o) {
  ProcessOptions po;
  po.top_sites = o.top_sites;
  po.deflate = o.deflate;
  po.part_dir = plan.tmp / store_data_dir(plan.output).filename();
  Progress progress(comm, plan.progress, total);

  Encoder local;
  std::vector<ItemResult> results;
  std::string fatal;
  std::size_t done = 0;
  try {
    // A test hook: this aggregator rank fails outside any one spill (as if it lost its share).
    if (const char* f = std::getenv("MEMSNAP_AGGREGATE_TEST_FAULT"); f != nullptr && std::atoi(f) == comm.rank()) {
      throw AggregateError("injected fault (MEMSNAP_AGGREGATE_TEST_FAULT)");
    }
    for (const auto& in : mine) {
      results.push_back(process_item(in, po));
      ++done;
      progress.add(1);
    }
  } catch (const std::exception& e) {
    fatal = "aggregator rank " + std::to_string(comm.rank()) + " failed: " + e.what();
  } catch (...) {
    fatal = "aggregator rank " + std::to_string(comm.rank()) + " failed";
  }
  try {
    progress.add(mine.size() - done);
  } catch (const std::exception& e) {
    if (fatal.empty()) fatal = e.what();
  }
  progress.finish();
  local.str(fatal);
  local.put(static_cast<std::uint64_t>(results.size()));
  for (const auto& r : results) encode(local, r);
  results.clear();
  const auto gathered = mpi::gather_bytes(comm, local.bytes(), 0);

  // Rank 0 decides; the outcome goes to every rank.
  std::string headline;
  std::vector<std::string> details;
  if (comm.rank() == 0) {
    std::error_code ec;
    try {
      std::vector<ItemResult> all;
      std::vector<std::string> fatals;
      for (const auto& bytes : gathered) {
        Decoder d(bytes);
        std::string f = d.str();
        if (!f.empty()) fatals.push_back(std::move(f));
        const auto n = d.get<std::uint64_t>();
        for (std::uint64_t i = 0; i < n; ++i) all.push_back(decode_item(d));
      }
      if (!fatals.empty()) {
        throw AggregateError(fatals.front() + "; nothing was written",
                             std::vector<std::string>(fatals.begin() + 1, fatals.end()));
      }
      const fs::path data_dir = plan.tmp / store_data_dir(plan.output).filename();
      Resolution res = resolve(std::move(all), store_data_dir(plan.output).filename().string());
      if (res.world_size == 0) throw AggregateError("no spill could be read; nothing was written", res.problems);
      if (!res.problems.empty() && !o.keep_going) {
        throw AggregateError(std::to_string(res.problems.size()) + " problem" + (res.problems.size() > 1 ? "s" : "") +
                                 " (" + headline_counts(res) +
                                 "); nothing was written: rerun with --keep-going to write the store with them marked",
                             res.problems);
      }
      std::ostream& log = o.log != nullptr ? *o.log : std::cerr;
      for (const auto& p : res.problems) log << o.verb << ": warning: " << p << "\n";
      for (auto idx : res.discard) fs::remove(data_dir / part_file_name(idx), ec);
      for (const auto& [idx, rank] : res.keep) {
        fs::rename(data_dir / part_file_name(idx), data_dir / rank_file_name(rank), ec);
        if (ec) throw AggregateError("cannot rename " + (data_dir / part_file_name(idx)).string() + ": " + ec.message());
      }
      StoreIndex index;
      index.run_name = res.run_name;
      index.world_size = res.world_size;
      index.config_json = res.config_json;
      index.ranks = std::move(res.ranks);
      index.rows = std::move(res.rows);
      index.sites = std::move(res.sites);
      write_root_file(plan.tmp / plan.output.filename(), index);
      install_store(plan, o.overwrite);
      fs::remove_all(plan.tmp, ec);
    } catch (const AggregateError& e) {
      headline = e.what();
      details = e.details();
      fs::remove_all(plan.tmp, ec);
    } catch (const std::exception& e) {
      headline = e.what();
      fs::remove_all(plan.tmp, ec);
    }
  }
  Encoder out;
  out.str(headline);
  out.put(static_cast<std::uint64_t>(details.size()));
  for (const auto& d : details) out.str(d);
  std::vector<char> bytes = std::move(out.bytes());
  mpi::bcast_bytes(comm, bytes, 0);
  Decoder d(bytes);
  headline = d.str();
  const auto n = d.get<std::uint64_t>();
  details.clear();
  for (std::uint64_t i = 0; i < n; ++i) details.push_back(d.str());
  if (!headline.empty()) throw AggregateError(headline, details);
}

/// Shares files out: largest first, each to the least-loaded rank (ties: the lowest rank).
std::vector<std::uint32_t> my_share(const Plan& plan, int rank, int size) {
  std::vector<std::uint32_t> order(plan.files.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return plan.files[a].second > plan.files[b].second; });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(size), 0);
  std::vector<std::uint32_t> mine;
  for (auto i : order) {
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += plan.files[i].second + 1;
    if (r == rank) mine.push_back(i);
  }
  return mine;
}

}  // namespace

// --- public entry points ------------------------------------------------------------------------

int aggregate(const AggregateOptions& options, MPI_Comm parent) {
  h5::QuietErrors quiet;
  mpi::Comm comm(parent);
  Plan plan;
  if (comm.rank() == 0) {
    std::error_code ec;
    const fs::path run_dir = fs::absolute(options.run_dir, ec).lexically_normal();
    if (options.run_dir.empty()) {
      plan.error = "no run folder given";
    } else if (!fs::is_directory(run_dir, ec)) {
      plan.error = options.run_dir.string() + ": no such folder";
    } else {
      for (const auto& f : find_spills(run_dir)) plan.files.emplace_back(f.string(), fs::file_size(f, ec));
      if (plan.files.empty()) {
        plan.error = options.run_dir.string() + ": no spill files (looked for spill/*" + kSpillSuffix + " and *" + kSpillSuffix + ")";
      }
    }
    if (plan.error.empty()) {
      plan.error = prepare_output(plan, options.output.empty() ? run_dir / kDefaultStoreName : options.output, options.overwrite);
    }
    plan.progress = options.progress;
  }
  plan = share_plan(comm, std::move(plan));

  std::vector<ItemInput> mine;
  for (auto i : my_share(plan, comm.rank(), comm.size())) mine.push_back(ItemInput{i, plan.files[i].first, nullptr});
  CoreOptions o;
  o.keep_going = options.keep_going;
  o.overwrite = options.overwrite;
  o.top_sites = options.top_sites;
  o.deflate = options.deflate;
  o.log = options.log;
  run_collective(comm, plan, mine, plan.files.size(), o);
  return 0;
}

int aggregate_main(const AggregateOptions& options) {
  const char* prefix = "memsnap aggregate: ";
  try {
    mpi::Session session;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      return aggregate(options, MPI_COMM_WORLD);
    } catch (const AggregateError& e) {
      // Agreed on every rank: rank 0 speaks for all.
      if (rank == 0) {
        std::cerr << prefix << e.what() << "\n";
        for (const auto& d : e.details()) std::cerr << prefix << d << "\n";
      }
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << prefix << e.what() << "\n";
    return 1;
  }
}

struct InJobWriter::Impl {
  mpi::Comm comm;
  InJobOptions options;
  Impl(MPI_Comm c, InJobOptions o) : comm(c), options(std::move(o)) {}
  void run(std::vector<ItemInput>& mine);
};

InJobWriter::InJobWriter(MPI_Comm comm, InJobOptions options) {
  if (!mpi::initialized() || mpi::finalized()) {
    throw AggregateError("memsnap's in-job store writer needs MPI to be initialised (and not yet finalized)");
  }
  m_impl = std::make_unique<Impl>(comm, std::move(options));
}

InJobWriter::~InJobWriter() = default;

void InJobWriter::write(const RankRecord* record) {
  std::vector<ItemInput> mine;
  if (record != nullptr) mine.push_back(ItemInput{0, {}, record});
  m_impl->run(mine);
}

void InJobWriter::write_spill(const std::filesystem::path& spill) {
  // The spill is read inside the collective (as an item), so a bad spill is a marked rank,
  // not a rank that throws while the others wait.
  std::vector<ItemInput> mine;
  if (!spill.empty()) mine.push_back(ItemInput{0, spill, nullptr});
  m_impl->run(mine);
}

void InJobWriter::Impl::run(std::vector<ItemInput>& mine) {
  h5::QuietErrors quiet;
  const InJobOptions& opt = options;
  Plan plan;
  if (comm.rank() == 0) {
    plan.error = opt.output.empty() ? "no output store given" : prepare_output(plan, opt.output, opt.overwrite);
  }
  plan = share_plan(comm, std::move(plan));
  for (auto& in : mine) in.index = static_cast<std::uint32_t>(comm.rank());
  CoreOptions o;
  o.keep_going = opt.keep_going;
  o.overwrite = opt.overwrite;
  o.top_sites = opt.top_sites;
  o.deflate = opt.deflate;
  o.verb = "memsnap";
  run_collective(comm, plan, mine, 0, o);
}

// --- info -------------------------------------------------------------------------------------

namespace {

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
    nlohmann::json jr;
    jr["rank"] = r.rank;
    jr["status"] = r.status;
    jr["host"] = r.host;
    if (!r.status_detail.empty()) jr["status_detail"] = r.status_detail;
    jr["windows"] = nlohmann::json::array();
    slot[r.rank] = out_ranks.size();
    out_ranks.push_back(std::move(jr));
  }
  for (const auto& row : rows) {
    if (row.window < 0) continue;
    auto it = slot.find(row.rank);
    if (it == slot.end()) continue;
    nlohmann::json w;
    w["batch"] = row.batch_end;
    w["batch_start"] = row.batch_start;
    w["events"] = row.n_events;
    w["dropped"] = row.dropped;
    w["peak_allocated"] = row.peak_allocated;
    w["peak_reserved"] = row.peak_reserved;
    w["live_at_open"] = row.live_at_open;
    w["live_at_close"] = row.live_at_close;
    w["oom"] = row.oom;
    w["status"] = row.status;
    w["batch_method"] = row.batch_method;
    w["batch_confidence"] = row.batch_confidence;
    out_ranks[it->second]["windows"].push_back(std::move(w));
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
  for (std::uint32_t i = 0; i < spills.size(); ++i) {
    ItemResult it = process_item(ItemInput{i, spills[i], nullptr}, po);
    it.sites.clear();
    items.push_back(std::move(it));
  }
  Resolution res = resolve(std::move(items), "");
  return info_json(res.run_name, res.world_size, res.ranks, res.rows);
}

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, units[u]);
  return buf;
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
}

int info_main(const std::string& path, bool json, std::ostream& out) {
  try {
    std::error_code ec;
    nlohmann::json info;
    fs::path p(path);
    if (fs::is_directory(p, ec)) {
      if (find_spills(p).empty() && fs::is_regular_file(p / kDefaultStoreName, ec)) {
        info = store_info_json(StoreReader(p / kDefaultStoreName));
      } else {
        info = spill_info_json(p);
      }
    } else if (fs::exists(p, ec)) {
      info = store_info_json(StoreReader(p));
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
