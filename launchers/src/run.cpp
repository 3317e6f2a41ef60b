#include "run.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/launch_env.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/names.hpp"
#include "memsnap/report.hpp"
#include "memsnap/spill.hpp"

extern char** environ;

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The signals `memsnap run` passes on to its command while it runs.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};

// How `memsnap run` handles signals while its command runs: no handler, but the signals it passes
// on, and SIGCHLD, blocked and taken one at a time by the thread that waits for the command
// (sigtimedwait), so that nothing is lost between fork and the wait, nothing runs in a handler,
// and memsnap records how the command ended before a signal can end memsnap itself.
class ChildSignals {
 public:
  // Blocks the signals to pass on (those the shell ignores stay ignored, in memsnap and in the
  // command: `nohup`, a script's background job) and SIGCHLD.
  ChildSignals() {
    sigemptyset(&m_waited);
    for (int sig : kForwarded) {
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_IGN) sigaddset(&m_waited, sig);
    }
    // An inherited SIGCHLD ignore would reap the command before memsnap could see how it ended.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &m_sigchld);
    sigaddset(&m_waited, SIGCHLD);
    sigprocmask(SIG_BLOCK, &m_waited, &m_mask);
  }

  // In the child, before exec: the signal state memsnap was started with.
  void restore_in_child() const {
    sigaction(SIGCHLD, &m_sigchld, nullptr);
    sigprocmask(SIG_SETMASK, &m_mask, nullptr);
  }

  // Waits for `child` to end, passing signals on to it; returns its wait status. Not one from the
  // terminal (Ctrl-C, a hang-up), which the kernel sends to the whole foreground process group:
  // the child, still in memsnap's group, got it too, and a second SIGINT is "force quit" to many
  // training loops.
  int wait_passing_on(pid_t child) const {
    int status = 0;
    for (;;) {
      const pid_t done = waitpid(child, &status, WNOHANG);
      if (done == child || (done < 0 && errno == ECHILD)) return status;
      siginfo_t info{};
      const timespec poll = {1, 0};  // a missed SIGCHLD costs a second at most
      const int sig = sigtimedwait(&m_waited, &info, &poll);
      if (sig <= 0 || sig == SIGCHLD) continue;
      if (info.si_code == SI_KERNEL && getpgid(child) == getpgrp()) continue;
      kill(child, sig);
    }
  }

  // The command has ended: from here on a signal is for memsnap run itself, as for the other
  // commands (an interrupted gathering or report removes its temporaries and ends by the signal).
  // One that came meanwhile acts now.
  void resume() const {
    sigaction(SIGCHLD, &m_sigchld, nullptr);
    interrupt::remove_temporaries_on_signal();  // takes SIGINT, SIGTERM and SIGHUP, still blocked
    sigset_t others;
    sigemptyset(&others);
    for (int sig : {SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGCHLD})
      if (sigismember(&m_waited, sig) && !sigismember(&m_mask, sig)) sigaddset(&others, sig);
    sigprocmask(SIG_UNBLOCK, &others, nullptr);
  }

 private:
  sigset_t m_waited;  // the signals passed on, and SIGCHLD
  sigset_t m_mask;    // the mask memsnap was started with
  struct sigaction m_sigchld {};
};

