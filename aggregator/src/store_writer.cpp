// Writes the HDF5 store: a rank's bulk file, and the root file that indexes and links them.
//
// Only serial HDF5 calls (default file driver) are used: each aggregator rank writes whole files
// of its own and rank 0 writes the root, so the store builds the same with a serial or a parallel
// HDF5 and no rank ever waits on a collective metadata operation.
#include <chrono>
#include <ctime>
#include <set>
#include <unordered_map>

#include "chunked_write.hpp"
#include "hdf5_util.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/store.hpp"
#include "memsnap/version.hpp"
#include "store_layout.hpp"

namespace memsnap {

namespace {

using h5::Handle;

std::string iso_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Handle create_file(const std::filesystem::path& path) {
  // Exclusive: a store is built under a fresh temporary name and never clobbers a file.
  Handle fapl = h5::file_access();
  return h5::file_handle(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl),
                         path.string() + ": cannot create");
}

Handle create_group(hid_t loc, const std::string& name, const std::string& context) {
  return h5::group_handle(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                          context + ": cannot create group " + name);
}

void write_strings(hid_t loc, const std::string& prefix, const std::vector<std::string>& strings, h5::Compression deflate,
                   const std::string& context) {
  std::vector<std::uint8_t> blob;
  std::vector<std::uint64_t> offsets;
  layout::pack_strings(strings, blob, offsets);
  h5::write_vector(loc, (prefix + "blob").c_str(), H5T_NATIVE_UINT8, blob, deflate, context);
  h5::write_vector(loc, (prefix + "offsets").c_str(), H5T_NATIVE_UINT64, offsets, deflate, context);
}

/// A bulk dataset of records whose compound type comes from their field table.
template <class T>
void write_records(hid_t loc, const char* name, const std::vector<T>& records, h5::Compression deflate,
                   const std::string& context) {
  Handle t = layout::compound_type<T>();
  h5::write_vector(loc, name, t, records, deflate, context);
}

/// An index table: rows packed by their field table, strings as wide as the longest value.
template <class S>
void write_table(hid_t loc, const char* name, const std::vector<S>& rows, int deflate, const std::string& context) {
  const layout::RowLayout l = layout::layout_of_rows(rows);
  const std::vector<char> bytes = layout::pack(l, rows);
  Handle t = l.compound_type();
  h5::write_array(loc, name, t, bytes.data(), rows.size(), deflate, context);
}

// Attributes live in the object header (64 KiB at most with the default file format): a long
// human detail is cut, at a character boundary.
constexpr std::size_t kMaxDetailBytes = 16 * 1024;
std::string clip_utf8(const std::string& s, std::size_t max) {
  if (s.size() <= max) return s;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  return s.substr(0, n);
}

void write_window(hid_t batches_group, const WindowRecord& w, int index, h5::Compression o, const std::string& context) {
  const std::string name = std::to_string(w.batch_end);
  const std::string c = context + ": /batch/" + name;
  Handle g = create_group(batches_group, name, context);
  h5::write_attr(g, "window", index, c);
  h5::write_attr(g, "batch_start", w.batch_start, c);
  h5::write_attr(g, "batch_end", w.batch_end, c);
  h5::write_attr(g, "open_time_ns", w.open_time_ns, c);
  h5::write_attr(g, "close_time_ns", w.close_time_ns, c);
  h5::write_attr(g, "oom", w.oom, c);
  h5::write_attr(g, "closed", w.closed, c);
  h5::write_attr(g, "dropped", w.dropped, c);
  h5::write_attr(g, "status", status_name(w.status), c);
  h5::write_attr(g, "batch_method", w.batch_method, c);
  h5::write_attr(g, "batch_confidence", w.batch_confidence, c);
  h5::write_attr(g, "batch_detail", clip_utf8(w.batch_detail, kMaxDetailBytes), c);

  write_records(g, "events", w.events, o, c);
  write_records(g, "live_at_start", w.live_at_start, o, c);
  write_records(g, "batches", w.batches, 0, c);

  std::vector<layout::SegmentRow> segs;
  std::vector<layout::BlockRow> blocks;
  segs.reserve(w.segments.size());
  for (const auto& s : w.segments) {
    layout::SegmentRow r;
    r.addr = s.addr;
    r.size = s.size;
    r.stream = s.stream;
    r.device = s.device;
    r.first_block = blocks.size();
    r.n_blocks = static_cast<std::uint32_t>(s.blocks.size());
    std::memcpy(r.pool, s.pool.data(), std::min(s.pool.size(), layout::kPoolWidth - 1));
    for (const auto& b : s.blocks) blocks.push_back(layout::BlockRow{b.addr, b.size, b.requested_size, b.stack_id, b.state});
    segs.push_back(r);
  }
  write_records(g, "segments", segs, o, c);
  write_records(g, "blocks", blocks, o, c);
  const std::vector<std::uint8_t> extras(w.source_extras.begin(), w.source_extras.end());
  h5::write_vector(g, "source_extras", H5T_NATIVE_UINT8, extras, o, c);
  g.close(c + ": cannot close");
}

}  // namespace

