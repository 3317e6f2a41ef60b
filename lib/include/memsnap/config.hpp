// memsnap's configuration: the keys of Composer's memory snapshot callback plus memsnap's own.
// One JSON or YAML file; MEMSNAP_<KEY> environment variables override single keys.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace memsnap {

// A bad configuration: what() is one line naming the key, the value and what is allowed.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which stacks are captured: none; native return addresses; the Python interpreter's frames (the
// PyTorch attachment only); or both, native frames first.
enum class StackMode { none, native, python, all };
inline bool wants_native(StackMode m) { return m == StackMode::native || m == StackMode::all; }
inline bool wants_python(StackMode m) { return m == StackMode::python || m == StackMode::all; }

struct Config {
  std::int64_t skip_batches = 1;    // batches before the first window
  std::int64_t interval = 3;        // batches per window
  std::int64_t repeat = 0;          // further windows after the first; -1: until the job ends
  std::string folder = "memsnap/{run_name}";  // the run folder: spills, store, report
  std::string filename = "rank{rank}.{batch}.pt.trace.memory_snapshot.html";
  std::string remote_file_name;     // empty: no upload
  bool overwrite = false;           // replace earlier outputs instead of refusing
  std::int64_t max_entries = 100000;  // events held in memory between two flushes
  StackMode stacks = StackMode::none;
  std::int64_t stack_depth = 24;    // frames kept per native stack (1..64)
  std::int64_t stack_min_bytes = 0; // stacks only for allocations of at least this size (0: every event)
  std::string batch_marker = "(?i)^(train[_ ./-]?)?(step|batch|iter(ation)?)([_ ./#:-]?[0-9]+)?$";
  bool oom_snapshot = true;         // write a flagged window when an allocation fails
  std::string run_name;             // empty: derived from the launcher's job id
  bool enabled = true;
  bool torch_attachment = true;     // `memsnap run`: attach to PyTorch's allocator where torch is imported
  bool background_writes = true;    // batch ends drained and written by memsnap's own thread, not the job's

  bool operator==(const Config&) const = default;
};

// The keys a config may hold, in documentation order.
const std::vector<std::string>& config_keys();

// Reads keys from a JSON object onto `base`. `origin` names the source in error lines
// ("memsnap.yaml", "MEMSNAP_INTERVAL"). Unknown keys are errors.
Config config_from_json(const nlohmann::json& object, const Config& base, std::string_view origin);
nlohmann::json config_to_json(const Config& config);

// Parses a config file (JSON or YAML, by content). A training YAML that holds
// `callbacks: {memory_snapshot: {...}}` (Composer, llm-foundry) or a top-level `memsnap:` block is
// accepted as is: only that block is read, plus the top-level `run_name`.
nlohmann::json read_config_file(const std::string& path);

using EnvLookup = std::function<std::optional<std::string>(const char*)>;
EnvLookup process_env();

// The effective configuration: defaults, then the file (`path`, or $MEMSNAP_CONFIG when empty),
// then MEMSNAP_<KEY> overrides. Throws ConfigError. MEMSNAP_ENABLED=false wins over everything:
// the file is not read then (it may be the bad file that made `memsnap run` turn recording off).
Config load_config(const std::string& path, const EnvLookup& env);

// True when MEMSNAP_ENABLED says false (false, 0, no, off): `memsnap run` passes it to a command
// it does not record (its config failed to load, the folder holds an earlier record, enabled: false).
bool disabled_by_environment(const EnvLookup& env);

// The configuration a recording source starts with (the CUPTI library, the PyTorch attachment,
// memsnap_init): std::nullopt when this process must not record. Quiet when MEMSNAP_ENABLED is
// false (whoever set it has said why); otherwise a config that does not load, or enabled: false,
// gives one line per process, however many sources ask. Never falls back to the defaults.
std::optional<Config> recording_config(const std::string& path, const EnvLookup& env) noexcept;

// Composer time strings: 3, "3", "3ba" are 3 batches. Throws ConfigError for other units.
std::int64_t parse_batches(const nlohmann::json& value, std::string_view key, std::string_view origin);

}  // namespace memsnap
