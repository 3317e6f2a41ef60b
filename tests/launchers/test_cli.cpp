// The memsnap command as a user runs it: real mpirun, real HDF5, real Chromium.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "memsnap/spill.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

using Result = test::ShellResult;

Result sh(const std::string& cmd) {
  return test::run_shell(cmd, "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
}

// MEMSNAP_TEST_CLI runs the tests against another memsnap binary (e.g. one built before a change).
const std::string kMemsnap = std::getenv("MEMSNAP_TEST_CLI") != nullptr ? std::getenv("MEMSNAP_TEST_CLI") : MEMSNAP_CLI;
const std::string kSim = MEMSNAP_FSDP_SIM;
const std::string kMpirun = std::string(MEMSNAP_MPIRUN) + " --oversubscribe";

json read_json(const std::filesystem::path& p) { return json::parse(test::read_file(p)); }

std::vector<std::pair<std::string, int>> findings_of(const json& summary) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& f : summary["findings"]) out.emplace_back(f["kind"], f["rank"]);
  std::sort(out.begin(), out.end());
  return out;
}

// Starts `args` with SIGINT, SIGTERM and SIGHUP at their defaults, as a terminal's foreground job
// has them (a shell ignores SIGINT in the jobs it starts in the background), `env` added to the
// environment, output to `log`. Those in `as_they_are` keep this process's disposition.
pid_t spawn_as_foreground(const std::vector<std::string>& args, const std::vector<std::string>& env, const fs::path& log,
                          const std::vector<int>& as_they_are = {}) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> all = env;
  for (char** e = environ; *e != nullptr; ++e) all.emplace_back(*e);
  all.emplace_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  all.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  for (auto& e : all) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t def;
  sigemptyset(&def);
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    if (std::find(as_they_are.begin(), as_they_are.end(), sig) == as_they_are.end()) sigaddset(&def, sig);
  posix_spawnattr_setsigdefault(&attr, &def);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &files, &attr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  return pid;
}

bool wait_until(const std::function<bool()>& done) {
  for (int i = 0; i < 1500; ++i) {  // 30 s
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The environment that makes memsnap signal itself (tests/launchers/signal_at.c, preloaded): signal
// `sig` right after its `count`th `call` ("rename" or "mkdir") of a path that contains `path`.
// ASan is told that the preload comes first on purpose. The last entry is the LD_PRELOAD: under
// mpirun, pass it to the ranks with -x instead.
std::vector<std::string> signal_at_env(const std::string& call, const std::string& path, int count = 1, int sig = SIGTERM) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  return {std::string("ASAN_OPTIONS=") + (asan != nullptr ? asan : "") + ":verify_asan_link_order=0",
          "MEMSNAP_TEST_SIGNAL_ON=" + call,
          "MEMSNAP_TEST_SIGNAL_PATH=" + path,
          "MEMSNAP_TEST_SIGNAL_COUNT=" + std::to_string(count),
          "MEMSNAP_TEST_SIGNAL=" + std::to_string(sig),
          std::string("LD_PRELOAD=") + MEMSNAP_SIGNAL_AT};
}

// The whole pipeline under mpirun: record, gather in the same slots, report, names the planted ranks.
TEST(Cli, RunUnderMpirunRecordsGathersAndNamesThePlantedRanks) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "run_name: t\nfolder: " + (dir / "run").string() + "\nrepeat: 1\nstacks: native\n");
  const auto r = sh(kMpirun + " -np 4 " + kMemsnap + " run --config " + (dir / "m.yaml").string() + " -- " + kSim +
                    " --step-us 0 --batches 8 --layers 4 --hidden 512 --unsharded-rank 1 --leak-rank 2 --leak-mib 16 --spike 3:6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("index.html"), std::string::npos) << r.out;
  ASSERT_TRUE(std::filesystem::exists(dir / "run/memsnap.h5")) << r.out;
  const json summary = read_json(dir / "run/report/summary.json");
  EXPECT_EQ(summary["format_version"], 1);
  const std::vector<std::pair<std::string, int>> expected = {{"leak", 2}, {"shard_imbalance", 1}, {"spike", 3}};
  EXPECT_EQ(findings_of(summary), expected) << summary["findings"].dump(2);
  for (const auto& f : summary["findings"]) {
    if (f["kind"] == "leak") {
      EXPECT_EQ(f["bytes"], 16u << 20) << "per batch";
    }
    if (f["kind"] == "shard_imbalance") {
      EXPECT_EQ(f["bytes"], 12ull * 512 * 512 * 2 * 3 / 4) << "3/4 of layer 0";
    }
    if (f["kind"] == "spike") {
      EXPECT_EQ(f["batch"], 6);
    }
    EXPECT_TRUE(f["site"].is_string()) << f.dump();
  }
  for (int rank = 0; rank < 4; ++rank) {
    const json exit = read_json(dir / ("run/spill/rank" + std::to_string(rank) + ".exit.json"));
    EXPECT_EQ(exit["exit_code"], 0);
    EXPECT_EQ(exit["used_mpi"], "no");
    EXPECT_TRUE(std::filesystem::exists(dir / ("run/report/rank" + std::to_string(rank) + ".4.pt.trace.memory_snapshot.html")));
  }
  // The same store through info --json: four ranks, two windows each.
  const auto info = sh(kMemsnap + " info --json " + (dir / "run/memsnap.h5").string());
  ASSERT_EQ(info.code, 0) << info.out;
  const json j = json::parse(info.out);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][2]["windows"].size(), 2u);
  EXPECT_EQ(j["ranks"][2]["windows"][0]["batch"], 4);

  // The real page in a real browser: it renders, and lists the three findings.
  const auto dom = sh("chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=10000 --dump-dom file://" +
                      (dir / "run/report/index.html").string());
  ASSERT_EQ(dom.code, 0) << "chromium is needed for this test (ci/setup.sh installs it): " << dom.out;
  EXPECT_NE(dom.out.find("data-ready=\"1\""), std::string::npos) << dom.out.substr(0, 2000);
  EXPECT_EQ(dom.out.find("data-error=\""), std::string::npos) << "a script error on the page";
  for (const char* text : {"leak", "shard imbalance", "spike"}) EXPECT_NE(dom.out.find(text), std::string::npos) << text;
}

