// Native stacks: return addresses on the hot path (frame pointers, else DWARF), symbols at window close.
#include "stacks.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef MEMSNAP_HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif

#ifdef MEMSNAP_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace memsnap::stacks {

namespace {

// The calling thread's stack top (pthread_getattr_np once per thread): frame pointers are
// followed only between the capturing frame and it, so a broken chain never reads elsewhere.
struct StackRange {
  std::uintptr_t top = 0;
  bool known = false;
};
__attribute__((tls_model("initial-exec"))) thread_local StackRange t_stack;

std::uintptr_t stack_top() noexcept {
  if (!t_stack.known) {
    t_stack.known = true;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      std::size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0) t_stack.top = reinterpret_cast<std::uintptr_t>(addr) + size;
      pthread_attr_destroy(&attr);
    }
  }
  return t_stack.top;
}

}  // namespace

// Frame-pointer walk: two loads a frame. Trusted only when the chain is whole: every saved frame
// pointer lies above the last one and below the stack's top, 16-aligned as the x86-64 and AArch64
// ABIs keep them, and the chain either reaches max_depth or ends at the outermost frame (a saved
// frame pointer of 0, as _start and clone leave it). Code built without frame pointers breaks
// one of these nearly always (rbp holds a heap pointer, a counter, or a stale frame), and then
// the DWARF unwinder takes the whole stack. 0: not trusted.
[[gnu::noinline]] int capture_with_frame_pointers(std::uintptr_t* out, int max_depth) noexcept {
#if defined(__x86_64__) || defined(__aarch64__)
  const std::uintptr_t top = stack_top();
  auto fp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (top == 0 || fp >= top) return 0;
  int n = 0;
  while (n < max_depth) {
    if ((fp & 15) != 0 || fp + 2 * sizeof(std::uintptr_t) > top) return 0;
    const auto* frame = reinterpret_cast<const std::uintptr_t*>(fp);
    const std::uintptr_t next = frame[0];
    const std::uintptr_t ra = frame[1];
    if (ra < 4096) return 0;
    out[n++] = ra;
    if (next == 0) return n;  // the outermost frame
    if (next <= fp) return 0;
    fp = next;
  }
  return n;
#else
  (void)out;
  (void)max_depth;
  return 0;
#endif
}

int capture_with_dwarf(std::uintptr_t* out, int max_depth) noexcept {
#ifdef MEMSNAP_HAVE_LIBUNWIND
  // libunwind caches what it learnt of each return address (per thread), so a stack seen before
  // costs little more than a frame-pointer walk; glibc's backtrace decodes DWARF every time.
  return unw_backtrace(reinterpret_cast<void**>(out), max_depth);
#else
  return ::backtrace(reinterpret_cast<void**>(out), max_depth);
#endif
}

int capture(std::uintptr_t* out, int max_depth) noexcept {
  const int n = capture_with_frame_pointers(out, max_depth);
  return n > 0 ? n : capture_with_dwarf(out, max_depth);
}

void warm_up() noexcept {
#ifdef MEMSNAP_HAVE_LIBUNWIND
  unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
#endif
  void* probe[4];
  (void)capture_with_dwarf(reinterpret_cast<std::uintptr_t*>(probe), 4);
  (void)stack_top();
}

bool is_own_frame(std::uintptr_t pc) noexcept {
  static const void* own_base = [] {
    Dl_info info{};
    return dladdr(reinterpret_cast<void*>(&capture), &info) != 0 ? info.dli_fbase : nullptr;
  }();
  Dl_info info{};
  if (own_base == nullptr || dladdr(reinterpret_cast<void*>(pc), &info) == 0) return false;
  return info.dli_fbase == own_base;
}

namespace {
std::string demangle(const char* name) {
  if (name == nullptr) return {};
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status == 0 && out != nullptr) {
    std::string s(out);
    std::free(out);
    return s;
  }
  return name;
}

std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%zx", static_cast<std::size_t>(v));
  return buf;
}
}  // namespace

