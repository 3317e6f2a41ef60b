// A folder of pages that memsnap writes and later replaces: a report's or a diff's. memsnap writes
// into a folder only when it is absent, empty, or holds an earlier output of the same command (its
// marker file, which lists the files that output wrote). The new pages are written to a staging
// folder inside it and put in place at the end, all at once as far as signals go: a Ctrl-C or
// mpirun's SIGTERM leaves either the earlier output or the new one, never pages of both runs.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memsnap/interrupt.hpp"

namespace memsnap {

struct PageFolderKind {
  const char* marker;   // ".memsnap-report": the file that says the folder is the command's
  const char* staging;  // ".memsnap-report.partial": where the new pages wait
  const char* format;   // the marker's "format"
  const char* writer;   // who the refusals name: "memsnap", "memsnap diff"
  const char* output;   // what the folder holds: "memsnap report", "memsnap diff"
};

class PageFolder {
 public:
  /// Looks at `dir`: refusal() says why the command may not write there ("" when it may).
  PageFolder(const PageFolderKind& kind, std::filesystem::path dir, bool overwrite);

  const std::string& refusal() const { return m_refusal; }
  const std::filesystem::path& dir() const { return m_dir; }
  std::filesystem::path staging() const { return m_dir / m_kind.staging; }

  /// Makes the folder (if absent) and an empty staging folder in it. An interrupt from here on
  /// removes the staging folder, and the folder if it was made here and holds nothing else.
  /// Throws Error.
  void open();

  /// Puts the staging folder's `files` (names relative to the folder) in place of the earlier
  /// output, removes that output's files the new one lacks (only files its marker lists), writes
  /// the marker (`marker` with "format" and "files" added) and removes the staging folder; an
  /// interrupt waits until this is done. Killed outright midway (SIGKILL, a lost node), the folder
  /// keeps a marker that lists every file of both outputs, so the next run replaces them all.
  /// Returns how many of the earlier output's files were removed. Throws Error.
  std::size_t install(const std::vector<std::string>& files, nlohmann::json marker);

  /// Undoes open() after a failure: the staging folder goes, and the folder if it was made here
  /// and is empty. An earlier output stays as it was.
  void abandon() noexcept;

 private:
  void write_marker(const std::vector<std::string>& files, nlohmann::json marker) const;

  PageFolderKind m_kind;
  std::filesystem::path m_dir;
  bool m_exists = false;
  bool m_created = false;
  std::vector<std::string> m_earlier;  // the earlier output's files (its marker's list)
  std::string m_refusal;
  interrupt::Temporary m_dir_guard, m_staging_guard;
};

}  // namespace memsnap
