// Remote upload of a report and its store: file:// copies and S3 PUTs signed by libcurl (SigV4).
#include "memsnap/upload.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "memsnap/interrupt.hpp"
#include "memsnap/names.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
using Status = UploadOutcome::Status;

constexpr std::string_view kS3 = "s3://";
constexpr std::string_view kFile = "file://";

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = s.find(sep, start);
    out.emplace_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

[[noreturn]] void bad_template(const std::string& tmpl, const std::string& why) {
  throw UploadError("key 'remote_file_name' has value \"" + tmpl + "\": " + why);
}

// The formatted part below the bucket (s3) or below the filesystem root (file) may not climb or
// stand still: every component is a real name.
void check_components(const std::string& tmpl, const std::string& formatted, std::string_view path) {
  for (const auto& c : split(path, '/')) {
    if (c == "." || c == "..") bad_template(tmpl, "the name '" + formatted + "' holds a '" + c + "' component");
  }
}

// A destination split into scheme, bucket (s3 only) and the path template below it.
struct Target {
  bool s3 = false;
  std::string bucket;
  std::string path_tmpl;  // s3: the key template; file: the path template (absolute or relative)
};

Target parse_target(const std::string& tmpl) {
  Target t;
  std::string_view rest = tmpl;
  if (starts_with(rest, kS3)) {
    t.s3 = true;
    rest.remove_prefix(kS3.size());
    const std::size_t slash = rest.find('/');
    t.bucket = std::string(rest.substr(0, slash));
    if (t.bucket.empty() || slash == std::string_view::npos || slash + 1 == rest.size()) {
      bad_template(tmpl,
                   "allowed: s3://BUCKET/KEY with {rank} and {batch} in the key, e.g. "
                   "s3://bucket/{run_name}/memory_snapshots/rank{rank}.{batch}.pt.trace.memory_snapshot.html");
    }
    if (t.bucket.find_first_of("{}") != std::string::npos) bad_template(tmpl, "the bucket name must be literal text");
    t.path_tmpl = std::string(rest.substr(slash + 1));
    if (t.path_tmpl.front() == '/') bad_template(tmpl, "the key starts with '/'");
  } else if (starts_with(rest, kFile)) {
    rest.remove_prefix(kFile.size());
    if (starts_with(rest, "localhost/")) rest.remove_prefix(std::string_view("localhost").size());
    t.path_tmpl = std::string(rest);
    if (t.path_tmpl.empty() || t.path_tmpl.back() == '/') bad_template(tmpl, "allowed: file://PATH naming a rank page");
  } else {
    bad_template(tmpl, "allowed: s3://BUCKET/KEY or file://PATH (a rank page's name, with {rank} and {batch})");
  }
  return t;
}

std::string with_html(std::string name) {
  if (name.size() < 5 || name.compare(name.size() - 5, 5, ".html") != 0) name += ".html";
  return name;
}

// --- S3 ----------------------------------------------------------------------------------------

std::string env_or(const EnvLookup& env, const char* name, const std::string& fallback = {}) {
  const auto v = env(name);
  return v && !v->empty() ? *v : fallback;
}

struct S3Settings {
  std::string access_key, secret_key, session_token, region, endpoint;  // endpoint: empty for AWS
  std::string error;                                                    // set when the settings cannot work
};

S3Settings s3_settings(const EnvLookup& env) {
  S3Settings s;
  s.access_key = env_or(env, "AWS_ACCESS_KEY_ID");
  s.secret_key = env_or(env, "AWS_SECRET_ACCESS_KEY");
  s.session_token = env_or(env, "AWS_SESSION_TOKEN");
  s.region = env_or(env, "AWS_REGION", env_or(env, "AWS_DEFAULT_REGION", "us-east-1"));
  s.endpoint = env_or(env, "AWS_ENDPOINT_URL_S3", env_or(env, "AWS_ENDPOINT_URL"));
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  if (s.access_key.empty() || s.secret_key.empty()) {
    s.error = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set for s3:// uploads";
  } else if (!s.endpoint.empty() && !starts_with(s.endpoint, "http://") && !starts_with(s.endpoint, "https://")) {
    s.error = "AWS_ENDPOINT_URL(_S3) is \"" + s.endpoint + "\"; allowed: http://HOST[:PORT] or https://HOST[:PORT]";
  } else if (s.region.find_first_of(":/ ") != std::string::npos) {
    s.error = "AWS_REGION is \"" + s.region + "\"; allowed: a region name such as us-east-1";
  }
  return s;
}

