// From CUPTI callbacks to allocator events (see callback_mapper.hpp for the rules).
#include "callback_mapper.hpp"
#include "cupti_meta.hpp"

#include <string>
#include <utility>
#include <vector>


#include "memsnap/memsnap.h"

namespace memsnap::cupti {

namespace {

// Depth of subscribed runtime calls on this thread: a driver callback inside one is the same
// allocation seen again (cudaMalloc -> cuMemAlloc_v2) and is skipped.
thread_local int t_runtime_depth = 0;

// NVTX ranges pushed on this thread and not yet popped: (domain, name matched batch_marker).
// Every push is kept, matching or not, so that pops pair with the right push.
struct PushedRange {
  const void* domain;
  bool matches;
};
constexpr std::size_t kMaxPushed = 4096;
thread_local std::vector<PushedRange> t_pushed;
thread_local std::size_t t_pushed_overflow = 0;  // pushes beyond kMaxPushed, popped first

enum class Op : std::uint8_t { alloc, free, map, unmap, create };

constexpr CUpti_CallbackId kRuntimeCbids[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000,
    CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020,
};

constexpr CUpti_CallbackId kDriverCbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc,
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemFree,
    CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost,
    CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    CUPTI_DRIVER_TRACE_CBID_cuMemMap,
    CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
};

constexpr CUpti_CallbackId kNvtxCbids[] = {
    CUPTI_CBID_NVTX_nvtxRangePushA,        CUPTI_CBID_NVTX_nvtxRangePushW,
    CUPTI_CBID_NVTX_nvtxRangePushEx,       CUPTI_CBID_NVTX_nvtxRangePop,
    CUPTI_CBID_NVTX_nvtxDomainRangePushEx, CUPTI_CBID_NVTX_nvtxDomainRangePop,
    CUPTI_CBID_NVTX_nvtxRangeStartA,       CUPTI_CBID_NVTX_nvtxRangeStartW,
    CUPTI_CBID_NVTX_nvtxRangeStartEx,      CUPTI_CBID_NVTX_nvtxRangeEnd,
    CUPTI_CBID_NVTX_nvtxDomainRangeStartEx, CUPTI_CBID_NVTX_nvtxDomainRangeEnd,
};

template <class T>
std::uint64_t out_ptr(T** p, bool ok) {
  return ok && p != nullptr ? reinterpret_cast<std::uint64_t>(*p) : 0;
}
std::uint64_t out_dptr(const CUdeviceptr* p, bool ok) { return ok && p != nullptr ? *p : 0; }
std::uint64_t handle(const void* stream) { return reinterpret_cast<std::uint64_t>(stream); }

// The name of an NVTX event: ASCII only (wide and registered strings never match).
const char* ascii_message(const nvtxEventAttributes_t* attr) {
  if (attr == nullptr || attr->messageType != NVTX_MESSAGE_TYPE_ASCII) return nullptr;
  return attr->message.ascii;
}

}  // namespace

struct CallbackMapper::Call {
  Op op = Op::alloc;
  bool host = false;
  std::uint64_t addr = 0;  // the returned (alloc, map) or passed (free, unmap) address
  std::uint64_t size = 0;  // requested bytes
  std::uint64_t stream = 0;
  int device = -2;         // known from the call itself (cuMemCreate's location), else -2
};

std::span<const CUpti_CallbackId> CallbackMapper::runtime_cbids() noexcept {
  return kRuntimeCbids;
}
std::span<const CUpti_CallbackId> CallbackMapper::driver_cbids() noexcept {
  return kDriverCbids;
}
std::span<const CUpti_CallbackId> CallbackMapper::nvtx_cbids() noexcept { return kNvtxCbids; }

