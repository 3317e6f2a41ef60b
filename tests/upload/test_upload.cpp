// Remote upload of a real report: file:// copies, and a real S3-compatible server (s3rver) on loopback.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "memsnap/store.hpp"
#include "memsnap/upload.hpp"
#include "test_util.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;

const std::string kMemsnap = MEMSNAP_CLI;
const std::string kSim = MEMSNAP_FSDP_SIM;
const std::string kMpirun = std::string(MEMSNAP_MPIRUN) + " --oversubscribe";
const std::string kS3rver = MEMSNAP_S3RVER;
const std::string kSigV4Check = std::string(MEMSNAP_PYTHON) + " " + MEMSNAP_SIGV4_CHECK;
const std::string kTemplateName = "{run_name}/memory_snapshots/rank{rank}.{batch}.pt.trace.memory_snapshot.html";

using Result = test::ShellResult;

// Runs `cmd` with no AWS settings inherited and loopback kept away from any proxy.
Result sh(const std::string& cmd) {
  return test::run_shell(cmd,
                         "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NO_PROXY=127.0.0.1 no_proxy=127.0.0.1; "
                         "unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 "
                         "AWS_REGION AWS_DEFAULT_REGION AWS_PROFILE");
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every regular file under `dir`, by path relative to it, with its bytes.
std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = test::read_file(e.path());
  }
  return out;
}

// Records a 2-rank fsdp_sim run under mpirun (two windows per rank: batches 4 and 7) with
// `config` added to the memsnap config, and gathers it serially. Returns the run folder.
fs::path record(const test::TempDir& dir, const std::string& name, const std::string& config, int layers) {
  const fs::path run = dir / name;
  test::write_file(dir / (name + ".yaml"), "run_name: up\nfolder: " + run.string() + "\nrepeat: 1\n" + config);
  auto r = sh(kMpirun + " -np 2 " + kMemsnap + " run --no-aggregate --config " + (dir / (name + ".yaml")).string() +
              " -- " + kSim + " --batches 8 --step-us 0 --hidden 256 --layers " + std::to_string(layers));
  EXPECT_EQ(r.code, 0) << r.out;
  r = sh(kMemsnap + " aggregate " + run.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(run / "memsnap.h5")) << r.out;
  return run;
}

// What a report upload must leave remotely: each page, summary.json and index.html of the report
// folder, and the store with its rank files, all in one folder, by name relative to it.
std::map<std::string, std::string> expected_objects(const fs::path& run, const fs::path& report) {
  auto out = files_under(report);
  out.erase(".memsnap-report");  // the report folder's own marker stays local: it says which files memsnap wrote there
  out["memsnap.h5"] = test::read_file(run / "memsnap.h5");
  for (const auto& [name, bytes] : files_under(run / "memsnap.h5.d")) out["memsnap.h5.d/" + name] = bytes;
  return out;
}

// --- an S3-compatible server on loopback ---------------------------------------------------------

class S3Server {
 public:
  explicit S3Server(const fs::path& dir) : m_dir(dir) { start(); }
  ~S3Server() { stop(); }

  void start() {
    fs::create_directories(m_dir / "data");
    const std::string log = (m_dir / "s3rver.log").string();
    fs::remove(log);
    m_pid = fork();
    if (m_pid == 0) {
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      const std::string data = (m_dir / "data").string();
      execlp("node", "node", kS3rver.c_str(), "-d", data.c_str(), "-a", "127.0.0.1", "-p", "0", "--configure-bucket",
             "bkt", static_cast<char*>(nullptr));
      _exit(127);
    }
    // The server prints "S3rver listening on 127.0.0.1:PORT" once it accepts connections.
    for (int i = 0; i < 300 && m_port == 0; ++i) {
      const std::string text = test::read_file(log);
      const auto at = text.find("listening on 127.0.0.1:");
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        m_port = std::stoi(text.substr(at + std::string("listening on 127.0.0.1:").size()));
        break;
      }
      int status = 0;
      if (waitpid(m_pid, &status, WNOHANG) == m_pid) {
        m_pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_GT(m_port, 0) << "s3rver did not start (the upload_install_s3rver test installs it): "
                         << test::read_file(log);
  }

  // Kills the server and waits (bounded) until it is gone.
  void stop() {
    if (m_pid <= 0) return;
    kill(m_pid, SIGKILL);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(m_pid, nullptr, WNOHANG) == m_pid) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    m_pid = -1;
  }

