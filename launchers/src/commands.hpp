// The subcommands of the memsnap binary. Each registers its options and runs from its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace memsnap::cli {

void add_commands(CLI::App& app);
int exit_code();  // of the subcommand that ran

void add_info(CLI::App& app, int& code);
void add_aggregate(CLI::App& app, int& code);
void add_report(CLI::App& app, int& code);
void add_import(CLI::App& app, int& code);
void add_export(CLI::App& app, int& code);
void add_run(CLI::App& app, int& code);
void add_diff(CLI::App& app, int& code);
void add_view(CLI::App& app, int& code);

}  // namespace memsnap::cli
