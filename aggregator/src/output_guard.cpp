// What memsnap may replace under `-o` (see output_guard.hpp).
#include "output_guard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>

#include "hdf5_util.hpp"
#include "memsnap/store.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;

OutputState verdict(const fs::path& where, bool ours, std::string what) {
  OutputState s;
  s.present = true;
  s.ours = ours;
  s.where = where;
  s.what = std::move(what);
  return s;
}

/// What a path is, in words, when it is not a regular file (or "" when it is one).
std::string not_a_file(const fs::file_status& st) {
  if (fs::is_symlink(st)) return "a symbolic link";
  if (fs::is_directory(st)) return "a folder";
  if (!fs::is_regular_file(st)) return "not a regular file (a device, socket or pipe)";
  return "";
}

/// "" when `file` is an HDF5 file whose root has format="memsnap"; else what it is instead.
std::string memsnap_store_problem(const fs::path& file) {
  h5::QuietErrors quiet;
  if (H5Fis_hdf5(file.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return "a file that memsnap did not write (not an HDF5 store)";
  }
  try {
    h5::Handle fapl = h5::file_access();
    h5::Handle f = h5::file_handle(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl), file.string());
    if (h5::has_attr(f, "format") && h5::read_attr_string(f, "format", file.string()) == kStoreFormat) return "";
    return "an HDF5 file that memsnap did not write (no format=\"memsnap\" attribute)";
  } catch (const std::exception&) {
    H5Eclear2(H5E_DEFAULT);
    return "an HDF5 file that memsnap cannot open to check that it wrote it";
  }
}

bool is_rank_file_name(const std::string& name) {
  static const std::regex pattern("rank[0-9]+\\.h5");
  return std::regex_match(name, pattern);
}

/// Whether `file` (a regular file) is one that `memsnap export` marked as its own.
bool is_memsnap_export(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  std::string head(kExportChromePrefix.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  if (head == kExportChromePrefix) return true;
  if (head.empty() || head[0] != '\x80') return false;  // a pickle starts with PROTO
  in.clear();
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(in.tellg());
  if (size < kExportTorchTrailer.size() + 2) return false;
  std::string tail(kExportTorchTrailer.size(), '\0');
  in.seekg(static_cast<std::streamoff>(size - tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return in && tail == kExportTorchTrailer;
}

}  // namespace

OutputState inspect_store_output(const fs::path& store) {
  std::error_code ec;
  OutputState root;
  const fs::file_status st = fs::symlink_status(store, ec);
  if (fs::exists(st)) {
    if (std::string kind = not_a_file(st); !kind.empty()) {
      return verdict(store, false, kind == "a folder" ? "a folder that memsnap did not write" : kind);
    }
    if (std::string problem = memsnap_store_problem(store); !problem.empty()) return verdict(store, false, problem);
    root = verdict(store, true, "a memsnap store");
  }
  const fs::path data = store_data_dir(store);
  const fs::file_status dst = fs::symlink_status(data, ec);
  if (!fs::exists(dst)) return root;
  if (!fs::is_directory(dst) || fs::is_symlink(dst)) {
    return verdict(data, false, not_a_file(dst).empty() ? "a file that memsnap did not write" : not_a_file(dst));
  }
  // The data folder is marked by the store beside it (whose external links name its rank files)
  // and by holding nothing else: alone, or with anything else in it, it is not taken for ours.
  if (!root.present) {
    return verdict(data, false, "a folder that memsnap did not write (no memsnap store " + store.filename().string() +
                                    " beside it)");
  }
  for (fs::directory_iterator it(data, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    const fs::file_status est = fs::symlink_status(p, ec);
    if (!fs::is_regular_file(est) || !is_rank_file_name(p.filename().string()) || H5Fis_hdf5(p.c_str()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return verdict(p, false, std::string(fs::is_directory(est) ? "a folder" : "a file") +
                                   " in the store's data folder that memsnap did not write");
    }
  }
  if (ec) return verdict(data, false, "a folder memsnap cannot list (" + ec.message() + ")");
  root.what = "a memsnap store";
  return root;
}

OutputState inspect_export_output(const fs::path& file) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(file, ec);
  if (!fs::exists(st)) return {};
  if (std::string kind = not_a_file(st); !kind.empty()) return verdict(file, false, kind + ", not a file memsnap exported");
  if (!is_memsnap_export(file)) return verdict(file, false, "a file that memsnap export did not write");
  return verdict(file, true, "an earlier memsnap export");
}

std::string output_refusal(const OutputState& state, bool overwrite, const std::string& replaces) {
  if (!state.present || (state.ours && overwrite)) return "";
  if (!state.ours) {
    return state.where.string() + " is " + state.what + "; refusing to replace it, with or without --overwrite " +
           "(choose another -o)";
  }
  return state.where.string() + " already exists (" + state.what + "); --overwrite replaces " + replaces;
}

std::string write_export_file(const fs::path& file, std::string_view bytes, bool overwrite) {
  ExportFile out(file, overwrite);
  out.write(bytes);
  return out.commit();
}

ExportFile::ExportFile(fs::path file, bool overwrite) : m_file(std::move(file)), m_overwrite(overwrite) {
  const fs::path dir = m_file.parent_path().empty() ? fs::path(".") : m_file.parent_path();
  m_tmp = dir / interrupt::temporary_name(m_file, "tmp");
  m_tmp_guard = interrupt::Temporary(m_tmp);
  m_fd = ::open(m_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (m_fd < 0) {
    m_error = m_file.string() + ": cannot write in " + dir.string() + ": " + std::strerror(errno);
    m_tmp.clear();  // not ours to remove
    m_tmp_guard.release();
  }
}

ExportFile::~ExportFile() {
  if (m_fd >= 0) ::close(m_fd);
  std::error_code ec;
  if (!m_tmp.empty()) fs::remove(m_tmp, ec);
}

bool ExportFile::write(std::string_view bytes) {
  for (std::size_t done = 0; done < bytes.size() && m_error.empty();) {
    const ssize_t n = ::write(m_fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      m_error = failure(std::strerror(n < 0 ? errno : EIO));
    } else {
      done += static_cast<std::size_t>(n);
      m_size += static_cast<std::uint64_t>(n);
    }
  }
  return m_error.empty();
}

std::string ExportFile::failure(const std::string& error) {
  std::error_code ec;
  const bool before = fs::exists(fs::symlink_status(m_file, ec));
  return m_file.string() + ": cannot write it: " + error + (before ? " (the earlier file is unchanged)" : " (nothing was written)");
}

std::string ExportFile::commit() {
  if (m_error.empty() && ::fsync(m_fd) != 0) m_error = failure(std::strerror(errno));
  if (m_fd >= 0 && ::close(m_fd) != 0 && m_error.empty()) m_error = failure(std::strerror(errno));
  m_fd = -1;
  if (!m_error.empty()) return m_error;
  // Checked again: something may have appeared at `file` while this was written.
  if (std::string refusal = output_refusal(inspect_export_output(m_file), m_overwrite, "it"); !refusal.empty()) return refusal;
  std::error_code ec;
  fs::rename(m_tmp, m_file, ec);
  if (ec) return m_error = failure(ec.message());
  m_tmp.clear();  // it is `file` now
  m_tmp_guard.release();
  return "";
}

}  // namespace memsnap
