// Assembles the report pages: inlined assets plus the page's data as an escaped JSON block.
//
// The page data follows the contracts built by report/ from the store (sizes in bytes, times in
// ns). Before embedding, the data is reshaped into what the page scripts read:
//   * every time becomes an offset from the window's t0_ns (the absolute base is kept as the
//     decimal string "time_base_ns"), because epoch nanoseconds (~1.7e18) exceed the 2^53 a JS
//     number holds exactly; allocs.end_ns == -1 (still live) becomes null;
//   * addresses become hex strings for the same reason;
//   * segments and their blocks become columnar arrays, block addresses offsets in their segment.
// The cross page's data is embedded as given (its sparklines are compact text already: "spark":
// {"max": bytes, "levels": two base64url characters a level}, see PageDigest::spark in
// memsnap/report.hpp), and so is everything else; the scripts treat every field as optional.
#include "html/html.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "web_assets.hpp"

namespace memsnap::report {
namespace {

using nlohmann::json;

bool is_int(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

std::int64_t as_i64(const json& v, std::int64_t fallback = 0) {
  if (v.is_number_unsigned()) return static_cast<std::int64_t>(v.get<std::uint64_t>());
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) return static_cast<std::int64_t>(v.get<double>());
  return fallback;
}

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

json* member(json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

void rebase(json& v, std::int64_t base) {
  if (is_int(v))
    v = as_i64(v) - base;
  else if (v.is_number_float())
    v = v.get<double>() - static_cast<double>(base);
}

void rebase_array(json* arr, std::int64_t base) {
  if (arr && arr->is_array())
    for (auto& v : *arr) rebase(v, base);
}

void rebase_field_of_each(json* arr, const char* key, std::int64_t base) {
  if (!arr || !arr->is_array()) return;
  for (auto& item : *arr)
    if (json* v = member(item, key)) rebase(*v, base);
}

json hex(const json& v) {
  if (!is_int(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx",
                static_cast<unsigned long long>(v.is_number_unsigned() ? v.get<std::uint64_t>()
                                                                       : static_cast<std::uint64_t>(v.get<std::int64_t>())));
  return std::string(buf);
}

json columnar_segments(const json& segments, json& blocks_out) {
  json seg = {{"addr", json::array()}, {"size", json::array()}, {"stream", json::array()},
              {"device", json::array()}, {"pool", json::array()}, {"nblocks", json::array()}};
  blocks_out = {{"offset", json::array()}, {"size", json::array()}, {"state", json::array()},
                {"stack", json::array()}};
  if (!segments.is_array()) return seg;
  for (const auto& s : segments) {
    if (!s.is_object()) continue;
    const json null_v;
    auto get = [&](const char* k) -> const json& {
      const json* v = member(s, k);
      return v ? *v : null_v;
    };
    const std::int64_t base = as_i64(get("addr"));
    seg["addr"].push_back(hex(get("addr")));
    seg["size"].push_back(get("size"));
    seg["stream"].push_back(get("stream"));
    seg["device"].push_back(get("device"));
    seg["pool"].push_back(get("pool").is_string() ? get("pool") : json(""));
    std::int64_t n = 0, cursor = 0;
    if (const json* bl = member(s, "blocks"); bl && bl->is_array()) {
      for (const auto& b : *bl) {
        if (!b.is_object()) continue;
        const json* a = member(b, "addr");
        const std::int64_t size = member(b, "size") ? as_i64(*member(b, "size")) : 0;
        const std::int64_t off =
            a && is_int(*a) ? static_cast<std::int64_t>(static_cast<std::uint64_t>(as_i64(*a)) -
                                                         static_cast<std::uint64_t>(base))
                            : cursor;
        cursor = off + size;
        blocks_out["offset"].push_back(off);
        blocks_out["size"].push_back(size);
        blocks_out["state"].push_back(member(b, "state") ? *member(b, "state") : json(0));
        blocks_out["stack"].push_back(member(b, "stack") ? *member(b, "stack") : json(-1));
        ++n;
      }
    }
    seg["nblocks"].push_back(n);
  }
  return seg;
}

json rank_view(const json& data) {
  json v = data.is_object() ? data : json::object();
  const std::int64_t t0 = member(v, "t0_ns") ? as_i64(*member(v, "t0_ns")) : 0;
  v["time_base_ns"] = std::to_string(t0);
  if (member(v, "t0_ns")) v["t0_ns"] = 0;
  if (json* t1 = member(v, "t1_ns")) rebase(*t1, t0);
  if (json* st = member(v, "stats"))
    if (json* pt = member(*st, "peak_allocated_time_ns")) rebase(*pt, t0);
  rebase_field_of_each(member(v, "batches"), "time_ns", t0);
  rebase_field_of_each(member(v, "ooms"), "time_ns", t0);
  if (json* o = member(v, "other")) rebase_array(member(*o, "time_ns"), t0);
  if (json* t = member(v, "totals")) rebase_array(member(*t, "time_ns"), t0);
  if (json* a = member(v, "allocs")) {
    rebase_array(member(*a, "start_ns"), t0);
    if (json* e = member(*a, "end_ns"); e && e->is_array())
      for (auto& x : *e) x = (is_int(x) && as_i64(x) == -1) ? json(nullptr) : json(as_i64(x) - t0);
    if (json* ad = member(*a, "addr"); ad && ad->is_array())
      for (auto& x : *ad) x = hex(x);
  }
  if (json* s = member(v, "segments")) {
    json blocks;
    json seg = columnar_segments(*s, blocks);
    *s = std::move(seg);
    v["blocks"] = std::move(blocks);
  }
  return v;
}

std::string string_field(const json& data, const char* key, const char* fallback) {
  const json* v = member(data, key);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}

// The page up to and including its data block. `rest` is what follows: page_tail's scripts.
std::string page_head(const std::string& title, const char* body_class, const json& view) {
  std::string out;
  const std::string data = json_for_script(view);
  out.reserve(data.size() + 20000);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  // The page must work offline and must not be steerable by its data: nothing may be fetched.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
         "base-uri 'none'; form-action 'none'\">\n";
  out += "<meta name=\"generator\" content=\"memsnap\">\n";
  out += "<title>" + escape_html(title) + "</title>\n<style>\n";
  out += detail::web_asset("common.css");
  out += "</style>\n</head>\n<body class=\"";
  out += body_class;
  out += "\">\n<script>\n";
  out += detail::web_asset("boot.js");
  out += "</script>\n<noscript>This memsnap report needs JavaScript to draw its charts.</noscript>\n";
  out += "<div id=\"app\"></div>\n<script type=\"application/json\" id=\"memsnap-data\">";
  out += data;
  out += "</script>\n";
  return out;
}

// The rank page's scripts, in the order they run: the shared helpers, the window's data model,
// one file per view, and rank.js, which puts the views on the page.
constexpr const char* kRankScripts[] = {"common.js",        "flame.js",         "rank_model.js",  "rank_header.js",
                                        "rank_findings.js", "rank_timeline.js", "rank_flame.js",  "rank_segments.js",
                                        "rank_sites.js",    "rank.js"};
constexpr const char* kCrossScripts[] = {"common.js", "cross.js"};

// The scripts after the data block, each in its own element; `findings` (when not null) is a
// second data block the scripts read (the rank page's findings, known only once every rank's
// window is analysed).
template <std::size_t N>
std::string page_tail(const json* findings, const char* const (&scripts)[N]) {
  using detail::web_asset;
  std::string out;
  if (findings != nullptr) {
    out += "<script type=\"application/json\" id=\"memsnap-findings\">";
    out += json_for_script(*findings);
    out += "</script>\n";
  }
  for (const char* script : scripts) {
    out += "<script>\n";
    out += web_asset(script);
    out += "</script>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

std::string rank_title(const json& data) {
  std::string title = "memsnap · " + string_field(data, "run_name", "run");
  if (const json* r = member(data, "rank"); r && is_int(*r)) title += " · rank " + std::to_string(as_i64(*r));
  const json* b0 = member(data, "batch_start");
  const json* b1 = member(data, "batch_end");
  if (b0 && b1 && is_int(*b0) && is_int(*b1))
    title += " · batches " + std::to_string(as_i64(*b0)) + "–" + std::to_string(as_i64(*b1));
  // Invalid UTF-8 in a title would otherwise pass through; the JSON dump replaces it, so go
  // through it for the title as well.
  const std::string safe_title = json(title).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(safe_title).get<std::string>();
}

}  // namespace

std::string json_for_script(const nlohmann::json& data) {
  const std::string s = data.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size() + s.size() / 16);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    // Outside strings JSON has none of these characters, so escaping them everywhere is exact.
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else if (c == '\xE2' && i + 2 < s.size() && s[i + 1] == '\x80' &&
             (s[i + 2] == '\xA8' || s[i + 2] == '\xA9')) {
      out += s[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else
      out += c;
  }
  return out;
}

std::string spark_levels(const std::vector<std::uint64_t>& levels, std::uint64_t max) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  out.reserve(levels.size() * 2);
  for (auto v : levels) {
    const double f = max == 0 ? 0.0 : static_cast<double>(v < max ? v : max) / static_cast<double>(max);
    const auto q = static_cast<unsigned>(f * 4095.0 + 0.5);
    out += kDigits[q >> 6];
    out += kDigits[q & 63];
  }
  return out;
}

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_rank_page_head(const nlohmann::json& data) {
  return page_head(rank_title(data), "page-rank", rank_view(data));
}

std::string render_rank_page_tail(const nlohmann::json& findings) {
  static const json none = json::array();
  return page_tail(findings.is_array() ? &findings : &none, kRankScripts);
}

std::string render_rank_page(const nlohmann::json& data, const nlohmann::json& findings) {
  return render_rank_page_head(data) + render_rank_page_tail(findings);
}

std::string render_cross_page(const nlohmann::json& data) {
  const std::string title = "memsnap · " + string_field(data, "run_name", "run") + " · all ranks";
  const std::string safe_title = json(title).dump(-1, ' ', false, json::error_handler_t::replace);
  static const json empty = json::object();
  return page_head(json::parse(safe_title).get<std::string>(), "page-cross", data.is_object() ? data : empty) +
         page_tail(nullptr, kCrossScripts);
}

}  // namespace memsnap::report
