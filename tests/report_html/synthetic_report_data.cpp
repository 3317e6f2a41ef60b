// Generates report page data that looks like an FSDP training job: parameter and optimizer
// shards live across the window, per-layer all-gathers, activations freed in reverse order in
// backward, gradient shards, many small temporaries summarised in the "other" band.
#include "synthetic_report_data.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "html/html.hpp"

namespace memsnap::test {
namespace {

using nlohmann::json;
constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
constexpr std::int64_t kMs = 1000000;
constexpr std::int64_t kEpoch = 1733140000000000000;  // epoch ns: beyond 2^53 on purpose

enum Category { kParams, kGrads, kOptim, kGather, kActs, kOther };
const char* const kCategories[] = {"parameters", "gradients", "optimizer_state", "all_gather", "activations", "other"};

struct Alloc {
  std::int64_t addr, size, start, end;  // end -1: live at window end
  int stack, category, stream;
};

class Frames {
 public:
  explicit Frames(bool hostile) : m_hostile(hostile) {}
  int frame(const std::string& name, const std::string& file, int line) {
    const std::string key = name + "\n" + file + "\n" + std::to_string(line);
    auto it = m_ids.find(key);
    if (it != m_ids.end()) return it->second;
    const int id = static_cast<int>(m_name.size());
    m_name.push_back(name);
    m_file.push_back(file);
    m_line.push_back(line);
    m_ids.emplace(key, id);
    return id;
  }
  int stack(const std::vector<int>& frames) {
    auto it = m_stack_ids.find(frames);
    if (it != m_stack_ids.end()) return it->second;
    const int id = static_cast<int>(m_stacks.size());
    m_stacks.push_back(frames);
    m_stack_ids.emplace(frames, id);
    return id;
  }
  // A Python + native stack for an allocation made by `op` inside `module` of layer `layer`.
  int site(const std::string& op, const std::string& module, int layer, const std::string& phase) {
    std::vector<int> f;
    f.push_back(frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "c10/cuda/CUDACachingAllocator.cpp", 1187));
    f.push_back(frame("at::native::empty_cuda", "aten/src/ATen/native/cuda/EmptyTensor.cpp", 42));
    f.push_back(frame(op, op.find("all_gather") != std::string::npos ? "torch/distributed/distributed_c10d.py" : "torch/_ops.py", 700 + static_cast<int>(op.size())));
    f.push_back(frame(module + "." + phase, "model/transformer.py", 100 + 7 * static_cast<int>(module.size())));
    if (layer >= 0) f.push_back(frame("Block.forward", "model/transformer.py", 212 + layer % 3));
    if (m_hostile && layer == 1)
      f.push_back(frame("</script><script>document.body.dataset.pwned='frame'</script>", "<img src=x onerror=\"document.body.dataset.pwned='file'\">", 1));
    f.push_back(frame("train_step", "train.py", 88));
    f.push_back(frame("main", "train.py", 131));
    return stack(f);
  }
  json frames_json() const { return {{"name", m_name}, {"file", m_file}, {"line", m_line}}; }
  json stacks_json() const { return m_stacks; }

 private:
  bool m_hostile;
  std::vector<std::string> m_name, m_file;
  std::vector<int> m_line;
  std::map<std::string, int> m_ids;
  std::vector<std::vector<int>> m_stacks;
  std::map<std::vector<int>, int> m_stack_ids;
};

std::int64_t round_up(std::int64_t v, std::int64_t to) { return (v + to - 1) / to * to; }

}  // namespace