// A second run into a folder that holds an earlier one, overwrite false: the job runs and ends
// (no rank waits for another in MPI_Init), and every file of the earlier run, lock files and exit
// records included, keeps its bytes and its modification time. With overwrite true it records anew.
TEST(Cli, ARefusedRunLeavesEveryFileOfTheEarlierRunAsItWas) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "folder: " + (dir / "run").string() + "\nrepeat: 1\n");
  const std::string cmd = "timeout 120 " + kMpirun + " -np 3 " + kMemsnap + " run --config " + (dir / "m.yaml").string() +
                          " -- " + kSim + " --step-us 0 --batches 6";
  auto r = sh(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  auto snapshot = [&] {
    std::map<std::string, std::pair<std::string, std::filesystem::file_time_type>> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir / "run")) {
      if (e.is_regular_file()) files[e.path().string()] = {test::read_file(e.path()), e.last_write_time()};
    }
    return files;
  };
  const auto before = snapshot();
  ASSERT_TRUE(before.count((dir / "run/spill/rank1.lock").string()));
  ASSERT_TRUE(before.count((dir / "run/spill/rank1.exit.json").string()));
  r = sh(cmd);
  ASSERT_EQ(r.code, 0) << "the refused run must still run the job and end: " << r.out;
  EXPECT_NE(r.out.find("overwrite is false"), std::string::npos) << r.out;
  const auto after = snapshot();
  ASSERT_EQ(after.size(), before.size()) << r.out;
  for (const auto& [path, content] : before) {
    ASSERT_TRUE(after.count(path)) << path;
    EXPECT_EQ(after.at(path).first, content.first) << path << " changed";
    EXPECT_EQ(after.at(path).second, content.second) << path << " was written";
  }
  // overwrite: true records the new run, after the earlier run's exit records (another launch).
  test::write_file(dir / "m.yaml", "folder: " + (dir / "run").string() + "\nrepeat: 1\noverwrite: true\n");
  r = sh(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("index.html"), std::string::npos) << r.out;
  EXPECT_NE(test::read_file(dir / "run/spill/rank1.lock"), before.at((dir / "run/spill/rank1.lock").string()).first);
}

// Exactly the README's demo: ci/demo.sh's command line and config.
TEST(Cli, TheDemoNamesLeakRank3UnshardedRank0AndSpikeOnRank2Batch3) {
  test::TempDir dir;
  const auto r = sh("MEMSNAP_FOLDER=" + (dir / "run").string() + " " + kMpirun + " -np 4 " + kMemsnap +
                    " run --config " + MEMSNAP_SOURCE_DIR "/launchers/examples/demo.yaml -- " + kSim +
                    " --leak-rank 3 --unsharded-rank 0 --spike 2:3");
  ASSERT_EQ(r.code, 0) << r.out;
  const json summary = read_json(dir / "run/report/summary.json");
  const std::vector<std::pair<std::string, int>> expected = {{"leak", 3}, {"shard_imbalance", 0}, {"spike", 2}};
  EXPECT_EQ(findings_of(summary), expected) << summary["findings"].dump(2);
  for (const auto& f : summary["findings"]) {
    if (f["kind"] == "spike") {
      EXPECT_EQ(f["batch"], 3);
    }
  }
  EXPECT_EQ(summary["imbalance"]["outlier_ranks"], json::array({2})) << "the spike makes rank 2's peak the outlier";
  // The rendered page shows the outlier and the causes; a screenshot stays as an artifact.
  const std::filesystem::path shot = std::filesystem::path(MEMSNAP_ARTIFACTS) / "demo_index.png";
  std::filesystem::create_directories(shot.parent_path());
  const auto dom = sh("chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1800 "
                      "--virtual-time-budget=10000 --screenshot=" + shot.string() + " file://" +
                      (dir / "run/report/index.html").string() + " && chromium --headless=new --no-sandbox --disable-gpu "
                      "--virtual-time-budget=10000 --dump-dom file://" + (dir / "run/report/index.html").string());
  ASSERT_EQ(dom.code, 0) << dom.out;
  EXPECT_TRUE(std::filesystem::exists(shot));
  EXPECT_NE(dom.out.find("data-ready=\"1\""), std::string::npos);
  EXPECT_EQ(dom.out.find("data-error=\""), std::string::npos);
  EXPECT_NE(dom.out.find("cache_batch_metrics"), std::string::npos) << "the leak's site is named";
  EXPECT_NE(dom.out.find("init_unsharded_module"), std::string::npos) << "the unsharded module is named";
}

// One rank's child dies with SIGKILL mid-window: the others' results are whole, the dead rank's
// record up to the kill is in the store and the report, and nothing hangs.
TEST(Cli, ARankKilledMidWindowIsReportedWithWhatItRecorded) {
  test::TempDir dir;
  // Batches written on the job's own thread: batch 5 is on disk when batch 6 kills the rank.
  test::write_file(dir / "m.yaml", "run_name: t\nfolder: " + (dir / "run").string() + "\nrepeat: 1\nbackground_writes: false\n");
  const auto r = sh(kMpirun + " -np 4 " + kMemsnap + " run --config " + (dir / "m.yaml").string() + " -- " + kSim +
                    " --step-us 0 --batches 8 --layers 2 --hidden 256 --kill 2:6");
  EXPECT_NE(r.code, 0) << "the job failed, as it did: " << r.out;
  const json exit = read_json(dir / "run/spill/rank2.exit.json");
  EXPECT_EQ(exit["signal"], 9);
  ASSERT_TRUE(std::filesystem::exists(dir / "run/report/summary.json")) << r.out;
  const json summary = read_json(dir / "run/report/summary.json");
  ASSERT_EQ(summary["ranks"].size(), 4u);
  for (int rank : {0, 1, 3}) {
    EXPECT_EQ(summary["ranks"][rank]["status"], "ok");
    EXPECT_EQ(summary["ranks"][rank]["windows"].size(), 2u);
  }
  const auto& dead = summary["ranks"][2];
  EXPECT_EQ(dead["status"], "truncated");
  ASSERT_EQ(dead["windows"].size(), 2u) << dead.dump();
  EXPECT_EQ(dead["windows"][0]["status"], "ok");
  EXPECT_EQ(dead["windows"][1]["status"], "truncated");
  EXPECT_GE(dead["windows"][1]["events"].get<int>(), 1) << "batch 5 was flushed before the kill in batch 6";
  EXPECT_TRUE(std::filesystem::exists(dir / ("run/report/rank2." + std::to_string(dead["windows"][1]["batch"].get<int>()) +
                                             ".pt.trace.memory_snapshot.html")));
  bool named = false;
  for (const auto& f : summary["findings"]) {
    if (f["kind"] != "truncated" || f["rank"] != 2) continue;
    named = true;
    // "rank 2 killed by SIGKILL (...) in batch 6": how and when, not just that it stopped.
    EXPECT_NE(f["detail"].get<std::string>().find("SIGKILL"), std::string::npos) << f.dump();
    EXPECT_NE(f["detail"].get<std::string>().find("in batch 6"), std::string::npos) << f.dump();
  }
  EXPECT_TRUE(named) << summary["findings"].dump(2);
}

// Nodes whose clocks differ by an hour: the record lines up by batch, the findings are the same.
TEST(Cli, ClocksThatDifferBetweenNodesStillLineUpByBatch) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "run_name: t\nfolder: " + (dir / "run").string() + "\n");
  auto r = sh(kMpirun + " -np 3 " + kMemsnap + " run --no-aggregate --config " + (dir / "m.yaml").string() + " -- " + kSim +
              " --step-us 0 --batches 5 --layers 2 --hidden 256 --leak-rank 2");
  ASSERT_EQ(r.code, 0) << r.out;
  // Rank 1 as if its node's clock ran an hour ahead.
  const std::int64_t hour = 3600'000'000'000;
  for (const auto& p : find_spills(dir / "run")) {
    RankRecord rec = read_spill(p);
    if (rec.meta.rank != 1) continue;
    for (auto& w : rec.windows) {
      w.open_time_ns += hour;
      w.close_time_ns += hour;
      for (auto& e : w.events) e.time_ns += hour;
      for (auto& b : w.batches) b.time_ns += hour;
      for (auto& a : w.live_at_start) a.time_ns += hour;
    }
    std::filesystem::remove(p);
    std::string error;
    ASSERT_TRUE(write_spill(rec, p, error)) << error;
  }
  r = sh(kMemsnap + " aggregate " + (dir / "run").string() + " && " + kMemsnap + " report " + (dir / "run/memsnap.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const json summary = read_json(dir / "run/report/summary.json");
  const std::vector<std::pair<std::string, int>> expected = {{"leak", 2}};
  EXPECT_EQ(findings_of(summary), expected) << summary["findings"].dump(2);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(summary["ranks"][rank]["windows"][0]["batch_start"], 2);
    EXPECT_EQ(summary["ranks"][rank]["windows"][0]["batch"], 4);
  }
  EXPECT_EQ(summary["ranks"][1]["windows"][0]["peak_allocated"], summary["ranks"][0]["windows"][0]["peak_allocated"]);
}

