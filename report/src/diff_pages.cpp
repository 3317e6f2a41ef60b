// memsnap diff's pages and output folder (see memsnap/diff_pages.hpp).
#include "memsnap/diff_pages.hpp"

#include <fstream>

#include "html/html.hpp"
#include "html/web_assets.hpp"
#include "memsnap/errors.hpp"
#include "memsnap/report.hpp"
#include "page_folder.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The diff's folder: replaced only where its marker is (or when empty), as a report's is.
constexpr PageFolderKind kDiffFolder = {".memsnap-diff", ".memsnap-diff.partial", "memsnap-diff", "memsnap diff",
                                        "memsnap diff"};

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
  PageFolder folder(kDiffFolder, dir, overwrite);
  if (!folder.refusal().empty()) return folder.refusal();
  try {
    folder.open();
    const fs::path staging = folder.staging();
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
    folder.install(files, json::object());
    if (pages) *pages = rank_pages.size();
  } catch (const std::exception& e) {
    folder.abandon();
    return e.what();
  }
  return "";
}

}  // namespace memsnap