// Percent-encodes a key as SigV4's canonical URI wants it: each byte but A-Z a-z 0-9 - . _ ~ and '/'.
std::string encode_key(std::string_view key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// Path-style addressing for a given endpoint (what S3-compatible services expect); on AWS,
// virtual-hosted style unless the bucket's dots would break the TLS name.
std::string object_url(const S3Settings& s, const std::string& bucket, const std::string& key) {
  if (!s.endpoint.empty()) return s.endpoint + "/" + bucket + "/" + encode_key(key);
  if (bucket.find('.') == std::string::npos)
    return "https://" + bucket + ".s3." + s.region + ".amazonaws.com/" + encode_key(key);
  return "https://s3." + s.region + ".amazonaws.com/" + bucket + "/" + encode_key(key);
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
struct FileDeleter {
  void operator()(FILE* f) const { std::fclose(f); }
};

struct HttpResult {
  CURLcode curl = CURLE_OK;
  long status = 0;
  std::string body;       // the first 64 KiB of the response
  std::string transport;  // curl's message when curl != CURLE_OK
};

std::size_t collect_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  const std::size_t bytes = size * n;
  if (body->size() < 65536) body->append(data, std::min(bytes, 65536 - body->size()));
  return bytes;
}

std::size_t read_file_cb(char* buffer, std::size_t size, std::size_t n, void* user) {
  FILE* f = static_cast<FILE*>(user);
  const std::size_t got = std::fread(buffer, 1, size * n, f);
  if (got == 0 && std::ferror(f)) return CURL_READFUNC_ABORT;
  return got;
}

// One signed request. `upload`: PUT the file's bytes (streamed); otherwise HEAD.
HttpResult s3_request(const S3Settings& s, const std::string& url, FILE* upload, std::uint64_t size,
                      bool if_none_match) {
  HttpResult r;
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) {
    r.curl = CURLE_FAILED_INIT;
    r.transport = "cannot start libcurl";
    return r;
  }
  CURL* c = curl.get();
  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string sigv4 = "aws:amz:" + s.region + ":s3";
  const std::string userpwd = s.access_key + ":" + s.secret_key;
  // curl 7.88 signs the payload hash it finds in this header; without it S3 refuses the request.
  curl_slist* raw = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!s.session_token.empty()) raw = curl_slist_append(raw, ("x-amz-security-token: " + s.session_token).c_str());
  if (if_none_match) raw = curl_slist_append(raw, "If-None-Match: *");
  std::unique_ptr<curl_slist, SlistDeleter> headers(raw);

  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  // A stalled transfer (under 1 byte/s for 60 s) is a failure, not a hang.
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  if (upload != nullptr) {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, read_file_cb);
    curl_easy_setopt(c, CURLOPT_READDATA, upload);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  } else {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  }
  r.curl = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  if (r.curl != CURLE_OK)
    r.transport = std::string(curl_easy_strerror(r.curl)) + (errbuf[0] ? std::string(" (") + errbuf + ")" : "");
  return r;
}

std::string xml_field(const std::string& body, const std::string& tag) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const std::size_t a = body.find(open);
  if (a == std::string::npos) return {};
  const std::size_t b = body.find(close, a + open.size());
  if (b == std::string::npos) return {};
  std::string v = body.substr(a + open.size(), b - a - open.size());
  std::replace(v.begin(), v.end(), '\n', ' ');
  return v;
}

// Failures that every further file would hit alike.
bool stops_everything(const std::string& code) {
  static const std::set<std::string> codes = {
      "InvalidAccessKeyId", "SignatureDoesNotMatch",        "ExpiredToken",     "InvalidToken", "TokenRefreshRequired",
      "NoSuchBucket",       "AuthorizationHeaderMalformed", "InvalidBucketName"};
  return codes.count(code) != 0;
}

