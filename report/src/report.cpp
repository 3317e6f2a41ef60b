// `memsnap report`: the per-rank pages rendered in parallel by the ranks that own them, the
// cross-rank page and summary.json by rank 0 from the gathered page digests and the findings the
// store holds (memsnap/findings.hpp: computed once, when the store was written). In three steps,
// so that each rank page opens with the findings about it while no rank keeps more than one
// page's data:
//   1. every rank reads its windows and their numbers (the store's /summary, /sites and /digest;
//      a store older than format version 3 has its windows analysed again), writes each page up
//      to its data into the staging folder and keeps the window's digest;
//   2. rank 0 gathers the page digests, reads the store's findings, writes index.html and
//      summary.json, and broadcasts the findings;
//   3. every rank appends each page's tail (its findings);
//   4. rank 0 puts the whole staging folder in place of the earlier report (page_folder.hpp),
//      after the last collective and as one step for signals: an interrupted report leaves the
//      earlier report or the new one, never pages of both.
// A failure at any step removes the staging folder and leaves an earlier report as it was.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>
#include <utility>

#include "html/html.hpp"
#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/names.hpp"
#include "memsnap/progress.hpp"
#include "memsnap/report.hpp"
#include "memsnap/upload.hpp"
#include "memsnap/version.hpp"
#include "page_folder.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

json digest_to_json(const PageDigest& d) {
  return {{"rank", d.rank}, {"batch", d.batch}, {"page", d.page}, {"spark", {d.spark, d.spark_max}}, {"stacks", d.site_stacks}};
}

PageDigest digest_from_json(const json& j) {
  PageDigest d;
  d.rank = j.at("rank");
  d.batch = j.at("batch");
  d.page = j.at("page");
  d.spark = j.at("spark")[0];
  d.spark_max = j.at("spark")[1];
  d.site_stacks = j.at("stacks");
  return d;
}

// The cross page keeps the first stack it sees for each site name (cross_rank_analysis), and most
// ranks name the same sites: later copies are dropped where they are met, before they are sent to
// rank 0 and again there, so what rank 0 holds grows with the sites, not with sites x ranks.
void drop_stacks_seen(PageDigest& d, std::set<std::string>& seen) {
  for (auto it = d.site_stacks.begin(); it != d.site_stacks.end();) {
    if (seen.insert(it.key()).second) {
      ++it;
    } else {
      it = d.site_stacks.erase(it);
    }
  }
}

namespace fs = std::filesystem;

// Writes `text` to `path` (a file of the staging folder: nobody reads it before it is renamed
// into the report).
void write_file(const fs::path& path, const std::string& text, bool append = false) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  out << text;
  out.flush();
  if (!out) throw Error("cannot write " + path.string());
}

// The report folder: memsnap replaces only a folder whose marker says it holds a memsnap report
// (or an empty one), and removes only the files the marker lists.
constexpr PageFolderKind kReportFolder = {".memsnap-report", ".memsnap-report.partial", "memsnap-report", "memsnap",
                                          "memsnap report"};

// What a page's findings are: those about its rank and window (a finding's batch inside the
// window, or no batch), and the rank's leaks and shard imbalance on each of its windows. Each
// gets its anchor on the page, "finding-KIND[-BATCH]", as the cross page links to it.
json findings_of_page(const json& all, int rank, std::int64_t batch_start, std::int64_t batch_end) {
  json out = json::array();
  for (const auto& f : all) {
    if (!f.is_object() || !f.contains("rank") || !f["rank"].is_number_integer() || f["rank"].get<int>() != rank) continue;
    const std::string kind = f.value("kind", "");
    const json& b = f.contains("batch") ? f["batch"] : json();
    const bool rank_wide = kind == "leak" || kind == "shard_imbalance" || b.is_null();
    const bool inside = b.is_number_integer() && b.get<std::int64_t>() >= batch_start && b.get<std::int64_t>() <= batch_end;
    if (!rank_wide && !inside) continue;
    json g = f;
    g["anchor"] = "finding-" + kind + (b.is_number_integer() ? "-" + std::to_string(b.get<std::int64_t>()) : "");
    g["in_window"] = inside;
    out.push_back(std::move(g));
  }
  return out;
}

