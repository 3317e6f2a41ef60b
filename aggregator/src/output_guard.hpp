// What memsnap may replace under `-o`: only what it wrote itself (a store it recognises by its
// format attribute, with its data folder of rank files; a file `memsnap export` marked as its
// own), and never a user's folder or file, --overwrite or not.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "memsnap/interrupt.hpp"

namespace memsnap {

/// What is at an output path.
struct OutputState {
  bool present = false;  // something is there (for a store: the root file or its data folder)
  bool ours = false;     // memsnap wrote all of it: --overwrite may replace it
  std::filesystem::path where;  // the path the verdict is about (the output, its data folder, or an entry there)
  std::string what;             // in words: "a folder that memsnap did not write", "a store memsnap wrote"
};

/// A store (root file `store` and its data folder `store_data_dir(store)`): memsnap's when the
/// root is a regular HDF5 file with format="memsnap" and the data folder, where there is one,
/// holds nothing but rank files (rank<N>.h5, HDF5) and sits beside such a root. Anything else at
/// either path (a folder, a link, another file, a stray file in the data folder) is not ours.
OutputState inspect_store_output(const std::filesystem::path& store);

/// An export file: memsnap's when it is a regular file that `memsnap export` marked as its own
/// (kExportTorchTrailer at the end of a pickle, kExportChromePrefix at the start of a trace).
OutputState inspect_export_output(const std::filesystem::path& file);

/// "" when `state` may be written over (nothing there, or ours and `overwrite`); otherwise one
/// line saying what is there and what to do: refused outright when it is not memsnap's, and
/// pointing at --overwrite (with what it would replace: `replaces`) only when that is allowed.
std::string output_refusal(const OutputState& state, bool overwrite, const std::string& replaces);

/// Bytes after the pickle's STOP opcode in a torch export: pickle readers (Python's, torch's
/// memory viewer, memsnap's) stop at STOP, so they never see it.
inline constexpr std::string_view kExportTorchTrailer = "\nmemsnap export: torch snapshot\n";
/// How a Chrome trace memsnap exports begins (its JSON keys are sorted: displayTimeUnit, otherData,
/// traceEvents); "otherData" is the trace format's place for metadata.
inline constexpr std::string_view kExportChromePrefix = R"({"displayTimeUnit":"ms","otherData":{"producer":"memsnap export")";

/// Writes an export: `bytes` to `file` through a temporary file beside it, renamed into place only when all
/// of it is written and synced: a failure (disk full, no permission) removes the temporary file
/// and leaves what was at `file` as it was. Checks `file` again just before the rename. Returns ""
/// or one line naming the file and what went wrong.
std::string write_export_file(const std::filesystem::path& file, std::string_view bytes, bool overwrite);

/// write_export_file for an export written as it is made: write() appends to the temporary file,
/// commit() syncs it, checks `file` again and renames it into place. Destroyed without a commit
/// (a failure, an exception), it removes the temporary file and `file` stays as it was.
class ExportFile {
 public:
  ExportFile(std::filesystem::path file, bool overwrite);
  ~ExportFile();
  ExportFile(const ExportFile&) = delete;
  ExportFile& operator=(const ExportFile&) = delete;

  /// Appends `bytes`; false once something failed (then nothing more is written).
  bool write(std::string_view bytes);
  /// "" when `file` now holds what was written; else write_export_file's one line.
  std::string commit();
  std::uint64_t size() const { return m_size; }

 private:
  std::string failure(const std::string& error);
  std::filesystem::path m_file, m_tmp;
  interrupt::Temporary m_tmp_guard;  // an interrupted export leaves no temporary file
  bool m_overwrite;
  int m_fd = -1;
  std::string m_error;  // the first failure, in words
  std::uint64_t m_size = 0;
};

}  // namespace memsnap