TEST(Cli, RunReturnsTheChildsExitCodeAndRecordsHowItEnded) {
  test::TempDir dir;
  const std::string env = "MEMSNAP_FOLDER=" + (dir / "run").string() + " ";
  auto r = sh(env + kMemsnap + " run --no-aggregate -- sh -c 'exit 7'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_EQ(read_json(dir / "run/spill/rank0.exit.json")["exit_code"], 7);
  // A second run into that folder would be refused (overwrite false): another folder.
  r = sh("MEMSNAP_FOLDER=" + (dir / "run2").string() + " " + kMemsnap + " run --no-aggregate -- sh -c 'kill -9 $$'");
  EXPECT_EQ(r.code, 128 + 9) << r.out;
  const json exit = read_json(dir / "run2/spill/rank0.exit.json");
  EXPECT_EQ(exit["signal"], 9);
  EXPECT_NE(exit["how"].get<std::string>().find("SIGKILL"), std::string::npos);
  // Started with SIGCHLD ignored (by a parent that set it so: the kernel then reaps the command
  // unseen), memsnap still sees how the command ended.
  r = sh("MEMSNAP_FOLDER=" + (dir / "run-chld").string() + " env --ignore-signal=CHLD " + kMemsnap +
         " run --no-aggregate -- sh -c 'sleep 0.1; exit 7'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_EQ(read_json(dir / "run-chld/spill/rank0.exit.json")["exit_code"], 7);
  r = sh(env + kMemsnap + " run -- /nonexistent/train");
  EXPECT_EQ(r.code, 127) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/train"), std::string::npos);
  // Ended by a signal, memsnap run ends by it too, as a shell or mpirun would see the command end
  // (a shell's $? alone reads 128 + N either way): here SIGINT, and SIGSEGV without a core file.
  for (int sig : {SIGINT, SIGSEGV}) {
    SCOPED_TRACE(strsignal(sig));
    const pid_t pid = spawn_as_foreground(
        {kMemsnap, "run", "--no-aggregate", "--", "/bin/sh", "-c", "kill -" + std::to_string(sig) + " $$"},
        {"MEMSNAP_FOLDER=" + (dir / ("run-" + std::to_string(sig))).string()}, dir / "log");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status << ": " << test::read_file(dir / "log");
    EXPECT_FALSE(WIFSIGNALED(status) && WCOREDUMP(status));
    EXPECT_EQ(read_json(dir / ("run-" + std::to_string(sig)) / "spill/rank0.exit.json")["signal"], sig);
  }
}

TEST(Cli, BadConfigRunsTheJobUnrecordedWithOneLine) {
  test::TempDir dir;
  test::write_file(dir / "bad.yaml", "interval: often\n");
  const auto r = sh("MEMSNAP_FOLDER=" + (dir / "run").string() + " " + kMemsnap + " run --config " +
                    (dir / "bad.yaml").string() + " -- sh -c 'echo trained; exit 0'");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("trained"), std::string::npos);
  EXPECT_NE(r.out.find("'interval'"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << "the job's line and memsnap's one line: " << r.out;
}

TEST(Cli, TorchrunStyleRanksGatherWhenDone) {
  // Two ranks as torchrun starts them: no MPI, RANK/WORLD_SIZE in the environment.
  test::TempDir dir;
  const std::string common = "MEMSNAP_FOLDER=" + (dir / "run").string() + " MEMSNAP_RUN_NAME=tr WORLD_SIZE=2 ";
  const std::string cmd = " " + kMemsnap + " run --aggregate-when-done --wait 60 -- " + kSim + " --step-us 0 --batches 5 --layers 2 --hidden 256";
  const auto r = sh("(" + common + "RANK=1 LOCAL_RANK=1" + cmd + " & " + common + "RANK=0 LOCAL_RANK=0" + cmd + "; wait)");
  EXPECT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(std::filesystem::exists(dir / "run/report/summary.json")) << r.out;
  const json summary = read_json(dir / "run/report/summary.json");
  EXPECT_EQ(summary["ranks"].size(), 2u);
  EXPECT_TRUE(summary["findings"].empty()) << "identical ranks have no findings: " << summary["findings"].dump();
}

TEST(Cli, CommandsRunAtOnceWithoutMpirunDoNotCollide) {
  // Each memsnap command that no launcher started is an MPI singleton. Open MPI keeps every
  // isolated singleton's session files in one folder, so commands run at once raced on it and
  // some failed in MPI_Init (10 of 320 here); each now has a folder of its own in TMPDIR, and
  // leaves nothing there.
  test::TempDir dir;
  std::filesystem::create_directories(dir / "tmp");
  const std::string pickle = std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_native.pickle";
  std::string loops;
  for (int k = 0; k < 6; ++k) {
    const std::string store = (dir / ("s" + std::to_string(k) + ".h5")).string();
    loops += "(for i in 1 2 3 4 5 6 7 8; do TMPDIR=" + (dir / "tmp").string() + " " + kMemsnap + " import " + pickle +
             " --rank 0 --batch 1 --overwrite -o " + store + " >/dev/null 2>&1 || echo failed; done) & ";
  }
  const auto r = sh("(" + loops + "wait)");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("failed"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir / "tmp")) << "left in TMPDIR: " << std::filesystem::directory_iterator(dir / "tmp")->path();
}

TEST(Cli, ReportGatesOnImbalanceAndNeverClobbers) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "run_name: t\nfolder: " + (dir / "run").string() + "\n");
  auto r = sh(kMpirun + " -np 2 " + kMemsnap + " run --no-aggregate --config " + (dir / "m.yaml").string() + " -- " + kSim +
              " --step-us 0 --batches 5 --layers 2 --hidden 256 --leak-rank 1 --leak-mib 256");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " aggregate " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string store = (dir / "run/memsnap.h5").string();
  r = sh(kMemsnap + " report " + store + " --fail-on-imbalance 0.01");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("--fail-on-imbalance"), std::string::npos);
  const std::string before = test::read_file(dir / "run/report/index.html");
  r = sh(kMemsnap + " report " + store);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(dir / "run/report/index.html"), before);
  r = sh(kMemsnap + " report " + store + " --overwrite --fail-on-imbalance 10");
  EXPECT_EQ(r.code, 0) << r.out;
  // Under mpirun the ranks share the pages; the result is the same report.
  r = sh(kMpirun + " -np 2 " + kMemsnap + " report " + store + " -o " + (dir / "r2").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_json(dir / "r2/summary.json")["findings"], read_json(dir / "run/report/summary.json")["findings"]);
  EXPECT_TRUE(std::filesystem::exists(dir / "r2/rank1.4.pt.trace.memory_snapshot.html"));
}