// One line on a terminal, rewritten in place ("memsnap report: 12/64 window pages").
struct Line {
  bool on = false;
  bool shown = false;
  void say(const std::string& text) {
    if (!on) return;
    std::fprintf(stderr, "\r\033[Kmemsnap report: %s", text.c_str());
    std::fflush(stderr);
    shown = true;
  }
  void end() {
    if (shown) std::fputs("\r\033[K", stderr);
    shown = false;
  }
};

std::string filename_template(const StoreInfo& info) {
  try {
    const json c = json::parse(info.config_json.empty() ? "{}" : info.config_json);
    if (c.is_object() && c.contains("filename") && c["filename"].is_string()) return c["filename"];
  } catch (const json::exception&) {
  }
  return Config{}.filename;
}

}  // namespace

std::string page_name(const std::string& tmpl, const std::string& run_name, const RankInfo& r, int world_size,
                      std::int64_t batch) {
  NameVars v{run_name, r.rank, r.local_rank, world_size, r.local_world_size, r.node_rank, batch, ""};
  std::string name = format_name(tmpl, v);
  if (name.size() < 5 || name.compare(name.size() - 5, 5, ".html") != 0) name += ".html";
  return name;
}

std::string report_folder_refusal(const fs::path& dir, bool overwrite) {
  return PageFolder(kReportFolder, dir, overwrite).refusal();
}

