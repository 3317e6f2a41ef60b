// Fuzz target: StoreReader on stores that HDF5 itself wrote, so that the fuzzing stays in
// memsnap's reader rather than in HDF5's file-format parser (fuzz_store_raw covers that).
// A valid one-rank store is written once with memsnap's own writer; each input is a list of
// edits made through the HDF5 API (attributes of another type or shape, datasets replaced with
// other contents, types or ranks, objects deleted or soft-linked elsewhere, window groups copied
// under other names), then the store is read as `memsnap info`, `report` and `export` do.
#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_store_common.hpp"

namespace {

namespace fs = std::filesystem;
using memsnap::fuzz::Bytes;
constexpr const char* kTarget = "fuzz_store";

// Objects an edit can name. Paths under /rank/0 live in the rank file (the root file links them).
constexpr const char* kObjects[] = {
    "/", "/ranks", "/summary", "/sites", "/site_names", "/site_names/blob", "/site_names/offsets",
    "/rank/0", "/rank/0/frames", "/rank/0/frames/names_blob", "/rank/0/frames/names_offsets",
    "/rank/0/frames/files_blob", "/rank/0/frames/files_offsets", "/rank/0/frames/lines",
    "/rank/0/stacks", "/rank/0/stacks/offsets", "/rank/0/stacks/frame_ids",
    "/rank/0/device_total_bytes", "/rank/0/batch", "/rank/0/batch/4", "/rank/0/batch/4/events",
    "/rank/0/batch/4/live_at_start", "/rank/0/batch/4/batches", "/rank/0/batch/4/segments",
    "/rank/0/batch/4/blocks", "/rank/0/batch/7", "/rank/0/batch/7/events", "/rank/0/batch/7/segments",
    "/rank/0/batch/7/blocks"};
constexpr std::size_t kObjectCount = sizeof kObjects / sizeof kObjects[0];

constexpr const char* kAttributes[] = {
    "format", "format_version", "run_name", "world_size", "created", "tool_version", "config",
    "hostname", "pid", "local_rank", "local_world_size", "node_rank", "device_name", "source",
    "status", "status_detail", "spill", "start_unix_ns", "clock_offset_ns", "window", "batch_start",
    "batch_end", "open_time_ns", "close_time_ns", "oom", "closed", "dropped"};
constexpr std::size_t kAttributeCount = sizeof kAttributes / sizeof kAttributes[0];

memsnap::RankRecord base_record() {
  using namespace memsnap;
  RankRecord r;
  r.meta.rank = 0;
  r.meta.world_size = 1;
  r.meta.host = "node0";
  r.meta.pid = 1234;
  r.meta.run_name = "fuzz";
  r.meta.device_name = "cpu";
  r.meta.device_total_bytes = {1u << 30};
  r.has_meta = true;
  r.ended = true;
  r.frames = {{"operator new", "new.cc", 1}, {"FsdpSim::forward(int)", "fsdp_sim.cpp", 186}, {"main", "main.cpp", 9}};
  r.stacks = {{0, 1, 2}, {1, 2}};
  for (int k = 0; k < 2; ++k) {
    WindowRecord w;
    w.batch_start = 1 + 3 * k;
    w.batch_end = 4 + 3 * k;
    w.open_time_ns = 1000 + k;
    w.close_time_ns = 9000 + k;
    w.closed = true;
    w.live_at_start = {LiveAlloc{0x1000, 4096, 0, 10, 1, 0, 0, 0}, LiveAlloc{0x100000, 1 << 20, 0, 5, kNoStack, 0, 1, 0}};
    w.events = {Event{2000, 0x100000, 1 << 20, 0, kNoStack, 0, Action::segment_alloc, 0},
                Event{2100, 0x2000, 512, 0, 0, 0, Action::alloc, 0},
                Event{2200, 0x3000, 1024, 0, 1, 0, Action::alloc, 0},
                Event{2300, 0x2000, 512, 0, 0, 0, Action::free_completed, 0},
                Event{2400, 0x9000, 1 << 24, 0, 1, 0, Action::oom, 0}};
    w.batches = {BatchMark{w.batch_start + 1, 2050}, BatchMark{w.batch_start + 2, 2250}};
    w.segments = {Segment{0x100000, 1 << 20, 0, 0, "large", {Block{0x100000, 1024, 1000, 1, 1}, Block{0x100400, 4096, 4096, 0, kNoStack}}}};
    r.windows.push_back(std::move(w));
  }
  return r;
}

struct BaseStore {
  std::string root_bytes;
  std::string rank_bytes;
};

// Written once with memsnap's writer, in a folder of its own, then kept as bytes.
const BaseStore& base_store() {
  static const BaseStore base = [] {
    using namespace memsnap;
    const fs::path dir = memsnap::fuzz::scratch_dir() / "base";
    fs::create_directories(dir / "memsnap.h5.d");
    const RankRecord rec = base_record();
    RankInfo info;
    info.rank = 0;
    info.host = rec.meta.host;
    info.device = rec.meta.device_name;
    info.pid = rec.meta.pid;
    info.source = "api";
    info.n_windows = static_cast<std::uint32_t>(rec.windows.size());
    info.data_file = "memsnap.h5.d/rank0.h5";
    info.spill = "rank0.pid1234.spill";
    write_rank_file(dir / info.data_file, rec, info);
    StoreIndex index;
    index.run_name = "fuzz";
    index.world_size = 1;
    index.config_json = "{}";
    index.ranks = {info};
    for (std::size_t i = 0; i < rec.windows.size(); ++i) {
      const WindowStats stats = analyse_window(rec, rec.windows[i]);
      index.rows.push_back(make_summary_row(rec, static_cast<int>(i), stats));
      for (const auto& s : stats.sites) {
        SiteRow row{s};
        row.rank = 0;
        row.window = static_cast<int>(i);
        row.batch = rec.windows[i].batch_end;
        index.sites.push_back(row);
      }
    }
    write_root_file(dir / "memsnap.h5", index);
    BaseStore b{memsnap::fuzz::read_whole(dir / "memsnap.h5"), memsnap::fuzz::read_whole(dir / info.data_file)};
    fs::remove_all(dir);
    return b;
  }();
  return base;
}

// The file and the path inside it that hold an object.
struct Where {
  hid_t file;
  std::string path;
};
Where locate(hid_t root, hid_t rank, const std::string& object) {
  const std::string prefix = "/rank/0";
  if (object.rfind(prefix, 0) == 0 && object.size() > prefix.size()) return {rank, object.substr(prefix.size())};
  if (object == prefix) return {root, object};
  return {root, object};
}

std::vector<char> payload(Bytes& in, std::size_t n) {
  std::vector<char> v(n, 0);
  const auto s = in.take(n);
  if (!s.empty()) std::memcpy(v.data(), s.data(), s.size());
  return v;
}

hid_t make_space(std::uint8_t shape, hsize_t n, hsize_t* count) {
  if (shape % 4 == 0) {
    *count = 1;
    return H5Screate(H5S_SCALAR);
  }
  if (shape % 4 == 1) {
    *count = 0;
    return H5Screate(H5S_NULL);
  }
  if (shape % 4 == 2) {
    *count = n;
    const hsize_t dims[1] = {n};
    return H5Screate_simple(1, dims, nullptr);
  }
  *count = n * 2;
  const hsize_t dims[2] = {n, 2};
  return H5Screate_simple(2, dims, nullptr);
}

// The element type of an edit: one of a few native types, a fixed or variable string, or
// (for datasets) the type the object had.
hid_t make_type(std::uint8_t kind, hid_t original) {
  switch (kind % 7) {
    case 0: return H5Tcopy(H5T_NATIVE_INT64);
    case 1: return H5Tcopy(H5T_NATIVE_UINT8);
    case 2: return H5Tcopy(H5T_NATIVE_DOUBLE);
    case 3: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 1 + kind / 7);
      return t;
    }
    case 4: return H5Tcopy(H5T_NATIVE_INT32);
    case 5: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      return t;
    }
    default: return original >= 0 ? H5Tcopy(original) : H5Tcopy(H5T_NATIVE_UINT64);
  }
}

