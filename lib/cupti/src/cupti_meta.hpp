// The CUPTI parameter structs of the runtime, driver and NVTX calls (functionParams), with what
// their headers need. generated_cuda_meta.h names the legacy 32-bit driver types that cuda.h
// declares only for the driver's own build; they are declared here the same way (pointer uses only).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_driver_cbid.h>
#include <cupti_nvtx_cbid.h>
#include <cupti_runtime_cbid.h>

#if !defined(__CUDA_API_VERSION_INTERNAL)
typedef unsigned int CUdeviceptr_v1;
typedef struct CUDA_MEMCPY2D_v1_st CUDA_MEMCPY2D_v1;
typedef struct CUDA_MEMCPY3D_v1_st CUDA_MEMCPY3D_v1;
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st CUDA_ARRAY3D_DESCRIPTOR_v1;
#endif

#include <generated_cuda_meta.h>
#include <generated_cuda_runtime_api_meta.h>
#include <generated_nvtx_meta.h>
