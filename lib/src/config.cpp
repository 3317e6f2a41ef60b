// Configuration keys (one table: name, parser and check, dump), config files (JSON, YAML, training
// configs with a memsnap block) and MEMSNAP_<KEY> overrides.
#include "memsnap/config.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "log.hpp"
#include "memsnap/names.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

// A value as it appears in an error line: scalars as JSON (invalid UTF-8 replaced), containers
// by their kind only, so a hostile value can neither throw nor recurse here.
std::string show(const json& value) {
  std::string s;
  if (value.is_array()) {
    s = "a list of " + std::to_string(value.size());
  } else if (value.is_object()) {
    s = "a mapping of " + std::to_string(value.size()) + " keys";
  } else {
    s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

[[noreturn]] void bad(std::string_view origin, std::string_view key, const json& value,
                      std::string_view allowed) {
  throw ConfigError(std::string(origin) + ": key '" + std::string(key) + "' has value " +
                    show(value) + "; allowed: " + std::string(allowed));
}

std::int64_t as_int(const json& v, std::string_view key, std::string_view origin, std::int64_t lo,
                    std::int64_t hi, std::string_view allowed) {
  std::int64_t n = 0;
  if (v.is_number_integer()) {
    n = v.get<std::int64_t>();
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    char* end = nullptr;
    errno = 0;
    long long parsed = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0) bad(origin, key, v, allowed);
    n = parsed;
  } else {
    bad(origin, key, v, allowed);
  }
  if (n < lo || n > hi) bad(origin, key, v, allowed);
  return n;
}

bool as_bool(const json& v, std::string_view key, std::string_view origin) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  }
  if (v.is_number_integer() && (v.get<std::int64_t>() == 0 || v.get<std::int64_t>() == 1)) return v.get<std::int64_t>() == 1;
  bad(origin, key, v, "true or false");
}

std::string as_string(const json& v, std::string_view key, std::string_view origin,
                      bool allow_null = false) {
  if (v.is_string()) return v.get<std::string>();
  if (allow_null && v.is_null()) return {};
  bad(origin, key, v, allow_null ? "a string or null" : "a string");
}

// YAML text that is a plain number: digits by hand (std::regex recurses once per character,
// so a 50 KB scalar would overflow the stack).
bool is_integer_text(const std::string& s) {
  std::size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i == s.size() || s.size() > 20) return false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool is_real_text(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  const bool numeric = end == s.c_str() + s.size();
  // strtod also takes "inf", "nan" and hex floats; YAML configs mean strings by those.
  return numeric && s.find_first_of("xXnNiI") == std::string::npos;
}

constexpr int kMaxYamlDepth = 64;

json yaml_to_json(const YAML::Node& node, int depth = 0) {
  // Deep nesting, and aliases that contain themselves (`a: &x {b: *x}`), end here, not in a
  // stack overflow inside the training process.
  if (depth > kMaxYamlDepth) throw ConfigError("the configuration nests deeper than " + std::to_string(kMaxYamlDepth) + " levels");
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item, depth + 1));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = yaml_to_json(kv.second, depth + 1);
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return s;  // quoted in the file: keep it a string
      if (s == "null" || s == "~" || s == "Null" || s == "NULL") return nullptr;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      try {
        if (is_integer_text(s)) return std::stoll(s);
        if (is_real_text(s)) return std::stod(s);
      } catch (const std::out_of_range&) {
      }
      return s;
    }
  }
  return nullptr;
}

}  // namespace

std::int64_t parse_batches(const json& value, std::string_view key, std::string_view origin) {
  constexpr std::string_view allowed = "a whole number of batches, e.g. 3 or \"3ba\"";
  if (value.is_string()) {
    std::string s = value.get<std::string>();
    if (s.size() > 2 && s.ends_with("ba")) s.resize(s.size() - 2);
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0 || n < 0 || n > INT32_MAX) bad(origin, key, value, allowed);
    return n;
  }
  if (!value.is_number_integer()) bad(origin, key, value, allowed);
  return as_int(value, key, origin, 0, INT32_MAX, allowed);
}

namespace {

void check_template_key(const std::string& value, bool is_file, std::string_view key, std::string_view origin) {
  try {
    check_template(value, is_file, key);
  } catch (const NameError& e) {
    throw ConfigError(std::string(origin) + ": " + e.what());
  }
}

// The page name stays inside the report folder, whatever the variables hold.
bool climbs_out(const std::string& name) {
  std::string part;
  bool climbs = name.front() == '/';
  for (std::size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '/') {
      climbs |= part == "..";
      part.clear();
    } else {
      part += name[i];
    }
  }
  return climbs;
}