TEST(Cli, ImportReportAndExportPyTorchSnapshots) {
  test::TempDir dir;
  const std::string data = MEMSNAP_TEST_DATA;
  std::filesystem::copy_file(data + "/torch-2.11/snap_native.pickle", dir / "rank0.5.pt.trace.memory_snapshot.pickle");
  std::filesystem::copy_file(data + "/torch-2.11/snap_exp.pickle", dir / "rank1.5.pt.trace.memory_snapshot.pickle");
  std::filesystem::copy_file(data + "/torch-2.11/snap_oom.pickle", dir / "rank2.5.pt.trace.memory_snapshot.pickle");
  const std::string store = (dir / "t.h5").string();
  auto r = sh(kMemsnap + " import " + (dir / "rank0.5.pt.trace.memory_snapshot.pickle").string() + " " +
              (dir / "rank1.5.pt.trace.memory_snapshot.pickle").string() + " " +
              (dir / "rank2.5.pt.trace.memory_snapshot.pickle").string() + " -o " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " report " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  const json summary = read_json(dir / "report/summary.json");
  bool oom = false;
  for (const auto& f : summary["findings"]) oom |= f["kind"] == "oom" && f["rank"] == 2;
  EXPECT_TRUE(oom) << summary["findings"].dump();
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 --format torch -o " + (dir / "back.pickle").string());
  ASSERT_EQ(r.code, 0) << r.out;
  // Python's own pickle reads it back with the same segments and trace length as the original.
  r = sh("python3 -c \"import pickle,sys; a=pickle.load(open(sys.argv[1],'rb')); b=pickle.load(open(sys.argv[2],'rb')); "
         "print(len(a['segments'])==len(b['segments']) and sum(map(len,a['device_traces']))==sum(map(len,b['device_traces'])))\" " +
         (dir / "back.pickle").string() + " " + data + "/torch-2.11/snap_native.pickle");
  EXPECT_EQ(r.out, "True\n");
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 --format torch -o " + (dir / "back.pickle").string());
  EXPECT_EQ(r.code, 1) << "an existing file is not replaced";
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 99 -o " + (dir / "x.pickle").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("has: 5"), std::string::npos) << r.out;
}

// Python's pickle reads `exported` as the same values as `original` (tests/torch/roundtrip_equal.py:
// key order aside, types included); the first difference otherwise.
std::string roundtrip_difference(const std::filesystem::path& original, const std::filesystem::path& exported) {
  const auto r = sh("python3 " MEMSNAP_SOURCE_DIR "/tests/torch/roundtrip_equal.py '" + original.string() + "' '" +
                    exported.string() + "'");
  return r.code == 0 && r.out == "OK\n" ? std::string() : r.out;
}

// memsnap import, the store, memsnap export --format torch: the pickle comes back, for torch
// 2.11's own snapshots and for hand-made ones with what those never show (tests/torch/make_snapshot.py).
TEST(Cli, ImportedSnapshotsExportBackEqual) {
  test::TempDir dir;
  std::vector<std::filesystem::path> originals;
  for (const char* name : {"snap_native", "snap_exp", "snap_oom"})
    originals.push_back(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/" + name + ".pickle");
  for (const char* kind : {"rich", "old"}) {
    originals.push_back(dir / (std::string(kind) + ".pickle"));
    const auto made = sh("python3 " MEMSNAP_SOURCE_DIR "/tests/torch/make_snapshot.py " + std::string(kind) + " " +
                         originals.back().string());
    ASSERT_EQ(made.code, 0) << made.out;
  }
  for (std::size_t i = 0; i < originals.size(); ++i) {
    SCOPED_TRACE(originals[i].string());
    const std::string store = (dir / ("s" + std::to_string(i) + ".h5")).string();
    auto r = sh(kMemsnap + " import --rank 0 --batch 5 " + originals[i].string() + " -o " + store);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto back = dir / ("back" + std::to_string(i) + ".pickle");
    r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 --format torch -o " + back.string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(roundtrip_difference(originals[i], back), "");
  }
}

// Two pickles of one rank become one record: the second's stack ids move, and so must those its
// extras name (segment frames, unknown entries' frames).
TEST(Cli, TwoSnapshotsOfOneRankBothExportBack) {
  test::TempDir dir;
  std::filesystem::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", dir / "rank0.3.pickle");
  const auto made =
      sh("python3 " MEMSNAP_SOURCE_DIR "/tests/torch/make_snapshot.py rich " + (dir / "rank0.7.pickle").string());
  ASSERT_EQ(made.code, 0) << made.out;
  const std::string store = (dir / "t.h5").string();
  auto r = sh(kMemsnap + " import " + (dir / "rank0.3.pickle").string() + " " + (dir / "rank0.7.pickle").string() +
              " -o " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* batch : {"3", "7"}) {
    SCOPED_TRACE(batch);
    const auto back = dir / (std::string("back") + batch + ".pickle");
    r = sh(kMemsnap + " export " + store + " --rank 0 --batch " + batch + " --format torch -o " + back.string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(roundtrip_difference(dir / (std::string("rank0.") + batch + ".pickle"), back), "");
  }
  // And info says how each window's batches were found.
  r = sh(kMemsnap + " info --json " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  const json info = json::parse(r.out);  // kept: a range-for over a temporary's member dangles
  for (const auto& w : info["ranks"][0]["windows"]) {
    EXPECT_TRUE(w["batch_method"].is_string()) << w.dump();
    EXPECT_TRUE(w["batch_confidence"].is_number()) << w.dump();
  }
}

TEST(Cli, BadInputIsOneLineAndANonZeroExit) {
  test::TempDir dir;
  // A pickle that would import code.
  test::write_file(dir / "rank0.1.pickle", std::string("\x80\x04\x63os\nsystem\n", 12));
  auto r = sh(kMemsnap + " import " + (dir / "rank0.1.pickle").string() + " -o " + (dir / "s.h5").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("GLOBAL"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "s.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir / "s.h5.d"));
  // Unknown option, missing argument, not a store.
  r = sh(kMemsnap + " report --bogus x");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = sh(kMemsnap + " info");
  EXPECT_EQ(r.code, 2);
  test::write_file(dir / "fake.h5", "not hdf5");
  r = sh(kMemsnap + " report " + (dir / "fake.h5").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("fake.h5"), std::string::npos) << r.out;
  r = sh(kMemsnap + " import " + (dir / "rank0.1.pickle").string() + " -o " + (dir / "s.h5").string() + " --template 'r{rank}'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("template"), std::string::npos) << r.out;
}

// --- what --overwrite may replace (issue #27) ----------------------------------------------------

// Every file and folder under `dir`, with each file's bytes: the user's data, to compare after.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  if (fs::is_regular_file(dir)) return {{"", test::read_file(dir)}};
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? test::read_file(e.path()) : std::string("<dir>");
  }
  return out;
}

// Names in `dir` that a memsnap command leaves behind only when it failed to clean up.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp-") != std::string::npos || n.find(".import-") != std::string::npos ||
        n.find(".partial") != std::string::npos) {
      out.push_back(n);
    }
  }
  return out;
}

// A folder of the user's own: files, a nested folder, an HDF5 file of another tool's.
void make_users_folder(const fs::path& dir) {
  fs::create_directories(dir / "sub");
  test::write_file(dir / "notes.txt", "my notes\n");
  test::write_file(dir / "sub/data.bin", std::string("\0\1\2binary", 9));
}

TEST(Cli, OverwriteNeverReplacesWhatMemsnapDidNotWrite) {
  test::TempDir dir;
  fs::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", dir / "rank0.5.pickle");
  const std::string pickle = (dir / "rank0.5.pickle").string();
  auto r = sh(kMemsnap + " import " + pickle + " -o " + (dir / "ok.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  // A recorded run for aggregate.
  r = sh("MEMSNAP_FOLDER=" + (dir / "run").string() + " " + kMemsnap + " run --no-aggregate -- " + kSim +
         " --step-us 0 --batches 5 --layers 2 --hidden 256");
  ASSERT_EQ(r.code, 0) << r.out;

  // What the user has under the names they pass to -o: a folder, a plain file, an HDF5 file that is
  // not a store (a memsnap rank file has no format attribute), a folder where a store's data folder
  // would go, and a file of theirs inside a memsnap store's data folder.
  make_users_folder(dir / "precious");
  test::write_file(dir / "notes.h5", "not a store\n");
  fs::copy_file(dir / "ok.h5.d/rank0.h5", dir / "other.h5");
  make_users_folder(dir / "fresh.h5.d");
  fs::copy_file(dir / "ok.h5", dir / "mixed.h5");
  fs::copy(dir / "ok.h5.d", dir / "mixed.h5.d");
  test::write_file(dir / "mixed.h5.d/mine.txt", "mine\n");
  const std::vector<std::pair<std::string, fs::path>> targets = {
      {"precious", dir / "precious"}, {"notes.h5", dir / "notes.h5"},       {"other.h5", dir / "other.h5"},
      {"fresh.h5", dir / "fresh.h5.d"}, {"mixed.h5", dir / "mixed.h5.d"}};
  for (const auto& [name, watched] : targets) {
    const fs::path out = dir / name;
    const auto before = tree(watched);
    const auto before_root = tree(out);
    ASSERT_FALSE(before.empty()) << name;
    for (const std::string& flag : {std::string(), std::string(" --overwrite")}) {
      SCOPED_TRACE(name + flag);
      std::vector<std::pair<std::string, std::string>> commands = {
          {"memsnap import", kMemsnap + " import " + pickle + " -o " + out.string() + flag},
          {"memsnap aggregate", kMemsnap + " aggregate " + (dir / "run").string() + " -o " + out.string() + flag}};
      if (name == "precious") {  // under mpirun too (once: it takes a while)
        commands.emplace_back("memsnap aggregate", kMpirun + " -np 2 " + kMemsnap + " aggregate " +
                                                       (dir / "run").string() + " -o " + out.string() + flag);
      }
      for (const auto& [verb, cmd] : commands) {
        r = sh(cmd);
        EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
        EXPECT_NE(r.out.find(verb + ": "), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("memsnap did not write"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("choose another -o"), std::string::npos) << r.out;
        EXPECT_EQ(r.out.find("--overwrite replaces"), std::string::npos) << "never suggested where refused: " << r.out;
        if (cmd.rfind(kMpirun, 0) != 0) {
          EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
        }
        EXPECT_EQ(tree(watched), before) << cmd;
        EXPECT_EQ(tree(out), before_root) << cmd;
        EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>()) << cmd;
      }
    }
  }

  // export: onto a folder, the user's own file (the pickle imported), another file.
  for (const fs::path& out : {dir / "precious", fs::path(pickle), dir / "notes.h5"}) {
    const auto before = tree(out);
    for (const std::string& flag : {std::string(), std::string(" --overwrite")}) {
      for (const char* format : {"torch", "chrome"}) {
        SCOPED_TRACE(out.string() + flag + " " + format);
        r = sh(kMemsnap + " export " + (dir / "ok.h5").string() + " --rank 0 --batch 5 --format " + format + " -o " +
               out.string() + flag);
        EXPECT_EQ(r.code, 1) << r.out;
        EXPECT_NE(r.out.find("memsnap export: " + out.string() + " is a"), std::string::npos) << r.out;
        EXPECT_NE(r.out.find("choose another -o"), std::string::npos) << r.out;
        EXPECT_EQ(r.out.find("filesystem error"), std::string::npos) << r.out;
        EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
        EXPECT_EQ(tree(out), before);
        EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>());
      }
    }
  }
}

TEST(Cli, OverwriteReplacesWhatMemsnapWrote) {
  test::TempDir dir;
  const std::string data = MEMSNAP_TEST_DATA;
  fs::copy_file(data + "/torch-2.11/snap_oom.pickle", dir / "rank0.5.pickle");
  fs::copy_file(data + "/torch-2.11/snap_exp.pickle", dir / "rank1.5.pickle");
  const std::string store = (dir / "s.h5").string();
  auto r = sh(kMemsnap + " import " + (dir / "rank0.5.pickle").string() + " -o " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto first = tree(dir / "s.h5.d");

  // Without --overwrite: refused, saying what --overwrite would replace.
  const std::string both = (dir / "rank0.5.pickle").string() + " " + (dir / "rank1.5.pickle").string();
  r = sh(kMemsnap + " import " + both + " -o " + store);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--overwrite replaces it and its data folder s.h5.d"), std::string::npos) << r.out;
  EXPECT_EQ(tree(dir / "s.h5.d"), first);

  // With it: replaced, by import and by aggregate (under mpirun too).
  r = sh(kMemsnap + " import " + both + " -o " + store + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "s.h5.d/rank1.h5"));
  r = sh("MEMSNAP_FOLDER=" + (dir / "run").string() + " " + kMemsnap + " run --no-aggregate -- " + kSim +
         " --step-us 0 --batches 5 --layers 2 --hidden 256");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMpirun + " -np 2 " + kMemsnap + " aggregate " + (dir / "run").string() + " -o " + store + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir / "s.h5.d/rank1.h5")) << "the one-rank run's store replaced the two-rank one";
  r = sh(kMemsnap + " info --json " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["ranks"].size(), 1u);

  // An export memsnap wrote is replaced with --overwrite, whatever its format, and only then.
  const std::string out = (dir / "w.pickle").string();
  r = sh(kMemsnap + " import " + (dir / "rank0.5.pickle").string() + " -o " + store + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string torch_bytes = test::read_file(out);
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 --format chrome -o " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--overwrite replaces it"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(out), torch_bytes);
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 --format chrome -o " + out + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json::parse(test::read_file(out))["otherData"]["producer"], "memsnap export");
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 -o " + out + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::read_file(out), torch_bytes);
  EXPECT_EQ(roundtrip_difference(dir / "rank0.5.pickle", out), "") << "the mark after STOP is invisible to pickle.load";
  EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>());
}

