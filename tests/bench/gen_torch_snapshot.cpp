// gen_torch_snapshot: writes a synthetic PyTorch memory snapshot pickle of the shape
// torch.cuda.memory._dump_snapshot writes (torch 2.11), for tests/bench/bench_import.sh.
//
//   gen_torch_snapshot OUT.pickle [--entries N] [--frames-per-entry F] [--shared-frames |
//       --torch-frames | --separate-frames] [--separate-strings] [--devices D] [--segments S] [--seed X]
//       [--leak-bytes B] [--no-frame-opcodes]
//
// The pickle is written opcode by opcode as it is generated (protocol 4, FRAMEs of ~64 KiB,
// MEMOIZE after every str/list/dict, BINGET/LONG_BINGET for what is shared, MARK/APPENDS and
// MARK/SETITEMS in batches of 1000 as Python's pickler writes them); memory stays bounded by
// the stack pool and the per-step layout, whatever N is.
//
// The workload is a training loop repeated step after step on every device, with addresses laid
// out once in the working segments (the caching allocator hands the same blocks back every
// step): forward allocates 64 activations, backward allocates a gradient per activation and
// frees the activation, the optimizer step (annotated Optimizer.step#AdamW.step, as torch.optim
// does) allocates and frees 32 temporaries, zero_grad frees the gradients. Weights (no frames:
// allocated before recording) and AdamW state (with frames) sit in persistent segments that
// predate the trace; one allocation a step (--leak-bytes, at train.py's append_history) is kept
// in a segment of its own, so the trace holds a leak to find. The last working segment is
// reserved during the first step (segment_alloc). The dump comes at the end of a step, so the
// segments' blocks are what the replay of the trace leaves.
//
// --shared-frames (default): a pool of distinct stacks; each frames list and each frame dict is
// written once and referenced after. --torch-frames: what torch 2.11 writes (measured on
// tests/data/torch-loops): every alloc and free_requested has a frames list of its own, the
// frame dicts in them are shared. --separate-frames: every entry has its own frames list and
// frame dicts. In all three free_completed shares free_requested's list, as torch's do; strings
// are memo-shared as Python interns them, unless --separate-strings writes every name and
// filename anew. Bytes per entry with 16 frames: about 80 shared, 270 separate, 880 separate
// with separate strings.
#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::size_t kFrameTarget = 64 * 1024;  // Python's _FRAME_SIZE_TARGET
constexpr std::size_t kBatch = 1000;             // items per APPENDS/SETITEMS, as Python writes them
constexpr std::uint64_t kSegmentRound = 2ULL << 20;
constexpr int kActivations = 64;
constexpr int kTemporaries = 32;
constexpr std::uint64_t kEntriesPerStep = kActivations * 6 + kTemporaries * 3;  // + 1 with a leak

struct Options {
  std::string out;
  std::uint64_t entries = 100000;
  int frames = 16;
  bool share_lists = true;  // a stack's frames list written once, referenced after
  bool share_dicts = true;  // a frame's dict written once, referenced after
  bool separate_strings = false;
  int devices = 1;
  int segments = 8;
  std::uint64_t seed = 1;
  std::uint64_t leak_bytes = 4096;
  bool frame_opcodes = true;
};

/// Protocol-4 opcodes to a file, grouped into FRAMEs that end only between opcodes. Every memo
/// slot it hands out is the one Python's unpickler assigns (MEMOIZE takes the next index).
class PickleStream {
 public:
  PickleStream(std::FILE* out, bool frames) : m_out(out), m_frames(frames) {
    m_frame.reserve(2 * kFrameTarget);
    std::fputc(0x80, m_out);  // PROTO 4, outside any frame as Python writes it
    std::fputc(4, m_out);
  }
  ~PickleStream() = default;
  PickleStream(const PickleStream&) = delete;
  PickleStream& operator=(const PickleStream&) = delete;

  /// STOP and the last frame. False when the file could not be written.
  bool finish() {
    op('.');
    commit();
    return std::fflush(m_out) == 0 && std::ferror(m_out) == 0;
  }
  std::uint64_t bytes() const { return m_written + m_frame.size(); }

