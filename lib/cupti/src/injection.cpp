// libmemsnap_cupti.so: recording for unmodified CUDA programs. The CUDA driver loads it through
// CUDA_INJECTION64_PATH and calls InitializeInjection; the NVTX loader loads it through
// NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2, which hands NVTX to CUPTI so that
// range pushes reach the NVTX callbacks below.
//
// Do no harm: a second CUPTI subscriber (Nsight, compute-sanitizer, torch.profiler started
// first), a bad config or an unusable folder gives one warning line and the program runs on with
// no callback enabled. Nothing here throws into the program, calls exit, or links libcuda (driver
// functions are looked up in the libcuda the program already loaded), so the library loads on a
// machine without a driver too.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <cuda.h>
#include <cupti.h>

#include "callback_mapper.hpp"
#include "log.hpp"
#include "memsnap/config.hpp"
#include "memsnap/launch_env.hpp"
#include "memsnap/recorder.hpp"

namespace memsnap::cupti {
namespace {

// The few driver functions used, from the libcuda that loaded us.
struct Driver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_name)(char*, int, CUdevice) = nullptr;
  CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;

  void load() noexcept {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    auto sym = [&](const char* name) { return lib != nullptr ? dlsym(lib, name) : dlsym(RTLD_DEFAULT, name); };
    device_get = reinterpret_cast<decltype(device_get)>(sym("cuDeviceGet"));
    device_get_name = reinterpret_cast<decltype(device_get_name)>(sym("cuDeviceGetName"));
    mem_get_info = reinterpret_cast<decltype(mem_get_info)>(sym("cuMemGetInfo_v2"));
    ctx_get_current = reinterpret_cast<decltype(ctx_get_current)>(sym("cuCtxGetCurrent"));
    // dlopen's reference is dropped: libcuda stays loaded by the program.
    if (lib != nullptr) dlclose(lib);
  }
};

// Device of a context: cuptiGetDeviceId, cached per thread for the last context seen
// (cudaGetDevice must not be called inside callbacks).
class DriverDevices final : public DeviceQuery {
 public:
  explicit DriverDevices(const Driver& driver) : m_driver(driver) {}

  int device_of(CUcontext context) noexcept override {
    thread_local CUcontext t_context = nullptr;
    thread_local int t_device = 0;
    if (context == nullptr && m_driver.ctx_get_current != nullptr) m_driver.ctx_get_current(&context);
    if (context == nullptr) return 0;
    if (context == t_context) return t_device;
    std::uint32_t id = 0;
    if (cuptiGetDeviceId(context, &id) != CUPTI_SUCCESS) return 0;
    t_context = context;
    t_device = static_cast<int>(id);
    return t_device;
  }

  // Called at the exit of a failed allocation, with the context current.
  bool memory_info(CUcontext, std::uint64_t* free_bytes, std::uint64_t* total_bytes) noexcept override {
    if (m_driver.mem_get_info == nullptr) return false;
    size_t f = 0, t = 0;
    if (m_driver.mem_get_info(&f, &t) != CUDA_SUCCESS) return false;
    *free_bytes = f;
    *total_bytes = t;
    return true;
  }

 private:
  const Driver& m_driver;
};

class RecorderSink final : public EventSink {
 public:
  void record(Action action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept override {
    Recorder::global().record(action, device, addr, size, stream);
  }
  void oom(int device, std::uint64_t requested, std::uint64_t device_free, std::uint64_t device_total,
           std::uint64_t stream) noexcept override {
    Recorder::global().record_oom(device, requested, device_free, device_total, stream);
  }
  void step() noexcept override { Recorder::global().step(); }
  void batch_range_opened() noexcept override { Recorder::global().batch_marks_expected(); }
};

struct State {
  std::atomic<bool> enabled{false};  // callbacks do work
  std::atomic<bool> started{false};  // the recorder was started (or refused)
  std::mutex start_mutex;
  pid_t pid = 0;
  CUpti_SubscriberHandle subscriber = nullptr;
  Config config;
  LaunchInfo launch;
  Driver driver;
  DriverDevices devices{driver};
  RecorderSink sink;
  std::unique_ptr<CallbackMapper> mapper;
};

// Never destroyed: callbacks can arrive while the process tears down.
State* g_state = nullptr;

void not_recorded(const std::string& why) {
  log::write(log::Level::warn, why + "; this run is not recorded, the job goes on");
}

std::string result_text(CUptiResult r) {
  const char* text = nullptr;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || text == nullptr) return "CUPTI error " + std::to_string(r);
  return text;
}

