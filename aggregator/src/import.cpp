// `memsnap import`: PyTorch snapshot pickles into a store.
//
// Each pickle becomes one window of its rank (rank and batch from the file name). The pickles of
// a rank are merged into one record, written as that rank's spill in a private folder, and the
// folder is aggregated exactly as a recorded run is: same analysis, same store, same sharing of
// the work under mpirun. The folder is removed afterwards.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "memsnap/aggregate.hpp"
#include "memsnap/config.hpp"
#include "memsnap/interop.hpp"
#include "memsnap/mpi.hpp"
#include "memsnap/spill.hpp"
#include "output_guard.hpp"
#include "progress.hpp"
#include "torch/snapshot.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;

// Appends `from`'s frames, stacks and windows to `into`, renumbering ids (also those the
// windows' source_extras name).
void merge_into(RankRecord& into, RankRecord&& from) {
  const auto frame_base = static_cast<std::uint32_t>(into.frames.size());
  const auto stack_base = static_cast<std::uint32_t>(into.stacks.size());
  for (auto& f : from.frames) into.frames.push_back(std::move(f));
  for (auto& s : from.stacks) {
    for (auto& id : s) id += frame_base;
    into.stacks.push_back(std::move(s));
  }
  auto shift = [&](std::uint32_t& id) {
    if (id != kNoStack) id += stack_base;
  };
  for (auto& w : from.windows) {
    for (auto& e : w.events) shift(e.stack_id);
    for (auto& a : w.live_at_start) shift(a.stack_id);
    for (auto& seg : w.segments) {
      for (auto& b : seg.blocks) shift(b.stack_id);
    }
    if (stack_base > 0 && !w.source_extras.empty()) {
      auto extras = nlohmann::json::parse(w.source_extras, nullptr, false);
      if (!extras.is_discarded()) {
        torch::shift_extras_stacks(extras, stack_base);
        w.source_extras = extras.dump();
      }
    }
    into.windows.push_back(std::move(w));
  }
}

// One line on how the windows' batches were found, so a user sees at once when they were inferred
// (and where nothing was found).
void print_batch_methods(const fs::path& store, std::ostream& out) {
  try {
    std::map<std::string, int> count;
    double lowest = 1;
    for (const auto& row : StoreReader(store).summary()) {
      if (row.window < 0) continue;
      ++count[row.batch_method];
      if (row.batch_method != "recorded" && row.batch_method != "none") lowest = std::min(lowest, row.batch_confidence);
    }
    if (count.empty() || (count.size() == 1 && count.count("recorded"))) return;
    std::string line;
    for (const auto& [method, n] : count) line += (line.empty() ? "" : ", ") + std::to_string(n) + " " + method;
    char conf[32];
    std::snprintf(conf, sizeof conf, "%.2f", lowest);
    out << "memsnap import: batch boundaries: " << line << " (lowest confidence " << conf
        << "; memsnap info --json has each window's; give --interval if the windows' batch count is known)\n";
  } catch (const std::exception&) {
    // the store was just written; a failure to read it back is reported by whoever opens it next
  }
}

}  // namespace

