// Findings kept in the store: `memsnap aggregate` (with and without mpirun) writes /findings and
// the cross-rank digest; they are what the rank files give when analysed again; an earlier
// format's store computes them on the fly; `memsnap info` lists them, a plain HDF5 reader and
// h5py read them, and `memsnap report` shows the store's findings without computing its own.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "memsnap/findings.hpp"
#include "memsnap/spill.hpp"
#include "memsnap/store.hpp"
#include "spill_gen.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using test::GenSpec;
using test::shell_quote;
using test::TempDir;

test::SplitResult sh(const std::string& cmd) {
  return test::run_shell_split(cmd);
}

std::string cli() { return (fs::path(MEMSNAP_BIN_DIR) / "memsnap").string(); }

test::SplitResult aggregate(int np, const fs::path& run, const fs::path& store) {
  std::string cmd;
  if (np > 0) cmd = std::string("timeout 120 ") + MEMSNAP_MPIEXEC + " -n " + std::to_string(np) + " --oversubscribe ";
  return sh(cmd + shell_quote(cli()) + " aggregate --keep-going -o " + shell_quote(store.string()) + " " +
            shell_quote(run.string()));
}

// World 6: ranks 0, 1, 3 and 5 fine, 2 missing, 4 killed inside its last window (truncated).
void make_run(const fs::path& run) {
  fs::create_directories(run / "spill");
  for (int r : {0, 1, 3, 4, 5}) {
    GenSpec s;
    s.rank = r;
    s.world_size = 6;
    s.last_window_open = r == 4;
    const RankRecord rec = test::make_record(s);
    ASSERT_TRUE(test::write_spill_file(run / "spill" / spill_file_name(r, 1000 + r), rec, r != 4));
  }
  test::cut_file(run / "spill" / spill_file_name(4, 1004), 5);
}

// The store as memsnap wrote format version 2: no /findings, no /digest.
void as_format_version_2(const fs::path& store) {
  const hid_t f = H5Fopen(store.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_GE(H5Ldelete(f, "findings", H5P_DEFAULT), 0);
  EXPECT_GE(H5Ldelete(f, "digest", H5P_DEFAULT), 0);
  const std::int64_t two = 2;
  const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &two), 0);
  H5Aclose(a);
  H5Fclose(f);
}

// The root file written again from `info` (its attributes, /ranks, /summary), `sites` and
// `findings`: the store as it was, but for what the test changed in those.
void rewrite_root(const fs::path& store, const StoreInfo& info, const std::vector<SiteRow>& sites, const StoreFindings& findings) {
  StoreIndex index;
  static_cast<StoreAttrs&>(index) = info;
  index.ranks = info.ranks;
  index.rows = info.rows;
  index.sites = sites;
  index.findings = &findings;
  fs::remove(store);
  write_root_file(store, index);
}

std::vector<std::string> kinds(const std::vector<Finding>& f) {
  std::vector<std::string> out;
  for (const auto& x : f) out.push_back(x.kind + " " + std::to_string(x.rank));
  return out;
}

// One string column of a dataset of compound rows, read with nothing but HDF5.
std::vector<std::string> raw_column(const fs::path& file, const char* dataset, const char* column, std::size_t width) {
  std::vector<std::string> out;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  const hid_t ds = H5Dopen2(f, dataset, H5P_DEFAULT);
  if (ds >= 0) {
    const hid_t space = H5Dget_space(ds);
    const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space));
    const hid_t str = H5Tcopy(H5T_C_S1);
    H5Tset_size(str, width);
    H5Tset_cset(str, H5T_CSET_UTF8);
    const hid_t mem = H5Tcreate(H5T_COMPOUND, width);
    H5Tinsert(mem, column, 0, str);
    std::vector<char> buf(n * width, '\0');
    if (n > 0 && H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0) {
      for (std::size_t i = 0; i < n; ++i) out.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
    }
    H5Tclose(mem);
    H5Tclose(str);
    H5Sclose(space);
    H5Dclose(ds);
  }
  H5Fclose(f);
  return out;
}

