// Fuzz target: name templates and the rule that a formatted name never leaves its folder.
// Input: flags byte, 6 ints, then NUL-separated template, run name, relative name, folder, timestamp.
#include <cstdint>
#include <filesystem>

#include "fuzz_common.hpp"
#include "memsnap/names.hpp"

namespace {

constexpr const char* kTarget = "fuzz_names";

// folder / rel, normalised, still under folder.
bool stays_inside(const std::filesystem::path& folder, const std::filesystem::path& joined) {
  const auto rel = joined.lexically_normal().lexically_relative(folder.lexically_normal());
  if (rel.empty()) return false;
  const auto first = *rel.begin();
  return first != ".." && !rel.is_absolute();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memsnap;
  fuzz::Bytes in(data, size);
  const std::uint8_t flags = in.byte();
  NameVars vars;
  vars.rank = in.get<std::int32_t>();
  vars.local_rank = in.get<std::int32_t>();
  vars.world_size = in.get<std::int32_t>();
  vars.local_world_size = in.get<std::int32_t>();
  vars.node_rank = in.get<std::int32_t>();
  const std::int64_t batch = in.get<std::int64_t>();
  if (flags & 1) vars.batch = batch;
  const std::string tmpl = in.until_nul();
  vars.run_name = in.until_nul();
  const std::string relative = in.until_nul();
  std::string folder = in.until_nul();
  if (folder.empty()) folder = "run";
  vars.timestamp = in.until_nul();

  fuzz::run_guarded(kTarget, [&] {
    // A template that passes the check formats without error (config load checks, the recorder
    // formats later, where an error could no longer be reported as a config error).
    bool ok = true;
    try {
      check_template(tmpl, vars.batch.has_value(), "filename");
    } catch (const NameError&) {
      ok = false;
    }
    std::string formatted;
    try {
      formatted = format_name(tmpl, vars);
    } catch (const NameError& e) {
      MEMSNAP_FUZZ_CHECK(kTarget, !ok, std::string("check_template accepted '") + tmpl + "' but format_name failed: " + e.what());
    }

    // A run name that passes is one path component.
    bool run_ok = true;
    try {
      check_run_name(vars.run_name);
    } catch (const NameError&) {
      run_ok = false;
    }
    if (run_ok) {
      const std::filesystem::path p(vars.run_name);
      std::size_t parts = 0;
      for (const auto& part : p) {
        (void)part;
        ++parts;
      }
      MEMSNAP_FUZZ_CHECK(kTarget, parts == 1 && p.is_relative() && vars.run_name != "." && vars.run_name != "..",
                         "run name '" + vars.run_name + "' is not one path component");
      try {
        const auto joined = join_inside(folder, vars.run_name);
        MEMSNAP_FUZZ_CHECK(kTarget, stays_inside(folder, joined), "run name escapes: " + joined.string());
      } catch (const NameError& e) {
        fuzz::finding(kTarget, "a valid run name refused by join_inside: " + std::string(e.what()));
      }
    }

    // join_inside never returns a path outside its folder, for the raw name and the formatted one.
    for (const std::string* rel : {&relative, static_cast<const std::string*>(&formatted)}) {
      try {
        const auto joined = join_inside(folder, *rel);
        MEMSNAP_FUZZ_CHECK(kTarget, stays_inside(folder, joined),
                           "join_inside('" + folder + "', '" + *rel + "') = '" + joined.string() + "' leaves the folder");
      } catch (const NameError&) {
      }
    }
  });
  return 0;
}