// A write that fails midway (an unreadable pickle, an aggregator rank that fails after the
// conversion) leaves the earlier store as it was, byte for byte, and nothing else behind.
TEST(Cli, AFailedImportLeavesTheEarlierStoreAndNothingElse) {
  test::TempDir dir;
  fs::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", dir / "rank0.5.pickle");
  test::write_file(dir / "rank1.5.pickle", std::string("\x80\x04h\x4e.", 5));  // BINGET of nothing
  const std::string store = (dir / "s.h5").string();
  auto r = sh(kMemsnap + " import " + (dir / "rank0.5.pickle").string() + " -o " + store);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto root = tree(dir / "s.h5"), data = tree(dir / "s.h5.d");
  const std::string good = (dir / "rank0.5.pickle").string(), bad = (dir / "rank1.5.pickle").string();
  for (const std::string& cmd : {
           kMemsnap + " import " + good + " " + bad + " -o " + store + " --overwrite",
           kMpirun + " -np 2 " + kMemsnap + " import " + good + " " + bad + " -o " + store + " --overwrite",
           kMemsnap + " import " + bad + " -o " + store + " --overwrite --keep-going",
           "MEMSNAP_AGGREGATE_TEST_FAULT=0 " + kMemsnap + " import " + good + " -o " + store + " --overwrite",
           kMpirun + " -np 2 -x MEMSNAP_AGGREGATE_TEST_FAULT=1 " + kMemsnap + " import " + good + " " + bad +
               " -o " + store + " --overwrite --keep-going"}) {
    SCOPED_TRACE(cmd);
    r = sh(cmd);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(tree(dir / "s.h5"), root);
    EXPECT_EQ(tree(dir / "s.h5.d"), data);
    EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>());
    EXPECT_EQ(r.out.find(".import-"), std::string::npos) << "no internal folder in the messages: " << r.out;
    EXPECT_EQ(r.out.find(".tmp-"), std::string::npos) << r.out;
  }
  // A failed export (a window the store does not have) leaves the earlier export too.
  const std::string out = (dir / "w.pickle").string();
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string before = test::read_file(out);
  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 6 -o " + out + " --overwrite");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("s.h5: rank 0 has no window ending at batch 6"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(out), before);
  EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>());
  // An export that fails while it streams (the disk fills: here a file size limit of 1 KiB, with
  // SIGXFSZ ignored so that the write itself fails) leaves the earlier export, or nothing.
  ASSERT_GT(before.size(), 2048u) << "the window must be larger than the limit";
  for (const std::string format : {"torch", "chrome"}) {
    SCOPED_TRACE(format);
    const std::string limited = "trap '' XFSZ; ulimit -f 1; ";
    r = sh(limited + kMemsnap + " export " + store + " --rank 0 --batch 5 --format " + format + " -o " + out +
           " --overwrite");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("the earlier file is unchanged"), std::string::npos) << r.out;
    EXPECT_EQ(test::read_file(out), before);
    const std::string fresh = (dir / ("fresh-" + format + ".out")).string();
    r = sh(limited + kMemsnap + " export " + store + " --rank 0 --batch 5 --format " + format + " -o " + fresh);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("nothing was written"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(fresh));
    EXPECT_EQ(leftovers(dir.path()), std::vector<std::string>());
  }
}