std::filesystem::path store_data_dir(const std::filesystem::path& store) {
  std::filesystem::path d = store;
  d += ".d";
  return d;
}

SummaryRow make_summary_row(const RankRecord& record, int window, const WindowStats& s) {
  SummaryRow r;
  r.rank = record.meta.rank;
  r.window = window;
  r.batch_start = s.batch_start;
  r.batch_end = s.batch_end;
  r.host = record.meta.host;
  r.device = record.meta.device_name;
  static_cast<WindowSummary&>(r) = s;
  r.oom = s.oom;
  r.oom_requested = s.oom_requested;
  r.status = status_name(s.status);
  for (int c = 0; c < kCategoryCount; ++c) r.category_bytes[c] = s.category_bytes_at_peak[c];
  if (window >= 0 && static_cast<std::size_t>(window) < record.windows.size()) {
    r.batch_method = record.windows[static_cast<std::size_t>(window)].batch_method;
    r.batch_confidence = record.windows[static_cast<std::size_t>(window)].batch_confidence;
  }
  return r;
}

RankFileWriter::RankFileWriter(const StoreWriteOptions& options) : m_deflate(options.deflate) {
  if (options.deflate > 0) m_compressor = std::make_unique<h5::ChunkCompressor>(options.deflate, options.threads);
}

RankFileWriter::~RankFileWriter() = default;

unsigned RankFileWriter::threads() const { return m_compressor ? m_compressor->threads() : 1; }

void write_rank_file(const std::filesystem::path& path, const RankRecord& record, const RankInfo& info,
                     const StoreWriteOptions& options) {
  RankFileWriter(options).write(path, record, info);
}

