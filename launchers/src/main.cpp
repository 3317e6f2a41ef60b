// memsnap: one binary, one subcommand per pipeline stage.
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <iostream>
#include <regex>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "memsnap/version.hpp"

namespace {

/// CLI11's range message in words: "Value -1 not in range 0.000000 to 1797...(309 digits).000000"
/// reads "-1 is not allowed: give a number of 0 or more".
std::string in_words(std::string message) {
  static const std::regex range(R"(Value (\S+) not in range (\S+) to (\S+))");
  std::smatch m;
  if (!std::regex_search(message, m, range)) return message;
  auto number = [](std::string text) {
    if (const auto dot = text.find('.'); dot != std::string::npos && text.find_first_not_of('0', dot + 1) == std::string::npos) {
      text.erase(dot);
    }
    return text;
  };
  const std::string lo = number(m[2].str()), hi = number(m[3].str());
  const std::string allowed = hi.size() > 15 ? lo + " or more" : "from " + lo + " to " + hi;
  return message.replace(static_cast<std::size_t>(m.position(0)), static_cast<std::size_t>(m.length(0)),
                         m[1].str() + " is not allowed: give a number " + (hi.size() > 15 ? "of " : "") + allowed);
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Buffers of 1 MiB and more come from the system and go back to it when freed. glibc's sliding
  // threshold would rise to the size of the first big buffer freed (an import's memo offsets:
  // the pickle's size, when under 32 MiB) and keep later buffers up to that size in the heap, not
  // given back between a command's phases: 13 MiB more peak RSS importing a 26.6 MB snapshot.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
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
    // One line naming what is wrong, and the subcommand's --help for the rest.
    std::string help = "memsnap --help";
    for (const CLI::App* sub : app.get_subcommands()) help = "memsnap " + sub->get_name() + " --help";
    std::cerr << "memsnap: " << in_words(e.what()) << " (see " << help << ")\n";
    return 2;
  }
  return memsnap::cli::exit_code();
}
