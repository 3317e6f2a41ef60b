// Categories (what memory is for) on real torch 2.11 pickles: the same loops recorded with
// stacks="python" and stacks="all" (tests/data/torch-stacks, tests/gpu/make_trust_data.sh) read
// the same, allocation by allocation and at the peak through the real `memsnap import`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "categories.hpp"
#include "memsnap/analysis.hpp"
#include "memsnap/store.hpp"
#include "test_util.hpp"
#include "torch/snapshot.hpp"

namespace memsnap {
namespace {

namespace fs = std::filesystem;
constexpr double MiB = 1024.0 * 1024.0;

const fs::path kStacks = fs::path(MEMSNAP_TEST_DATA) / "torch-stacks";
const char* kLoops[] = {"mlp_sgd", "gpt_adamw", "lstm_sgd", "vit_adam", "fsdp_unshard"};

// The pickles of one recording, by file name (rank0.5..., rank1.5...).
std::vector<fs::path> pickles(const std::string& loop, const std::string& stacks) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(kStacks / loop / stacks)) {
    if (e.path().extension() == ".pickle") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

RankRecord import_rank0(const std::string& loop, const std::string& stacks) {
  const auto files = pickles(loop, stacks);
  if (files.empty()) throw std::runtime_error("no pickle in " + (kStacks / loop / stacks).string());
  return torch::import_snapshot_file(files.front().string(), {}).record;
}

bool is_python(const Frame& f) { return f.file.ends_with(".py"); }

using FramePredicate = std::function<bool(const Frame&)>;
bool has_frame(const RankRecord& r, std::uint32_t stack, const FramePredicate& pred) {
  if (!has_frames(r, stack)) return false;
  return std::any_of(r.stacks[stack].begin(), r.stacks[stack].end(),
                     [&](std::uint32_t id) { return id < r.frames.size() && pred(r.frames[id]); });
}

// The stack of the first allocation whose stack has a frame matching each predicate.
std::uint32_t find_alloc(const RankRecord& r, const std::vector<FramePredicate>& preds) {
  for (const auto& w : r.windows) {
    for (const auto& e : w.events) {
      if (e.action != Action::alloc) continue;
      if (std::all_of(preds.begin(), preds.end(), [&](const FramePredicate& p) { return has_frame(r, e.stack_id, p); }))
        return e.stack_id;
    }
  }
  return kNoStack;
}

FramePredicate name_has(std::string a, std::string b = "") {
  return [a, b](const Frame& f) { return f.name.find(a) != std::string::npos && f.name.find(b) != std::string::npos; };
}
FramePredicate python_frame(std::string name, std::string file_end = ".py") {
  return [name, file_end](const Frame& f) { return is_python(f) && f.name == name && f.file.ends_with(file_end); };
}

// The stack's frames without its Python ones: what native stacks (memsnap's `stacks: native`)
// record in the same Python program.
std::vector<const Frame*> native_only(const RankRecord& r, std::uint32_t stack) {
  std::vector<const Frame*> out;
  for (auto id : r.stacks[stack]) {
    if (!is_python(r.frames[id])) out.push_back(&r.frames[id]);
  }
  return out;
}

// A forward op passes torch's autograd dispatch (torch::autograd::VariableType::addmm records
// the graph); that is no gradient. The module's forward says what the memory is for.
TEST(CategoriesTest, ForwardOpUnderAutogradDispatchIsAnActivation) {
  const RankRecord r = import_rank0("gpt_adamw", "all");
  const auto stack = find_alloc(r, {name_has("torch::autograd::VariableType::", "addmm("),
                                    python_frame("forward", "torch/nn/modules/linear.py")});
  ASSERT_NE(stack, kNoStack) << "no forward addmm under VariableType in the pickle";
  EXPECT_EQ(category_name(categorize(r, stack)), std::string("activations"));
  // The same stack with its C++ frames only (no Python frame to say it is a forward): not a gradient.
  EXPECT_NE(category_name(categorize_frames(native_only(r, stack))), std::string("gradients"));
}

// A user's `unshard` all-gathers parameters in the forward (torch.cat under VariableType::cat).
TEST(CategoriesTest, UnshardInTheForwardIsAnAllGather) {
  const RankRecord r = import_rank0("fsdp_unshard", "all");
  const auto stack = find_alloc(r, {name_has("torch::autograd::VariableType::", "cat("), python_frame("unshard")});
  ASSERT_NE(stack, kNoStack) << "no unshard allocation in the pickle";
  EXPECT_EQ(category_name(categorize(r, stack)), std::string("all_gather"));
}

// A real backward runs on torch's autograd engine thread (Engine::thread_main, evaluate_function,
// a generated *Backward0 node): its allocations are gradients, with or without Python frames,
// and when a native stack is cut to its innermost frames (memsnap keeps 24) inside the node.
TEST(CategoriesTest, RealBackwardIsAGradient) {
  const RankRecord r = import_rank0("mlp_sgd", "all");
  const auto stack = find_alloc(r, {name_has("torch::autograd::Engine::thread_main"), name_has("AddmmBackward0::apply")});
  ASSERT_NE(stack, kNoStack) << "no backward mm on the engine thread in the pickle";
  EXPECT_EQ(category_name(categorize(r, stack)), std::string("gradients"));
  auto frames = native_only(r, stack);
  const auto node = std::find_if(frames.begin(), frames.end(), [](const Frame* f) { return f->name.find("AddmmBackward0::apply") != std::string::npos; });
  ASSERT_NE(node, frames.end());
  frames.erase(node + 1, frames.end());  // the stack cut just outside the backward node
  EXPECT_EQ(category_name(categorize_frames(frames)), std::string("gradients"));

  // A gradient summed into the engine's input buffer (two uses of one tensor).
  const RankRecord f = import_rank0("fsdp_unshard", "all");
  const auto sum = find_alloc(f, {name_has("torch::autograd::InputBuffer::add"), name_has("torch::autograd::Engine::thread_main")});
  ASSERT_NE(sum, kNoStack) << "no InputBuffer::add in the pickle";
  EXPECT_EQ(category_name(categorize(f, sum)), std::string("gradients"));
}

// The optimizer's step passes the same autograd dispatch (VariableType::_foreach_sqrt).
TEST(CategoriesTest, OptimizerStepIsOptimizerState) {
  const RankRecord r = import_rank0("gpt_adamw", "all");
  const auto stack = find_alloc(r, {name_has("torch::autograd::VariableType::", "_foreach_"), python_frame("_multi_tensor_adam")});
  ASSERT_NE(stack, kNoStack) << "no Adam step allocation in the pickle";
  EXPECT_EQ(category_name(categorize(r, stack)), std::string("optimizer_state"));
}

// The loops are deterministic: the two recordings hold the same allocations in the same order.
// Every allocation reads the same under both settings, except what stacks="python" leaves
// without frames: the backward on the engine's threads, which has no Python frame (there torch
// records none, so nothing can tell it from memory allocated before the trace began).
TEST(CategoriesTest, EveryAllocationReadsTheSameUnderBothStackSettings) {
  for (const char* loop : kLoops) {
    const RankRecord py = import_rank0(loop, "python"), all = import_rank0(loop, "all");
    ASSERT_EQ(py.windows.size(), 1u);
    ASSERT_EQ(all.windows.size(), 1u);
    const auto& pe = py.windows[0].events;
    const auto& ae = all.windows[0].events;
    ASSERT_EQ(pe.size(), ae.size()) << loop;
    std::map<std::string, int> mismatches;
    int compared = 0, engine = 0;
    for (std::size_t i = 0; i < pe.size(); ++i) {
      ASSERT_EQ(pe[i].size, ae[i].size) << loop << " event " << i;
      if (pe[i].action != Action::alloc) continue;
      const std::string a = category_name(categorize(all, ae[i].stack_id));
      if (!has_frames(py, pe[i].stack_id)) {
        ASSERT_TRUE(has_frame(all, ae[i].stack_id, name_has("torch::autograd::Engine::thread_main"))) << loop << " event " << i;
        EXPECT_EQ(a, "gradients") << loop << " event " << i << ": the backward";
        ++engine;
        continue;
      }
      const std::string p = category_name(categorize(py, pe[i].stack_id));
      ++compared;
      if (p != a) ++mismatches[p + " -> " + a];
    }
    EXPECT_GT(compared, 0) << loop;
    EXPECT_GT(engine, 0) << loop;
    for (const auto& [what, n] : mismatches) ADD_FAILURE() << loop << ": " << n << " allocations read " << what;
  }
}

// Native stacks: a C++ program's own functions decide; torch's dispatch and allocator frames
// say nothing; a stack without frames is other.
TEST(CategoriesTest, NativeStacksAndStacklessKeepTheirCategories) {
  auto cat = [](std::vector<Frame> frames) {
    std::vector<const Frame*> p;
    for (const auto& f : frames) p.push_back(&f);
    return std::string(category_name(categorize_frames(p)));
  };
  const Frame alloc{"c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)", "", 0};
  const Frame addmm{"torch::autograd::VariableType::(anonymous namespace)::addmm(c10::DispatchKeySet, at::Tensor const&)", "VariableType_0.cpp", 0};
  const Frame main_frame{"main", "train.cpp", 80};
  // The C++ API (libtorch): the module's forward, the optimizer's step, the engine's backward.
  EXPECT_EQ(cat({alloc, addmm, {"Net::forward(torch::autograd::Variable)", "train.cpp", 30}, main_frame}), "activations")
      << "the parameters' types say nothing";
  EXPECT_EQ(cat({alloc, addmm, {"torch::nn::LinearImpl::forward(at::Tensor const&)", "linear.cpp", 0}, {"Net::forward(at::Tensor)", "train.cpp", 30}, main_frame}),
            "activations");
  EXPECT_EQ(cat({alloc, {"torch::autograd::VariableType::(anonymous namespace)::mul_Tensor(c10::DispatchKeySet)", "", 0},
                 {"torch::optim::Adam::step(std::function<at::Tensor ()>)", "adam.cpp", 0}, main_frame}),
            "optimizer_state");
  EXPECT_EQ(cat({alloc, {"torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)", "", 0},
                 {"torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", "", 0}, main_frame}),
            "gradients");
  // The demo's native frames (launchers/examples/fsdp_sim.cpp).
  EXPECT_EQ(cat({{"(anonymous namespace)::Trainer::all_gather_params()", "fsdp_sim.cpp", 187}, main_frame}), "all_gather");
  EXPECT_EQ(cat({{"(anonymous namespace)::Trainer::backward_unsharded_grad()", "fsdp_sim.cpp", 189}, main_frame}), "gradients");
  // An op whose kernel says "forward" (at::native::*_forward) says nothing on its own.
  EXPECT_EQ(cat({alloc, {"auto at::native::_efficient_attention_forward(at::Tensor const&)", "attention.cu", 0}, main_frame}), "other");
  // No frames at all.
  RankRecord r;
  r.stacks = {{}};
  EXPECT_EQ(categorize(r, 0), Category::other);
  EXPECT_EQ(categorize(r, kNoStack), Category::other);
  EXPECT_EQ(cat({}), "other");
}

// An allocation the window made without frames, in a torch snapshot whose allocations carry
// Python frames, was made by a thread without Python (the autograd engine's backward): gradients,
// at the site that says so. Memory live when the window opened without frames (allocated before
// the trace began) stays other at "<no stack>"; so does every allocation of a record without
// Python frames, and of a source whose recorder leaves small allocations without frames.
TEST(CategoriesTest, AllocationsWithoutPythonFramesInsideTheWindowAreTheBackward) {
  RankRecord r;
  r.meta.source = "torch";
  r.frames = {{"forward", "/home/me/train.py", 12}};
  r.stacks = {{}, {0}};  // 0: frames: [] (torch's empty list), 1: a Python frame
  WindowRecord w;
  w.open_time_ns = 100;
  w.live_at_start = {LiveAlloc{0x1000, 1000, 0, 0, 0, 0, 0, 0}, LiveAlloc{0x2000, 3000, 0, 0, kNoStack, 0, 0, 0}};
  w.events = {Event{200, 0x3000, 20000, 0, 1, 0, Action::alloc, 0}, Event{300, 0x4000, 400000, 0, 0, 0, Action::alloc, 0},
              Event{400, 0x5000, 5000000, 0, kNoStack, 0, Action::alloc, 0}};
  r.windows = {w};
  const auto bytes = [](const WindowStats& s, Category c) { return s.category_bytes_at_peak[static_cast<int>(c)]; };
  const auto site_bytes = [](const WindowStats& s, const std::string& name) {
    std::uint64_t b = 0;
    for (const auto& site : s.sites) b += site.name == name ? site.bytes_at_peak : 0;
    return b;
  };
  ASSERT_TRUE(python_frames_recorded(r, r.windows[0]));
  WindowStats s = analyse_window(r, r.windows[0]);
  EXPECT_EQ(bytes(s, Category::activations), 20000u);
  EXPECT_EQ(bytes(s, Category::gradients), 5400000u);
  EXPECT_EQ(bytes(s, Category::other), 4000u) << "live at the window's open: before the trace";
  EXPECT_EQ(site_bytes(s, kNoPythonFramesSite), 5400000u);
  EXPECT_EQ(site_bytes(s, "<no stack>"), 4000u);
  for (const auto& site : s.sites) {
    if (site.name == kNoPythonFramesSite) {
      EXPECT_EQ(site.category, Category::gradients);
    }
  }
  EXPECT_EQ(categorize_allocation(r, 0, true, true), Category::gradients);
  EXPECT_EQ(categorize_allocation(r, 0, false, true), Category::other);
  EXPECT_EQ(categorize_allocation(r, 0, true, false), Category::other);

  // Without a Python frame on any allocation of the window (context="state" puts frames on the
  // snapshot's blocks only; a record without frames), or from memsnap's own recorder: other.
  for (const std::string source : {"torch", "torch_tracker", "api", "cupti"}) {
    RankRecord o = r;
    o.meta.source = source;
    if (source == "torch") o.windows[0].events[0].stack_id = 0;
    EXPECT_FALSE(python_frames_recorded(o, o.windows[0])) << source;
    s = analyse_window(o, o.windows[0]);
    EXPECT_EQ(bytes(s, Category::gradients), 0u) << source;
    EXPECT_EQ(site_bytes(s, kNoPythonFramesSite), 0u) << source;
  }
}

// At the window's peak, through `memsnap import` and the store's /summary: every category the
// Python-frames recording shows is there under stacks="all" too, within a few percent of the
// peak. What the backward holds on the engine's threads reads gradients under both: under "all"
// by the engine's C++ frames, under "python" because the window made it without frames.
class StackSettings : public testing::TestWithParam<const char*> {};

StoreReader import_reader(const std::string& name, const std::vector<fs::path>& files, const fs::path& dir) {
  std::string cmd = std::string(MEMSNAP_BIN) + " import -o " + (dir / name).string();
  for (const auto& p : files) cmd += " " + p.string();
  const auto r = test::run_shell(cmd);
  if (r.code != 0) throw std::runtime_error(cmd + ": " + r.out);
  return StoreReader(dir / name);
}

std::vector<SummaryRow> import_store(const std::string& loop, const std::string& stacks, const fs::path& dir) {
  return import_reader(loop + "-" + stacks, pickles(loop, stacks), dir).summary();
}

TEST_P(StackSettings, CategoriesAtThePeakAgree) {
  const std::string loop = GetParam();
  test::TempDir dir;
  const StoreReader py_store = import_reader(loop + "-python", pickles(loop, "python"), dir.path());
  const auto py = py_store.summary();
  const auto all = import_store(loop, "all", dir.path());
  // The backward's allocations are named for what they are under "python": no Python frames.
  bool engine_site = false;
  for (const auto& site : py_store.sites()) {
    if (site.name != kNoPythonFramesSite) continue;
    engine_site = true;
    EXPECT_EQ(site.category, Category::gradients);
  }
  EXPECT_TRUE(engine_site) << "no site " << kNoPythonFramesSite << " under stacks=\"python\"";
  ASSERT_EQ(py.size(), all.size());
  ASSERT_FALSE(py.empty());
  const auto idx = [](Category c) { return static_cast<int>(c); };
  for (std::size_t i = 0; i < py.size(); ++i) {
    const auto& p = py[i];
    const auto& a = all[i];
    ASSERT_EQ(p.rank, a.rank);
    ASSERT_EQ(p.peak_allocated, a.peak_allocated) << "the same loop";
    const double tolerance = 0.03 * static_cast<double>(p.peak_allocated);
    std::string table;
    for (int c = 0; c < kCategoryCount; ++c)
      table += std::string(" ") + category_name(static_cast<Category>(c)) + " " + std::to_string(p.category_bytes[c] / MiB) + "/" +
               std::to_string(a.category_bytes[c] / MiB);
    SCOPED_TRACE(loop + " rank " + std::to_string(p.rank) + " MiB python/all:" + table);
    for (Category c : {Category::parameters, Category::gradients, Category::optimizer_state, Category::all_gather,
                       Category::reduce_scatter, Category::activations, Category::other}) {
      const double pb = static_cast<double>(p.category_bytes[idx(c)]), ab = static_cast<double>(a.category_bytes[idx(c)]);
      EXPECT_NEAR(ab, pb, tolerance) << category_name(c);
      if (pb > 0) {
        EXPECT_GT(ab, 0) << category_name(c) << " is 0 at the peak under stacks=\"all\"";
      }
    }
  }
  if (loop == "fsdp_unshard") {
    for (const auto& a : all) {
      EXPECT_GT(a.category_bytes[idx(Category::all_gather)], 0u) << "rank " << a.rank;
      EXPECT_GT(a.category_bytes[idx(Category::activations)], 0u) << "rank " << a.rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RealLoops, StackSettings, testing::ValuesIn(kLoops));

// A loop recorded with context=None (tests/data/torch-loops/stackless_mlp): no allocation has a
// frame, so nothing tells the backward's from the rest; everything stays other at "<no stack>".
TEST(CategoriesTest, AStacklessRecordReadsOther) {
  test::TempDir dir;
  std::vector<fs::path> files;
  const fs::path loop = fs::path(MEMSNAP_TEST_DATA) / "torch-loops" / "stackless_mlp";
  for (const auto& e : fs::directory_iterator(loop)) {
    if (e.path().extension() == ".pickle") files.push_back(e.path());
  }
  ASSERT_FALSE(files.empty());
  const StoreReader store = import_reader("stackless", files, dir.path());
  const auto rows = store.summary();
  ASSERT_FALSE(rows.empty());
  for (const auto& row : rows) {
    EXPECT_GT(row.peak_allocated, 0u);
    EXPECT_EQ(row.category_bytes[static_cast<int>(Category::other)], row.peak_allocated) << "rank " << row.rank;
  }
  for (const auto& site : store.sites()) EXPECT_EQ(site.name, "<no stack>") << "rank " << site.rank;
}

}  // namespace
}  // namespace memsnap