// std::regex compiles and matches recursively: a long or deeply nested pattern could overflow the
// stack of the training process. Real step names need neither.
void check_batch_marker(const std::string& marker, std::string_view key, const json& v, std::string_view origin) {
  int depth = 0, deepest = 0;
  for (char ch : marker) {
    depth += ch == '(' ? 1 : ch == ')' ? -1 : 0;
    deepest = std::max(deepest, depth);
  }
  if (marker.size() > 256 || deepest > 8) {
    bad(origin, key, v, "a regular expression of at most 256 characters and 8 nested groups");
  }
  std::string pattern = marker;
  std::regex::flag_type flags = std::regex::ECMAScript;
  if (pattern.rfind("(?i)", 0) == 0) {
    pattern = pattern.substr(4);
    flags |= std::regex::icase;
  }
  try {
    std::regex probe(pattern, flags);
  } catch (const std::regex_error&) {
    bad(origin, key, v, "a valid regular expression (ECMAScript; a leading (?i) ignores case)");
  }
}

constexpr std::pair<StackMode, const char*> kStackModes[] = {
    {StackMode::none, "none"}, {StackMode::native, "native"}, {StackMode::python, "python"}, {StackMode::all, "all"}};

// One configuration key: its name, how a value is checked and set on a Config, and how the
// Config's value is written back (config_to_json). Each key's default is its member initialiser in
// memsnap/config.hpp; config_to_json(Config{}) shows them all.
struct Key {
  std::string_view name;
  std::function<void(Config&, const json& v, std::string_view key, std::string_view origin)> parse;
  std::function<json(const Config&)> dump;
};

Key flag(std::string_view name, bool Config::*m) {
  return {name, [m](Config& c, const json& v, std::string_view key, std::string_view origin) { c.*m = as_bool(v, key, origin); },
          [m](const Config& c) { return json(c.*m); }};
}
Key batches(std::string_view name, std::int64_t Config::*m) {
  return {name, [m](Config& c, const json& v, std::string_view key, std::string_view origin) { c.*m = parse_batches(v, key, origin); },
          [m](const Config& c) { return json(c.*m); }};
}
Key whole(std::string_view name, std::int64_t Config::*m, std::int64_t lo, std::int64_t hi, std::string_view allowed) {
  return {name,
          [=](Config& c, const json& v, std::string_view key, std::string_view origin) {
            c.*m = as_int(v, key, origin, lo, hi, allowed);
          },
          [m](const Config& c) { return json(c.*m); }};
}
json text_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// The keys in documentation order (config_keys(), the MEMSNAP_<KEY> variables, "known keys").
const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      batches("skip_batches", &Config::skip_batches),
      {"interval",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.interval = parse_batches(v, key, origin);
         if (c.interval < 1) bad(origin, key, v, "at least 1 batch, e.g. 3 or \"3ba\"");
       },
       [](const Config& c) { return json(c.interval); }},
      whole("repeat", &Config::repeat, -1, INT32_MAX, "-1 (until the job ends), 0 (one window) or more"),
      {"folder",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.folder = as_string(v, key, origin);
         if (c.folder.empty()) bad(origin, key, v, "a non-empty folder path");
         check_template_key(c.folder, false, key, origin);
       },
       [](const Config& c) { return json(c.folder); }},
      {"filename",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.filename = as_string(v, key, origin);
         check_template_key(c.filename, true, key, origin);
         if (c.filename.empty()) bad(origin, key, v, "a non-empty file name template");
         if (climbs_out(c.filename)) bad(origin, key, v, "a name inside the report folder (no leading '/', no '..')");
       },
       [](const Config& c) { return json(c.filename); }},
      {"remote_file_name",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.remote_file_name = as_string(v, key, origin, true);
         if (!c.remote_file_name.empty()) check_template_key(c.remote_file_name, true, key, origin);
       },
       [](const Config& c) { return text_or_null(c.remote_file_name); }},
      flag("overwrite", &Config::overwrite),
      whole("max_entries", &Config::max_entries, 1, std::int64_t{1} << 32, "a whole number from 1 to 4294967296"),
      {"stacks",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         const std::string s = v.is_string() ? v.get<std::string>() : std::string("?");
         for (const auto& [mode, name] : kStackModes) {
           if (s == name) {
             c.stacks = mode;
             return;
           }
         }
         bad(origin, key, v, "\"none\", \"native\", \"python\" or \"all\"");
       },
       [](const Config& c) {
         for (const auto& [mode, name] : kStackModes) {
           if (c.stacks == mode) return json(name);
         }
         return json("none");
       }},
      whole("stack_depth", &Config::stack_depth, 1, 64, "a whole number from 1 to 64"),
      whole("stack_min_bytes", &Config::stack_min_bytes, 0, std::int64_t{1} << 50,
            "a byte count from 0 to 2^50, e.g. 1048576"),
      {"batch_marker",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.batch_marker = as_string(v, key, origin);
         check_batch_marker(c.batch_marker, key, v, origin);
       },
       [](const Config& c) { return json(c.batch_marker); }},
      flag("oom_snapshot", &Config::oom_snapshot),
      {"run_name",
       [](Config& c, const json& v, std::string_view key, std::string_view origin) {
         c.run_name = as_string(v, key, origin, true);
         try {
           if (!c.run_name.empty()) check_run_name(c.run_name);
         } catch (const NameError& e) {
           throw ConfigError(std::string(origin) + ": key 'run_name': " + e.what());
         }
       },
       [](const Config& c) { return json(c.run_name); }},
      flag("enabled", &Config::enabled),
      flag("torch_attachment", &Config::torch_attachment),
      flag("background_writes", &Config::background_writes),
  };
  return table;
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Key& k : keys()) out.emplace_back(k.name);
    return out;
  }();
  return names;
}

