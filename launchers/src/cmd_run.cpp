#include "commands.hpp"
#include "run.hpp"

namespace memsnap::cli {

void add_run(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand(
      "run", "Run one rank's training command recorded by memsnap (under mpirun, srun or torchrun), then gather and report");
  static RunOptions o;
  cmd->add_option("--config", o.config, "memsnap config, JSON or YAML (default: $MEMSNAP_CONFIG)");
  cmd->add_flag("--no-aggregate", o.no_aggregate, "only record; print the commands that gather and report");
  cmd->add_flag("--aggregate-when-done", o.aggregate_when_done,
                "without MPI (torchrun): rank 0 waits for every rank, then gathers and reports alone");
  static bool no_cupti = false;
  cmd->add_flag("--no-cupti", no_cupti,
                "do not inject the CUPTI library (CUPTI takes one client: torch.profiler, Nsight and "
                "compute-sanitizer need it for themselves)");
  static bool no_torch = false;
  cmd->add_flag("--no-torch", no_torch,
                "do not attach to PyTorch's allocator in Python jobs (the same as torch_attachment: false)");
  cmd->add_option("--wait", o.wait_seconds, "seconds rank 0 waits for the other ranks (default 600)")->check(CLI::NonNegativeNumber);
  cmd->add_option("command", o.command, "the command and its arguments, after --")->required();
  cmd->prefix_command();  // everything after the options belongs to the command
  cmd->callback([&code] {
    std::error_code ec;
    o.self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    o.cupti = !no_cupti;
    o.torch = !no_torch;
    int ended_by = 0;
    code = run_main(o, &ended_by);
    if (ended_by != 0) end_by_signal(ended_by);
  });
}

}  // namespace memsnap::cli
