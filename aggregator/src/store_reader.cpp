// Reads the HDF5 store through its root file; external links take it into the rank files, so
// nothing here depends on the physical layout.
#include <charconv>
#include <algorithm>

#include "hdf5_util.hpp"
#include "memsnap/findings.hpp"
#include "memsnap/store.hpp"
#include "store_layout.hpp"

namespace memsnap {

namespace {
using h5::Handle;

/// A bulk dataset of records whose compound type comes from their field table.
template <class T>
std::vector<T> read_records(hid_t loc, const char* name, const std::string& context) {
  Handle t = layout::compound_type<T>();
  return h5::read_vector<T>(loc, name, t, context);
}

// Rows of an index table, unpacked by their field table from a memory layout whose string
// widths and optional columns follow the file's.
template <class S>
std::vector<S> read_table(hid_t file, const char* name, const std::string& c) {
  const std::string what = c + ": cannot read /" + name;
  Handle ds = h5::dataset_handle(H5Dopen2(file, name, H5P_DEFAULT), what);
  const std::size_t n = h5::array_size(ds, what);
  Handle ft = h5::type_handle(H5Dget_type(ds), what);
  if (H5Tget_class(ft) != H5T_COMPOUND) throw StoreError(what + ": not a memsnap table (its row type differs)");
  const layout::RowLayout l = layout::layout_of_file<S>(ft.get());
  Handle t = l.compound_type();
  // The file's row type must be memsnap's: the same fields, of the same classes, inside the row.
  // HDF5's own conversion of a damaged compound type can read out of bounds.
  const int members = H5Tget_nmembers(t);
  if (H5Tget_class(ft) != H5T_COMPOUND || H5Tget_nmembers(ft) != members) {
    throw StoreError(what + ": not a memsnap table (its row type differs)");
  }
  const std::size_t row = H5Tget_size(ft);
  for (int i = 0; i < members; ++i) {
    char* want = H5Tget_member_name(t, static_cast<unsigned>(i));
    char* have = H5Tget_member_name(ft, static_cast<unsigned>(i));
    const bool same_name = want != nullptr && have != nullptr && std::string(want) == have;
    H5free_memory(want);
    H5free_memory(have);
    Handle member = h5::type_handle(H5Tget_member_type(ft, static_cast<unsigned>(i)), what);
    const bool fits = H5Tget_member_offset(ft, static_cast<unsigned>(i)) + H5Tget_size(member) <= row;
    if (!same_name || !fits || H5Tget_member_class(ft, static_cast<unsigned>(i)) != H5Tget_member_class(t, static_cast<unsigned>(i))) {
      throw StoreError(what + ": not a memsnap table (field " + std::to_string(i) + " differs)");
    }
  }
  const double stored = static_cast<double>(H5Dget_storage_size(ds));
  if (static_cast<double>(n) * static_cast<double>(row) > 256.0 * stored + static_cast<double>(1u << 20)) {
    throw StoreError(what + ": it declares " + std::to_string(n) + " rows but stores only " +
                     std::to_string(static_cast<std::uint64_t>(stored)) + " bytes (damaged file?)");
  }
  std::vector<char> bytes(n * l.size());
  if (n > 0) h5::check_status(H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), what);
  return layout::unpack<S>(l, bytes);
}

std::vector<std::string> read_strings(hid_t loc, const std::string& prefix, const std::string& c) {
  auto blob = h5::read_vector<std::uint8_t>(loc, (prefix + "blob").c_str(), H5T_NATIVE_UINT8, c);
  auto offsets = h5::read_vector<std::uint64_t>(loc, (prefix + "offsets").c_str(), H5T_NATIVE_UINT64, c);
  return layout::unpack_strings(blob, offsets, c + ": " + prefix);
}

std::string attr_or(hid_t loc, const char* name, const std::string& c, const std::string& fallback = "") {
  return h5::has_attr(loc, name) ? h5::read_attr_string(loc, name, c) : fallback;
}

WindowRecord read_window_group(hid_t g, const std::string& c, bool events = true) {
  WindowRecord w;
  w.batch_start = h5::read_attr<std::int64_t>(g, "batch_start", c);
  w.batch_end = h5::read_attr<std::int64_t>(g, "batch_end", c);
  w.open_time_ns = h5::read_attr<std::int64_t>(g, "open_time_ns", c);
  w.close_time_ns = h5::read_attr<std::int64_t>(g, "close_time_ns", c);
  w.oom = h5::read_attr<std::int64_t>(g, "oom", c) != 0;
  w.closed = h5::read_attr<std::int64_t>(g, "closed", c) != 0;
  w.dropped = h5::read_attr<std::uint64_t>(g, "dropped", c);
  w.status = status_from_name(h5::read_attr_string(g, "status", c));
  // Stores written before batch inference and source extras: the defaults.
  w.batch_method = attr_or(g, "batch_method", c, "recorded");
  w.batch_confidence = h5::has_attr(g, "batch_confidence") ? h5::read_attr<double>(g, "batch_confidence", c) : 1.0;
  w.batch_detail = attr_or(g, "batch_detail", c);
  if (h5::exists(g, "source_extras")) {
    const auto extras = h5::read_vector<std::uint8_t>(g, "source_extras", H5T_NATIVE_UINT8, c);
    w.source_extras.assign(extras.begin(), extras.end());
  }
  if (events) w.events = read_records<Event>(g, "events", c);
  w.live_at_start = read_records<LiveAlloc>(g, "live_at_start", c);
  w.batches = read_records<BatchMark>(g, "batches", c);
  const auto segs = read_records<layout::SegmentRow>(g, "segments", c);
  const auto blocks = read_records<layout::BlockRow>(g, "blocks", c);
  for (const auto& r : segs) {
    Segment s;
    s.addr = r.addr;
    s.size = r.size;
    s.stream = r.stream;
    s.device = r.device;
    s.pool = std::string(r.pool, strnlen(r.pool, layout::kPoolWidth));
    if (r.first_block + r.n_blocks > blocks.size()) throw StoreError(c + ": segment blocks out of range");
    for (std::uint64_t b = r.first_block; b < r.first_block + r.n_blocks; ++b) {
      const auto& k = blocks[b];
      s.blocks.push_back(Block{k.addr, k.size, k.requested_size, k.state, k.stack_id});
    }
    w.segments.push_back(std::move(s));
  }
  return w;
}

}  // namespace

