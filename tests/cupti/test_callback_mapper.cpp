// The CUPTI callback-to-event mapping, fed with synthetic callback records (no GPU needed).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>


#include "callback_mapper.hpp"
#include "cupti_meta.hpp"
#include "memsnap/config.hpp"
#include "memsnap/memsnap.h"
#include "memsnap/recorder.hpp"
#include "memsnap/spill.hpp"
#include "test_util.hpp"

namespace memsnap::cupti {
namespace {

struct Seen {
  std::string what;  // action name, "oom" or "step"
  int device = 0;
  std::uint64_t addr = 0, size = 0, stream = 0, extra = 0;  // extra: device_free for oom
  bool operator==(const Seen&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << s.what << " dev " << s.device << " addr " << s.addr << " size " << s.size << " stream " << s.stream
            << " extra " << s.extra;
}

class FakeSink : public EventSink {
 public:
  void record(Action a, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept override {
    seen.push_back({std::string(action_name(a)), device, addr, size, stream, 0});
  }
  void oom(int device, std::uint64_t requested, std::uint64_t device_free, std::uint64_t, std::uint64_t stream) noexcept override {
    seen.push_back({"oom", device, 0, requested, stream, device_free});
  }
  void step() noexcept override { seen.push_back({"step"}); }
  std::vector<Seen> seen;
};

// Context "handles" are fake pointers: context 0x10 is device 0, 0x11 device 1.
class FakeDevices : public DeviceQuery {
 public:
  int device_of(CUcontext ctx) noexcept override { return static_cast<int>(reinterpret_cast<std::uintptr_t>(ctx) - 0x10); }
  bool memory_info(CUcontext, std::uint64_t* f, std::uint64_t* t) noexcept override {
    ++info_calls;
    *f = 1000;
    *t = 5000;
    return true;
  }
  int info_calls = 0;
};

CUcontext ctx(int device) { return reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(0x10 + device)); }

// Drives one API call through its enter and exit callbacks, like CUPTI does.
class Api {
 public:
  explicit Api(CallbackMapper& m) : m_(m) {}

  template <class Params>
  void enter(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, Params& p, int device = 0) {
    CUpti_CallbackData d = data(CUPTI_API_ENTER, &p, nullptr, device);
    m_.on_api(domain, cbid, d);
  }
  template <class Params>
  void exit(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, Params& p, int result, int device = 0) {
    cudaError_t rt = static_cast<cudaError_t>(result);
    CUresult drv = static_cast<CUresult>(result);
    void* ret = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? static_cast<void*>(&rt) : static_cast<void*>(&drv);
    CUpti_CallbackData d = data(CUPTI_API_EXIT, &p, ret, device);
    m_.on_api(domain, cbid, d);
  }
  template <class Params>
  void call(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, Params& p, int result = 0, int device = 0) {
    enter(domain, cbid, p, device);
    exit(domain, cbid, p, result, device);
  }

 private:
  static CUpti_CallbackData data(CUpti_ApiCallbackSite site, const void* params, void* ret, int device) {
    CUpti_CallbackData d{};
    d.callbackSite = site;
    d.functionName = "test";
    d.functionParams = params;
    d.functionReturnValue = ret;
    d.context = ctx(device);
    return d;
  }
  CallbackMapper& m_;
};

constexpr auto kRuntime = CUPTI_CB_DOMAIN_RUNTIME_API;
constexpr auto kDriver = CUPTI_CB_DOMAIN_DRIVER_API;

class CallbackMapperTest : public ::testing::Test {
 protected:
  FakeSink sink;
  FakeDevices devices;
  CallbackMapper mapper{sink, devices, Config{}.batch_marker};
  Api api{mapper};