  void op(char code) {
    if (m_frame.size() >= kFrameTarget) commit();
    m_frame += code;
  }
  std::uint32_t memoize() {
    op('\x94');
    return m_memo++;
  }
  void get(std::uint32_t index) {
    if (index < 256) {
      op('h');  // BINGET
      m_frame += static_cast<char>(index);
    } else {
      op('j');  // LONG_BINGET
      le(index, 4);
    }
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v <= 0xff) {
      op('K');
      le(static_cast<std::uint64_t>(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      op('M');
      le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<std::uint64_t>(v), 4);
    } else {
      // LONG1: the fewest little-endian two's-complement bytes that keep the sign.
      int n = 1;
      while (n < 8 && !((v >> (8 * n - 1)) == 0 || (v >> (8 * n - 1)) == -1)) ++n;
      op('\x8a');
      m_frame += static_cast<char>(n);
      le(static_cast<std::uint64_t>(v), n);
    }
  }
  /// A str written anew and memoised (its memo index returned), as Python writes a str object.
  std::uint32_t str(std::string_view s) {
    if (s.size() < 256) {
      op('\x8c');  // SHORT_BINUNICODE
      m_frame += static_cast<char>(s.size());
    } else {
      op('X');  // BINUNICODE
      le(s.size(), 4);
    }
    m_frame.append(s);
    return memoize();
  }
  /// An interned str: written the first time, referenced after.
  void interned(const std::string& s) {
    auto [it, fresh] = m_interned.try_emplace(s, 0);
    if (fresh) {
      it->second = str(s);
    } else {
      get(it->second);
    }
  }
  void boolean(bool b) { op(b ? '\x88' : '\x89'); }

 private:
  std::FILE* m_out;
  bool m_frames;
  std::string m_frame;
  std::uint64_t m_written = 2;  // PROTO
  std::uint32_t m_memo = 0;
  std::unordered_map<std::string, std::uint32_t> m_interned;

  void le(std::uint64_t v, int width) {
    for (int i = 0; i < width; ++i) m_frame += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void commit() {
    if (m_frames && m_frame.size() >= 4) {
      char head[9] = {'\x95'};
      for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<char>((m_frame.size() >> (8 * i)) & 0xff);
      std::fwrite(head, 1, sizeof head, m_out);
      m_written += sizeof head;
    }
    std::fwrite(m_frame.data(), 1, m_frame.size(), m_out);
    m_written += m_frame.size();
    m_frame.clear();
  }
};

/// The items of one list of known length, batched as Python's pickler does: MARK items APPENDS
/// per 1000, a lone last item with APPEND and no MARK.
class Batches {
 public:
  Batches(PickleStream& p, std::uint64_t total) : m_p(p), m_total(total) {}
  void before() {
    if (m_done % kBatch == 0 && batch_size() > 1) m_p.op('(');
  }
  void after() {
    ++m_done;
    if (m_done % kBatch == 0 || m_done == m_total) {
      const std::uint64_t n = (m_done - 1) % kBatch + 1;
      m_p.op(n > 1 ? 'e' : 'a');  // APPENDS, APPEND
    }
  }

 private:
  PickleStream& m_p;
  std::uint64_t m_total, m_done = 0;
  std::uint64_t batch_size() const { return std::min<std::uint64_t>(kBatch, m_total - m_done); }
};

struct Frame {
  std::string name, filename;
  int line = 0;
};

/// The frames and stacks every entry draws from: distinct stacks, frames shared between them.
struct StackPool {
  std::vector<Frame> frames;
  std::vector<std::vector<std::uint32_t>> stacks;  // frame ids, innermost first
  std::map<std::tuple<std::string, std::string, int>, std::uint32_t> ids;

