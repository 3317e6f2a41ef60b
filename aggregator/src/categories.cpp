// Categories: what an allocation's memory is for, from the frames of its stack.
#include "categories.hpp"

#include <array>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "text.hpp"

namespace memsnap {
namespace {

using text::contains;
using text::lower;
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// FSDP's `unshard` all-gathers a module's parameters; a module kept "unsharded" is not that.
bool only_unsharded(std::string_view text, std::string_view needle) {
  if (needle != "unshard") return false;
  for (std::size_t at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + 1)) {
    if (text.substr(at, 9) != "unsharded") return false;
  }
  return true;
}

struct Rule {
  Category category;
  std::array<std::string_view, 6> needles;
};
// In priority order within one frame: collective buffers, then optimizer, parameters, gradients, forward.
constexpr Rule kRules[] = {
    {Category::all_gather, {"all_gather", "allgather", "unshard", "foreach_all_gather", "_all_gather", "pre_forward"}},
    {Category::reduce_scatter, {"reduce_scatter", "reducescatter", "post_backward", "foreach_reduce", "_reduce_grad", ""}},
    {Category::optimizer_state, {"torch/optim/", "optimizer", "optim_state", "_init_group", "adam", "exp_avg"}},
    {Category::parameters, {"fully_shard", "fsdpparam", "flat_param", "sharded_param", "reset_parameters", "init_param"}},
    {Category::gradients, {"accumulate_grad", "backward", "autograd", "grad_", "_grad", ""}},
    {Category::activations, {"forward", "activation", "", "", "", ""}},
};

// What a frame says the memory is for (`text`: its function and file); other where it says nothing.
Category rule_category(const std::string& function, const std::string& file) {
  const std::string text = lower(function + " " + file);
  for (const auto& rule : kRules) {
    for (auto n : rule.needles) {
      if (!n.empty() && contains(text, n) && !only_unsharded(text, n)) return rule.category;
    }
  }
  return Category::other;
}

// A Python interpreter frame (torch's snapshots, memsnap's PyTorch attachment): its file is a
// Python source or a pseudo-file such as `<frozen ...>`, `<eval_with_key>.3` or `<string>`.
bool is_python_frame(const Frame& f) {
  const std::string_view file = f.file;
  return (file.size() > 3 && file.substr(file.size() - 3) == ".py") || starts_with(file, "<");
}

// A native frame's qualified function name: without its return type, parameters and template
// arguments ("auto at::native::f<T>(at::Tensor const&)" -> "at::native::f"); anonymous namespaces
// read "{anon}".
std::string qualified_name(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  int depth = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.substr(i, 21) == "(anonymous namespace)") {
      if (depth == 0) out += "{anon}";
      i += 20;
      continue;
    }
    const char c = name[i];
    if (c == '<') {
      ++depth;
    } else if (c == '>' && depth > 0) {
      --depth;
    } else if (depth == 0) {
      // `operator()` and `operator<`... keep their own parentheses and brackets out of the way.
      if (c == '(' && !(out.size() >= 8 && out.compare(out.size() - 8, 8, "operator") == 0)) break;
      out += c;
    }
  }
  const auto space = out.rfind(' ');
  return space == std::string::npos ? out : out.substr(space + 1);
}

// Native frames that say the allocation is made by a real backward: torch's autograd engine
// running the graph (on its device threads, or the caller's for CPU tensors), a backward node's
// generated apply, the accumulation of a parameter's gradient. A forward never has them: its
// autograd frames are the dispatch (VariableType::*) that records the graph.
bool is_backward_engine(std::string_view q) {
  static constexpr std::string_view prefixes[] = {
      "torch::autograd::Engine::",       "torch::autograd::python::PythonEngine::", "torch::autograd::AccumulateGrad",
      "torch::autograd::InputBuffer::",  "torch::autograd::accumulate",             "torch::autograd::Node::operator()",
      "torch::autograd::validate_outputs",
  };
  for (auto p : prefixes) {
    if (starts_with(q, p)) return true;
  }
  // torch::autograd::generated::AddmmBackward0::apply, ...::AddmmBackward0_apply_functional.
  return starts_with(q, "torch::autograd::generated::") && contains(q, "Backward");
}

