// `memsnap import`: PyTorch snapshot pickles into a store.
//
// Each pickle becomes one window of its rank (rank and batch from the file name). The pickles of
// a rank are merged into one record, written as that rank's spill in a private folder, and the
// folder is aggregated exactly as a recorded run is: same analysis, same store, same sharing of
// the work under mpirun. The folder is removed afterwards. Within a process, the pickles are read
// on threads (one per CPU, while memory allows) and merged in the order a serial import reads
// them, so the store is the same either way.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <new>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/import_export.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/spill.hpp"
#include "output_guard.hpp"
#include "memsnap/progress.hpp"
#include "torch/snapshot.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;

// Appends `from`'s frames, stacks and windows to `into`, renumbering ids (also those the
// windows' source_extras name).
void merge_into(RankRecord& into, RankRecord&& from) {
  const auto frame_base = static_cast<std::uint32_t>(into.frames.size());
  const auto stack_base = static_cast<std::uint32_t>(into.stacks.size());
  for (auto& f : from.frames) into.frames.push_back(std::move(f));
  for (auto& s : from.stacks) {
    for (auto& id : s) id += frame_base;
    into.stacks.push_back(std::move(s));
  }
  auto shift = [&](std::uint32_t& id) {
    if (id != kNoStack) id += stack_base;
  };
  for (auto& w : from.windows) {
    for (auto& e : w.events) shift(e.stack_id);
    for (auto& a : w.live_at_start) shift(a.stack_id);
    for (auto& seg : w.segments) {
      for (auto& b : seg.blocks) shift(b.stack_id);
    }
    if (stack_base > 0 && !w.source_extras.empty()) {
      auto extras = nlohmann::json::parse(w.source_extras, nullptr, false);
      if (!extras.is_discarded()) {
        torch::shift_extras_stacks(extras, stack_base);
        w.source_extras = extras.dump();
      }
    }
    into.windows.push_back(std::move(w));
  }
}

// One line on how the windows' batches were found, so a user sees at once when they were inferred
// (and where nothing was found).
void print_batch_methods(const fs::path& store, const std::string& verb, std::ostream& out) {
  try {
    std::map<std::string, int> count;
    double lowest = 1;
    for (const auto& row : StoreReader(store).summary()) {
      if (row.window < 0) continue;
      ++count[row.batch_method];
      if (row.batch_method != "recorded" && row.batch_method != "none") lowest = std::min(lowest, row.batch_confidence);
    }
    if (count.empty() || (count.size() == 1 && count.count("recorded"))) return;
    std::string line;
    for (const auto& [method, n] : count) line += (line.empty() ? "" : ", ") + std::to_string(n) + " " + method;
    char conf[32];
    std::snprintf(conf, sizeof conf, "%.2f", lowest);
    out << verb << ": batch boundaries: " << line << " (lowest confidence " << conf
        << "; memsnap info --json has each window's; give --interval if the windows' batch count is known)\n";
  } catch (const std::exception&) {
    // the store was just written; a failure to read it back is reported by whoever opens it next
  }
}

}  // namespace