  int port() const { return m_port; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(m_port); }
  std::string env(const std::string& key = "S3RVER") const {
    return "AWS_ENDPOINT_URL=" + endpoint() + " AWS_ACCESS_KEY_ID=" + key + " AWS_SECRET_ACCESS_KEY=S3RVER ";
  }

  struct Object {
    long status = 0;
    std::string bytes;
  };
  // GET through libcurl, signed as memsnap signs.
  Object get(const std::string& key) const {
    Object o;
    CURL* c = curl_easy_init();
    const std::string url = endpoint() + "/bkt/" + key;
    curl_slist* h = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(c, CURLOPT_USERPWD, "S3RVER:S3RVER");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(
        c, CURLOPT_WRITEFUNCTION, +[](char* d, std::size_t s, std::size_t n, void* u) {
          static_cast<std::string*>(u)->append(d, s * n);
          return s * n;
        });
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &o.bytes);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &o.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return o;
  }

  // Every expected object is there with exactly these bytes.
  void expect_objects(const std::string& folder, const std::map<std::string, std::string>& expected) const {
    for (const auto& [name, bytes] : expected) {
      const Object o = get(folder + name);
      EXPECT_EQ(o.status, 200) << folder + name;
      EXPECT_TRUE(o.bytes == bytes) << folder + name << ": " << o.bytes.size() << " bytes read back, " << bytes.size()
                                    << " sent";
    }
  }

 private:
  fs::path m_dir;
  pid_t m_pid = -1;
  int m_port = 0;
};

