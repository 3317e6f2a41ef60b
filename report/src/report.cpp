// `memsnap report`: the per-rank pages rendered in parallel by the ranks that own them, the
// cross-rank page and summary.json by rank 0 from the gathered digests.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>

#include "../../aggregator/src/mpi_util.hpp"
#include "html/html.hpp"
#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/names.hpp"
#include "memsnap/report.hpp"
#include "memsnap/upload.hpp"
#include "memsnap/version.hpp"

namespace memsnap {
namespace {

using nlohmann::json;

json digest_to_json(const WindowDigest& d) {
  json held = json::array();
  for (const auto& h : d.sites_at_low) held.push_back({h.name, static_cast<int>(h.category), h.bytes});
  json batches = json::array();
  for (const auto& b : d.batches)
    batches.push_back({b.batch, b.peak_allocated, b.live_at_end, b.live_at_start, b.min_allocated, b.peak_site, b.peak_site_excess});
  return {{"rank", d.rank}, {"batch", d.batch}, {"page", d.page}, {"batches", batches},
          {"spark", {d.spark, d.spark_max}}, {"stacks", d.site_stacks},
          {"method", {d.batch_method, d.batch_confidence, d.batch_detail}},
          {"growth", {d.growth_per_batch, d.growth_monotone, d.growth_site, d.growth_site_per_batch}},
          {"retained", {d.retained_per_batch, d.retained_site, d.retained_times, d.growth_regrown}},
          {"held", held},
          {"cut_short", d.cut_short}};
}

WindowDigest digest_from_json(const json& j) {
  WindowDigest d;
  d.rank = j.at("rank");
  d.batch = j.at("batch");
  d.page = j.at("page");
  for (const auto& b : j.at("batches")) d.batches.push_back(BatchStat{b[0], b[1], b[2], b[3], b[4], b[5], b[6]});
  const auto& m = j.at("method");
  d.batch_method = m[0];
  d.batch_confidence = m[1];
  d.batch_detail = m[2];
  const auto& g = j.at("growth");
  d.growth_per_batch = g[0];
  d.growth_monotone = g[1];
  d.growth_site = g[2];
  d.growth_site_per_batch = g[3];
  const auto& k = j.at("retained");
  d.retained_per_batch = k[0];
  d.retained_site = k[1];
  d.retained_times = k[2];
  d.growth_regrown = k[3];
  for (const auto& h : j.at("held")) {
    const int category = std::clamp(h[1].get<int>(), 0, kCategoryCount - 1);
    d.sites_at_low.push_back(HeldSite{h[0], static_cast<Category>(category), h[2]});
  }
  d.cut_short = j.at("cut_short");
  d.spark = j.at("spark")[0];
  d.spark_max = j.at("spark")[1];
  d.site_stacks = j.at("stacks");
  return d;
}

// The cross page keeps the first stack it sees for each site name (cross_rank_analysis), and most
// ranks name the same sites: later copies are dropped where they are met, before they are sent to
// rank 0 and again there, so what rank 0 holds grows with the sites, not with sites x ranks.
void drop_stacks_seen(WindowDigest& d, std::set<std::string>& seen) {
  for (auto it = d.site_stacks.begin(); it != d.site_stacks.end();) {
    if (seen.insert(it.key()).second) {
      ++it;
    } else {
      it = d.site_stacks.erase(it);
    }
  }
}

// Writes `text` to `path` through a temporary name, so a reader never sees half a page.
void write_whole(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot write " + path.string() + ": " + ec.message());
}

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

