// Name templates ({run_name}, {rank}, {batch}, ...): checking, formatting, and keeping a formatted
// name inside its output folder. The public header is memsnap/names.hpp.
#include "memsnap/names.hpp"

#include <ctime>

namespace memsnap {
namespace {

constexpr std::string_view kVariables[] = {"run_name",   "rank",      "local_rank",
                                           "world_size", "local_world_size", "node_rank",
                                           "batch",      "timestamp"};

bool known_variable(std::string_view name) {
  for (auto v : kVariables) {
    if (v == name) return true;
  }
  return false;
}

std::string variable_list() {
  std::string out;
  for (auto v : kVariables) out += (out.empty() ? "{" : ", {") + std::string(v) + "}";
  return out;
}

// Walks a template, calling `on_text` for literal text and `on_var` for each {variable}.
template <class OnText, class OnVar>
void scan(std::string_view tmpl, OnText on_text, OnVar on_var) {
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (c == '{' && i + 1 < tmpl.size() && tmpl[i + 1] == '{') {
      on_text('{');
      ++i;
    } else if (c == '}' && i + 1 < tmpl.size() && tmpl[i + 1] == '}') {
      on_text('}');
      ++i;
    } else if (c == '{') {
      const auto close = tmpl.find('}', i + 1);
      if (close == std::string_view::npos) {
        throw NameError("template '" + std::string(tmpl) + "' has a '{' without its '}'");
      }
      on_var(tmpl.substr(i + 1, close - i - 1));
      i = close;
    } else if (c == '}') {
      throw NameError("template '" + std::string(tmpl) + "' has a '}' without its '{'");
    } else {
      on_text(c);
    }
  }
}

}  // namespace

void check_template(std::string_view tmpl, bool batch_allowed, std::string_view key) {
  scan(tmpl, [](char) {}, [&](std::string_view var) {
    if (!known_variable(var)) {
      throw NameError("key '" + std::string(key) + "': unknown variable {" + std::string(var) +
                      "} in '" + std::string(tmpl) + "'; allowed: " + variable_list());
    }
    if (var == "batch" && !batch_allowed) {
      throw NameError("key '" + std::string(key) + "': {batch} is not allowed in '" +
                      std::string(tmpl) + "' (the folder holds every batch)");
    }
  });
}

std::string format_name(std::string_view tmpl, const NameVars& v) {
  std::string out;
  scan(tmpl, [&](char c) { out += c; }, [&](std::string_view var) {
    if (var == "run_name") out += v.run_name;
    else if (var == "rank") out += std::to_string(v.rank);
    else if (var == "local_rank") out += std::to_string(v.local_rank);
    else if (var == "world_size") out += std::to_string(v.world_size);
    else if (var == "local_world_size") out += std::to_string(v.local_world_size);
    else if (var == "node_rank") out += std::to_string(v.node_rank);
    else if (var == "timestamp") out += v.timestamp;
    else if (var == "batch") {
      if (!v.batch) throw NameError("template '" + std::string(tmpl) + "' uses {batch} where no batch is known");
      out += std::to_string(*v.batch);
    } else {
      throw NameError("unknown variable {" + std::string(var) + "} in '" + std::string(tmpl) +
                      "'; allowed: " + variable_list());
    }
  });
  return out;
}

void check_run_name(std::string_view name) {
  if (name.empty()) throw NameError("the run name is empty");
  if (name == "." || name == "..") throw NameError("the run name '" + std::string(name) + "' is not a folder name");
  for (unsigned char c : name) {
    if (c == '/' || c == '\\') {
      throw NameError("the run name '" + std::string(name) + "' holds a path separator; it must be one folder name");
    }
    if (c < 0x20 || c == 0x7f) throw NameError("the run name holds a control character");
  }
}

std::filesystem::path join_inside(const std::filesystem::path& folder, std::string_view relative) {
  const std::filesystem::path rel(relative);
  if (relative.empty()) throw NameError("an empty file name");
  if (rel.is_absolute() || rel.has_root_name()) {
    throw NameError("the name '" + std::string(relative) + "' is absolute; it must stay inside " + folder.string());
  }
  for (const auto& part : rel) {
    if (part == "..") {
      throw NameError("the name '" + std::string(relative) + "' climbs out of " + folder.string() + " with '..'");
    }
  }
  return folder / rel;
}

std::string timestamp_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace memsnap
