// guest/src/export.h — marks the driver API definitions that libcuda.so.1 exports. Everything else
// in the library is hidden (-fvisibility=hidden plus the version script guest/libcuda.map).
#pragma once
#define ORION_EXPORT __attribute__((visibility("default")))