// Ctrl-C, mpirun's SIGTERM or a closed terminal while an import works (here: waits on its input,
// a pipe nobody writes): the command ends by that signal, as before, and leaves none of its
// temporaries, neither its working folder beside the store nor Open MPI's session folder. The
// same for `memsnap view`, whose folder then takes the next view.
TEST(Cli, AnInterruptedImportLeavesNothingBehind) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    for (const std::string verb : {"import", "view"}) {
      SCOPED_TRACE(verb);
      test::TempDir dir;
      const fs::path tmp = dir / "tmp", fifo = dir / "rank0.1.pickle";
      fs::create_directories(tmp);
      ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
      const fs::path out = verb == "import" ? dir / "s.h5" : dir / "v";
      const fs::path work_in = verb == "import" ? dir.path() : out;
      const pid_t pid = spawn_as_foreground({kMemsnap, verb, fifo.string(), "-o", out.string()}, {"TMPDIR=" + tmp.string()},
                                            dir / "log");
      ASSERT_GT(pid, 0);
      const bool working = wait_until([&] {
        return fs::is_directory(work_in) && !leftovers(work_in).empty() && !fs::is_empty(tmp);
      });
      EXPECT_TRUE(working) << "no working folder or MPI session folder appeared: " << test::read_file(dir / "log");
      ::kill(pid, sig);
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status << ": " << test::read_file(dir / "log");
      if (fs::exists(work_in)) {
        EXPECT_EQ(leftovers(work_in), std::vector<std::string>());
      }
      EXPECT_TRUE(fs::is_empty(tmp)) << fs::directory_iterator(tmp)->path();
      EXPECT_FALSE(fs::exists(dir / "s.h5"));
      EXPECT_FALSE(fs::exists(out / "memsnap.h5"));
      if (verb == "view") {
        fs::remove(fifo);
        fs::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", fifo);
        const Result r = sh(kMemsnap + " view " + fifo.string() + " -o " + out.string());
        EXPECT_EQ(r.code, 0) << r.out;
      }
    }
  }
}

// A working folder that outlived its process (killed outright: SIGKILL, a lost node) is named
// for what it is, in `memsnap view`'s refusal, with what to do; it is not removed.
TEST(Cli, ViewNamesTheWorkingFolderOfAKilledCommand) {
  test::TempDir dir;
  const fs::path pickle = dir / "snap.pickle", view = dir / "v";
  fs::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", pickle);
  const pid_t ended = ::fork();
  if (ended == 0) ::_exit(0);
  ASSERT_GT(ended, 0);
  ASSERT_EQ(::waitpid(ended, nullptr, 0), ended);
  const std::string stale = ".memsnap.h5.import-" + std::to_string(ended) + "-7";
  fs::create_directories(view / stale / "spill");
  Result r = sh(kMemsnap + " view " + pickle.string() + " -o " + view.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("holds " + stale + ", left by a memsnap command that was killed (process " + std::to_string(ended) +
                       " has ended); remove it (rm -r " + (view / stale).string() + ") and run again"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::is_directory(view / stale / "spill"));
  // One whose process still runs (this test's): wait for it.
  fs::remove_all(view / stale);
  const std::string live = ".memsnap.h5.tmp-" + std::to_string(::getpid()) + "-ab12";
  fs::create_directories(view / live);
  r = sh(kMemsnap + " view " + pickle.string() + " -o " + view.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("holds " + live + ", the working folder of memsnap process " + std::to_string(::getpid()) +
                       ", which is still running here"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::is_directory(view / live));
}

// "" when the marker `marker` in `dir` lists exactly the files there (staging included, so a
// staging folder left behind shows too), else what differs.
std::string marker_mismatch(const fs::path& dir, const std::string& marker) {
  std::set<std::string> files, listed;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != marker) files.insert(e.path().filename().string());
  const json m = read_json(dir / marker);
  for (const auto& f : m["files"]) listed.insert(f.get<std::string>());
  if (listed == files) return "";
  return "a marker that lists " + std::to_string(listed.size()) + " files of " + std::to_string(files.size());
}

// The report folder `dir` as a user finds it: "run_NAME" when it holds one whole report of that
// run (each page written by it, the marker listing exactly the files there, no staging folder),
// else what is wrong.
std::string whole_report(const fs::path& dir) {
  if (!fs::is_directory(dir)) return "no folder";
  std::set<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".html") continue;
    const std::string text = test::read_file(e.path());
    const std::size_t at = text.find("run_");
    runs.insert(at == std::string::npos ? "none" : text.substr(at, 5));
  }
  std::string all;
  for (const auto& r : runs) all += (all.empty() ? "" : " and ") + r;
  if (runs.size() != 1) return "pages of " + all;
  if (std::string wrong = marker_mismatch(dir, ".memsnap-report"); !wrong.empty()) return wrong;
  return all;
}