struct StoreReader::Impl {
  std::filesystem::path path;
  Handle file;
  std::string c;  // context for messages: the file name

  Handle open_rank(int rank) const {
    const std::string name = "/rank/" + std::to_string(rank);
    if (!h5::exists(file, name)) throw StoreError(c + ": no rank " + std::to_string(rank) + " in this store");
    return h5::group_handle(H5Gopen2(file, name.c_str(), H5P_DEFAULT),
                            c + ": cannot open " + name + " (its data file " + data_file(rank) + ")");
  }
  Handle open_window(int rank, std::int64_t batch, std::string& c) const {
    Handle g = open_rank(rank);
    const std::string name = "batch/" + std::to_string(batch);
    c = this->c + ": /rank/" + std::to_string(rank) + "/" + name;
    if (!h5::exists(g, name)) throw StoreError(this->c + ": rank " + std::to_string(rank) + " has no window ending at batch " + std::to_string(batch));
    return h5::group_handle(H5Gopen2(g, name.c_str(), H5P_DEFAULT), c + ": cannot open");
  }
  std::string data_file(int rank) const {
    H5L_info_t info;
    const std::string name = "/rank/" + std::to_string(rank);
    if (H5Lget_info(file, name.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_EXTERNAL) {
      H5Eclear2(H5E_DEFAULT);
      return "in the root file";
    }
    std::vector<char> buf(info.u.val_size);
    const char* fname = nullptr;
    const char* oname = nullptr;
    unsigned flags = 0;
    if (H5Lget_val(file, name.c_str(), buf.data(), buf.size(), H5P_DEFAULT) < 0 ||
        H5Lunpack_elink_val(buf.data(), buf.size(), &flags, &fname, &oname) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return "?";
    }
    return fname;
  }
};

StoreReader::StoreReader(const std::filesystem::path& path) : m_impl(std::make_unique<Impl>()) {
  h5::QuietErrors quiet;
  m_impl->path = path;
  m_impl->c = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw StoreError(m_impl->c + ": no such file");
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw StoreError(m_impl->c + ": not an HDF5 file");
  }
  Handle fapl = h5::file_access();
  m_impl->file = h5::file_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), m_impl->c + ": cannot open");
  if (!h5::has_attr(m_impl->file, "format") || h5::read_attr_string(m_impl->file, "format", m_impl->c) != kStoreFormat) {
    throw StoreError(m_impl->c + ": an HDF5 file but not a memsnap store (no format=\"memsnap\" attribute)");
  }
  const auto version = h5::read_attr<std::int64_t>(m_impl->file, "format_version", m_impl->c);
  if (version < kStoreOldestFormatVersion || version > kStoreFormatVersion) {
    throw StoreError(m_impl->c + ": store format version " + std::to_string(version) +
                     " is not supported (this memsnap reads versions " + std::to_string(kStoreOldestFormatVersion) +
                     " to " + std::to_string(kStoreFormatVersion) + ")");
  }
}