std::optional<std::pair<int, std::int64_t>> parse_rank_batch(const std::string& file_name, const std::string& tmpl) {
  // The template as a regular expression: {rank} and {batch} capture numbers, other variables
  // match anything, the rest is literal.
  std::string pattern = "^";
  int rank_group = 0, batch_group = 0, groups = 0;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] == '{') {
      const auto close = tmpl.find('}', i);
      if (close == std::string::npos) return std::nullopt;
      const std::string var = tmpl.substr(i + 1, close - i - 1);
      ++groups;
      if (var == "rank") rank_group = groups;
      if (var == "batch") batch_group = groups;
      pattern += (var == "rank" || var == "batch") ? "([0-9]+)" : "(.*?)";
      i = close;
    } else {
      if (std::strchr(".^$|()[]*+?\\", tmpl[i]) != nullptr) pattern += '\\';
      pattern += tmpl[i];
    }
  }
  if (rank_group == 0 || batch_group == 0) return std::nullopt;
  std::smatch m;
  if (!std::regex_search(file_name, m, std::regex(pattern))) return std::nullopt;
  try {
    return std::make_pair(std::stoi(m[rank_group].str()), std::stoll(m[batch_group].str()));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

constexpr int kImportProgressTag = 7782;

/// A pickle left out under --keep-going: its rank and why, sent to rank 0 for the summary.
struct LeftOut {
  int rank = 0;
  std::string file;
  std::string why;
};

std::vector<char> to_lines(const std::vector<LeftOut>& left) {
  std::string text;
  for (const auto& l : left) text += std::to_string(l.rank) + "\t" + l.file + "\t" + l.why + "\n";
  return {text.begin(), text.end()};
}

std::vector<LeftOut> from_lines(const std::vector<std::vector<char>>& all) {
  std::vector<LeftOut> out;
  for (const auto& bytes : all) {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    for (std::string line; std::getline(in, line);) {
      const auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
      if (t1 == std::string::npos || t2 == std::string::npos) continue;
      out.push_back(LeftOut{std::atoi(line.substr(0, t1).c_str()), line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1)});
    }
  }
  return out;
}

std::string plural(std::size_t n, const std::string& thing) {
  return std::to_string(n) + " " + thing + (n == 1 ? "" : "s");
}

/// One pickle to read: its file and who and when it is.
struct PickleTask {
  fs::path path;
  torch::ImportOptions options;
};

/// A pickle read: its record (with the extras in each window), or the line saying why not.
struct PickleOutcome {
  torch::ImportResult result;
  std::string error;
};

PickleOutcome read_pickle(const PickleTask& t) {
  PickleOutcome out;
  try {
    out.result = torch::import_snapshot_file(t.path.string(), t.options);
    // What the record has no place for travels with the window, so that export gives the pickle back.
    for (auto& w : out.result.record.windows) w.source_extras = out.result.extras.dump();
    out.result.extras = nlohmann::json();
  } catch (const std::bad_alloc&) {
    out.error = t.path.string() + ": out of memory while reading it";
  } catch (const std::exception& e) {
    out.error = e.what();
    // Every line names the file (the importer's own errors do).
    if (out.error.rfind(t.path.string(), 0) != 0) out.error = t.path.string() + ": " + out.error;
  }
  return out;
}

/// Memory a pickle takes while it is read and until it is merged, per byte of file: the streaming
/// reader's values in flight, the record's events (40 bytes each) and the extras' JSON. Measured
/// (peak RSS of torch::import_snapshot_file over the file's size, 1M entries of 16 frames from
/// tests/bench/gen_torch_snapshot): 0.34 with separate frames (275 MB), 0.71 with torch's frames
/// (113 MB), 0.88 with shared frames (80 MB), 0.90 and 1.25 for those two over 4 devices (the
/// merge by time copies the events once more); about 2.4x margin over the largest. A pickle whose
/// layout streaming cannot follow (not torch's) is read whole, at about 20 bytes a byte.
constexpr std::uint64_t kMemoryPerPickleByte = 3;

/// What threads may hold at once: three quarters of /proc/meminfo's MemAvailable (a 1 GiB
/// stand-in where it cannot be read).
std::uint64_t memory_budget() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      const std::uint64_t kib = std::strtoull(line.c_str() + 13, nullptr, 10);
      if (kib > 0) return kib * 1024 / 4 * 3;
    }
  }
  return 1ULL << 30;
}

/// Threads to read pickles on: the CPUs this process may run on, shared with the other memsnap
/// ranks on the node (mpirun -np M spreads the pickles over processes instead). Collective.
unsigned reader_threads(const mpi::Comm& comm) {
  MPI_Comm node = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int on_node = 1;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  unsigned allowed = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) allowed = static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
  const unsigned share = std::max(1u, std::max(1u, std::thread::hardware_concurrency()) / static_cast<unsigned>(on_node));
  return std::min(allowed, share);
}

