// A report's or a diff's output folder (see page_folder.hpp).
#include "page_folder.hpp"

#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "memsnap/errors.hpp"
#include "memsnap/names.hpp"

namespace memsnap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A path a marker lists, if it stays inside the folder (a damaged marker cannot aim elsewhere).
std::optional<fs::path> listed_path(const fs::path& dir, const std::string& name, const char* marker) {
  if (name.empty() || name == marker) return std::nullopt;
  try {
    return join_inside(dir, name);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void rename_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  fs::rename(from, to, ec);
  if (ec) throw Error("cannot write " + to.string() + ": " + ec.message());
}

}  // namespace

PageFolder::PageFolder(const PageFolderKind& kind, fs::path dir, bool overwrite) : m_kind(kind), m_dir(std::move(dir)) {
  std::error_code ec;
  const auto status = fs::symlink_status(m_dir, ec);
  if (ec || status.type() == fs::file_type::not_found) return;
  m_exists = true;
  if (status.type() != fs::file_type::directory) {
    m_refusal = m_dir.string() + " is not a folder (a file or a link memsnap did not write); it is left as it is: choose "
                                 "another -o";
    return;
  }
  bool empty = true;
  for (const auto& e : fs::directory_iterator(m_dir, ec)) {
    if (e.path().filename() != m_kind.staging) empty = false;
  }
  if (ec) {
    m_refusal = "cannot read " + m_dir.string() + ": " + ec.message();
    return;
  }
  bool has_output = false;
  const fs::path marker = m_dir / m_kind.marker;
  if (fs::is_regular_file(fs::symlink_status(marker, ec))) {
    std::ifstream in(marker, std::ios::binary);
    const json m = json::parse(in, nullptr, false);
    if (m.is_object() && m.value("format", "") == m_kind.format && m.contains("files") && m["files"].is_array()) {
      has_output = true;
      for (const auto& f : m["files"]) {
        if (f.is_string()) m_earlier.push_back(f.get<std::string>());
      }
    }
  }
  if (!has_output && !empty) {
    m_refusal = m_dir.string() + " holds files that " + m_kind.writer + " did not write (no " + m_kind.marker +
                " marker); they are left as they are: choose another -o (an empty or new folder)";
  } else if (has_output && !overwrite) {
    m_refusal = m_dir.string() + " already holds a " + m_kind.output + "; pass --overwrite to replace it";
  }
}

void PageFolder::open() {
  std::error_code ec;
  if (!m_exists) {
    m_created = fs::create_directories(m_dir, ec);
    if (ec) throw Error("cannot create " + m_dir.string() + ": " + ec.message());
    if (m_created) m_dir_guard = interrupt::Temporary::empty_folder(m_dir);
  }
  fs::remove_all(staging(), ec);  // a run that was killed before it finished
  m_staging_guard = interrupt::Temporary(staging());
  if (!fs::create_directory(staging(), ec)) {
    throw Error("cannot create " + staging().string() + (ec ? ": " + ec.message() : ": it exists"));
  }
}

void PageFolder::write_marker(const std::vector<std::string>& files, json marker) const {
  marker["format"] = m_kind.format;
  marker["files"] = files;
  const fs::path staged = staging() / m_kind.marker;
  {
    std::ofstream out(staged, std::ios::binary | std::ios::trunc);
    out << marker.dump(1) << "\n";
    out.flush();
    if (!out) throw Error("cannot write " + staged.string());
  }
  rename_into(staged, m_dir / m_kind.marker);
}

std::size_t PageFolder::install(const std::vector<std::string>& files, json marker) {
  const interrupt::Deferred all_at_once;  // an interrupt waits until the new output is whole
  const std::set<std::string> now(files.begin(), files.end());
  // First a marker that lists the files of both outputs: whatever ends this midway, the next run
  // knows every file here as its own to replace.
  std::set<std::string> both = now;
  both.insert(m_earlier.begin(), m_earlier.end());
  write_marker(std::vector<std::string>(both.begin(), both.end()), marker);
  m_dir_guard.release();  // the folder holds an output from here on
  for (const auto& name : files) rename_into(join_inside(staging(), name), join_inside(m_dir, name));
  std::size_t removed = 0;
  for (const auto& old : m_earlier) {
    if (now.count(old)) continue;
    const auto path = listed_path(m_dir, old, m_kind.marker);
    std::error_code ec;
    if (path && fs::is_regular_file(fs::symlink_status(*path, ec)) && fs::remove(*path, ec)) ++removed;
  }
  write_marker(std::vector<std::string>(now.begin(), now.end()), std::move(marker));
  std::error_code ec;
  fs::remove_all(staging(), ec);
  m_staging_guard.release();
  return removed;
}

void PageFolder::abandon() noexcept {
  std::error_code ec;
  fs::remove_all(staging(), ec);
  m_staging_guard.release();
  if (m_created) fs::remove(m_dir, ec);  // only if empty
  m_dir_guard.release();
}

}  // namespace memsnap
