// memsnap diff's pages and output folder (see memsnap/diff_pages.hpp).
#include "memsnap/diff_pages.hpp"

#include <unistd.h>

#include <fstream>
#include <optional>
#include <set>

#include "html/html.hpp"
#include "html/web_assets.hpp"
#include "memsnap/errors.hpp"
#include "memsnap/interrupt.hpp"
#include "memsnap/report.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kMarker = ".memsnap-diff";
constexpr const char* kStaging = ".memsnap-diff.partial";

std::string page(const std::string& title, const char* body_class, const json& data) {
  using report::detail::web_asset;
  const std::string safe = json(title).dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  // Offline and not steerable by its data: nothing may be fetched.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
         "base-uri 'none'; form-action 'none'\">\n";
  out += "<meta name=\"generator\" content=\"memsnap diff\">\n<title>";
  out += report::escape_html(json::parse(safe).get<std::string>());
  out += "</title>\n<style>\n";
  out += web_asset("common.css");
  out += "</style>\n</head>\n<body class=\"";
  out += body_class;
  out += "\">\n<script>\n";
  out += web_asset("boot.js");
  out += "</script>\n<noscript>This memsnap diff needs JavaScript to draw its charts.</noscript>\n";
  out += "<div id=\"app\"></div>\n<script type=\"application/json\" id=\"memsnap-data\">";
  out += report::json_for_script(data);
  out += "</script>\n<script>\n";
  out += web_asset("common.js");
  out += "</script>\n<script>\n";
  out += web_asset("flame.js");  // the differential flame graph (absent: the page shows bars)
  out += "</script>\n<script>\n";
  out += web_asset("diff.js");
  out += "</script>\n</body>\n</html>\n";
  return out;
}

std::string label_of(const json& d, const char* side) {
  const json& s = d.contains(side) ? d[side] : json();
  return s.is_object() && s.contains("label") && s["label"].is_string() ? s["label"].get<std::string>() : side;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw Error("cannot write " + path.string());
}

struct Folder {
  bool exists = false;
  std::vector<std::string> files;  // the earlier diff's (its marker's list)
  std::string refusal;
};

// Absent, empty, or an earlier memsnap diff (its marker); anything else is refused.
Folder inspect(const fs::path& dir, bool overwrite) {
  Folder st;
  std::error_code ec;
  const auto status = fs::symlink_status(dir, ec);
  if (ec || status.type() == fs::file_type::not_found) return st;
  st.exists = true;
  if (status.type() != fs::file_type::directory) {
    st.refusal = dir.string() + " is not a folder (a file or a link memsnap did not write); it is left as it is: choose another -o";
    return st;
  }
  bool empty = true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != kStaging) empty = false;
  if (ec) {
    st.refusal = "cannot read " + dir.string() + ": " + ec.message();
    return st;
  }
  bool ours = false;
  if (fs::is_regular_file(fs::symlink_status(dir / kMarker, ec))) {
    std::ifstream in(dir / kMarker, std::ios::binary);
    const json m = json::parse(in, nullptr, false);
    if (m.is_object() && m.value("format", "") == "memsnap-diff" && m.contains("files") && m["files"].is_array()) {
      ours = true;
      for (const auto& f : m["files"])
        if (f.is_string()) st.files.push_back(f.get<std::string>());
    }
  }
  if (!ours && !empty) {
    st.refusal = dir.string() + " holds files that memsnap diff did not write (no " + kMarker +
                 " marker); they are left as they are: choose another -o (an empty or new folder)";
  } else if (ours && !overwrite) {
    st.refusal = dir.string() + " already holds a memsnap diff; pass --overwrite to replace it";
  }
  return st;
}

// A plain file name the marker lists (a damaged marker cannot aim outside the folder).
bool plain_name(const std::string& n) {
  return !n.empty() && n != kMarker && n != "." && n != ".." && n.find('/') == std::string::npos;
}

}  // namespace

std::string render_diff_page(const json& d) {
  return page("memsnap diff · " + label_of(d, "base") + " → " + label_of(d, "new"), "page-diff", d);
}

std::string render_diff_rank_page(const json& d, const json& rank) {
  json data = {{"base", d.value("base", json::object())},
               {"new", d.value("new", json::object())},
               {"noise", d.value("noise", json::object())},
               {"windows_mode", d.value("windows_mode", false)},
               {"rank", rank}};
  const std::string r = rank.contains("rank") ? rank["rank"].dump() : "?";
  return page("memsnap diff · rank " + r + " · " + label_of(d, "base") + " → " + label_of(d, "new"), "page-diff-rank", data);
}

std::string write_diff_output(const diff::DiffResult& result, const fs::path& dir, bool overwrite, std::size_t* pages) {
  const Folder st = inspect(dir, overwrite);
  if (!st.refusal.empty()) return st.refusal;
  std::error_code ec;
  const bool created = !st.exists;
  if (created && !fs::create_directories(dir, ec) && ec) return "cannot make " + dir.string() + ": " + ec.message();
  const fs::path staging = dir / kStaging;
  fs::remove_all(staging, ec);
  interrupt::Temporary staging_guard(staging);  // an interrupted diff leaves no staging folder
  auto undo = [&] {
    std::error_code e2;
    fs::remove_all(staging, e2);
    if (created) fs::remove(dir, e2);  // only if empty
  };
  try {
    if (!fs::create_directory(staging, ec)) throw Error("cannot make " + staging.string() + ": " + ec.message());
    std::vector<std::pair<int, std::string>> rank_pages;
    for (const auto& r : result.ranks)
      if (r.changed) rank_pages.emplace_back(r.base_rank, "rank" + std::to_string(r.base_rank) + ".html");
    const json data = diff::to_json(result, rank_pages);
    std::vector<std::string> files = {"index.html", "diff.json"};
    write_file(staging / "diff.json", data.dump(1) + "\n");
    write_file(staging / "index.html", render_diff_page(data));
    for (const auto& r : data["ranks"]) {
      if (!r.contains("page")) continue;
      const std::string name = r["page"];
      write_file(staging / name, render_diff_rank_page(data, r));
      files.push_back(name);
    }
    // Swap in: the new files, then the earlier diff's files this one lacks go, then the marker.
    for (const auto& f : files) {
      fs::rename(staging / f, dir / f, ec);
      if (ec) throw Error("cannot write " + (dir / f).string() + ": " + ec.message());
    }
    const std::set<std::string> now(files.begin(), files.end());
    for (const auto& f : st.files)
      if (plain_name(f) && !now.count(f)) fs::remove(dir / f, ec);
    write_file(staging / kMarker, json({{"format", "memsnap-diff"}, {"files", files}}).dump() + "\n");
    fs::rename(staging / kMarker, dir / kMarker, ec);
    if (ec) throw Error("cannot write " + (dir / kMarker).string() + ": " + ec.message());
    fs::remove_all(staging, ec);
    if (pages) *pages = rank_pages.size();
  } catch (const std::exception& e) {
    undo();
    return e.what();
  }
  return "";
}

}  // namespace memsnap
