// The C ABI: thin forwarding to the process-wide Recorder.
#include "memsnap/memsnap.h"

#include "log.hpp"
#include "memsnap/recorder.hpp"

using memsnap::Action;
using memsnap::Recorder;

extern "C" int memsnap_init(const char* config_path) {
  return Recorder::global().start_from_environment(config_path != nullptr ? config_path : "") ? 0 : 1;
}

extern "C" void memsnap_record_alloc(int device, uint64_t addr, uint64_t size, uint64_t stream) {
  Recorder::global().record(Action::alloc, device, addr, size, stream);
}

extern "C" void memsnap_record_free(int device, uint64_t addr, uint64_t size, uint64_t stream) {
  Recorder::global().record(Action::free_completed, device, addr, size, stream);
}

extern "C" void memsnap_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream) {
  if (action < MEMSNAP_ALLOC || action > MEMSNAP_SEGMENT_UNMAP) return;
  Recorder::global().record(static_cast<Action>(action), device, addr, size, stream);
}

extern "C" void memsnap_record_oom(int device, uint64_t requested, uint64_t device_free, uint64_t device_total,
                                   uint64_t stream) {
  Recorder::global().record_oom(device, requested, device_free, device_total, stream);
}

extern "C" void memsnap_step(void) { Recorder::global().step(); }

extern "C" int memsnap_dump(void) { return Recorder::global().dump() ? 0 : 1; }

extern "C" void memsnap_shutdown(void) { Recorder::global().stop(); }

extern "C" int memsnap_active(void) { return Recorder::global().active() ? 1 : 0; }