  std::uint32_t frame(const std::string& name, const std::string& file, int line) {
    auto [it, fresh] = ids.try_emplace({name, file, line}, static_cast<std::uint32_t>(frames.size()));
    if (fresh) frames.push_back({name, file, line});
    return it->second;
  }
  /// A stack of exactly `depth` frames, innermost first: `inner`, then (`model`) the module
  /// nesting of a forward pass, the loop's train_step, a trainer's call chain to fill, main and
  /// <module>. Returns its id.
  std::uint32_t add(const std::vector<std::uint32_t>& inner, int depth, int site_line, bool model) {
    const std::string torch = "/opt/conda/lib/python3.12/site-packages/torch/";
    const std::vector<std::uint32_t> tail = {frame("main", "/workspace/train.py", 231),
                                             frame("<module>", "/workspace/train.py", 260)};
    const auto room = [&](const std::vector<std::uint32_t>& s, std::size_t more) {
      return static_cast<int>(s.size() + more + tail.size()) < depth;
    };
    std::vector<std::uint32_t> s = inner;
    bool has_step = false;
    for (std::uint32_t f : inner) has_step |= frames[f].name == "train_step";
    for (int level = 0; model && room(s, has_step ? 0 : 1); ++level) {
      const std::uint32_t nest[3] = {frame("forward", "/workspace/model.py", 40 + 13 * level + site_line % 11),
                                     frame("_call_impl", torch + "nn/modules/module.py", 1786),
                                     frame("_wrapped_call_impl", torch + "nn/modules/module.py", 1775)};
      for (std::uint32_t f : nest)
        if (room(s, has_step ? 0 : 1)) s.push_back(f);
    }
    if (!has_step) s.push_back(frame("train_step", "/workspace/train.py", 120 + site_line % 7));
    for (int level = 0; room(s, 0); ++level) s.push_back(frame("_run_stage", "/workspace/trainer.py", 300 + 10 * level));
    for (std::uint32_t f : tail) s.push_back(f);
    s.resize(static_cast<std::size_t>(std::max(depth, 0)));
    stacks.push_back(std::move(s));
    return static_cast<std::uint32_t>(stacks.size() - 1);
  }
};

struct Alloc {
  std::uint64_t addr = 0, size = 0;
  std::uint32_t stack = 0;
};

struct Block {
  std::uint64_t addr = 0, size = 0;
  bool active = false;
  int stack = -1;  // -1: no frames
};

struct Segment {
  std::uint64_t addr = 0, size = 0;
  std::vector<Block> blocks;
  int stack = -1;
  bool reserved_in_trace = false;
};

/// One device's plan: segments, the per-step layout and the stacks of each site.
struct DevicePlan {
  std::vector<Segment> segments;
  std::vector<Alloc> activations, gradients, temporaries;
  std::uint32_t bwd_free_stack = 0, zero_grad_stack = 0, leak_stack = 0;
  std::uint64_t leak_base = 0;
  int reserved_segment = -1;  // index into segments, or -1
};

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

class Generator {
 public:
  explicit Generator(const Options& o) : m_o(o), m_rng(o.seed) {}

  int run() {
    const std::uint64_t per_step = kEntriesPerStep + (m_o.leak_bytes > 0 ? 1 : 0);
    m_steps = std::max<std::uint64_t>(1, (m_o.entries + per_step * m_o.devices / 2) / (per_step * m_o.devices));
    make_stacks();
    for (int d = 0; d < m_o.devices; ++d) m_plans.push_back(plan_device(d));

    std::FILE* f = std::fopen(m_o.out.c_str(), "wb");
    if (f == nullptr) {
      std::cerr << "gen_torch_snapshot: " << m_o.out << ": cannot write it: " << std::strerror(errno) << "\n";
      return 1;
    }
    std::vector<char> buffer(1 << 20);
    std::setvbuf(f, buffer.data(), _IOFBF, buffer.size());
    PickleStream p(f, m_o.frame_opcodes);
    m_p = &p;
    std::uint64_t entries = 0;
    p.op('}');
    p.memoize();
    p.op('(');
    p.interned("segments");
    write_segments();
    p.interned("device_traces");
    p.op(']');
    p.memoize();
    Batches traces(p, static_cast<std::uint64_t>(m_o.devices));
    for (int d = 0; d < m_o.devices; ++d) {
      traces.before();
      entries += write_trace(d);
      traces.after();
    }
    p.interned("allocator_settings");
    write_allocator_settings();
    p.interned("external_annotations");
    write_annotations();
    p.op('u');
    const bool ok = p.finish();
    const std::uint64_t bytes = p.bytes();
    m_p = nullptr;
    if (std::fclose(f) != 0 || !ok) {
      std::cerr << "gen_torch_snapshot: " << m_o.out << ": cannot write it: " << std::strerror(errno) << "\n";
      return 1;
    }
    std::cerr << "gen_torch_snapshot: " << m_o.out << ": " << entries << " trace entries (" << m_steps
              << " steps x " << m_o.devices << " device" << (m_o.devices == 1 ? "" : "s") << "), "
              << m_pool.stacks.size() << " distinct stacks of " << m_o.frames << " frames, "
              << (m_o.share_lists ? "shared" : m_o.share_dicts ? "torch's" : "separate") << " frames, " << bytes
              << " bytes\n";
    return 0;
  }

