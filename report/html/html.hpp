// Renders memsnap's self-contained HTML report pages (per-rank window page, cross-rank page).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace memsnap::report {

/// A complete HTML document for one rank's window (the "rank page" data contract, described at
/// the top of html.cpp). Does not throw on odd data: missing fields render as "not recorded".
/// All scripts and styles are inlined; the page loads nothing when viewed.
/// `findings`: the findings about this rank and window (summary.json's, each with "anchor"),
/// shown first on the page; an array, else none.
std::string render_rank_page(const nlohmann::json& data, const nlohmann::json& findings = nlohmann::json::array());

/// The same page in two parts, head + tail: the head (everything up to the page's data) can be
/// written before the findings are known, the tail appended once they are.
std::string render_rank_page_head(const nlohmann::json& data);
std::string render_rank_page_tail(const nlohmann::json& findings);

/// A complete HTML document comparing all ranks of a run (data contract: "Cross-rank page").
std::string render_cross_page(const nlohmann::json& data);

/// JSON text that is safe inside <script type="application/json">: '<', '>', '&', U+2028 and
/// U+2029 are written as \uXXXX escapes, invalid UTF-8 is replaced by U+FFFD.
std::string json_for_script(const nlohmann::json& data);

/// A sparkline of the cross page as text: each level (bytes) scaled to 0..4095 of `max` and written
/// as two characters of the base64url alphabet (A-Z a-z 0-9 - _), high six bits first. A few
/// hundred bytes per window where a JSON array of numbers took kilobytes: the cross page holds one
/// per rank and window. cross.js reads it back (sparkLevels).
std::string spark_levels(const std::vector<std::uint64_t>& levels, std::uint64_t max);

/// Text escaped for HTML element content and quoted attribute values.
std::string escape_html(std::string_view text);

}  // namespace memsnap::report
