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
bool meta_present(const RankMeta& m) { return !(m.host.empty() && m.pid == 0 && m.run_name.empty() && m.config_json.empty()); }

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