 private:
  Options m_o;
  std::mt19937_64 m_rng;
  std::uint64_t m_steps = 0;
  StackPool m_pool;
  std::vector<DevicePlan> m_plans;
  PickleStream* m_p = nullptr;
  std::vector<std::uint32_t> m_stack_memo, m_frame_memo;  // memo index + 1 once written (shared mode)
  // Per site: the stacks of forward activations, backward gradients, optimizer temporaries, state.
  std::vector<std::uint32_t> m_fwd, m_bwd, m_opt, m_state;
  std::uint32_t m_bwd_free = 0, m_zero_grad = 0, m_leak = 0;
  struct Annotation {
    bool start;
    int device;
    std::int64_t time;
  };
  std::vector<Annotation> m_annotations;

  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(m_rng);
  }
  /// Log-uniform between 2^lo and 2^hi bytes, a multiple of 512 as the caching allocator rounds.
  std::uint64_t size_between(int lo, int hi) {
    const double e = std::uniform_real_distribution<double>(lo, hi)(m_rng);
    return round_up(static_cast<std::uint64_t>(std::exp2(e)), 512);
  }

  void make_stacks() {
    const std::string torch = "/opt/conda/lib/python3.12/site-packages/torch/";
    const int depth = m_o.frames;
    struct Op {
      const char *name, *file;
      int line;
    };
    const Op fwd_ops[] = {{"linear", "nn/modules/linear.py", 125},     {"gelu", "nn/functional.py", 1885},
                          {"layer_norm", "nn/functional.py", 2910},    {"dropout", "nn/functional.py", 1422},
                          {"scaled_dot_product_attention", "nn/functional.py", 5612},
                          {"softmax", "nn/functional.py", 2140},       {"embedding", "nn/functional.py", 2567},
                          {"cross_entropy", "nn/functional.py", 3494}};
    auto op_frame = [&](const Op& op) { return m_pool.frame(op.name, torch + op.file, op.line); };
    for (int i = 0; i < kActivations; ++i) {
      m_fwd.push_back(m_pool.add({op_frame(fwd_ops[i % 8])}, depth, i, true));
      m_bwd.push_back(m_pool.add({m_pool.frame("_engine_run_backward", torch + "autograd/graph.py", 829),
                                  m_pool.frame("backward", torch + "autograd/__init__.py", 354),
                                  m_pool.frame("backward", torch + "_tensor.py", 647),
                                  m_pool.frame("train_step", "/workspace/train.py", 140 + i)},
                                 depth, i, false));
    }
    for (int i = 0; i < kTemporaries; ++i) {
      m_opt.push_back(m_pool.add({m_pool.frame("_multi_tensor_adamw", torch + "optim/adamw.py", 560 + i),
                                  m_pool.frame("adamw", torch + "optim/adamw.py", 380),
                                  m_pool.frame("step", torch + "optim/adamw.py", 226),
                                  m_pool.frame("wrapper", torch + "optim/optimizer.py", 485),
                                  m_pool.frame("train_step", "/workspace/train.py", 150)},
                                 depth, i, false));
    }
    for (int i = 0; i < 2; ++i) {
      m_state.push_back(m_pool.add({m_pool.frame("_init_group", torch + "optim/adamw.py", 176 + i),
                                    m_pool.frame("step", torch + "optim/adamw.py", 220),
                                    m_pool.frame("wrapper", torch + "optim/optimizer.py", 485),
                                    m_pool.frame("train_step", "/workspace/train.py", 150)},
                                   depth, 0, false));
    }
    m_bwd_free = m_pool.add({m_pool.frame("_engine_run_backward", torch + "autograd/graph.py", 829),
                             m_pool.frame("backward", torch + "_tensor.py", 647)},
                            depth, 3, false);
    m_zero_grad = m_pool.add({m_pool.frame("zero_grad", torch + "optim/optimizer.py", 1010),
                              m_pool.frame("train_step", "/workspace/train.py", 131)},
                             depth, 5, false);
    m_leak = m_pool.add({m_pool.frame("append_history", "/workspace/train.py", 88),
                         m_pool.frame("train_step", "/workspace/train.py", 155)},
                        depth, 6, false);
    m_stack_memo.assign(m_pool.stacks.size(), 0);
    m_frame_memo.assign(m_pool.frames.size(), 0);
  }