void at_exit() {
  State* s = g_state;
  // A fork child inherits this handler (and a copy of the recorder that is inert there): it does
  // nothing, so it cannot wait on CUPTI or on a lock held by a thread that does not exist.
  if (s == nullptr || getpid() != s->pid) return;
  s->enabled.store(false);
  Recorder::global().stop();
  // Unsubscribing is optional: the driver tears CUPTI down itself. Kept behind a variable so that
  // both paths stay testable (tests/gpu/run.sh runs both).
  const char* v = std::getenv("MEMSNAP_CUPTI_UNSUBSCRIBE");
  if (v != nullptr && std::strcmp(v, "1") == 0) cuptiUnsubscribe(s->subscriber);
}

void in_fork_child() {
  if (g_state != nullptr) g_state->enabled.store(false);
}

// The recorder starts with the first context, when the device name can be asked for (the driver
// is still initialising when InitializeInjection runs).
void start_recording(State& s, CUcontext context) noexcept {
  try {
    std::lock_guard lock(s.start_mutex);
    if (s.started.load()) return;
    RecorderOptions options;
    options.source = "cupti";
    std::uint32_t ordinal = 0;
    CUdevice device = 0;
    char name[256] = {};
    if (context != nullptr && cuptiGetDeviceId(context, &ordinal) == CUPTI_SUCCESS && s.driver.device_get != nullptr &&
        s.driver.device_get(&device, static_cast<int>(ordinal)) == CUDA_SUCCESS && s.driver.device_get_name != nullptr &&
        s.driver.device_get_name(name, sizeof name - 1, device) == CUDA_SUCCESS) {
      options.device_name = name;
    }
    options.trim_modules = {"libmemsnap_cupti", "libcupti", "libcuda.so"};
    const bool ok = Recorder::global().start(s.config, s.launch, options);  // logs its own refusal
    s.started.store(true);
    if (!ok) {
      s.enabled.store(false);
      return;
    }
    // Registered after the recorder's own handler, so it runs first: callbacks stop before the
    // final flush.
    std::atexit(at_exit);
  } catch (...) {
    s.started.store(true);
    s.enabled.store(false);
  }
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata) {
  State* s = g_state;
  if (s == nullptr || cbdata == nullptr || !s->enabled.load(std::memory_order_relaxed)) return;
  switch (domain) {
    case CUPTI_CB_DOMAIN_RESOURCE:
      if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED && !s->started.load(std::memory_order_acquire)) {
        start_recording(*s, static_cast<const CUpti_ResourceData*>(cbdata)->context);
      }
      return;
    case CUPTI_CB_DOMAIN_RUNTIME_API:
    case CUPTI_CB_DOMAIN_DRIVER_API: {
      const auto& data = *static_cast<const CUpti_CallbackData*>(cbdata);
      if (!s->started.load(std::memory_order_acquire) && data.callbackSite == CUPTI_API_EXIT && data.context != nullptr) {
        start_recording(*s, data.context);
      }
      s->mapper->on_api(domain, cbid, data);
      return;
    }
    case CUPTI_CB_DOMAIN_NVTX:
      s->mapper->on_nvtx(cbid, *static_cast<const CUpti_NvtxData*>(cbdata));
      return;
    default:
      return;
  }
}

