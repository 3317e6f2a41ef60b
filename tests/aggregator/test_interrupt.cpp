// memsnap/interrupt.hpp: what a signal does to an offline command's temporaries, in a child
// process (a gtest death test) that installs the handling and signals itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "memsnap/interrupt.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;

void make_folder_with_a_file(const fs::path& dir) {
  fs::create_directories(dir / "spill");
  std::ofstream(dir / "spill" / "rank0.spill") << "bytes";
}

// In the child: temporaries registered, one released, then `sig` sent to the process while a
// Deferred lives. The process must outlive the signal until the Deferred ends (it writes a mark
// then), and die by that signal right after, with the live temporaries removed.
[[noreturn]] void child(const fs::path& dir, int sig) {
  interrupt::remove_temporaries_on_signal();
  make_folder_with_a_file(dir / "work");
  make_folder_with_a_file(dir / "kept");
  std::ofstream(dir / "file.tmp") << "x";
  interrupt::Temporary work(dir / "work"), kept(dir / "kept"), file(dir / "file.tmp");
  kept.release();
  {
    const interrupt::Deferred renames;
    ::kill(::getpid(), sig);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::ofstream(dir / "deferred-ran-to-its-end") << (fs::exists(dir / "work") ? "work still there" : "work gone");
  }
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the signal ends the process before this
  std::_Exit(0);
}

TEST(InterruptTest, ASignalRemovesLiveTemporariesAfterDeferredRenamesAndEndsTheProcessByIt) {
  GTEST_FLAG_SET(death_test_style, "fast");  // a fork: the child sees this TempDir
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(strsignal(sig));
    test::TempDir dir;
    EXPECT_EXIT(child(dir.path(), sig), testing::KilledBySignal(sig), "");
    EXPECT_FALSE(fs::exists(dir / "work")) << "a live temporary stays";
    EXPECT_FALSE(fs::exists(dir / "file.tmp"));
    EXPECT_TRUE(fs::exists(dir / "kept" / "spill" / "rank0.spill")) << "a released one was removed";
    EXPECT_EQ(test::read_file(dir / "deferred-ran-to-its-end"), "work still there")
        << "the signal acted inside a Deferred";
  }
}

// A temporary whose guard is gone (its owner renamed it into place) is never removed.
TEST(InterruptTest, NothingOutsideTheLiveTemporariesIsTouched) {
  GTEST_FLAG_SET(death_test_style, "fast");  // a fork: the child sees this TempDir
  test::TempDir dir;
  EXPECT_EXIT(
      {
        interrupt::remove_temporaries_on_signal();
        make_folder_with_a_file(dir / "store");
        { interrupt::Temporary gone(dir / "store"); }
        interrupt::Temporary moved(dir / "a");
        interrupt::Temporary other = std::move(moved);  // one registration, moved
        ::kill(::getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(20));
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGTERM), "");
  EXPECT_TRUE(fs::exists(dir / "store" / "spill" / "rank0.spill"));
}

// A report's folder made by the command goes with it only while empty: a file someone put there
// meanwhile stays, and so does the folder. Temporaries inside it go first (newest first).
TEST(InterruptTest, AFolderForAnOutputIsRemovedOnlyWhileEmpty) {
  GTEST_FLAG_SET(death_test_style, "fast");  // a fork: the child sees this TempDir
  test::TempDir dir;
  EXPECT_EXIT(
      {
        interrupt::remove_temporaries_on_signal();
        fs::create_directories(dir / "empty");
        fs::create_directories(dir / "used");
        interrupt::Temporary empty = interrupt::Temporary::empty_folder(dir / "empty");
        interrupt::Temporary used = interrupt::Temporary::empty_folder(dir / "used");
        make_folder_with_a_file(dir / "empty" / "staging");
        interrupt::Temporary staging(dir / "empty" / "staging");
        std::ofstream(dir / "used" / "notes.txt") << "the user's";
        ::kill(::getpid(), SIGINT);
        std::this_thread::sleep_for(std::chrono::seconds(20));
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGINT), "");
  EXPECT_FALSE(fs::exists(dir / "empty")) << "its staging folder inside went first, then it";
  EXPECT_EQ(test::read_file(dir / "used" / "notes.txt"), "the user's");
}

// A signal ignored when the command starts (nohup's SIGHUP, a script's background job's SIGINT)
// stays ignored: the command runs on and keeps its temporaries.
TEST(InterruptTest, ASignalIgnoredAtTheStartStaysIgnored) {
  GTEST_FLAG_SET(death_test_style, "fast");
  test::TempDir dir;
  EXPECT_EXIT(
      {
        ::signal(SIGHUP, SIG_IGN);
        interrupt::remove_temporaries_on_signal();
        make_folder_with_a_file(dir / "work");
        interrupt::Temporary work(dir / "work");
        ::kill(::getpid(), SIGHUP);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::_Exit(fs::exists(dir / "work") ? 3 : 4);
      },
      testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace memsnap
