// What an offline command (import, view, aggregate, report, export, diff) leaves when it is
// interrupted: nothing of its own. Ctrl-C, mpirun's SIGTERM or a closed terminal removes the
// temporary files and folders it made, then ends it by that signal as before.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace memsnap::interrupt {

/// From here on, SIGINT, SIGTERM and SIGHUP remove every live Temporary, then end the process by
/// that signal (its exit status is the one the signal gave before). Call it before any thread
/// starts: it blocks those signals in the calling thread, whose mask later threads inherit, and
/// takes them on a thread of its own. A child forked after it gets them unblocked. Calling it
/// again does nothing. `memsnap run` calls it once its command has ended (until then it forwards
/// signals to the command); a signal the shell ignores stays ignored.
void remove_temporaries_on_signal();

/// The name of a temporary this process makes beside `output`: ".NAME.KIND-PID-RANDOM", with KIND
/// "tmp" (a store's or an export's temporary) or "import" (an import's working folder).
std::string temporary_name(const std::filesystem::path& output, std::string_view kind);

/// The process that made `name`, when it is a temporary_name of `output`; 0 when it is not.
long temporary_owner(std::string_view name, const std::filesystem::path& output);

/// A file or folder this process made for itself, removed (recursively) if the process is
/// interrupted while the guard lives. Its owner still removes or renames it on the normal paths;
/// call release() once it is no longer temporary (renamed into place, or removed). Guards are
/// undone newest first, so a temporary made inside another goes before it.
class Temporary {
 public:
  Temporary() = default;
  explicit Temporary(std::filesystem::path path);
  /// A folder this process made for an output (a report's folder), removed on an interrupt only if
  /// it is empty then: anything put there meanwhile by someone else stays.
  static Temporary empty_folder(std::filesystem::path path);
  ~Temporary();
  Temporary(Temporary&& other) noexcept;
  Temporary& operator=(Temporary&& other) noexcept;
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  /// No longer removed on a signal.
  void release() noexcept;

 private:
  Temporary(std::filesystem::path path, bool only_if_empty);

  std::uint64_t m_id = 0;  // 0: nothing registered
};

/// While one lives, an interrupt waits: a few renames that put a finished output in place (a store,
/// a report's pages) run to their end, or are undone, before the process ends. Not nested, and
/// never around an MPI collective (a peer killed meanwhile would keep it waiting).
class Deferred {
 public:
  Deferred();
  ~Deferred();
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
};

}  // namespace memsnap::interrupt
