#include "cli_checks.hpp"
#include "commands.hpp"
#include "memsnap/import_export.hpp"

namespace memsnap::cli {

void add_import(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("import", "Import PyTorch memory snapshot pickles (torch.cuda.memory._dump_snapshot, "
                                           "Composer's MemorySnapshot/OOMObserver) into a store");
  static ImportCliOptions o;
  static int rank = -1;
  static std::int64_t batch = -1;
  cmd->add_option("PICKLES", o.pickles, "snapshot files, or folders of them (their *.pickle and *.pkl files)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("-o,--output", o.output, "the store to write")->required();
  cmd->add_option("--template", o.name_template, "rank and batch from each file name")->capture_default_str();
  cmd->add_option("--rank", rank, "rank of a single file (with --batch)")->check(whole_number(0, 1 << 24));
  cmd->add_option("--batch", batch, "batch of a single file (with --rank)")->check(whole_number(0));
  cmd->add_option("--world-size", o.world_size, "ranks in the job (default: highest rank + 1)")
      ->check(whole_number(1, 1 << 24, "ranks"));
  cmd->add_option("--interval", o.interval,
                  "batches each snapshot spans (the recording's interval); helps find batch boundaries in a trace "
                  "without step marks (default: the distance between a rank's snapshots, else found from the trace)")
      ->check(whole_number(1, 100000, "batches"));
  cmd->add_option("--config", o.config,
                  "the recording's config (memsnap's, or a training YAML with callbacks: memory_snapshot:): its "
                  "interval is the windows' batch count, as --interval")
      ->check(CLI::ExistingFile);
  cmd->add_option("--run-name", o.run_name, "run name in the store");
  cmd->add_flag("--overwrite", o.overwrite,
                "replace a store memsnap wrote earlier (never a folder or a file it did not write)");
  cmd->add_flag("--keep-going", o.keep_going, "store what can be read; leave out, and name, the pickles that are bad");
  cmd->add_option("--threads", o.threads,
                   "pickles read at once in this process (default: its CPUs, shared among the memsnap ranks on the "
                   "node, as far as memory allows)")
      ->check(whole_number(1, 1024, "threads"));
  cmd->footer("Example:\n  memsnap import rank*.pickle -o run.h5 && memsnap report run.h5\n"
              "  (rank and batch from Composer's names rank{rank}.{batch}...; one window per pickle)\n");
  cmd->callback([&code] {
    if (rank >= 0) o.rank = rank;
    if (batch >= 0) o.batch = batch;
    code = import_main(o);
  });
}

void add_export(CLI::App& app, int& code) {
  auto* cmd = app.add_subcommand("export", "Write one stored window as a torch snapshot pickle or a Chrome trace");
  static ExportCliOptions o;
  cmd->add_option("STORE", o.store, "the store")->required();
  cmd->add_option("--rank", o.rank, "rank")->required()->check(whole_number(0, 1 << 24));
  cmd->add_option("--batch", o.batch, "the window, named by its last batch (memsnap info STORE lists them)")->required();
  cmd->add_option("--format", o.format, "torch (pickle for PyTorch's memory viewer) or chrome (Perfetto JSON)")
      ->check(CLI::IsMember({"torch", "chrome"}))
      ->capture_default_str();
  cmd->add_option("-o,--output", o.output, "file to write")->required();
  cmd->add_flag("--overwrite", o.overwrite, "replace a file memsnap exported earlier (never another file or a folder)");
  cmd->footer("Example:\n  memsnap export run.h5 --rank 0 --batch 7 --format torch -o rank0.7.pickle\n"
              "  (then drop it on https://pytorch.org/memory_viz)\n");
  cmd->callback([&code] { code = export_main(o); });
}

}  // namespace memsnap::cli