  DevicePlan plan_device(int d) {
    DevicePlan plan;
    const int leak_segments = m_o.leak_bytes > 0 ? 1 : 0;
    const int persistent = std::max(1, m_o.segments / 4);
    const int working = std::max(1, m_o.segments - persistent - leak_segments);
    std::uint64_t next = 0x7f0000000000ULL + (static_cast<std::uint64_t>(d) << 40);
    auto segment = [&](std::uint64_t size) {
      Segment s;
      s.addr = next;
      s.size = size;
      next += round_up(size, 1ULL << 30) + (1ULL << 30);  // gaps, as cudaMalloc leaves
      return s;
    };

    // Persistent: weights (before recording: no frames) and AdamW's two states a weight (frames).
    std::vector<Block> persistent_blocks;
    for (int i = 0; i < kActivations; ++i) {
      const std::uint64_t w = size_between(16, 24);
      persistent_blocks.push_back({0, w, true, -1});
      for (int k = 0; k < 2; ++k) persistent_blocks.push_back({0, w, true, static_cast<int>(m_state[k])});
    }
    const std::size_t per_segment = (persistent_blocks.size() + persistent - 1) / persistent;
    for (int s = 0; s < persistent; ++s) {
      std::uint64_t used = 0;
      std::vector<Block> blocks;
      for (std::size_t i = s * per_segment; i < std::min(persistent_blocks.size(), (s + 1) * per_segment); ++i) {
        blocks.push_back(persistent_blocks[i]);
        used += persistent_blocks[i].size;
      }
      Segment seg = segment(round_up(std::max<std::uint64_t>(used, 1), kSegmentRound));
      std::uint64_t at = seg.addr;
      for (auto& b : blocks) {
        b.addr = at;
        at += b.size;
      }
      if (at < seg.addr + seg.size) blocks.push_back({at, seg.addr + seg.size - at, false, -1});
      seg.blocks = std::move(blocks);
      plan.segments.push_back(std::move(seg));
    }

    // The step's layout, the same every step: activations, then gradients, then temporaries.
    for (int i = 0; i < kActivations; ++i) plan.activations.push_back({0, size_between(18, 24), m_fwd[i]});
    for (int i = 0; i < kActivations; ++i) plan.gradients.push_back({0, persistent_blocks[3 * i].size, m_bwd[i]});
    for (int i = 0; i < kTemporaries; ++i) plan.temporaries.push_back({0, size_between(16, 22), m_opt[i]});
    std::uint64_t total = 0, largest = 0;
    for (auto* list : {&plan.activations, &plan.gradients, &plan.temporaries})
      for (const auto& a : *list) {
        total += a.size;
        largest = std::max(largest, a.size);
      }
    const std::uint64_t working_size = round_up(std::max(total / working + total / 4, largest), kSegmentRound);
    const std::size_t first_working = plan.segments.size();
    for (int s = 0; s < working; ++s) {
      Segment seg = segment(working_size);
      seg.blocks.push_back({seg.addr, seg.size, false, -1});
      plan.segments.push_back(std::move(seg));
    }
    std::size_t at_segment = first_working;
    std::uint64_t at = plan.segments[at_segment].addr;
    for (auto* list : {&plan.activations, &plan.gradients, &plan.temporaries})
      for (auto& a : *list) {
        if (at + a.size > plan.segments[at_segment].addr + working_size) {
          ++at_segment;  // total/4 of slack per segment keeps this inside the working segments
          at = plan.segments[at_segment].addr;
        }
        a.addr = at;
        at += a.size;
      }
    if (working > 1) {
      // Reserved in the first step, by the first allocation that lands in it (in the trace's
      // order: activations, gradients from the last, temporaries), whose frames it keeps.
      Segment& last = plan.segments.back();
      std::vector<const Alloc*> order;
      for (const auto& a : plan.activations) order.push_back(&a);
      for (auto it = plan.gradients.rbegin(); it != plan.gradients.rend(); ++it) order.push_back(&*it);
      for (const auto& a : plan.temporaries) order.push_back(&a);
      for (const Alloc* a : order) {
        if (a->addr >= last.addr && a->addr < last.addr + last.size) {
          last.reserved_in_trace = true;
          last.stack = static_cast<int>(a->stack);
          plan.reserved_segment = static_cast<int>(plan.segments.size() - 1);
          break;
        }
      }
    }

    if (leak_segments > 0) {
      Segment seg = segment(round_up(m_steps * m_o.leak_bytes, kSegmentRound));
      plan.leak_base = seg.addr;
      for (std::uint64_t i = 0; i < m_steps; ++i)
        seg.blocks.push_back({seg.addr + i * m_o.leak_bytes, m_o.leak_bytes, true, static_cast<int>(m_leak)});
      const std::uint64_t end = seg.addr + m_steps * m_o.leak_bytes;
      if (end < seg.addr + seg.size) seg.blocks.push_back({end, seg.addr + seg.size - end, false, -1});
      plan.segments.push_back(std::move(seg));
    }
    plan.bwd_free_stack = m_bwd_free;
    plan.zero_grad_stack = m_zero_grad;
    plan.leak_stack = m_leak;
    return plan;
  }