// Takes one HTTP request on loopback (answering 100 Continue when asked, then 200) and keeps
// its head and body as they arrived, so that a test can check what a real service would verify.
class CaptureServer {
 public:
  CaptureServer() {
    m_fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(m_fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(m_fd, 1) != 0 ||
        getsockname(m_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot listen on loopback";
      return;
    }
    m_port = ntohs(a.sin_port);
    m_thread = std::thread([this] { serve(); });
  }
  ~CaptureServer() {
    if (m_thread.joinable()) m_thread.join();
    close(m_fd);
  }
  int port() const { return m_port; }
  // The request, once it has been answered.
  std::pair<std::string, std::string> request() {
    if (m_thread.joinable()) m_thread.join();
    return {m_head, m_body};
  }

 private:
  // Reads into `into` until `done` says so, 10 s at most.
  static void read_until(int fd, std::string& into, const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char buf[4096];
    while (!done() && std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      into.append(buf, static_cast<std::size_t>(n));
    }
  }
  static void send_all(int fd, const std::string& s) { (void)!send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

  void serve() {
    pollfd p{m_fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) return;
    const int c = accept(m_fd, nullptr, nullptr);
    if (c < 0) return;
    std::string data;
    read_until(c, data, [&] { return data.find("\r\n\r\n") != std::string::npos; });
    const std::size_t end = data.find("\r\n\r\n");
    if (end != std::string::npos) {
      m_head = data.substr(0, end + 4);
      m_body = data.substr(end + 4);
      std::size_t length = 0;
      const auto at = m_head.find("Content-Length: ");
      if (at != std::string::npos) length = std::stoul(m_head.substr(at + 16));
      if (m_head.find("Expect: 100-continue") != std::string::npos) send_all(c, "HTTP/1.1 100 Continue\r\n\r\n");
      read_until(c, m_body, [&] { return m_body.size() >= length; });
      send_all(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
    shutdown(c, SHUT_WR);
    std::string rest;
    read_until(c, rest, [] { return false; });  // until the client closes (or 10 s)
    close(c);
  }

  int m_fd = -1;
  int m_port = 0;
  std::thread m_thread;
  std::string m_head, m_body;
};

// --- naming (no server) ------------------------------------------------------------------------

StoreInfo two_rank_info() {
  StoreInfo info;
  info.run_name = "job7";
  info.world_size = 2;
  for (int r = 0; r < 2; ++r) {
    RankInfo ri;
    ri.rank = r;
    ri.local_rank = r;
    ri.local_world_size = 2;
    ri.data_file = "memsnap.h5.d/rank" + std::to_string(r) + ".h5";
    info.ranks.push_back(ri);
  }
  return info;
}

const std::vector<ReportPage> kPages = {{0, 4, "rank0.4.pt.trace.memory_snapshot.html"},
                                        {1, 4, "rank1.4.pt.trace.memory_snapshot.html"}};

TEST(UploadPlanTest, RankPagesTakeTheTemplateAndTheRestGoBeside) {
  const auto items = plan_report_upload("s3://bkt/" + kTemplateName, two_rank_info(), "/runs/x/memsnap.h5",
                                        "/runs/x/report", kPages, "20260101-000000");
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& i : items) got.emplace_back(i.local.string(), i.remote);
  const std::string f = "s3://bkt/job7/memory_snapshots/";
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"/runs/x/report/rank0.4.pt.trace.memory_snapshot.html", f + "rank0.4.pt.trace.memory_snapshot.html"},
      {"/runs/x/report/rank1.4.pt.trace.memory_snapshot.html", f + "rank1.4.pt.trace.memory_snapshot.html"},
      {"/runs/x/report/summary.json", f + "summary.json"},
      {"/runs/x/report/index.html", f + "index.html"},
      {"/runs/x/memsnap.h5.d/rank0.h5", f + "memsnap.h5.d/rank0.h5"},
      {"/runs/x/memsnap.h5.d/rank1.h5", f + "memsnap.h5.d/rank1.h5"},
      {"/runs/x/memsnap.h5", f + "memsnap.h5"}};
  EXPECT_EQ(got, expected);
  // A file:// destination and a name without .html, as local page names get it.
  const auto file = plan_report_upload("file:///srv/{run_name}/{timestamp}/r{rank}-{batch}", two_rank_info(),
                                       "/runs/x/memsnap.h5", "/runs/x/report", kPages, "20260101-000000");
  EXPECT_EQ(file[1].remote, "file:///srv/job7/20260101-000000/r1-4.html");
  EXPECT_EQ(file[3].remote, "file:///srv/job7/20260101-000000/index.html");
}

TEST(UploadPlanTest, RefusesTemplatesThatCannotWork) {
  auto error_of = [](const std::string& tmpl) -> std::string {
    try {
      plan_report_upload(tmpl, two_rank_info(), "/r/memsnap.h5", "/r/report", kPages, "t");
    } catch (const UploadError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(error_of("s3://bkt/{run_name}/../../x/rank{rank}.{batch}.html").find("'..' component"), std::string::npos);
  EXPECT_NE(error_of("file:///srv/./rank{rank}.{batch}.html").find("'.' component"), std::string::npos);
  EXPECT_NE(error_of("s3://bkt/rank{rank}/{batch}.html").find("changes with the rank"), std::string::npos);
  EXPECT_NE(error_of("s3://bkt/{run_name}/page.html").find("the same name"), std::string::npos);
  EXPECT_NE(error_of("gs://bkt/rank{rank}.{batch}.html").find("allowed: s3://BUCKET/KEY or file://PATH"),
            std::string::npos);
  EXPECT_NE(error_of("s3://{run_name}/rank{rank}.{batch}.html").find("bucket name must be literal"), std::string::npos);
  EXPECT_NE(error_of("s3://bkt/rank{rnak}.{batch}.html").find("unknown variable {rnak}"), std::string::npos);
  EXPECT_EQ(error_of("s3://bkt/" + kTemplateName), "accepted");
}

// --- file:// -----------------------------------------------------------------------------------

TEST(UploadTest, FileCopiesTheReportAndStoreAndRefusesToReplaceUnlessOverwrite) {
  test::TempDir dir;
  const std::string remote = "file://" + (dir / "remote").string() + "/" + kTemplateName;
  const fs::path run = record(dir, "a", "remote_file_name: " + remote + "\n", 2);
  auto r = sh(kMemsnap + " report " + (run / "memsnap.h5").string() + " -o " + (dir / "r1").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("uploaded 9 files to file://" + (dir / "remote/up/memory_snapshots/").string()),
            std::string::npos)
      << r.out;
  const auto first = expected_objects(run, dir / "r1");
  ASSERT_EQ(first.size(), 9u) << "4 pages, summary.json, index.html, the store and its 2 rank files";
  EXPECT_EQ(files_under(dir / "remote/up/memory_snapshots"), first);

  // Again into another local folder: every object is refused, one line each, nothing changes.
  r = sh(kMemsnap + " report " + (run / "memsnap.h5").string() + " -o " + (dir / "r2").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_EQ(count(r.out, "exists; overwrite is false"), 9u) << r.out;
  EXPECT_TRUE(fs::exists(dir / "r2/index.html")) << "the report is still written";
  EXPECT_EQ(files_under(dir / "remote/up/memory_snapshots"), first);

  // --no-upload: the report alone.
  r = sh(kMemsnap + " report --no-upload " + (run / "memsnap.h5").string() + " -o " + (dir / "r3").string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("upload"), std::string::npos) << r.out;

  // A different run of the same name whose config says overwrite: true replaces every object.
  const fs::path run2 = record(dir, "b", "remote_file_name: " + remote + "\noverwrite: true\n", 3);
  r = sh(kMemsnap + " report " + (run2 / "memsnap.h5").string() + " -o " + (dir / "r4").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto second = expected_objects(run2, dir / "r4");
  ASSERT_NE(second.at("summary.json"), first.at("summary.json")) << "the two runs differ (3 layers against 2)";
  EXPECT_EQ(files_under(dir / "remote/up/memory_snapshots"), second);
}

// --- S3 ----------------------------------------------------------------------------------------

TEST(UploadTest, S3UploadReadsBackIdenticalRefusesExistingAndReplacesWithOverwrite) {
  test::TempDir dir;
  S3Server server(dir / "s3");
  const std::string remote = "s3://bkt/" + kTemplateName;
  const fs::path run = record(dir, "a", "remote_file_name: " + remote + "\n", 2);
  const std::string store = (run / "memsnap.h5").string();
  auto r = sh(server.env() + kMemsnap + " report " + store + " -o " + (dir / "r1").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("uploaded 9 files to s3://bkt/up/memory_snapshots/"), std::string::npos) << r.out;
  const auto first = expected_objects(run, dir / "r1");
  ASSERT_EQ(first.size(), 9u);
  server.expect_objects("up/memory_snapshots/", first);

  // A different run of the same name (overwrite: false): refused for every object, nothing changes.
  const fs::path run2 = record(dir, "b", "remote_file_name: " + remote + "\n", 3);
  const std::string store2 = (run2 / "memsnap.h5").string();
  r = sh(server.env() + kMemsnap + " report " + store2 + " -o " + (dir / "r2").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_EQ(count(r.out, "exists; overwrite is false"), 9u) << r.out;
  EXPECT_NE(r.out.find("uploaded 0 of 9 files"), std::string::npos) << r.out;
  server.expect_objects("up/memory_snapshots/", first);

  // --overwrite replaces them.
  r = sh(server.env() + kMemsnap + " report --overwrite " + store2 + " -o " + (dir / "r2").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto second = expected_objects(run2, dir / "r2");
  ASSERT_NE(second.at("summary.json"), first.at("summary.json"));
  server.expect_objects("up/memory_snapshots/", second);
}

TEST(UploadTest, S3BadCredentialsGiveOneLineWithTheErrorCode) {
  test::TempDir dir;
  S3Server server(dir / "s3");
  const fs::path run = record(dir, "a", "remote_file_name: s3://bkt/" + kTemplateName + "\n", 2);
  const auto before = files_under(run);
  const auto r = sh(server.env("WRONGKEY") + kMemsnap + " report " + (run / "memsnap.h5").string() + " -o " +
                    (dir / "r").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_EQ(count(r.out, "upload failed"), 1u) << "one line, not one per file: " << r.out;
  EXPECT_NE(r.out.find("HTTP 403 InvalidAccessKeyId"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8 more file(s) not uploaded: every file would be refused alike (InvalidAccessKeyId)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("WRONGKEY:S3RVER"), std::string::npos) << "the secret is never printed";
  EXPECT_EQ(server.get("up/memory_snapshots/index.html").status, 404);
  EXPECT_EQ(files_under(run), before);
  EXPECT_TRUE(fs::exists(dir / "r/index.html"));

  // No credentials at all: one line naming the variables, nothing sent.
  const auto none = sh("AWS_ENDPOINT_URL=" + server.endpoint() + " " + kMemsnap + " report " +
                       (run / "memsnap.h5").string() + " -o " + (dir / "r2").string());
  EXPECT_EQ(none.code, 4) << none.out;
  EXPECT_NE(none.out.find("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set"), std::string::npos)
      << none.out;
}

TEST(UploadTest, S3ServerGoneMidUploadIsReportedPerFileRetriedAndLeavesLocalFiles) {
  test::TempDir dir;
  S3Server server(dir / "s3");
  const fs::path run = record(dir, "a", "remote_file_name: s3://bkt/" + kTemplateName + "\n", 2);
  auto r = sh(kMemsnap + " report --no-upload " + (run / "memsnap.h5").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto before = files_under(run);

  // Through the library, to stop the server right after the first object.
  StoreReader reader(run / "memsnap.h5");
  const StoreInfo info = reader.info();
  std::vector<ReportPage> pages;
  for (const auto& e : fs::directory_iterator(run / "report")) {
    const std::string name = e.path().filename().string();
    int rank = 0;
    long long batch = 0;
    if (std::sscanf(name.c_str(), "rank%d.%lld.", &rank, &batch) == 2) pages.push_back({rank, batch, name});
  }
  ASSERT_EQ(pages.size(), 4u);
  const auto items =
      plan_report_upload("s3://bkt/" + kTemplateName, info, run / "memsnap.h5", run / "report", pages, "t");
  UploadOptions options;
  const std::string endpoint = server.endpoint();
  options.env = [&](const char* name) -> std::optional<std::string> {
    const std::map<std::string, std::string> env = {
        {"AWS_ENDPOINT_URL", endpoint}, {"AWS_ACCESS_KEY_ID", "S3RVER"}, {"AWS_SECRET_ACCESS_KEY", "S3RVER"}};
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  options.after_each = [&](std::size_t i, const UploadOutcome&) {
    if (i == 0) server.stop();
  };
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = upload_files(items, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(outcomes.size(), items.size());
  EXPECT_EQ(outcomes[0].status, UploadOutcome::Status::uploaded) << outcomes[0].detail;
  for (std::size_t i : {1, 2}) {
    EXPECT_EQ(outcomes[i].status, UploadOutcome::Status::failed) << i;
    EXPECT_EQ(outcomes[i].attempts, 3) << i;
    EXPECT_NE(outcomes[i].detail.find("Couldn't connect"), std::string::npos) << outcomes[i].detail;
    EXPECT_NE(outcomes[i].detail.find("after 3 attempts"), std::string::npos) << outcomes[i].detail;
  }
  for (std::size_t i = 3; i < outcomes.size(); ++i)
    EXPECT_EQ(outcomes[i].status, UploadOutcome::Status::not_attempted) << i;
  EXPECT_GE(seconds, 2 * (0.5 + 1.0)) << "two files, each retried after 0.5 s and 1 s";
  EXPECT_LT(seconds, 60);
  EXPECT_EQ(files_under(run), before);

  // The command against the server that is gone: per-file lines, exit code 4, the report written.
  r = sh(server.env() + kMemsnap + " report " + (run / "memsnap.h5").string() + " -o " + (dir / "r").string());
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_EQ(count(r.out, "upload failed"), 2u) << r.out;
  EXPECT_EQ(count(r.out, "after 3 attempts"), 2u) << r.out;
  EXPECT_NE(r.out.find("7 more file(s) not uploaded: the last two files could not reach the server"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank0.4.pt.trace.memory_snapshot.html -> "
                       "s3://bkt/up/memory_snapshots/rank0.4.pt.trace.memory_snapshot.html"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(dir / "r/index.html"));
  auto after = files_under(run);
  EXPECT_EQ(after, before);
}

// s3rver does not check SigV4 signatures, so the request memsnap sends is checked here against
// the signature recomputed independently (tests/upload/sigv4_check.py), as S3 computes it.
TEST(UploadTest, S3RequestsCarryAValidSigV4SignatureWithTokenRegionAndEncodedKey) {
  test::TempDir dir;
  test::write_file(dir / "f.txt", "hello, bucket");
  CaptureServer server;
  const std::map<std::string, std::string> env = {
      {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:" + std::to_string(server.port()) + "/"},
      {"AWS_ENDPOINT_URL", "http://127.0.0.1:1"},  // the S3-specific one wins
      {"AWS_ACCESS_KEY_ID", "AKIDTEST"},
      {"AWS_SECRET_ACCESS_KEY", "wJalr/K7MDENG+bPxRfiCY"},
      {"AWS_SESSION_TOKEN", "token/with+chars="},
      {"AWS_REGION", "eu-west-3"}};
  UploadOptions options;
  options.overwrite = true;  // a single PUT, no HEAD
  options.env = [&](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  const auto out = upload_files({{dir / "f.txt", "s3://bkt/run 1/f+x~.txt"}}, options);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status, UploadOutcome::Status::uploaded) << out[0].detail;
  const auto [head, body] = server.request();
  EXPECT_EQ(head.substr(0, head.find("\r\n")), "PUT /bkt/run%201/f%2Bx~.txt HTTP/1.1") << head;
  EXPECT_EQ(body, "hello, bucket");
  EXPECT_NE(head.find("Content-Length: 13\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("x-amz-security-token: token/with+chars=\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("Credential=AKIDTEST/"), std::string::npos) << head;
  EXPECT_NE(head.find("/eu-west-3/s3/aws4_request"), std::string::npos) << head;
  EXPECT_NE(head.find("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,"), std::string::npos)
      << head;
  test::write_file(dir / "head.txt", head);
  const auto check = sh(kSigV4Check + " " + (dir / "head.txt").string() + " 'wJalr/K7MDENG+bPxRfiCY'");
  ASSERT_EQ(check.code, 0) << check.out;
  const std::string expected = check.out.substr(0, check.out.find(' '));
  const std::string given = check.out.substr(check.out.find(' ') + 1, 64);
  EXPECT_EQ(expected.size(), 64u) << check.out;
  EXPECT_EQ(given, expected) << "the signature S3 would compute differs from the one sent:\n" << head;
}

TEST(UploadTest, S3MissingBucketStopsAtTheFirstFile) {
  test::TempDir dir;
  S3Server server(dir / "s3");
  test::write_file(dir / "a.txt", "a");
  const std::string endpoint = server.endpoint();
  UploadOptions options;
  options.env = [&](const char* name) -> std::optional<std::string> {
    if (std::string(name) == "AWS_ENDPOINT_URL") return endpoint;
    if (std::string(name) == "AWS_ACCESS_KEY_ID" || std::string(name) == "AWS_SECRET_ACCESS_KEY") return "S3RVER";
    return std::nullopt;
  };
  const auto out =
      upload_files({{dir / "a.txt", "s3://nobucket/a.txt"}, {dir / "a.txt", "s3://nobucket/b.txt"}}, options);
  EXPECT_EQ(out[0].status, UploadOutcome::Status::failed);
  EXPECT_EQ(out[0].attempts, 1) << "a 404 is not retried";
  EXPECT_NE(out[0].detail.find("HTTP 404 NoSuchBucket"), std::string::npos) << out[0].detail;
  EXPECT_EQ(out[1].status, UploadOutcome::Status::not_attempted);
}

}  // namespace
}  // namespace memsnap