struct Step {
  Status status = Status::failed;
  bool retry = false;      // transient: try again
  bool transport = false;  // never got an HTTP answer
  bool stop = false;       // every further file would fail the same way
  std::string detail;
  std::string stop_why;  // with stop: what every file would hit
};

Step http_failure(const char* what, const HttpResult& r) {
  Step s;
  if (r.curl != CURLE_OK) {
    s.retry = s.transport = true;
    s.detail = std::string(what) + ": " + r.transport;
    return s;
  }
  const std::string code = xml_field(r.body, "Code"), message = xml_field(r.body, "Message");
  s.detail = std::string(what) + ": HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code) +
             (message.empty() ? "" : " (" + message + ")");
  s.retry = r.status >= 500 || r.status == 408 || r.status == 429;
  s.stop = stops_everything(code);
  if (s.stop) s.stop_why = "every file would be refused alike (" + code + ")";
  return s;
}

Step s3_put_once(const S3Settings& s, const Target& t, const std::string& key, const fs::path& local, bool overwrite) {
  const std::string url = object_url(s, t.bucket, key);
  if (!overwrite) {
    const HttpResult head = s3_request(s, url, nullptr, 0, false);
    if (head.curl == CURLE_OK && head.status >= 200 && head.status < 300)
      return {Status::exists, false, false, false, "exists; overwrite is false"};
    // 404: absent. 403: absent without list permission, or refused; the PUT below tells which.
    if (!(head.curl == CURLE_OK && (head.status == 404 || head.status == 403))) return http_failure("HEAD", head);
  }
  std::error_code ec;
  const std::uint64_t size = fs::file_size(local, ec);
  std::unique_ptr<FILE, FileDeleter> f(ec ? nullptr : std::fopen(local.c_str(), "rb"));
  if (!f)
    return {Status::failed, false, false, false,
            "cannot read " + local.string() + ": " + (ec ? ec.message() : std::strerror(errno))};
  // If-None-Match: * closes the gap between HEAD and PUT where the service supports it.
  const HttpResult put = s3_request(s, url, f.get(), size, !overwrite);
  if (put.curl == CURLE_OK && put.status >= 200 && put.status < 300) return {Status::uploaded, false, false, false, {}};
  if (put.curl == CURLE_OK && put.status == 412 && !overwrite)
    return {Status::exists, false, false, false, "exists; overwrite is false"};
  return http_failure("PUT", put);
}

// --- file:// -----------------------------------------------------------------------------------

Step file_copy_once(const fs::path& dest, const fs::path& local, bool overwrite) {
  std::error_code ec;
  if (!overwrite && fs::exists(fs::symlink_status(dest, ec)))
    return {Status::exists, false, false, false, "exists; overwrite is false"};
  fs::create_directories(dest.parent_path(), ec);
  if (ec)
    return {Status::failed, false, false, false,
            "cannot create folder " + dest.parent_path().string() + ": " + ec.message()};
  // Through a temporary name beside it, so a reader never sees half a file.
  const fs::path tmp = dest.string() + ".memsnap-tmp" + std::to_string(getpid());
  interrupt::Temporary guard(tmp);  // an interrupted upload leaves no half copy at the destination
  fs::copy_file(local, tmp, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return {Status::failed, false, false, false, "cannot copy: " + ec.message()};
  }
  int rc = 0;
  if (overwrite) {
    rc = ::rename(tmp.c_str(), dest.c_str());
  } else {
    rc = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a file system without it
      rc = ::link(tmp.c_str(), dest.c_str());
      if (rc == 0) ::unlink(tmp.c_str());
    }
  }
  const int err = errno;
  if (rc == 0) guard.release();
  if (rc != 0) {
    fs::remove(tmp, ec);
    if (err == EEXIST) return {Status::exists, false, false, false, "exists; overwrite is false"};
    return {Status::failed, false, false, false, "cannot write " + dest.string() + ": " + std::strerror(err)};
  }
  return {Status::uploaded, false, false, false, {}};
}

}  // namespace