  /// A frame dict: memo-shared in shared mode, else written anew.
  void write_frame(std::uint32_t id) {
    PickleStream& p = *m_p;
    if (m_o.share_dicts && m_frame_memo[id] != 0) {
      p.get(m_frame_memo[id] - 1);
      return;
    }
    const Frame& f = m_pool.frames[id];
    p.op('}');
    const std::uint32_t memo = p.memoize();
    p.op('(');
    p.interned("name");
    m_o.separate_strings ? static_cast<void>(p.str(f.name)) : p.interned(f.name);
    p.interned("filename");
    m_o.separate_strings ? static_cast<void>(p.str(f.filename)) : p.interned(f.filename);
    p.interned("line");
    p.integer(f.line);
    p.op('u');
    if (m_o.share_dicts) m_frame_memo[id] = memo + 1;
  }

  /// A frames list (stack -1: the empty list); returns its memo index.
  std::uint32_t write_frames(int stack) {
    PickleStream& p = *m_p;
    if (stack < 0) {
      p.op(']');
      return p.memoize();
    }
    if (m_o.share_lists && m_stack_memo[stack] != 0) {
      p.get(m_stack_memo[stack] - 1);
      return m_stack_memo[stack] - 1;
    }
    const auto& frames = m_pool.stacks[stack];
    p.op(']');
    const std::uint32_t memo = p.memoize();
    Batches items(p, frames.size());
    for (std::uint32_t f : frames) {
      items.before();
      write_frame(f);
      items.after();
    }
    if (m_o.share_lists) m_stack_memo[stack] = memo + 1;
    return memo;
  }

  void write_segments() {
    PickleStream& p = *m_p;
    std::uint64_t count = 0;
    for (const auto& plan : m_plans) count += plan.segments.size();
    p.op(']');
    p.memoize();
    Batches segments(p, count);
    for (int d = 0; d < m_o.devices; ++d) {
      for (const Segment& s : m_plans[d].segments) {
        std::uint64_t allocated = 0;
        for (const Block& b : s.blocks) allocated += b.active ? b.size : 0;
        segments.before();
        p.op('}');
        p.memoize();
        p.op('(');
        p.interned("device");
        p.integer(d);
        p.interned("address");
        p.integer(static_cast<std::int64_t>(s.addr));
        p.interned("total_size");
        p.integer(static_cast<std::int64_t>(s.size));
        for (const char* key : {"allocated_size", "active_size", "requested_size"}) {
          p.interned(key);
          p.integer(static_cast<std::int64_t>(allocated));
        }
        p.interned("stream");
        p.integer(0);
        p.interned("segment_type");
        p.interned("large");
        p.interned("segment_pool_id");
        p.integer(0);
        p.integer(0);
        p.op('\x86');  // TUPLE2
        p.memoize();
        p.interned("is_expandable");
        p.boolean(false);
        p.interned("frames");
        write_frames(s.stack);
        p.interned("blocks");
        p.op(']');
        p.memoize();
        Batches blocks(p, s.blocks.size());
        for (const Block& b : s.blocks) {
          blocks.before();
          p.op('}');
          p.memoize();
          p.op('(');
          p.interned("address");
          p.integer(static_cast<std::int64_t>(b.addr));
          p.interned("size");
          p.integer(static_cast<std::int64_t>(b.size));
          p.interned("requested_size");
          p.integer(b.active ? static_cast<std::int64_t>(b.size) : 0);
          p.interned("state");
          p.interned(b.active ? "active_allocated" : "inactive");
          p.interned("frames");
          write_frames(b.stack);
          p.op('u');
          blocks.after();
        }
        p.op('u');
        segments.after();
      }
    }
  }

