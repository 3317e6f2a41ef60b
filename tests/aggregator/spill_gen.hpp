// Synthetic rank records with known events, frames and stacks, written with the real SpillWriter:
// the input of the aggregator's tests and of its benchmark.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "memsnap/record.hpp"
#include "memsnap/spill.hpp"

namespace memsnap::test {

struct GenSpec {
  int rank = 0;
  int world_size = 1;
  std::string run_name = "synthetic";
  int windows = 2;
  std::size_t events_per_window = 400;
  std::size_t live_slots = 64;     // allocations in flight at most
  bool last_window_open = false;  // the process "died" inside its last window (no close, no END)
  bool inferred_batches = false;  // windows say their batches were inferred, and carry source extras
};

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/// Window w covers batches [2 + 4w, 4 + 4w], so window 0 is named batch 4 (Composer's default
/// skip_batches=1, interval=3 with a gap between windows).
inline std::int64_t window_start(int w) { return 2 + 4 * w; }
inline std::int64_t window_end(int w) { return window_start(w) + 2; }

/// A deterministic record: sizes and stacks depend on the rank so ranks differ.
inline RankRecord make_record(const GenSpec& spec) {
  RankRecord r;
  RankMeta& m = r.meta;
  m.rank = spec.rank;
  m.world_size = spec.world_size;
  m.local_rank = spec.rank % 2;
  m.local_world_size = 2;
  m.node_rank = spec.rank / 2;
  m.host = "node" + std::to_string(spec.rank / 2);
  m.pid = 1000 + spec.rank;
  m.run_name = spec.run_name;
  m.source = "api";
  m.device_name = "Synthetic GPU";
  m.config_json = R"({"interval":3,"skip_batches":1})";
  m.tool_version = "test";
  m.start_unix_ns = 1700000000000000000LL;
  m.device_total_bytes = {80ULL << 30};

  r.frames = {{"memsnap::Recorder::record_alloc", "recorder.cpp", 10},
              {"train_step", "train.py", 12},
              {"Model::forward", "model.py", 40},
              {"Model::backward", "model.py", 90},
              {"Adam::step", "torch/optim/adam.py", 120},
              {"FSDP::all_gather", "fsdp.py", 300},
              {"init_params", "model.py", 5}};
  r.stacks = {{0, 2, 1}, {0, 3, 1}, {0, 4, 1}, {0, 5, 2, 1}, {0, 6}};

  const std::uint64_t scale = 1 + static_cast<std::uint64_t>(spec.rank % 3);
  std::int64_t t = 1'000'000 + spec.rank;
  for (int wi = 0; wi < spec.windows; ++wi) {
    WindowRecord w;
    w.batch_start = window_start(wi);
    w.open_time_ns = t;
    // Parameters live across the window: the baseline.
    for (int p = 0; p < 4; ++p) {
      w.live_at_start.push_back(LiveAlloc{0x7000'0000'0000ULL + static_cast<std::uint64_t>(p) * 0x100000, (1ULL << 20) * scale,
                                          0, t - 100, 4, 0, 0, 0});
    }
    w.live_at_start.push_back(LiveAlloc{0x7100'0000'0000ULL, (64ULL << 20) * scale, 0, t - 200, kNoStack, 0, 1, 0});
    std::vector<std::uint64_t> slot_addr(spec.live_slots, 0), slot_size(spec.live_slots, 0);
    const std::size_t n = spec.events_per_window;
    w.events.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (i % (n / 3 + 1) == 0) w.batches.push_back(BatchMark{w.batch_start + static_cast<std::int64_t>(w.batches.size()), t});
      const std::uint64_t h = mix((static_cast<std::uint64_t>(spec.rank) << 40) ^ (static_cast<std::uint64_t>(wi) << 32) ^ i);
      const std::size_t s = h % spec.live_slots;
      Event e;
      e.time_ns = t;
      e.device = 0;
      e.stream = 7;
      if (slot_addr[s] == 0) {
        e.action = Action::alloc;
        e.addr = 0x7f00'0000'0000ULL + (static_cast<std::uint64_t>(s) << 24) + ((h >> 8) & 0xff) * 512;
        e.size = (1 + (h >> 16) % 64) * 4096 * scale;
        e.stack_id = (h >> 24) % 7 < 5 ? static_cast<std::uint32_t>((h >> 24) % 7) : kNoStack;
        slot_addr[s] = e.addr;
        slot_size[s] = e.size;
      } else {
        e.action = Action::free_completed;
        e.addr = slot_addr[s];
        e.size = slot_size[s];
        slot_addr[s] = 0;
      }
      w.events.push_back(e);
      t += 100 + static_cast<std::int64_t>(h % 50);
    }
    while (w.batches.size() < 3) w.batches.push_back(BatchMark{w.batch_start + static_cast<std::int64_t>(w.batches.size()), t});
    if (spec.inferred_batches) {
      w.batch_method = wi % 2 == 0 ? "recurring_annotation" : "periodicity";
      w.batch_confidence = 0.5 + 0.125 * wi;
      w.batch_detail = "window " + std::to_string(wi) + " of rank " + std::to_string(spec.rank);
      w.source_extras = R"({"device_count":1,"segments":[],"other_keys":{"rank":)" + std::to_string(spec.rank) + "}}";
    }
    const bool open = spec.last_window_open && wi == spec.windows - 1;
    if (!open) {
      w.batch_end = window_end(wi);
      w.close_time_ns = t;
      w.closed = true;
      w.oom = false;
      w.dropped = static_cast<std::uint64_t>(spec.rank);
      w.status = RecordStatus::ok;
      Segment seg{0x7100'0000'0000ULL, (64ULL << 20) * scale, 0, 0, "large", {}};
      seg.blocks.push_back(Block{0x7100'0000'0000ULL, 1 << 20, (1 << 20) - 100, 1, 2});
      seg.blocks.push_back(Block{0x7100'0010'0000ULL, 2 << 20, 2 << 20, 0, kNoStack});
      w.segments.push_back(seg);
    } else {
      w.batch_end = w.batches.back().batch;
      w.status = RecordStatus::truncated;
    }
    r.windows.push_back(std::move(w));
    t += 1'000'000;
  }
  r.status = spec.last_window_open ? RecordStatus::truncated : RecordStatus::ok;
  return r;
}

