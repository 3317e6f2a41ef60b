// A program that is itself a CUPTI client (as Nsight, torch.profiler or a sanitizer are): it
// subscribes before CUDA starts. Under memsnap's injection, memsnap must step aside with one line
// and the program's own callbacks must keep working. Built and run by tests/gpu/run.sh.
#include <cuda_runtime.h>
#include <cupti.h>

#include <cstdio>

namespace {
int g_mallocs = 0;
void CUPTIAPI count(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  if (static_cast<const CUpti_CallbackData*>(data)->callbackSite == CUPTI_API_EXIT) ++g_mallocs;
}
}  // namespace

int main() {
  CUpti_SubscriberHandle sub;
  if (cuptiSubscribe(&sub, count, nullptr) != CUPTI_SUCCESS) {
    std::printf("second_subscriber: own cuptiSubscribe failed\n");
    return 1;
  }
  cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020);
  void* p = nullptr;
  for (int i = 0; i < 3; ++i) {
    if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return 2;
    cudaFree(p);
  }
  std::printf("second_subscriber: own callbacks saw %d cudaMalloc calls\n", g_mallocs);
  cuptiUnsubscribe(sub);
  return g_mallocs == 3 ? 0 : 3;
}
