// Tests of the HTML report pages: escaping of hostile strings, self-containment, and real
// rendering in headless Chromium (pages and screenshots are left in the build tree).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <regex>
#include <sstream>
#include <string>

#include "html/html.hpp"
#include "synthetic_report_data.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using memsnap::report::render_cross_page;
using memsnap::report::render_rank_page;
using memsnap::test::CrossPageSpec;
using memsnap::test::RankPageSpec;

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << p;
}
std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// The JSON embedded in a page, parsed back.
json embedded_data(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"memsnap-data\">";
  const auto a = page.find(open);
  if (a == std::string::npos) return nullptr;
  const auto b = page.find("</script>", a);
  return json::parse(page.substr(a + open.size(), b - a - open.size()));
}

// ---- escaping --------------------------------------------------------------------------------

TEST(ReportHtmlEscapingTest, JsonForScriptEscapesEverythingThatEndsAScript) {
  const json j = {{"s", "</script><!-- & \u2028 \u2029 >"}};
  const std::string out = memsnap::report::json_for_script(j);
  EXPECT_EQ(out.find('<'), std::string::npos);
  EXPECT_EQ(out.find('>'), std::string::npos);
  EXPECT_EQ(out.find('&'), std::string::npos);
  EXPECT_EQ(out.find("\u2028"), std::string::npos);
  EXPECT_EQ(out.find("\u2029"), std::string::npos);
  EXPECT_EQ(json::parse(out), j);  // still the same data
}

TEST(ReportHtmlEscapingTest, InvalidUtf8DoesNotThrow) {
  const json j = {{"run_name", std::string("bad\xff\xfe utf8")}};
  std::string page;
  EXPECT_NO_THROW(page = render_rank_page(j));
  EXPECT_NE(page.find("memsnap-data"), std::string::npos);
}

TEST(ReportHtmlEscapingTest, HostileStringsCannotBreakOutOfTheData) {
  RankPageSpec rs;
  rs.hostile = true;
  rs.n_allocs = 400;
  CrossPageSpec cs;
  cs.hostile = true;
  const json hostile_finding = json::array({{{"kind", "leak"}, {"rank", 0}, {"site", "</script><img src=x>"}, {"detail", "<b onclick=1>"}}});
  for (const std::string& page : {render_rank_page(memsnap::test::synthetic_rank_page(rs), hostile_finding), render_cross_page(memsnap::test::synthetic_cross_page(cs))}) {
    const std::string l = lower(page);
    // Exactly our own script elements: boot, data, and common + cross.js on the cross page; the
    // rank page's findings, and its ten scripts (common, flame, rank_model, six views, rank).
    const std::size_t scripts = page.find("memsnap-findings") != std::string::npos ? 3 + 10 : 4;
    EXPECT_EQ(count(l, "<script"), scripts);
    EXPECT_EQ(count(l, "</script"), scripts);
    EXPECT_EQ(count(l, "<img"), 0u);
    EXPECT_EQ(count(l, "<svg"), 0u);
    EXPECT_EQ(count(l, "<b "), 0u);
    EXPECT_EQ(page.find("\u2028"), std::string::npos);
    EXPECT_NE(page.find("<title>memsnap · &lt;img src=x onerror=&quot;"), std::string::npos);
    const json data = embedded_data(page);
    ASSERT_TRUE(data.is_object());
    EXPECT_EQ(data["run_name"], "<img src=x onerror=\"document.body.dataset.pwned='run'\">");
  }
}

// ---- self-containment and size ---------------------------------------------------------------

TEST(ReportHtmlSelfContainedTest, PagesLoadNothingFromTheNetwork) {
  RankPageSpec rs;
  rs.n_allocs = 500;
  for (const std::string& page : {render_rank_page(memsnap::test::synthetic_rank_page(rs)),
                                  render_cross_page(memsnap::test::synthetic_cross_page({})),
                                  render_rank_page(json::object()), render_cross_page(json::object())}) {
    const std::string l = lower(page);
    for (const char* bad : {"http://", "https://", "src=", "@import", "url(", "fetch(", "xmlhttprequest", "websocket",
                            "import(", "sendbeacon", "<link", "<iframe", "<object", "<embed", "eventsource", "worker("})
      EXPECT_EQ(l.find(bad), std::string::npos) << "page contains '" << bad << "'";
    // And the browser is told to refuse any load, should a string ever get through.
    EXPECT_NE(page.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  }
}

TEST(ReportHtmlSizeTest, MillionEventWindowStaysCompact) {
  RankPageSpec rs;
  rs.n_allocs = 20000;
  rs.other_allocs = 490000;
  const json data = memsnap::test::synthetic_rank_page(rs);
  const std::string page = render_rank_page(data);
  EXPECT_LT(page.size(), 8u << 20) << "the 20000-band page is " << page.size() << " bytes";
  const std::string empty = render_rank_page(json::object());
  EXPECT_LT(empty.size(), 300u << 10);
  EXPECT_GT(empty.size(), 20u << 10);  // the assets are really in there
  const json back = embedded_data(page);
  EXPECT_EQ(back["allocs"]["size"].size(), data["allocs"]["size"].size());
}

TEST(ReportHtmlSizeTest, ThousandRankCrossPageStaysCompact) {
  CrossPageSpec cs;
  cs.world_size = 1024;
  cs.windows = 4;
  const std::string page = render_cross_page(memsnap::test::synthetic_cross_page(cs));
  // 4096 windows with a sparkline each: a few hundred bytes apiece, not kilobytes.
  EXPECT_LT(page.size(), 4u << 20) << "the 1024-rank cross page is " << page.size() << " bytes";
}

TEST(ReportHtmlDataTest, SparkLevelsAreTwoCharactersALevel) {
  using memsnap::report::spark_levels;
  EXPECT_EQ(spark_levels({0, 500, 1000}, 1000), "AAgA__");  // 0, 2048 and 4095 of 4095
  EXPECT_EQ(spark_levels({64, 9000}, 4095), "BA__");  // 64 = 1 << 6; above max: clamped
  EXPECT_EQ(spark_levels({7, 7}, 0), "AAAA");
  EXPECT_EQ(spark_levels({}, 10), "");
}

TEST(ReportHtmlDataTest, TimesAreRebasedExactlyAndAddressesKeptAsHex) {
  const std::int64_t t0 = 1733140000000000123;  // not representable as a JS number
  json d = {{"t0_ns", t0}, {"t1_ns", t0 + 1000},
            {"allocs", {{"addr", {0x7f3a00000200LL}}, {"size", {512}}, {"start_ns", {t0 - 7}}, {"end_ns", {-1}}}},
            {"segments", json::array({{{"addr", 0x7f3a00000000LL}, {"size", 2097152}, {"blocks", json::array({{{"addr", 0x7f3a00000200LL}, {"size", 512}, {"state", 1}, {"stack", -1}}})}}})},
            {"batches", json::array({{{"batch", 2}, {"time_ns", t0 + 3}}})}};
  const json v = embedded_data(render_rank_page(d));
  EXPECT_EQ(v["time_base_ns"], std::to_string(t0));
  EXPECT_EQ(v["t1_ns"], 1000);
  EXPECT_EQ(v["allocs"]["start_ns"][0], -7);
  EXPECT_TRUE(v["allocs"]["end_ns"][0].is_null());
  EXPECT_EQ(v["allocs"]["addr"][0], "7f3a00000200");
  EXPECT_EQ(v["batches"][0]["time_ns"], 3);
  EXPECT_EQ(v["segments"]["addr"][0], "7f3a00000000");
  EXPECT_EQ(v["blocks"]["offset"][0], 0x200);
}

TEST(ReportHtmlDataTest, OddInputStillRenders) {
  for (const json& d : {json(), json::object(), json::array({1, 2}), json{{"allocs", "nope"}, {"segments", 3}, {"stats", nullptr}},
                        json{{"ranks", json::array({nullptr, 1, json::object()})}}}) {
    EXPECT_NO_THROW(render_rank_page(d));
    EXPECT_NO_THROW(render_cross_page(d));
  }
}

// ---- real browser ----------------------------------------------------------------------------

std::string find_chromium() {
  if (const char* env = std::getenv("MEMSNAP_CHROMIUM"); env && *env) return access(env, X_OK) == 0 ? env : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
      const std::string p = dir + "/" + name;
      if (access(p.c_str(), X_OK) == 0) return p;
    }
  return "";
}

