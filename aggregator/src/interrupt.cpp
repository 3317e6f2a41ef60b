// Temporaries removed when an offline command is interrupted: see memsnap/interrupt.hpp.
//
// The signals are taken by sigwait on a thread of their own rather than in a handler, so that the
// removal is ordinary code (std::filesystem, a mutex) instead of async-signal-safe code. Other
// threads may still be writing into a folder while it is removed: the removal is tried a few
// times, and the process ends right after.
#include "memsnap/interrupt.hpp"

#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace memsnap::interrupt {

namespace fs = std::filesystem;

namespace {

struct Registry {
  std::mutex deferred;  // held by a Deferred, and by the signal thread before it acts
  std::mutex mutex;
  std::uint64_t next_id = 1;
  struct Entry {
    std::uint64_t id = 0;
    fs::path path;
    bool only_if_empty = false;  // a folder of the user's output: removed only while empty
  };
  std::vector<Entry> paths;  // oldest first
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the signal thread may use it during exit
  return *r;
}

void remove_all_registered() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.paths.rbegin(); it != r.paths.rend(); ++it) {
    std::error_code ec;
    if (it->only_if_empty) {
      fs::remove(it->path, ec);  // fails, and removes nothing, unless the folder is empty
      continue;
    }
    for (int attempt = 0; attempt < 5; ++attempt) {
      fs::remove_all(it->path, ec);
      if (!ec && !fs::exists(fs::symlink_status(it->path, ec))) break;
    }
  }
  r.paths.clear();
}

// Takes the signals in `set` (blocked in every thread).
[[noreturn]] void wait_for_signals(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  std::lock_guard<std::mutex> wait_for_renames(registry().deferred);
  remove_all_registered();
  // End by the same signal: its default action, delivered to this thread, where it is unblocked.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  for (;;) pause();  // not reached: the default action of these signals ends the process
}

sigset_t g_taken;  // the signals blocked here, unblocked in a forked child

void unblock_in_child() { pthread_sigmask(SIG_UNBLOCK, &g_taken, nullptr); }

}  // namespace

void remove_temporaries_on_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A signal the user's shell ignores (a command started with `nohup`, or in the background of
    // a script) stays ignored: it is not blocked, as a blocked one would reach sigwait.
    sigemptyset(&g_taken);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_IGN) sigaddset(&g_taken, sig);
    }
    if (sigisemptyset(&g_taken)) return;
    pthread_sigmask(SIG_BLOCK, &g_taken, nullptr);
    pthread_atfork(nullptr, nullptr, unblock_in_child);
    try {
      std::thread(wait_for_signals, g_taken).detach();
    } catch (const std::exception&) {
      pthread_sigmask(SIG_UNBLOCK, &g_taken, nullptr);  // no thread: the signals act as before
    }
  });
}

std::string temporary_name(const fs::path& output, std::string_view kind) {
  std::random_device rd;
  std::ostringstream name;
  name << "." << output.filename().string() << "." << kind << "-" << ::getpid() << "-" << std::hex << rd();
  return name.str();
}

long temporary_owner(std::string_view name, const fs::path& output) {
  for (const std::string_view kind : {"tmp", "import"}) {
    const std::string prefix = "." + output.filename().string() + "." + std::string(kind) + "-";
    if (name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view rest = name.substr(prefix.size());
    const std::size_t dash = rest.find('-');
    if (dash == 0 || dash > 9 || rest.find_first_not_of("0123456789") != dash) return 0;
    return std::stol(std::string(rest.substr(0, dash)));
  }
  return 0;
}

Deferred::Deferred() { registry().deferred.lock(); }

Deferred::~Deferred() { registry().deferred.unlock(); }

Temporary::Temporary(fs::path path) : Temporary(std::move(path), false) {}

Temporary::Temporary(fs::path path, bool only_if_empty) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  m_id = r.next_id++;
  r.paths.push_back({m_id, std::move(path), only_if_empty});
}

Temporary Temporary::empty_folder(fs::path path) { return Temporary(std::move(path), true); }

Temporary::~Temporary() { release(); }

Temporary::Temporary(Temporary&& other) noexcept : m_id(std::exchange(other.m_id, 0)) {}

Temporary& Temporary::operator=(Temporary&& other) noexcept {
  if (this != &other) {
    release();
    m_id = std::exchange(other.m_id, 0);
  }
  return *this;
}

void Temporary::release() noexcept {
  if (m_id == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.paths.begin(); it != r.paths.end(); ++it) {
    if (it->id == m_id) {
      r.paths.erase(it);
      break;
    }
  }
  m_id = 0;
}

}  // namespace memsnap::interrupt