json synthetic_rank_page(const RankPageSpec& spec) {
  std::mt19937_64 rng(spec.seed * 7919 + static_cast<std::uint64_t>(spec.rank));
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  Frames fr(spec.hostile);
  const int L = std::max(2, spec.layers);
  const int n_batches = 3;
  const std::int64_t batch_ns = 300 * kMs;
  const std::int64_t t0 = kEpoch + spec.rank * 1000;
  const std::int64_t shard = static_cast<std::int64_t>(std::llround(48.0 * MiB * spec.shard_scale));
  const int acts_per_layer = 6;
  std::vector<Alloc> allocs;
  std::int64_t next_addr = 0x7f3a00000000LL;
  auto add = [&](std::int64_t size, std::int64_t start, std::int64_t end, int stack, int cat, int stream = 7) {
    size = round_up(size, 512);
    allocs.push_back({next_addr, size, start, end, stack, cat, stream});
    next_addr += round_up(size, 2 * MiB);
  };
  // Persistent state allocated before the window opened.
  for (int l = 0; l < L; ++l) add(shard, t0 - 5000 * kMs + l * kMs, -1, fr.site("aten::empty", "FlatParamHandle", -1, "init"), kParams);
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < 2; ++k)
      add(shard, t0 - 3000 * kMs + l * kMs + k, -1, fr.site(k ? "aten::zeros_like (exp_avg_sq)" : "aten::zeros_like (exp_avg)", "AdamW", -1, "step"), kOptim);
  const int fixed_per_batch = L * (acts_per_layer + 3);
  const std::int64_t budget = spec.n_allocs - static_cast<std::int64_t>(allocs.size()) - n_batches * fixed_per_batch;
  const int temps_per_layer = static_cast<int>(std::max<std::int64_t>(0, budget / (n_batches * 2 * L)));

  std::vector<std::int64_t> batch_starts;
  std::int64_t t1 = t0 + n_batches * batch_ns;
  std::int64_t oom_time = -1;
  std::vector<std::size_t> prev_grads;
  for (int b = 0; b < n_batches; ++b) {
    const std::int64_t bs = t0 + b * batch_ns + 1 * kMs;
    batch_starts.push_back(bs);
    // zero_grad: the previous batch's gradient shards go away.
    for (std::size_t g : prev_grads) allocs[g].end = bs;
    prev_grads.clear();
    const std::int64_t fwd = 100 * kMs / L, bwd = 170 * kMs / L;
    std::vector<std::vector<std::size_t>> acts(L);
    for (int l = 0; l < L; ++l) {
      const std::int64_t ls = bs + l * fwd;
      add(shard * spec.world_size, ls, ls + fwd * 8 / 10, fr.site("c10d::_allgather_base_", "FullyShardedDataParallel", l, "pre_forward"), kGather, 13);
      for (int a = 0; a < acts_per_layer; ++a) {
        const std::int64_t sz = (8 + static_cast<std::int64_t>(uni(rng) * 56)) * MiB;
        acts[l].push_back(allocs.size());
        static const char* ops[] = {"aten::mm", "aten::_softmax", "aten::gelu", "aten::native_layer_norm", "aten::_scaled_dot_product_flash_attention", "aten::add"};
        static const char* mods[] = {"Attention", "Attention", "MLP", "LayerNorm", "Attention", "Block"};
        add(sz, ls + (a + 1) * fwd / (acts_per_layer + 2), -2, fr.site(ops[a], mods[a], l, "forward"), kActs);
      }
      for (int k = 0; k < temps_per_layer; ++k) {
        const std::int64_t s = ls + static_cast<std::int64_t>(uni(rng) * fwd * 0.9);
        add((1 + static_cast<std::int64_t>(uni(rng) * 6)) * MiB, s, s + static_cast<std::int64_t>(uni(rng) * fwd * 0.3) + 1000,
            fr.site("aten::empty_strided", "MLP", l, "forward"), kOther);
      }
    }
    if (spec.leak) add(64 * MiB, bs + 50 * kMs, -1, fr.site("aten::cat", "KVCache", -1, "remember"), kActs);
    const std::int64_t bwd_start = bs + 100 * kMs;
    for (int l = L - 1; l >= 0; --l) {
      const std::int64_t ls = bwd_start + (L - 1 - l) * bwd;
      if (spec.oom && b == n_batches - 1 && l == L / 2) { oom_time = ls + bwd / 3; break; }
      add(shard * spec.world_size, ls, ls + bwd * 7 / 10, fr.site("c10d::_allgather_base_", "FullyShardedDataParallel", l, "pre_backward"), kGather, 13);
      for (std::size_t i : acts[l]) allocs[i].end = ls + bwd / 2 + static_cast<std::int64_t>(uni(rng) * bwd * 0.4);
      prev_grads.push_back(allocs.size());
      add(shard, ls + bwd * 8 / 10, -1, fr.site("c10d::reduce_scatter_tensor", "FullyShardedDataParallel", l, "post_backward"), kGrads, 13);
      for (int k = 0; k < temps_per_layer; ++k) {
        const std::int64_t s = ls + static_cast<std::int64_t>(uni(rng) * bwd * 0.9);
        add((1 + static_cast<std::int64_t>(uni(rng) * 6)) * MiB, s, s + static_cast<std::int64_t>(uni(rng) * bwd * 0.3) + 1000,
            fr.site("aten::empty_strided", "MLP", l, "backward"), kOther);
      }
    }
    if (oom_time >= 0) break;
  }
  if (oom_time >= 0) t1 = oom_time + 2 * kMs;
  for (auto& a : allocs) {
    if (a.end == -2) a.end = oom_time >= 0 ? -1 : t1 - 1;  // activations of an interrupted backward
    if (a.end > t1) a.end = -1;
  }
  if (static_cast<int>(allocs.size()) > spec.n_allocs) allocs.resize(static_cast<std::size_t>(spec.n_allocs));

  // The "other" band: bytes held by the many small allocations not listed.
  json other = {{"time_ns", json::array()}, {"bytes", json::array()}, {"count", json::array()}};
  const int other_points = static_cast<int>(std::min<std::int64_t>(6000, std::max<std::int64_t>(2, spec.other_allocs / 8)));
  std::vector<std::pair<std::int64_t, std::int64_t>> other_series;
  for (int i = 0; i < other_points && spec.other_allocs > 0; ++i) {
    const std::int64_t t = t0 + (t1 - t0) * i / other_points;
    const double phase = std::fmod(static_cast<double>(t - t0) / batch_ns, 1.0);
    const double level = 0.35 + 0.65 * std::sin(3.14159 * std::min(1.0, phase * 1.6)) + 0.1 * uni(rng);
    const std::int64_t bytes = static_cast<std::int64_t>(level * 420 * MiB);
    const std::int64_t count = static_cast<std::int64_t>(level * std::min<std::int64_t>(spec.other_allocs / 4, 60000));
    other["time_ns"].push_back(t);
    other["bytes"].push_back(bytes);
    other["count"].push_back(count);
    other_series.emplace_back(t, bytes);
  }

  // Totals: a sweep over every listed allocation plus the other band.
  std::vector<std::pair<std::int64_t, std::int64_t>> deltas;
  for (const auto& a : allocs) {
    deltas.emplace_back(std::max(a.start, t0), a.size);
    if (a.end >= 0) deltas.emplace_back(a.end, -a.size);
  }
  std::int64_t prev_other = 0;
  for (const auto& [t, v] : other_series) { deltas.emplace_back(t, v - prev_other); prev_other = v; }
  std::sort(deltas.begin(), deltas.end(), [](auto& x, auto& y) { return x.first < y.first || (x.first == y.first && x.second < y.second); });
  json totals = {{"time_ns", json::array()}, {"allocated", json::array()}, {"reserved", json::array()}};
  std::int64_t cur = 0, reserved = 0, peak = 0, peak_t = t0, peak_res = 0;
  std::vector<std::int64_t> tt, ta, tr;
  for (std::size_t i = 0; i < deltas.size(); ++i) {
    cur += deltas[i].second;
    if (i + 1 < deltas.size() && deltas[i + 1].first == deltas[i].first) continue;
    reserved = std::max(reserved, round_up(cur, 512 * MiB));
    tt.push_back(deltas[i].first); ta.push_back(cur); tr.push_back(reserved);
    if (cur > peak) { peak = cur; peak_t = deltas[i].first; }
    peak_res = std::max(peak_res, reserved);
  }
  // Downsample to <= 8000 points, keeping each bucket's extremes.
  const std::size_t max_points = 8000;
  if (tt.size() > max_points) {
    const std::size_t per = (tt.size() + max_points / 2 - 1) / (max_points / 2);
    for (std::size_t s = 0; s < tt.size(); s += per) {
      std::size_t lo = s, hi = s;
      for (std::size_t k = s; k < std::min(tt.size(), s + per); ++k) {
        if (ta[k] < ta[lo]) lo = k;
        if (ta[k] > ta[hi]) hi = k;
      }
      for (std::size_t k : {std::min(lo, hi), std::max(lo, hi)}) {
        totals["time_ns"].push_back(tt[k]); totals["allocated"].push_back(ta[k]); totals["reserved"].push_back(tr[k]);
        if (lo == hi) break;
      }
    }
  } else {
    totals["time_ns"] = tt; totals["allocated"] = ta; totals["reserved"] = tr;
  }

  json A = {{"addr", json::array()}, {"size", json::array()}, {"start_ns", json::array()}, {"end_ns", json::array()},
            {"stream", json::array()}, {"device", json::array()}, {"stack", json::array()}, {"category", json::array()}};
  std::int64_t live_open = 0, live_close = 0;
  for (const auto& a : allocs) {
    A["addr"].push_back(a.addr); A["size"].push_back(a.size); A["start_ns"].push_back(a.start); A["end_ns"].push_back(a.end);
    A["stream"].push_back(a.stream); A["device"].push_back(spec.rank % 8); A["stack"].push_back(a.stack); A["category"].push_back(a.category);
    if (a.start < t0) live_open += a.size;
    if (a.end < 0) live_close += a.size;
  }

  // Sites at the peak.
  std::map<int, std::pair<std::int64_t, std::int64_t>> by_stack;
  std::map<int, int> stack_cat;
  for (const auto& a : allocs)
    if (a.start <= peak_t && (a.end < 0 || a.end > peak_t)) {
      auto& s = by_stack[a.stack];
      s.first += a.size; s.second += 1;
      stack_cat[a.stack] = a.category;
    }
  std::vector<std::pair<int, std::pair<std::int64_t, std::int64_t>>> sites(by_stack.begin(), by_stack.end());
  std::sort(sites.begin(), sites.end(), [](auto& x, auto& y) { return x.second.first > y.second.first; });
  json sites_j = json::array();
  const json frames = fr.frames_json();
  const json stacks = fr.stacks_json();
  for (std::size_t i = 0; i < sites.size() && i < 60; ++i) {
    const int st = sites[i].first;
    const int f2 = stacks[st][2].get<int>(), f3 = stacks[st][3].get<int>();
    std::string name = frames["name"][f3].get<std::string>() + " → " + frames["name"][f2].get<std::string>();
    if (spec.hostile && i == 0) name = "<b onmouseover=\"document.body.dataset.pwned='site'\">site</b>";
    sites_j.push_back({{"name", name}, {"stack", st}, {"bytes", sites[i].second.first}, {"count", sites[i].second.second}, {"category", stack_cat[st]}});
  }

  // Allocator state at window end: live allocations in 2 MiB-rounded segments, with free tails.
  json segments = json::array();
  std::vector<const Alloc*> live;
  for (const auto& a : allocs) if (a.end < 0) live.push_back(&a);
  std::sort(live.begin(), live.end(), [](auto* x, auto* y) { return x->addr < y->addr; });
  for (std::size_t i = 0; i < live.size();) {
    const std::int64_t seg_addr = live[i]->addr;
    json blocks = json::array();
    std::int64_t off = 0;
    const std::size_t n = std::min<std::size_t>(live.size() - i, 1 + static_cast<std::size_t>(uni(rng) * 6));
    for (std::size_t k = 0; k < n; ++k, ++i) {
      const Alloc& a = *live[i];
      blocks.push_back({{"addr", seg_addr + off}, {"size", a.size}, {"state", 1}, {"stack", a.stack}});
      off += a.size;
      const std::int64_t gap = uni(rng) < 0.4 ? (1 + static_cast<std::int64_t>(uni(rng) * 40)) * MiB : 0;
      if (gap) { blocks.push_back({{"addr", seg_addr + off}, {"size", gap}, {"state", uni(rng) < 0.2 ? 2 : 0}, {"stack", -1}}); off += gap; }
    }
    const std::int64_t size = round_up(off, 2 * MiB);
    if (size > off) blocks.push_back({{"addr", seg_addr + off}, {"size", size - off}, {"state", 0}, {"stack", -1}});
    segments.push_back({{"addr", seg_addr}, {"size", size}, {"stream", 7}, {"device", spec.rank % 8}, {"pool", "large"}, {"blocks", blocks}});
  }
  for (int s = 0; s < 24; ++s) {  // the small pool
    const std::int64_t seg_addr = 0x7f9000000000LL + s * 2 * MiB;
    json blocks = json::array();
    std::int64_t off = 0;
    while (off < 2 * MiB) {
      const std::int64_t sz = std::min<std::int64_t>(2 * MiB - off, (1 + static_cast<std::int64_t>(uni(rng) * 256)) * 512);
      const int state = uni(rng) < 0.55 ? 1 : (uni(rng) < 0.2 ? 2 : 0);
      blocks.push_back({{"addr", seg_addr + off}, {"size", sz}, {"state", state}, {"stack", state == 1 ? allocs.back().stack : -1}});
      off += sz;
      if (blocks.size() > 40) { blocks.push_back({{"addr", seg_addr + off}, {"size", 2 * MiB - off}, {"state", 0}, {"stack", -1}}); break; }
    }
    segments.push_back({{"addr", seg_addr}, {"size", 2 * MiB}, {"stream", 7}, {"device", spec.rank % 8}, {"pool", "small"}, {"blocks", blocks}});
  }

  json batches = json::array();
  for (int b = 0; b < static_cast<int>(batch_starts.size()); ++b) batches.push_back({{"batch", spec.batch_end - 2 + b}, {"time_ns", batch_starts[static_cast<std::size_t>(b)]}});
  json ooms = json::array();
  if (oom_time >= 0) ooms.push_back({{"time_ns", oom_time}, {"size", 6 * GiB}, {"device_free", 1 * GiB + 300 * MiB}, {"device", spec.rank % 8}});
  std::int64_t peak_alloc_reserved = 0;
  for (std::size_t i = 0; i < tt.size(); ++i) if (tt[i] == peak_t) peak_alloc_reserved = tr[i];

  const std::string host = spec.hostile ? std::string("node\u2028<svg onload=alert(1)>") : "gpu-node-" + std::to_string(spec.rank / 8);
  json j = {
      {"format_version", 1},
      {"run_name", spec.hostile ? "<img src=x onerror=\"document.body.dataset.pwned='run'\">" : "llama-7b-fsdp"},
      {"rank", spec.rank}, {"world_size", spec.world_size}, {"host", host}, {"device", "NVIDIA H200"}, {"source", "torch"},
      {"batch_start", spec.batch_end - 2}, {"batch_end", spec.batch_end},
      {"status", oom_time >= 0 ? "ok" : "ok"}, {"oom", oom_time >= 0},
      {"stats", {{"peak_allocated", peak}, {"peak_allocated_time_ns", peak_t}, {"peak_reserved", peak_res}, {"live_at_open", live_open},
                 {"live_at_close", live_close}, {"n_events", 2 * static_cast<std::int64_t>(allocs.size()) + 2 * spec.other_allocs}, {"dropped", 0},
                 {"fragmentation_at_peak", peak_alloc_reserved - peak}}},
      {"t0_ns", t0}, {"t1_ns", t1},
      {"batches", batches}, {"ooms", ooms},
      {"frames", frames}, {"stacks", stacks}, {"allocs", A}, {"other", other}, {"totals", totals},
      {"segments", segments}, {"sites", sites_j},
      {"categories", std::vector<std::string>(std::begin(kCategories), std::end(kCategories))},
      {"links", {{"index", "index.html"},
                 {"prev", spec.hostile ? json("javascript:document.body.dataset.pwned='link'") : json("rank" + std::to_string(spec.rank) + "." + std::to_string(spec.batch_end - 3) + ".html")},
                 {"next", nullptr}}},
  };
  return j;
}