// The value of attribute `name` on the first element that starts with `element_start`.
std::string attr_of(const std::string& dom, const std::string& element_start, const std::string& name);

class ReportHtmlBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_chromium = find_chromium();
    ASSERT_FALSE(m_chromium.empty())
        << "Chromium is required for the report browser tests and was not found in PATH "
           "(install Debian's 'chromium' package, or point MEMSNAP_CHROMIUM at a Chrome binary).";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    m_dir = fs::path(MEMSNAP_TEST_OUTPUT_DIR) / info->name();
    fs::remove_all(m_dir);
    fs::create_directories(m_dir);
  }

  std::string chromium(const std::string& flags, const fs::path& page, const std::string& hash, const fs::path& out) {
    const fs::path profile = m_dir / ".profile";
    const std::string cmd = "timeout 120 '" + m_chromium + "' --headless=new --no-sandbox --disable-gpu --hide-scrollbars " +
                            "--no-first-run --no-default-browser-check --user-data-dir='" + profile.string() + "' " + flags +
                            " 'file://" + fs::absolute(page).string() + hash + "' > '" + out.string() + "' 2> '" +
                            (m_dir / "chromium.log").string() + "'";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << cmd << "\n" << read_file(m_dir / "chromium.log").substr(0, 4000);
    return read_file(out);
  }
  std::string dump_dom(const fs::path& page, bool selftest = true) {
    const auto t = std::chrono::steady_clock::now();
    std::string dom = chromium("--virtual-time-budget=10000 --window-size=1400,1000 --dump-dom", page, selftest ? "#selftest" : "",
                               m_dir / (page.stem().string() + ".dom.html"));
    std::cout << "[chromium] " << page.filename().string() << ": dump-dom took "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() << " s\n";
    return dom;
  }
  void screenshot(const fs::path& page, const std::string& name, int width = 1400, int height = 1000, const std::string& hash = "") {
    const fs::path png = m_dir / (name + ".png");
    chromium("--virtual-time-budget=10000 --window-size=" + std::to_string(width) + "," + std::to_string(height) + " --screenshot='" + png.string() + "'",
             page, hash, m_dir / (name + ".screenshot.log"));
    EXPECT_TRUE(fs::exists(png) && fs::file_size(png) > 10000) << "no screenshot at " << png;
    std::cout << "[chromium] screenshot " << png.string() << "\n";
  }
  // body[data-NAME], or "" when absent.
  static std::string body_attr(const std::string& dom, const std::string& name) {
    return attr_of(dom, "<body", "data-" + name);
  }
  // The page rendered, without script errors, and its self test (#selftest) passed.
  void expect_rendered(const std::string& dom, const std::string& what, bool selftest = true) {
    EXPECT_EQ(body_attr(dom, "ready"), "1") << what << " did not finish rendering";
    EXPECT_EQ(body_attr(dom, "error"), "") << what << " hit a script error";
    EXPECT_EQ(dom.find("data-pwned"), std::string::npos) << what << ": injected markup ran";
    if (selftest) {
      const std::string st = body_attr(dom, "selftest");
      EXPECT_FALSE(st.empty()) << what << ": self test did not run";
      EXPECT_EQ(st.find("fail"), std::string::npos) << what << ": " << st;
      EXPECT_EQ(st.find("error"), std::string::npos) << what << ": " << st;
    }
    std::cout << "[chromium] " << what << ": render " << body_attr(dom, "render-ms") << " ms (ready at "
              << body_attr(dom, "ready-at-ms") << " ms after navigation start"
              << (body_attr(dom, "geometry-ms").empty() ? "" : ", band geometry " + body_attr(dom, "geometry-ms") + " ms, first draw " + body_attr(dom, "first-draw-ms") + " ms")
              << ") selftest: " << body_attr(dom, "selftest") << "\n";
    RecordProperty(what + "_render_ms", body_attr(dom, "render-ms"));
  }

  // A copy of `page` beside it with `script` run after the page's own (it reports into body[data-*]).
  fs::path with_script(const fs::path& page, const std::string& name, const std::string& script) {
    std::string html = read_file(page);
    const auto at = html.rfind("</body>");
    html.insert(at == std::string::npos ? html.size() : at, "<script>\n" + script + "\n</script>\n");
    const fs::path out = page.parent_path() / name;
    write_file(out, html);
    return out;
  }
  std::string dump_dom_at(const fs::path& page, const std::string& hash, int width = 1400) {
    return chromium("--virtual-time-budget=10000 --window-size=" + std::to_string(width) + ",1000 --dump-dom", page, hash,
                    m_dir / (page.stem().string() + ".dom.html"));
  }

  std::string m_chromium;
  fs::path m_dir;
};