/// A rank of the benchmarks' synthetic run (tests/bench: bench_aggregate, bench_diff_gen, and so
/// bench_scale.sh and bench_diff.sh): one window of `events` events, 1024 allocations in flight.
inline RankRecord make_bench_record(int rank, int world_size, std::size_t events) {
  GenSpec s;
  s.rank = rank;
  s.world_size = world_size;
  s.run_name = "bench";
  s.windows = 1;
  s.events_per_window = events;
  s.live_slots = 1024;
  return make_record(s);
}

/// Writes `r` as the recorder does (events in chunks, batch marks between them). Windows with
/// closed=false get no close record; `end` false leaves out the END record (a killed process).
inline bool write_spill_file(const std::filesystem::path& path, const RankRecord& r, bool end) {
  SpillWriter sw;
  if (!sw.open(path) || !sw.write_meta(r.meta) || !sw.write_frames(0, r.frames) || !sw.write_stacks(0, r.stacks)) return false;
  for (std::size_t wi = 0; wi < r.windows.size(); ++wi) {
    const auto& w = r.windows[wi];
    const auto id = static_cast<std::uint32_t>(wi);
    if (!sw.write_window_open(id, w.batch_start, w.open_time_ns, w.live_at_start)) return false;
    std::size_t mark = 0, i = 0;
    const std::size_t chunk = 50000;
    while (i < w.events.size() || mark < w.batches.size()) {
      while (mark < w.batches.size() && (i >= w.events.size() || w.batches[mark].time_ns <= w.events[i].time_ns)) {
        if (!sw.write_batch(id, w.batches[mark++])) return false;
      }
      if (i >= w.events.size()) continue;
      std::size_t j = i;
      const std::int64_t limit = mark < w.batches.size() ? w.batches[mark].time_ns : INT64_MAX;
      while (j < w.events.size() && j - i < chunk && w.events[j].time_ns < limit) ++j;
      if (j == i) j = i + 1;
      if (!sw.write_events(id, std::span(w.events).subspan(i, j - i))) return false;
      i = j;
    }
    if (w.batch_method != "recorded" || w.batch_confidence != 1.0 || !w.batch_detail.empty()) {
      if (!sw.write_window_batches(id, w.batch_method, w.batch_confidence, w.batch_detail)) return false;
    }
    if (!sw.write_window_extras(id, w.source_extras)) return false;
    if (!w.closed) continue;
    if (!w.segments.empty() && !sw.write_segments(id, w.segments)) return false;
    if (!sw.write_window_close(id, w.batch_end, w.close_time_ns, w.oom, w.dropped)) return false;
  }
  if (end && !sw.write_end()) return false;
  sw.close();
  return true;
}

/// Flips one byte `from_end` bytes before the end of the file (damages the last records).
inline void damage_file(const std::filesystem::path& path, std::uintmax_t from_end) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return;
  const auto size = std::filesystem::file_size(path);
  std::fseek(f, static_cast<long>(size - from_end), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(size - from_end), SEEK_SET);
  std::fputc(c ^ 0x5a, f);
  std::fclose(f);
}

/// Cuts the file `bytes` short (a process killed mid-write).
inline void cut_file(const std::filesystem::path& path, std::uintmax_t bytes) {
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - bytes);
}

}  // namespace memsnap::test