void RankFileWriter::write(const std::filesystem::path& path, const RankRecord& record, const RankInfo& info) {
  const h5::Compression bulk(m_deflate, m_compressor.get());
  h5::QuietErrors quiet;
  const std::string c = path.string();
  Handle file = create_file(path);
  layout::write_rank_attrs(file, record.meta, info, c);
  h5::write_vector(file, "device_total_bytes", H5T_NATIVE_UINT64, record.meta.device_total_bytes, 0, c);

  {
    Handle frames = create_group(file, "frames", c);
    std::vector<std::string> names, files;
    std::vector<std::uint32_t> lines;
    names.reserve(record.frames.size());
    files.reserve(record.frames.size());
    lines.reserve(record.frames.size());
    for (const auto& f : record.frames) {
      names.push_back(f.name);
      files.push_back(f.file);
      lines.push_back(f.line);
    }
    write_strings(frames, "names_", names, bulk, c + ": /frames");
    write_strings(frames, "files_", files, bulk, c + ": /frames");
    h5::write_vector(frames, "lines", H5T_NATIVE_UINT32, lines, bulk, c + ": /frames");
  }
  {
    Handle stacks = create_group(file, "stacks", c);
    std::vector<std::uint64_t> offsets{0};
    std::vector<std::uint32_t> ids;
    offsets.reserve(record.stacks.size() + 1);
    for (const auto& s : record.stacks) {
      ids.insert(ids.end(), s.begin(), s.end());
      offsets.push_back(ids.size());
    }
    h5::write_vector(stacks, "offsets", H5T_NATIVE_UINT64, offsets, bulk, c + ": /stacks");
    h5::write_vector(stacks, "frame_ids", H5T_NATIVE_UINT32, ids, bulk, c + ": /stacks");
  }
  {
    Handle batches = create_group(file, "batch", c);
    std::set<std::int64_t> seen;
    for (std::size_t i = 0; i < record.windows.size(); ++i) {
      const auto& w = record.windows[i];
      if (!seen.insert(w.batch_end).second) {
        throw StoreError(c + ": two windows of rank " + std::to_string(info.rank) + " end at batch " +
                         std::to_string(w.batch_end));
      }
      write_window(batches, w, static_cast<int>(i), bulk, c);
    }
  }
  file.close(c + ": cannot close (disk full?)");
}

void write_root_file(const std::filesystem::path& path, const StoreIndex& index) {
  h5::QuietErrors quiet;
  const std::string c = path.string();
  Handle file = create_file(path);
  h5::write_attr(file, "format", kStoreFormat, c);
  h5::write_attr(file, "format_version", kStoreFormatVersion, c);
  StoreAttrs attrs = index;
  if (attrs.created.empty()) attrs.created = iso_now();
  if (attrs.tool_version.empty()) attrs.tool_version = kVersion;
  layout::write_root_attrs(file, attrs, c);

  write_table(file, "ranks", index.ranks, 0, c);
  write_table(file, "summary", index.rows, 1, c);

  // /sites and /site_names: ids are ranks in the sorted set of names, so the same spills give the
  // same ids whatever the number of aggregator ranks.
  {
    std::vector<std::string> names;
    names.reserve(index.sites.size());
    for (const auto& s : index.sites) names.push_back(s.name);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::unordered_map<std::string, std::uint32_t> ids;
    for (std::size_t i = 0; i < names.size(); ++i) ids.emplace(names[i], static_cast<std::uint32_t>(i));

    std::vector<SiteRow> sites = index.sites;
    for (auto& s : sites) s.site_id = ids.at(s.name);
    write_table(file, "sites", sites, 1, c);
    Handle g = create_group(file, "site_names", c);
    write_strings(g, "", names, 1, c + ": /site_names");
  }

  // /findings and the cross-rank digest its rules read (memsnap/findings.hpp).
  if (index.findings != nullptr) {
    write_table(file, "findings", index.findings->findings, 1, c);
    Handle g = create_group(file, "digest", c);
    write_table(g, "windows", index.findings->digest.windows, 1, c + ": /digest");
    write_table(g, "batches", index.findings->digest.batches, 1, c + ": /digest");
    write_table(g, "held", index.findings->digest.held, 1, c + ": /digest");
  }

  // /rank/<r>: external links into the rank files, or plain groups for ranks without data.
  {
    Handle ranks = create_group(file, "rank", c);
    for (const auto& r : index.ranks) {
      const std::string name = std::to_string(r.rank);
      if (!r.data_file.empty()) {
        h5::check_status(H5Lcreate_external(r.data_file.c_str(), "/", ranks, name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                         c + ": cannot link /rank/" + name + " to " + r.data_file);
        continue;
      }
      Handle g = create_group(ranks, name, c);
      layout::write_rank_status_attrs(g, r, c + ": /rank/" + name);
    }
  }
  file.close(c + ": cannot close (disk full?)");
}

}  // namespace memsnap