// A shell command's exit status and its stdout and stderr together.
struct Ran {
  int code = -1;
  std::string out;
};
Ran sh(const std::string& cmd) {
  const fs::path log = fs::temp_directory_path() / ("memsnap-report-test-" + std::to_string(getpid()) + ".log");
  const int rc = std::system((cmd + " > '" + log.string() + "' 2>&1").c_str());
  Ran r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(log)};
  fs::remove(log);
  return r;
}
const std::string kMemsnap = MEMSNAP_CLI;
const std::string kLoops = std::string(MEMSNAP_TEST_DATA) + "/torch-loops/";

// Imports a real loop of tests/data/torch-loops into DIR/memsnap.h5.
void import_loop(const std::string& loop, const fs::path& dir) {
  const Ran r = sh(kMemsnap + " import " + kLoops + loop + "/*.pickle -o '" + (dir / "memsnap.h5").string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
}
std::string attr_of(const std::string& dom, const std::string& element_start, const std::string& name) {
  const auto at = dom.find(element_start);
  if (at == std::string::npos) return "";
  const auto end = dom.find('>', at);
  // By hand, not with std::regex: libstdc++'s matcher recurses per character, and a long value
  // (a flame path) overflows the stack under ASan.
  const std::string tag = dom.substr(at, end - at);
  const std::string key = " " + name + "=\"";
  const auto v = tag.find(key);
  if (v == std::string::npos) return "";
  const auto from = v + key.size();
  const auto to = tag.find('"', from);
  return to == std::string::npos ? "" : tag.substr(from, to - from);
}

TEST_F(ReportHtmlBrowserTest, FourRankFsdpRun) {
  CrossPageSpec cs;
  cs.world_size = 4;
  cs.leak_rank = 3;
  cs.imbalance_rank = 1;
  cs.spike_rank = 2;
  const json cross = memsnap::test::synthetic_cross_page(cs);
  write_file(m_dir / "index.html", render_cross_page(cross));
  json rank3;
  for (int r = 0; r < 4; ++r) {
    RankPageSpec rs;
    rs.rank = r;
    rs.batch_end = 4;
    rs.n_allocs = 3000;
    rs.leak = r == 3;
    rs.shard_scale = r == 1 ? 1.32 : 1.0;
    const json d = memsnap::test::synthetic_rank_page(rs);
    if (r == 3) rank3 = d;
    write_file(m_dir / ("rank" + std::to_string(r) + ".4.html"), render_rank_page(d));
  }

  const std::string dom = dump_dom(m_dir / "index.html");
  expect_rendered(dom, "cross page (4 ranks)");
  EXPECT_EQ(count(dom, "<li class=\"finding\""), cross["findings"].size());
  EXPECT_NE(dom.find("data-kind=\"leak\" data-rank=\"3\""), std::string::npos);
  EXPECT_NE(dom.find("Rank 3 leaks 64.0 MiB per batch at "), std::string::npos);
  EXPECT_NE(dom.find("data-kind=\"shard_imbalance\" data-rank=\"1\""), std::string::npos);
  EXPECT_EQ(count(dom, "<tr class=\"row clickable rank-row"), 4u);
  EXPECT_EQ(count(dom, "data-bars=\"4\""), 3u);
  EXPECT_EQ(count(dom, "class=\"row clickable diff-row\""), 20u);  // first page of the site diffs

  const std::string rdom = dump_dom(m_dir / "rank3.4.html");
  expect_rendered(rdom, "rank page (3000 bands)");
  EXPECT_NE(rdom.find("data-bands=\"" + std::to_string(rank3["allocs"]["size"].size()) + "\""), std::string::npos);
  EXPECT_EQ(count(rdom, "site-row\" data-bytes="), std::min<std::size_t>(25, rank3["sites"].size()));
  EXPECT_NE(rdom.find("data-segments=\"" + std::to_string(rank3["segments"].size()) + "\""), std::string::npos);
  EXPECT_NE(rdom.find("href=\"index.html\""), std::string::npos);  // link back to the cross-rank page

  screenshot(m_dir / "index.html", "cross4");
  screenshot(m_dir / "index.html", "cross4_full", 1400, 3000);
  screenshot(m_dir / "rank3.4.html", "rank3");
  screenshot(m_dir / "rank3.4.html", "rank3_full", 1400, 2200);
  // After the self test: a band pinned in the detail panel, the sites table sorted and expanded.
  screenshot(m_dir / "rank3.4.html", "rank3_pinned", 1400, 1000, "#selftest");
  screenshot(m_dir / "rank3.4.html", "rank3_zoomed", 1400, 1000, "#view=0,40000000");
}

TEST_F(ReportHtmlBrowserTest, MillionEventWindow) {
  RankPageSpec rs;
  rs.rank = 5;
  rs.world_size = 8;
  rs.n_allocs = 20000;
  rs.other_allocs = 490000;  // with the listed ones, 1.02M events in the window
  rs.oom = true;
  const json d = memsnap::test::synthetic_rank_page(rs);
  ASSERT_GE(d["stats"]["n_events"].get<std::int64_t>(), 1000000);
  write_file(m_dir / "rank5.10.html", render_rank_page(d));
  const std::string dom = dump_dom(m_dir / "rank5.10.html");
  expect_rendered(dom, "rank page (20000 bands, 1M events)");
  EXPECT_NE(dom.find("data-bands=\"" + std::to_string(d["allocs"]["size"].size()) + "\""), std::string::npos);
  EXPECT_NE(dom.find("data-oom=\"1\""), std::string::npos);
  screenshot(m_dir / "rank5.10.html", "rank_1m");
}

TEST_F(ReportHtmlBrowserTest, ThousandRankRun) {
  CrossPageSpec cs;
  cs.world_size = 1024;
  cs.windows = 4;
  cs.leak_rank = 3;
  cs.imbalance_rank = 17;
  cs.spike_rank = 500;
  cs.oom_rank = 1000;
  cs.missing_rank = 77;
  cs.truncated_rank = 900;
  cs.n_site_diffs = 120;
  const json cross = memsnap::test::synthetic_cross_page(cs);
  write_file(m_dir / "index.html", render_cross_page(cross));
  const std::string dom = dump_dom(m_dir / "index.html");
  expect_rendered(dom, "cross page (1024 ranks)");
  EXPECT_EQ(count(dom, "data-bars=\"1024\""), 3u);
  EXPECT_EQ(count(dom, "<li class=\"finding\""), cross["findings"].size());
  for (const char* f : {"data-kind=\"oom\" data-rank=\"1000\"", "data-kind=\"missing\" data-rank=\"77\"", "data-kind=\"spike\" data-rank=\"500\"",
                        "data-kind=\"truncated\" data-rank=\"900\"", "data-kind=\"leak\" data-rank=\"3\""})
    EXPECT_NE(dom.find(f), std::string::npos) << f;
  // Without the self test, the table shows the first 50 of 1,024 ranks.
  const std::string plain = dump_dom(m_dir / "index.html", false);
  expect_rendered(plain, "cross page (1024 ranks, no selftest)", false);
  EXPECT_NE(plain.find("1–50 of 1,024"), std::string::npos);
  EXPECT_EQ(count(plain, "<tr class=\"row clickable rank-row"), 50u);  // paginated, not 1024 rows
  screenshot(m_dir / "index.html", "cross1024");
  screenshot(m_dir / "index.html", "cross1024_full", 1400, 3000);
}

// A leak in the code every rank runs, at 1,024 ranks: one row that names how many ranks and which,
// not 1,024 rows; a finding of its own (the spike) stays its own row, and summary.json keeps
// every finding (the page only groups them).
TEST_F(ReportHtmlBrowserTest, ALeakOnEveryRankIsOneRow) {
  CrossPageSpec cs;
  cs.world_size = 1024;
  cs.spike_rank = 500;
  cs.imbalance_rank = -1;
  json cross = memsnap::test::synthetic_cross_page(cs);
  json findings = json::array();
  for (const auto& f : cross["findings"]) findings.push_back(f);
  for (int r = 0; r < 1024; ++r) {
    findings.push_back({{"kind", "leak"}, {"rank", r}, {"batch", 7}, {"bytes", (r == 9 ? 25 : 24) * 1024 * 1024},
                        {"site", "train (train.py:88)"},
                        {"detail", "rank " + std::to_string(r) + " keeps 24.0 MiB more after every batch"}});
  }
  // Two alike are still two rows.
  for (int r : {3, 4}) {
    findings.push_back({{"kind", "shard_imbalance"}, {"rank", r}, {"batch", nullptr}, {"bytes", 8 * 1024 * 1024},
                        {"site", "init (model.py:3)"}, {"detail", "holds more"}});
  }
  cross["findings"] = findings;
  write_file(m_dir / "index.html", render_cross_page(cross));
  const std::string dom = dump_dom(m_dir / "index.html");
  expect_rendered(dom, "cross page (a leak on all 1024 ranks)");
  EXPECT_EQ(count(dom, "<li class=\"finding group\""), 1u);
  EXPECT_NE(dom.find("data-kind=\"leak\" data-ranks=\"1024\""), std::string::npos);
  EXPECT_NE(dom.find("1024 ranks (0\u20131023) each leak 24.0 MiB\u201325.0 MiB per batch at "), std::string::npos);
  EXPECT_NE(dom.find("data-kind=\"spike\" data-rank=\"500\""), std::string::npos);
  EXPECT_EQ(count(dom, "data-kind=\"shard_imbalance\" data-rank="), 2u);
  EXPECT_EQ(count(dom, "<li class=\"finding\""), cross["findings"].size() - 1024);
  screenshot(m_dir / "index.html", "cross1024_grouped");
}

TEST_F(ReportHtmlBrowserTest, HostileStringsStayText) {
  RankPageSpec rs;
  rs.hostile = true;
  rs.n_allocs = 600;
  CrossPageSpec cs;
  cs.hostile = true;
  write_file(m_dir / "rank.html", render_rank_page(memsnap::test::synthetic_rank_page(rs)));
  write_file(m_dir / "index.html", render_cross_page(memsnap::test::synthetic_cross_page(cs)));
  for (const char* name : {"rank.html", "index.html"}) {
    const std::string dom = dump_dom(m_dir / name);
    expect_rendered(dom, std::string("hostile ") + name);
    const std::string l = lower(dom);
    EXPECT_EQ(l.find("<img"), std::string::npos);
    EXPECT_EQ(l.find("<svg"), std::string::npos);
    EXPECT_EQ(l.find("href=\"javascript"), std::string::npos);
    EXPECT_NE(dom.find("&lt;img src=x onerror="), std::string::npos);  // shown, as text
  }
  screenshot(m_dir / "rank.html", "hostile_rank");
}

TEST_F(ReportHtmlBrowserTest, EmptyDataRendersGracefully) {
  write_file(m_dir / "rank.html", render_rank_page(json{{"format_version", 1}, {"rank", 2}}));
  write_file(m_dir / "index.html", render_cross_page(json{{"format_version", 1}}));
  const std::string rdom = dump_dom(m_dir / "rank.html");
  expect_rendered(rdom, "empty rank page");
  EXPECT_NE(rdom.find("no segments recorded"), std::string::npos);
  EXPECT_NE(rdom.find("no allocation sites recorded"), std::string::npos);
  const std::string cdom = dump_dom(m_dir / "index.html");
  expect_rendered(cdom, "empty cross page");
  EXPECT_NE(cdom.find("no windows recorded"), std::string::npos);
  EXPECT_NE(cdom.find("No findings"), std::string::npos);
}

// ---- the pages of a real report ---------------------------------------------------------------

// fsdp2_ring (5 ranks, a trace ring buffer of 812 entries, so each window opens mid-batch): rank 2
// leaks, rank 0 holds an unsharded module, rank 3 spikes in batch 4 of its window of batches 3-5.
class ReportPagesTest : public ReportHtmlBrowserTest {
 protected:
  void SetUp() override {
    ReportHtmlBrowserTest::SetUp();
    import_loop("fsdp2_ring", m_dir);
    const Ran r = sh(kMemsnap + " report '" + (m_dir / "memsnap.h5").string() + "' --no-upload");
    ASSERT_EQ(r.code, 0) << r.out;
    m_report = m_dir / "report";
  }
  fs::path m_report;
};

// The rank page opens with the findings about its rank and window, marks the finding's batch on
// the timeline and highlights the allocations of its site; the cross page's "open page" lands on it.
TEST_F(ReportPagesTest, RankPageOpensWithItsFindings) {
  const json summary = json::parse(read_file(m_report / "summary.json"));
  std::map<std::string, json> by_kind;
  for (const auto& f : summary["findings"]) by_kind[f["kind"]] = f;
  ASSERT_TRUE(by_kind.count("leak") && by_kind.count("spike") && by_kind.count("shard_imbalance")) << summary["findings"];
  ASSERT_EQ(by_kind["spike"]["rank"], 3);
  ASSERT_EQ(by_kind["spike"]["batch"], 4);

  // The cross page links each finding to its anchor on the rank page.
  const std::string cross = dump_dom(m_report / "index.html", false);
  expect_rendered(cross, "cross page of fsdp2_ring", false);
  EXPECT_NE(cross.find("href=\"rank3.5.pt.trace.memory_snapshot.html#finding-spike-4\""), std::string::npos);
  EXPECT_NE(cross.find("href=\"rank2.5.pt.trace.memory_snapshot.html#finding-leak-5\""), std::string::npos);
  // The heatmap's rows name the batches a window spans: the spike's batch 4 is in "batches 2–5".
  EXPECT_NE(attr_of(cross, "<canvas class=\"interactive\" aria-label=\"peak allocated per rank and batch\"", "data-rows").find("batches 2\u20135"),
            std::string::npos);

  // The spike, followed from the cross page.
  const std::string spike = dump_dom_at(m_report / "rank3.5.pt.trace.memory_snapshot.html", "#finding-spike-4");
  expect_rendered(spike, "rank 3's page at its spike", false);
  EXPECT_NE(spike.find("<section class=\"card\" id=\"findings\">"), std::string::npos);
  EXPECT_NE(spike.find("<li class=\"finding active\" id=\"finding-spike-4\" data-kind=\"spike\" data-rank=\"3\" data-batch=\"4\""), std::string::npos);
  EXPECT_EQ(attr_of(spike, "<canvas class=\"interactive\" tabindex=\"0\"", "data-marked-batch"), "4");
  const std::string lit = attr_of(spike, "<canvas class=\"interactive\" tabindex=\"0\"", "data-highlighted");
  EXPECT_GT(std::atoi(lit.c_str()), 0) << "the spike's largest live blocks at its peak are highlighted";
  EXPECT_LE(std::atoi(lit.c_str()), 20);
  // The findings come first on the page: before the stats and the timeline.
  EXPECT_LT(spike.find("id=\"findings\""), spike.find("class=\"stats\""));

  // The leak, opened without an anchor: its first finding is shown; its kept allocations are lit.
  const std::string leak = dump_dom(m_report / "rank2.5.pt.trace.memory_snapshot.html", false);
  expect_rendered(leak, "rank 2's page (a leak)", false);
  EXPECT_NE(leak.find("<li class=\"finding active\" id=\"finding-leak-5\""), std::string::npos);
  EXPECT_GT(std::atoi(attr_of(leak, "<canvas class=\"interactive\" tabindex=\"0\"", "data-highlighted").c_str()), 0);
  EXPECT_NE(leak.find("kept allocations"), std::string::npos);
  // Its summary agrees with the finding: the window opened mid-batch, so what it kept is counted
  // from the first batch start in it, not from the mid-batch level at open (that read -27.1 MiB).
  std::smatch close;
  ASSERT_TRUE(std::regex_search(leak, close, std::regex("Live at close</div><div class=\"v\">[^<]*</div><div class=\"n\">([^<]*)</div>")));
  EXPECT_EQ(close[1].str().rfind("+", 0), 0u) << close[1].str();
  EXPECT_NE(close[1].str().find("since batch 3 began"), std::string::npos) << close[1].str();
  EXPECT_NE(close[1].str().find("keeps 9.00 MiB per batch"), std::string::npos) << close[1].str();

  // The imbalance: the memory its site holds at every batch boundary.
  const std::string held = dump_dom(m_report / "rank0.5.pt.trace.memory_snapshot.html", false);
  EXPECT_NE(held.find("<li class=\"finding active\" id=\"finding-shard_imbalance\""), std::string::npos);
  EXPECT_GT(std::atoi(attr_of(held, "<canvas class=\"interactive\" tabindex=\"0\"", "data-highlighted").c_str()), 0);
  EXPECT_NE(held.find("allocations held at every batch boundary"), std::string::npos);

  // A clean rank says so.
  const std::string clean = dump_dom(m_report / "rank1.5.pt.trace.memory_snapshot.html", false);
  EXPECT_NE(clean.find("No findings about rank 1 in this window."), std::string::npos);
  screenshot(m_report / "rank3.5.pt.trace.memory_snapshot.html", "spike_from_cross", 1400, 1400, "#finding-spike-4");
}

// An imported page names where it came from and shows no empty host or device label.
TEST_F(ReportPagesTest, ImportedPagesShowNoEmptyLabels) {
  const std::string dom = dump_dom(m_report / "rank1.5.pt.trace.memory_snapshot.html", false);
  expect_rendered(dom, "an imported rank page", false);
  EXPECT_EQ(dom.find("host <b></b>"), std::string::npos);
  EXPECT_EQ(dom.find("device <b></b>"), std::string::npos);
  EXPECT_NE(dom.find("imported from <b>"), std::string::npos);
}

// The navigation bar keeps every link visible on a narrow window (it was clipped below ~1000 px).
TEST_F(ReportPagesTest, NavigationBarIsNotClippedWhenNarrow) {
  const std::string measure =
      "(function(){var bar=document.querySelector('.topbar').getBoundingClientRect();var bad=[];"
      "document.querySelectorAll('.topbar nav a, .topbar nav span').forEach(function(a){var r=a.getBoundingClientRect();"
      "if(r.bottom>bar.bottom+0.5||r.right>window.innerWidth+0.5||r.top<bar.top-0.5)bad.push(a.textContent);});"
      "document.body.dataset.navClipped=bad.join('|')||'none';})();";
  for (const char* page : {"index.html", "rank2.5.pt.trace.memory_snapshot.html"}) {
    const fs::path p = with_script(m_report / page, std::string("narrow_") + page, measure);
    for (int width : {600, 800, 1000}) {
      const std::string dom = dump_dom_at(p, "", width);
      EXPECT_EQ(body_attr(dom, "nav-clipped"), "none") << page << " at " << width << " px";
    }
  }
  screenshot(m_report / "index.html", "cross_narrow", 800, 600);
}

// oom_caught: rank 3 catches an OOM in batch 4 and goes on. Its page shows the OOM badge, not
// "ok" beside it; so does its row of the cross page's rank table.
TEST_F(ReportHtmlBrowserTest, OomPagesShowOneBadge) {
  import_loop("oom_caught", m_dir);
  const Ran r = sh(kMemsnap + " report '" + (m_dir / "memsnap.h5").string() + "' --no-upload");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string dom = dump_dom(m_dir / "report/rank3.5.pt.trace.memory_snapshot.html", false);
  expect_rendered(dom, "rank 3's page (OOM)", false);
  const auto head = dom.substr(dom.find("<div class=\"page-head\">"), 4000);
  EXPECT_NE(head.find("data-oom=\"1\""), std::string::npos);
  EXPECT_EQ(head.find(">ok</span>"), std::string::npos) << "an \"ok\" badge beside the OOM badge";
  const std::string cross = dump_dom(m_dir / "report/index.html", false);
  const auto row = cross.find("<tr class=\"row clickable rank-row\" data-rank=\"3\">");
  ASSERT_NE(row, std::string::npos);
  const std::string cells = cross.substr(row, cross.find("</tr>", row) - row);
  EXPECT_NE(cells.find(">OOM</span>"), std::string::npos);
  EXPECT_EQ(cells.find(">ok</span>"), std::string::npos) << cells;
}

// A persistent chart of tiny values: nice whole-byte ticks, no label twice ("1 B, 1 B, 0 B").
// And one definition of an outlier everywhere: the tile's count is what every chart marks red.
TEST_F(ReportHtmlBrowserTest, ChartAxesAndOutliersAgree) {
  CrossPageSpec cs;
  cs.world_size = 256;
  cs.windows = 2;
  json cross = memsnap::test::synthetic_cross_page(cs);
  int k = 0;
  for (auto& r : cross["ranks"]) {
    for (auto& w : r["windows"]) {
      w["persistent"] = k % 3 == 0 ? 1 : 0;  // bytes: an imported snapshot holds next to nothing for good
      // A third of the ranks reserve 1.5x the median: the old per-chart rule called them outliers.
      if (k % 3 == 1) w["peak_reserved"] = w["peak_reserved"].get<double>() * 1.5;
    }
    ++k;
  }
  cross["imbalance"]["outlier_ranks"] = json::array({3});
  write_file(m_dir / "index.html", render_cross_page(cross));
  const std::string dom = dump_dom(m_dir / "index.html", false);
  expect_rendered(dom, "cross page (tiny persistent values)", false);
  for (const char* metric : {"peak", "reserved", "persistent"}) {
    const std::string canvas = "data-metric=\"" + std::string(metric) + "\"";
    const auto at = dom.rfind("<canvas", dom.find(canvas));
    ASSERT_NE(at, std::string::npos) << metric;
    const std::string tag = dom.substr(at, dom.find('>', at) - at);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(tag, m, std::regex("data-y-ticks=\"([^\"]*)\""))) << metric << ": " << tag;
    std::set<std::string> seen;
    std::stringstream ticks(m[1].str());
    std::string t;
    while (std::getline(ticks, t, '|')) {
      EXPECT_TRUE(seen.insert(t).second) << metric << " axis repeats " << t << ": " << m[1].str();
      if (t.size() > 2 && t.compare(t.size() - 2, 2, " B") == 0 && !std::isalpha(static_cast<unsigned char>(t[t.size() - 3]))) {
        EXPECT_EQ(t.find('.'), std::string::npos) << metric << " axis has a fraction of a byte: " << m[1].str();
      }
    }
    ASSERT_TRUE(std::regex_search(tag, m, std::regex("data-outliers=\"([0-9]+)\""))) << metric << ": " << tag;
    EXPECT_EQ(m[1].str(), "1") << metric << " marks other outliers than the tile's";
  }
  EXPECT_NE(dom.find("Outlier ranks</div><div class=\"v\">1</div>"), std::string::npos);
}

