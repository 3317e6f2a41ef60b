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
//   3. every rank appends each page's tail (its findings) and moves the page into the report
//      folder; rank 0 moves the cross page and summary.json, removes the earlier report's pages
//      this one lacks (the folder's marker lists what memsnap wrote) and writes the new marker.
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
#include "memsnap/interrupt.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/names.hpp"
#include "memsnap/progress.hpp"
#include "memsnap/report.hpp"
#include "memsnap/upload.hpp"
#include "memsnap/version.hpp"

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

void move_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  fs::rename(from, to, ec);
  if (ec) throw Error("cannot write " + to.string() + ": " + ec.message());
}

// The report folder's marker: memsnap replaces only a folder that carries it (or is empty). It
// lists the files the report wrote, so that a later report removes exactly those it no longer has.
constexpr const char* kMarker = ".memsnap-report";
// Where a report is written before it replaces the earlier one; removed on success and failure.
constexpr const char* kStaging = ".memsnap-report.partial";

struct FolderState {
  bool exists = false;
  bool ours = false;               // an earlier memsnap report (its marker), or empty
  bool has_report = false;         // the marker is there
  std::vector<std::string> files;  // what the earlier report wrote (its marker's list)
  std::string refusal;             // why memsnap may not write there ("" when it may)
};

// Whether memsnap may write its report into `dir`: absent, empty, or an earlier report of its own
// (the marker, valid JSON that says so). A folder of anything else is refused, --overwrite or not.
FolderState inspect_report_folder(const fs::path& dir, bool overwrite) {
  FolderState st;
  std::error_code ec;
  const auto status = fs::symlink_status(dir, ec);
  if (ec || status.type() == fs::file_type::not_found) return st;
  st.exists = true;
  if (status.type() != fs::file_type::directory) {
    st.refusal = dir.string() + " is not a folder (a file or a link memsnap did not write); it is left as it is: choose "
                 "another -o";
    return st;
  }
  bool empty = true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kStaging) empty = false;
  }
  if (ec) {
    st.refusal = "cannot read " + dir.string() + ": " + ec.message();
    return st;
  }
  const fs::path marker = dir / kMarker;
  if (fs::is_regular_file(fs::symlink_status(marker, ec))) {
    std::ifstream in(marker, std::ios::binary);
    const json m = json::parse(in, nullptr, false);
    if (m.is_object() && m.value("format", "") == "memsnap-report" && m.contains("files") && m["files"].is_array()) {
      st.ours = st.has_report = true;
      for (const auto& f : m["files"]) {
        if (f.is_string()) st.files.push_back(f.get<std::string>());
      }
    }
  }
  if (!st.ours && empty) st.ours = true;
  if (!st.ours) {
    st.refusal = dir.string() + " holds files that memsnap did not write (no " + kMarker +
                 " marker); they are left as they are: choose another -o (an empty or new folder)";
  } else if (st.has_report && !overwrite) {
    st.refusal = dir.string() + " already holds a memsnap report; pass --overwrite to replace it";
  }
  return st;
}

// A path the marker lists, if it stays inside the folder (a damaged marker cannot aim elsewhere).
std::optional<fs::path> listed_path(const fs::path& dir, const std::string& name) {
  if (name.empty() || name == kMarker) return std::nullopt;
  try {
    return join_inside(dir, name);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

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
  return inspect_report_folder(dir, overwrite).refusal;
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
  const fs::path staging = out_dir / kStaging;
  // A progress line on a terminal only (quiet in pipes, logs and tests): rank 0's, counting the
  // pages of every rank.
  int progress_on = root && !options.quiet && Progress::wanted() ? 1 : 0;
  MPI_Bcast(&progress_on, 1, MPI_INT, 0, comm->get());
  Line line;
  line.on = progress_on != 0;

  std::unique_ptr<StoreReader> store;
  StoreInfo info;
  FolderState folder;
  bool created_dir = false;
  interrupt::Temporary staging_guard;  // an interrupted report leaves no staging folder
  try {
    store = std::make_unique<StoreReader>(options.store);
    info = store->info();
    if (root) {
      folder = inspect_report_folder(out_dir, options.overwrite);
      if (!folder.refusal.empty()) throw Error(folder.refusal);
      std::error_code ec;
      created_dir = !folder.exists;
      fs::create_directories(out_dir, ec);
      if (ec) throw Error("cannot create " + out_dir.string() + ": " + ec.message());
      fs::remove_all(staging, ec);  // a report that died before it finished
      staging_guard = interrupt::Temporary(staging);
      fs::create_directories(staging, ec);
      if (ec) throw Error("cannot create " + staging.string() + ": " + ec.message());
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
    if (!root) return;
    std::error_code ec;
    fs::remove_all(staging, ec);
    if (created_dir) fs::remove(out_dir, ec);  // only if empty
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

  // 3. Every page gets its findings (its tail), then the report replaces the earlier one.
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
  try {
    const interrupt::Deferred renames;  // an interrupt waits for this rank's pages to be in place
    for (const auto& p : pages) move_file(join_inside(staging, p.name), join_inside(out_dir, p.name));
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (failed()) return 1;

  int code = 0;
  if (root) {
    line.end();
    try {
      std::size_t removed = 0;
      {
        const interrupt::Deferred renames;  // and for the index, the summary and the marker
        move_file(staging / "index.html", out_dir / "index.html");
        move_file(staging / "summary.json", out_dir / "summary.json");
        // The earlier report's pages this one does not have: only files memsnap wrote there (its
        // marker lists them).
        std::set<std::string> now = {"index.html", "summary.json"};
        for (const auto& p : all_pages) now.insert(p.page);
        for (const auto& old : folder.files) {
          if (now.count(old)) continue;
          const auto path = listed_path(out_dir, old);
          std::error_code ec;
          if (path && fs::is_regular_file(fs::symlink_status(*path, ec)) && fs::remove(*path, ec)) ++removed;
        }
        json marker = {{"format", "memsnap-report"},
                       {"format_version", 1},
                       {"note", "written by memsnap report: memsnap replaces this folder's report only where this file "
                                "is; it removes only the files listed here"},
                       {"store", fs::absolute(options.store).string()},
                       {"files", json(std::vector<std::string>(now.begin(), now.end()))}};
        write_file(out_dir / kMarker, marker.dump(1) + "\n");
        std::error_code ec;
        fs::remove_all(staging, ec);
      }

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
      std::error_code ec;
      fs::remove_all(staging, ec);
      std::cerr << "memsnap report: " << e.what() << "\n";
      code = 1;
    }
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, comm->get());
  return code;
}

}  // namespace memsnap
