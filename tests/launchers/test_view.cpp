// `memsnap view`: pickles to pages in one step, on real torch 2.11 snapshots; folders of pickles
// for import and view; pickles read on threads give the store a serial import gives.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

test::ShellResult sh(const std::string& cmd) { return test::run_shell(cmd); }

const std::string kMemsnap = std::getenv("MEMSNAP_TEST_CLI") != nullptr ? std::getenv("MEMSNAP_TEST_CLI") : MEMSNAP_CLI;
const std::string kData = MEMSNAP_TEST_DATA;

std::size_t lines(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

// Every file under `dir` with its bytes, to compare after.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? test::read_file(e.path()) : "<dir>";
  }
  return out;
}

json info_of(const fs::path& store) {
  const auto r = sh(kMemsnap + " info --json " + store.string());
  EXPECT_EQ(r.code, 0) << r.out;
  return json::parse(r.out, nullptr, false);
}

TEST(ViewTest, ARealPickleBecomesAPageBesideItAndItsPathIsPrinted) {
  test::TempDir dir;
  const fs::path pickle = dir / "snap_native.pickle";  // no rank or batch in the name: rank 0, batches from 1
  fs::copy_file(kData + "/torch-2.11/snap_native.pickle", pickle);
  auto r = sh(kMemsnap + " view " + pickle.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path folder = dir / "snap_native.memsnap";
  const fs::path page = folder / "report/index.html";
  EXPECT_TRUE(fs::is_regular_file(page));
  EXPECT_TRUE(fs::is_regular_file(folder / "report/summary.json"));
  EXPECT_NE(r.out.find("memsnap view: open " + fs::absolute(page).string() + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("next: memsnap report"), std::string::npos) << "view has already reported: " << r.out;
  const json info = info_of(folder / "memsnap.h5");
  ASSERT_EQ(info["ranks"].size(), 1u) << info.dump();
  EXPECT_EQ(info["ranks"][0]["rank"], 0);
  // Its batches count from 1 (four steps, found from the recurring annotation) and the window is
  // named after the last: not squeezed below batch 1.
  EXPECT_EQ(info["ranks"][0]["windows"][0]["batch_start"], 1);
  EXPECT_EQ(info["ranks"][0]["windows"][0]["batch"], 4);

  // Again: what the first view wrote is replaced only with --overwrite.
  const auto before = tree(folder);
  r = sh(kMemsnap + " view " + pickle.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(lines(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(tree(folder), before);
  r = sh(kMemsnap + " view " + pickle.string() + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(page));
}

// A long import says on a terminal how far it has read, within one pickle too (the reader's
// bytes, every 16 MiB), and says nothing of it in a pipe. `script` gives the command a terminal;
// MEMSNAP_PROGRESS_DELAY=0 shows the line at once, not after a second.
TEST(ViewTest, ALongImportSaysHowFarItHasReadOnATerminal) {
  const fs::path gen = fs::path(MEMSNAP_BIN_DIR) / "gen_torch_snapshot";
  if (!fs::exists(gen)) GTEST_SKIP() << "no " << gen << " (tests/bench not built)";
  if (sh("command -v script").code != 0) GTEST_SKIP() << "no script(1) to give a terminal";
  if (sh("script -qec 'test -t 2' /dev/null </dev/null").code != 0) GTEST_SKIP() << "script(1) could not open a terminal here";
  test::TempDir dir;
  const fs::path pickle = dir / "big.pickle";  // 400k entries, 45 MB
  ASSERT_EQ(sh(gen.string() + " " + pickle.string() + " --entries 400k --frames-per-entry 16 --torch-frames").code, 0);
  const std::string view = "env MEMSNAP_PROGRESS_DELAY=0 " + kMemsnap + " view " + pickle.string();
  auto r = sh("script -qec " + test::shell_quote(view) + " /dev/null </dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  // The line is rewritten in place ("\r"): every state of it.
  std::vector<int> percents;
  std::string line;
  for (char c : r.out + "\n") {
    if (c != '\r' && c != '\n') {
      line += c;
      continue;
    }
    const auto at = line.find(" % of ");
    if (line.rfind("memsnap view: ", 0) == 0 && at != std::string::npos) {
      percents.push_back(std::atoi(line.c_str() + 14));
      EXPECT_NE(line.find(" read (1 snapshot)"), std::string::npos) << line;
    }
    line.clear();
  }
  ASSERT_FALSE(percents.empty()) << r.out;
  EXPECT_TRUE(std::is_sorted(percents.begin(), percents.end())) << r.out;
  EXPECT_EQ(percents.back(), 100) << r.out;
  EXPECT_TRUE(std::any_of(percents.begin(), percents.end(), [](int p) { return p > 0 && p < 100; }))
      << "no line from within the pickle: " << r.out;
  EXPECT_TRUE(fs::is_regular_file(dir / "big.memsnap/report/index.html"));

  // In a pipe: no progress line, and no carriage return.
  r = sh(view + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find(" % of "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
}

TEST(ViewTest, ComposerNamesGiveRankAndBatch) {
  test::TempDir dir;
  const fs::path pickle = dir / "rank1.5.pt.trace.memory_snapshot.pickle";
  fs::copy_file(kData + "/torch-2.11/snap_exp.pickle", pickle);
  auto r = sh(kMemsnap + " view " + pickle.string() + " -o " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("memsnap view: open " + fs::absolute(dir / "out/report/index.html").string()), std::string::npos)
      << r.out;
  const json info = info_of(dir / "out/memsnap.h5");
  ASSERT_EQ(info["ranks"].size(), 2u) << "rank 0 missing, rank 1 there: " << info.dump();
  EXPECT_EQ(info["ranks"][1]["rank"], 1);
  EXPECT_EQ(info["ranks"][1]["windows"][0]["batch"], 5);
}

TEST(ViewTest, AFolderOfPicklesIsEveryPickleInIt) {
  test::TempDir dir;
  const fs::path snaps = dir / "snaps";
  fs::create_directories(snaps);
  for (int rank = 0; rank < 4; ++rank) {
    const std::string name = "rank" + std::to_string(rank) + ".3.pt.trace.memory_snapshot.pickle";
    fs::copy_file(kData + "/torch-loops/lm_everyrank/" + name, snaps / name);
  }
  test::write_file(snaps / "notes.txt", "not a pickle\n");
  auto r = sh(kMemsnap + " import " + snaps.string() + " -o " + (dir / "run.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("4 snapshots read, 4 ranks"), std::string::npos) << r.out;
  r = sh(kMemsnap + " view " + snaps.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(dir / "snaps.memsnap/report/index.html")) << r.out;
  EXPECT_EQ(info_of(dir / "snaps.memsnap/memsnap.h5")["ranks"].size(), 4u);
  // A folder without pickles: one line naming it.
  fs::create_directories(dir / "empty");
  r = sh(kMemsnap + " import " + (dir / "empty").string() + " -o " + (dir / "e.h5").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find((dir / "empty").string()), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "e.h5"));
}

TEST(ViewTest, AFolderOfTheUsersFilesIsRefusedAndLeftAsItWas) {
  test::TempDir dir;
  const fs::path pickle = dir / "rank0.5.pickle";
  fs::copy_file(kData + "/torch-2.11/snap_oom.pickle", pickle);
  const fs::path mine = dir / "mine";
  fs::create_directories(mine / "report");
  test::write_file(mine / "notes.txt", "my notes\n");
  test::write_file(mine / "report/index.html", "<p>my page</p>\n");
  const auto before = tree(mine);
  for (const bool overwrite : {false, true}) {
    auto r = sh(kMemsnap + " view " + pickle.string() + " -o " + mine.string() + (overwrite ? " --overwrite" : ""));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_EQ(lines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find("notes.txt, which memsnap did not write"), std::string::npos) << r.out;
    EXPECT_EQ(tree(mine), before);
  }
  // Its report folder alone, holding a page of the user's: refused before anything is imported.
  fs::remove(mine / "notes.txt");
  const auto only_report = tree(mine);
  auto r = sh(kMemsnap + " view " + pickle.string() + " -o " + mine.string() + " --overwrite");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("memsnap did not write"), std::string::npos) << r.out;
  EXPECT_EQ(tree(mine), only_report);
}

TEST(ViewTest, ABadPickleIsOneLineNamingItAndLeavesNothing) {
  test::TempDir dir;
  const fs::path bad = dir / "rank0.1.pickle";
  test::write_file(bad, std::string("\x80\x04\x63os\nsystem\n", 12));  // would import code
  auto r = sh(kMemsnap + " view " + bad.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(lines(r.out), 1u) << r.out;
  EXPECT_EQ(r.out.rfind("memsnap view: " + bad.string() + ": not a PyTorch snapshot", 0), 0u) << r.out;
  EXPECT_FALSE(fs::exists(dir / "rank0.1.memsnap"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"rank0.1.pickle"});
}

// --- pickles read on threads (memsnap import without mpirun) -------------------------------------

// Every rank file of `store`'s data folder is the same as `other`'s (h5diff: same data and
// attributes); the root differs only in when it was written.
void expect_same_store(const fs::path& store, const fs::path& other) {
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(store.string() + ".d"))) {
    const fs::path theirs = fs::path(other.string() + ".d") / e.path().filename();
    const auto r = sh("h5diff " + e.path().string() + " " + theirs.string());
    EXPECT_EQ(r.code, 0) << e.path().filename() << ": " << r.out;
    ++files;
  }
  EXPECT_EQ(files, static_cast<std::size_t>(std::distance(fs::directory_iterator(fs::path(other.string() + ".d")),
                                                          fs::directory_iterator())));
  const auto r = sh("h5diff -c " + store.string() + " " + other.string() + " | grep -v '^external link' | grep -v "
                    "'^[0-9]* differences found' | grep -v '^attribute: <created of </>>'");
  EXPECT_EQ(r.out, "") << "the roots differ beyond their time of writing";
}

TEST(ImportTest, PicklesReadOnThreadsMakeTheStoreASerialReadMakes) {
  test::TempDir dir;
  const std::string pickles = kData + "/torch-loops/mlp_sgd";  // 16 ranks
  for (const std::string& how : {std::string("serial"), std::string("threads3"), std::string("np2")}) {
    fs::create_directories(dir / how);
    const std::string flags = how == "serial" ? " --threads 1" : how == "threads3" ? " --threads 3" : "";
    const std::string launch = how == "np2" ? std::string(MEMSNAP_MPIRUN) + " --oversubscribe -np 2 " : "";
    const auto r = sh("export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; " + launch + kMemsnap +
                      " import " + pickles + " -o " + (dir / how / "s.h5").string() + flags);
    ASSERT_EQ(r.code, 0) << how << ": " << r.out;
  }
  expect_same_store(dir / "threads3/s.h5", dir / "serial/s.h5");
  expect_same_store(dir / "np2/s.h5", dir / "serial/s.h5");
}

TEST(ImportTest, OnThreadsTheFirstBadPickleIsNamedAsWhenSerial) {
  test::TempDir dir;
  for (int rank = 0; rank < 6; ++rank) {
    const std::string name = "rank" + std::to_string(rank) + ".5.pt.trace.memory_snapshot.pickle";
    if (rank == 2 || rank == 4) {
      test::write_file(dir / name, std::string("\x80\x04\x63os\nsystem\n", 12));
    } else {
      fs::copy_file(kData + "/torch-loops/mlp_sgd/" + name, dir / name);
    }
  }
  std::map<std::string, test::ShellResult> out;
  for (const std::string threads : {"1", "4"}) {
    for (const std::string keep : {"", " --keep-going"}) {
      const fs::path store = dir / ("s" + threads + (keep.empty() ? "" : "k") + ".h5");
      auto r = sh(kMemsnap + " import " + dir.path().string() + " -o " + store.string() + " --threads " + threads + keep);
      EXPECT_EQ(r.code, keep.empty() ? 1 : 0) << r.out;
      EXPECT_EQ(fs::exists(store), !keep.empty()) << r.out;
      // The store's name aside, the output is the same.
      for (std::size_t at; (at = r.out.find(store.string())) != std::string::npos;) r.out.replace(at, store.string().size(), "S.h5");
      out[threads + keep] = r;
    }
  }
  const auto& serial = out["1"];
  EXPECT_EQ(lines(serial.out), 1u) << serial.out;
  EXPECT_NE(serial.out.find("rank2.5.pt.trace.memory_snapshot.pickle: not a PyTorch snapshot"), std::string::npos)
      << serial.out;
  EXPECT_EQ(out["4"].out, serial.out);
  EXPECT_EQ(out["4 --keep-going"].out, out["1 --keep-going"].out);
  EXPECT_NE(out["1 --keep-going"].out.find("4 of 6 snapshots read"), std::string::npos) << out["1 --keep-going"].out;
}

}  // namespace
}  // namespace memsnap