  /// One trace entry; frames_memo >= 0 references a list already written (free_completed shares
  /// free_requested's). Returns the memo index of its frames list.
  std::uint32_t write_entry(const char* action, std::uint64_t addr, std::uint64_t size, std::int64_t time,
                            std::uint32_t stack, std::int64_t frames_memo = -1) {
    PickleStream& p = *m_p;
    p.op('}');
    p.memoize();
    p.op('(');
    p.interned("action");
    p.interned(action);
    p.interned("addr");
    p.integer(static_cast<std::int64_t>(addr));
    p.interned("size");
    p.integer(static_cast<std::int64_t>(size));
    p.interned("stream");
    p.integer(0);
    p.interned("time_us");
    p.integer(time);
    p.interned("compile_context");
    p.str("N/A");  // a new str object per entry in torch's dump
    p.interned("user_metadata");
    p.interned("");
    p.interned("frames");
    std::uint32_t memo;
    if (frames_memo >= 0) {
      memo = static_cast<std::uint32_t>(frames_memo);
      p.get(memo);
    } else {
      memo = write_frames(static_cast<int>(stack));
    }
    p.op('u');
    return memo;
  }

  std::uint64_t write_trace(int d) {
    PickleStream& p = *m_p;
    const DevicePlan& plan = m_plans[d];
    const std::uint64_t per_step = kEntriesPerStep + (m_o.leak_bytes > 0 ? 1 : 0);
    const std::uint64_t total = m_steps * per_step + (plan.reserved_segment >= 0 ? 1 : 0);
    std::int64_t t = 1796486051034001LL + 17 * d;
    std::uint64_t written = 0;
    bool reserved = plan.reserved_segment < 0;
    const Segment* last = plan.reserved_segment >= 0 ? &plan.segments[plan.reserved_segment] : nullptr;
    Batches items(p, total);
    auto entry = [&](const char* action, std::uint64_t addr, std::uint64_t size, std::uint32_t stack,
                     std::int64_t frames_memo = -1) {
      t += static_cast<std::int64_t>(uniform(1, 40));
      items.before();
      const std::uint32_t memo = write_entry(action, addr, size, t, stack, frames_memo);
      items.after();
      ++written;
      return memo;
    };
    auto alloc = [&](const Alloc& a) {
      if (!reserved && a.addr >= last->addr && a.addr < last->addr + last->size) {
        entry("segment_alloc", last->addr, last->size, a.stack);
        reserved = true;
      }
      entry("alloc", a.addr, a.size, a.stack);
    };
    auto free = [&](const Alloc& a, std::uint32_t stack) {
      const std::uint32_t memo = entry("free_requested", a.addr, a.size, stack);
      entry("free_completed", a.addr, a.size, stack, memo);
    };
    p.op(']');
    p.memoize();
    for (std::uint64_t step = 0; step < m_steps; ++step) {
      for (const Alloc& a : plan.activations) alloc(a);
      if (m_o.leak_bytes > 0) entry("alloc", plan.leak_base + step * m_o.leak_bytes, m_o.leak_bytes, plan.leak_stack);
      for (int i = kActivations - 1; i >= 0; --i) {
        alloc(plan.gradients[i]);
        free(plan.activations[i], plan.bwd_free_stack);
      }
      m_annotations.push_back({true, d, t + 1});
      for (const Alloc& a : plan.temporaries) {
        alloc(a);
        free(a, a.stack);
      }
      m_annotations.push_back({false, d, t + 1});
      for (const Alloc& g : plan.gradients) free(g, plan.zero_grad_stack);
    }
    if (written != total) {
      std::cerr << "gen_torch_snapshot: internal error: " << written << " entries, planned " << total << "\n";
      std::abort();
    }
    return written;
  }