void initialize() noexcept {
  try {
    const EnvLookup env = process_env();
    auto s = std::make_unique<State>();
    s->launch = detect_launch(env);
    log::set_rank(s->launch.rank);
    // Not loaded, disabled, or MEMSNAP_ENABLED=false from `memsnap run`: no capture at all (the
    // reason is said once per process, by whichever source asks first).
    const std::optional<Config> config = recording_config("", env);
    if (!config) return;
    s->config = *config;
    s->mapper = std::make_unique<CallbackMapper>(s->sink, s->devices, s->config.batch_marker);
    s->driver.load();

    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "memsnap";
    char other[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = {};
    params.oldSubscriberName = other;
    params.oldSubscriberSize = sizeof other;
    g_state = s.get();  // before subscribing; callbacks stay off until `enabled`
    const CUptiResult r = cuptiSubscribe_v2(&s->subscriber, on_callback, nullptr, &params);
    if (r != CUPTI_SUCCESS) {
      g_state = nullptr;
      if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        // CUPTI names the other client where it can ("CUPTI for <not provided>" when it cannot).
        const std::string name = other[0] != '\0' && std::strstr(other, "not provided") == nullptr ? other : "";
        not_recorded("another CUPTI client is attached (" + (name.empty() ? std::string("Nsight, a profiler or a sanitizer") : name) +
                     ")");
      } else {
        not_recorded("CUPTI is not usable here (" + result_text(r) + ")");
      }
      return;
    }
    // Exactly the allocation and range callbacks: whole domains cost 8-25 % of a training step.
    CUptiResult bad = CUPTI_SUCCESS;
    auto enable = [&](CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
      const CUptiResult e = cuptiEnableCallback(1, s->subscriber, domain, cbid);
      if (e != CUPTI_SUCCESS && bad == CUPTI_SUCCESS) bad = e;
    };
    for (auto cbid : CallbackMapper::runtime_cbids()) enable(CUPTI_CB_DOMAIN_RUNTIME_API, cbid);
    for (auto cbid : CallbackMapper::driver_cbids()) enable(CUPTI_CB_DOMAIN_DRIVER_API, cbid);
    for (auto cbid : CallbackMapper::nvtx_cbids()) enable(CUPTI_CB_DOMAIN_NVTX, cbid);
    enable(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    if (bad != CUPTI_SUCCESS) {
      cuptiUnsubscribe(s->subscriber);
      g_state = nullptr;
      not_recorded("cannot enable the CUPTI callbacks (" + result_text(bad) + ")");
      return;
    }
    s->pid = getpid();
    pthread_atfork(nullptr, nullptr, in_fork_child);
    s->enabled.store(true);
    s.release();  // g_state owns it for the life of the process
  } catch (const std::exception& e) {
    g_state = nullptr;
    not_recorded(std::string("cannot start the CUPTI capture: ") + e.what());
  } catch (...) {
    g_state = nullptr;
    not_recorded("cannot start the CUPTI capture");
  }
}

}  // namespace
}  // namespace memsnap::cupti

/// Called by the CUDA driver (once, during cuInit) when CUDA_INJECTION64_PATH names this library.
/// Returns 1 whatever happens: the program runs on, recorded or not.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> called{false};
  if (!called.exchange(true)) memsnap::cupti::initialize();
  return 1;
}

/// Called by the NVTX loader when NVTX_INJECTION64_PATH names this library: NVTX is handed to
/// CUPTI (whose callbacks then see range pushes and pops). Returns CUPTI's verdict; 0 makes NVTX
/// stay a no-op, which is also the answer when CUPTI cannot be found.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(const void* get_export_table) {
  using Init = int (*)(const void*);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuptiSubscribe), &info) == 0 || info.dli_fname == nullptr) return 0;
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return 0;
  auto init = reinterpret_cast<Init>(dlsym(lib, "InitializeInjectionNvtx2"));
  const int ok = init != nullptr ? init(get_export_table) : 0;
  dlclose(lib);  // our own dependency: stays loaded
  return ok;
}