  void nvtx(CUpti_CallbackId cbid, const void* params, const void* ret = nullptr) {
    CUpti_NvtxData d{};
    d.functionName = "nvtx";
    d.functionParams = params;
    d.functionReturnValue = ret;
    mapper.on_nvtx(cbid, d);
  }
  void push(const char* name) {
    nvtxRangePushA_params p{name};
    nvtx(CUPTI_CBID_NVTX_nvtxRangePushA, &p);
  }
  void pop() {
    nvtxRangePop_params p{};
    nvtx(CUPTI_CBID_NVTX_nvtxRangePop, &p);
  }
  std::size_t steps() const {
    std::size_t n = 0;
    for (const auto& s : sink.seen) n += s.what == "step";
    return n;
  }
};

TEST_F(CallbackMapperTest, RuntimeOverDriverIsOneEvent) {
  void* ptr = reinterpret_cast<void*>(0x7000'0000);
  cudaMalloc_v3020_params rt{&ptr, 4096};
  CUdeviceptr dptr = 0x7000'0000;
  cuMemAlloc_v2_params drv{&dptr, 4096};
  api.enter(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, rt, 1);
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, drv, 0, 1);  // cudaMalloc's own driver call
  api.exit(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, rt, cudaSuccess, 1);
  cudaFree_v3020_params rfree{ptr};
  cuMemFree_v2_params dfree{dptr};
  api.enter(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, rfree, 1);
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, dfree, 0, 1);
  api.exit(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, rfree, cudaSuccess, 1);
  const std::vector<Seen> want = {{"alloc", 1, 0x7000'0000, 4096, 0, 0}, {"free_completed", 1, 0x7000'0000, 0, 0, 0}};
  EXPECT_EQ(sink.seen, want);
}

TEST_F(CallbackMapperTest, DriverCallAloneIsRecordedAtExit) {
  CUdeviceptr dptr = 0;
  cuMemAlloc_v2_params p{&dptr, 512};
  api.enter(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, p);
  EXPECT_TRUE(sink.seen.empty()) << "nothing is recorded before the call returns";
  dptr = 0xabc000;  // the driver writes the pointer before the exit callback
  api.exit(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, p, CUDA_SUCCESS);
  ASSERT_EQ(sink.seen.size(), 1u);
  EXPECT_EQ(sink.seen[0], (Seen{"alloc", 0, 0xabc000, 512, 0, 0}));
  // After the runtime call above ended, driver calls count again (the depth flag unwinds).
  cuMemFree_v2_params f{0xabc000};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, f);
  EXPECT_EQ(sink.seen.size(), 2u);
}

TEST_F(CallbackMapperTest, AsyncVariantsCarryTheirStream) {
  auto stream = reinterpret_cast<cudaStream_t>(0x5555);
  void* ptr = reinterpret_cast<void*>(0x9000);
  cudaMallocAsync_v11020_params a{&ptr, 100, stream};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020, a);
  cudaMallocAsync_ptsz_v11020_params b{&ptr, 200, stream};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020, b);
  cudaMallocFromPoolAsync_v11020_params c{&ptr, 300, nullptr, stream};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020, c);
  cudaFreeAsync_v11020_params d{ptr, stream};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, d);
  cudaFreeAsync_ptsz_v11020_params e{ptr, stream};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020, e);
  CUdeviceptr dptr = 0xd000;
  cuMemAllocAsync_params f{&dptr, 400, reinterpret_cast<CUstream>(0x6666)};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync, f);
  cuMemFreeAsync_params g{0xd000, reinterpret_cast<CUstream>(0x6666)};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync, g);
  const std::vector<Seen> want = {
      {"alloc", 0, 0x9000, 100, 0x5555, 0},         {"alloc", 0, 0x9000, 200, 0x5555, 0},
      {"alloc", 0, 0x9000, 300, 0x5555, 0},         {"free_completed", 0, 0x9000, 0, 0x5555, 0},
      {"free_completed", 0, 0x9000, 0, 0x5555, 0},  {"alloc", 0, 0xd000, 400, 0x6666, 0},
      {"free_completed", 0, 0xd000, 0, 0x6666, 0},
  };
  EXPECT_EQ(sink.seen, want);
}

TEST_F(CallbackMapperTest, HostPinnedMemoryIsTheHostDevice) {
  void* h = reinterpret_cast<void*>(0x1234000);
  cudaMallocHost_v3020_params a{&h, 64};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, a, cudaSuccess, 1);
  cudaHostAlloc_v3020_params b{&h, 128, 0};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020, b, cudaSuccess, 1);
  cudaFreeHost_v3020_params c{h};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020, c, cudaSuccess, 1);
  cuMemHostAlloc_params d{&h, 256, 0};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc, d, CUDA_SUCCESS, 1);
  cuMemAllocHost_v2_params e{&h, 512};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2, e, CUDA_SUCCESS, 1);
  cuMemFreeHost_params f{h};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost, f, CUDA_SUCCESS, 1);
  ASSERT_EQ(sink.seen.size(), 6u);
  for (const auto& s : sink.seen) EXPECT_EQ(s.device, MEMSNAP_HOST_DEVICE) << s;
  EXPECT_EQ(sink.seen[1].size, 128u);
  EXPECT_EQ(sink.seen[2].what, "free_completed");
}