  void write_allocator_settings() {
    PickleStream& p = *m_p;
    p.op('}');
    p.memoize();
    p.op('(');
    p.interned("PYTORCH_CUDA_ALLOC_CONF");
    p.interned("");
    p.interned("max_split_size");
    p.integer(-1);
    p.interned("garbage_collection_threshold");
    p.op('G');  // BINFLOAT 0.0
    for (int i = 0; i < 8; ++i) p.op('\0');
    for (const char* key : {"expandable_segments", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                            "graph_capture_record_stream_reuse"}) {
      p.interned(key);
      p.boolean(false);
    }
    p.interned("pinned_num_register_threads");
    p.integer(1);
    p.interned("roundup_power2_divisions");
    p.op('}');
    p.memoize();
    p.op('(');
    for (int i = 1; i <= 32768; i *= 2) {
      p.str(std::to_string(i));
      p.integer(0);
    }
    p.op('u');
    p.op('u');
  }

  void write_annotations() {
    PickleStream& p = *m_p;
    p.op(']');
    p.memoize();
    Batches items(p, m_annotations.size());
    for (const Annotation& a : m_annotations) {
      items.before();
      p.op('}');
      p.memoize();
      p.op('(');
      p.interned("stage");
      p.interned(a.start ? "START" : "END");
      p.interned("name");
      p.interned("Optimizer.step#AdamW.step");
      p.interned("device");
      p.integer(a.device);
      p.interned("time_us");
      p.integer(a.time);
      p.op('u');
      items.after();
    }
  }
};

[[noreturn]] void usage(const char* why) {
  std::cerr << "gen_torch_snapshot: " << why
            << "\nusage: gen_torch_snapshot OUT.pickle [--entries N] [--frames-per-entry F] [--shared-frames | "
               "--torch-frames | --separate-frames] [--separate-strings] [--devices D] [--segments S] [--seed X] [--leak-bytes B] "
               "[--no-frame-opcodes]\n";
  std::exit(2);
}

std::uint64_t number(int& i, int argc, char** argv, std::uint64_t lo, std::uint64_t hi) {
  if (i + 1 >= argc) usage((std::string(argv[i]) + " needs a value").c_str());
  char* end = nullptr;
  const std::string text = argv[++i];
  double v = std::strtod(text.c_str(), &end);  // 3e6 and 1000000 alike
  if (end != nullptr && (*end == 'k' || *end == 'K')) v *= 1e3, ++end;
  else if (end != nullptr && (*end == 'm' || *end == 'M')) v *= 1e6, ++end;
  if (text.empty() || end == nullptr || *end != '\0' || v < static_cast<double>(lo) || v > static_cast<double>(hi)) {
    usage((std::string(argv[i - 1]) + ": '" + text + "' is not a number from " + std::to_string(lo) + " to " +
           std::to_string(hi))
              .c_str());
  }
  return static_cast<std::uint64_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--entries") o.entries = number(i, argc, argv, 1, 1ULL << 36);
    else if (a == "--frames-per-entry") o.frames = static_cast<int>(number(i, argc, argv, 0, 200));
    else if (a == "--shared-frames") o.share_lists = o.share_dicts = true;
    else if (a == "--torch-frames") o.share_lists = false, o.share_dicts = true;
    else if (a == "--separate-frames") o.share_lists = o.share_dicts = false;
    else if (a == "--separate-strings") o.separate_strings = true;
    else if (a == "--devices") o.devices = static_cast<int>(number(i, argc, argv, 1, 64));
    else if (a == "--segments") o.segments = static_cast<int>(number(i, argc, argv, 3, 4096));
    else if (a == "--seed") o.seed = number(i, argc, argv, 0, 1ULL << 52);
    else if (a == "--leak-bytes") o.leak_bytes = round_up(number(i, argc, argv, 0, 1ULL << 30), 512);
    else if (a == "--no-frame-opcodes") o.frame_opcodes = false;
    else if (!a.empty() && a[0] == '-') usage(("unknown option " + a).c_str());
    else if (o.out.empty()) o.out = a;
    else usage(("a second output file " + a).c_str());
  }
  if (o.out.empty()) usage("no output file");
  return Generator(o).run();
}
