// Per-window analysis: what the aggregator computes for every rank's window and the store keeps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memsnap/record.hpp"
#include "memsnap/window_replay.hpp"  // free_action, live_key: what a replay of a window means

namespace memsnap {

// FSDP-aware grouping of allocations, decided from the frames of their stack.
enum class Category : std::uint8_t {
  parameters = 0,
  gradients = 1,
  optimizer_state = 2,
  all_gather = 3,
  reduce_scatter = 4,
  activations = 5,
  other = 6,
};
inline constexpr int kCategoryCount = 7;
const char* category_name(Category c);

// Bytes held at the window's peak by one allocation site.
struct SiteStat {
  std::uint32_t stack_id = kNoStack;  // a representative full stack (kNoStack: none recorded)
  std::string name;                   // the site: innermost frame outside allocator internals
  Category category = Category::other;
  std::uint64_t bytes_at_peak = 0;
  std::uint64_t count_at_peak = 0;
  std::uint64_t bytes_allocated = 0;  // over the whole window
  std::uint64_t allocations = 0;
  bool operator==(const SiteStat&) const = default;
};

// Bytes one site holds at a point of the window.
struct HeldSite {
  std::string name;
  Category category = Category::other;
  std::uint64_t bytes = 0;
  bool operator==(const HeldSite&) const = default;
};

struct BatchStat {
  std::int64_t batch = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t live_at_end = 0;
  std::uint64_t live_at_start = 0;  // allocated bytes when the batch began
  // The lowest allocated bytes during the batch: what it holds on to. Python frees a batch's
  // outputs only when the next batch rebinds their names, so the level at a boundary still
  // holds the previous batch's last tensors; the low point inside the batch does not.
  std::uint64_t min_allocated = 0;
  // The site that held the most more at this batch's peak than at the window's other batches'
  // peaks (their median): what a spike in this batch is made of. Empty with one batch.
  std::string peak_site;
  std::uint64_t peak_site_excess = 0;
  // An allocation failed in this batch (the first that did): its size, the allocated bytes when
  // it was refused, and the site that asked (the OOM's own stack; without one, what this
  // batch's peak holds more of than the window's other batches). `oom_went_on`: the job
  // allocated again after it (it caught torch's OutOfMemoryError and went on), so the window
  // was not cut short by it. The batch's peak is the failed attempt's, not the job's need.
  bool oom = false;
  bool oom_went_on = false;
  std::uint64_t oom_requested = 0;
  std::uint64_t live_at_oom = 0;
  std::string oom_site;
  bool operator==(const BatchStat&) const = default;
};

// How a window's batch low points grow, and what its batches keep for good: what the leak rule
// reads of a window (analyse_window computes it; the store keeps it in /digest/windows).
struct WindowGrowth {
  // Growth of the batches' low points (min_allocated) from one batch to the next (the mean over
  // the window; 0 with fewer than two batches) less the optimizer state created in its batches
  // (a parameter's first gradient; it stops once every parameter has its state), and the site
  // whose bytes at those low points grew the most.
  double growth_per_batch = 0;
  bool growth_monotone = false;  // every batch's low point is at least the one before's
  std::string growth_site;
  double growth_site_per_batch = 0;
  // Memory the batches keep for good: bytes per batch of the window's allocations still live at
  // its end from sites that made them at two or more separate times (a quarter of a batch apart
  // or more), the last time's left out (it may be the last batch's own tensors). 0 where no site
  // keeps memory batch after batch. `retained_site` keeps the most; `retained_times` is how many
  // separate times it allocated what it keeps.
  double retained_per_batch = 0;
  std::string retained_site;
  std::uint32_t retained_times = 0;
  // A code path regrows one tensor: its allocations are larger at each of three or more times,
  // the last held at the window's end (or the window has no stacks to tell). What makes rising
  // low points a leak: they also rise with a run of ever larger inputs.
  bool growth_regrown = false;
  bool operator==(const WindowGrowth&) const = default;
};

// A window's events, its peaks and the levels at its open and close: what /summary keeps of it
// (SummaryRow).
struct WindowSummary {
  std::uint64_t n_events = 0;
  std::uint64_t dropped = 0;
  std::uint64_t peak_allocated = 0;
  std::int64_t peak_allocated_time_ns = 0;
  std::uint64_t peak_reserved = 0;
  std::int64_t peak_reserved_time_ns = 0;
  std::uint64_t live_at_open = 0;    // allocated bytes when the window opened
  std::uint64_t live_at_close = 0;   // allocated bytes when it closed
  std::uint64_t reserved_at_open = 0;
  std::uint64_t reserved_at_close = 0;
  std::uint64_t persistent = 0;      // bytes of allocations live across the whole window
  std::uint64_t fragmentation_at_peak = 0;  // reserved minus allocated at the allocated peak
  bool operator==(const WindowSummary&) const = default;
};

// One analysed window: its summary (WindowSummary), how its batches' low points grow
// (WindowGrowth), and the rest below.
struct WindowStats : WindowSummary, WindowGrowth {
  std::int64_t batch_start = 0;
  std::int64_t batch_end = 0;
  bool reserved_seen = false;        // the source reported segments (else reserved = allocated)
  bool oom = false;
  std::uint64_t oom_requested = 0;
  std::uint64_t live_at_oom = 0;     // allocated bytes when the (first) allocation was refused
  std::string oom_site;              // BatchStat::oom_site of that batch ("" before any batch)
  bool oom_went_on = false;          // the job allocated again after it (BatchStat::oom_went_on)
  RecordStatus status = RecordStatus::ok;
  std::vector<SiteStat> sites;       // by bytes at peak, largest first (top_sites)
  std::uint64_t category_bytes_at_peak[kCategoryCount] = {};
  std::vector<BatchStat> batches;
  // What the window's lowest batch low point holds, by site, largest first (at most top_sites):
  // what a rank that holds more than the others at every batch boundary holds more of.
  std::vector<HeldSite> sites_at_low;
};

struct AnalysisOptions {
  std::size_t top_sites = 32;
};

WindowStats analyse_window(const RankRecord& rank, const WindowRecord& window, const AnalysisOptions& options = {});

// A stack with frames: an id the rank holds and that is not empty (kNoStack has none).
inline bool has_frames(const RankRecord& rank, std::uint32_t stack_id) {
  return stack_id < rank.stacks.size() && !rank.stacks[stack_id].empty();
}

// The site of a stack: the innermost frame that is not allocator or framework plumbing,
// as "function (file:line)". Empty stack: "<no stack>".
std::string site_name(const RankRecord& rank, std::uint32_t stack_id);
// A frame as sites name it: "function (file:line)".
std::string frame_label(const Frame& f);
// A frame of the user's own code: Python outside installed packages (torch, site-packages).
bool is_user_code(const Frame& f);
Category categorize(const RankRecord& rank, std::uint32_t stack_id);

// Allocations without frames in a window whose allocations carry Python frames. torch's
// snapshot (stacks="python", or "all") records the Python stack of the thread that allocates;
// a thread without Python gets `frames: []`. In a training loop that thread is torch's autograd
// engine running the backward (under stacks="all" the same allocations carry its C++ frames and
// read gradients), so an allocation the window made without frames is a gradient there, and its
// site says why it has no frames. Memory live when the window opened without frames (allocated
// before the trace began) stays "<no stack>", other.
inline constexpr const char* kNoPythonFramesSite = "<no Python frames: autograd engine>";
// Whether the window's allocations were recorded with Python frames by torch's snapshot (source
// "torch"; some allocation event of the window has a Python frame). Not for torch's
// context="state" (frames on the snapshot's blocks only), nor for memsnap's own recorders, whose
// stack_min_bytes leaves small allocations without frames.
bool python_frames_recorded(const RankRecord& rank, const WindowRecord& window);
// Whether an allocation is one of those: made in the window (not live at its open), without
// frames, in a window where python_frames_recorded.
inline bool made_without_python(const RankRecord& rank, std::uint32_t stack_id, bool made_in_window, bool python_window) {
  return python_window && made_in_window && !has_frames(rank, stack_id);
}
// The category of one allocation: its stack's, or gradients where made_without_python.
Category categorize_allocation(const RankRecord& rank, std::uint32_t stack_id, bool made_in_window, bool python_window);

}  // namespace memsnap
