// Fuzz target: the config file parser (JSON or YAML, Composer training YAMLs) and the key checks.
// read_config_file takes a path, so the bytes go into a memfd read back through /proc/self/fd/N.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "memsnap/config.hpp"
#include "memsnap/names.hpp"

namespace {

constexpr const char* kTarget = "fuzz_config";

// One memfd per process, rewritten for every input.
const std::string& config_path(const std::uint8_t* data, std::size_t size) {
  static int fd = -1;
  static std::string path;
  if (fd < 0) {
    fd = memfd_create("memsnap-fuzz-config", MFD_CLOEXEC);
    if (fd < 0) memsnap::fuzz::finding(kTarget, "memfd_create failed");
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  if (ftruncate(fd, 0) != 0) memsnap::fuzz::finding(kTarget, "ftruncate failed");
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) memsnap::fuzz::finding(kTarget, "pwrite failed");
    done += static_cast<std::size_t>(n);
  }
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memsnap;
  const std::string& path = config_path(data, size);
  fuzz::run_guarded(kTarget, [&] {
    Config c;
    try {
      const nlohmann::json j = read_config_file(path);
      c = config_from_json(j, Config{}, "fuzz.yaml");
    } catch (const ConfigError&) {
      return;  // one line naming the key and value: documented
    }
    // What was accepted round-trips through JSON unchanged (memsnap run hands the effective
    // config to its child this way).
    Config again;
    try {
      again = config_from_json(config_to_json(c), Config{}, "round trip");
    } catch (const ConfigError& e) {
      fuzz::finding(kTarget, std::string("an accepted config does not read back: ") + e.what());
    }
    MEMSNAP_FUZZ_CHECK(kTarget, again == c, config_to_json(c).dump());

    // Accepted templates format: folder without a batch, filename with one.
    NameVars vars;
    vars.run_name = c.run_name.empty() ? "memsnap" : c.run_name;
    vars.timestamp = "20260101-000000";
    try {
      const std::string folder = format_name(c.folder, vars);
      vars.batch = 4;
      const std::string file = format_name(c.filename, vars);
      if (!c.remote_file_name.empty()) (void)format_name(c.remote_file_name, vars);
      try {
        (void)join_inside(folder.empty() ? std::string(".") : folder, file);
      } catch (const NameError&) {
        // a filename that climbs out is refused when the page is written: documented
      }
    } catch (const NameError& e) {
      fuzz::finding(kTarget, std::string("an accepted template does not format: ") + e.what());
    }
  });
  return 0;
}