// The store holds the findings computed when it was written, the same with one aggregator rank
// or three, and they are what the rank files give when every window is analysed again (as
// `memsnap report` did before the store kept them).
TEST(FindingsStore, AggregateKeepsTheFindingsAndTheirDigest) {
  TempDir t;
  make_run(t / "run");
  std::vector<Finding> first;
  for (int np : {0, 3}) {
    SCOPED_TRACE("np " + std::to_string(np));
    const fs::path store = t / ("store" + std::to_string(np) + ".h5");
    const auto r = aggregate(np, t / "run", store);
    ASSERT_EQ(r.rc, 0) << r.err;
    const StoreReader reader(store);
    EXPECT_EQ(reader.info().format_version, 3);
    ASSERT_TRUE(reader.has_findings());
    const std::vector<Finding> stored = reader.findings();
    ASSERT_GE(stored.size(), 2u);
    EXPECT_EQ(kinds({stored.begin(), stored.begin() + 2}), (std::vector<std::string>{"missing 2", "truncated 4"}));
    EXPECT_EQ(stored[0].has_batch, false);
    EXPECT_NE(stored[1].detail.find("rank 4's record is truncated"), std::string::npos) << stored[1].detail;
    EXPECT_TRUE(stored[1].has_batch);
    EXPECT_GE(stored[1].window, 0);
    const StoreFindings again = compute_store_findings(reader);
    EXPECT_EQ(stored, again.findings);
    const DigestTables digest = reader.digest();
    EXPECT_EQ(digest.windows, again.digest.windows);
    EXPECT_EQ(digest.batches, again.digest.batches);
    EXPECT_EQ(digest.held, again.digest.held);
    EXPECT_EQ(digest.windows.size(), 10u);  // 5 ranks x 2 windows (rank 4's last one cut short)
    EXPECT_EQ(read_findings(store), stored);
    if (first.empty()) first = stored;
    EXPECT_EQ(stored, first);
    // A plain HDF5 reader finds the columns by name.
    const auto raw = raw_column(store, "findings", "kind", 64);
    ASSERT_EQ(raw.size(), stored.size());
    for (std::size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(raw[i], stored[i].kind);
  }
}

// A store written before /findings existed: read_findings computes them from its rank files, the
// same as a store that keeps them; `memsnap info` lists them either way.
TEST(FindingsStore, AnEarlierFormatsStoreComputesThemOnTheFly) {
  TempDir t;
  make_run(t / "run");
  const fs::path store = t / "run/memsnap.h5";
  ASSERT_EQ(aggregate(0, t / "run", store).rc, 0);
  const std::vector<Finding> stored = read_findings(store);
  ASSERT_FALSE(stored.empty());
  ASSERT_NO_FATAL_FAILURE(as_format_version_2(store));
  const StoreReader old(store);
  EXPECT_EQ(old.info().format_version, 2);
  EXPECT_FALSE(old.has_findings());
  EXPECT_EQ(read_findings(store), stored);
  EXPECT_THROW(stored_window_stats(old), StoreError);  // its windows must be analysed again
  const auto i = sh(shell_quote(cli()) + " info --json " + shell_quote(store.string()));
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_EQ(nlohmann::json::parse(i.out)["findings"], findings_json(stored));

  // The version 1 store of the fuzz corpus (one rank: no findings), read as it is.
  const std::string raw = test::read_file(fs::path(MEMSNAP_SOURCE_DIR) / "tests/fuzz/corpus/store_raw/aggregate_fsdp_sim.bin");
  ASSERT_GT(raw.size(), 4u);
  std::uint32_t n = 0;
  std::memcpy(&n, raw.data(), 4);
  fs::create_directories(t / "v1/memsnap.h5.d");
  test::write_file(t / "v1/memsnap.h5", raw.substr(4, n));
  test::write_file(t / "v1/memsnap.h5.d/rank0.h5", raw.substr(4 + n));
  EXPECT_EQ(StoreReader(t / "v1/memsnap.h5").info().format_version, 1);
  EXPECT_EQ(read_findings(t / "v1/memsnap.h5"), compute_store_findings(StoreReader(t / "v1/memsnap.h5")).findings);
}

// `memsnap info` lists the store's findings: in --json, and one line each in the table.
TEST(FindingsStore, InfoListsTheFindings) {
  TempDir t;
  make_run(t / "run");
  const fs::path store = t / "run/memsnap.h5";
  ASSERT_EQ(aggregate(0, t / "run", store).rc, 0);
  const auto j = sh(shell_quote(cli()) + " info --json " + shell_quote(store.string()));
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto info = nlohmann::json::parse(j.out);
  ASSERT_GE(info["findings"].size(), 2u) << j.out;
  EXPECT_EQ(info["findings"], findings_json(read_findings(store)));
  EXPECT_EQ(info["findings"][0]["kind"], "missing");
  EXPECT_EQ(info["findings"][0]["rank"], 2);
  EXPECT_TRUE(info["findings"][0]["batch"].is_null());
  // A rank's status_detail shows where it has one.
  EXPECT_FALSE(info["ranks"][4].value("status_detail", "").empty()) << j.out;
  EXPECT_FALSE(info["ranks"][0].contains("status_detail")) << j.out;
  const auto table = sh(shell_quote(cli()) + " info " + shell_quote(store.string()));
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find(std::to_string(info["findings"].size()) + " findings:\n  missing: rank 2 left no record (no spill file)\n  truncated: rank 4's record is truncated"),
            std::string::npos)
      << table.out;
}