// ---- the report folder: memsnap replaces only a report of its own ------------------------------

// Every file under `dir`, with its bytes.
std::map<std::string, std::string> snapshot_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path());
  }
  return out;
}

TEST(ReportFolderTest, AFolderOfTheUsersFilesIsRefusedWithOrWithoutOverwrite) {
  const fs::path dir = fs::path(MEMSNAP_TEST_OUTPUT_DIR) / "ReportFolderTest.Refused";
  fs::remove_all(dir);
  import_loop("everyrank_cat", dir);
  const fs::path mine = dir / "precious";
  write_file(mine / "notes.txt", "my notes\n");
  write_file(mine / "index.html", "<html>my own index</html>\n");  // even a file a report would write
  write_file(mine / "sub/data.bin", std::string("\0\1\2\3", 4));
  const auto before = snapshot_of(mine);
  for (const char* flag : {"", " --overwrite"}) {
    const Ran r = sh(kMemsnap + " report '" + (dir / "memsnap.h5").string() + "' --no-upload -o '" + mine.string() + "'" + flag);
    EXPECT_EQ(r.code, 1) << flag << ": " << r.out;
    EXPECT_NE(r.out.find(mine.string() + " holds files that memsnap did not write"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
    EXPECT_EQ(snapshot_of(mine), before) << "the user's files changed" << flag;
    EXPECT_FALSE(fs::exists(mine / ".memsnap-report.partial"));
  }
  // A file where the folder would be is refused too.
  write_file(dir / "afile", "x");
  const Ran f = sh(kMemsnap + " report '" + (dir / "memsnap.h5").string() + "' --no-upload --overwrite -o '" + (dir / "afile").string() + "'");
  EXPECT_EQ(f.code, 1) << f.out;
  EXPECT_EQ(read_file(dir / "afile"), "x");
}

TEST(ReportFolderTest, OverwriteReplacesAnEarlierReportAndOnlyItsOwnStalePages) {
  const fs::path dir = fs::path(MEMSNAP_TEST_OUTPUT_DIR) / "ReportFolderTest.Overwrite";
  fs::remove_all(dir);
  import_loop("fsdp2_ring", dir / "five");   // ranks 0-4: rank4.5...html among its pages
  import_loop("everyrank_cat", dir / "four");  // ranks 0-3, the same page names but rank 4's
  const fs::path out = dir / "report";
  Ran r = sh(kMemsnap + " report '" + (dir / "five/memsnap.h5").string() + "' --no-upload -o '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(out / "rank4.5.pt.trace.memory_snapshot.html"));
  ASSERT_TRUE(fs::exists(out / ".memsnap-report"));
  write_file(out / "my-notes.txt", "the user's, put there later\n");
  // Without --overwrite: refused, nothing changes.
  const auto first = snapshot_of(out);
  r = sh(kMemsnap + " report '" + (dir / "four/memsnap.h5").string() + "' --no-upload -o '" + out.string() + "'");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("already holds a memsnap report; pass --overwrite"), std::string::npos) << r.out;
  EXPECT_EQ(snapshot_of(out), first);
  // A report that fails (a damaged rank file) leaves the earlier report as it was, and no staging folder.
  fs::copy(dir / "four", dir / "broken", fs::copy_options::recursive);
  write_file(dir / "broken/memsnap.h5.d/rank2.h5", "not HDF5");
  r = sh(kMemsnap + " report '" + (dir / "broken/memsnap.h5").string() + "' --no-upload --overwrite -o '" + out.string() + "'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(snapshot_of(out), first) << r.out;
  EXPECT_FALSE(fs::exists(out / ".memsnap-report.partial"));
  // With --overwrite: replaced; rank 4's page (this report has no rank 4) removed, the user's file kept.
  r = sh(kMemsnap + " report '" + (dir / "four/memsnap.h5").string() + "' --no-upload --overwrite -o '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(out / "rank4.5.pt.trace.memory_snapshot.html"));
  EXPECT_EQ(read_file(out / "my-notes.txt"), "the user's, put there later\n");
  EXPECT_EQ(json::parse(read_file(out / "summary.json"))["findings"].size(),
            json::parse(read_file(out / "summary.json"))["findings"].size());
  EXPECT_NE(read_file(out / "rank0.5.pt.trace.memory_snapshot.html"), first.at("rank0.5.pt.trace.memory_snapshot.html"));
  EXPECT_FALSE(fs::exists(out / ".memsnap-report.partial"));
  // A failed report into a new folder leaves no folder behind.
  r = sh(kMemsnap + " report '" + (dir / "broken/memsnap.h5").string() + "' --no-upload -o '" + (dir / "new").string() + "'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir / "new"));
}

// The terminal output of a report in a pipe: no progress line, at most 10 findings, the rest
// counted, and one closing line saying what it wrote and what to open.
TEST(ReportOutputTest, FindingsAreCappedAndTheLastLineSaysWhatToOpen) {
  const fs::path dir = fs::path(MEMSNAP_TEST_OUTPUT_DIR) / "ReportOutputTest";
  fs::remove_all(dir);
  // everyrank_cat's 4 ranks each keep memory for good: its pickles as 16 ranks make 16 leaks.
  fs::create_directories(dir / "pickles");
  for (int r = 0; r < 16; ++r) {
    fs::copy_file(kLoops + "everyrank_cat/rank" + std::to_string(r % 4) + ".5.pt.trace.memory_snapshot.pickle",
                  dir / "pickles" / ("rank" + std::to_string(r) + ".5.pt.trace.memory_snapshot.pickle"));
  }
  Ran r = sh(kMemsnap + " import '" + (dir / "pickles").string() + "'/*.pickle -o '" + (dir / "memsnap.h5").string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " report '" + (dir / "memsnap.h5").string() + "' --no-upload");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << "a progress line in a pipe";
  const auto findings = json::parse(read_file(dir / "report/summary.json"))["findings"].size();
  std::size_t printed = 0;
  for (std::size_t p = r.out.find("  finding: "); p != std::string::npos; p = r.out.find("  finding: ", p + 1)) ++printed;
  ASSERT_GT(findings, 10u);
  EXPECT_EQ(printed, 10u);
  EXPECT_NE(r.out.find("  " + std::to_string(findings - 10) + " more findings in " + (dir / "report/summary.json").string() + "\n"),
            std::string::npos) << r.out;
  std::string last = r.out.substr(0, r.out.size() - 1);
  last = last.substr(last.rfind('\n') + 1);
  EXPECT_EQ(last, "memsnap report: wrote 16 window pages, index.html and summary.json to " + (dir / "report").string() + "; open " +
                      (dir / "report/index.html").string());
}

// ---- the flame graph of bytes at the peak ---------------------------------------------------

// The flame block of a rank page's data, summed: it holds every byte live at the window's peak.
std::uint64_t flame_sum(const json& data) {
  std::uint64_t sum = 0;
  for (const auto& b : data["flame"]["bytes"]) sum += b.get<std::uint64_t>();
  return sum;
}

// Every rank page of real torch loops (frames or none, an OOM, a ring buffer that opened mid-batch)
// carries the bytes at its peak by stack, and they add up to the page's peak allocated exactly.
TEST(ReportFlameDataTest, BytesAtThePeakAddUpToThePeakOnRealLoops) {
  const fs::path dir = fs::path(MEMSNAP_TEST_OUTPUT_DIR) / "ReportFlameDataTest";
  fs::remove_all(dir);
  for (const std::string loop : {"gpt_adamw", "fsdp2_ring", "oom_caught", "stackless_mlp"}) {
    const fs::path d = dir / loop;
    fs::create_directories(d);
    import_loop(loop, d);
    const Ran r = sh(kMemsnap + " report '" + (d / "memsnap.h5").string() + "' --no-upload");
    ASSERT_EQ(r.code, 0) << r.out;
    std::size_t pages = 0;
    for (const auto& entry : fs::directory_iterator(d / "report")) {
      if (entry.path().filename().string().rfind("rank", 0) != 0) continue;
      const json data = embedded_data(read_file(entry.path()));
      ASSERT_TRUE(data.contains("flame")) << entry.path();
      const auto peak = data["stats"]["peak_allocated"].get<std::uint64_t>();
      EXPECT_GT(peak, 0u) << entry.path();
      EXPECT_EQ(flame_sum(data), peak) << entry.path();
      EXPECT_EQ(data["flame"]["bytes_total"].get<std::uint64_t>(), peak) << entry.path();
      const auto n = data["flame"]["stack"].size();
      EXPECT_EQ(data["flame"]["bytes"].size(), n);
      EXPECT_EQ(data["flame"]["category"].size(), n);
      for (const auto& id : data["flame"]["stack"]) EXPECT_LT(id.get<int>(), static_cast<int>(data["stacks"].size()));
      ++pages;
    }
    EXPECT_GT(pages, 0u) << loop;
  }
}

// The rank page of a real torch loop draws the icicle: its root is the page's peak allocated, the
// path of widest frames from it runs through the top site at the peak (gpt_adamw rank 0: the
// transformer's forward at torch_loops.py:130), hovering a frame says its function, file:line,
// bytes and share of the peak, a click zooms into it; and the page still loads nothing.
TEST_F(ReportHtmlBrowserTest, RankPageDrawsTheFlameGraphOfThePeak) {
  import_loop("gpt_adamw", m_dir);
  const Ran r = sh(kMemsnap + " report '" + (m_dir / "memsnap.h5").string() + "' --no-upload");
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path page = m_dir / "report/rank0.5.pt.trace.memory_snapshot.html";
  const std::string html = read_file(page);
  const json data = embedded_data(html);
  const std::string peak = std::to_string(data["stats"]["peak_allocated"].get<std::uint64_t>());
  const std::string top_site = data["sites"][0]["name"];
  ASSERT_EQ(top_site, "forward (/work/main/tests/gpu/torch_loops.py:130)");

  const std::string dom = dump_dom(page);  // #selftest: hovers the widest frame and zooms into it
  EXPECT_EQ(body_attr(dom, "ready"), "1");
  EXPECT_EQ(body_attr(dom, "error"), "");
  const std::string st = body_attr(dom, "selftest");
  EXPECT_NE(st.find("flame-hover=ok"), std::string::npos) << st;
  EXPECT_NE(st.find("flame-zoom=ok"), std::string::npos) << st;
  ASSERT_NE(dom.find("<section class=\"card\" id=\"flame\">"), std::string::npos);
  EXPECT_EQ(attr_of(dom, "<div class=\"flame\"", "data-root-bytes"), peak);
  EXPECT_EQ(attr_of(dom, "<div class=\"flame\"", "data-peak"), peak);
  EXPECT_GT(std::atoi(attr_of(dom, "<div class=\"flame\"", "data-nodes").c_str()), 100);
  const std::string widest = attr_of(dom, "<div class=\"flame\"", "data-widest-path");
  EXPECT_NE(widest.find(top_site), std::string::npos) << widest;
  EXPECT_EQ(widest.rfind("&lt;module&gt; (/work/main/tests/gpu/torch_loops.py:268) &gt; worker (", 0), 0u) << widest;
  // The hover, as the readout line under the chart says it (the self test left it on the frame).
  // Found by hand, not by one regex over the whole page: libstdc++'s regex recurses per character
  // and a lazy group over a DOM this size overflows the stack under ASan.
  EXPECT_EQ(attr_of(dom, "<div class=\"flame-readout\"", "data-name"), "&lt;module&gt;");
  const auto open = dom.find("<div class=\"flame-readout\"");
  ASSERT_NE(open, std::string::npos);
  const auto text_at = dom.find('>', open) + 1;
  const auto close = dom.find("</div>", text_at);
  ASSERT_NE(close, std::string::npos);
  const std::string readout = std::regex_replace(dom.substr(text_at, close - text_at), std::regex("<[^>]*>"), "");
  EXPECT_NE(readout.find("at /work/main/tests/gpu/torch_loops.py:268"), std::string::npos) << readout;
  EXPECT_NE(readout.find("bytes "), std::string::npos) << readout;
  EXPECT_NE(readout.find("% of the peak"), std::string::npos) << readout;
  const std::string l = lower(html);
  for (const char* bad : {"http://", "https://", "src=", "fetch(", "xmlhttprequest", "import("})
    EXPECT_EQ(l.find(bad), std::string::npos) << "page contains '" << bad << "'";
  screenshot(page, "flame", 1400, 2600);
}

}  // namespace
