// `memsnap diff BASE NEW [-o DIR] [--fail-on-growth X]`: what changed between two runs (or two
// windows of one run, `STORE --rank R --batch B` on either side), on every rank, at which line.
#include <glob.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_checks.hpp"
#include "commands.hpp"
#include "memsnap/diff.hpp"
#include "memsnap/diff_pages.hpp"
#include "memsnap/import_export.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/store.hpp"

namespace memsnap::cli {
namespace {

namespace fs = std::filesystem;

struct SideArg {
  std::string text;
  std::optional<int> rank;
  std::optional<std::int64_t> batch;
};

// A folder made for pickles imported on the fly, removed with everything in it at the end.
struct TempFolder {
  fs::path path;
  interrupt::Temporary guard;  // and if the command is interrupted
  TempFolder() {
    std::string t = (fs::temp_directory_path() / "memsnap-diff-XXXXXX").string();
    if (mkdtemp(t.data()) == nullptr) throw Error("cannot make a temporary folder in " + fs::temp_directory_path().string());
    path = t;
    guard = interrupt::Temporary(path);
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
};

bool starts_with_bytes(const fs::path& p, std::string_view magic) {
  std::ifstream in(p, std::ios::binary);
  std::string head(magic.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in.gcount() == static_cast<std::streamsize>(magic.size()) && head == magic;
}
bool is_hdf5(const fs::path& p) { return starts_with_bytes(p, "\x89HDF\r\n\x1a\n"); }
bool is_pickle(const fs::path& p) { return starts_with_bytes(p, "\x80"); }

// What a side names: a store, a run folder holding memsnap.h5, pickles (a file, a folder of them,
// or a quoted glob). Pickles are imported into a store in `temp`. Throws Error in one line.
fs::path resolve_store(const std::string& text, std::vector<std::unique_ptr<TempFolder>>& temps) {
  std::vector<fs::path> pickles;
  std::error_code ec;
  const fs::path p(text);
  if (text.find_first_of("*?[") != std::string::npos && !fs::exists(p, ec)) {
    glob_t g{};
    if (glob(text.c_str(), 0, nullptr, &g) == 0)
      for (std::size_t i = 0; i < g.gl_pathc; ++i) pickles.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    if (pickles.empty()) throw Error(text + ": no file matches");
  } else if (fs::is_directory(p, ec)) {
    if (fs::is_regular_file(p / kDefaultStoreName, ec)) return p / kDefaultStoreName;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.is_regular_file() && is_pickle(e.path())) pickles.push_back(e.path());
    std::sort(pickles.begin(), pickles.end());
    if (pickles.empty())
      throw Error(text + ": a folder without " + kDefaultStoreName + " and without torch snapshot pickles (give a store, a run folder or pickles)");
  } else if (fs::is_regular_file(p, ec)) {
    if (is_hdf5(p)) return p;
    if (!is_pickle(p)) throw Error(text + ": neither a memsnap store (HDF5) nor a torch snapshot pickle");
    pickles.push_back(p);
  } else {
    throw Error(text + ": no such file or folder");
  }
  auto temp = std::make_unique<TempFolder>();
  ImportCliOptions o;
  o.pickles = pickles;
  o.output = temp->path / "import.h5";
  o.run_name = p.filename().string();
  // import speaks for itself on stdout; here only its errors (stderr) are of use.
  std::ostringstream quiet;
  auto* old = std::cout.rdbuf(quiet.rdbuf());
  const int rc = import_main(o);
  std::cout.rdbuf(old);
  if (rc != 0) throw Error(text + ": the pickles could not be imported (above)");
  const fs::path store = o.output;
  temps.push_back(std::move(temp));
  return store;
}

}  // namespace

void add_diff(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("diff", "Compare two runs (stores, run folders or torch pickles), or two windows of one "
                                         "run: what changed in memory, on every rank, at which line");
  static std::vector<std::string> args;
  static std::string out = "memsnap-diff";
  static double fail = -1;
  static bool overwrite = false;
  static bool quiet = false;
  cmd->add_option("-o,--output", out, "output folder: index.html, a page per rank that changed, diff.json")->capture_default_str();
  cmd->add_option("--fail-on-growth", fail,
                  "exit 3 when a rank's peak allocated grew by more than the fraction X (0.1 = 10%) beyond noise")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--overwrite", overwrite, "replace an earlier memsnap diff in the folder (its .memsnap-diff marker)");
  cmd->add_flag("--quiet", quiet, "print only the headline (and the --fail-on-growth line)");
  // BASE and NEW, each perhaps followed by --rank R --batch B, are read below in order (CLI11 would
  // take them apart): everything from the first side on is passed through untouched.
  cmd->prefix_command();
  cmd->allow_extras();
  cmd->footer("BASE, NEW: stores, run folders (memsnap.h5 inside) or torch pickles (a file, a folder of them, a quoted\n"
              "  glob); either may be followed by --rank R --batch B to take one window of it.\n"
              "Examples:\n  memsnap diff runs/before runs/after -o diff && open diff/index.html\n"
              "  memsnap diff base.h5 new.h5 --fail-on-growth 0.05      (a CI gate: exit 3 when a rank grew > 5%)\n"
              "  memsnap diff run.h5 --rank 0 --batch 4 run.h5 --rank 0 --batch 40   (two windows of one run)\n");
  cmd->callback([&code, cmd] {
    args = cmd->remaining();
    std::vector<SideArg> sides;
    auto need = [&](std::size_t i, const std::string& opt) -> const std::string& {
      if (i + 1 >= args.size()) throw Error(opt + " needs a value");
      return args[i + 1];
    };
    try {
      for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto number = [&](const std::string& opt) {
          const std::string& v = need(i, opt);
          char* end = nullptr;
          const long long n = std::strtoll(v.c_str(), &end, 10);
          if (v.empty() || *end != '\0' || n < 0) throw Error(opt + ": '" + v + "' is not allowed: give a whole number of 0 or more");
          ++i;
          return static_cast<std::int64_t>(n);
        };
        if (a == "--rank" || a == "--batch") {
          if (sides.empty()) throw Error(a + " follows the side it narrows: STORE --rank R --batch B");
          if (a == "--rank") sides.back().rank = static_cast<int>(number(a));
          else sides.back().batch = number(a);
        } else if (a == "-o" || a == "--output") {
          out = need(i, a), ++i;
        } else if (a == "--fail-on-growth") {
          const std::string& v = need(i, a);
          char* end = nullptr;
          fail = std::strtod(v.c_str(), &end);
          if (v.empty() || *end != '\0' || !(fail >= 0)) throw Error("--fail-on-growth: '" + v + "' is not allowed: give a fraction of 0 or more (0.1 = 10%)");
          ++i;
        } else if (a == "--overwrite") {
          overwrite = true;
        } else if (a == "--quiet") {
          quiet = true;
        } else if (a.size() > 1 && a[0] == '-' && !fs::exists(a)) {
          throw Error("unknown option " + a);
        } else {
          sides.push_back({a, {}, {}});
        }
      }
      if (sides.size() != 2) throw Error("give two sides, BASE and NEW (got " + std::to_string(sides.size()) + ")");
      for (const auto& s : sides)
        if (s.rank.has_value() != s.batch.has_value()) throw Error(s.text + ": --rank and --batch go together (one window of the run)");
    } catch (const std::exception& e) {
      std::cerr << "memsnap diff: " << e.what() << " (see memsnap diff --help)\n";
      code = 2;
      return;
    }

    std::unique_ptr<mpi::World> world;  // held for both imports: MPI starts once and ends at the end
    std::vector<std::unique_ptr<TempFolder>> temps;
    try {
      world = std::make_unique<mpi::World>();
      std::vector<diff::SideData> data;
      for (const auto& s : sides) {
        diff::SideSpec spec;
        spec.store = resolve_store(s.text, temps);
        spec.label = s.text;
        if (s.rank) spec.label += " rank " + std::to_string(*s.rank) + " batch " + std::to_string(*s.batch);
        spec.rank = s.rank;
        spec.batch = s.batch;
        data.push_back(diff::load_side(spec));
      }
      diff::DiffOptions options;
      if (fail >= 0) options.fail_on_growth = fail;
      diff::DiffResult result = diff::compare(data[0], data[1], options);
      diff::add_stacks(result, data[0], data[1]);
      data.clear();
      std::size_t pages = 0;
      if (std::string err = write_diff_output(result, out, overwrite, &pages); !err.empty()) {
        std::cerr << "memsnap diff: " << err << "\n";
        code = 1;
        return;
      }
      const auto lines = diff::summary_lines(result);
      std::cout << "memsnap diff: " << lines.front() << "\n";
      if (!quiet)
        for (std::size_t i = 1; i < lines.size(); ++i) std::cout << lines[i] << "\n";
      const fs::path dir(out);
      std::cout << "  open " << (dir / "index.html").string() << " (" << pages << (pages == 1 ? " rank page" : " rank pages")
                << ", diff.json)\n";
      code = 0;
      if (result.growth_failed) {
        std::cout << "memsnap diff: " << result.growth_line << "\n";
        code = 3;
      }
    } catch (const std::exception& e) {
      std::cerr << "memsnap diff: " << e.what() << "\n";
      code = 1;
    }
  });
}

}  // namespace memsnap::cli
