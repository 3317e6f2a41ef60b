// Remote upload of a written report and its store: file:// copies and S3 PUTs, per the config's
// remote_file_name template.
//
// Naming. remote_file_name is the name of one rank page, as in Composer's callback, e.g.
//   s3://bucket/{run_name}/memory_snapshots/rank{rank}.{batch}.pt.trace.memory_snapshot.html
// Each rank page goes to that name formatted with its rank and batch (".html" added when missing,
// as for local pages). Everything else goes into the same remote folder (the template up to its
// last '/', which therefore may not depend on the rank or the batch):
//   FOLDER/index.html  FOLDER/summary.json  FOLDER/<store name>  FOLDER/<store name>.d/rank<r>.h5
// A formatted name never holds "." or ".." components, and the bucket (s3://) is literal text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "memsnap/config.hpp"
#include "memsnap/errors.hpp"
#include "memsnap/store.hpp"

namespace memsnap {

/// A remote_file_name that cannot be used: what() is one line naming the key, the value and why.
class UploadError : public Error {
 public:
  using Error::Error;
};

/// One file to send: its local path and its destination (file://PATH or s3://BUCKET/KEY).
struct UploadItem {
  std::filesystem::path local;
  std::string remote;
};

/// How one file fared.
struct UploadOutcome {
  enum class Status { uploaded, exists, failed, not_attempted };
  Status status = Status::not_attempted;
  int attempts = 0;
  std::string detail;  // why, one line: "HTTP 403 InvalidAccessKeyId (...)", "exists; overwrite is false"
};

struct UploadOptions {
  bool overwrite = false;                           // false: an existing object is left alone and reported
  int attempts = 3;                                 // per file, for transient failures (network, 5xx, 408, 429)
  std::vector<double> backoff_s = {0.5, 1.0, 2.0};  // sleep before retry i (the last repeats)
  EnvLookup env;                                    // AWS_* variables; empty: the process environment
  /// Called after each file with its index in `items`; for progress lines and tests.
  std::function<void(std::size_t, const UploadOutcome&)> after_each;
};

/// A rank page of the written report: its rank, the batch that closed its window, and its file
/// name relative to the report folder.
struct ReportPage {
  int rank = 0;
  std::int64_t batch = 0;
  std::string page;
};

/// Where each output of a report goes (see the naming above), in upload order: rank pages,
/// summary.json, index.html, the store's rank files, the store's root file. `timestamp` fills
/// {timestamp}. Throws UploadError for an unusable template or two outputs with one name.
std::vector<UploadItem> plan_report_upload(const std::string& remote_template, const StoreInfo& info,
                                           const std::filesystem::path& store, const std::filesystem::path& report_dir,
                                           const std::vector<ReportPage>& pages, const std::string& timestamp);

/// Sends each item, one at a time, and returns one outcome per item. Never throws. Stops early
/// (the rest `not_attempted`) when the credentials or the bucket are refused, or when two files in
/// a row could not reach the server at all.
std::vector<UploadOutcome> upload_files(const std::vector<UploadItem>& items, const UploadOptions& options);

/// The report's upload step: reads remote_file_name and overwrite from the store's config
/// (`overwrite_flag` also allows replacing), uploads, writes one line per file not uploaded and a
/// closing line to `err` (a success line to `out` unless `quiet`). Returns 0 when there is nothing
/// to upload or everything was uploaded, 4 otherwise. Never throws.
int upload_report(const StoreInfo& info, const std::filesystem::path& store, const std::filesystem::path& report_dir,
                  const std::vector<ReportPage>& pages, bool overwrite_flag, bool quiet, std::ostream& out,
                  std::ostream& err, const UploadOptions& base = {});

}  // namespace memsnap