namespace {
std::regex compile_marker(std::string_view pattern) {
  std::regex::flag_type flags = std::regex::ECMAScript | std::regex::optimize | std::regex::nosubs;
  std::string text(pattern);
  if (text.rfind("(?i)", 0) == 0) {
    text = text.substr(4);
    flags |= std::regex::icase;
  }
  return std::regex(text, flags);
}

// Decodes a subscribed runtime call. `ok`: the call succeeded, so output pointers are valid.
bool decode_runtime(CUpti_CallbackId cbid, const void* params, bool ok, Op& op, bool& host, std::uint64_t& addr,
                    std::uint64_t& size, std::uint64_t& stream) {
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: {
      auto* p = static_cast<const cudaMalloc_v3020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->devPtr, ok), size = p->size;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020: {
      auto* p = static_cast<const cudaMallocPitch_v3020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->devPtr, ok);
      size = (ok && p->pitch != nullptr ? *p->pitch : p->width) * p->height;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020: {
      auto* p = static_cast<const cudaMalloc3D_v3020_params*>(params);
      const auto& e = p->extent;
      const std::uint64_t depth = e.depth == 0 ? 1 : e.depth, height = e.height == 0 ? 1 : e.height;
      op = Op::alloc;
      addr = ok && p->pitchedDevPtr != nullptr ? reinterpret_cast<std::uint64_t>(p->pitchedDevPtr->ptr) : 0;
      size = (ok && p->pitchedDevPtr != nullptr ? p->pitchedDevPtr->pitch : e.width) * height * depth;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000: {
      auto* p = static_cast<const cudaMallocManaged_v6000_params*>(params);
      op = Op::alloc, addr = out_ptr(p->devPtr, ok), size = p->size;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020: {
      auto* p = static_cast<const cudaFree_v3020_params*>(params);
      op = Op::free, addr = reinterpret_cast<std::uint64_t>(p->devPtr);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020: {
      auto* p = static_cast<const cudaMallocAsync_v11020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->devPtr, ok), size = p->size, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020: {
      auto* p = static_cast<const cudaMallocAsync_ptsz_v11020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->devPtr, ok), size = p->size, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020: {
      auto* p = static_cast<const cudaMallocFromPoolAsync_v11020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->ptr, ok), size = p->size, stream = handle(p->stream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020: {
      auto* p = static_cast<const cudaMallocFromPoolAsync_ptsz_v11020_params*>(params);
      op = Op::alloc, addr = out_ptr(p->ptr, ok), size = p->size, stream = handle(p->stream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020: {
      auto* p = static_cast<const cudaFreeAsync_v11020_params*>(params);
      op = Op::free, addr = reinterpret_cast<std::uint64_t>(p->devPtr), stream = handle(p->hStream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020: {
      auto* p = static_cast<const cudaFreeAsync_ptsz_v11020_params*>(params);
      op = Op::free, addr = reinterpret_cast<std::uint64_t>(p->devPtr), stream = handle(p->hStream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020: {
      auto* p = static_cast<const cudaMallocHost_v3020_params*>(params);
      op = Op::alloc, host = true, addr = out_ptr(p->ptr, ok), size = p->size;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020: {
      auto* p = static_cast<const cudaHostAlloc_v3020_params*>(params);
      op = Op::alloc, host = true, addr = out_ptr(p->pHost, ok), size = p->size;
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020: {
      auto* p = static_cast<const cudaFreeHost_v3020_params*>(params);
      op = Op::free, host = true, addr = reinterpret_cast<std::uint64_t>(p->ptr);
      return true;
    }
    default:
      return false;
  }
}

bool decode_driver(CUpti_CallbackId cbid, const void* params, bool ok, Op& op, bool& host, std::uint64_t& addr,
                   std::uint64_t& size, std::uint64_t& stream, int& device) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc: {
      auto* p = static_cast<const cuMemAlloc_params*>(params);
      op = Op::alloc, addr = ok && p->dptr != nullptr ? *p->dptr : 0, size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
      auto* p = static_cast<const cuMemAlloc_v2_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
      auto* p = static_cast<const cuMemAllocPitch_v2_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok);
      size = (ok && p->pPitch != nullptr ? *p->pPitch : p->WidthInBytes) * p->Height;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree: {
      op = Op::free, addr = static_cast<const cuMemFree_params*>(params)->dptr;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2: {
      op = Op::free, addr = static_cast<const cuMemFree_v2_params*>(params)->dptr;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
      auto* p = static_cast<const cuMemAllocManaged_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync: {
      auto* p = static_cast<const cuMemAllocAsync_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
      auto* p = static_cast<const cuMemAllocAsync_ptsz_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync: {
      auto* p = static_cast<const cuMemAllocFromPoolAsync_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz: {
      auto* p = static_cast<const cuMemAllocFromPoolAsync_ptsz_params*>(params);
      op = Op::alloc, addr = out_dptr(p->dptr, ok), size = p->bytesize, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync: {
      auto* p = static_cast<const cuMemFreeAsync_params*>(params);
      op = Op::free, addr = p->dptr, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz: {
      auto* p = static_cast<const cuMemFreeAsync_ptsz_params*>(params);
      op = Op::free, addr = p->dptr, stream = handle(p->hStream);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost: {
      auto* p = static_cast<const cuMemAllocHost_params*>(params);
      op = Op::alloc, host = true, addr = out_ptr(p->pp, ok), size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2: {
      auto* p = static_cast<const cuMemAllocHost_v2_params*>(params);
      op = Op::alloc, host = true, addr = out_ptr(p->pp, ok), size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc: {
      auto* p = static_cast<const cuMemHostAlloc_params*>(params);
      op = Op::alloc, host = true, addr = out_ptr(p->pp, ok), size = p->bytesize;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost: {
      op = Op::free, host = true, addr = reinterpret_cast<std::uint64_t>(static_cast<const cuMemFreeHost_params*>(params)->p);
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: {
      auto* p = static_cast<const cuMemCreate_params*>(params);
      op = Op::create, size = p->size;
      if (p->prop != nullptr && p->prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) device = p->prop->location.id;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
      auto* p = static_cast<const cuMemMap_params*>(params);
      op = Op::map, addr = p->ptr, size = p->size;
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
      auto* p = static_cast<const cuMemUnmap_params*>(params);
      op = Op::unmap, addr = p->ptr, size = p->size;
      return true;
    }
    default:
      return false;
  }
}
}  // namespace

CallbackMapper::CallbackMapper(EventSink& sink, DeviceQuery& devices, std::string_view batch_marker)
    : m_sink(sink), m_devices(devices), m_marker(compile_marker(batch_marker)) {}

bool CallbackMapper::is_batch_marker(std::string_view name) const noexcept {
  try {
    return std::regex_search(name.begin(), name.end(), m_marker);
  } catch (...) {
    return false;  // std::regex_error (complexity) on a pathological name
  }
}

void CallbackMapper::on_api(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const CUpti_CallbackData& data) noexcept {
  const bool enter = data.callbackSite == CUPTI_API_ENTER;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (enter) {
      ++t_runtime_depth;
      return;
    }
    if (t_runtime_depth > 0) --t_runtime_depth;
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    if (enter || t_runtime_depth > 0) return;
  } else {
    return;
  }
  if (data.functionParams == nullptr || data.functionReturnValue == nullptr) return;
  // cudaSuccess and CUDA_SUCCESS are 0; cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are 2.
  const int result = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? static_cast<int>(*static_cast<cudaError_t*>(data.functionReturnValue))
                                                           : static_cast<int>(*static_cast<CUresult*>(data.functionReturnValue));
  static_assert(cudaErrorMemoryAllocation == 2 && CUDA_ERROR_OUT_OF_MEMORY == 2);
  const bool ok = result == 0;
  const bool out_of_memory = result == 2;
  if (!ok && !out_of_memory) return;
  Call call;
  const bool known = domain == CUPTI_CB_DOMAIN_RUNTIME_API
                         ? decode_runtime(cbid, data.functionParams, ok, call.op, call.host, call.addr, call.size, call.stream)
                         : decode_driver(cbid, data.functionParams, ok, call.op, call.host, call.addr, call.size, call.stream,
                                         call.device);
  if (known) handle_exit(call, data, ok, out_of_memory);
}

void CallbackMapper::handle_exit(const Call& c, const CUpti_CallbackData& data, bool ok, bool out_of_memory) noexcept {
  if (out_of_memory) {
    if (c.op != Op::alloc && c.op != Op::create) return;
    if (c.host) {
      m_sink.oom(MEMSNAP_HOST_DEVICE, c.size, 0, 0, c.stream);
      return;
    }
    const int device = c.device >= 0 ? c.device : m_devices.device_of(data.context);
    std::uint64_t free_bytes = 0, total_bytes = 0;
    if (!m_devices.memory_info(data.context, &free_bytes, &total_bytes)) free_bytes = total_bytes = 0;
    m_sink.oom(device, c.size, free_bytes, total_bytes, c.stream);
    return;
  }
  if (!ok) return;
  switch (c.op) {
    case Op::alloc:
      if (c.addr == 0) return;
      m_sink.record(Action::alloc, c.host ? MEMSNAP_HOST_DEVICE : m_devices.device_of(data.context), c.addr, c.size,
                    c.stream);
      return;
    case Op::free:
      // The size is the allocation's; the recorder knows it from the alloc (0 here).
      if (c.addr == 0) return;
      m_sink.record(Action::free_completed, c.host ? MEMSNAP_HOST_DEVICE : m_devices.device_of(data.context), c.addr,
                    0, c.stream);
      return;
    case Op::map: {
      const int device = m_devices.device_of(data.context);
      try {
        std::lock_guard lock(m_mutex);
        m_mappings[c.addr] = Mapping{c.size, device};
      } catch (...) {
      }
      m_sink.record(Action::segment_map, device, c.addr, c.size, 0);
      return;
    }
    case Op::unmap: {
      // One unmap may cover several mappings (each its own handle): end each one.
      std::vector<std::pair<std::uint64_t, Mapping>> ended;
      try {
        std::lock_guard lock(m_mutex);
        auto it = m_mappings.lower_bound(c.addr);
        while (it != m_mappings.end() && it->first < c.addr + c.size) {
          ended.emplace_back(it->first, it->second);
          it = m_mappings.erase(it);
        }
      } catch (...) {
      }
      if (ended.empty()) {
        m_sink.record(Action::segment_unmap, m_devices.device_of(data.context), c.addr, c.size, 0);
      }
      for (const auto& [addr, m] : ended) m_sink.record(Action::segment_unmap, m.device, addr, m.size, 0);
      return;
    }
    case Op::create:
      return;  // physical memory without an address; its mapping is the segment
  }
}

void CallbackMapper::range_pushed(const void* domain, bool matches) noexcept {
  if (matches) m_sink.batch_range_opened();
  try {
    if (t_pushed.size() >= kMaxPushed) {
      ++t_pushed_overflow;
      return;
    }
    t_pushed.push_back(PushedRange{domain, matches});
  } catch (...) {
    ++t_pushed_overflow;
  }
}

void CallbackMapper::range_popped(const void* domain) noexcept {
  if (t_pushed_overflow > 0) {
    --t_pushed_overflow;
    return;
  }
  for (auto it = t_pushed.rbegin(); it != t_pushed.rend(); ++it) {
    if (it->domain != domain) continue;
    const bool matches = it->matches;
    t_pushed.erase(std::next(it).base());
    if (matches) m_sink.step();
    return;
  }
}

void CallbackMapper::on_nvtx(CUpti_CallbackId cbid, const CUpti_NvtxData& data) noexcept {
  const void* params = data.functionParams;
  auto named = [&](const char* name) { return name != nullptr && is_batch_marker(name); };
  auto started = [&](bool matches) {
    if (!matches || data.functionReturnValue == nullptr) return;
    m_sink.batch_range_opened();
    const auto id = *static_cast<const nvtxRangeId_t*>(data.functionReturnValue);
    try {
      std::lock_guard lock(m_mutex);
      m_open_ranges.insert(id);
    } catch (...) {
    }
  };
  auto ended = [&](nvtxRangeId_t id) {
    bool matched = false;
    try {
      std::lock_guard lock(m_mutex);
      matched = m_open_ranges.erase(id) > 0;
    } catch (...) {
    }
    if (matched) m_sink.step();
  };
  if (params == nullptr && cbid != CUPTI_CBID_NVTX_nvtxRangePop) return;
  switch (cbid) {
    case CUPTI_CBID_NVTX_nvtxRangePushA:
      range_pushed(nullptr, named(static_cast<const nvtxRangePushA_params*>(params)->message));
      return;
    case CUPTI_CBID_NVTX_nvtxRangePushW:
      range_pushed(nullptr, false);
      return;
    case CUPTI_CBID_NVTX_nvtxRangePushEx:
      range_pushed(nullptr, named(ascii_message(static_cast<const nvtxRangePushEx_params*>(params)->eventAttrib)));
      return;
    case CUPTI_CBID_NVTX_nvtxDomainRangePushEx: {
      auto* p = static_cast<const nvtxDomainRangePushEx_params*>(params);
      range_pushed(p->domain, named(ascii_message(p->core.eventAttrib)));
      return;
    }
    case CUPTI_CBID_NVTX_nvtxRangePop:
      range_popped(nullptr);
      return;
    case CUPTI_CBID_NVTX_nvtxDomainRangePop:
      range_popped(static_cast<const nvtxDomainRangePop_params*>(params)->domain);
      return;
    case CUPTI_CBID_NVTX_nvtxRangeStartA:
      started(named(static_cast<const nvtxRangeStartA_params*>(params)->message));
      return;
    case CUPTI_CBID_NVTX_nvtxRangeStartEx:
      started(named(ascii_message(static_cast<const nvtxRangeStartEx_params*>(params)->eventAttrib)));
      return;
    case CUPTI_CBID_NVTX_nvtxDomainRangeStartEx:
      started(named(ascii_message(static_cast<const nvtxDomainRangeStartEx_params*>(params)->core.eventAttrib)));
      return;
    case CUPTI_CBID_NVTX_nvtxRangeEnd:
      ended(static_cast<const nvtxRangeEnd_params*>(params)->id);
      return;
    case CUPTI_CBID_NVTX_nvtxDomainRangeEnd:
      ended(static_cast<const nvtxDomainRangeEnd_params*>(params)->core.id);
      return;
    default:
      return;
  }
}

}  // namespace memsnap::cupti