// Fills `bytes` for `count` elements of `type`; variable-length strings get pointers into `texts`.
std::vector<char> element_data(Bytes& in, hid_t type, hsize_t count, std::vector<std::string>& texts) {
  if (H5Tis_variable_str(type) > 0) {
    texts.clear();
    std::vector<char> ptrs(count * sizeof(char*));
    for (hsize_t i = 0; i < count; ++i) texts.push_back(in.short_string(64));
    for (hsize_t i = 0; i < count; ++i) {
      const char* p = texts[i].c_str();
      std::memcpy(ptrs.data() + i * sizeof(char*), &p, sizeof p);
    }
    return ptrs;
  }
  return payload(in, count * H5Tget_size(type));
}

void edit(hid_t root, hid_t rank, Bytes& in) {
  const std::uint8_t op = in.byte();
  const Where w = locate(root, rank, kObjects[in.byte() % kObjectCount]);
  switch (op % 5) {
    case 0: {  // an attribute of another type or shape (or a new one)
      const char* name = kAttributes[in.byte() % kAttributeCount];
      const std::uint8_t kind = in.byte();
      // MEMSNAP_FUZZ_STORE_SCALAR_ATTRS=1: only scalar attributes, to fuzz past the known
      // overflow of reading a many-element attribute (crashes/store/read_attr_*).
      static const bool scalar_only = std::getenv("MEMSNAP_FUZZ_STORE_SCALAR_ATTRS") != nullptr;
      const std::uint8_t shape = scalar_only ? 0 : in.byte();
      const hsize_t n = in.byte() % 9;
      hid_t obj = H5Oopen(w.file, w.path.c_str(), H5P_DEFAULT);
      if (obj < 0) return;
      if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
      hsize_t count = 0;
      hid_t type = make_type(kind, -1);
      hid_t space = make_space(shape, n, &count);
      std::vector<std::string> texts;
      const std::vector<char> bytes = element_data(in, type, count, texts);
      hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
      if (attr >= 0) {
        if (count > 0) H5Awrite(attr, type, bytes.data());
        H5Aclose(attr);
      }
      H5Sclose(space);
      H5Tclose(type);
      H5Oclose(obj);
      return;
    }
    case 1:  // an object gone
      if (w.path != "/") H5Ldelete(w.file, w.path.c_str(), H5P_DEFAULT);
      return;
    case 2: {  // a dataset with other contents, element type or rank
      if (w.path == "/") return;
      hid_t original = -1;
      if (hid_t ds = H5Dopen2(w.file, w.path.c_str(), H5P_DEFAULT); ds >= 0) {
        original = H5Dget_type(ds);
        H5Dclose(ds);
      }
      const std::uint8_t kind = in.byte();
      const std::uint8_t shape = in.byte();
      const hsize_t n = in.byte() % 65;
      H5Ldelete(w.file, w.path.c_str(), H5P_DEFAULT);
      hsize_t count = 0;
      hid_t type = make_type(kind, original);
      hid_t space = make_space(shape, n, &count);
      std::vector<std::string> texts;
      const std::vector<char> bytes = element_data(in, type, count, texts);
      hid_t ds = H5Dcreate2(w.file, w.path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (ds >= 0) {
        if (count > 0) H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
        H5Dclose(ds);
      }
      H5Sclose(space);
      H5Tclose(type);
      if (original >= 0) H5Tclose(original);
      return;
    }
    case 3: {  // a window group copied under another name
      std::string name = in.short_string(40);
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name.find('\0') != std::string::npos) return;
      const std::string source = (in.byte() & 1) ? "/batch/4" : "/batch/7";
      H5Ocopy(rank, source.c_str(), rank, ("/batch/" + name).c_str(), H5P_DEFAULT, H5P_DEFAULT);
      return;
    }
    default: {  // an object replaced by a soft link to another (a loop, a dangling name)
      if (w.path == "/") return;
      const Where target = locate(root, rank, kObjects[in.byte() % kObjectCount]);
      if (target.file != w.file) return;
      H5Ldelete(w.file, w.path.c_str(), H5P_DEFAULT);
      H5Lcreate_soft(target.path.c_str(), w.file, w.path.c_str(), H5P_DEFAULT, H5P_DEFAULT);
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)quiet;
  const BaseStore& base = base_store();
  const fs::path dir = memsnap::fuzz::scratch_dir();
  const fs::path root_path = dir / "memsnap.h5";
  std::error_code ec;
  fs::create_directories(dir / "memsnap.h5.d", ec);
  memsnap::fuzz::write_file(root_path, base.root_bytes);
  memsnap::fuzz::write_file(dir / "memsnap.h5.d" / "rank0.h5", base.rank_bytes);
  {
    hid_t root = H5Fopen(root_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t rank = H5Fopen((dir / "memsnap.h5.d" / "rank0.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (root < 0 || rank < 0) memsnap::fuzz::finding(kTarget, "cannot open the base store for editing");
    Bytes in(data, size);
    for (int i = 0; i < 16 && !in.empty(); ++i) edit(root, rank, in);
    H5Fclose(rank);
    H5Fclose(root);
  }
  memsnap::fuzz::run_guarded(kTarget, [&] { memsnap::fuzz::exercise_store(root_path); });
  return 0;
}
