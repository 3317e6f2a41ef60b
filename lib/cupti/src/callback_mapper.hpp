// From CUPTI callbacks to allocator events: which callback means which Recorder call.
//
// The mapping is kept apart from CUPTI itself (subscription, the driver) so that tests can feed it
// synthetic callback records. It decides:
//   - one event per allocation however many API layers it passes: a runtime call (cudaMalloc)
//     marks its thread, and the driver calls it makes (cuMemAlloc_v2) are skipped;
//   - events are taken at API exit, from the returned pointer, and only for calls that succeeded;
//     an allocation that failed with out-of-memory becomes an OOM;
//   - host pinned memory is device MEMSNAP_HOST_DEVICE (-1);
//   - virtual-memory mappings (cuMemMap/cuMemUnmap) are segments, and an unmap of a range that
//     holds several mappings ends each of them with the size it was mapped with;
//   - the pop (or end) of an NVTX range whose name matches `batch_marker` ends a batch.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <regex>
#include <span>
#include <string_view>
#include <unordered_set>

#include <cupti_callbacks.h>

#include "memsnap/event.hpp"

namespace memsnap::cupti {

/// Where mapped events go: the process's Recorder in the injection, a fake in tests.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void record(Action action, int device, std::uint64_t addr, std::uint64_t size,
                      std::uint64_t stream) noexcept = 0;
  virtual void oom(int device, std::uint64_t requested, std::uint64_t device_free, std::uint64_t device_total,
                   std::uint64_t stream) noexcept = 0;
  virtual void step() noexcept = 0;
  /// A range matching batch_marker was opened: batches are marked explicitly in this process.
  virtual void batch_range_opened() noexcept {}
};

/// What the mapper asks the driver about: called from inside callbacks.
class DeviceQuery {
 public:
  virtual ~DeviceQuery() = default;
  /// The device ordinal of a context (the one current to the calling thread when `context` is null).
  virtual int device_of(CUcontext context) noexcept = 0;
  /// Free and total bytes of the current context's device; false when they cannot be read.
  virtual bool memory_info(CUcontext context, std::uint64_t* free_bytes, std::uint64_t* total_bytes) noexcept = 0;
};

class CallbackMapper {
 public:
  /// `batch_marker`: ECMAScript regex searched in NVTX range names; a leading "(?i)" ignores case.
  /// Throws std::regex_error for a bad pattern (the config loader already rejects those).
  CallbackMapper(EventSink& sink, DeviceQuery& devices, std::string_view batch_marker);
  CallbackMapper(const CallbackMapper&) = delete;
  CallbackMapper& operator=(const CallbackMapper&) = delete;

  /// A runtime or driver API callback (domain CUPTI_CB_DOMAIN_RUNTIME_API or _DRIVER_API).
  void on_api(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const CUpti_CallbackData& data) noexcept;
  /// An NVTX callback (domain CUPTI_CB_DOMAIN_NVTX).
  void on_nvtx(CUpti_CallbackId cbid, const CUpti_NvtxData& data) noexcept;

  bool is_batch_marker(std::string_view range_name) const noexcept;

  /// The callback ids to enable, per domain: exactly those on_api / on_nvtx handle.
  static std::span<const CUpti_CallbackId> runtime_cbids() noexcept;
  static std::span<const CUpti_CallbackId> driver_cbids() noexcept;
  static std::span<const CUpti_CallbackId> nvtx_cbids() noexcept;

 private:
  struct Call;  // one decoded allocation API call
  void handle_exit(const Call& call, const CUpti_CallbackData& data, bool ok, bool out_of_memory) noexcept;
  void range_pushed(const void* domain, bool matches) noexcept;
  void range_popped(const void* domain) noexcept;

  EventSink& m_sink;
  DeviceQuery& m_devices;
  std::regex m_marker;

  struct Mapping {
    std::uint64_t size;
    int device;
  };
  std::mutex m_mutex;  // the two tables below; taken on map/unmap and NVTX start/end only
  std::map<std::uint64_t, Mapping> m_mappings;     // live cuMemMap ranges by address
  std::unordered_set<std::uint64_t> m_open_ranges;  // nvtxRangeStart ids whose name matched
};

}  // namespace memsnap::cupti
