// memsnap: one binary, one subcommand per pipeline stage.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "memsnap/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"memsnap: where the GPU memory went, on every rank.\n"
               "  record:  mpirun -np N memsnap run [--config F] -- CMD ARGS...\n"
               "  gather:  mpirun -np M memsnap aggregate RUN_DIR\n"
               "  look:    memsnap report RUN_DIR/memsnap.h5   (then open RUN_DIR/report/index.html)",
               "memsnap"};
  app.set_version_flag("--version", memsnap::kVersion);
  app.require_subcommand(1);
  memsnap::cli::add_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line naming what is wrong; --help has the rest.
    std::cerr << "memsnap: " << e.what() << " (see memsnap --help)\n";
    return 2;
  }
  return memsnap::cli::exit_code();
}
