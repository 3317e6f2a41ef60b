// `memsnap view`: from PyTorch snapshot pickles to the report's pages in one step (import into a
// folder of its own, then report), ending with the path of the page to open.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli_checks.hpp"
#include "commands.hpp"
#include "memsnap/import_export.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/numeric.hpp"
#include "memsnap/report.hpp"
#include "memsnap/store.hpp"

namespace memsnap::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kVerb = "memsnap view";
constexpr const char* kReportDir = "report";

/// Beside the first pickle (or folder of pickles), named after it: rank0.3.pt.trace.memory_snapshot.memsnap/.
fs::path default_folder(fs::path first) {
  if (first.filename().empty()) first = first.parent_path();  // "snaps/"
  std::error_code ec;
  const std::string name = fs::is_directory(first, ec) ? first.filename().string() : first.stem().string();
  return first.parent_path() / (name + ".memsnap");
}

/// For a name in the view's folder that is a temporary of memsnap's own import or aggregation
/// (interrupt::temporary_name of the store): what to tell the user, or "" when it is not. Such a folder outlives its process only when that was killed outright (SIGKILL,
/// a lost node); a signal it can take (Ctrl-C, SIGTERM) removes it. Not removed here: a name alone
/// does not prove whose it is.
std::string temporary_note(const fs::path& dir, const fs::path& store, const std::string& name) {
  const long owner = interrupt::temporary_owner(name, store);
  if (owner <= 0) return "";
  const std::string pid = std::to_string(owner);
  const bool running = ::kill(static_cast<pid_t>(owner), 0) == 0 || errno == EPERM;
  if (running) return dir.string() + " holds " + name + ", the working folder of memsnap process " + pid +
                      ", which is still running here; let it finish, or choose another -o";
  return dir.string() + " holds " + name + ", left by a memsnap command that was killed (process " + pid +
         " has ended); remove it (rm -r " + (dir / name).string() + ") and run again";
}

/// "" when the view may write into `dir`: it is absent or empty, or holds only what an earlier view
/// wrote (the store, its data folder, a report folder that is empty or memsnap's). The store
/// itself is checked by import, before it writes anything; the report folder here, so that a
/// refusal comes before the import.
std::string folder_refusal(const fs::path& dir, const fs::path& store, bool overwrite) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return "";
  const std::string choose = "; refusing to write there, with or without --overwrite (choose another -o)";
  if (!fs::is_directory(st) || fs::is_symlink(st)) return dir.string() + " is not a folder" + choose;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != store.filename().string() && name != store_data_dir(store).filename().string() && name != kReportDir) {
      if (std::string note = temporary_note(dir, store, name); !note.empty()) return note;
      return dir.string() + " holds " + name + ", which memsnap did not write" + choose;
    }
  }
  if (ec) return dir.string() + ": cannot list the folder: " + ec.message();
  // The report folder as memsnap report itself judges it (its marker), asked before the import.
  return report_folder_refusal(dir / kReportDir, overwrite);
}

}  // namespace

