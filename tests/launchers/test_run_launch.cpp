// `memsnap run` and the launch a record belongs to: a bad config leaves nothing behind, and a
// record of another launch is never gathered or reported as this run. Real memsnap, real mpirun,
// the demo workload.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "memsnap/spill.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kMemsnap = MEMSNAP_CLI;
const std::string kSim = std::string(MEMSNAP_FSDP_SIM) + " --step-us 0 --batches 4 --layers 2 --hidden 128";
const std::string kMpirun = std::string(MEMSNAP_MPIRUN) + " --oversubscribe";

test::ShellResult sh(const std::string& cmd) {
  // No MEMSNAP_* of the caller's leaks in; Open MPI runs as root here (ci/env.sh).
  return test::run_shell("timeout 120 sh -c '" + cmd + "'",
                         "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; "
                         "unset MEMSNAP_CONFIG MEMSNAP_FOLDER MEMSNAP_RUN_NAME MEMSNAP_ENABLED MEMSNAP_LAUNCH");
}

// The lines memsnap printed (its own prefix: "memsnap run[...]", "memsnap[rank R]", "memsnap aggregate").
std::vector<std::string> memsnap_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("memsnap", 0) == 0) lines.push_back(line);
  }
  return lines;
}

std::set<std::string> files_under(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

json read_json(const fs::path& p) { return json::parse(test::read_file(p)); }

// A config that does not load: the job runs on every rank, its exit code comes back, nothing is
// written anywhere (the default folder under the working directory included), and memsnap says
// so in one line for the whole job, naming the file, the key and what is allowed.
TEST(RunLaunch, BadConfigRunsTheJobUnrecordedWritesNothingAndSaysSoOnce) {
  test::TempDir dir;
  test::write_file(dir / "bad.yaml", "interval: 3ep\n");
  auto r = sh("cd " + dir.path().string() + " && " + kMpirun + " -np 2 " + kMemsnap + " run --config bad.yaml -- " + kSim);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fsdp_sim rank 0/2: 4 batches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fsdp_sim rank 1/2: 4 batches"), std::string::npos) << r.out;
  auto lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << "one line for the job, not one per rank:\n" << r.out;
  for (const char* part : {"bad.yaml", "'interval'", "3ep", "allowed", "unrecorded"}) {
    EXPECT_NE(lines[0].find(part), std::string::npos) << part << " in: " << lines[0];
  }
  EXPECT_EQ(files_under(dir.path()), std::set<std::string>{"bad.yaml"}) << "nothing written: " << r.out;

  // The same file through $MEMSNAP_CONFIG, and the command's own exit code passed through.
  r = sh("cd " + dir.path().string() + " && MEMSNAP_CONFIG=bad.yaml " + kMemsnap + " run -- sh -c \"" + kSim + " && exit 7\"");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_NE(r.out.find("fsdp_sim rank 0/1: 4 batches"), std::string::npos) << r.out;
  lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << "the config line and how the command ended:\n" << r.out;
  EXPECT_NE(lines[0].find("'interval'"), std::string::npos) << r.out;
  EXPECT_NE(lines[1].find("exited with 7"), std::string::npos) << r.out;
  EXPECT_EQ(files_under(dir.path()), std::set<std::string>{"bad.yaml"}) << "nothing written: " << r.out;

  // A recorder in a process memsnap did not start, with MEMSNAP_CONFIG naming the bad file:
  // one line, and it steps aside (never records with the defaults).
  r = sh("cd " + dir.path().string() + " && MEMSNAP_CONFIG=bad.yaml " + kSim);
  EXPECT_EQ(r.code, 0) << r.out;
  lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_NE(lines[0].find("'interval'"), std::string::npos) << r.out;
  EXPECT_EQ(files_under(dir.path()), std::set<std::string>{"bad.yaml"}) << "nothing written: " << r.out;

  // Fixed, the next run into the same (default) folder is recorded and reported as itself.
  test::write_file(dir / "good.yaml", "interval: 3\nrun_name: fixed\n");
  r = sh("cd " + dir.path().string() + " && " + kMpirun + " -np 2 " + kMemsnap + " run --config good.yaml -- " + kSim);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("index.html"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("earlier"), std::string::npos) << r.out;
  const fs::path run = dir / "memsnap/fixed";
  const std::string launch = read_json(run / "spill/rank0.exit.json")["launch"];
  ASSERT_FALSE(launch.empty());
  const auto spills = find_spills(run);
  ASSERT_EQ(spills.size(), 2u);
  for (const auto& s : spills) {
    const auto meta = read_spill_meta(s);
    ASSERT_TRUE(meta.has_value()) << s;
    EXPECT_EQ(meta->launch, launch) << s << ": the spill names the launch that wrote it";
  }
  EXPECT_EQ(read_json(run / "report/summary.json")["ranks"].size(), 2u);
}

// A stray record of an earlier launch (a recorder that ran by itself, no exit record beside it)
// in the folder of the next run, overwrite false: the run is refused in one line that says when
// the stray record was made and what to do, and nothing is gathered or reported as this run.
TEST(RunLaunch, AStrayRecordOfAnEarlierLaunchIsNeverReportedAsThisRun) {
  test::TempDir dir;
  const fs::path run = dir / "run";
  auto r = sh("MEMSNAP_FOLDER=" + run.string() + " " + kSim);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(find_spills(run).size(), 1u) << r.out;
  const auto before = files_under(run);
  test::write_file(dir / "m.yaml", "folder: " + run.string() + "\n");
  r = sh(kMpirun + " -np 2 " + kMemsnap + " run --config " + (dir / "m.yaml").string() + " -- " + kSim);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("index.html"), std::string::npos) << "the earlier record reported as this run:\n" << r.out;
  const auto lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  for (const char* part : {"earlier launch", "made ", "overwrite", "another folder", "aggregate " }) {
    EXPECT_NE(lines[0].find(part), std::string::npos) << part << " in: " << lines[0];
  }
  EXPECT_FALSE(fs::exists(run / "memsnap.h5"));
  EXPECT_EQ(files_under(run), before) << "nothing in the folder changes";
}