int report_main(const ReportOptions& options) {
  std::unique_ptr<mpi::World> mpi_world;
  try {
    mpi_world = std::make_unique<mpi::World>();
  } catch (const std::exception& e) {
    std::cerr << "memsnap report: " << e.what() << "\n";
    return 1;
  }
  const mpi::Comm* comm = &mpi_world->comm;
  const bool root = comm->rank() == 0;
  std::string error;  // this rank's first error, agreed on collectively below
  auto agree = [&] { return mpi::agree_on_error(*comm, error); };

  const fs::path out_dir = options.out_dir.empty() ? options.store.parent_path() / "report" : options.out_dir;
  const fs::path staging = out_dir / kReportFolder.staging;  // every rank writes its pages there
  // A progress line on a terminal only (quiet in pipes, logs and tests): rank 0's, counting the
  // pages of every rank.
  int progress_on = root && !options.quiet && Progress::wanted() ? 1 : 0;
  MPI_Bcast(&progress_on, 1, MPI_INT, 0, comm->get());
  Line line;
  line.on = progress_on != 0;

  std::unique_ptr<StoreReader> store;
  StoreInfo info;
  std::optional<PageFolder> folder;  // rank 0's
  try {
    store = std::make_unique<StoreReader>(options.store);
    info = store->info();
    if (root) {
      folder.emplace(kReportFolder, out_dir, options.overwrite);
      if (!folder->refusal().empty()) throw Error(folder->refusal());
      folder->open();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (std::string e = agree(); !e.empty()) {
    if (root) std::cerr << "memsnap report: " << e << "\n";
    return 1;
  }
  // Undoes what this run wrote: its staging folder, and the report folder if it made it and it
  // is empty. An earlier report there stays as it was.
  auto clean_up = [&] {
    if (folder) folder->abandon();
  };
  // Whether a rank has failed: then every rank undoes what this run wrote, and rank 0 says why.
  auto failed = [&] {
    const std::string e = agree();
    if (e.empty()) return false;
    line.end();
    clean_up();
    if (root) std::cerr << "memsnap report: " << e << "\n";
    return true;
  };

  // 1. Each rank's windows: the page written up to its data (the findings, read by rank 0 in
  //    step 2, go in its tail), the digest kept for the cross page.
  struct Page {
    std::string name;
    int rank = 0;
    std::int64_t batch_start = 0, batch_end = 0;
  };
  std::vector<Page> pages;
  std::vector<PageDigest> digests;
  const std::string tmpl = filename_template(info);
  std::size_t total_windows = 0, my_windows = 0;
  std::vector<SiteRow> sites;  // /sites: the windows' numbers (step 1) and the cross page (step 2)
  bool sites_read = false;
  for (const auto& r : info.ranks) {
    total_windows += r.n_windows;
    if (r.rank % comm->size() == comm->rank()) my_windows += r.n_windows;
  }
  {
    Progress progress(*comm, progress_on != 0, total_windows, "memsnap report", "window pages", 7411);
    std::size_t counted = 0;
    try {
      // Each window's numbers as the store keeps them (one analysis, when it was written); a
      // store of an earlier format version keeps no /digest, and its windows are analysed here.
      std::vector<std::vector<WindowStats>> stored;
      if (my_windows > 0 && store->has_findings()) {
        sites = store->sites();
        sites_read = true;
        stored = stored_window_stats(info, sites, store->digest());
      }
      for (const auto& r : info.ranks) {
        if (r.rank % comm->size() != comm->rank() || r.n_windows == 0) continue;
        const RankRecord record = store->read_rank(r.rank);
        // A rank whose analysis failed when the store was written has windows but no rows.
        std::vector<WindowStats>* kept =
            r.rank >= 0 && static_cast<std::size_t>(r.rank) < stored.size() ? &stored[static_cast<std::size_t>(r.rank)] : nullptr;
        if (kept != nullptr && kept->size() != record.windows.size()) kept = nullptr;
        std::vector<std::string> names;
        for (const auto& w : record.windows) names.push_back(page_name(tmpl, info.run_name, r, info.world_size, w.batch_end));
        for (std::size_t i = 0; i < record.windows.size(); ++i) {
          const WindowRecord& w = record.windows[i];
          const WindowStats stats = kept != nullptr ? std::move((*kept)[i]) : analyse_window(record, w);
          const json links = {{"index", "index.html"},
                              {"prev", i > 0 ? json(names[i - 1]) : json(nullptr)},
                              {"next", i + 1 < names.size() ? json(names[i + 1]) : json(nullptr)}};
          PageDigest digest;
          digest.page = names[i];
          const json data =
              rank_page_data(record, w, stats, info.run_name, info.world_size, options.max_bands, links, &digest);
          write_file(join_inside(staging, names[i]), report::render_rank_page_head(data));
          pages.push_back({names[i], r.rank, w.batch_start, w.batch_end});
          digests.push_back(std::move(digest));
          if (counted < my_windows) {
            ++counted;
            progress.add(1);
          }
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    progress.add(my_windows - counted);  // rank 0 waits for every rank's count
    progress.finish();
  }
  if (failed()) return 1;

  // 2. Rank 0 gathers the page digests, reads the findings, writes the cross page and
  //    summary.json, and sends every rank the findings.
  json mine = json::array();
  {
    std::set<std::string> seen;
    for (auto& d : digests) {
      drop_stacks_seen(d, seen);
      mine.push_back(digest_to_json(d));
    }
  }
  digests.clear();
  std::string text = mine.dump();
  mine = json();
  auto gathered = mpi::gather_bytes(*comm, std::vector<char>(text.begin(), text.end()), 0);
  std::string().swap(text);

  std::optional<CrossRankResult> cross;
  std::vector<ReportPage> all_pages;
  std::vector<char> findings_bytes;
  if (root) {
    line.say("comparing the ranks");
    try {
      std::vector<PageDigest> all;
      std::set<std::string> seen;
      for (auto& part : gathered) {
        for (const auto& j : json::parse(part.begin(), part.end())) {
          all.push_back(digest_from_json(j));
          drop_stacks_seen(all.back(), seen);
        }
        std::vector<char>().swap(part);
      }
      for (const auto& d : all) all_pages.push_back({d.rank, d.batch, d.page});
      // The findings the store holds (computed when it was written); a store of an earlier
      // format version has none, and they are computed from its rank files.
      const std::vector<Finding> found = store->has_findings() ? store->findings() : compute_store_findings(*store).findings;
      if (!sites_read) sites = store->sites();
      cross = cross_rank_analysis(info, sites, found, all);
      all.clear();
      write_file(staging / "index.html", report::render_cross_page(cross->page));
      json summary = store_info_json(*store);
      for (const auto& [k, v] : cross->summary_json.items()) summary[k] = v;
      summary["format_version"] = kFormatVersion;
      write_file(staging / "summary.json", summary.dump(2) + "\n");
      const json& f = cross->summary_json.contains("findings") ? cross->summary_json["findings"] : json::array();
      const std::string ft = f.dump();
      findings_bytes.assign(ft.begin(), ft.end());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  gathered.clear();
  int root_failed = error.empty() ? 0 : 1;
  MPI_Bcast(&root_failed, 1, MPI_INT, 0, comm->get());
  if (root_failed) {
    line.end();
    clean_up();
    if (root) std::cerr << "memsnap report: " << error << "\n";
    return 1;
  }

  // 3. Every page gets its findings (its tail).
  mpi::bcast_bytes(*comm, findings_bytes, 0);
  try {
    if (root) line.say("writing the pages' findings");
    const json findings = json::parse(findings_bytes.begin(), findings_bytes.end());
    std::vector<char>().swap(findings_bytes);
    for (const auto& p : pages) {
      write_file(join_inside(staging, p.name),
                 report::render_rank_page_tail(findings_of_page(findings, p.rank, p.batch_start, p.batch_end)), true);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (failed()) return 1;

  // 4. Rank 0 puts the whole report in place of the earlier one, every rank's pages with the
  //    index: after the last collective, so that an interrupt leaves one report or the other.
  int code = 0;
  if (root) {
    line.end();
    try {
      std::vector<std::string> files = {"index.html", "summary.json"};
      for (const auto& p : all_pages) files.push_back(p.page);
      const json marker = {{"format_version", 1},
                           {"note", "written by memsnap report: memsnap replaces this folder's report only where this file "
                                    "is; it removes only the files listed here"},
                           {"store", fs::absolute(options.store).string()}};
      const std::size_t removed = folder->install(files, marker);

      if (!options.quiet) {
        const json& findings = cross->summary_json["findings"];
        constexpr std::size_t kShown = 10;
        std::size_t shown = 0;
        for (const auto& f : findings) {
          if (shown == kShown) break;
          std::cout << "  finding: " << f.value("detail", f.value("kind", "")) << "\n";
          ++shown;
        }
        if (findings.size() > shown) {
          std::cout << "  " << findings.size() - shown << " more finding" << (findings.size() - shown > 1 ? "s" : "")
                    << " in " << (out_dir / "summary.json").string() << "\n";
        }
        std::cout << "memsnap report: wrote " << all_pages.size() << " window page" << (all_pages.size() == 1 ? "" : "s")
                  << ", index.html and summary.json to " << out_dir.string()
                  << (removed > 0 ? " (removed " + std::to_string(removed) + " pages of the earlier report)" : "")
                  << "; open " << (out_dir / "index.html").string() << "\n";
      }
      if (options.upload) {
        if (upload_report(info, options.store, out_dir, all_pages, options.overwrite, options.quiet, std::cout, std::cerr) != 0) code = 4;
      }
      if (options.fail_on_imbalance && cross->peak_max_over_median - 1.0 > *options.fail_on_imbalance) {
        std::cerr << "memsnap report: memory imbalance " << cross->peak_max_over_median - 1.0
                  << " (max/median peak - 1) is over --fail-on-imbalance " << *options.fail_on_imbalance << "\n";
        code = 3;
      }
    } catch (const std::exception& e) {
      folder->abandon();
      std::cerr << "memsnap report: " << e.what() << "\n";
      code = 1;
    }
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, comm->get());
  return code;
}

}  // namespace memsnap