TEST_F(CallbackMapperTest, PitchAnd3DSizesComeFromThePitch) {
  void* p = reinterpret_cast<void*>(0x100000);
  std::size_t pitch = 1024;  // what the runtime chose for a 1000-byte row
  cudaMallocPitch_v3020_params a{&p, &pitch, 1000, 10};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020, a);
  cudaPitchedPtr pp{reinterpret_cast<void*>(0x200000), 512, 500, 4};
  cudaMalloc3D_v3020_params b{&pp, cudaExtent{500, 4, 3}};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020, b);
  ASSERT_EQ(sink.seen.size(), 2u);
  EXPECT_EQ(sink.seen[0].size, 10240u);
  EXPECT_EQ(sink.seen[1], (Seen{"alloc", 0, 0x200000, 512 * 4 * 3, 0, 0}));
}

TEST_F(CallbackMapperTest, VirtualMemoryMapsAreSegmentsAndUnmapEndsEachMapping) {
  cuMemMap_params m1{0x10000000, 2 << 20, 0, 1, 0};
  cuMemMap_params m2{0x10200000, 2 << 20, 0, 2, 0};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemMap, m1, CUDA_SUCCESS, 1);
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemMap, m2, CUDA_SUCCESS, 1);
  // One unmap over both mappings (allowed by CUDA) ends each with its own size and device,
  // whatever context is current then.
  cuMemUnmap_params u{0x10000000, 4 << 20};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, u, CUDA_SUCCESS, 0);
  // An unmap of a range mapped before recording began keeps the size it names.
  cuMemUnmap_params v{0x20000000, 6 << 20};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, v, CUDA_SUCCESS, 0);
  const std::vector<Seen> want = {
      {"segment_map", 1, 0x10000000, 2 << 20, 0, 0},   {"segment_map", 1, 0x10200000, 2 << 20, 0, 0},
      {"segment_unmap", 1, 0x10000000, 2 << 20, 0, 0}, {"segment_unmap", 1, 0x10200000, 2 << 20, 0, 0},
      {"segment_unmap", 0, 0x20000000, 6 << 20, 0, 0},
  };
  EXPECT_EQ(sink.seen, want);
  // cuMemCreate succeeding is physical memory without an address: no event of its own.
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop{};
  cuMemCreate_params c{&h, 2 << 20, &prop, 0};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemCreate, c);
  EXPECT_EQ(sink.seen.size(), want.size());
}

TEST_F(CallbackMapperTest, OutOfMemoryIsAnOomWithDeviceMemoryInfo) {
  void* p = nullptr;
  cudaMalloc_v3020_params a{&p, std::size_t{1} << 40};
  CUdeviceptr d = 0;
  cuMemAlloc_v2_params nested{&d, std::size_t{1} << 40};
  api.enter(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, a, 1);
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, nested, CUDA_ERROR_OUT_OF_MEMORY, 1);
  api.exit(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, a, cudaErrorMemoryAllocation, 1);
  ASSERT_EQ(sink.seen.size(), 1u) << "one OOM for the runtime call, none for its driver call";
  EXPECT_EQ(sink.seen[0], (Seen{"oom", 1, 0, std::size_t{1} << 40, 0, 1000}));
  EXPECT_EQ(devices.info_calls, 1);

  // A VMM cuMemCreate that fails names its device from the allocation properties.
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 3;
  cuMemCreate_params c{&h, 20 << 20, &prop, 0};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemCreate, c, CUDA_ERROR_OUT_OF_MEMORY, 0);
  ASSERT_EQ(sink.seen.size(), 2u);
  EXPECT_EQ(sink.seen[1], (Seen{"oom", 3, 0, 20 << 20, 0, 1000}));

  // Pinned host memory that cannot be had is an OOM of the host device, without device info.
  void* hp = nullptr;
  cudaHostAlloc_v3020_params ha{&hp, 999, 0};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020, ha, cudaErrorMemoryAllocation);
  ASSERT_EQ(sink.seen.size(), 3u);
  EXPECT_EQ(sink.seen[2], (Seen{"oom", MEMSNAP_HOST_DEVICE, 0, 999, 0, 0}));
}

