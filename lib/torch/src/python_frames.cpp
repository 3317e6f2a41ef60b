// Python frames for allocation stacks, through the interpreter's C API looked up with dlsym.
#include "python_frames.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memsnap/recorder.hpp"

namespace memsnap::pytorch {
namespace {

// The stable C-API functions used (all in Python 3.9+; the GC switch in 3.10+ and optional).
struct PythonApi {
  int (*gil_check)() = nullptr;                              // PyGILState_Check
  void* (*this_thread_state)() = nullptr;                    // PyGILState_GetThisThreadState
  void* (*thread_frame)(void*) = nullptr;                    // PyThreadState_GetFrame, new reference
  void* (*frame_back)(void*) = nullptr;                      // PyFrame_GetBack, new reference
  void* (*frame_code)(void*) = nullptr;                      // PyFrame_GetCode, new reference
  int (*frame_line)(void*) = nullptr;                        // PyFrame_GetLineNumber
  void* (*get_attr)(void*, const char*) = nullptr;           // PyObject_GetAttrString
  const char* (*utf8)(void*) = nullptr;                      // PyUnicode_AsUTF8
  void (*incref)(void*) = nullptr;                           // Py_IncRef
  void (*decref)(void*) = nullptr;                           // Py_DecRef
  void (*err_fetch)(void**, void**, void**) = nullptr;       // PyErr_Fetch
  void (*err_restore)(void*, void*, void*) = nullptr;        // PyErr_Restore
  int (*gc_disable)() = nullptr;                             // PyGC_Disable (3.10+)
  int (*gc_enable)() = nullptr;                              // PyGC_Enable (3.10+)
  bool ok = false;
};

template <class F>
void look_up(F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

const PythonApi& api() {
  static const PythonApi a = [] {
    PythonApi p;
    look_up(p.gil_check, "PyGILState_Check");
    look_up(p.this_thread_state, "PyGILState_GetThisThreadState");
    look_up(p.thread_frame, "PyThreadState_GetFrame");
    look_up(p.frame_back, "PyFrame_GetBack");
    look_up(p.frame_code, "PyFrame_GetCode");
    look_up(p.frame_line, "PyFrame_GetLineNumber");
    look_up(p.get_attr, "PyObject_GetAttrString");
    look_up(p.utf8, "PyUnicode_AsUTF8");
    look_up(p.incref, "Py_IncRef");
    look_up(p.decref, "Py_DecRef");
    look_up(p.err_fetch, "PyErr_Fetch");
    look_up(p.err_restore, "PyErr_Restore");
    look_up(p.gc_disable, "PyGC_Disable");
    look_up(p.gc_enable, "PyGC_Enable");
    p.ok = p.gil_check && p.this_thread_state && p.thread_frame && p.frame_back && p.frame_code && p.frame_line &&
           p.get_attr && p.utf8 && p.incref && p.decref && p.err_fetch && p.err_restore;
    return p;
  }();
  return a;
}

// An entry: kForeignFrame | code index << 24 | line. Code objects seen once are kept alive (one
// reference each), so a pointer never names two functions.
constexpr int kLineBits = 24;
constexpr std::uintptr_t kLineMask = (std::uintptr_t{1} << kLineBits) - 1;

struct CodeTable {
  std::mutex mutex;  // capture (a thread holding the GIL) against resolve (the recorder's writer)
  std::unordered_map<void*, std::uint32_t> ids;
  std::vector<std::pair<std::string, std::string>> names;  // (function, file)
};
CodeTable& table() {
  static CodeTable* t = new CodeTable();  // never destroyed: frees at exit may still capture
  return *t;
}

std::string attr_text(const PythonApi& p, void* object, const char* name) {
  void* value = p.get_attr(object, name);
  if (value == nullptr) return {};
  const char* text = p.utf8(value);
  std::string out = text != nullptr ? text : "";
  p.decref(value);
  return out;
}

// With the table locked and the GIL held.
std::uint32_t code_id(const PythonApi& p, CodeTable& t, void* code) {
  if (auto it = t.ids.find(code); it != t.ids.end()) return it->second;
  std::string name = attr_text(p, code, "co_qualname");  // 3.11+: Class.method
  if (name.empty()) name = attr_text(p, code, "co_name");
  std::string file = attr_text(p, code, "co_filename");
  p.incref(code);
  const auto id = static_cast<std::uint32_t>(t.names.size());
  t.names.emplace_back(std::move(name), std::move(file));
  t.ids.emplace(code, id);
  return id;
}

}  // namespace

bool python_frames_available() noexcept { return api().ok; }

int capture_python_frames(std::span<std::uintptr_t> out) noexcept {
  const PythonApi& p = api();
  if (!p.ok || out.empty() || p.gil_check() != 1) return 0;
  void* tstate = p.this_thread_state();
  if (tstate == nullptr) return 0;
  // Nothing here may run Python code or a collection: the allocator's lock is held, and a
  // collection could free tensors into it. Frame objects made on the way are kept out of the GC's
  // reach, and a pending exception is put back as it was.
  void *type = nullptr, *value = nullptr, *trace = nullptr;
  p.err_fetch(&type, &value, &trace);
  const bool gc_was_on = p.gc_disable != nullptr && p.gc_disable() == 1;
  int n = 0;
  try {
    CodeTable& t = table();
    std::lock_guard lock(t.mutex);
    void* frame = p.thread_frame(tstate);
    while (frame != nullptr && n < static_cast<int>(out.size())) {
      if (void* code = p.frame_code(frame)) {
        const std::uint32_t id = code_id(p, t, code);
        p.decref(code);
        const int line = p.frame_line(frame);
        out[n++] = kForeignFrame | (std::uintptr_t{id} << kLineBits) |
                   (static_cast<std::uintptr_t>(line > 0 ? line : 0) & kLineMask);
      }
      void* back = p.frame_back(frame);
      p.decref(frame);
      frame = back;
    }
    if (frame != nullptr) p.decref(frame);
  } catch (...) {
    n = 0;
  }
  if (gc_was_on) p.gc_enable();
  p.err_restore(type, value, trace);
  return n;
}

Frame resolve_python_frame(std::uintptr_t entry) noexcept {
  try {
    const auto id = static_cast<std::uint32_t>((entry & ~kForeignFrame) >> kLineBits);
    const auto line = static_cast<std::uint32_t>(entry & kLineMask);
    CodeTable& t = table();
    std::lock_guard lock(t.mutex);
    if (id >= t.names.size()) return Frame{"<python>", "", line};
    return Frame{t.names[id].first, t.names[id].second, line};
  } catch (...) {
    return Frame{"<python>", "", 0};
  }
}

}  // namespace memsnap::pytorch
