// Aggregation over MPI: share the spills out, analyse and write each rank's file in parallel,
// gather the metadata to rank 0, which decides, writes the root file and renames the store into
// place. One input's analysis and rank 0's decision are in rank_input.cpp; `memsnap info` in
// info.cpp.
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

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <future>
#include <iostream>
#include <regex>
#include <thread>

#include "rank_input.hpp"
#include "hdf5_util.hpp"
#include "memsnap/codec.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/spill.hpp"
#include "output_guard.hpp"
#include "memsnap/progress.hpp"

namespace memsnap {

namespace {

namespace fs = std::filesystem;

constexpr int kProgressTag = 7781;

// --- the collective driver ---------------------------------------------------------------------

/// One spill of the run and its size (which shares the spills out).
struct SpillFile {
  std::string path;
  std::uint64_t bytes = 0;
};

/// Rank 0's plan, broadcast to all.
struct Plan {
  std::string error;
  fs::path output;  // absolute
  fs::path tmp;     // absolute temp folder beside the output
  bool progress = false;
  std::vector<SpillFile> files;  // aggregate mode: spills and sizes
};

/// What an aggregator rank sends rank 0: a failure outside any one input, and each input's result.
struct ShareResult {
  std::string fatal;
  std::vector<ItemResult> items;
};

/// Rank 0's decision, sent to all: empty headline for success.
struct Outcome {
  std::string headline;
  std::vector<std::string> details;
};

}  // namespace

template <>
struct Fields<SpillFile> {
  static constexpr auto list = std::tuple{field("path", &SpillFile::path), field("bytes", &SpillFile::bytes)};
};
template <>
struct Fields<Plan> {
  static constexpr auto list = std::tuple{field("error", &Plan::error), field("output", &Plan::output),
                                          field("tmp", &Plan::tmp), field("progress", &Plan::progress),
                                          field("files", &Plan::files)};
};
template <>
struct Fields<ShareResult> {
  static constexpr auto list = std::tuple{field("fatal", &ShareResult::fatal), field("items", &ShareResult::items)};
};
template <>
struct Fields<Outcome> {
  static constexpr auto list = std::tuple{field("headline", &Outcome::headline), field("details", &Outcome::details)};
};

namespace {

template <class T>
std::vector<char> to_wire(const T& v) {
  ByteWriter w;
  w.value(v);
  if (w.overflowed()) throw AggregateError("internal: a text or list too long to send between aggregator ranks");
  return std::move(w.bytes());
}

template <class T>
T from_wire(const std::vector<char>& bytes) {
  try {
    ByteReader r(bytes);
    T v = r.value<T>();
    if (!r.done()) throw ByteReader::Short{};
    return v;
  } catch (const ByteReader::Short&) {
    throw AggregateError("internal: gathered metadata is shorter than announced");
  }
}

/// Broadcasts rank 0's plan; every rank throws the same AggregateError when it carries one.
Plan share_plan(const mpi::Comm& comm, Plan plan) {
  std::vector<char> bytes;
  if (comm.rank() == 0) bytes = to_wire(plan);
  mpi::bcast_bytes(comm, bytes, 0);
  Plan p = comm.rank() == 0 ? std::move(plan) : from_wire<Plan>(bytes);
  if (!p.error.empty()) throw AggregateError(p.error);
  return p;
}

/// What --overwrite replaces, for the refusal without it.
std::string store_replaces(const fs::path& store) {
  return "it and its data folder " + store_data_dir(store).filename().string();
}

/// A message with the temporary folder's paths in it, as the user's: a rank file being written
/// (TMP/STORE.d/partN.h5) reads as the store's data folder, the rest as the output's folder.
std::string for_user(std::string text, const Plan& plan) {
  if (plan.tmp.empty()) return text;
  const std::string data = (plan.tmp / store_data_dir(plan.output).filename()).string();
  const std::string shown = store_data_dir(plan.output).string();
  for (std::size_t at; (at = text.find(data + "/part")) != std::string::npos;) {
    std::size_t end = at + data.size() + 5;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (text.compare(end, 3, ".h5") == 0) end += 3;
    text.replace(at, end - at, shown);
  }
  for (std::size_t at; (at = text.find(plan.tmp.string())) != std::string::npos;) {
    text.replace(at, plan.tmp.string().size(), plan.output.parent_path().string());
  }
  // HDF5's description of a failed write spans lines ("file write failed: time = ...\n, filename
  // = ..., errno = 28, error message = 'No space left on device', ..."): its error message only.
  static const std::regex hdf5_io(R"(time = [\s\S]*?error message = '([^']*)'[^\n]*?offset = \d+)");
  text = std::regex_replace(text, hdf5_io, "$1");
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

/// Checks the output and makes the temporary folder (rank 0), which `guard` removes if the process
/// is interrupted. Returns an error line or "".
std::string prepare_output(Plan& plan, const fs::path& output, bool overwrite, interrupt::Temporary& guard) {
  std::error_code ec;
  plan.output = fs::absolute(output, ec).lexically_normal();
  if (ec) return output.string() + ": " + ec.message();
  const fs::path parent = plan.output.parent_path();
  if (!fs::is_directory(parent, ec)) return plan.output.string() + ": the folder " + parent.string() + " does not exist";
  // Only a store memsnap wrote is ever replaced, and only with --overwrite (output_guard.hpp);
  // the path as the user gave it, in the message.
  if (std::string refusal = output_refusal(inspect_store_output(output), overwrite, store_replaces(output));
      !refusal.empty()) {
    return refusal;
  }
  plan.tmp = parent / interrupt::temporary_name(plan.output, "tmp");
  guard = interrupt::Temporary(plan.tmp);
  if (!fs::create_directory(plan.tmp, ec) || ec) {
    return parent.string() + ": cannot write the store in this folder: " + ec.message();
  }
  if (!fs::create_directory(plan.tmp / store_data_dir(plan.output).filename(), ec) || ec) {
    fs::remove_all(plan.tmp, ec);
    return parent.string() + ": cannot write the store in this folder: " + ec.message();
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
    // Checked again: the store may have changed, or something else appeared, since the plan.
    const OutputState there = inspect_store_output(plan.output);
    if (std::string refusal = output_refusal(there, overwrite, store_replaces(plan.output)); !refusal.empty()) {
      throw AggregateError(refusal);
    }
    for (const auto& p : {plan.output, data}) {
      std::error_code ec;
      if (fs::exists(fs::symlink_status(p, ec))) move(p, plan.tmp / ("old." + p.filename().string()));
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

struct CoreOptions {
  bool keep_going = false;
  bool overwrite = false;
  std::size_t top_sites = 32;
  int deflate = 1;
  unsigned threads = 0;
  std::ostream* log = nullptr;
  AggregateStats* stats = nullptr;
  std::string verb = "memsnap aggregate";
  AggregateDone* done = nullptr;
  bool widen_binding = false;  // see threads_per_rank
};

/// CPUs the calling thread may run on.
unsigned cpus_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, CPU_COUNT(&set));
}

/// Compression threads for each aggregator rank: the node's cores shared out among the
/// aggregator ranks on it (collective).
///
/// mpirun binds each rank to one core by default (Open MPI with -np 1 or 2), right for a
/// one-thread compute rank, but an aggregator rank runs threads of its own: bound, they all
/// share that core (measured: -np 1 ran at the speed of one core with two compression threads).
/// With `widen`, a rank bound to fewer CPUs than its share lets its threads run on all of the
/// node's; otherwise (in-job, inside the user's program) its threads fit the CPUs it has.
unsigned threads_per_rank(const mpi::Comm& comm, bool widen) {
  MPI_Comm node = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int on_node = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned share = std::max(1u, cores / static_cast<unsigned>(std::max(on_node, 1)));
  if (cpus_allowed() >= share) return share;
  if (widen) {
    // This thread only: the threads it starts next inherit the mask; MPI's own stay bound.
    cpu_set_t set;
    CPU_ZERO(&set);
    for (unsigned c = 0; c < cores && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
    if (::sched_setaffinity(0, sizeof set, &set) == 0 && cpus_allowed() >= share) return share;
  }
  return cpus_allowed();
}

/// Everything after the plan: local work, gather, rank 0's decision, broadcast of the outcome.
void run_collective(const mpi::Comm& comm, const Plan& plan, const std::vector<ItemInput>& mine, std::size_t total,
                    const CoreOptions& o, interrupt::Temporary& tmp_guard) {
  ProcessOptions po;
  po.top_sites = o.top_sites;
  po.deflate = o.deflate;
  po.threads = o.threads != 0 ? o.threads : threads_per_rank(comm, o.widen_binding);
  po.part_dir = plan.tmp / store_data_dir(plan.output).filename();
  Progress progress(comm, plan.progress, total, o.verb, "ranks written", kProgressTag);

  ShareResult local;
  std::vector<ItemResult>& results = local.items;
  std::string& fatal = local.fatal;
  std::size_t done = 0;
  try {
    // A test hook: this aggregator rank fails outside any one spill (as if it lost its share).
    if (const char* f = std::getenv("MEMSNAP_AGGREGATE_TEST_FAULT"); f != nullptr && std::atoi(f) == comm.rank()) {
      throw AggregateError("injected fault (MEMSNAP_AGGREGATE_TEST_FAULT)");
    }
    const auto start = std::chrono::steady_clock::now();
    StoreWriteOptions wo;
    wo.deflate = po.deflate;
    wo.threads = po.threads;
    RankFileWriter writer(wo);
    // The next input is read and analysed on a thread of its own while this one's rank file is
    // written (this thread alone calls HDF5 and MPI). Two records at most are held; the one just
    // written lends its memory to the next read.
    RankRecord spare;
    std::future<LoadedItem> next;
    auto load = [&](std::size_t k) {
      next = std::async(std::launch::async, [&po, in = mine[k], reuse = std::move(spare)]() mutable {
        return load_item(in, po, std::move(reuse));
      });
      spare = RankRecord{};
    };
    if (!mine.empty()) load(0);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      LoadedItem item = next.get();
      if (k + 1 < mine.size()) load(k + 1);
      write_item(item, po, writer);
      results.push_back(std::move(item.result));
      ++done;
      if (o.stats != nullptr) {
        std::error_code ec;
        o.stats->spills++;
        if (!mine[k].spill.empty()) o.stats->spill_bytes += fs::file_size(mine[k].spill, ec);
        for (const auto& row : results.back().rows) o.stats->events += row.n_events;
      }
      progress.add(1);
      if (item.owned) spare = std::move(*item.owned);
    }
    if (o.stats != nullptr) {
      o.stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      o.stats->threads = writer.threads();
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
  std::vector<char> local_bytes;
  try {
    local_bytes = to_wire(local);
  } catch (const AggregateError& e) {
    local_bytes = to_wire(ShareResult{"aggregator rank " + std::to_string(comm.rank()) + " failed: " + e.what(), {}});
  }
  results.clear();
  const auto gathered = mpi::gather_bytes(comm, local_bytes, 0);

  // Rank 0 decides; the outcome goes to every rank.
  std::string headline;
  std::vector<std::string> details;
  if (comm.rank() == 0) {
    std::error_code ec;
    try {
      std::vector<ItemResult> all;
      std::vector<std::string> fatals;
      for (const auto& bytes : gathered) {
        ShareResult share = from_wire<ShareResult>(bytes);
        if (!share.fatal.empty()) fatals.push_back(std::move(share.fatal));
        for (auto& item : share.items) all.push_back(std::move(item));
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
      for (const auto& p : res.problems) log << o.verb << ": warning: " << for_user(p, plan) << "\n";
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
      // The findings, once, from every window's digest (memsnap/findings.hpp): kept in the store.
      StoreFindings found;
      {
        StoreInfo run;
        run.run_name = index.run_name;
        run.world_size = index.world_size;
        run.ranks = index.ranks;
        run.rows = index.rows;
        found.findings = compute_findings(run, index.sites, res.digest.windows_grouped());
        found.digest = std::move(res.digest);
      }
      index.findings = &found;
      write_root_file(plan.tmp / plan.output.filename(), index);
      // From here the temporary folder may hold the earlier store (install_store moves it there
      // before the new one goes in): an interrupt must not remove it.
      tmp_guard.release();
      {
        const interrupt::Deferred renames;  // the store is installed whole, or left as it was
        install_store(plan, o.overwrite);
      }
      fs::remove_all(plan.tmp, ec);
      if (o.done != nullptr) {
        o.done->filled = true;
        o.done->ranks = index.world_size;
        o.done->windows = static_cast<std::size_t>(
            std::count_if(index.rows.begin(), index.rows.end(), [](const SummaryRow& r) { return r.window >= 0; }));
        o.done->marked = static_cast<std::size_t>(
            std::count_if(index.ranks.begin(), index.ranks.end(), [](const RankInfo& r) { return r.status != "ok"; }));
      }
    } catch (const AggregateError& e) {
      headline = e.what();
      details = e.details();
      fs::remove_all(plan.tmp, ec);
    } catch (const std::exception& e) {
      headline = e.what();
      fs::remove_all(plan.tmp, ec);
    }
  }
  if (comm.rank() == 0) {
    headline = for_user(headline, plan);
    for (auto& d : details) d = for_user(d, plan);
  }
  std::vector<char> bytes = comm.rank() == 0 ? to_wire(Outcome{headline, details}) : std::vector<char>();
  mpi::bcast_bytes(comm, bytes, 0);
  const Outcome outcome = from_wire<Outcome>(bytes);
  if (!outcome.headline.empty()) throw AggregateError(outcome.headline, outcome.details);
}

/// Shares files out: largest first, each to the least-loaded rank (ties: the lowest rank).
std::vector<std::uint32_t> my_share(const Plan& plan, int rank, int size) {
  std::vector<std::uint32_t> order(plan.files.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return plan.files[a].bytes > plan.files[b].bytes; });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(size), 0);
  std::vector<std::uint32_t> mine;
  for (auto i : order) {
    const auto r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += plan.files[i].bytes + 1;
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
  interrupt::Temporary tmp_guard;
  if (comm.rank() == 0) {
    std::error_code ec;
    const fs::path run_dir = fs::absolute(options.run_dir, ec).lexically_normal();
    if (options.run_dir.empty()) {
      plan.error = "no run folder given";
    } else if (!fs::is_directory(run_dir, ec)) {
      plan.error = options.run_dir.string() + ": no such folder";
    } else {
      // One launch's records make a store (lib/src/spill.cpp: choose_launch).
      const LaunchChoice chosen = choose_launch(run_dir, options.launch);
      if (!chosen.note.empty()) (options.log != nullptr ? *options.log : std::cerr) << "memsnap aggregate: " << chosen.note << "\n";
      for (const auto& f : chosen.files) plan.files.push_back(SpillFile{f.string(), fs::file_size(f, ec)});
      if (!chosen.error.empty()) {
        plan.error = chosen.error;
      } else if (plan.files.empty()) {
        plan.error = options.run_dir.string() + ": no spill files (looked for spill/*" + kSpillSuffix + " and *" + kSpillSuffix + ")";
      }
    }
    if (plan.error.empty()) {
      plan.error = prepare_output(plan, options.output.empty() ? run_dir / kDefaultStoreName : options.output, options.overwrite,
                                  tmp_guard);
    }
    plan.progress = options.progress;
  }
  plan = share_plan(comm, std::move(plan));

  std::vector<ItemInput> mine;
  for (auto i : my_share(plan, comm.rank(), comm.size())) mine.push_back(ItemInput{i, plan.files[i].path, nullptr});
  CoreOptions o;
  o.keep_going = options.keep_going;
  o.overwrite = options.overwrite;
  o.top_sites = options.top_sites;
  o.deflate = options.deflate;
  o.threads = options.threads;
  // A rank mpirun bound to one core widens; a process nobody launched keeps the CPUs its user
  // gave it (taskset, numactl).
  o.widen_binding = mpi::launched();
  o.log = options.log;
  o.stats = options.stats;
  o.done = options.done;
  o.verb = options.verb;
  run_collective(comm, plan, mine, plan.files.size(), o, tmp_guard);
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
  interrupt::Temporary tmp_guard;
  if (comm.rank() == 0) {
    plan.error = opt.output.empty() ? "no output store given" : prepare_output(plan, opt.output, opt.overwrite, tmp_guard);
  }
  plan = share_plan(comm, std::move(plan));
  for (auto& in : mine) in.index = static_cast<std::uint32_t>(comm.rank());
  CoreOptions o;
  o.keep_going = opt.keep_going;
  o.overwrite = opt.overwrite;
  o.top_sites = opt.top_sites;
  o.deflate = opt.deflate;
  o.verb = "memsnap";
  run_collective(comm, plan, mine, 0, o, tmp_guard);
}

}  // namespace memsnap