// `memsnap report` renders the store's findings: a finding the store says differently is shown as
// the store says it, on the cross page, the rank page and in summary.json.
TEST(FindingsStore, ReportShowsTheStoresFindings) {
  TempDir t;
  make_run(t / "run");
  const fs::path store = t / "run/memsnap.h5";
  ASSERT_EQ(aggregate(0, t / "run", store).rc, 0);
  {
    const StoreReader reader(store);
    const StoreInfo info = reader.info();
    StoreFindings kept{reader.findings(), reader.digest()};
    kept.findings.push_back(Finding{.kind = "spike",
                                    .rank = 1,
                                    .window = 0,
                                    .has_batch = true,
                                    .batch = 3,
                                    .bytes = 77,
                                    .site = "kept_in_the_store (x.py:1)",
                                    .detail = "a finding only the store knows of",
                                    .method = "recorded"});
    // The store as it was, but for that finding.
    rewrite_root(store, info, reader.sites(), kept);
  }
  const auto r = sh(shell_quote(cli()) + " report --no-upload -o " + shell_quote((t / "report").string()) + " " +
                      shell_quote(store.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto summary = nlohmann::json::parse(test::read_file(t / "report/summary.json"));
  ASSERT_FALSE(summary["findings"].empty());
  EXPECT_EQ(summary["findings"], findings_json(read_findings(store)));
  EXPECT_EQ(summary["findings"].back()["detail"], "a finding only the store knows of");
  EXPECT_EQ(summary["findings"].back()["site"], "kept_in_the_store (x.py:1)");
  EXPECT_NE(test::read_file(t / "report/index.html").find("a finding only the store knows of"), std::string::npos);
  bool on_rank_page = false;
  for (const auto& e : fs::directory_iterator(t / "report")) {
    if (e.path().filename().string().find("rank1") == std::string::npos) continue;
    on_rank_page |= test::read_file(e.path()).find("a finding only the store knows of") != std::string::npos;
  }
  EXPECT_TRUE(on_rank_page);
}

// Every field of `stored` as `analysed` has it, but reserved_seen (not kept in the store).
void expect_same_stats(const WindowStats& stored, const WindowStats& analysed) {
  EXPECT_EQ(static_cast<const WindowSummary&>(stored), static_cast<const WindowSummary&>(analysed));
  EXPECT_EQ(static_cast<const WindowGrowth&>(stored), static_cast<const WindowGrowth&>(analysed));
  EXPECT_EQ(stored.batch_start, analysed.batch_start);
  EXPECT_EQ(stored.batch_end, analysed.batch_end);
  EXPECT_EQ(stored.oom, analysed.oom);
  EXPECT_EQ(stored.oom_requested, analysed.oom_requested);
  EXPECT_EQ(stored.live_at_oom, analysed.live_at_oom);
  EXPECT_EQ(stored.oom_site, analysed.oom_site);
  EXPECT_EQ(stored.oom_went_on, analysed.oom_went_on);
  EXPECT_EQ(stored.status, analysed.status);
  for (int c = 0; c < kCategoryCount; ++c) EXPECT_EQ(stored.category_bytes_at_peak[c], analysed.category_bytes_at_peak[c]);
  EXPECT_EQ(stored.batches, analysed.batches);
  EXPECT_EQ(stored.sites_at_low, analysed.sites_at_low);
  ASSERT_EQ(stored.sites.size(), analysed.sites.size());
  for (std::size_t i = 0; i < stored.sites.size(); ++i) {
    const SiteStat &a = stored.sites[i], &b = analysed.sites[i];
    EXPECT_EQ(std::tie(a.stack_id, a.name, a.category, a.bytes_at_peak, a.count_at_peak, a.bytes_allocated, a.allocations),
              std::tie(b.stack_id, b.name, b.category, b.bytes_at_peak, b.count_at_peak, b.bytes_allocated, b.allocations))
        << "site " << i;
  }
}

// On real torch pickles (tests/data/torch-loops through the real `memsnap import`; five loops
// that between them plant every cause, to keep the test short; all of them agreed when written):
// the findings the store keeps are those its rank files give analysed again, which is what
// `memsnap report` computed before the store kept them.
TEST(FindingsStore, ImportKeepsTheFindingsTheRankFilesGive) {
  const fs::path loops = fs::path(MEMSNAP_SOURCE_DIR) / "tests/data/torch-loops";
  std::size_t checked = 0, found = 0, windows = 0;
  for (const char* name : {"lm_autocast", "oom_caught", "amp_cat_metrics", "everyrank_cat", "fsdp2_ring"}) {
    const fs::directory_entry loop(loops / name);
    SCOPED_TRACE(name);
    TempDir t;
    std::string pickles;
    for (const auto& e : fs::directory_iterator(loop.path())) {
      if (e.path().extension() == ".pickle") pickles += " " + shell_quote(e.path().string());
    }
    const fs::path store = t / "s.h5";
    const auto r = sh(shell_quote(cli()) + " import" + pickles + " -o " + shell_quote(store.string()));
    ASSERT_EQ(r.rc, 0) << r.err;
    const StoreReader reader(store);
    ASSERT_TRUE(reader.has_findings());
    const StoreFindings again = compute_store_findings(reader);
    EXPECT_EQ(findings_json(reader.findings()), findings_json(again.findings));
    EXPECT_EQ(reader.digest().batches, again.digest.batches);
    // Each window's numbers as the store keeps them (what `memsnap report` reads) are those
    // analyse_window gives its rank file, but for reserved_seen, which the store does not keep.
    const auto stored = stored_window_stats(reader);
    for (const auto& rank : reader.info().ranks) {
      const RankRecord record = reader.read_rank(rank.rank);
      ASSERT_EQ(stored.at(static_cast<std::size_t>(rank.rank)).size(), record.windows.size());
      for (std::size_t i = 0; i < record.windows.size(); ++i) {
        SCOPED_TRACE("rank " + std::to_string(rank.rank) + " window " + std::to_string(i));
        expect_same_stats(stored[static_cast<std::size_t>(rank.rank)][i], analyse_window(record, record.windows[i]));
        ++windows;
      }
    }
    found += again.findings.size();
    ++checked;
  }
  EXPECT_EQ(checked, 5u);
  EXPECT_GT(found, checked);  // the loops plant causes
  EXPECT_GT(windows, 5u * 2);
}

// `memsnap report` takes each window's numbers from the store, not from a second analysis: a
// site the store names differently is shown as the store names it. And the pages of a store that
// keeps them are byte for byte those of the same store as an earlier format wrote it (no
// /digest: its windows analysed again), on a real loop with an OOM.
TEST(FindingsStore, ReportReadsEachWindowsNumbersFromTheStore) {
  TempDir t;
  const fs::path loop = fs::path(MEMSNAP_SOURCE_DIR) / "tests/data/torch-loops/oom_caught";
  std::string pickles;
  for (const auto& e : fs::directory_iterator(loop)) {
    if (e.path().extension() == ".pickle") pickles += " " + shell_quote(e.path().string());
  }
  const fs::path store = t / "s.h5";
  const auto imported = sh(shell_quote(cli()) + " import" + pickles + " -o " + shell_quote(store.string()));
  ASSERT_EQ(imported.rc, 0) << imported.err;
  auto report = [&](const char* name) {
    const auto r = sh(shell_quote(cli()) + " report --no-upload -o " + shell_quote((t / name).string()) + " " +
                      shell_quote(store.string()));
    EXPECT_EQ(r.rc, 0) << r.err;
    std::map<std::string, std::string> pages;
    for (const auto& e : fs::directory_iterator(t / name)) {
      if (e.path().extension() == ".html" && e.path().filename() != "index.html") pages[e.path().filename().string()] = test::read_file(e.path());
    }
    return pages;
  };
  const auto kept = report("kept");
  ASSERT_EQ(kept.size(), 8u);

  // As memsnap wrote format version 2: the pages come from analysing each window again.
  const fs::path v3 = t / "v3.h5";
  fs::copy_file(store, v3);
  ASSERT_NO_FATAL_FAILURE(as_format_version_2(store));
  const auto analysed = report("analysed");
  ASSERT_EQ(analysed.size(), kept.size());
  for (const auto& [name, page] : kept) EXPECT_TRUE(analysed.at(name) == page) << name << " differs";

  // The store's top site of rank 3's window renamed: the page shows the store's name.
  fs::remove(store);
  fs::copy_file(v3, store);
  std::string renamed;
  {
    const StoreReader reader(store);
    const StoreInfo info = reader.info();
    StoreFindings findings{reader.findings(), reader.digest()};
    std::vector<SiteRow> sites = reader.sites();
    for (auto& site : sites) {
      if (site.rank == 3 && renamed.empty()) {
        renamed = site.name;
        site.name = "renamed_in_the_store (x.py:1)";
      }
    }
    ASSERT_FALSE(renamed.empty());
    rewrite_root(store, info, sites, findings);
  }
  std::size_t shown = 0;
  for (const auto& [name, page] : report("renamed")) {
    const bool rank3 = name.find("rank3") != std::string::npos;
    const bool has = page.find("renamed_in_the_store (x.py:1)") != std::string::npos;
    EXPECT_EQ(has, rank3) << name;
    shown += has;
  }
  EXPECT_EQ(shown, 1u);
}

// h5py reads /findings. Debian's python3 (ci/setup.sh installs python3-h5py there), not whatever
// python3 comes first on the PATH (a pyenv shim has no h5py).
TEST(FindingsStore, H5pyReadsTheFindings) {
  if (sh("/usr/bin/python3 -c 'import h5py'").rc != 0) GTEST_SKIP() << "no h5py for /usr/bin/python3";
  TempDir t;
  make_run(t / "run");
  const fs::path store = t / "run/memsnap.h5";
  ASSERT_EQ(aggregate(0, t / "run", store).rc, 0);
  test::write_file(t / "check.py",
                   "import h5py, sys\n"
                   "f = h5py.File(sys.argv[1], 'r')\n"
                   "x = f['/findings'][:]\n"
                   "print([(k.decode(), int(r)) for k, r in zip(x['kind'], x['rank'])][:2], len(f['/digest/batches']) > 0)\n");
  const auto p = sh("/usr/bin/python3 " + shell_quote((t / "check.py").string()) + " " + shell_quote(store.string()));
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(p.out, "[('missing', 2), ('truncated', 4)] True\n");
}

}  // namespace
}  // namespace memsnap