TEST_F(CallbackMapperTest, OtherFailuresAndNullFreesRecordNothing) {
  void* p = reinterpret_cast<void*>(0x4000);
  cudaMalloc_v3020_params a{&p, 100};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, a, cudaErrorInvalidValue);
  cudaFree_v3020_params f{p};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, f, cudaErrorInvalidDevicePointer);
  cudaFree_v3020_params null_free{nullptr};  // cudaFree(0): the context-creation idiom
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, null_free);
  cuMemUnmap_params u{0x1000, 4096};
  api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, u, CUDA_ERROR_INVALID_VALUE);
  EXPECT_TRUE(sink.seen.empty());
  EXPECT_EQ(devices.info_calls, 0);
}

TEST_F(CallbackMapperTest, PoppingABatchRangeEndsTheBatch) {
  push("step");
  push("forward");  // nested, not a batch
  pop();
  EXPECT_EQ(steps(), 0u);
  pop();
  EXPECT_EQ(steps(), 1u);
  push("optimizer");
  pop();
  EXPECT_EQ(steps(), 1u);
  // A pop with nothing pushed (the push came before memsnap subscribed) ends nothing.
  pop();
  EXPECT_EQ(steps(), 1u);

  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = "train_step 7";
  nvtxRangePushEx_params ex{&attr};
  nvtx(CUPTI_CBID_NVTX_nvtxRangePushEx, &ex);
  pop();
  EXPECT_EQ(steps(), 2u);

  // Domain ranges pair with pops of the same domain.
  auto domain = reinterpret_cast<nvtxDomainHandle_t>(0x77);
  nvtxDomainRangePushEx_params dpush{domain, {&attr}};
  nvtx(CUPTI_CBID_NVTX_nvtxDomainRangePushEx, &dpush);
  push("forward");
  nvtxDomainRangePop_params dpop{domain};
  nvtx(CUPTI_CBID_NVTX_nvtxDomainRangePop, &dpop);
  EXPECT_EQ(steps(), 3u);
  pop();  // "forward"
  EXPECT_EQ(steps(), 3u);

  // Start/end ranges are matched by id, on any thread.
  nvtxRangeStartA_params s1{"batch"};
  nvtxRangeId_t id1 = 41, id2 = 42;
  nvtx(CUPTI_CBID_NVTX_nvtxRangeStartA, &s1, &id1);
  nvtxRangeStartA_params s2{"data loading"};
  nvtx(CUPTI_CBID_NVTX_nvtxRangeStartA, &s2, &id2);
  nvtxRangeEnd_params e2{id2};
  nvtx(CUPTI_CBID_NVTX_nvtxRangeEnd, &e2);
  EXPECT_EQ(steps(), 3u);
  nvtxRangeEnd_params e1{id1};
  nvtx(CUPTI_CBID_NVTX_nvtxRangeEnd, &e1);
  EXPECT_EQ(steps(), 4u);
  nvtx(CUPTI_CBID_NVTX_nvtxRangeEnd, &e1);  // ended twice: once only
  EXPECT_EQ(steps(), 4u);
}

TEST_F(CallbackMapperTest, DefaultBatchMarkerNames) {
  for (const char* yes : {"step", "Step", "batch", "train_step", "train_step 3", "iteration#2", "ITER_10", "train.batch"}) {
    EXPECT_TRUE(mapper.is_batch_marker(yes)) << yes;
  }
  for (const char* no : {"stepper", "forward", "optimizer.step", "", "train", "batch_norm"}) {
    EXPECT_FALSE(mapper.is_batch_marker(no)) << no;
  }
  FakeSink other_sink;
  CallbackMapper custom(other_sink, devices, "^fwd-bwd$");
  EXPECT_TRUE(custom.is_batch_marker("fwd-bwd"));
  EXPECT_FALSE(custom.is_batch_marker("step"));
}

TEST_F(CallbackMapperTest, EnablesExactlyTheCallbacksItHandles) {
  // Every id it enables maps to something; none is a whole domain.
  EXPECT_EQ(CallbackMapper::runtime_cbids().size(), 14u);
  EXPECT_EQ(CallbackMapper::driver_cbids().size(), 19u);
  EXPECT_EQ(CallbackMapper::nvtx_cbids().size(), 12u);
  for (auto cbid : CallbackMapper::runtime_cbids()) {
    EXPECT_LT(cbid, static_cast<CUpti_CallbackId>(CUPTI_RUNTIME_TRACE_CBID_SIZE));
  }
  for (auto cbid : CallbackMapper::driver_cbids()) {
    EXPECT_LT(cbid, static_cast<CUpti_CallbackId>(CUPTI_DRIVER_TRACE_CBID_SIZE));
  }
}

