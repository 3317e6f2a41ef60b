#include "stacks.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef MEMSNAP_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace memsnap::stacks {

int capture(std::uintptr_t* out, int max_depth) noexcept {
  return ::backtrace(reinterpret_cast<void**>(out), max_depth);
}

void warm_up() noexcept {
  void* probe[4];
  (void)::backtrace(probe, 4);
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