void say(int rank, const std::string& line) {
  const std::string text = "memsnap run[rank " + std::to_string(rank) + "]: " + line + "\n";
  ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

// A file installed beside the memsnap binary: BIN/../lib/RELATIVE or BIN/../lib64/RELATIVE,
// when `marker` (relative to it) exists; empty otherwise.
fs::path installed(const std::string& self, const fs::path& relative, const fs::path& marker = {}) {
  std::error_code ec;
  const fs::path bin = fs::canonical(self.empty() ? "/proc/self/exe" : self, ec).parent_path();
  for (const fs::path& p : {bin / "../lib" / relative, bin / "../lib64" / relative}) {
    if (fs::exists(marker.empty() ? p : p / marker, ec)) return fs::weakly_canonical(p, ec);
  }
  return {};
}

fs::path cupti_library(const std::string& self) { return installed(self, "libmemsnap_cupti.so"); }

// The folder holding memsnap's Python startup hook (sitecustomize.py, memsnap_torch/).
fs::path python_hook_folder(const std::string& self) {
  return installed(self, "memsnap/python", fs::path("memsnap_torch") / "__init__.py");
}

// The child's verdict on MPI, from its clean record: "yes", "no" or "unknown".
std::string child_used_mpi(const fs::path& spill_dir, int rank, long pid) {
  const fs::path spill = spill_dir / spill_file_name(rank, pid);
  std::error_code ec;
  if (!fs::exists(spill, ec)) return "unknown";
  try {
    const RankRecord r = read_spill(spill);
    if (!r.ended) return "unknown";
    return r.used_mpi ? "yes" : "no";
  } catch (const std::exception&) {
    return "unknown";
  }
}

fs::path exit_record_path(const fs::path& spill_dir, int rank) { return spill_dir / ("rank" + std::to_string(rank) + ".exit.json"); }

std::string g_launch;    // launch_identity() of this process's launch
bool g_refused = false;  // an earlier run is in the folder and overwrite is false

// An exit record written by this launch (any record, when the launcher names no launch).
bool this_launch(const json& record) { return g_launch.empty() || record.value("launch", std::string()) == g_launch; }

// When a process started, in clock ticks since boot (/proc/PID/stat field 22); 0 when unknown.
// With the pid, it names a process that pid reuse cannot confuse with another.
std::string process_start_ticks(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return "0";
  std::istringstream fields(stat.substr(paren + 2));  // from field 3 (state) on
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
  }
  return field.empty() ? "0" : field;
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// This launch, as the launcher names it (the same on every rank of one job step, new at the next):
// an exit record or a spill of an earlier launch into the same folder is stale, and a store is
// made of one launch's records. Empty only when the ranks cannot agree on a name (torchrun over
// several nodes without --rdzv-id).
std::string launch_identity(const LaunchInfo& launch, const EnvLookup& env) {
  if (!launch.job_id.empty()) {
    std::string id = launch.job_id;
    if (auto step = env("SLURM_STEP_ID")) id += "." + *step;
    return id;
  }
  // Open MPI 4 names no job in the environment, but every process of one mpirun gets the
  // mpirun's own address, which starts with its process name (jobfamily.vpid).
  if (auto uri = env("OMPI_MCA_orte_hnp_uri"); uri && !uri->empty()) return uri->substr(0, uri->find(';'));
  // One process: this memsnap run itself.
  if (launch.world_size == 1) return host_name() + ":" + std::to_string(getpid()) + ":" + process_start_ticks(getpid());
  // torchrun on one node without a run id: its ranks are children of one agent process.
  if (launch.launcher == "torchrun" && launch.local_world_size == launch.world_size) {
    return host_name() + ":" + std::to_string(getppid()) + ":" + process_start_ticks(getppid());
  }
  return {};
}

// What `memsnap run` knows of an earlier launch's record in the run folder: a file and when it was made.
struct EarlierRecord {
  fs::path file;
  std::string made;  // launch_time_text
};

// The follow-up for a user who wants to see an earlier record on purpose.
std::string look_at_earlier(const fs::path& run_dir, const std::string& self) {
  std::error_code ec;
  const fs::path store = run_dir / "memsnap.h5";
  if (fs::exists(store, ec)) return self + " report " + store.string();
  return self + " aggregate " + run_dir.string() + " && " + self + " report " + store.string();
}

std::string file_time_text(const fs::path& p) {
  std::error_code ec;
  const auto t = fs::last_write_time(p, ec);
  if (ec) return launch_time_text(0);
  const auto sys = std::chrono::file_clock::to_sys(t);
  return launch_time_text(std::chrono::duration_cast<std::chrono::nanoseconds>(sys.time_since_epoch()).count());
}

bool read_exit_record(const fs::path& p, json& out) {
  std::ifstream in(p);
  if (!in) return false;
  try {
    out = json::parse(in);
    return out.is_object();
  } catch (const json::exception&) {
    return false;  // being written: not there yet
  }
}

// Waits until every rank's exit record is in the (shared) spill folder, or the time is up.
// Returns the ranks still missing.
std::vector<int> wait_for_ranks(const fs::path& spill_dir, int world, double seconds, int rank, bool talk) {
  const auto start = std::chrono::steady_clock::now();
  auto last_note = start;
  while (true) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      json j;
      if (!read_exit_record(exit_record_path(spill_dir, r), j) || !this_launch(j)) missing.push_back(r);
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (missing.empty() || waited >= seconds) return missing;
    if (talk && std::chrono::steady_clock::now() - last_note > std::chrono::seconds(10)) {
      std::string list;
      for (std::size_t i = 0; i < missing.size() && i < 16; ++i) list += (i ? " " : "") + std::to_string(missing[i]);
      if (missing.size() > 16) list += " ...";
      say(rank, "waiting for " + std::to_string(missing.size()) + " rank(s) to finish: " + list);
      last_note = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// Aggregates the run folder (keeping going past bad ranks) and renders the report, in one MPI
// session for both stages: each would otherwise finalise it behind the other. Collective over
// whoever calls it; errors are printed by the stages themselves.
void gather_and_report(const fs::path& run_dir, const fs::path& store, bool overwrite, bool report, int rank,
                       const std::string& on_mpi_failure) {
  std::unique_ptr<mpi::Session> session;
  try {
    session = std::make_unique<mpi::Session>();
  } catch (const std::exception& e) {
    say(rank, e.what() + on_mpi_failure);
    return;
  }
  AggregateOptions ao;
  ao.run_dir = run_dir;
  ao.launch = g_launch;  // this launch's records only (empty: the newest launch's)
  ao.overwrite = overwrite;
  ao.keep_going = true;
  if (aggregate_main(ao) != 0 || !report) return;
  ReportOptions ro;
  ro.store = store;
  ro.overwrite = overwrite;
  report_main(ro);
}

}  // namespace

std::string describe_exit(int status, int& exit_code, int& sig, bool& core) {
  exit_code = 0;
  sig = 0;
  core = false;
  if (WIFEXITED(status)) {
    exit_code = WEXITSTATUS(status);
    return "exited with " + std::to_string(exit_code);
  }
  if (WIFSIGNALED(status)) {
    sig = WTERMSIG(status);
    core = WCOREDUMP(status);
    const char* name = sigabbrev_np(sig);
    std::string how = "killed by SIG" + std::string(name ? name : std::to_string(sig).c_str());
    if (sig == SIGKILL) how += " (often the kernel's OOM killer, or the launcher stopping the job)";
    if (core) how += ", core dumped";
    return how;
  }
  return "ended (status " + std::to_string(status) + ")";
}

[[noreturn]] void end_by_signal(int sig) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);  // a signal whose default is not to end the process
}