#ifdef MEMSNAP_HAVE_LIBDW
// When pc lies in code inlined into a function, the line table gives the inlined callee's line
// (often a header). The frame is the function itself, so report where it called the inlined code:
// DW_AT_call_file/DW_AT_call_line of the outermost inlined scope.
bool call_site_of_inlined_code(Dwfl_Module* mod, std::uintptr_t pc, Frame& f) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = dwfl_module_addrdie(mod, pc, &bias);
  if (cu == nullptr) return false;
  Dwarf_Die* scopes = nullptr;
  const int n = dwarf_getscopes(cu, pc - bias, &scopes);
  if (n <= 0) return false;
  Dwarf_Die* outermost_inline = nullptr;
  for (int i = 0; i < n; ++i) {
    const int tag = dwarf_tag(&scopes[i]);
    if (tag == DW_TAG_inlined_subroutine) outermost_inline = &scopes[i];
    if (tag == DW_TAG_subprogram) break;
  }
  bool found = false;
  if (outermost_inline != nullptr) {
    Dwarf_Attribute attr;
    Dwarf_Word file_index = 0, line = 0;
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    if (dwarf_formudata(dwarf_attr(outermost_inline, DW_AT_call_file, &attr), &file_index) == 0 &&
        dwarf_formudata(dwarf_attr(outermost_inline, DW_AT_call_line, &attr), &line) == 0 &&
        dwarf_getsrcfiles(cu, &files, &nfiles) == 0 && file_index < nfiles) {
      if (const char* file = dwarf_filesrc(files, file_index, nullptr, nullptr)) {
        f.file = file;
        f.line = static_cast<std::uint32_t>(line);
        found = true;
      }
    }
  }
  std::free(scopes);
  return found;
}
#endif

struct Symbolizer::Impl {
#ifdef MEMSNAP_HAVE_LIBDW
  Dwfl_Callbacks callbacks{};
  Dwfl* dwfl = nullptr;
  char* debuginfo_path = nullptr;
  Impl() {
    callbacks.find_elf = dwfl_linux_proc_find_elf;
    callbacks.find_debuginfo = dwfl_standard_find_debuginfo;
    callbacks.debuginfo_path = &debuginfo_path;
    dwfl = dwfl_begin(&callbacks);
    if (dwfl != nullptr) {
      dwfl_report_begin(dwfl);
      if (dwfl_linux_proc_report(dwfl, getpid()) != 0 || dwfl_report_end(dwfl, nullptr, nullptr) != 0) {
        dwfl_end(dwfl);
        dwfl = nullptr;
      }
    }
  }
  ~Impl() {
    if (dwfl != nullptr) dwfl_end(dwfl);
  }
#endif
};

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}
Symbolizer::~Symbolizer() = default;

Frame Symbolizer::resolve(std::uintptr_t return_address) {
  // A return address points after the call; look up the call instruction itself.
  const std::uintptr_t pc = return_address > 0 ? return_address - 1 : 0;
  Frame f;
#ifdef MEMSNAP_HAVE_LIBDW
  if (impl_->dwfl != nullptr) {
    if (Dwfl_Module* mod = dwfl_addrmodule(impl_->dwfl, pc)) {
      if (const char* name = dwfl_module_addrname(mod, pc)) f.name = demangle(name);
      if (call_site_of_inlined_code(mod, pc, f)) {
        // pc is in code inlined into the symbol's function: f holds that function's call line.
      } else if (Dwfl_Line* line = dwfl_module_getsrc(mod, pc)) {
        int lineno = 0;
        if (const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
          f.file = file;
          f.line = static_cast<std::uint32_t>(lineno > 0 ? lineno : 0);
        }
      }
      if (f.file.empty()) {
        const char* module_name = dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
        if (module_name != nullptr) f.file = module_name;
      }
    }
  }
#endif
  if (f.name.empty()) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
      if (info.dli_sname != nullptr) f.name = demangle(info.dli_sname);
      if (f.file.empty() && info.dli_fname != nullptr) f.file = info.dli_fname;
    }
  }
  if (f.name.empty()) f.name = hex(return_address);
  return f;
}

}  // namespace memsnap::stacks
