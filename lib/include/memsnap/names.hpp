// Name templates ({run_name}, {rank}, {batch}, ...) and the rule that a formatted name never
// leaves its output folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace memsnap {

class NameError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct NameVars {
  std::string run_name;
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  std::optional<std::int64_t> batch;  // unset: a template that uses {batch} is an error
  std::string timestamp;              // e.g. 20261202-143000
};

// Replaces {var}; "{{" and "}}" are literal braces. Unknown variables are errors.
std::string format_name(std::string_view tmpl, const NameVars& vars);

// Checks that a template uses only known variables (and {batch} only where allowed).
void check_template(std::string_view tmpl, bool batch_allowed, std::string_view key);

// A run name must be one path component: no '/', no "..", not empty, printable.
void check_run_name(std::string_view run_name);

// folder / relative, refusing a relative part that is absolute or climbs out with "..".
std::filesystem::path join_inside(const std::filesystem::path& folder, std::string_view relative);

// Current local time as YYYYmmdd-HHMMSS.
std::string timestamp_now();

}  // namespace memsnap