  const std::filesystem::path out_dir =
      options.out_dir.empty() ? options.store.parent_path() / "report" : options.out_dir;
  std::unique_ptr<StoreReader> store;
  StoreInfo info;
  try {
    store = std::make_unique<StoreReader>(options.store);
    info = store->info();
    if (root) {
      std::error_code ec;
      if (std::filesystem::exists(out_dir / "index.html", ec) && !options.overwrite) {
        throw Error(out_dir.string() + " already holds a report (index.html); pass --overwrite to replace it");
      }
      std::filesystem::create_directories(out_dir, ec);
      if (ec) throw Error("cannot create " + out_dir.string() + ": " + ec.message());
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (std::string e = agree(); !e.empty()) {
    if (root) std::cerr << "memsnap report: " << e << "\n";
    return 1;
  }

  // Per-rank pages: rank r is drawn by aggregator rank r % size.
  std::vector<WindowDigest> digests;
  const std::string tmpl = filename_template(info);
  try {
    for (const auto& r : info.ranks) {
      if (r.rank % comm->size() != comm->rank() || r.n_windows == 0) continue;
      const RankRecord record = store->read_rank(r.rank);
      std::vector<std::string> names;
      for (const auto& w : record.windows) names.push_back(page_name(tmpl, info.run_name, r, info.world_size, w.batch_end));
      for (std::size_t i = 0; i < record.windows.size(); ++i) {
        const WindowRecord& w = record.windows[i];
        const WindowStats stats = analyse_window(record, w);
        const json links = {{"index", "index.html"},
                            {"prev", i > 0 ? json(names[i - 1]) : json(nullptr)},
                            {"next", i + 1 < names.size() ? json(names[i + 1]) : json(nullptr)}};
        WindowDigest digest;
        digest.page = names[i];
        const json data = rank_page_data(record, w, stats, info.run_name, info.world_size, options.max_bands, links, &digest);
        write_whole(join_inside(out_dir, names[i]), report::render_rank_page(data));
        digests.push_back(std::move(digest));
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (std::string e = agree(); !e.empty()) {
    if (root) std::cerr << "memsnap report: " << e << "\n";
    return 1;
  }

  json mine = json::array();
  {
    std::set<std::string> seen;
    for (auto& d : digests) {
      drop_stacks_seen(d, seen);
      mine.push_back(digest_to_json(d));
    }
  }
  digests.clear();
  const std::string text = mine.dump();
  mine = json();
  auto gathered = mpi::gather_bytes(*comm, std::vector<char>(text.begin(), text.end()), 0);

  int code = 0;
  if (root) {
    try {
      std::vector<WindowDigest> all;
      std::set<std::string> seen;
      for (auto& part : gathered) {
        for (const auto& j : json::parse(part.begin(), part.end())) {
          all.push_back(digest_from_json(j));
          drop_stacks_seen(all.back(), seen);
        }
        std::vector<char>().swap(part);
      }
      const CrossRankResult cross = cross_rank_analysis(info, store->sites(), all);
      write_whole(out_dir / "index.html", report::render_cross_page(cross.page));
      json summary = store_info_json(*store);
      for (const auto& [k, v] : cross.summary_json.items()) summary[k] = v;
      summary["format_version"] = kFormatVersion;
      write_whole(out_dir / "summary.json", summary.dump(2) + "\n");
      if (!options.quiet) {
        std::cout << "memsnap report: " << all.size() << " window pages and the cross-rank page in " << out_dir.string()
                  << "\n  open " << (out_dir / "index.html").string() << "\n";
        for (const auto& f : cross.summary_json["findings"]) std::cout << "  finding: " << f["detail"].get<std::string>() << "\n";
      }
      if (options.upload) {
        std::vector<ReportPage> pages;
        for (const auto& d : all) pages.push_back({d.rank, d.batch, d.page});
        if (upload_report(info, options.store, out_dir, pages, options.overwrite, options.quiet, std::cout, std::cerr) != 0) code = 4;
      }
      if (options.fail_on_imbalance && cross.peak_max_over_median - 1.0 > *options.fail_on_imbalance) {
        std::cerr << "memsnap report: memory imbalance " << cross.peak_max_over_median - 1.0
                  << " (max/median peak - 1) is over --fail-on-imbalance " << *options.fail_on_imbalance << "\n";
        code = 3;
      }
    } catch (const std::exception& e) {
      std::cerr << "memsnap report: " << e.what() << "\n";
      code = 1;
    }
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, comm->get());
  return code;
}

}  // namespace memsnap