StoreReader::~StoreReader() = default;
StoreReader::StoreReader(StoreReader&&) noexcept = default;
StoreReader& StoreReader::operator=(StoreReader&&) noexcept = default;

const std::filesystem::path& StoreReader::path() const { return m_impl->path; }

std::vector<RankInfo> StoreReader::ranks() const {
  h5::QuietErrors quiet;
  return read_table<RankInfo>(m_impl->file, "ranks", m_impl->c);
}

std::vector<SummaryRow> StoreReader::summary() const {
  h5::QuietErrors quiet;
  // batch_method and batch_confidence are absent from stores written before they existed: the
  // rows keep SummaryRow's defaults ("recorded", 1.0).
  return read_table<SummaryRow>(m_impl->file, "summary", m_impl->c);
}

std::vector<SiteRow> StoreReader::sites() const {
  h5::QuietErrors quiet;
  const auto& c = m_impl->c;
  std::vector<SiteRow> out = read_table<SiteRow>(m_impl->file, "sites", c);
  Handle g = h5::group_handle(H5Gopen2(m_impl->file, "site_names", H5P_DEFAULT), c + ": cannot open /site_names");
  const auto names = read_strings(g, "", c + ": /site_names");
  for (auto& s : out) {
    if (s.site_id >= names.size()) throw StoreError(c + ": /sites names site " + std::to_string(s.site_id) + " beyond /site_names");
    s.name = names[s.site_id];
  }
  return out;
}

bool StoreReader::has_findings() const {
  h5::QuietErrors quiet;
  return h5::exists(m_impl->file, "findings");
}

std::vector<Finding> StoreReader::findings() const {
  h5::QuietErrors quiet;
  return read_table<Finding>(m_impl->file, "findings", m_impl->c);
}

DigestTables StoreReader::digest() const {
  h5::QuietErrors quiet;
  const auto& c = m_impl->c;
  DigestTables d;
  d.windows = read_table<DigestWindowRow>(m_impl->file, "digest/windows", c);
  d.batches = read_table<DigestBatchRow>(m_impl->file, "digest/batches", c);
  d.held = read_table<DigestHeldRow>(m_impl->file, "digest/held", c);
  return d;
}

StoreInfo StoreReader::info() const {
  h5::QuietErrors quiet;
  const auto& c = m_impl->c;
  StoreInfo info;
  info.format_version = static_cast<int>(h5::read_attr<std::int64_t>(m_impl->file, "format_version", c));
  layout::read_root_attrs(m_impl->file, info, c);
  info.ranks = ranks();
  info.rows = summary();
  return info;
}

