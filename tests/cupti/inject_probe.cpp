// Loads libmemsnap_cupti.so and calls InitializeInjection the way the CUDA driver does, for the
// CI tests on a machine without a driver: memsnap must say at most one line and step aside.
//   inject_probe LIB
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: inject_probe LIB\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("inject_probe: cannot load: %s\n", dlerror());
    return 3;
  }
  using Init = int (*)();
  auto init = reinterpret_cast<Init>(dlsym(lib, "InitializeInjection"));
  if (init == nullptr || dlsym(lib, "InitializeInjectionNvtx2") == nullptr) {
    std::printf("inject_probe: entry points missing\n");
    return 4;
  }
  const int first = init();
  const int second = init();  // the driver calls once; a second call must be harmless
  std::printf("inject_probe: InitializeInjection -> %d %d\n", first, second);
  return 0;
}
