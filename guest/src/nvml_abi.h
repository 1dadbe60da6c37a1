// guest/src/nvml_abi.h — the part of NVIDIA's NVML ABI that Orion's libnvidia-ml.so.1 implements,
// written out from the facts of nvml.h (NVML_API_VERSION 13; NVIDIA's header is not needed to build
// Orion). Names, values and layouts are NVML's; the static_asserts pin the layouts (x86-64 Linux).
// The full list of entry points is generated from nvml.h into nvml_api.inc
// (scripts/gen-nvml-api.py).
#pragma once

#include <cstddef>

extern "C" {

typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INSUFFICIENT_POWER = 8,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_IRQ_ISSUE = 11,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_CORRUPTED_INFOROM = 14,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_OPERATING_SYSTEM = 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
  NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
  NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_DEPRECATED = 26,
  NVML_ERROR_NOT_READY = 27,
  NVML_ERROR_GPU_NOT_FOUND = 28,
  NVML_ERROR_INVALID_STATE = 29,
  NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st* nvmlDevice_t;  // opaque

// Buffer sizes (bytes, NUL included) NVML documents for its string outputs.
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_UUID_BUFFER_SIZE 80
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_BUFFER_SIZE 64
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE 80
#define NVML_API_VERSION 13

#define NVML_INIT_FLAG_NO_GPUS 1    // don't fail nvmlInit when no GPUs are found
#define NVML_INIT_FLAG_NO_ATTACH 2  // don't attach GPUs

typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];  // "%04X:%02X:%02X.0"
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;  // device id << 16 | vendor id
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];  // "%08X:%02X:%02X.0"
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
  unsigned long long total;  // bytes
  unsigned long long free;   // bytes
  unsigned long long used;   // bytes: reserved + allocated
} nvmlMemory_t;

typedef struct nvmlUtilization_st {
  unsigned int gpu;     // percent of the sample period during which one or more kernels ran
  unsigned int memory;  // percent of the sample period during which device memory was read or written
} nvmlUtilization_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;         // nvmlMemory_v2
  unsigned long long total;     // bytes
  unsigned long long reserved;  // bytes reserved for system use (driver or firmware)
  unsigned long long free;      // bytes
  unsigned long long used;      // bytes allocated
} nvmlMemory_v2_t;
// NVML_STRUCT_VERSION(Memory, 2): sizeof | version << 24.
#define nvmlMemory_v2 (static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24))

typedef struct nvmlProcessInfo_v1_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes
} nvmlProcessInfo_v1_t;

// nvmlDeviceGetComputeRunningProcesses_v2 and _v3 both take this layout (nvml.h: nvmlProcessInfo_t).
typedef struct nvmlProcessInfo_v2_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;  // bytes
  unsigned int gpuInstanceId;        // 0xFFFFFFFF without MIG
  unsigned int computeInstanceId;    // 0xFFFFFFFF without MIG
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

typedef enum nvmlBrandType_enum {
  NVML_BRAND_UNKNOWN = 0,
  NVML_BRAND_NVIDIA = 14,
} nvmlBrandType_t;

}  // extern "C"

static_assert(sizeof(nvmlReturn_t) == 4 && sizeof(nvmlBrandType_t) == 4);
static_assert(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, domain) == 16 &&
              offsetof(nvmlPciInfo_t, pciSubSystemId) == 32 && offsetof(nvmlPciInfo_t, busId) == 36);
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlUtilization_t) == 8);
static_assert(sizeof(nvmlMemory_v2_t) == 40 && offsetof(nvmlMemory_v2_t, total) == 8 &&
              offsetof(nvmlMemory_v2_t, used) == 32);
static_assert(nvmlMemory_v2 == 0x02000028u);
static_assert(sizeof(nvmlProcessInfo_v1_t) == 16 && sizeof(nvmlProcessInfo_v2_t) == 24 &&
              offsetof(nvmlProcessInfo_v2_t, gpuInstanceId) == 16);