int run_main(const RunOptions& o, int* ended_by) {
  const auto started_at = fs::file_time_type::clock::now();
  const EnvLookup env = process_env();
  const LaunchInfo launch = detect_launch(env);
  const int rank = launch.rank;
  if (o.command.empty()) {
    std::cerr << "memsnap run: no command given; usage: memsnap run [--config F] -- CMD ARGS...\n";
    return 2;
  }

  const std::string self = o.self.empty() ? "memsnap" : o.self;
  const auto started_wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  // The configuration, resolved once here so that every process of the rank agrees. A config
  // that does not load leaves the command unrecorded: nothing is written anywhere, and the
  // command's own recorder is told so (MEMSNAP_ENABLED=false below) instead of falling back to
  // the defaults. Every rank reads the same file, so rank 0 alone says it.
  bool record = true;
  Config config;
  fs::path run_dir, spill_dir;
  try {
    config = load_config(o.config, env);
    if (config.run_name.empty()) config.run_name = default_run_name(launch);
    NameVars vars{config.run_name, rank, launch.local_rank, launch.world_size, launch.local_world_size,
                  launch.node_rank, std::nullopt, timestamp_now()};
    run_dir = fs::absolute(format_name(config.folder, vars));
    spill_dir = run_dir / "spill";
    record = config.enabled;
  } catch (const std::exception& e) {
    if (rank == 0) {
      say(rank, std::string(e.what()) + "; the command runs unrecorded on every rank (nothing is written)");
    }
    record = false;
  }
  if (record) {
    std::error_code ec;
    fs::create_directories(spill_dir, ec);
    if (ec) {
      // The folder is per node where nodes do not share it: the first rank of each node says it.
      if (launch.local_rank == 0) say(rank, "cannot create " + spill_dir.string() + ": " + ec.message() + "; the command runs unrecorded");
      record = false;
    }
  }
  g_launch = launch_identity(launch, env);
  // overwrite: false and an earlier run in the folder: the command runs unrecorded and nothing of
  // the earlier run changes (no spill, exit record, lock or store is touched). Every rank decides
  // alike, from what was there before this launch began: the earlier run's store, exit records
  // or spills that another launch wrote.
  if (record && !config.overwrite) {
    EarlierRecord earlier;
    std::error_code ec;
    // A record made well before this process started is an earlier run's; a fresh one may be a
    // quick rank of this launch (where no launcher names the launch, or a spill's META is not
    // written yet).
    auto long_ago = [&](std::int64_t unix_ns) { return unix_ns < started_wall_ns - 2'000'000'000; };
    if (fs::exists(run_dir / "memsnap.h5", ec)) earlier = {run_dir / "memsnap.h5", file_time_text(run_dir / "memsnap.h5")};
    for (const auto& e : fs::directory_iterator(spill_dir, ec)) {
      if (!earlier.file.empty()) break;
      const std::string name = e.path().filename().string();
      if (name.ends_with(".exit.json")) {
        json j;
        if (!read_exit_record(e.path(), j) || !this_launch(j)) {
          earlier = {e.path(), file_time_text(e.path())};
        } else if (g_launch.empty()) {
          const auto written = fs::last_write_time(e.path(), ec);
          if (!ec && written < started_at - std::chrono::seconds(2)) earlier = {e.path(), file_time_text(e.path())};
        }
      } else if (e.path().extension() == kSpillSuffix) {
        // A record with no exit record beside it: the command ran a recorder of its own, or
        // `memsnap run` did not write one (the job was killed). Its META names its launch.
        const std::optional<RankMeta> meta = read_spill_meta(e.path());
        if (meta && (g_launch.empty() ? long_ago(meta->start_unix_ns) : meta->launch != g_launch)) {
          earlier = {e.path(), launch_time_text(meta->start_unix_ns)};
        } else if (!meta && long_ago(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::file_clock::to_sys(fs::last_write_time(e.path(), ec)).time_since_epoch())
                                          .count())) {
          earlier = {e.path(), file_time_text(e.path())};
        }
      }
    }
    if (!earlier.file.empty()) {
      if (rank == 0)
        say(rank, run_dir.string() + " holds the record of an earlier launch (" + earlier.file.filename().string() + ", made " +
                      earlier.made + "); overwrite is false, so this run is not recorded and nothing there changes. "
                      "To record this run: another folder or run_name, or overwrite: true. To see the earlier record on purpose: " +
                      look_at_earlier(run_dir, self));
      record = false;
      g_refused = true;
    }
  }

  // The child's environment: our resolved settings, and the CUPTI injection when it was built.
  // Unrecorded, it gets MEMSNAP_ENABLED=false: a recorder the command loads itself (memsnap_init,
  // the CUPTI library, the PyTorch hook) stays off, quietly, whatever config it would find.
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("MEMSNAP_LAUNCH=", 0) == 0 || (!record && kv.rfind("MEMSNAP_ENABLED=", 0) == 0)) continue;
    if (record && (kv.rfind("MEMSNAP_FOLDER=", 0) == 0 || kv.rfind("MEMSNAP_RUN_NAME=", 0) == 0 ||
                   kv.rfind("MEMSNAP_CONFIG=", 0) == 0)) {
      continue;
    }
    env_text.push_back(kv);
  }
  if (!record) env_text.push_back("MEMSNAP_ENABLED=false");
  if (record) {
    env_text.push_back("MEMSNAP_FOLDER=" + run_dir.string());
    env_text.push_back("MEMSNAP_RUN_NAME=" + config.run_name);
    if (!g_launch.empty()) env_text.push_back("MEMSNAP_LAUNCH=" + g_launch);  // in each spill's META
    if (!o.config.empty()) env_text.push_back("MEMSNAP_CONFIG=" + fs::absolute(o.config).string());
    const fs::path cupti = o.cupti ? cupti_library(o.self) : fs::path();
    if (!cupti.empty()) {
      if (!env("CUDA_INJECTION64_PATH")) env_text.push_back("CUDA_INJECTION64_PATH=" + cupti.string());
      if (!env("NVTX_INJECTION64_PATH")) env_text.push_back("NVTX_INJECTION64_PATH=" + cupti.string());
    }
    // Python jobs: the startup hook attaches to PyTorch's allocator once the job imports torch
    // (lib/torch/python/sitecustomize.py); other programs never look at PYTHONPATH.
    const fs::path hook = o.torch && config.torch_attachment ? python_hook_folder(o.self) : fs::path();
    if (!hook.empty()) {
      auto old = std::find_if(env_text.begin(), env_text.end(), [](const std::string& kv) { return kv.rfind("PYTHONPATH=", 0) == 0; });
      if (old == env_text.end()) {
        env_text.push_back("PYTHONPATH=" + hook.string());
      } else {
        const std::string rest = old->substr(11);
        *old = "PYTHONPATH=" + hook.string() + (rest.empty() ? "" : ":" + rest);
      }
    }
  }
  std::vector<char*> envp, argv;
  for (auto& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const auto started = std::chrono::steady_clock::now();
  const ChildSignals signals;
  const pid_t child = fork();
  if (child == 0) {
    signals.restore_in_child();
    execvpe(argv[0], argv.data(), envp.data());
    const std::string msg = "memsnap run: cannot run " + o.command[0] + ": " + std::strerror(errno) + "\n";
    ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
    (void)ignored;
    _exit(127);
  }
  if (child < 0) {
    const int fork_errno = errno;
    signals.resume();
    std::cerr << "memsnap run: cannot start " << o.command[0] << ": " << std::strerror(fork_errno) << "\n";
    return 127;
  }
  const int status = signals.wait_passing_on(child);
  ExitRecord ex;
  ex.rank = rank;
  ex.pid = child;
  ex.how = describe_exit(status, ex.exit_code, ex.signal, ex.core_dumped);
  ex.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& a : o.command) ex.command += (ex.command.empty() ? "" : " ") + a;
  const int code = ex.signal ? 128 + ex.signal : ex.exit_code;
  if (ended_by != nullptr) *ended_by = ex.signal;
  if (ex.exit_code != 0 || ex.signal != 0) say(rank, o.command[0] + " " + ex.how);
  if (!record) {
    signals.resume();
    return code;
  }

  ex.used_mpi = child_used_mpi(spill_dir, rank, child);
  {
    const json j = {{"rank", ex.rank}, {"pid", ex.pid}, {"launch", g_launch}, {"exit_code", ex.exit_code}, {"signal", ex.signal},
                    {"core_dumped", ex.core_dumped}, {"how", ex.how}, {"used_mpi", ex.used_mpi},
                    {"seconds", ex.seconds}, {"command", ex.command}, {"launcher", launch.launcher}};
    const fs::path p = exit_record_path(spill_dir, rank);
    const fs::path tmp = p.string() + ".tmp";
    std::ofstream(tmp) << j.dump(2) << "\n";
    std::error_code ec;
    fs::rename(tmp, p, ec);
  }
  signals.resume();  // how the command ended is on disk: a signal may end memsnap from here on

  const fs::path store = run_dir / "memsnap.h5";
  // The records in the folder by launch: a store is made of this launch's only. Where the folder
  // also holds another launch's (overwrite: true replaces each rank's own record, not those of
  // ranks an earlier, larger launch had), the follow-up names this launch.
  auto launches_here = [&] { return spill_launches(find_spills(run_dir)); };
  auto follow_up_for = [&](const std::vector<SpillLaunch>& launches, bool under_mpirun = true) {
    const bool others = std::any_of(launches.begin(), launches.end(), [](const SpillLaunch& l) { return l.id != g_launch; });
    return (under_mpirun ? "mpirun -np " + std::to_string(launch.world_size) + " " : std::string()) + self + " aggregate " + run_dir.string() +
           (others && !g_launch.empty() ? " --launch " + g_launch : "") + " && " + self + " report " + store.string();
  };
  // Once every rank is done: when this launch recorded nothing (each command refused or never
  // loaded memsnap), nothing is gathered, and a record of another launch is never shown as this
  // run. Rank 0 says it. Every rank decides alike, from the same finished folder.
  auto recorded_nothing = [&](const std::vector<SpillLaunch>& launches) {
    if (g_launch.empty()) return false;  // no name to tell launches apart: the newest is gathered
    for (const auto& l : launches) {
      if (l.id == g_launch) return false;
    }
    if (rank != 0) return true;
    const SpillLaunch* newest = nullptr;
    for (const auto& l : launches) newest = &l;
    if (newest == nullptr) {
      say(rank, "this run left no record in " + run_dir.string() +
                    " (the command did not load memsnap, or memsnap said why above); nothing to gather");
    } else {
      say(rank, "this run left no record (memsnap said why above); " + run_dir.string() +
                    " holds the record of an earlier launch (" + (newest->id.empty() ? std::string(kUnnamedLaunch) : newest->id) +
                    ", made " + launch_time_text(newest->start_unix_ns) +
                    "), which is not this run and is not gathered. To record this run: another folder or run_name, or "
                    "overwrite: true. To see the earlier record on purpose: " + look_at_earlier(run_dir, self));
    }
    return true;
  };
  const bool mpi_launcher = launch.launcher == "openmpi" || launch.launcher == "pmix" || launch.launcher == "slurm";
  if (o.no_aggregate) {
    if (rank == 0) say(rank, "recorded in " + spill_dir.string() + "; to see it: " + follow_up_for(launches_here()));
    return code;
  }

  if (!mpi_launcher) {
    // torchrun or no launcher: no MPI between the ranks. Rank 0 may gather the record alone.
    if (rank != 0) return code;
    if (!o.aggregate_when_done && launch.world_size > 1) {
      say(rank, "recorded in " + spill_dir.string() + "; when every rank is done: " +
                    follow_up_for(launches_here(), false));
      return code;
    }
    const auto missing = wait_for_ranks(spill_dir, launch.world_size, o.wait_seconds, rank, true);
    if (recorded_nothing(launches_here())) return code;
    if (!missing.empty()) say(rank, std::to_string(missing.size()) + " rank(s) did not finish in time; they are marked in the store");
    gather_and_report(run_dir, store, config.overwrite, o.report, rank, "");
    return code;
  }

  // mpirun / srun: all ranks decide alike from the same shared facts: aggregate here only when
  // every rank has finished and no child initialised MPI (a second MPI_Init in a slot fails).
  const auto missing = wait_for_ranks(spill_dir, launch.world_size, std::min(o.wait_seconds, 120.0), rank, rank == 0);
  const std::vector<SpillLaunch> launches = launches_here();
  if (missing.empty() && recorded_nothing(launches)) return code;
  const std::string follow_up = follow_up_for(launches);
  // A child that was killed left no verdict; the ranks run one program, so the ranks that did
  // speak decide for it: any "yes" forbids the second MPI_Init, and at least one "no" is needed.
  bool in_slot = missing.empty();
  std::string why;
  if (!missing.empty()) why = std::to_string(missing.size()) + " rank(s) did not finish";
  int said_no = 0;
  for (int r = 0; r < launch.world_size && in_slot; ++r) {
    json j;
    read_exit_record(exit_record_path(spill_dir, r), j);
    const std::string used = j.value("used_mpi", "unknown");
    if (used == "yes") {
      in_slot = false;
      why = "the command initialised MPI itself";
    }
    said_no += used == "no";
  }
  if (in_slot && said_no == 0) {
    in_slot = false;
    why = "no rank left a clean record";
  }
  if (!in_slot) {
    if (rank == 0) say(rank, "recorded in " + spill_dir.string() + " (" + why + "); to see it: " + follow_up);
    return code;
  }
  gather_and_report(run_dir, store, config.overwrite, o.report, rank, "; to see the record: " + follow_up);
  return code;
}

}  // namespace memsnap