// The mapping through a real Recorder into a spill: sizes of frees come from their allocations,
// batches from NVTX, an OOM writes its window at once.
class ToRecorder : public EventSink {
 public:
  explicit ToRecorder(Recorder& r) : r_(r) {}
  void record(Action a, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream) noexcept override {
    r_.record(a, device, addr, size, stream);
  }
  void oom(int device, std::uint64_t requested, std::uint64_t f, std::uint64_t t, std::uint64_t stream) noexcept override {
    r_.record_oom(device, requested, f, t, stream);
  }
  void step() noexcept override { r_.step(); }

 private:
  Recorder& r_;
};

TEST(CuptiRecorderTest, SpillHoldsTheMappedHistory) {
  test::TempDir dir;
  Config config;
  config.folder = (dir / "run").string();
  config.skip_batches = 0;
  config.interval = 2;
  Recorder recorder;
  RecorderOptions options;
  options.source = "cupti";
  options.device_name = "Fake GPU";
  ASSERT_TRUE(recorder.start(config, LaunchInfo{}, options));
  ToRecorder sink(recorder);
  FakeDevices devices;
  CallbackMapper mapper(sink, devices, config.batch_marker);
  Api api(mapper);
  auto nvtx_push = [&](const char* name) {
    nvtxRangePushA_params p{name};
    CUpti_NvtxData d{"nvtxRangePushA", &p, nullptr};
    mapper.on_nvtx(CUPTI_CBID_NVTX_nvtxRangePushA, d);
  };
  auto nvtx_pop = [&] {
    nvtxRangePop_params p{};
    CUpti_NvtxData d{"nvtxRangePop", &p, nullptr};
    mapper.on_nvtx(CUPTI_CBID_NVTX_nvtxRangePop, d);
  };

  for (int batch = 1; batch <= 2; ++batch) {
    nvtx_push("step");
    void* p = reinterpret_cast<void*>(0x100000 * batch);
    cudaMalloc_v3020_params a{&p, 1000u * batch};
    api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, a);
    cudaFree_v3020_params f{p};
    api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, f);
    cuMemMap_params m{0x900000, 2 << 20, 0, 1, 0};
    api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemMap, m);
    cuMemUnmap_params u{0x900000, 2 << 20};
    api.call(kDriver, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, u);
    nvtx_pop();
  }
  // Batch 3, outside the window: a failed allocation writes an OOM window at once.
  void* none = nullptr;
  cudaMalloc_v3020_params big{&none, std::size_t{1} << 40};
  api.call(kRuntime, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, big, cudaErrorMemoryAllocation);
  const auto stats = recorder.stats();
  recorder.stop();

  const RankRecord r = read_spill(stats.spill_path);
  EXPECT_EQ(r.meta.source, "cupti");
  EXPECT_EQ(r.meta.device_name, "Fake GPU");
  ASSERT_EQ(r.windows.size(), 2u);
  const WindowRecord& w = r.windows[0];
  EXPECT_EQ(w.batch_start, 1);
  EXPECT_EQ(w.batch_end, 2);
  EXPECT_FALSE(w.oom);
  ASSERT_EQ(w.events.size(), 8u);
  EXPECT_EQ(w.events[0].action, Action::alloc);
  EXPECT_EQ(w.events[1].action, Action::free_completed);
  EXPECT_EQ(w.events[1].size, 1000u) << "the free carries its allocation's size";
  EXPECT_EQ(w.events[2].action, Action::segment_map);
  EXPECT_EQ(w.events[3].action, Action::segment_unmap);
  EXPECT_EQ(w.events[3].size, 2u << 20);
  EXPECT_EQ(w.events[5].size, 2000u);
  const WindowRecord& oom = r.windows[1];
  EXPECT_TRUE(oom.oom);
  EXPECT_EQ(oom.batch_end, 3);
  ASSERT_EQ(oom.events.size(), 1u);
  EXPECT_EQ(oom.events[0].action, Action::oom);
  EXPECT_EQ(oom.events[0].size, std::uint64_t{1} << 40);
  EXPECT_EQ(oom.events[0].addr, 1000u) << "the device's free bytes at the failure";
}

}  // namespace
}  // namespace memsnap::cupti