std::vector<std::int64_t> StoreReader::batches(int rank) const {
  h5::QuietErrors quiet;
  Handle g = m_impl->open_rank(rank);
  const std::string c = m_impl->c + ": /rank/" + std::to_string(rank);
  std::vector<std::pair<std::int64_t, std::int64_t>> found;  // (window, batch)
  if (!h5::exists(g, "batch")) return {};
  Handle b = h5::group_handle(H5Gopen2(g, "batch", H5P_DEFAULT), c + ": cannot open batch");
  H5G_info_t gi;
  h5::check_status(H5Gget_info(b, &gi), c + ": batch");
  for (hsize_t i = 0; i < gi.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(b, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) h5::fail(c + ": cannot list batch");
    std::string name(static_cast<std::size_t>(n), '\0');
    H5Lget_name_by_idx(b, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1, H5P_DEFAULT);
    Handle w = h5::group_handle(H5Gopen2(b, name.c_str(), H5P_DEFAULT), c + ": cannot open batch/" + name);
    // Window groups are named by their batch: anything else is damage, named as such.
    std::int64_t batch = 0;
    const auto [end, err] = std::from_chars(name.data(), name.data() + name.size(), batch);
    if (err != std::errc() || end != name.data() + name.size()) {
      throw StoreError(c + "/batch/" + name + ": a window group whose name is not a batch number");
    }
    found.emplace_back(h5::read_attr<std::int64_t>(w, "window", c + "/batch/" + name), batch);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::int64_t> out;
  for (const auto& [w, batch] : found) out.push_back(batch);
  return out;
}

WindowRecord StoreReader::read_window(int rank, std::int64_t batch) const {
  h5::QuietErrors quiet;
  std::string c;
  Handle w = m_impl->open_window(rank, batch, c);
  return read_window_group(w, c);
}

WindowRecord StoreReader::read_window_without_events(int rank, std::int64_t batch) const {
  h5::QuietErrors quiet;
  std::string c;
  Handle w = m_impl->open_window(rank, batch, c);
  return read_window_group(w, c, false);
}

void StoreReader::read_events(int rank, std::int64_t batch, const std::function<bool(std::span<const Event>)>& piece) const {
  h5::QuietErrors quiet;
  std::string c;
  Handle w = m_impl->open_window(rank, batch, c);
  const std::string what = c + ": cannot read events";
  Handle ds = h5::dataset_handle(H5Dopen2(w, "events", H5P_DEFAULT), what);
  const std::size_t n = h5::array_size(ds, what);
  // As read_vector: a damaged file may declare any extent.
  const double declared = static_cast<double>(n) * static_cast<double>(sizeof(Event));
  const double stored = static_cast<double>(H5Dget_storage_size(ds));
  if (declared > static_cast<double>(1ull << 30) && declared > 256.0 * stored) {
    throw StoreError(what + ": it declares " + std::to_string(n) + " items but stores only " +
                     std::to_string(static_cast<std::uint64_t>(stored)) + " bytes (damaged file?)");
  }
  // A piece per chunk, so that each chunk is inflated once.
  hsize_t step = 65536;
  Handle dcpl = h5::plist_handle(H5Dget_create_plist(ds), what);
  if (hsize_t chunk = 0; H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 1, &chunk) == 1 && chunk > 0) step = chunk;
  Handle type = layout::compound_type<Event>();
  Handle file_space = h5::space_handle(H5Dget_space(ds), what);
  std::vector<Event> buffer;
  for (hsize_t start = 0; start < n; start += step) {
    const hsize_t count = std::min<hsize_t>(step, n - start);
    buffer.resize(count);
    h5::check_status(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &count, nullptr), what);
    Handle mem_space = h5::space_handle(H5Screate_simple(1, &count, nullptr), what);
    h5::check_status(H5Dread(ds, type, mem_space, file_space, H5P_DEFAULT, buffer.data()), what);
    if (!piece(std::span<const Event>(buffer))) return;
  }
}

RankRecord StoreReader::read_rank(int rank) const {
  RankRecord r = read_rank_without_windows(rank);
  h5::QuietErrors quiet;
  if (!h5::exists(m_impl->open_rank(rank), "frames")) return r;  // a rank without data: status only
  for (auto batch : batches(rank)) r.windows.push_back(read_window(rank, batch));
  return r;
}

RankRecord StoreReader::read_rank_without_windows(int rank) const {
  h5::QuietErrors quiet;
  Handle g = m_impl->open_rank(rank);
  const std::string c = m_impl->c + ": /rank/" + std::to_string(rank);
  RankRecord r;
  r.path = m_impl->path.string();
  RankMeta& m = r.meta;
  m.rank = rank;
  m.source.clear();  // a group without the attribute names no source (RankMeta's default is "api")
  RankInfo state;      // status "ok" where the group does not say
  layout::read_rank_attrs(g, m, state, c);
  r.status = status_from_name(state.status);
  r.status_detail = state.status_detail;
  if (!h5::exists(g, "frames")) return r;  // a rank without data: status only

  m.device_total_bytes = h5::read_vector<std::uint64_t>(g, "device_total_bytes", H5T_NATIVE_UINT64, c);
  {
    Handle f = h5::group_handle(H5Gopen2(g, "frames", H5P_DEFAULT), c + ": cannot open frames");
    const auto names = read_strings(f, "names_", c + "/frames");
    const auto files = read_strings(f, "files_", c + "/frames");
    const auto lines = h5::read_vector<std::uint32_t>(f, "lines", H5T_NATIVE_UINT32, c + "/frames");
    if (names.size() != files.size() || names.size() != lines.size()) throw StoreError(c + "/frames: columns of different lengths");
    r.frames.reserve(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) r.frames.push_back(Frame{names[i], files[i], lines[i]});
  }
  {
    Handle s = h5::group_handle(H5Gopen2(g, "stacks", H5P_DEFAULT), c + ": cannot open stacks");
    const auto offsets = h5::read_vector<std::uint64_t>(s, "offsets", H5T_NATIVE_UINT64, c + "/stacks");
    const auto ids = h5::read_vector<std::uint32_t>(s, "frame_ids", H5T_NATIVE_UINT32, c + "/stacks");
    for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (offsets[i] > offsets[i + 1] || offsets[i + 1] > ids.size()) throw StoreError(c + "/stacks: offsets out of range");
      r.stacks.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(offsets[i]), ids.begin() + static_cast<std::ptrdiff_t>(offsets[i + 1]));
    }
  }
  return r;
}

}  // namespace memsnap