// A store of `ranks` ranks of fsdp_sim, its run named run_NAME (which its pages show).
std::string make_run(const fs::path& dir, const std::string& name, int ranks) {
  test::write_file(dir / (name + ".yaml"),
                   "run_name: run_" + name + "\nfolder: " + (dir / name).string() + "\nrepeat: 1\nstacks: native\n");
  const auto r = sh(kMpirun + " -np " + std::to_string(ranks) + " " + kMemsnap + " run --config " +
                    (dir / (name + ".yaml")).string() + " -- " + kSim + " --step-us 0 --batches 8 --layers 2 --hidden 256");
  EXPECT_EQ(r.code, 0) << r.out;
  return (dir / name / "memsnap.h5").string();
}

// Ctrl-C or mpirun's SIGTERM while a report replaces an earlier one: the folder then holds one
// whole report, the earlier or the new, never pages of both runs (the signal is sent from inside
// memsnap, right after a chosen rename, by the preloaded signal_at.c). Killed outright midway,
// the next report still replaces every file. A report folder the report made goes with it.
TEST(Cli, AnInterruptedReportLeavesOneWholeReport) {
  test::TempDir dir;
  const std::string a = make_run(dir.path(), "a", 4), b = make_run(dir.path(), "b", 2);
  const fs::path out = dir / "report";
  struct Case {
    int np, sig, count;
  };
  // Run b's report has 2 pages, index.html and summary.json: 6 renames with its two markers.
  for (const Case c : {Case{1, SIGTERM, 1}, Case{1, SIGINT, 3}, Case{1, SIGHUP, 6}, Case{2, SIGTERM, 2}}) {
    SCOPED_TRACE("np " + std::to_string(c.np) + ", " + strsignal(c.sig) + " after rename " + std::to_string(c.count));
    fs::remove_all(out);
    Result r = sh(kMemsnap + " report " + a + " -o " + out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_EQ(whole_report(out), "run_a");
    std::vector<std::string> env = signal_at_env("rename", out.string(), c.count, c.sig);
    std::vector<std::string> args = {kMemsnap, "report", b, "-o", out.string(), "--overwrite"};
    if (c.np > 1) {  // the preload for the ranks, not for mpirun
      args.insert(args.begin(), {MEMSNAP_MPIRUN, "--oversubscribe", "-np", std::to_string(c.np), "-x", env.back()});
      env.pop_back();
    }
    const pid_t pid = spawn_as_foreground(args, env, dir / "log");
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (c.np == 1) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == c.sig) << "status " << status << ": " << test::read_file(dir / "log");
    } else {
      EXPECT_NE(status, 0) << test::read_file(dir / "log");
    }
    EXPECT_EQ(whole_report(out), "run_b") << "the signal came while the new report was going in: it waits for it";
    EXPECT_EQ(leftovers(out), std::vector<std::string>());
  }
  // SIGKILL midway: both runs' files are there, the marker lists all of them, and the next report
  // replaces them (run a's rank 2 and 3 pages go).
  {
    fs::remove_all(out);
    ASSERT_EQ(sh(kMemsnap + " report " + a + " -o " + out.string()).code, 0);
    const pid_t pid = spawn_as_foreground({kMemsnap, "report", b, "-o", out.string(), "--overwrite"},
                                          signal_at_env("rename", out.string(), 3, SIGKILL), dir / "log");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    EXPECT_EQ(whole_report(out), "pages of run_a and run_b");
    const Result r = sh(kMemsnap + " report " + b + " -o " + out.string() + " --overwrite");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(whole_report(out), "run_b");
    EXPECT_FALSE(fs::exists(out / "rank3.4.pt.trace.memory_snapshot.html"));
  }
  // Interrupted before its pages go in, into a folder it made: neither the folder nor anything in it stays.
  {
    const fs::path fresh = dir / "fresh";
    const pid_t pid = spawn_as_foreground({kMemsnap, "report", b, "-o", fresh.string()},
                                          signal_at_env("mkdir", ".memsnap-report.partial"), dir / "log");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << ": " << test::read_file(dir / "log");
    EXPECT_FALSE(fs::exists(fresh));
  }
}

// The same for `memsnap diff`: interrupted while it replaces an earlier diff, the folder holds one
// whole diff (its index.html and diff.json of the same pair, the marker listing what is there).
TEST(Cli, AnInterruptedDiffLeavesOneWholeDiff) {
  test::TempDir dir;
  const std::string a = make_run(dir.path(), "a", 2), b = make_run(dir.path(), "b", 2);
  const fs::path out = dir / "diff";
  // "a" or "b": the base both files name, or what is wrong.
  auto whole_diff = [&]() -> std::string {
    const json data = read_json(out / "diff.json");
    const std::string index = test::read_file(out / "index.html");
    const std::size_t at = index.find("\"run_name\":\"run_");  // the base's, first
    const std::string shown = at == std::string::npos ? "none" : index.substr(at + 16, 1);
    if (std::string wrong = marker_mismatch(out, ".memsnap-diff"); !wrong.empty()) return wrong;
    const std::string base = data["base"]["run_name"];
    if (base != "run_" + shown) return "diff.json of " + base + ", index.html of run_" + shown;
    return shown;
  };
  for (int count : {1, 2, 3, 4}) {
    SCOPED_TRACE("SIGTERM after rename " + std::to_string(count));
    fs::remove_all(out);
    ASSERT_EQ(sh(kMemsnap + " diff " + a + " " + b + " -o " + out.string() + " --quiet").code, 0);
    ASSERT_EQ(whole_diff(), "a");
    const pid_t pid = spawn_as_foreground({kMemsnap, "diff", b, a, "-o", out.string(), "--overwrite", "--quiet"},
                                          signal_at_env("rename", out.string(), count), dir / "log");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << ": " << test::read_file(dir / "log");
    EXPECT_EQ(whole_diff(), "b");
    EXPECT_EQ(leftovers(out), std::vector<std::string>());
  }
}

// `nohup memsnap run -- python train.py`: a signal the shell ignores stays ignored, in memsnap
// and in the command (a closed terminal's SIGHUP ends neither); the others still reach it.
TEST(Cli, RunLeavesASignalTheShellIgnoresIgnored) {
  test::TempDir dir;
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGHUP, &ignore, &before), 0);
  const fs::path ready = dir / "ready";
  const std::string script = "grep SigIgn /proc/$$/status; : > " + ready.string() + "; sleep 1; echo done";
  const pid_t pid = spawn_as_foreground({kMemsnap, "run", "--", "/bin/sh", "-c", script}, {"MEMSNAP_ENABLED=false"}, dir / "log",
                                        {SIGHUP});
  sigaction(SIGHUP, &before, nullptr);
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(wait_until([&] { return fs::exists(ready); })) << test::read_file(dir / "log");
  ::kill(pid, SIGHUP);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string log = test::read_file(dir / "log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ": " << log;
  EXPECT_NE(log.find("done"), std::string::npos) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("SigIgn:\\s*([0-9a-f]+)"))) << log;
  EXPECT_EQ(std::stoull(m[1].str(), nullptr, 16) & (1ull << (SIGHUP - 1)), 1ull << (SIGHUP - 1)) << "the command's SIGHUP: " << log;
  // SIGTERM, not ignored, goes to the command as before (which memsnap says it was killed by).
  const fs::path started = dir / "started";
  const pid_t again = spawn_as_foreground({kMemsnap, "run", "--", "/bin/sh", "-c", ": > " + started.string() + "; sleep 5"},
                                          {"MEMSNAP_ENABLED=false"}, dir / "log2");
  EXPECT_TRUE(wait_until([&] { return fs::exists(started); })) << test::read_file(dir / "log2");
  ::kill(again, SIGTERM);
  ASSERT_EQ(::waitpid(again, &status, 0), again);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << ": " << test::read_file(dir / "log2");
  EXPECT_NE(test::read_file(dir / "log2").find("/bin/sh killed by SIGTERM"), std::string::npos) << test::read_file(dir / "log2");
}

