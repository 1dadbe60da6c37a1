"""Drives Orion's libnvidia-ml.so.1 (and, with --cuda, its libcuda.so.1) through NVML's C ABI with
ctypes, in one process, and prints `RESULT <json>` with what it saw. tests/integration/test_nvml.py
asserts on it. Layouts are NVML's (nvml.h): nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t,
nvmlPciInfo_t.

  python nvml_probe.py [--cuda]     # without --cuda the process never calls the CUDA driver API
"""
import ctypes as C
import json
import os
import sys

MIB = 1 << 20


class Memory(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


class MemoryV2(C.Structure):
    _fields_ = [("version", C.c_uint), ("total", C.c_ulonglong), ("reserved", C.c_ulonglong),
                ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


class ProcessInfo(C.Structure):  # nvmlProcessInfo_t (v2/v3)
    _fields_ = [("pid", C.c_uint), ("usedGpuMemory", C.c_ulonglong), ("gpuInstanceId", C.c_uint),
                ("computeInstanceId", C.c_uint)]


class PciInfo(C.Structure):
    _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint), ("device", C.c_uint),
                ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint), ("busId", C.c_char * 32)]


NVML_MEMORY_V2 = C.sizeof(MemoryV2) | (2 << 24)


def index_of(nvml, handle):
    idx = C.c_uint(99)
    return idx.value if nvml.nvmlDeviceGetIndex(handle, C.byref(idx)) == 0 else None


def main():
    use_cuda = "--cuda" in sys.argv
    nvml = C.CDLL("libnvidia-ml.so.1")
    nvml.nvmlErrorString.restype = C.c_char_p
    out = {"pid": os.getpid(), "init": nvml.nvmlInit_v2()}
    cnt = C.c_uint(0)
    out["count_rc"] = nvml.nvmlDeviceGetCount_v2(C.byref(cnt))
    out["count"] = cnt.value
    buf = C.create_string_buffer(96)
    out["driver_rc"] = nvml.nvmlSystemGetDriverVersion(buf, 80)
    cuda_ver = C.c_int(0)
    out["cuda_version_rc"] = nvml.nvmlSystemGetCudaDriverVersion_v2(C.byref(cuda_ver))
    out["cuda_version"] = cuda_ver.value
    devs = []
    handles = []
    for i in range(cnt.value):
        h = C.c_void_p()
        d = {"handle_rc": nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(h))}
        handles.append(h)
        d["uuid_rc"] = nvml.nvmlDeviceGetUUID(h, buf, 96)
        d["uuid"] = buf.value.decode()
        d["uuid_short_rc"] = nvml.nvmlDeviceGetUUID(h, buf, 10)  # NVML_ERROR_INSUFFICIENT_SIZE
        nvml.nvmlDeviceGetName(h, buf, 96)
        d["name"] = buf.value.decode()
        pci = PciInfo()
        d["pci_rc"] = nvml.nvmlDeviceGetPciInfo_v3(h, C.byref(pci))
        d["pci_bus_id"] = pci.busId.decode()
        d["pci_bus_id_legacy"] = pci.busIdLegacy.decode()
        mj, mn = C.c_int(), C.c_int()
        nvml.nvmlDeviceGetCudaComputeCapability(h, C.byref(mj), C.byref(mn))
        d["cc"] = [mj.value, mn.value]
        idx = C.c_uint(99)
        nvml.nvmlDeviceGetIndex(h, C.byref(idx))
        d["index"] = idx.value
        by = C.c_void_p()
        d["by_uuid_rc"] = nvml.nvmlDeviceGetHandleByUUID(d["uuid"].upper().encode(), C.byref(by))
        d["by_uuid_index"] = index_of(nvml, by)
        by = C.c_void_p()
        d["by_pci_rc"] = nvml.nvmlDeviceGetHandleByPciBusId_v2(d["pci_bus_id_legacy"].lower().encode(), C.byref(by))
        d["by_pci_index"] = index_of(nvml, by)
        m = Memory()
        d["mem_rc"] = nvml.nvmlDeviceGetMemoryInfo(h, C.byref(m))
        d["mem"] = [m.total, m.free, m.used]
        devs.append(d)
    out["devices"] = devs
    out["bad_index_rc"] = nvml.nvmlDeviceGetHandleByIndex_v2(cnt.value, C.byref(C.c_void_p()))

    h0 = handles[0]

    def mem_v2():
        m = MemoryV2(version=NVML_MEMORY_V2)
        rc = nvml.nvmlDeviceGetMemoryInfo_v2(h0, C.byref(m))
        return [rc, m.total, m.reserved, m.free, m.used]

    def procs():
        n = C.c_uint(0)
        first = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h0, C.byref(n), None)
        arr = (ProcessInfo * 8)()
        n = C.c_uint(8)
        rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h0, C.byref(n), arr)
        return [first, rc, [[arr[i].pid, arr[i].usedGpuMemory] for i in range(n.value)]]

    out["mem_v2_before"] = mem_v2()
    out["procs_before"] = procs()
    if use_cuda:
        cu = C.CDLL("libcuda.so.1")
        assert cu.cuInit(0) == 0
        n = C.c_int(0)
        cu.cuDeviceGetCount(C.byref(n))
        out["cuda_count"] = n.value
        uuids, pcis = [], []
        for i in range(n.value):
            raw = (C.c_ubyte * 16)()
            cu.cuDeviceGetUuid(raw, i)
            b = bytes(raw).hex()
            uuids.append(f"GPU-{b[:8]}-{b[8:12]}-{b[12:16]}-{b[16:20]}-{b[20:]}")
            cu.cuDeviceGetPCIBusId(buf, 96, i)
            pcis.append(buf.value.decode())
        out["cuda_uuids"], out["cuda_pci"] = uuids, pcis
        ctx = C.c_void_p()
        assert cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        ptr = C.c_uint64(0)
        out["alloc_rc"] = cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(64 * MIB))
        out["mem_v2_alloc"] = mem_v2()
        m = Memory()
        nvml.nvmlDeviceGetMemoryInfo(h0, C.byref(m))
        out["mem_alloc"] = [m.total, m.free, m.used]
        out["procs_alloc"] = procs()
        free, total = C.c_size_t(), C.c_size_t()
        cu.cuMemGetInfo_v2(C.byref(free), C.byref(total))
        out["cuda_mem"] = [free.value, total.value]
        out["free_rc"] = cu.cuMemFree_v2(C.c_uint64(ptr.value))
        out["mem_v2_freed"] = mem_v2()
    # Entry points Orion refuses: NVML_ERROR_NOT_SUPPORTED (3), each logged once by name.
    v = C.c_uint(0)
    out["refused"] = {
        "nvmlDeviceGetTemperature": nvml.nvmlDeviceGetTemperature(h0, 0, C.byref(v)),
        "nvmlDeviceGetPowerUsage": nvml.nvmlDeviceGetPowerUsage(h0, C.byref(v)),
        "nvmlDeviceGetClockInfo": nvml.nvmlDeviceGetClockInfo(h0, 1, C.byref(v)),
    }
    util = (C.c_uint * 2)(777, 777)
    out["utilization"] = [nvml.nvmlDeviceGetUtilizationRates(h0, util), util[0], util[1]]
    nvml.nvmlDeviceGetTemperature(h0, 0, C.byref(v))  # a second call: logged only once
    out["error_string"] = nvml.nvmlErrorString(3).decode()
    out["shutdown"] = nvml.nvmlShutdown()
    out["after_shutdown_rc"] = nvml.nvmlDeviceGetCount_v2(C.byref(cnt))
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
