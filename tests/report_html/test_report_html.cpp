// Tests of the HTML report pages: escaping of hostile strings, self-containment, and real
// rendering in headless Chromium (pages and screenshots are left in the build tree).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
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
  for (const std::string& page : {render_rank_page(memsnap::test::synthetic_rank_page(rs)), render_cross_page(memsnap::test::synthetic_cross_page(cs))}) {
    const std::string l = lower(page);
    // Exactly our own four script elements: boot, data, common, page.
    EXPECT_EQ(count(l, "<script"), 4u);
    EXPECT_EQ(count(l, "</script"), 4u);
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
    std::smatch m;
    if (!std::regex_search(dom, m, std::regex("<body[^>]*>"))) return "";
    const std::string body = m.str();
    std::smatch a;
    if (!std::regex_search(body, a, std::regex(" data-" + name + "=\"([^\"]*)\""))) return "";
    return a[1].str();
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

  std::string m_chromium;
  fs::path m_dir;
};

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

}  // namespace
