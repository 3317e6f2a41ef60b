#include "commands.hpp"

#include <unistd.h>

#include <iostream>

#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/report.hpp"

namespace memsnap::cli {
namespace {
int g_code = 0;
}

int exit_code() { return g_code; }

void add_commands(CLI::App& app) {
  add_run(app, g_code);
  add_aggregate(app, g_code);
  add_import(app, g_code);
  add_report(app, g_code);
  add_info(app, g_code);
  add_export(app, g_code);
}

void add_info(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("info", "Summarise a spill folder (RUN_DIR) or a store (.h5): per rank and window");
  static std::string path;
  static bool json = false;
  cmd->add_option("PATH", path, "a run folder with spill files, or a store")->required();
  cmd->add_flag("--json", json, "print JSON (stable, versioned: format_version)");
  cmd->callback([&code] { code = info_main(path, json, std::cout); });
}

void add_aggregate(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("aggregate",
                                 "Gather every rank's spill into one HDF5 store (run serially or under mpirun -np M)");
  static AggregateOptions o;
  static std::string config;
  cmd->add_option("RUN_DIR", o.run_dir, "the run folder (holds spill/)")->required();
  cmd->add_option("-o,--output", o.output, "the store (default RUN_DIR/memsnap.h5)");
  cmd->add_option("--config", config, "memsnap config (its overwrite key applies to the store)");
  cmd->add_flag("--keep-going", o.keep_going, "write what can be written; mark missing, truncated and corrupt ranks");
  cmd->add_flag("--overwrite", o.overwrite, "replace an existing store");
  cmd->add_option("--top-sites", o.top_sites, "allocation sites kept per window")->check(CLI::Range(1, 100000));
  cmd->add_option("--threads", o.threads,
                  "compression threads per aggregator rank, on the CPUs mpirun bound it to (default: the node's "
                  "cores shared among its aggregator ranks, also past a one-core binding)")
      ->check(CLI::Range(1, 1024));
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
    code = aggregate_main(o);
  });
}

void add_report(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("report", "Render a store as HTML: index.html (cross-rank) and one page per rank and window");
  static ReportOptions o;
  static double fail = -1;
  cmd->add_option("STORE", o.store, "the store written by memsnap aggregate or import")->required();
  cmd->add_option("-o,--output", o.out_dir, "output folder (default: report/ beside the store)");
  cmd->add_option("--fail-on-imbalance", fail, "exit 3 when (max peak / median peak) - 1 is over X")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--overwrite", o.overwrite, "replace the pages of an earlier report in the folder");
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