std::vector<UploadItem> plan_report_upload(const std::string& tmpl, const StoreInfo& info, const fs::path& store,
                                           const fs::path& report_dir, const std::vector<ReportPage>& pages,
                                           const std::string& timestamp) {
  try {
    check_template(tmpl, true, "remote_file_name");
  } catch (const NameError& e) {
    throw UploadError(e.what());
  }
  const Target t = parse_target(tmpl);
  const std::size_t slash = t.path_tmpl.rfind('/');
  const std::string folder_tmpl = slash == std::string::npos ? "" : t.path_tmpl.substr(0, slash);
  const std::string prefix = t.s3 ? std::string(kS3) + t.bucket + "/" : std::string(kFile);

  auto vars_of = [&](int rank, std::int64_t batch) {
    NameVars v;
    v.run_name = info.run_name;
    v.rank = rank;
    v.world_size = info.world_size;
    v.batch = batch;
    v.timestamp = timestamp;
    if (rank >= 0 && rank < static_cast<int>(info.ranks.size())) {
      v.local_rank = info.ranks[rank].local_rank;
      v.node_rank = info.ranks[rank].node_rank;
      v.local_world_size = info.ranks[rank].local_world_size;
    }
    return v;
  };
  auto format = [&](const std::string& part, const NameVars& v) {
    try {
      return format_name(part, v);
    } catch (const NameError& e) {
      throw UploadError(std::string("key 'remote_file_name': ") + e.what());
    }
  };

  // The shared files sit beside the pages, so the folder must be one for all of them.
  NameVars a = vars_of(0, 1), b = vars_of(1, 2);
  b.local_rank = a.local_rank + 1;
  b.node_rank = a.node_rank + 1;
  b.local_world_size = a.local_world_size + 1;
  const std::string folder = format(folder_tmpl, a);
  if (folder != format(folder_tmpl, b)) {
    bad_template(tmpl,
                 "its folder part '" + folder_tmpl +
                     "' changes with the rank or the batch; index.html, summary.json "
                     "and the store go into the same folder as every rank page, so only the file name may use {rank}, "
                     "{local_rank}, {node_rank}, {local_world_size} and {batch}");
  }
  auto remote_of = [&](const std::string& path) {
    check_components(tmpl, prefix + path,
                     t.s3 ? std::string_view(path) : std::string_view(path).substr(path.front() == '/'));
    return prefix + path;
  };
  auto beside = [&](const std::string& name) { return folder.empty() ? name : folder + "/" + name; };

  std::vector<UploadItem> items;
  for (const auto& p : pages) {
    items.push_back(
        {join_inside(report_dir, p.page), remote_of(with_html(format(t.path_tmpl, vars_of(p.rank, p.batch))))});
  }
  items.push_back({report_dir / "summary.json", remote_of(beside("summary.json"))});
  items.push_back({report_dir / "index.html", remote_of(beside("index.html"))});
  const fs::path store_dir = store.parent_path();
  for (const auto& r : info.ranks) {
    if (r.data_file.empty()) continue;
    items.push_back({join_inside(store_dir, r.data_file), remote_of(beside(r.data_file))});
  }
  items.push_back({store, remote_of(beside(store.filename().string()))});

  std::map<std::string, fs::path> seen;
  for (const auto& item : items) {
    const auto [at, fresh] = seen.emplace(item.remote, item.local);
    if (!fresh) {
      bad_template(tmpl, "gives " + at->second.string() + " and " + item.local.string() + " the same name " +
                             item.remote + "; use {rank} and {batch} in the file name");
    }
  }
  return items;
}