std::optional<std::pair<int, std::int64_t>> parse_rank_batch(const std::string& file_name, const std::string& tmpl) {
  // The template as a regular expression: {rank} and {batch} capture numbers, other variables
  // match anything, the rest is literal.
  std::string pattern = "^";
  int rank_group = 0, batch_group = 0, groups = 0;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] == '{') {
      const auto close = tmpl.find('}', i);
      if (close == std::string::npos) return std::nullopt;
      const std::string var = tmpl.substr(i + 1, close - i - 1);
      ++groups;
      if (var == "rank") rank_group = groups;
      if (var == "batch") batch_group = groups;
      pattern += (var == "rank" || var == "batch") ? "([0-9]+)" : "(.*?)";
      i = close;
    } else {
      if (std::strchr(".^$|()[]*+?\\", tmpl[i]) != nullptr) pattern += '\\';
      pattern += tmpl[i];
    }
  }
  if (rank_group == 0 || batch_group == 0) return std::nullopt;
  std::smatch m;
  if (!std::regex_search(file_name, m, std::regex(pattern))) return std::nullopt;
  try {
    return std::make_pair(std::stoi(m[rank_group].str()), std::stoll(m[batch_group].str()));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

namespace {

constexpr int kImportProgressTag = 7782;

/// A pickle left out under --keep-going: its rank and why, sent to rank 0 for the summary.
struct LeftOut {
  int rank = 0;
  std::string file;
  std::string why;
};

std::vector<char> to_lines(const std::vector<LeftOut>& left) {
  std::string text;
  for (const auto& l : left) text += std::to_string(l.rank) + "\t" + l.file + "\t" + l.why + "\n";
  return {text.begin(), text.end()};
}

std::vector<LeftOut> from_lines(const std::vector<std::vector<char>>& all) {
  std::vector<LeftOut> out;
  for (const auto& bytes : all) {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    for (std::string line; std::getline(in, line);) {
      const auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
      if (t1 == std::string::npos || t2 == std::string::npos) continue;
      out.push_back(LeftOut{std::atoi(line.substr(0, t1).c_str()), line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1)});
    }
  }
  return out;
}

std::string plural(std::size_t n, const std::string& thing) {
  return std::to_string(n) + " " + thing + (n == 1 ? "" : "s");
}

}  // namespace