void add_view(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("view", "Import PyTorch snapshot pickles and render the report in one step; prints "
                                         "the page to open");
  static ImportCliOptions o;
  static fs::path dir;
  static int rank = -1;
  static std::int64_t batch = -1;
  static std::size_t max_bands = ReportOptions{}.max_bands;
  cmd->add_option("PICKLES", o.pickles, "snapshot files, or folders of them (their *.pickle and *.pkl files)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("-o,--output", dir,
                  "the folder for the store and the report (default: beside the first pickle, named after it, "
                  "NAME.memsnap/)");
  cmd->add_option("--template", o.name_template,
                  "rank and batch from each file name (a single file that does not fit it is rank 0, its batches counted from 1)")
      ->capture_default_str();
  cmd->add_option("--rank", rank, "rank of a single file (with --batch)")->check(whole_number(0, 1 << 24));
  cmd->add_option("--batch", batch, "batch of a single file (with --rank)")->check(whole_number(0));
  cmd->add_option("--interval", o.interval, "batches each snapshot spans, when known (as memsnap import --interval)")
      ->check(whole_number(1, 100000, "batches"));
  cmd->add_flag("--overwrite", o.overwrite, "replace the store and report an earlier memsnap view wrote in the folder");
  cmd->add_flag("--keep-going", o.keep_going, "show what can be read; leave out, and name, the pickles that are bad");
  cmd->add_option("--max-bands", max_bands, "allocations drawn one by one per page; the rest are summed")
      ->check(CLI::Range(100, 1000000));
  cmd->footer("Example:\n  memsnap view rank0.3.pt.trace.memory_snapshot.pickle\n"
              "  (writes rank0.3.pt.trace.memory_snapshot.memsnap/ beside it and prints the page to open)\n");
  cmd->callback([&code] {
    // Import and report each open MPI for themselves; held here, it stays open from one to the other.
    std::unique_ptr<mpi::World> world;
    try {
      world = std::make_unique<mpi::World>();
    } catch (const std::exception& e) {
      std::cerr << kVerb << ": " << e.what() << "\n";
      code = 1;
      return;
    }
    const bool root = world->comm.rank() == 0;
    const bool chatty = root && isatty(STDERR_FILENO) != 0;
    auto fail = [&](const std::string& line) {
      if (root) std::cerr << kVerb << ": " << line << "\n";
      code = 1;
    };
    const fs::path first_given = o.pickles.front();
    try {
      o.pickles = expand_pickle_paths(o.pickles);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    if (rank >= 0) o.rank = rank;
    if (batch >= 0) o.batch = batch;
    // A single snapshot needs no name: one that does not fit the template is rank 0, its batches
    // counted from 1 (batch -1: the importer names the window after its last batch).
    if (o.pickles.size() == 1 && !o.rank && !o.batch &&
        !parse_rank_batch(o.pickles.front().filename().string(), o.name_template)) {
      o.rank = 0;
      o.batch = -1;
    }
    const fs::path folder = dir.empty() ? default_folder(first_given) : dir;
    o.output = folder / kDefaultStoreName;
    o.verb = kVerb;
    o.suggest_report = false;
    o.run_name = folder.filename().string();
    if (o.run_name.size() > 8 && o.run_name.ends_with(".memsnap")) o.run_name.resize(o.run_name.size() - 8);

    std::string refusal;
    bool created = false;
    if (root) {
      refusal = folder_refusal(folder, o.output, o.overwrite);
      std::error_code ec;
      if (refusal.empty() && !fs::exists(folder, ec)) {
        created = fs::create_directories(folder, ec);
        if (ec) refusal = folder.string() + ": cannot create the folder: " + ec.message();
      }
    }
    try {
      if (const std::string first = mpi::agree_on_error(world->comm, refusal); !first.empty()) return fail(first);
    } catch (const std::exception& e) {
      return fail(e.what());
    }

    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&t0] {
      return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0).count());
    };
    if (chatty) {
      std::uintmax_t bytes = 0;
      for (const auto& p : o.pickles) {
        std::error_code ec;
        const auto n = fs::file_size(p, ec);
        if (!ec) bytes += n;
      }
      std::cerr << kVerb << ": reading " << o.pickles.size() << " snapshot" << (o.pickles.size() == 1 ? "" : "s")
                << " (" << human_bytes(bytes) << ") into " << o.output.string() << "\n";
    }
    code = import_main(o);
    if (code != 0) {
      // Nothing is left behind: a folder made for this view goes again (import wrote nothing in it).
      std::error_code ec;
      if (root && created) fs::remove_all(folder, ec);
      return;
    }
    if (chatty) std::cerr << kVerb << ": read in " << seconds() << " s; writing the report\n";
    ReportOptions ro;
    ro.store = o.output;
    ro.out_dir = folder / kReportDir;
    ro.overwrite = o.overwrite;
    ro.max_bands = max_bands;
    ro.upload = false;
    code = report_main(ro);
    if (code == 0 && root) std::cout << kVerb << ": open " << fs::absolute(ro.out_dir / "index.html").string() << "\n";
  });
}

}  // namespace memsnap::cli