std::vector<UploadOutcome> upload_files(const std::vector<UploadItem>& items, const UploadOptions& options) {
  std::vector<UploadOutcome> out(items.size());
  const EnvLookup env = options.env ? options.env : process_env();
  std::optional<S3Settings> s3;
  int transport_failures_in_a_row = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const UploadItem& item = items[i];
    UploadOutcome& o = out[i];
    Step step;
    try {
      const Target t = parse_target(item.remote);
      if (t.s3 && !s3) {
        curl_init_once();
        s3 = s3_settings(env);
      }
      if (t.s3 && !s3->error.empty()) {
        step = {Status::failed, false, false, true, s3->error, "no credentials"};
      } else {
        for (int attempt = 1; attempt <= std::max(1, options.attempts); ++attempt) {
          if (attempt > 1 && !options.backoff_s.empty()) {
            const double wait = options.backoff_s[std::min<std::size_t>(attempt - 2, options.backoff_s.size() - 1)];
            std::this_thread::sleep_for(std::chrono::duration<double>(wait));
          }
          o.attempts = attempt;
          step = t.s3 ? s3_put_once(*s3, t, t.path_tmpl, item.local, options.overwrite)
                      : file_copy_once(t.path_tmpl, item.local, options.overwrite);
          if (!step.retry) break;
        }
      }
    } catch (const std::exception& e) {
      step = {Status::failed, false, false, false, e.what()};
    }
    o.status = step.status;
    o.detail = step.detail;
    if (o.status == Status::failed && o.attempts > 1) o.detail += "; after " + std::to_string(o.attempts) + " attempts";
    if (options.after_each) options.after_each(i, o);
    transport_failures_in_a_row = step.status == Status::failed && step.transport ? transport_failures_in_a_row + 1 : 0;
    if (step.stop || transport_failures_in_a_row >= 2) {
      const std::string why = step.stop ? step.stop_why : "the last two files could not reach the server";
      for (std::size_t j = i + 1; j < items.size(); ++j) out[j] = {Status::not_attempted, 0, why};
      break;
    }
  }
  return out;
}

int upload_report(const StoreInfo& info, const fs::path& store, const fs::path& report_dir,
                  const std::vector<ReportPage>& pages, bool overwrite_flag, bool quiet, std::ostream& out,
                  std::ostream& err, const UploadOptions& base) {
  std::string tmpl;
  UploadOptions options = base;
  try {
    const nlohmann::json c = nlohmann::json::parse(info.config_json.empty() ? "{}" : info.config_json);
    if (c.is_object()) {
      if (c.contains("remote_file_name") && c["remote_file_name"].is_string()) tmpl = c["remote_file_name"];
      if (c.contains("overwrite") && c["overwrite"].is_boolean() && c["overwrite"].get<bool>())
        options.overwrite = true;
    }
  } catch (const nlohmann::json::exception& e) {
    err << "memsnap report: upload: the store's config is not JSON (" << e.what() << "); nothing uploaded\n";
    return 4;
  }
  if (tmpl.empty()) return 0;
  if (overwrite_flag) options.overwrite = true;
  try {
    const std::vector<UploadItem> items = plan_report_upload(tmpl, info, store, report_dir, pages, timestamp_now());
    const std::vector<UploadOutcome> outcomes = upload_files(items, options);
    std::size_t uploaded = 0, exists = 0, failed = 0, skipped = 0;
    std::string skipped_why;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const UploadOutcome& o = outcomes[i];
      const std::string which = items[i].local.string() + " -> " + items[i].remote;
      switch (o.status) {
        case Status::uploaded:
          ++uploaded;
          break;
        case Status::exists:
          ++exists;
          err << "memsnap report: not uploaded " << which << ": " << o.detail << "\n";
          break;
        case Status::failed:
          ++failed;
          err << "memsnap report: upload failed " << which << ": " << o.detail << "\n";
          break;
        case Status::not_attempted:
          ++skipped;
          skipped_why = o.detail;
          break;
      }
    }
    if (skipped > 0) err << "memsnap report: " << skipped << " more file(s) not uploaded: " << skipped_why << "\n";
    const std::size_t slash = items.front().remote.rfind('/');
    const std::string folder = items.front().remote.substr(0, slash + 1);
    if (uploaded == items.size()) {
      if (!quiet) out << "memsnap report: uploaded " << uploaded << " files to " << folder << "\n";
      return 0;
    }
    err << "memsnap report: uploaded " << uploaded << " of " << items.size() << " files to " << folder << " (" << exists
        << " already there, " << failed << " failed, " << skipped
        << " not attempted); the local report and store are unchanged\n";
  } catch (const std::exception& e) {
    err << "memsnap report: upload: " << e.what() << "; nothing uploaded\n";
  }
  return 4;
}

}  // namespace memsnap