/// Reads the tasks' pickles ahead on `threads` threads, in task order, while the caller takes the
/// outcomes in that same order. A pickle starts only while the memory the started and not yet
/// taken ones need (its size in `bytes` x kMemoryPerPickleByte) stays within `budget`, or when
/// none is in flight. With one thread it reads each pickle in take(), as a serial import does, unless
/// `ticking`: then one thread reads, and take() calls its `tick` while it waits (a progress line
/// within a large pickle).
class PickleReader {
 public:
  PickleReader(const std::vector<PickleTask>& tasks, const std::vector<std::uint64_t>& bytes, unsigned threads,
               std::uint64_t budget, bool ticking)
      : m_tasks(tasks), m_slots(tasks.size()), m_budget(budget) {
    for (std::size_t i = 0; i < tasks.size(); ++i) m_slots[i].cost = bytes[i] * kMemoryPerPickleByte;
    threads = static_cast<unsigned>(std::min<std::size_t>(threads, tasks.size()));
    if (threads <= 1 && !ticking) return;
    for (unsigned i = 0; i < threads; ++i) m_threads.emplace_back([this] { work(); });
  }
  ~PickleReader() {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_stopping = true;
    }
    m_cv.notify_all();
    for (auto& t : m_threads) t.join();
  }
  PickleReader(const PickleReader&) = delete;
  PickleReader& operator=(const PickleReader&) = delete;

  /// The outcome of task `i`; tasks are taken in order, each once. `tick` is called every quarter
  /// of a second while it waits for a reading thread.
  PickleOutcome take(std::size_t i, const std::function<void()>& tick) {
    if (m_threads.empty()) return read_pickle(m_tasks[i]);
    std::unique_lock<std::mutex> lock(m_mutex);
    while (!m_cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return m_slots[i].done; })) {
      lock.unlock();
      tick();
      lock.lock();
    }
    PickleOutcome out = std::move(m_slots[i].outcome);
    m_slots[i].outcome = PickleOutcome();
    m_in_flight -= m_slots[i].cost;
    lock.unlock();
    m_cv.notify_all();
    return out;
  }

 private:
  struct Slot {
    std::uint64_t cost = 0;
    bool done = false;
    PickleOutcome outcome;
  };
  const std::vector<PickleTask>& m_tasks;
  std::vector<Slot> m_slots;
  std::uint64_t m_budget;
  std::vector<std::thread> m_threads;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::size_t m_next = 0;        // the next task to start
  std::uint64_t m_in_flight = 0;  // cost of the started tasks not yet taken
  bool m_stopping = false;

  void work() {
    std::unique_lock<std::mutex> lock(m_mutex);
    for (;;) {
      m_cv.wait(lock, [&] {
        return m_stopping || m_next >= m_slots.size() || m_in_flight == 0 ||
               m_in_flight + m_slots[m_next].cost <= m_budget;
      });
      if (m_stopping || m_next >= m_slots.size()) return;
      const std::size_t i = m_next++;
      m_in_flight += m_slots[i].cost;
      lock.unlock();
      PickleOutcome out = read_pickle(m_tasks[i]);
      lock.lock();
      m_slots[i].outcome = std::move(out);
      m_slots[i].done = true;
      m_cv.notify_all();
    }
  }
};

}  // namespace

std::vector<fs::path> expand_pickle_paths(const std::vector<fs::path>& paths) {
  std::vector<fs::path> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    std::vector<fs::path> found;
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string ext = it->path().extension().string();
      if ((ext == ".pickle" || ext == ".pkl") && it->is_regular_file(ec)) found.push_back(it->path());
    }
    if (ec) throw std::runtime_error(p.string() + ": cannot list the folder: " + ec.message());
    if (found.empty()) throw std::runtime_error(p.string() + ": a folder without snapshot files (*.pickle, *.pkl)");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