int import_main(const ImportCliOptions& o) {
  std::unique_ptr<mpi::World> mpi_world;
  try {
    mpi_world = std::make_unique<mpi::World>();
  } catch (const std::exception& e) {
    std::cerr << "memsnap import: " << e.what() << "\n";
    return 1;
  }
  const mpi::Comm* comm = &mpi_world->comm;
  const bool root = comm->rank() == 0;
  auto fail = [&](const std::string& line) {
    if (root) std::cerr << "memsnap import: " << line << "\n";
    return 1;
  };

  // Which file is which rank and batch: decided alike on every rank (no I/O yet).
  if ((o.rank.has_value() || o.batch.has_value()) && o.pickles.size() != 1) {
    return fail("--rank and --batch name one file; with several, name them by a --template");
  }
  if (o.rank.has_value() != o.batch.has_value()) return fail("--rank and --batch go together");
  int interval = o.interval;
  if (interval == 0 && !o.config.empty()) {
    try {
      // The file's own values only: no MEMSNAP_* variables of this shell.
      interval = static_cast<int>(std::min<std::int64_t>(load_config(o.config, [](const char*) {
                                                           return std::optional<std::string>();
                                                         }).interval,
                                                         100000));
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }
  std::map<int, std::vector<std::pair<std::int64_t, fs::path>>> by_rank;
  std::map<std::pair<int, std::int64_t>, fs::path> seen;
  for (const auto& p : o.pickles) {
    std::pair<int, std::int64_t> rb;
    if (o.rank) {
      rb = {*o.rank, *o.batch};
    } else if (auto parsed = parse_rank_batch(p.filename().string(), o.name_template)) {
      rb = *parsed;
    } else {
      return fail(p.string() + ": the name does not fit the template '" + o.name_template +
                  "' (give --template, e.g. 'snap_rank{rank}_step{batch}', or --rank and --batch)");
    }
    // One window per rank and batch: the same file twice, or two files of one window, is refused
    // here, before any work.
    if (auto [it, fresh] = seen.emplace(rb, p); !fresh) {
      std::error_code ec;
      const bool same = it->second == p || fs::equivalent(it->second, p, ec);
      return fail(same ? p.string() + " is given twice"
                       : it->second.string() + " and " + p.string() + " are both rank " + std::to_string(rb.first) +
                             ", batch " + std::to_string(rb.second) + " (one snapshot per rank and batch)");
    }
    by_rank[rb.first].emplace_back(rb.second, p);
  }
  int world = o.world_size;
  if (world == 0) world = by_rank.empty() ? 1 : by_rank.rbegin()->first + 1;
  if (!by_rank.empty() && by_rank.rbegin()->first >= world) {
    return fail("rank " + std::to_string(by_rank.rbegin()->first) + " is beyond --world-size " + std::to_string(world));
  }
  // Only a store memsnap wrote is ever replaced, and only with --overwrite: checked before any work.
  {
    std::string refusal;
    if (root) {
      refusal = output_refusal(inspect_store_output(o.output), o.overwrite,
                               "it and its data folder " + store_data_dir(o.output).filename().string());
    }
    if (const std::string first = mpi::agree_on_error(*comm, refusal); !first.empty()) return fail(first);
  }
  const std::string run_name = !o.run_name.empty() ? o.run_name : o.output.stem().string();

  // A private folder beside the store for the converted records; its name comes from rank 0.
  std::vector<char> name_bytes;
  if (root) {
    std::random_device rd;
    const std::string name = "." + o.output.filename().string() + ".import-" + std::to_string(getpid()) + "-" +
                             std::to_string(rd() % 1000000);
    name_bytes.assign(name.begin(), name.end());
  }
  mpi::bcast_bytes(*comm, name_bytes, 0);
  const fs::path work = fs::absolute(o.output).parent_path() / std::string(name_bytes.begin(), name_bytes.end());
  const fs::path spill_dir = work / "spill";

  // Each aggregator rank converts its share of ranks; failures are agreed on collectively.
  std::string error;
  std::error_code ec;
  if (root) {
    fs::create_directories(spill_dir, ec);
    if (ec) error = fs::absolute(o.output).parent_path().string() + ": cannot write the store in this folder: " + ec.message();
  }
  if (const std::string first = mpi::agree_on_error(*comm, error); !first.empty()) {
    if (root) fs::remove_all(work, ec);
    return fail(first);
  }
  std::size_t my_pickles = 0;
  {
    int index = 0;
    for (const auto& [rank, files] : by_rank) {
      if (index++ % comm->size() == comm->rank()) my_pickles += files.size();
    }
  }
  Progress progress(*comm, Progress::wanted(), o.pickles.size(), "memsnap import", "snapshots read",
                    kImportProgressTag);
  std::size_t processed = 0;
  std::vector<LeftOut> left_out;
  int index = 0;
  try {
    for (auto& [rank, files] : by_rank) {
      if (index++ % comm->size() != comm->rank() || !error.empty()) continue;
      std::sort(files.begin(), files.end());
      RankRecord merged;
      bool first = true;
      for (std::size_t fi = 0; fi < files.size(); ++fi) {
        const auto& [batch, path] = files[fi];
        try {
          torch::ImportOptions io;
          io.rank = rank;
          io.world_size = world;
          io.batch = batch;
          // Batches in the window: --interval, else the distance to the rank's neighbouring window
          // (Composer's repeated windows are `interval` batches apart), else unknown.
          io.expected_batches = interval;
          if (io.expected_batches == 0 && files.size() > 1) {
            const std::int64_t gap = fi > 0 ? batch - files[fi - 1].first : files[1].first - batch;
            if (gap > 0 && gap <= 100000) io.expected_batches = static_cast<int>(gap);
          }
          io.run_name = run_name;
          torch::ImportResult r = torch::import_snapshot_file(path.string(), io);
          // What the record has no place for travels with the window, so that export gives the
          // pickle back.
          for (auto& w : r.record.windows) w.source_extras = r.extras.dump();
          if (first) {
            merged.meta = r.record.meta;
            merged.meta.world_size = world;
            merged.meta.run_name = run_name;
            first = false;
          }
          merge_into(merged, std::move(r.record));
        } catch (const std::exception& e) {
          if (!o.keep_going) {
            error = e.what();
            break;
          }
          std::cerr << "memsnap import: warning: " << e.what() << " (left out: --keep-going)\n";
          left_out.push_back(LeftOut{rank, path.string(), e.what()});
        }
        ++processed;
        progress.add(1);
      }
      if (!error.empty() || first) continue;  // nothing readable: the rank comes out missing
      std::string werr;
      if (!write_spill(merged, spill_dir / spill_file_name(rank, merged.meta.pid), werr)) {
        // Named as the user sees it: the store's folder, not memsnap's working folder in it.
        const auto colon = werr.rfind(": ");
        error = fs::absolute(o.output).parent_path().string() + ": cannot write rank " + std::to_string(rank) +
                "'s converted snapshots there" + (colon == std::string::npos ? "" : werr.substr(colon));
      }
    }
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  progress.add(my_pickles - processed);  // what an error skipped, so that rank 0 stops waiting
  progress.finish();
  int code = 0;
  if (const std::string first = mpi::agree_on_error(*comm, error); !first.empty()) {
    if (root) std::cerr << "memsnap import: " << first << "\n";
    code = 1;
  } else {
    const std::vector<LeftOut> all_left = from_lines(mpi::gather_bytes(*comm, to_lines(left_out), 0));
    std::string none_read;
    if (root && all_left.size() == o.pickles.size()) {
      none_read = o.pickles.size() == 1 ? "the snapshot could not be read; nothing was written"
                                        : "none of the " + std::to_string(o.pickles.size()) +
                                              " snapshots could be read; nothing was written";
    }
    if (const std::string first = mpi::agree_on_error(*comm, none_read); !first.empty()) {
      MPI_Barrier(comm->get());
      if (root) fs::remove_all(work, ec);
      return fail(first);
    }
    AggregateOptions ao;
    ao.run_dir = work;
    ao.output = o.output;
    ao.overwrite = o.overwrite;
    ao.keep_going = o.keep_going || world > static_cast<int>(by_rank.size());
    ao.verb = "memsnap import";
    ao.progress = Progress::wanted();
    std::ostringstream warnings;
    ao.log = &warnings;
    AggregateDone done;
    ao.done = &done;
    try {
      aggregate(ao, comm->get());
      if (root) {
        // A rank whose every pickle was left out comes out missing: its pickles' lines said why.
        std::set<int> explained;
        for (const auto& l : all_left) explained.insert(l.rank);
        std::istringstream in(warnings.str());
        for (std::string line; std::getline(in, line);) {
          const std::string tag = "memsnap import: warning: rank ";
          if (line.rfind(tag, 0) == 0 && explained.count(std::atoi(line.c_str() + tag.size())) &&
              line.find(": missing: no spill file") != std::string::npos) {
            continue;
          }
          std::cerr << line << "\n";
        }
        const std::size_t total = o.pickles.size();
        std::cout << "memsnap import: ";
        if (all_left.empty()) {
          std::cout << plural(total, "snapshot") << " read";
        } else {
          std::cout << total - all_left.size() << " of " << plural(total, "snapshot") << " read (" << all_left.size()
                    << " left out:";
          for (std::size_t i = 0; i < all_left.size() && i < 3; ++i) std::cout << " " << all_left[i].file;
          if (all_left.size() > 3) std::cout << " ...";
          std::cout << ")";
        }
        std::cout << ", " << plural(static_cast<std::size_t>(done.ranks), "rank") << ", "
                  << plural(done.windows, "window") << " -> " << o.output.string() << "\n";
        print_batch_methods(o.output, std::cout);
        std::cout << "  next: memsnap report " << o.output.string() << "\n";
      }
    } catch (const AggregateError& e) {
      if (root) {
        std::cerr << warnings.str();
        std::cerr << "memsnap import: " << e.what() << "\n";
        for (const auto& d : e.details()) std::cerr << "  " << d << "\n";
      }
      code = 1;
    }
  }
  MPI_Barrier(comm->get());
  if (root) fs::remove_all(work, ec);
  return code;
}

}  // namespace memsnap
