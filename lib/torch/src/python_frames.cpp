// Python frames for allocation stacks: a probed frame-chain walk, names resolved with the GIL.
#include "python_frames.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memsnap/recorder.hpp"

namespace memsnap::pytorch {
namespace {

// The C-API functions used, all in the stable ABI of Python 3.9+ (used with the GIL only).
struct PythonApi {
  void* (*this_thread_state)() = nullptr;                // PyGILState_GetThisThreadState
  void* (*thread_frame)(void*) = nullptr;                // PyThreadState_GetFrame, new reference
  void* (*frame_back)(void*) = nullptr;                  // PyFrame_GetBack, new reference
  void* (*frame_code)(void*) = nullptr;                  // PyFrame_GetCode, new reference
  int (*frame_line)(void*) = nullptr;                    // PyFrame_GetLineNumber
  int (*addr_to_line)(void*, int) = nullptr;             // PyCode_Addr2Line
  void* (*get_attr)(void*, const char*) = nullptr;       // PyObject_GetAttrString
  const char* (*utf8)(void*) = nullptr;                  // PyUnicode_AsUTF8
  long (*as_long)(void*) = nullptr;                      // PyLong_AsLong
  void (*decref)(void*) = nullptr;                       // Py_DecRef
  void (*err_fetch)(void**, void**, void**) = nullptr;   // PyErr_Fetch
  void (*err_restore)(void*, void*, void*) = nullptr;    // PyErr_Restore
  bool ok = false;
};

template <class F>
void look_up(F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

const PythonApi& api() {
  static const PythonApi a = [] {
    PythonApi p;
    look_up(p.this_thread_state, "PyGILState_GetThisThreadState");
    look_up(p.thread_frame, "PyThreadState_GetFrame");
    look_up(p.frame_back, "PyFrame_GetBack");
    look_up(p.frame_code, "PyFrame_GetCode");
    look_up(p.frame_line, "PyFrame_GetLineNumber");
    look_up(p.addr_to_line, "PyCode_Addr2Line");
    look_up(p.get_attr, "PyObject_GetAttrString");
    look_up(p.utf8, "PyUnicode_AsUTF8");
    look_up(p.as_long, "PyLong_AsLong");
    look_up(p.decref, "Py_DecRef");
    look_up(p.err_fetch, "PyErr_Fetch");
    look_up(p.err_restore, "PyErr_Restore");
    p.ok = p.this_thread_state && p.thread_frame && p.frame_back && p.frame_code && p.frame_line && p.addr_to_line &&
           p.get_attr && p.utf8 && p.as_long && p.decref && p.err_fetch && p.err_restore;
    return p;
  }();
  return a;
}

using Word = std::uintptr_t;
Word load(Word address, std::size_t offset) { return *reinterpret_cast<const Word*>(address + offset); }

// A load from an address that may not be mapped (the probe only): the kernel copies it into a
// pipe and says EFAULT instead of the process faulting.
bool checked_load(Word address, std::size_t offset, Word& out) {
  static int fds[2] = {-1, -1};
  if (fds[0] < 0 && pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  if (address < 4096) return false;
  if (::write(fds[1], reinterpret_cast<const void*>(address + offset), sizeof(Word)) != sizeof(Word)) return false;
  return ::read(fds[0], &out, sizeof(Word)) == sizeof(Word);
}

// Where the frames are, as the probe found it (CPython 3.11 and 3.12: thread state -> cframe ->
// current frame; 3.13: thread state -> current frame; the frame's code, previous frame and
// instruction pointer at version-specific slots).
struct Layout {
  std::size_t state_slot = 0;     // byte offset in the thread state
  bool via_cframe = false;        // the slot holds a _PyCFrame*, whose `cframe_slot` is the frame
  std::size_t cframe_slot = 0;
  std::size_t code_slot = 0, previous_slot = 0, instr_slot = 0;  // in an interpreter frame
  std::size_t code_start = 0;     // offset of the bytecode in a code object (code type's basicsize)
  Word code_type = 0;             // the code type, for checking a pointer before naming it
  std::array<Word, 4> shims{};    // code of the C-stack entry frames that the C API skips
  int shim_count = 0;
  int instr_adjust = 0;           // code units between the stored pointer and the current instruction
};
std::atomic<bool> g_ready{false};
Layout g_layout;  // written once by the probe, before g_ready

Word current_frame(const Layout& l, Word state) {
  const Word v = load(state, l.state_slot);
  if (!l.via_cframe || v == 0) return v;
  return load(v, l.cframe_slot);
}

bool is_shim(const Layout& l, Word code) {
  for (int i = 0; i < l.shim_count; ++i) {
    if (l.shims[i] == code) return true;
  }
  return false;
}

// An entry: kForeignFrame | code id << 24 | instruction offset (code units).
constexpr int kOffsetBits = 24;
constexpr std::uintptr_t kOffsetMask = (std::uintptr_t{1} << kOffsetBits) - 1;
constexpr std::uint32_t kPendingLine = 0xffffffffu;

struct CodeInfo {
  Word code = 0;
  std::string name, file;
  bool named = false;
};
struct Table {
  std::mutex mutex;  // capture (any thread) against resolve and name lookups; memsnap's own lock
  std::unordered_map<Word, std::uint32_t> ids;
  std::vector<CodeInfo> codes;
  std::unordered_map<std::uintptr_t, std::uint32_t> lines;  // entry -> line, kPendingLine until resolved
  std::vector<std::uintptr_t> pending;
};
Table& table() {
  static Table* t = new Table();  // never destroyed: frees at exit may still capture
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

// Probe steps, each with the GIL held and a frame object of this thread in hand.
struct FrameRef {
  Word frame = 0;  // PyFrameObject*
  Word code = 0;   // its code (borrowed after the walk: the frames hold it)
  int line = 0;
};

bool find_layout(const PythonApi& p, Word state, const std::vector<FrameRef>& chain, Layout& l, std::string& why) {
  // PyFrameObject (3.11-3.13): object head, f_back, then f_frame, the interpreter frame.
  auto interpreter_frame = [](Word frame_object) { return load(frame_object, 3 * sizeof(Word)); };
  const Word top = interpreter_frame(chain[0].frame);
  pthread_attr_t attr;
  void* stack_base = nullptr;
  std::size_t stack_size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &stack_base, &stack_size);
    pthread_attr_destroy(&attr);
  }
  const Word lo = reinterpret_cast<Word>(stack_base), hi = lo + stack_size;
  bool found = false;
  for (std::size_t off = 0; off < 96 * sizeof(Word) && !found; off += sizeof(Word)) {
    Word v = 0;
    if (!checked_load(state, off, v)) break;
    if (v == top) {
      l.state_slot = off, l.via_cframe = false, found = true;
    } else if ((v >= state && v < state + 2048) || (v >= lo && v < hi)) {  // a _PyCFrame: in the state or on the stack
      for (std::size_t in = 0; in < 2 * sizeof(Word); in += sizeof(Word)) {
        if (load(v, in) == top) {
          l.state_slot = off, l.via_cframe = true, l.cframe_slot = in, found = true;
          break;
        }
      }
    }
  }
  if (!found) return why = "the thread state holds no pointer to the current frame", false;
  for (l.code_slot = 0; l.code_slot < 8 * sizeof(Word) && load(top, l.code_slot) != chain[0].code;) l.code_slot += sizeof(Word);
  if (l.code_slot == 8 * sizeof(Word)) return why = "no code slot in the interpreter frame", false;
  l.code_type = load(chain[0].code, sizeof(Word));
  void* basicsize = p.get_attr(reinterpret_cast<void*>(l.code_type), "__basicsize__");
  if (basicsize == nullptr) return why = "the code type has no __basicsize__", false;
  l.code_start = static_cast<std::size_t>(p.as_long(basicsize));
  p.decref(basicsize);
  // The instruction pointer: the slot pointing into this frame's bytecode (ob_size code units).
  auto in_code = [&](Word code, Word ptr) {
    const Word start = code + l.code_start;
    const auto units = static_cast<Word>(load(code, 2 * sizeof(Word)));
    return ptr >= start && ptr < start + 2 * units + 2;
  };
  for (l.instr_slot = 0; l.instr_slot < 10 * sizeof(Word) && !in_code(chain[0].code, load(top, l.instr_slot));) {
    l.instr_slot += sizeof(Word);
  }
  if (l.instr_slot == 10 * sizeof(Word)) return why = "no instruction pointer in the interpreter frame", false;
  // The previous-frame slot: the one from which the next frame object's interpreter frame is
  // reached, passing at most two C-stack entry frames (code objects too: remembered as shims).
  // Candidate slots hold anything (dicts, counters), so pointers are followed by checked reads.
  const Word next = interpreter_frame(chain[1].frame);
  for (l.previous_slot = 0; l.previous_slot < 10 * sizeof(Word); l.previous_slot += sizeof(Word)) {
    if (l.previous_slot == l.code_slot || l.previous_slot == l.instr_slot) continue;
    Word f = 0, code = 0, type = 0;
    if (!checked_load(top, l.previous_slot, f)) continue;
    l.shim_count = 0;
    for (int hop = 0; hop < 3 && f != 0 && f != next; ++hop) {
      if (!checked_load(f, l.code_slot, code) || !checked_load(code, sizeof(Word), type) || type != l.code_type) {
        f = 0;
        break;
      }
      l.shims[l.shim_count++] = code;
      if (!checked_load(f, l.previous_slot, f)) f = 0;
    }
    if (f != 0 && f == next) break;
  }
  if (l.previous_slot == 10 * sizeof(Word)) return why = "no previous-frame slot in the interpreter frame", false;
  return true;
}

}  // namespace

bool probe_python_frames(std::string& why) noexcept {
  const PythonApi& p = api();
  if (!p.ok) return why = "this process has no Python interpreter", false;
  void *type = nullptr, *value = nullptr, *trace = nullptr;
  p.err_fetch(&type, &value, &trace);
  bool ok = false;
  std::vector<FrameRef> chain;
  try {
    const Word state = reinterpret_cast<Word>(p.this_thread_state());
    void* f = state != 0 ? p.thread_frame(reinterpret_cast<void*>(state)) : nullptr;
    while (f != nullptr && chain.size() < 256) {
      void* code = p.frame_code(f);
      chain.push_back(FrameRef{reinterpret_cast<Word>(f), reinterpret_cast<Word>(code), p.frame_line(f)});
      p.decref(code);  // the frame keeps it
      f = p.frame_back(f);
    }
    if (f != nullptr) p.decref(f);
    Layout l;
    if (chain.size() < 2) {
      why = "too few Python frames to check the layout";
    } else if (find_layout(p, state, chain, l, why)) {
      // Check: the raw walk gives the C API's frames, code and line alike, all the way down.
      Word frame = current_frame(l, state);
      std::size_t i = 0;
      std::string mismatch = "a longer chain";
      for (int guard = 0; frame != 0 && guard < 1024; ++guard) {
        const Word code = load(frame, l.code_slot);
        if (i < chain.size() && code != chain[i].code && !is_shim(l, code) && l.shim_count < static_cast<int>(l.shims.size()) &&
            load(code, sizeof(Word)) == l.code_type) {
          // A frame the C API skips (3.12's entry frames on the C stack run a trampoline code).
          const Word after = load(frame, l.previous_slot);
          if (after != 0 && load(after, l.code_slot) == chain[i].code) l.shims[l.shim_count++] = code;
        }
        if (!is_shim(l, code)) {
          if (i >= chain.size() || code != chain[i].code) {
            mismatch = "code";
            break;
          }
          const auto offset = static_cast<int>((load(frame, l.instr_slot) - (code + l.code_start)) / 2);
          if (i == 0) {
            for (int adjust : {0, -1, 1}) {
              if (p.addr_to_line(reinterpret_cast<void*>(code), 2 * (offset + adjust)) == chain[0].line) {
                l.instr_adjust = adjust;
                break;
              }
            }
          }
          if (p.addr_to_line(reinterpret_cast<void*>(code), 2 * (offset + l.instr_adjust)) != chain[i].line) {
            mismatch = "line " + std::to_string(p.addr_to_line(reinterpret_cast<void*>(code), 2 * (offset + l.instr_adjust))) +
                       " for " + std::to_string(chain[i].line);
            break;
          }
          ++i;
        }
        frame = load(frame, l.previous_slot);
      }
      // Below the outermost frame the C API shows, the interpreter's own entry frames may remain.
      for (int tail = 0; i == chain.size() && frame != 0 && tail < 2; ++tail) {
        const Word code = load(frame, l.code_slot);
        if (load(code, sizeof(Word)) != l.code_type) break;
        if (!is_shim(l, code) && l.shim_count < static_cast<int>(l.shims.size())) l.shims[l.shim_count++] = code;
        frame = load(frame, l.previous_slot);
      }
      if (i == chain.size() && frame == 0) {
        ok = true;
      } else {
        why = "the frame walk disagrees with the interpreter at frame " + std::to_string(i) + " of " +
              std::to_string(chain.size()) + " (" + mismatch + ")";
      }
    }
    for (auto& r : chain) p.decref(reinterpret_cast<void*>(r.frame));
    if (ok) {
      g_layout = l;
      g_ready.store(true, std::memory_order_release);
    }
  } catch (...) {
    why = "internal error while checking the frame layout";
    ok = false;
  }
  p.err_restore(type, value, trace);
  return ok;
}

int capture_python_frames(std::span<std::uintptr_t> out) noexcept {
  if (!g_ready.load(std::memory_order_acquire) || out.empty()) return 0;
  const Layout& l = g_layout;
  const Word state = reinterpret_cast<Word>(api().this_thread_state());  // a thread-local lookup
  if (state == 0) return 0;
  int n = 0;
  try {
    Table& t = table();
    std::lock_guard lock(t.mutex);
    Word frame = current_frame(l, state);
    for (int guard = 0; frame != 0 && n < static_cast<int>(out.size()) && guard < 1024; ++guard) {
      const Word code = load(frame, l.code_slot);
      if (!is_shim(l, code) && code != 0) {
        auto [it, added] = t.ids.try_emplace(code, static_cast<std::uint32_t>(t.codes.size()));
        if (added) t.codes.push_back(CodeInfo{code, {}, {}, false});
        const Word instr = load(frame, l.instr_slot);
        const Word start = code + l.code_start;
        const Word offset = instr >= start ? std::min<Word>((instr - start) / 2, kOffsetMask) : 0;
        const std::uintptr_t entry = kForeignFrame | (std::uintptr_t{it->second} << kOffsetBits) | offset;
        if (t.lines.try_emplace(entry, kPendingLine).second) t.pending.push_back(entry);
        out[n++] = entry;
      }
      frame = load(frame, l.previous_slot);
    }
  } catch (...) {
    return 0;
  }
  return n;
}

void resolve_pending_python_frames() noexcept {
  if (!g_ready.load(std::memory_order_acquire)) return;
  const PythonApi& p = api();
  const Layout& l = g_layout;
  void *type = nullptr, *value = nullptr, *trace = nullptr;
  p.err_fetch(&type, &value, &trace);
  try {
    Table& t = table();
    std::lock_guard lock(t.mutex);
    for (const std::uintptr_t entry : t.pending) {
      const auto id = static_cast<std::uint32_t>((entry & ~kForeignFrame) >> kOffsetBits);
      CodeInfo& c = t.codes[id];
      // A code object is alive while a frame runs it; one gone since would have another type here.
      const bool is_code = load(c.code, sizeof(Word)) == l.code_type;
      if (!c.named && is_code) {
        c.name = attr_text(p, reinterpret_cast<void*>(c.code), "co_qualname");  // 3.11+: Class.method
        if (c.name.empty()) c.name = attr_text(p, reinterpret_cast<void*>(c.code), "co_name");
        c.file = attr_text(p, reinterpret_cast<void*>(c.code), "co_filename");
        c.named = true;
      }
      const int offset = static_cast<int>(entry & kOffsetMask) + l.instr_adjust;
      const int line = is_code ? p.addr_to_line(reinterpret_cast<void*>(c.code), 2 * std::max(offset, 0)) : 0;
      t.lines[entry] = static_cast<std::uint32_t>(std::max(line, 0));
    }
    t.pending.clear();
  } catch (...) {
  }
  p.err_restore(type, value, trace);
}

Frame resolve_python_frame(std::uintptr_t entry) noexcept {
  try {
    const auto id = static_cast<std::uint32_t>((entry & ~kForeignFrame) >> kOffsetBits);
    Table& t = table();
    std::lock_guard lock(t.mutex);
    if (id >= t.codes.size() || !t.codes[id].named) return Frame{"<python frame>", "", 0};
    auto it = t.lines.find(entry);
    const std::uint32_t line = it == t.lines.end() || it->second == kPendingLine ? 0 : it->second;
    return Frame{t.codes[id].name, t.codes[id].file, line};
  } catch (...) {
    return Frame{"<python frame>", "", 0};
  }
}

}  // namespace memsnap::pytorch
