#include "memsnap/config.hpp"

#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <cstring>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

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

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = {
      "skip_batches", "interval",     "repeat",       "folder",     "filename",
      "remote_file_name", "overwrite", "max_entries", "stacks",     "stack_depth",
      "stack_min_bytes", "batch_marker", "oom_snapshot", "run_name", "enabled", "torch_attachment",
      "background_writes"};
  return keys;
}

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

Config config_from_json(const json& object, const Config& base, std::string_view origin) {
  if (!object.is_object()) {
    throw ConfigError(std::string(origin) + ": the configuration must be a mapping of keys, not " +
                      show(object));
  }
  Config c = base;
  for (const auto& [key, v] : object.items()) {
    if (key == "skip_batches") {
      c.skip_batches = parse_batches(v, key, origin);
    } else if (key == "interval") {
      c.interval = parse_batches(v, key, origin);
      if (c.interval < 1) bad(origin, key, v, "at least 1 batch, e.g. 3 or \"3ba\"");
    } else if (key == "repeat") {
      c.repeat = as_int(v, key, origin, -1, INT32_MAX, "-1 (until the job ends), 0 (one window) or more");
    } else if (key == "folder") {
      c.folder = as_string(v, key, origin);
      if (c.folder.empty()) bad(origin, key, v, "a non-empty folder path");
      try {
        check_template(c.folder, false, key);
      } catch (const NameError& e) {
        throw ConfigError(std::string(origin) + ": " + e.what());
      }
    } else if (key == "filename") {
      c.filename = as_string(v, key, origin);
      try {
        check_template(c.filename, true, key);
      } catch (const NameError& e) {
        throw ConfigError(std::string(origin) + ": " + e.what());
      }
      if (c.filename.empty()) bad(origin, key, v, "a non-empty file name template");
      // The page name stays inside the report folder, whatever the variables hold.
      std::string part;
      bool climbs = c.filename.front() == '/';
      for (std::size_t i = 0; i <= c.filename.size(); ++i) {
        if (i == c.filename.size() || c.filename[i] == '/') {
          climbs |= part == "..";
          part.clear();
        } else {
          part += c.filename[i];
        }
      }
      if (climbs) bad(origin, key, v, "a name inside the report folder (no leading '/', no '..')");
    } else if (key == "remote_file_name") {
      c.remote_file_name = as_string(v, key, origin, true);
      try {
        if (!c.remote_file_name.empty()) check_template(c.remote_file_name, true, key);
      } catch (const NameError& e) {
        throw ConfigError(std::string(origin) + ": " + e.what());
      }
    } else if (key == "overwrite") {
      c.overwrite = as_bool(v, key, origin);
    } else if (key == "max_entries") {
      c.max_entries = as_int(v, key, origin, 1, std::int64_t{1} << 32, "a whole number from 1 to 4294967296");
    } else if (key == "stacks") {
      std::string s = v.is_string() ? v.get<std::string>() : std::string("?");
      if (s == "none") c.stacks = StackMode::none;
      else if (s == "native") c.stacks = StackMode::native;
      else if (s == "python") c.stacks = StackMode::python;
      else if (s == "all") c.stacks = StackMode::all;
      else bad(origin, key, v, "\"none\", \"native\", \"python\" or \"all\"");
    } else if (key == "stack_depth") {
      c.stack_depth = as_int(v, key, origin, 1, 64, "a whole number from 1 to 64");
    } else if (key == "stack_min_bytes") {
      c.stack_min_bytes = as_int(v, key, origin, 0, std::int64_t{1} << 50, "a byte count from 0 to 2^50, e.g. 1048576");
    } else if (key == "batch_marker") {
      c.batch_marker = as_string(v, key, origin);
      // std::regex compiles and matches recursively: a long or deeply nested pattern could
      // overflow the stack of the training process. Real step names need neither.
      int depth = 0, deepest = 0;
      for (char ch : c.batch_marker) {
        depth += ch == '(' ? 1 : ch == ')' ? -1 : 0;
        deepest = std::max(deepest, depth);
      }
      if (c.batch_marker.size() > 256 || deepest > 8) {
        bad(origin, key, v, "a regular expression of at most 256 characters and 8 nested groups");
      }
      std::string pattern = c.batch_marker;
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
    } else if (key == "oom_snapshot") {
      c.oom_snapshot = as_bool(v, key, origin);
    } else if (key == "run_name") {
      c.run_name = as_string(v, key, origin, true);
      try {
        if (!c.run_name.empty()) check_run_name(c.run_name);
      } catch (const NameError& e) {
        throw ConfigError(std::string(origin) + ": key 'run_name': " + e.what());
      }
    } else if (key == "enabled") {
      c.enabled = as_bool(v, key, origin);
    } else if (key == "torch_attachment") {
      c.torch_attachment = as_bool(v, key, origin);
    } else if (key == "background_writes") {
      c.background_writes = as_bool(v, key, origin);
    } else {
      std::string known;
      for (const auto& k : config_keys()) known += (known.empty() ? "" : ", ") + k;
      throw ConfigError(std::string(origin) + ": unknown key '" + key + "'; known keys: " + known);
    }
  }
  return c;
}

namespace {
const char* stack_mode_name(StackMode m) {
  switch (m) {
    case StackMode::native: return "native";
    case StackMode::python: return "python";
    case StackMode::all: return "all";
    case StackMode::none: break;
  }
  return "none";
}
}  // namespace

json config_to_json(const Config& c) {
  return json{{"skip_batches", c.skip_batches},
              {"interval", c.interval},
              {"repeat", c.repeat},
              {"folder", c.folder},
              {"filename", c.filename},
              {"remote_file_name", c.remote_file_name.empty() ? json(nullptr) : json(c.remote_file_name)},
              {"overwrite", c.overwrite},
              {"max_entries", c.max_entries},
              {"stacks", stack_mode_name(c.stacks)},
              {"stack_depth", c.stack_depth},
              {"stack_min_bytes", c.stack_min_bytes},
              {"batch_marker", c.batch_marker},
              {"oom_snapshot", c.oom_snapshot},
              {"run_name", c.run_name},
              {"enabled", c.enabled},
              {"torch_attachment", c.torch_attachment},
              {"background_writes", c.background_writes}};
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

Config load_config(const std::string& path, const EnvLookup& env) {
  Config c;
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
