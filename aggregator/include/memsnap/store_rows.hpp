// The field tables of the store's index rows (memsnap/codec.hpp): one description of /ranks,
// /summary and /sites, from which the writer packs the tables, the reader unpacks them and the
// aggregator gathers rows over MPI. Table order is the file's column order (stores already
// written keep reading); a field added later names the store format version that added it.
// `memsnap info --json` and summary.json show every column of /ranks and /summary but those
// aggregator/src/info.cpp leaves out.
#pragma once

#include <string>
#include <tuple>

#include "memsnap/codec.hpp"
#include "memsnap/record_fields.hpp"
#include "memsnap/store.hpp"

namespace memsnap {

/// /summary's column for the bytes of one category at the peak: "<category>_at_peak".
inline std::string category_column(int c) { return std::string(category_name(static_cast<Category>(c))) + "_at_peak"; }

template <>
struct Fields<RankInfo> {
  static constexpr auto list = std::tuple{
      field("rank", &RankInfo::rank),
      field("status", &RankInfo::status),
      field("host", &RankInfo::host),
      field("device", &RankInfo::device),
      field("pid", &RankInfo::pid),
      field("local_rank", &RankInfo::local_rank),
      field("node_rank", &RankInfo::node_rank),
      field("local_world_size", &RankInfo::local_world_size),
      field("source", &RankInfo::source),
      field("n_windows", &RankInfo::n_windows),
      field("data_file", &RankInfo::data_file),
      field("spill", &RankInfo::spill),
      field("status_detail", &RankInfo::status_detail)};
};

/// /summary's columns of a window's WindowSummary (within SummaryRow's, below).
template <>
struct Fields<WindowSummary> {
  static constexpr auto list = std::tuple{
      field("n_events", &WindowSummary::n_events),
      field("dropped", &WindowSummary::dropped),
      field("peak_allocated", &WindowSummary::peak_allocated),
      field("peak_allocated_time_ns", &WindowSummary::peak_allocated_time_ns),
      field("peak_reserved", &WindowSummary::peak_reserved),
      field("peak_reserved_time_ns", &WindowSummary::peak_reserved_time_ns),
      field("live_at_open", &WindowSummary::live_at_open),
      field("live_at_close", &WindowSummary::live_at_close),
      field("reserved_at_open", &WindowSummary::reserved_at_open),
      field("reserved_at_close", &WindowSummary::reserved_at_close),
      field("persistent", &WindowSummary::persistent),
      field("fragmentation_at_peak", &WindowSummary::fragmentation_at_peak)};
};

template <>
struct Fields<SummaryRow> {
  static constexpr auto list = std::tuple_cat(
      std::tuple{field("rank", &SummaryRow::rank), field("window", &SummaryRow::window),
                 field("batch_start", &SummaryRow::batch_start), field("batch_end", &SummaryRow::batch_end),
                 field("host", &SummaryRow::host), field("device", &SummaryRow::device)},
      Fields<WindowSummary>::list,
      std::tuple{field("oom", &SummaryRow::oom), field("oom_requested", &SummaryRow::oom_requested),
                 field("status", &SummaryRow::status),
                 field("category_bytes", &SummaryRow::category_bytes).columns(category_column),
                 field("batch_method", &SummaryRow::batch_method).since_version(2),
                 field("batch_confidence", &SummaryRow::batch_confidence).since_version(2)});
};

/// The site's name travels with the row; the store keeps it in /site_names, named by site_id.
template <>
struct Fields<SiteRow> {
  static constexpr auto list = std::tuple{
      field("rank", &SiteRow::rank),
      field("window", &SiteRow::window),
      field("batch", &SiteRow::batch),
      field("site_id", &SiteRow::site_id),
      field("category", &SiteStat::category),
      field("bytes_at_peak", &SiteStat::bytes_at_peak),
      field("count", &SiteStat::count_at_peak),
      field("bytes_allocated", &SiteStat::bytes_allocated),
      field("allocations", &SiteStat::allocations),
      field("stack_id", &SiteStat::stack_id),
      field("site", &SiteStat::name).not_stored()};
};

}  // namespace memsnap
