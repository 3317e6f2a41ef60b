// Records three batches through the installed library, C API and C++ API both.
#include <memsnap/memsnap.h>
#include <memsnap/recorder.hpp>

#include <cstdio>

int main() {
  if (memsnap_init(nullptr) != 0) return 1;
  for (int b = 0; b < 5; ++b) {
    memsnap_record_alloc(0, 0x1000 + b * 64, 64, 0);
    memsnap_step();
  }
  const memsnap::RecorderStats s = memsnap::Recorder::global().stats();
  memsnap_shutdown();
  std::printf("windows=%llu live=%llu\n", static_cast<unsigned long long>(s.windows),
              static_cast<unsigned long long>(s.live_allocations));
  return s.windows == 1 && s.live_allocations == 5 ? 0 : 1;
}