// Ctrl-C at a terminal: the kernel signals the terminal's foreground process group, `memsnap
// run` and its command alike. The command gets that one SIGINT, not a second from memsnap (to
// many training loops a second Ctrl-C means "stop now, skip the clean-up").
TEST(Cli, RunPassesCtrlCOnOnce) {
  test::TempDir dir;
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (terminal < 0 || ::grantpt(terminal) != 0 || ::unlockpt(terminal) != 0) {
    GTEST_SKIP() << "no pseudo-terminal here (/dev/ptmx): " << std::strerror(errno);
  }
  const std::string tty = ::ptsname(terminal);
  const fs::path ready = dir / "ready", log = dir / "log";
  const pid_t pid = ::fork();
  if (pid == 0) {  // a session of its own, with the terminal as its controlling terminal
    ::setsid();
    const int in = ::open(tty.c_str(), O_RDWR);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setenv("MEMSNAP_ENABLED", "false", 1);
    ::execl(kMemsnap.c_str(), kMemsnap.c_str(), "run", "--", MEMSNAP_SIGNAL_COUNT, ready.c_str(), "2", nullptr);
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(wait_until([&] { return fs::exists(ready); })) << test::read_file(log);
  ASSERT_EQ(::write(terminal, "\x03", 1), 1);  // Ctrl-C
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(terminal);
  const std::string out = test::read_file(log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << ": " << out;
  EXPECT_NE(out.find("SIGINT code=" + std::to_string(SI_KERNEL) + " sender=0"), std::string::npos) << "the terminal's: " << out;
  EXPECT_EQ(out.find("sender=" + std::to_string(pid)), std::string::npos) << "a second one, from memsnap: " << out;
}

// Once its command has ended, `memsnap run` gathers the record and renders the report itself: a
// Ctrl-C or mpirun's SIGTERM then ends it as it ends `memsnap report` (here sent as the report
// makes its staging folder): the store it finished stays, the report folder it made goes.
TEST(Cli, RunTakesASignalOnceItsCommandHasEnded) {
  test::TempDir dir;
  test::write_file(dir / "m.yaml", "run_name: t\nfolder: " + (dir / "run").string() + "\nrepeat: 1\nstacks: native\n");
  const pid_t pid = spawn_as_foreground(
      {kMemsnap, "run", "--config", (dir / "m.yaml").string(), "--", kSim, "--step-us", "0", "--batches", "8", "--layers", "2",
       "--hidden", "256"},
      signal_at_env("mkdir", ".memsnap-report.partial"), dir / "log");
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status << ": " << test::read_file(dir / "log");
  EXPECT_TRUE(fs::exists(dir / "run/memsnap.h5")) << test::read_file(dir / "log");
  EXPECT_FALSE(fs::exists(dir / "run/report"));
  EXPECT_EQ(leftovers(dir / "run"), std::vector<std::string>());
}

// Issue #27 item 7: every error names its file and says in words what is wrong; each command ends
// with what it wrote and what to run next; --help shows defaults and an example.
TEST(Cli, MessagesNameTheFileAndSayWhatToRunNext) {
  test::TempDir dir;
  fs::copy_file(std::string(MEMSNAP_TEST_DATA) + "/torch-2.11/snap_oom.pickle", dir / "rank0.5.pickle");
  test::write_file(dir / "rank1.5.pickle", std::string("h\x4e", 2));
  const std::string good = (dir / "rank0.5.pickle").string(), bad = (dir / "rank1.5.pickle").string();
  const std::string store = (dir / "s.h5").string();

  auto r = sh(kMemsnap + " import " + bad + " -o " + store);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("memsnap import: " + bad + ": not a PyTorch snapshot: opcode BINGET (0x68) at byte 0"),
            std::string::npos)
      << r.out;

  for (const char* bad_number : {"--interval 0", "--interval -3", "--world-size 0", "--rank -1 --batch 1"}) {
    r = sh(kMemsnap + " import " + good + " -o " + store + " " + bad_number);
    EXPECT_EQ(r.code, 2) << bad_number;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("give a whole number"), std::string::npos) << r.out;
    EXPECT_FALSE(std::regex_search(r.out, std::regex("[0-9]{20}"))) << "no 300-digit range: " << r.out;
  }
  r = sh(kMemsnap + " import " + good + " -o " + store + " --interval 0");
  EXPECT_NE(r.out.find("from 1 to 100000"), std::string::npos) << r.out;

  r = sh(kMemsnap + " import " + good + " " + good + " -o " + store);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(good + " is given twice"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".tmp-"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".import-"), std::string::npos) << r.out;

  // --keep-going: the warning is import's, and the summary counts the pickles read.
  r = sh(kMemsnap + " import " + good + " " + bad + " -o " + store + " --keep-going");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("memsnap aggregate"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memsnap import: warning: " + bad + ": not a PyTorch snapshot"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memsnap import: 1 of 2 snapshots read (1 left out: " + bad + ")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  next: memsnap report " + store + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << "no progress line off a terminal: " << r.out;

  r = sh(kMemsnap + " export " + store + " --rank 0 --batch 5 -o " + (dir / "w.pickle").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-> " + (dir / "w.pickle").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  next: "), std::string::npos) << r.out;

  r = sh("MEMSNAP_FOLDER=" + (dir / "run").string() + " " + kMemsnap + " run --no-aggregate -- " + kSim +
         " --step-us 0 --batches 5 --layers 2 --hidden 256");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " aggregate " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string run_store = (dir / "run/memsnap.h5").string();
  EXPECT_EQ(r.out, "memsnap aggregate: 1 rank, 1 window -> " + run_store + "\n  next: memsnap report " + run_store + "\n");

  for (const char* sub : {"run", "aggregate", "import", "report", "info", "export"}) {
    r = sh(kMemsnap + " " + sub + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("Example:\n  "), std::string::npos) << sub << ": " << r.out;
  }
  EXPECT_NE(sh(kMemsnap + " import --help").out.find("=rank{rank}.{batch}"), std::string::npos) << "defaults shown";
  EXPECT_NE(sh(kMemsnap + " export --help").out.find("=torch"), std::string::npos);
  EXPECT_NE(sh(kMemsnap + " aggregate --help").out.find("=32"), std::string::npos);
}

}  // namespace
}  // namespace memsnap
