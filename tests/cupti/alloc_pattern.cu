// A CUDA program with a known allocation pattern over NVTX-marked batches, for the CUPTI capture.
//
// It knows nothing of memsnap. Run it under CUDA_INJECTION64_PATH/NVTX_INJECTION64_PATH (or
// `memsnap run`) with skip_batches 0, interval 3, repeat 1: batches 1-3 form window 3, batches 4-6
// window 6, and a failed 1 TB cudaMalloc in batch 7 an OOM window. With --expect it prints, one
// line each, the events memsnap should have recorded:
//   expect <window> <action> <device> <addr> <size> <stream>
// so that a checker can compare them with the spill. Without a usable GPU it prints one line and
// exits 2 (the CI test checks that this is the same with and without the injection).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

bool g_expect = false;

void expect(int window, const char* action, int device, const void* addr, std::size_t size, cudaStream_t stream) {
  if (!g_expect) return;
  std::printf("expect %d %s %d %llu %llu %llu\n", window, action, device,
              static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(addr)),
              static_cast<unsigned long long>(size),
              static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(stream)));
}

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::printf("alloc_pattern: %s failed: %s\n", #call, cudaGetErrorName(err_));     \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_CU(call)                                                                   \
  do {                                                                                   \
    CUresult err_ = (call);                                                              \
    if (err_ != CUDA_SUCCESS) {                                                          \
      std::printf("alloc_pattern: %s failed: %d\n", #call, static_cast<int>(err_));      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void fill(float* p, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

// The allocation sites a native stack should show (kept out of line).
__attribute__((noinline)) void* allocate_batch_buffer(std::size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  return p;
}
__attribute__((noinline)) void launch_fill(float* p, std::size_t bytes, cudaStream_t s) {
  fill<<<64, 256, 0, s>>>(p, bytes / sizeof(float), 1.0f);
  CHECK(cudaGetLastError());
}

// Driver entry points through the runtime, so the program starts (and fails cleanly) where no
// driver is installed, as CI's machine.
struct Vmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemSetAccess_v10020 set_access;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemAddressFree_v10020 address_free;
  PFN_cuMemAlloc_v3020 mem_alloc;
  PFN_cuMemFree_v3020 mem_free;
};
template <class F>
void entry(const char* name, F& f) {
  cudaDriverEntryPointQueryResult q{};
  void* p = nullptr;
  CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || p == nullptr) {
    std::printf("alloc_pattern: no driver entry point %s\n", name);
    std::exit(1);
  }
  f = reinterpret_cast<F>(p);
}

}  // namespace

int main(int argc, char** argv) {
  bool fork_child = false;
  for (int i = 1; i < argc; ++i) {
    g_expect |= std::strcmp(argv[i], "--expect") == 0;
    fork_child |= std::strcmp(argv[i], "--fork") == 0;
  }
  // A range before CUDA starts: the NVTX injection loads here, with or without a GPU.
  nvtxRangePushA("setup");
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  nvtxRangePop();
  if (probe != cudaSuccess || count == 0) {
    std::printf("alloc_pattern: no usable CUDA device (%s)\n", probe != cudaSuccess ? cudaGetErrorName(probe) : "none");
    return 2;
  }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));  // creates the context; frees nothing
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Window 3: batches 1-3. A grows (kept live until the end), B and C come and go, H is pinned host.
  std::vector<void*> kept;
  std::vector<std::size_t> kept_sizes;
  for (int batch = 1; batch <= 3; ++batch) {
    nvtxRangePushA("step");
    nvtxRangePushA("forward");  // a nested range that is not a batch
    const std::size_t a_bytes = std::size_t{1} << 20 << (batch - 1);  // 1, 2, 4 MiB
    void* a = allocate_batch_buffer(a_bytes);
    expect(3, "alloc", dev, a, a_bytes, nullptr);
    kept.push_back(a);
    kept_sizes.push_back(a_bytes);
    void* b = allocate_batch_buffer(3 << 20);
    expect(3, "alloc", dev, b, 3 << 20, nullptr);
    launch_fill(static_cast<float*>(b), 3 << 20, stream);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaFree(b));
    expect(3, "free_completed", dev, b, 3 << 20, nullptr);
    nvtxRangePop();

    void* c = nullptr;
    CHECK(cudaMallocAsync(&c, 256 << 10, stream));
    expect(3, "alloc", dev, c, 256 << 10, stream);
    launch_fill(static_cast<float*>(c), 256 << 10, stream);
    CHECK(cudaFreeAsync(c, stream));
    expect(3, "free_completed", dev, c, 256 << 10, stream);
    CHECK(cudaStreamSynchronize(stream));

    void* h = nullptr;
    if (batch == 2) {
      CHECK(cudaHostAlloc(&h, 64 << 10, cudaHostAllocDefault));
    } else {
      CHECK(cudaMallocHost(&h, 64 << 10));
    }
    expect(3, "alloc", -1, h, 64 << 10, nullptr);
    CHECK(cudaFreeHost(h));
    expect(3, "free_completed", -1, h, 64 << 10, nullptr);
    nvtxRangePop();  // "step": batch ends
  }

  // Window 6: batches 4-6. Virtual memory (as PyTorch's expandable segments), driver
  // allocations, managed, pitched and pool memory.
  Vmm vmm{};
  entry("cuMemGetAllocationGranularity", vmm.granularity);
  entry("cuMemCreate", vmm.create);
  entry("cuMemAddressReserve", vmm.reserve);
  entry("cuMemMap", vmm.map);
  entry("cuMemSetAccess", vmm.set_access);
  entry("cuMemUnmap", vmm.unmap);
  entry("cuMemRelease", vmm.release);
  entry("cuMemAddressFree", vmm.address_free);
  entry("cuMemAlloc", vmm.mem_alloc);
  entry("cuMemFree", vmm.mem_free);

  nvtxRangePushA("train_step 4");
  {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    std::size_t gran = 0;
    CHECK_CU(vmm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const std::size_t page = gran < (2u << 20) ? (2u << 20) : gran;
    CUdeviceptr base = 0;
    CHECK_CU(vmm.reserve(&base, 4 * page, 0, 0, 0));
    CUmemGenericAllocationHandle h[2];
    for (int i = 0; i < 2; ++i) {
      CHECK_CU(vmm.create(&h[i], page, &prop, 0));
      CHECK_CU(vmm.map(base + i * page, page, 0, h[i], 0));
      expect(6, "segment_map", dev, reinterpret_cast<void*>(base + i * page), page, nullptr);
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(vmm.set_access(base, 2 * page, &access, 1));
    launch_fill(reinterpret_cast<float*>(base), 2 * page, stream);
    CHECK(cudaStreamSynchronize(stream));
    CHECK_CU(vmm.unmap(base, 2 * page));  // one unmap for both mappings
    expect(6, "segment_unmap", dev, reinterpret_cast<void*>(base), page, nullptr);
    expect(6, "segment_unmap", dev, reinterpret_cast<void*>(base + page), page, nullptr);
    for (auto x : h) CHECK_CU(vmm.release(x));
    CHECK_CU(vmm.address_free(base, 4 * page));
  }
  nvtxRangePop();

  // Batch 5 is a start/end range (not a push/pop).
  const nvtxRangeId_t range = nvtxRangeStartA("batch");
  {
    CUdeviceptr d = 0;
    CHECK_CU(vmm.mem_alloc(&d, 512 << 10));
    expect(6, "alloc", dev, reinterpret_cast<void*>(d), 512 << 10, nullptr);
    CHECK_CU(vmm.mem_free(d));
    expect(6, "free_completed", dev, reinterpret_cast<void*>(d), 512 << 10, nullptr);
    void* m = nullptr;
    CHECK(cudaMallocManaged(&m, 1 << 20));
    expect(6, "alloc", dev, m, 1 << 20, nullptr);
    CHECK(cudaFree(m));
    expect(6, "free_completed", dev, m, 1 << 20, nullptr);
  }
  nvtxRangeEnd(range);

  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = "iteration";
  nvtxRangePushEx(&attr);
  {
    void* p = nullptr;
    std::size_t pitch = 0;
    CHECK(cudaMallocPitch(&p, &pitch, 1000, 100));
    expect(6, "alloc", dev, p, pitch * 100, nullptr);
    CHECK(cudaFree(p));
    expect(6, "free_completed", dev, p, pitch * 100, nullptr);
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    void* q = nullptr;
    CHECK(cudaMallocFromPoolAsync(&q, 128 << 10, pool, stream));
    expect(6, "alloc", dev, q, 128 << 10, stream);
    CHECK(cudaFreeAsync(q, stream));
    expect(6, "free_completed", dev, q, 128 << 10, stream);
    CHECK(cudaStreamSynchronize(stream));
  }
  nvtxRangePop();

  // Batch 7: a 1 TB request fails; memsnap writes an OOM window at once.
  void* huge = nullptr;
  const std::size_t tb = std::size_t{1} << 40;
  const cudaError_t oom = cudaMalloc(&huge, tb);
  std::printf("alloc_pattern: 1 TB cudaMalloc -> %s\n", cudaGetErrorName(oom));
  if (oom == cudaErrorMemoryAllocation) expect(7, "oom", dev, nullptr, tb, nullptr);
  (void)cudaGetLastError();

  for (void* a : kept) CHECK(cudaFree(a));
  CHECK(cudaStreamDestroy(stream));
  std::size_t total = 0;
  for (auto s : kept_sizes) total += s;
  std::printf("alloc_pattern: done, %zu bytes kept over window 3\n", total);
  if (fork_child) {
    // A child that exits normally runs the atexit handlers it inherited: memsnap's must not
    // touch CUPTI or the recorder there (nor hang).
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) std::exit(0);
    int status = -1;
    for (int i = 0; i < 200 && waitpid(child, &status, WNOHANG) == 0; ++i) usleep(100 * 1000);
    const bool exited = WIFEXITED(status);
    if (!exited) kill(child, SIGKILL);
    std::printf("alloc_pattern: fork child %s\n", exited ? "exited" : "HUNG (killed after 20 s)");
  }
  return 0;
}