int import_main(const ImportCliOptions& o) {
  std::unique_ptr<mpi::World> mpi_world;
  try {
    mpi_world = std::make_unique<mpi::World>();
  } catch (const std::exception& e) {
    std::cerr << o.verb << ": " << e.what() << "\n";
    return 1;
  }
  const mpi::Comm* comm = &mpi_world->comm;
  const bool root = comm->rank() == 0;
  auto fail = [&](const std::string& line) {
    if (root) std::cerr << o.verb << ": " << line << "\n";
    return 1;
  };
  std::vector<fs::path> pickles;
  try {
    pickles = expand_pickle_paths(o.pickles);
  } catch (const std::exception& e) {
    return fail(e.what());
  }

  // Which file is which rank and batch: decided alike on every rank (no I/O yet).
  if ((o.rank.has_value() || o.batch.has_value()) && pickles.size() != 1) {
    return fail("--rank and --batch name one file; with several, name them by a --template");
  }
  if (o.rank.has_value() != o.batch.has_value()) return fail("--rank and --batch go together");
  int interval = o.interval;
  if (interval == 0 && !o.config.empty()) {
    try {
      // The file's own values only: no MEMSNAP_* variables of this shell.
      interval = static_cast<int>(std::min<std::int64_t>(load_config(o.config, [](const char*) {
                                                           return std::optional<std::string>();
                                                         }).interval,
                                                         100000));
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  std::map<int, std::vector<std::pair<std::int64_t, fs::path>>> by_rank;
  std::map<std::pair<int, std::int64_t>, fs::path> seen;
  for (const auto& p : pickles) {
    std::pair<int, std::int64_t> rb;
    if (o.rank) {
      rb = {*o.rank, *o.batch};
    } else if (auto parsed = parse_rank_batch(p.filename().string(), o.name_template)) {
      rb = *parsed;
    } else {
      return fail(p.string() + ": the name does not fit the template '" + o.name_template +
                  "' (give --template, e.g. 'snap_rank{rank}_step{batch}', or --rank and --batch)");
    }
    // One window per rank and batch: the same file twice, or two files of one window, is refused
    // here, before any work.
    if (auto [it, fresh] = seen.emplace(rb, p); !fresh) {
      std::error_code ec;
      const bool same = it->second == p || fs::equivalent(it->second, p, ec);
      return fail(same ? p.string() + " is given twice"
                       : it->second.string() + " and " + p.string() + " are both rank " + std::to_string(rb.first) +
                             ", batch " + std::to_string(rb.second) + " (one snapshot per rank and batch)");
    }
    by_rank[rb.first].emplace_back(rb.second, p);
  }
  int world = o.world_size;
  if (world == 0) world = by_rank.empty() ? 1 : by_rank.rbegin()->first + 1;
  if (!by_rank.empty() && by_rank.rbegin()->first >= world) {
    return fail("rank " + std::to_string(by_rank.rbegin()->first) + " is beyond --world-size " + std::to_string(world));
  }
  // Only a store memsnap wrote is ever replaced, and only with --overwrite: checked before any work.
  {
    std::string refusal;
    if (root) {
      refusal = output_refusal(inspect_store_output(o.output), o.overwrite,
                               "it and its data folder " + store_data_dir(o.output).filename().string());
    }
    if (const std::string first = mpi::agree_on_error(*comm, refusal); !first.empty()) return fail(first);
  }
  const std::string run_name = !o.run_name.empty() ? o.run_name : o.output.stem().string();

  // A private folder beside the store for the converted records; its name comes from rank 0.
  std::vector<char> name_bytes;
  if (root) {
    const std::string name = interrupt::temporary_name(o.output, "import");
    name_bytes.assign(name.begin(), name.end());
  }
  mpi::bcast_bytes(*comm, name_bytes, 0);
  const fs::path work = fs::absolute(o.output).parent_path() / std::string(name_bytes.begin(), name_bytes.end());
  const fs::path spill_dir = work / "spill";
  interrupt::Temporary work_guard;  // an interrupted import leaves no working folder
  if (root) work_guard = interrupt::Temporary(work);

  // Each aggregator rank converts its share of ranks; failures are agreed on collectively.
  std::string error;
  std::error_code ec;
  if (root) {
    fs::create_directories(spill_dir, ec);
    if (ec) error = fs::absolute(o.output).parent_path().string() + ": cannot write the store in this folder: " + ec.message();
  }
  if (const std::string first = mpi::agree_on_error(*comm, error); !first.empty()) {
    if (root) fs::remove_all(work, ec);
    return fail(first);
  }
  // My share of the pickles, in the order a serial import reads them: rank by rank, each rank's
  // by batch. Threads read them ahead; they are merged in this order, so the store is the same.
  std::vector<PickleTask> tasks;
  std::vector<std::size_t> rank_ends;  // where each of my ranks' tasks end
  {
    int index = 0;
    for (auto& [rank, files] : by_rank) {
      if (index++ % comm->size() != comm->rank()) continue;
      std::sort(files.begin(), files.end());
      for (std::size_t fi = 0; fi < files.size(); ++fi) {
        const auto& [batch, path] = files[fi];
        PickleTask t;
        t.path = path;
        t.options.rank = rank;
        t.options.world_size = world;
        t.options.batch = batch;
        // Batches in the window: --interval, else the distance to the rank's neighbouring window
        // (Composer's repeated windows are `interval` batches apart), else unknown.
        t.options.expected_batches = interval;
        if (t.options.expected_batches == 0 && files.size() > 1) {
          const std::int64_t gap = fi > 0 ? batch - files[fi - 1].first : files[1].first - batch;
          if (gap > 0 && gap <= 100000) t.options.expected_batches = static_cast<int>(gap);
        }
        t.options.run_name = run_name;
        tasks.push_back(std::move(t));
      }
      rank_ends.push_back(tasks.size());
    }
  }
  unsigned threads = o.threads;
  try {
    if (threads == 0) threads = reader_threads(*comm);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Progress in bytes of the pickles read (torch::ImportOptions::progress), so that the line
  // moves within one large pickle too; rank 0's terminal decides, for every rank (Progress needs
  // them to agree). Each pickle's size (0 where it cannot be read) also sets its memory cost.
  int progress_wanted = root && Progress::wanted() ? 1 : 0;
  MPI_Bcast(&progress_wanted, 1, MPI_INT, 0, comm->get());
  const bool progress_on = progress_wanted != 0;
  std::vector<std::uint64_t> task_bytes(tasks.size(), 0);
  std::uint64_t all_bytes = 0, my_bytes = 0;
  for (const auto& p : pickles) {
    std::error_code size_ec;
    const auto size = fs::file_size(p, size_ec);
    all_bytes += size_ec ? 0 : size;
  }
  auto read_so_far = std::make_unique<std::atomic<std::uint64_t>[]>(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    std::error_code size_ec;
    const auto size = fs::file_size(tasks[i].path, size_ec);
    task_bytes[i] = size_ec ? 0 : size;
    my_bytes += task_bytes[i];
    tasks[i].options.progress = &read_so_far[i];
  }
  const std::size_t n_pickles = pickles.size();
  Progress progress(
      *comm, progress_on, all_bytes, o.verb,
      [n_pickles](std::size_t done, std::size_t total) {
        const int percent = total == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
        return std::to_string(percent) + " % of " + human_bytes(total) + " read (" + std::to_string(n_pickles) +
               (n_pickles == 1 ? " snapshot)" : " snapshots)");
      },
      kImportProgressTag);
  std::uint64_t reported = 0;  // bytes this rank has added to the progress
  std::size_t taken = 0;       // tasks taken: counted whole
  auto tick = [&] {
    std::uint64_t now = 0;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      now += i < taken ? task_bytes[i] : std::min(read_so_far[i].load(std::memory_order_relaxed), task_bytes[i]);
    }
    if (now > reported) progress.add(now - reported);
    reported = std::max(reported, now);
  };
  std::vector<LeftOut> left_out;
  try {
    PickleReader reader(tasks, task_bytes, error.empty() ? threads : 1, memory_budget(), progress_on && error.empty());
    std::size_t next = 0;
    for (std::size_t end : rank_ends) {
      if (!error.empty()) break;
      RankRecord merged;
      bool first = true;
      const int rank = tasks[next].options.rank;
      for (; next < end; ++next) {
        PickleOutcome r = reader.take(next, tick);
        if (!r.error.empty()) {
          if (!o.keep_going) {
            error = r.error;
            break;
          }
          std::cerr << o.verb << ": warning: " << r.error << " (left out: --keep-going)\n";
          left_out.push_back(LeftOut{rank, tasks[next].path.string(), r.error});
        } else {
          if (first) {
            merged.meta = r.result.record.meta;
            merged.meta.world_size = world;
            merged.meta.run_name = run_name;
            first = false;
          }
          merge_into(merged, std::move(r.result.record));
        }
        taken = next + 1;
        tick();
      }
      if (!error.empty() || first) continue;  // nothing readable: the rank comes out missing
      std::string werr;
      if (!write_spill(merged, spill_dir / spill_file_name(rank, merged.meta.pid), werr)) {
        // Named as the user sees it: the store's folder, not memsnap's working folder in it.
        const auto colon = werr.rfind(": ");
        error = fs::absolute(o.output).parent_path().string() + ": cannot write rank " + std::to_string(rank) +
                "'s converted snapshots there" + (colon == std::string::npos ? "" : werr.substr(colon));
      }
    }
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  progress.add(my_bytes - reported);  // what an error skipped, so that rank 0 stops waiting
  progress.finish();
  int code = 0;
  if (const std::string first = mpi::agree_on_error(*comm, error); !first.empty()) {
    if (root) std::cerr << o.verb << ": " << first << "\n";
    code = 1;
  } else {
    const std::vector<LeftOut> all_left = from_lines(mpi::gather_bytes(*comm, to_lines(left_out), 0));
    std::string none_read;
    if (root && all_left.size() == pickles.size()) {
      none_read = pickles.size() == 1 ? "the snapshot could not be read; nothing was written"
                                      : "none of the " + std::to_string(pickles.size()) +
                                            " snapshots could be read; nothing was written";
    }
    if (const std::string first = mpi::agree_on_error(*comm, none_read); !first.empty()) {
      MPI_Barrier(comm->get());
      if (root) fs::remove_all(work, ec);
      return fail(first);
    }
    AggregateOptions ao;
    ao.run_dir = work;
    ao.output = o.output;
    ao.overwrite = o.overwrite;
    ao.keep_going = o.keep_going || world > static_cast<int>(by_rank.size());
    ao.verb = o.verb;
    ao.progress = progress_on;
    std::ostringstream warnings;
    ao.log = &warnings;
    AggregateDone done;
    ao.done = &done;
    try {
      aggregate(ao, comm->get());
      if (root) {
        // A rank whose every pickle was left out comes out missing: its pickles' lines said why.
        std::set<int> explained;
        for (const auto& l : all_left) explained.insert(l.rank);
        std::istringstream in(warnings.str());
        for (std::string line; std::getline(in, line);) {
          const std::string tag = o.verb + ": warning: rank ";
          if (line.rfind(tag, 0) == 0 && explained.count(std::atoi(line.c_str() + tag.size())) &&
              line.find(": missing: no spill file") != std::string::npos) {
            continue;
          }
          std::cerr << line << "\n";
        }
        const std::size_t total = pickles.size();
        std::cout << o.verb << ": ";
        if (all_left.empty()) {
          std::cout << plural(total, "snapshot") << " read";
        } else {
          std::cout << total - all_left.size() << " of " << plural(total, "snapshot") << " read (" << all_left.size()
                    << " left out:";
          for (std::size_t i = 0; i < all_left.size() && i < 3; ++i) std::cout << " " << all_left[i].file;
          if (all_left.size() > 3) std::cout << " ...";
          std::cout << ")";
        }
        std::cout << ", " << plural(static_cast<std::size_t>(done.ranks), "rank") << ", "
                  << plural(done.windows, "window") << " -> " << o.output.string() << "\n";
        print_batch_methods(o.output, o.verb, std::cout);
        if (o.suggest_report) std::cout << "  next: memsnap report " << o.output.string() << "\n";
      }
    } catch (const AggregateError& e) {
      if (root) {
        std::cerr << warnings.str();
        std::cerr << o.verb << ": " << e.what() << "\n";
        for (const auto& d : e.details()) std::cerr << "  " << d << "\n";
      }
      code = 1;
    }
  }
  MPI_Barrier(comm->get());
  if (root) fs::remove_all(work, ec);
  return code;
}

}  // namespace memsnap
