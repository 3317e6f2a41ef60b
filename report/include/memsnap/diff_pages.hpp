// memsnap diff's pages: DIR/index.html (the diff's cross page), DIR/rank<R>.html for each rank
// that changed, and DIR/diff.json, written the way memsnap writes every output: into a staging
// folder, swapped in only when complete, replacing only an earlier diff (its .memsnap-diff marker).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "memsnap/diff.hpp"

namespace memsnap {

/// The diff's cross page (a complete, self-contained HTML document) from diff.json's data.
std::string render_diff_page(const nlohmann::json& diff_json);
/// A rank page: `rank` is one element of diff.json's "ranks"; `diff_json` gives the labels and noise.
std::string render_diff_rank_page(const nlohmann::json& diff_json, const nlohmann::json& rank);

/// Writes the pages and diff.json into `dir`. A folder of other files is refused, an earlier
/// diff only with `overwrite`; a failure leaves nothing of this diff and an earlier one as it was.
/// Returns "" or one line naming the folder and what is wrong; `pages` gets the rank pages written.
std::string write_diff_output(const diff::DiffResult& result, const std::filesystem::path& dir, bool overwrite,
                              std::size_t* pages = nullptr);

}  // namespace memsnap
