#include "commands.hpp"

#include "cli_checks.hpp"

#include <unistd.h>

#include <iostream>

#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/report.hpp"

namespace memsnap::cli {
namespace {
int g_code = 0;

/// "1 rank", "4 ranks".
std::string count(std::size_t n, const std::string& thing) {
  return std::to_string(n) + " " + thing + (n == 1 ? "" : "s");
}
}  // namespace

int exit_code() { return g_code; }

void add_commands(CLI::App& app) {
  add_run(app, g_code);
  add_aggregate(app, g_code);
  add_import(app, g_code);
  add_view(app, g_code);
  add_report(app, g_code);
  add_info(app, g_code);
  add_export(app, g_code);
  add_diff(app, g_code);
  // run and report register their options in files of their own; their examples are here, with the rest.
  if (CLI::App* report = app.get_subcommand("report")) {
    report->footer("Example:\n  memsnap report RUN_DIR/memsnap.h5   (then open RUN_DIR/report/index.html)\n");
    if (CLI::Option* bands = report->get_option_no_throw("--max-bands")) bands->capture_default_str();
  }
  // The offline commands leave none of their temporaries when interrupted (Ctrl-C, mpirun's
  // SIGTERM): taken before any of them starts MPI or a thread. `run` forwards signals to its
  // command while it runs, and takes them so once it has ended (run.cpp).
  for (CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() != "run") sub->preparse_callback([](std::size_t) { interrupt::remove_temporaries_on_signal(); });
  }
  if (CLI::App* run = app.get_subcommand("run")) {
    run->footer("Example:\n  mpirun -np 8 memsnap run --config memsnap.yaml -- python train.py\n"
                "  (records into memsnap/{run_name}/, then gathers the store and writes the report there)\n");
  }
}

void add_info(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("info", "Summarise a spill folder (RUN_DIR) or a store (.h5): per rank and window");
  static std::string path;
  static bool json = false;
  cmd->add_option("PATH", path, "a run folder with spill files, or a store")->required();
  cmd->add_flag("--json", json, "print JSON (stable, versioned: format_version)");
  cmd->footer("Example:\n  memsnap info RUN_DIR/memsnap.h5 --json\n");
  cmd->callback([&code] { code = info_main(path, json, std::cout); });
}

void add_aggregate(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("aggregate",
                                 "Gather every rank's spill into one HDF5 store (run serially or under mpirun -np M)");
  static AggregateOptions o;
  static AggregateDone done;
  static std::string config;
  cmd->add_option("RUN_DIR", o.run_dir, "the run folder (holds spill/)")->required();
  cmd->add_option("-o,--output", o.output, "the store (default RUN_DIR/memsnap.h5)");
  cmd->add_option("--config", config, "memsnap config (its overwrite key applies to the store)");
  cmd->add_flag("--keep-going", o.keep_going, "write what can be written; mark missing, truncated and corrupt ranks");
  cmd->add_flag("--overwrite", o.overwrite,
                "replace a store memsnap wrote earlier (never a folder or a file it did not write)");
  cmd->add_option("--launch", o.launch,
                  "the launch whose records make the store, when RUN_DIR holds several (default: the newest; "
                  "memsnap names them)");
  cmd->add_option("--top-sites", o.top_sites, "allocation sites kept per window")
      ->check(whole_number(1, 100000, "sites"))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads,
                  "compression threads per aggregator rank, on the CPUs mpirun bound it to (default: the node's "
                  "cores shared among its aggregator ranks, also past a one-core binding)")
      ->check(whole_number(1, 1024, "threads"));
  cmd->footer("Example:\n  mpirun -np 4 memsnap aggregate RUN_DIR && memsnap report RUN_DIR/memsnap.h5\n");
  cmd->callback([&code] {
    o.progress = isatty(STDERR_FILENO) != 0;
    if (!config.empty()) {
      try {
        if (load_config(config, process_env()).overwrite) o.overwrite = true;
      } catch (const ConfigError& e) {
        std::cerr << "memsnap aggregate: " << e.what() << "\n";
        code = 2;
        return;
      }
    }
    o.done = &done;
    code = aggregate_main(o);
    if (code == 0 && done.filled) {
      const std::string store = (o.output.empty() ? o.run_dir / kDefaultStoreName : o.output).string();
      std::cout << "memsnap aggregate: " << count(done.ranks, "rank") << ", " << count(done.windows, "window");
      if (done.marked > 0) std::cout << " (" << count(done.marked, "rank") << " marked: memsnap info " << store << ")";
      std::cout << " -> " << store << "\n  next: memsnap report " << store << "\n";
    }
  });
}

void add_report(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("report", "Render a store as HTML: index.html (cross-rank) and one page per rank and window");
  static ReportOptions o;
  static double fail = -1;
  cmd->add_option("STORE", o.store, "the store written by memsnap aggregate or import")->required();
  cmd->add_option("-o,--output", o.out_dir, "output folder (default: report/ beside the store)");
  cmd->add_option("--fail-on-imbalance", fail, "exit 3 when (max peak / median peak) - 1 is over X")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--overwrite", o.overwrite, "replace an earlier memsnap report in the folder (one with its .memsnap-report marker; a folder of other files is refused) and remove its pages this report lacks");
  static bool no_upload = false;
  cmd->add_flag("--no-upload", no_upload, "do not upload to the config's remote_file_name");
  cmd->add_option("--max-bands", o.max_bands, "allocations drawn one by one per page; the rest are summed")->check(CLI::Range(100, 1000000));
  cmd->callback([&code] {
    if (fail >= 0) o.fail_on_imbalance = fail;
    o.upload = !no_upload;
    code = report_main(o);
  });
}

}  // namespace memsnap::cli
