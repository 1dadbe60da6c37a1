"""A minimal driver-API program for tests against fake peers: loads Orion's libcuda.so.1 with
ctypes and runs the steps named on the command line, printing `STEP <name> <CUresult>` after each
(flushed), so a test sees how far it got even if the process hangs or aborts.

  python driver_probe.py init ctx alloc dtoh sync
"""
import ctypes
import os
import sys

MIB = 1 << 20


def main():
    lib = ctypes.CDLL(os.environ.get("ORION_PROBE_LIBCUDA", "libcuda.so.1"))
    dev = ctypes.c_int(0)
    ctx = ctypes.c_void_p()
    ptr = ctypes.c_uint64(0)
    buf = ctypes.create_string_buffer(MIB)
    for step in sys.argv[1:]:
        if step == "init":
            r = lib.cuInit(0)
            if r == 0:
                r = lib.cuDeviceGet(ctypes.byref(dev), 0)
        elif step == "ctx":
            r = lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        elif step == "alloc":
            r = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(MIB))
        elif step == "dtoh":
            r = lib.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr.value), ctypes.c_size_t(MIB))
        elif step == "sync":
            r = lib.cuCtxSynchronize()
        else:
            raise SystemExit(f"unknown step {step}")
        print(f"STEP {step} {r}" + (f" ptr={ptr.value:#x}" if step == "alloc" else ""), flush=True)
        if r != 0:
            break
    print("PROBE END", flush=True)


if __name__ == "__main__":
    main()
