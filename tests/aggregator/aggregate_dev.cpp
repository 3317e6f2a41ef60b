// memsnap_aggregate_dev: a stand-in for the `memsnap aggregate` and `memsnap info` subcommands,
// with the same arguments, so the aggregator's tests run before (and without) the real CLI.
//
//   memsnap_aggregate_dev aggregate [-o STORE] [--keep-going] [--overwrite] [--progress] RUN_DIR
//   memsnap_aggregate_dev info PATH [--json]
#include <cstring>
#include <iostream>
#include <string>

#include "memsnap/aggregate.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " aggregate [-o STORE] [--keep-going] [--overwrite] [--progress] RUN_DIR\n"
              << "       " << argv[0] << " info PATH [--json]\n";
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "info") {
    bool json = false;
    std::string path;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--json") == 0) {
        json = true;
      } else {
        path = argv[i];
      }
    }
    return memsnap::info_main(path, json, std::cout);
  }
  if (cmd != "aggregate") {
    std::cerr << argv[0] << ": unknown command " << cmd << "\n";
    return 2;
  }
  memsnap::AggregateOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-o" && i + 1 < argc) {
      o.output = argv[++i];
    } else if (a == "--keep-going") {
      o.keep_going = true;
    } else if (a == "--overwrite") {
      o.overwrite = true;
    } else if (a == "--progress") {
      o.progress = true;
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << argv[0] << ": unknown option " << a << "\n";
      return 2;
    } else {
      o.run_dir = a;
    }
  }
  return memsnap::aggregate_main(o);
}