// Native frames that say how an allocation was made, not what for: the allocator, the dispatcher
// and its kernels (c10::, at::), the autograd dispatch that records a forward's graph
// (torch::autograd::VariableType::*, ...), the Python bindings and the interpreter, the runtime.
bool is_native_plumbing(std::string_view q, const Frame& f) {
  static constexpr std::string_view prefixes[] = {
      "c10::",          "at::",           "torch::autograd::", "torch::unwind", "torch::CapturedTraceback",
      "torch::cuda::",  "torch::jit::",   "torch::dynamo::",   "torch::detail::", "torch::impl::",
      "torch::utils::", "torch::python::", "torch::Python",    "std::",           "__gnu_cxx::",
      "pybind11::",     "THP",            "{anon}::THP",       "_Py",             "Py_",
      "PyEval",         "PyObject",       "PyRun",             "PyCMethod",       "PyType",
      "PyVectorcall",   "PyCFunction",    "PyFunction",        "PyMethod",        "__libc",
      "_start",         "start_thread",   "clone",             "0x",              "??",
      "memsnap",        "cudaMalloc",     "cuMem",             "operator new",    "malloc",
  };
  if (q.empty()) return true;
  for (auto p : prefixes) {
    if (starts_with(q, p)) return true;
  }
  // Frames of torch's and the runtime's own libraries, where a symbol-less frame names only them.
  static constexpr std::string_view files[] = {"libtorch", "libc10", "libcuda", "libcudart", "libpython", "libc.so", "libnccl"};
  for (auto p : files) {
    if (contains(f.file, p)) return true;
  }
  return false;
}

}  // namespace

const char* category_name(Category c) {
  static constexpr const char* names[kCategoryCount] = {"parameters",     "gradients",   "optimizer_state", "all_gather",
                                                        "reduce_scatter", "activations", "other"};
  const auto i = static_cast<int>(c);
  return i >= 0 && i < kCategoryCount ? names[i] : "other";
}

Category categorize_frames(std::span<const Frame* const> stack) {
  // The innermost frame that says what the memory is for decides (an all-gather called from a
  // forward hook is an all-gather buffer; a gradient shard made inside a reduce-scatter is a
  // gradient). Python frames, where the stack has any, are the ones that say it: torch's
  // stacks="all" puts C++ frames inside them whose names are about dispatch, not purpose
  // (every forward op passes torch::autograd::VariableType::*), and the same loop recorded with
  // Python frames alone must read the same.
  bool python = false;
  for (const Frame* f : stack) {
    if (f != nullptr && is_python_frame(*f)) {
      python = true;
      break;
    }
  }
  if (python) {
    for (const Frame* f : stack) {
      if (f == nullptr || !is_python_frame(*f)) continue;
      if (const Category c = rule_category(f->name, f->file); c != Category::other) return c;
    }
  }
  // Native frames (memsnap's native stacks, the C++ API, torch's C++ frames where no Python frame
  // said anything): the program's own functions decide, the real backward engine makes a
  // gradient, plumbing says nothing.
  for (const Frame* f : stack) {
    if (f == nullptr || is_python_frame(*f)) continue;
    const std::string q = qualified_name(f->name);
    if (is_backward_engine(q)) return Category::gradients;
    if (python || is_native_plumbing(q, *f)) continue;
    // The function's own name, not its parameters' types ("Net::forward(torch::autograd::Variable)").
    if (const Category c = rule_category(q, f->file); c != Category::other) return c;
  }
  return Category::other;
}

bool python_frames_recorded(const RankRecord& rank, const WindowRecord& window) {
  if (rank.meta.source != "torch") return false;
  // One answer per stack id: a window has millions of events and few stacks.
  std::vector<std::int8_t> python(rank.stacks.size(), -1);
  for (const auto& e : window.events) {
    if (e.action != Action::alloc || !has_frames(rank, e.stack_id)) continue;
    auto& known = python[e.stack_id];
    if (known < 0) {
      known = 0;
      for (auto id : rank.stacks[e.stack_id]) {
        if (id < rank.frames.size() && is_python_frame(rank.frames[id])) {
          known = 1;
          break;
        }
      }
    }
    if (known == 1) return true;
  }
  return false;
}

Category categorize_allocation(const RankRecord& rank, std::uint32_t stack_id, bool made_in_window, bool python_window) {
  return made_without_python(rank, stack_id, made_in_window, python_window) ? Category::gradients : categorize(rank, stack_id);
}

Category categorize(const RankRecord& rank, std::uint32_t stack_id) {
  if (stack_id >= rank.stacks.size()) return Category::other;
  const Stack& ids = rank.stacks[stack_id];
  std::vector<const Frame*> frames;
  frames.reserve(ids.size());
  for (auto id : ids) frames.push_back(id < rank.frames.size() ? &rank.frames[id] : nullptr);
  return categorize_frames(frames);
}

}  // namespace memsnap
