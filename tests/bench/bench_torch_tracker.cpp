// What a trace entry of PyTorch's CUDA caching allocator costs the allocating thread (GPU
// benchmark, built where the PyTorch attachment is). No Python: the loop calls the allocator the
// way a tensor's creation and release do, so the differences between modes are not buried in the
// interpreter's own 600-1300 ns per torch.empty.
//   memsnap_bench_torch_tracker --mode plain|empty_tracker|attach|paired [--batches N] [--pairs N]
//                               [--label L] [--out FILE]
//   plain          no tracker: PyTorch builds no trace entries
//   empty_tracker  a tracker that does nothing: PyTorch's own cost of building each entry
//   attach         memsnap's attachment (memsnap_torch_attach; windows as MEMSNAP_* say)
//   paired         the attachment, its tracker bypassed in every other batch: memsnap's own share
//                  per entry as the median of (batch - mean of its two neighbours), all in one
//                  process (the machine's drift between processes drops out)
// Each batch allocates and frees `pairs` blocks (alloc, free_requested, free_completed: three
// trace entries each), then ends the batch (memsnap_torch_step in attach mode). Prints one JSON
// line: ns per entry (wall and this thread's CPU time, median and min over batches), and the time
// the batch end took on this thread (median, max).
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

extern "C" int memsnap_torch_attach(const char* device_name);
extern "C" void memsnap_torch_attach_empty_tracker();
extern "C" void memsnap_torch_step();
extern "C" std::uint64_t memsnap_torch_events();
extern "C" void memsnap_torch_bench_bypass(int on);

namespace {

std::int64_t clock_ns(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double round1(double x) { return static_cast<double>(static_cast<std::int64_t>(x * 10 + 0.5)) / 10; }

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "memsnap_bench_torch_tracker: %s\n"
                       "usage: memsnap_bench_torch_tracker --mode plain|empty_tracker|attach|paired [--batches N] "
                       "[--warmup N] [--pairs N] [--label L] [--out FILE]\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "plain", label, out;
  int batches = 200, warmup = 10, pairs = 1200;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("option " + a + " needs a value").c_str());
    const char* v = argv[++i];
    if (a == "--mode") mode = v;
    else if (a == "--label") label = v;
    else if (a == "--out") out = v;
    else if (a == "--batches") batches = std::atoi(v);
    else if (a == "--warmup") warmup = std::atoi(v);
    else if (a == "--pairs") pairs = std::atoi(v);
    else usage(("unknown option " + a).c_str());
  }
  if (mode != "plain" && mode != "empty_tracker" && mode != "attach" && mode != "paired") usage(("unknown mode " + mode).c_str());
  if (batches < 1 || pairs < 1 || warmup < 0) usage("--batches and --pairs must be at least 1");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "memsnap_bench_torch_tracker: no CUDA device\n");
    return 2;
  }
  namespace alloc = c10::cuda::CUDACachingAllocator;
  alloc::init(devices);
  alloc::raw_delete(alloc::raw_alloc(1 << 20));  // the device's allocator state exists
  if (mode == "empty_tracker") memsnap_torch_attach_empty_tracker();
  const bool paired = mode == "paired";
  if ((mode == "attach" || paired) && memsnap_torch_attach("bench") != 1) {
    std::fprintf(stderr, "memsnap_bench_torch_tracker: memsnap did not attach\n");
    return 1;
  }
  const bool recording = mode == "attach" || paired;

  // Sizes as a transformer's activations and gradients mix them; a few blocks stay live.
  const std::size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 256 << 10};
  std::vector<void*> held;
  for (int i = 0; i < 8; ++i) held.push_back(alloc::raw_alloc(1 << 20));
  std::vector<double> wall, cpu, ends;
  std::uint64_t events_before = 0;
  for (int b = 0; b < warmup + batches; ++b) {
    if (b == warmup && recording) events_before = memsnap_torch_events();
    if (paired) memsnap_torch_bench_bypass(b % 2 == 0);
    const std::int64_t w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < pairs; ++i) alloc::raw_delete(alloc::raw_alloc(sizes[i % 6]));
    const std::int64_t w1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (recording) memsnap_torch_step();
    const std::int64_t w2 = clock_ns(CLOCK_MONOTONIC);
    if (b < warmup) continue;
    wall.push_back(static_cast<double>(w1 - w0) / (3.0 * pairs));
    cpu.push_back(static_cast<double>(c1 - c0) / (3.0 * pairs));
    ends.push_back(static_cast<double>(w2 - w1) / 1e3);
  }
  for (void* p : held) alloc::raw_delete(p);
  if (paired) memsnap_torch_bench_bypass(0);
  const double events = recording ? static_cast<double>(memsnap_torch_events() - events_before) : 3.0 * pairs * batches;
  // paired: wall[] alternates bypassed and recorded batches (the first recorded when warmup is odd).
  std::vector<double> share, bypassed, recorded;
  for (std::size_t i = 0; paired && i < wall.size(); ++i) {
    const bool was_recorded = (static_cast<std::size_t>(warmup) + i) % 2 == 1;
    (was_recorded ? recorded : bypassed).push_back(wall[i]);
    if (was_recorded && i > 0 && i + 1 < wall.size()) share.push_back(wall[i] - (wall[i - 1] + wall[i + 1]) / 2);
  }

  char extra[256] = "";
  if (paired)
    std::snprintf(extra, sizeof extra,
                  ", \"bypassed_ns_per_entry\": %.1f, \"recorded_ns_per_entry\": %.1f, "
                  "\"memsnap_share_ns_per_entry\": %.1f",
                  round1(median(bypassed)), round1(median(recorded)), round1(median(share)));
  char line[768];
  std::snprintf(line, sizeof line,
                "{\"label\": \"%s\", \"mode\": \"%s\", \"ns_per_entry\": %.1f, \"ns_per_entry_min\": %.1f, "
                "\"cpu_ns_per_entry\": %.1f, \"cpu_ns_per_entry_min\": %.1f, \"batch_end_us_median\": %.1f, "
                "\"batch_end_us_max\": %.1f, \"events_per_batch\": %.1f, \"batches\": %d%s}",
                (label.empty() ? mode : label).c_str(), mode.c_str(), round1(median(wall)),
                round1(*std::min_element(wall.begin(), wall.end())), round1(median(cpu)),
                round1(*std::min_element(cpu.begin(), cpu.end())), round1(median(ends)),
                round1(*std::max_element(ends.begin(), ends.end())), round1(events / batches), batches, extra);
  std::printf("bench: %s\n", line);
  if (!out.empty()) std::ofstream(out, std::ios::app) << line << "\n";
  return 0;
}