Config config_from_json(const json& object, const Config& base, std::string_view origin) {
  if (!object.is_object()) {
    throw ConfigError(std::string(origin) + ": the configuration must be a mapping of keys, not " +
                      show(object));
  }
  Config c = base;
  for (const auto& [key, v] : object.items()) {
    const auto& table = keys();
    const std::string& name = key;  // clang 14 cannot capture a structured binding
    const auto it = std::find_if(table.begin(), table.end(), [&](const Key& k) { return k.name == name; });
    if (it == table.end()) {
      std::string known;
      for (const auto& k : config_keys()) known += (known.empty() ? "" : ", ") + k;
      throw ConfigError(std::string(origin) + ": unknown key '" + key + "'; known keys: " + known);
    }
    it->parse(c, v, key, origin);
  }
  return c;
}

json config_to_json(const Config& c) {
  json out = json::object();
  for (const Key& k : keys()) out[std::string(k.name)] = k.dump(c);
  return out;
}

json read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the config file (" + std::strerror(errno) + ")");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  json root;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    try {
      root = json::parse(text);
    } catch (const json::parse_error& e) {
      throw ConfigError(path + ": not valid JSON: " + e.what());
    }
  } else {
    try {
      root = yaml_to_json(YAML::Load(text));
    } catch (const YAML::Exception& e) {
      throw ConfigError(path + ": not valid YAML (line " + std::to_string(e.mark.line + 1) +
                        "): " + e.msg);
    } catch (const ConfigError& e) {
      throw ConfigError(path + ": " + e.what());
    }
  }
  if (root.is_null()) return json::object();  // an empty file: all defaults
  if (!root.is_object()) throw ConfigError(path + ": the configuration must be a mapping of keys");

  // A training config (Composer / llm-foundry): take our block and the run's name.
  auto pick = [&](const json& block, const char* where) {
    if (!block.is_object()) {
      throw ConfigError(path + ": '" + where + "' must be a mapping of memsnap's keys");
    }
    json out = block;
    if (!out.contains("run_name") && root.contains("run_name") && root["run_name"].is_string()) {
      out["run_name"] = root["run_name"];
    }
    return out;
  };
  if (root.contains("callbacks") && root["callbacks"].is_object()) {
    const json& callbacks = root["callbacks"];
    if (callbacks.contains("memsnap")) return pick(callbacks["memsnap"], "callbacks.memsnap");
    if (callbacks.contains("memory_snapshot")) {
      json block = callbacks["memory_snapshot"].is_null() ? json::object() : callbacks["memory_snapshot"];
      return pick(block, "callbacks.memory_snapshot");
    }
    throw ConfigError(path + ": a training config without callbacks.memory_snapshot or callbacks.memsnap");
  }
  if (root.contains("memsnap")) return pick(root["memsnap"], "memsnap");
  return root;
}

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

bool disabled_by_environment(const EnvLookup& env) {
  const auto v = env("MEMSNAP_ENABLED");
  if (!v) return false;
  try {
    return !as_bool(json(*v), "enabled", "MEMSNAP_ENABLED");
  } catch (const ConfigError&) {
    return false;  // load_config names the bad value
  }
}

Config load_config(const std::string& path, const EnvLookup& env) {
  Config c;
  if (disabled_by_environment(env)) {
    c.enabled = false;
    return c;
  }
  std::string file = path;
  if (file.empty()) file = env("MEMSNAP_CONFIG").value_or("");
  if (!file.empty()) c = config_from_json(read_config_file(file), c, file);

  for (const auto& key : config_keys()) {
    std::string var = "MEMSNAP_";
    for (char ch : key) var += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    auto value = env(var.c_str());
    if (!value) continue;
    // Environment values are text; the key's parser converts ("3", "3ba", "true", "native").
    c = config_from_json(json{{key, *value}}, c, var);
  }
  return c;
}

}  // namespace memsnap

namespace memsnap {

std::optional<Config> recording_config(const std::string& path, const EnvLookup& env) noexcept {
  // One verdict per process: the CUPTI library and the PyTorch attachment both ask.
  static std::atomic<bool> said{false};
  try {
    if (disabled_by_environment(env)) {
      log::write(log::Level::debug, "not recording (MEMSNAP_ENABLED is false)");
      return std::nullopt;
    }
    Config config = load_config(path, env);
    if (!config.enabled) {
      log::once(said, log::Level::info, "disabled by the config (enabled: false)");
      return std::nullopt;
    }
    return config;
  } catch (const std::exception& e) {
    log::once(said, log::Level::warn, std::string(e.what()) + "; this process is not recorded, the job goes on");
  } catch (...) {
    log::once(said, log::Level::warn, "cannot read memsnap's configuration; this process is not recorded, the job goes on");
  }
  return std::nullopt;
}

}  // namespace memsnap