// overwrite: true, and the command records nothing itself (it never loads memsnap): the earlier
// launch's record that stays in the folder is not gathered as this run; one line says so.
TEST(RunLaunch, ARunThatRecordedNothingDoesNotGatherAnEarlierLaunch) {
  test::TempDir dir;
  const fs::path run = dir / "run";
  auto r = sh("MEMSNAP_FOLDER=" + run.string() + " " + kSim);
  ASSERT_EQ(r.code, 0) << r.out;
  test::write_file(dir / "m.yaml", "folder: " + run.string() + "\noverwrite: true\n");
  r = sh(kMemsnap + " run --config " + (dir / "m.yaml").string() + " -- sh -c \"exit 0\"");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("index.html"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(run / "memsnap.h5")) << r.out;
  const auto lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_NE(lines[0].find("this run left no record"), std::string::npos) << r.out;
  EXPECT_NE(lines[0].find("earlier launch"), std::string::npos) << r.out;
}

// Two launches into one folder (overwrite: true, 3 ranks, then 2): the second run's store is made
// of its own 2 ranks. `memsnap aggregate` by hand takes the newest launch and names the one it
// left out in one line; --launch picks one; an unknown --launch is one line and exit 1.
TEST(RunLaunch, AggregateOfAFolderWithTwoLaunchesTakesTheNewestAndSaysSo) {
  test::TempDir dir;
  const fs::path run = dir / "run";
  test::write_file(dir / "m.yaml", "folder: " + run.string() + "\noverwrite: true\n");
  const std::string cmd = kMemsnap + " run --config " + (dir / "m.yaml").string() + " -- " + kSim;
  auto r = sh(kMpirun + " -np 3 " + cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string first = read_json(run / "spill/rank2.exit.json")["launch"];
  r = sh(kMpirun + " -np 2 " + cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string second = read_json(run / "spill/rank0.exit.json")["launch"];
  ASSERT_NE(first, second);
  EXPECT_NE(r.out.find("index.html"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(run / "report/summary.json")["ranks"].size(), 2u) << "rank 2 of the first launch mixed in";

  r = sh(kMemsnap + " aggregate " + run.string() + " -o " + (dir / "by_hand.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto lines = memsnap_lines(r.out);
  ASSERT_GE(lines.size(), 1u) << r.out;
  const auto note = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.find("2 launches") != std::string::npos; });
  ASSERT_NE(note, lines.end()) << r.out;
  EXPECT_NE(note->find("newest, launch " + second + " (2 ranks"), std::string::npos) << *note;
  EXPECT_NE(note->find("leaves out launch " + first + " (1 rank"), std::string::npos) << *note;
  EXPECT_NE(note->find("--launch " + first), std::string::npos) << *note;
  auto info = sh(kMemsnap + " info --json " + (dir / "by_hand.h5").string());
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_EQ(json::parse(info.out)["ranks"].size(), 2u);

  // The first launch on purpose: only its rank 2 is left, so its ranks 0 and 1 are missing.
  r = sh(kMemsnap + " aggregate " + run.string() + " --launch " + first + " --keep-going -o " + (dir / "first.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  info = sh(kMemsnap + " info --json " + (dir / "first.h5").string());
  ASSERT_EQ(info.code, 0) << info.out;
  const json j = json::parse(info.out);
  ASSERT_EQ(j["ranks"].size(), 3u) << info.out;
  EXPECT_EQ(j["ranks"][2]["status"], "ok");
  EXPECT_EQ(j["ranks"][0]["status"], "missing");

  r = sh(kMemsnap + " aggregate " + run.string() + " --launch nope -o " + (dir / "nope.h5").string());
  EXPECT_EQ(r.code, 1) << r.out;
  lines = memsnap_lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  EXPECT_NE(lines[0].find("no record of launch nope"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "nope.h5"));
}

}  // namespace
}  // namespace memsnap