json synthetic_cross_page(const CrossPageSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const int N = std::max(1, spec.world_size);
  const int W = std::max(1, spec.windows);
  json ranks = json::array();
  std::vector<double> peak_by_rank(static_cast<std::size_t>(N), 0);
  const double base = 52.0 * GiB;
  for (int r = 0; r < N; ++r) {
    json windows = json::array();
    const bool missing = r == spec.missing_rank;
    for (int w = 0; w < W && !missing; ++w) {
      const int batch = 4 + 3 * w;
      double peak = base * (1 + 0.004 * noise(rng));
      if (r == spec.imbalance_rank) peak *= 1.32;
      if (r == spec.leak_rank) peak += 3.0 * 64 * MiB * w + 64 * MiB;
      if (r == spec.spike_rank && w == W / 2) peak += 9.5 * GiB;
      const bool oom = r == spec.oom_rank && w == W - 1;
      if (oom) peak = 139.0 * GiB * 0.97;
      const double persistent = 18.0 * GiB * (r == spec.imbalance_rank ? 1.32 : 1.0) + (r == spec.leak_rank ? 3.0 * 64 * MiB * (w + 1) : 0);
      const auto ipeak = static_cast<std::int64_t>(peak);
      std::vector<std::uint64_t> levels;
      for (int i = 0; i < 128; ++i) {
        const double x = i / 127.0;
        const double ph = std::fmod(x * 3, 1.0);
        const double shape = ph < 0.35 ? ph / 0.35 : ph < 0.9 ? 1 - (ph - 0.35) / 0.55 * 0.9 : 0.1;
        const double level = persistent + (peak - persistent) * shape * (0.97 + 0.03 * uni(rng));
        levels.push_back(static_cast<std::uint64_t>(level));
      }
      const std::uint64_t level_max = *std::max_element(levels.begin(), levels.end());
      const std::string spark = memsnap::report::spark_levels(levels, level_max);
      const bool trunc = r == spec.truncated_rank && w == W - 1;
      windows.push_back({{"batch", batch}, {"batch_start", batch - 2}, {"peak_allocated", ipeak},
                         {"peak_reserved", static_cast<std::int64_t>(peak * 1.07 / (2 * MiB)) * 2 * MiB},
                         {"live_at_open", static_cast<std::int64_t>(persistent)}, {"live_at_close", static_cast<std::int64_t>(persistent + (r == spec.leak_rank ? 192 * MiB : 0))},
                         {"persistent", static_cast<std::int64_t>(persistent)}, {"oom", oom}, {"status", trunc ? "truncated" : "ok"},
                         {"page", "rank" + std::to_string(r) + "." + std::to_string(batch) + ".html"},
                         {"spark", {{"max", level_max}, {"levels", spark}}}});
      peak_by_rank[static_cast<std::size_t>(r)] = std::max(peak_by_rank[static_cast<std::size_t>(r)], peak);
    }
    const std::string status = missing ? "missing" : r == spec.truncated_rank ? "truncated" : "ok";
    ranks.push_back({{"rank", r}, {"status", status}, {"host", spec.hostile && r == 0 ? "<img src=x onerror=\"document.body.dataset.pwned='host'\">" : "gpu-node-" + std::to_string(r / 8)},
                     {"device", "NVIDIA H200"}, {"windows", windows}});
  }
  std::vector<double> present;
  for (int r = 0; r < N; ++r) if (r != spec.missing_rank) present.push_back(peak_by_rank[static_cast<std::size_t>(r)]);
  std::vector<double> sorted = present;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  const double mx = sorted.empty() ? 0 : sorted.back(), mn = sorted.empty() ? 0 : sorted.front();
  double mean = 0, sd = 0;
  for (double v : present) mean += v;
  mean /= std::max<std::size_t>(1, present.size());
  for (double v : present) sd += (v - mean) * (v - mean);
  sd = std::sqrt(sd / std::max<std::size_t>(1, present.size()));
  json z = json::array(), out = json::array();
  for (int r = 0; r < N; ++r) {
    const double zz = r == spec.missing_rank || sd == 0 ? 0.0 : (peak_by_rank[static_cast<std::size_t>(r)] - mean) / sd;
    z.push_back(std::round(zz * 100) / 100);
    if ((N >= 8 && std::abs(zz) >= 3) || (N < 8 && med > 0 && peak_by_rank[static_cast<std::size_t>(r)] > 1.1 * med)) out.push_back(r);
  }
  json findings = json::array();
  auto finding = [&](const char* kind, int rank, json batch, std::int64_t bytes, json site, const std::string& detail) {
    findings.push_back({{"kind", kind}, {"rank", rank}, {"batch", batch}, {"bytes", bytes}, {"site", site}, {"detail", detail}});
  };
  if (spec.leak_rank >= 0 && spec.leak_rank < N)
    finding("leak", spec.leak_rank, nullptr, 64 * MiB, spec.hostile ? "</script><img src=x onerror=\"document.body.dataset.pwned='finding'\">" : "KVCache.remember → aten::cat (model/cache.py:57)",
            "live memory at window close grows by 64 MiB every batch over " + std::to_string(W) + " windows; the others stay flat");
  if (spec.imbalance_rank >= 0 && spec.imbalance_rank < N)
    finding("shard_imbalance", spec.imbalance_rank, nullptr, static_cast<std::int64_t>(peak_by_rank[static_cast<std::size_t>(spec.imbalance_rank)] - med), "FlatParamHandle.init → aten::empty",
            "parameter and optimizer shards are 1.32× the median rank's; check the FSDP wrap policy");
  if (spec.spike_rank >= 0 && spec.spike_rank < N)
    finding("spike", spec.spike_rank, 4 + 3 * (W / 2), static_cast<std::int64_t>(9.5 * GiB), "Attention.forward → aten::_scaled_dot_product_flash_attention", "one batch peaks 9.5 GiB above this rank's other batches");
  if (spec.oom_rank >= 0 && spec.oom_rank < N)
    finding("oom", spec.oom_rank, 4 + 3 * (W - 1), 6 * GiB, nullptr, "cudaMalloc of 6 GiB failed with 1.3 GiB free on the device");
  if (spec.missing_rank >= 0 && spec.missing_rank < N) finding("missing", spec.missing_rank, nullptr, 0, nullptr, "no spill file found for this rank");
  if (spec.truncated_rank >= 0 && spec.truncated_rank < N)
    finding("truncated", spec.truncated_rank, 4 + 3 * (W - 1), 0, nullptr, "the spill file ends mid-record (process killed?); the readable prefix is shown");

  static const char* kSites[] = {"FlatParamHandle.init → aten::empty", "AdamW.step → aten::zeros_like (exp_avg)", "AdamW.step → aten::zeros_like (exp_avg_sq)",
                                 "FullyShardedDataParallel.pre_forward → c10d::_allgather_base_", "Attention.forward → aten::mm", "MLP.forward → aten::gelu",
                                 "FullyShardedDataParallel.post_backward → c10d::reduce_scatter_tensor", "KVCache.remember → aten::cat", "LayerNorm.forward → aten::native_layer_norm",
                                 "Attention.forward → aten::_scaled_dot_product_flash_attention"};
  static const char* kSiteCat[] = {"parameters", "optimizer_state", "optimizer_state", "all_gather", "activations", "activations", "gradients", "activations", "activations", "activations"};
  json diffs = json::array();
  for (int s = 0; s < spec.n_site_diffs; ++s) {
    const int kind = s % 10;
    json by_rank = json::array();
    std::int64_t mxv = -1, mnv = -1;
    int mxr = 0, mnr = 0;
    const double scale = (3.0 + 40.0 / (1 + s)) * GiB / 10;
    for (int r = 0; r < N; ++r) {
      double v = r == spec.missing_rank ? 0 : scale * (1 + 0.02 * noise(rng));
      if (r == spec.imbalance_rank && kind < 3) v *= 1.32;
      if (r == spec.leak_rank && kind == 7) v += 192 * MiB;
      if (r == spec.spike_rank && kind == 9) v += 9.5 * GiB;
      const auto iv = static_cast<std::int64_t>(std::max(0.0, v));
      by_rank.push_back(iv);
      if (mxv < 0 || iv > mxv) { mxv = iv; mxr = r; }
      if (mnv < 0 || iv < mnv) { mnv = iv; mnr = r; }
    }
    std::string site = kSites[kind];
    if (s >= 10) site += " #" + std::to_string(s / 10);
    json stack = json::array({{{"name", "c10::cuda::CUDACachingAllocator::malloc"}, {"file", "c10/cuda/CUDACachingAllocator.cpp"}, {"line", 1187}},
                              {{"name", site.substr(site.find("→ ") + 4)}, {"file", "torch/_ops.py"}, {"line", 716}},
                              {{"name", site.substr(0, site.find(" →"))}, {"file", "model/transformer.py"}, {"line", 120 + s}},
                              {{"name", "train_step"}, {"file", "train.py"}, {"line", 88}}});
    if (spec.hostile && s == 0) stack[1]["name"] = "</script><script>document.body.dataset.pwned='diff'</script>";
    diffs.push_back({{"site", site}, {"stack", stack}, {"bytes_by_rank", by_rank}, {"max_rank", mxr}, {"min_rank", mnr}, {"delta", mxv - mnv}, {"category", kSiteCat[kind]}});
  }
  std::sort(diffs.begin(), diffs.end(), [](const json& a, const json& b) { return a["delta"].get<std::int64_t>() > b["delta"].get<std::int64_t>(); });

  json cat_rows = json::array();
  for (int r = 0; r < N; ++r) {
    const double p = r == spec.missing_rank ? 0 : peak_by_rank[static_cast<std::size_t>(r)];
    const double im = r == spec.imbalance_rank ? 1.32 : 1.0;
    const std::int64_t params = static_cast<std::int64_t>(6.0 * GiB * im), grads = params, optim = 2 * params;
    const std::int64_t gather = static_cast<std::int64_t>(p > 0 ? 7.5 * GiB : 0);
    const std::int64_t rest = static_cast<std::int64_t>(std::max(0.0, p - static_cast<double>(params + grads + optim + gather)));
    cat_rows.push_back(p > 0 ? json::array({params, grads, optim, gather, rest * 9 / 10, rest / 10}) : json::array({0, 0, 0, 0, 0, 0}));
  }
  return {
      {"format_version", 1}, {"run_name", spec.hostile ? "<img src=x onerror=\"document.body.dataset.pwned='run'\">" : "llama-7b-fsdp"},
      {"world_size", N}, {"created", "2024-12-02T14:05:00Z"}, {"ranks", ranks},
      {"imbalance", {{"metric", "peak_allocated"}, {"max", static_cast<std::int64_t>(mx)}, {"median", static_cast<std::int64_t>(med)},
                     {"max_over_median", med > 0 ? std::round(mx / med * 1000) / 1000 : 0.0}, {"spread", static_cast<std::int64_t>(mx - mn)},
                     {"outlier_ranks", out}, {"zscores", z}}},
      {"findings", findings}, {"site_diffs", diffs},
      {"categories", {{"names", std::vector<std::string>(std::begin(kCategories), std::end(kCategories))}, {"bytes_by_rank", cat_rows}}},
  };
}

}  // namespace memsnap::test
