"""A driver-API shell for tests that interleave several processes: loads Orion's libcuda.so.1 with
ctypes, reads one command per line on stdin and answers one line on stdout (flushed):

  alloc MIB      -> "<CUresult> <dptr>"        cuMemAlloc of MIB MiB
  free DPTR      -> "<CUresult>"               cuMemFree
  export DPTR    -> "<CUresult> <handle hex>"  cuIpcGetMemHandle
  import HEX     -> "<CUresult> <dptr>"        cuIpcOpenMemHandle
  close DPTR     -> "<CUresult>"               cuIpcCloseMemHandle
  meminfo        -> "<CUresult> <free> <total>" cuMemGetInfo, in bytes

It starts with cuInit and a context and prints "READY <CUresult>". DPTR is decimal or 0x hex.
"""
import ctypes
import os
import sys

MIB = 1 << 20


class IpcMemHandle(ctypes.Structure):  # CUipcMemHandle, passed by value
    _fields_ = [("reserved", ctypes.c_char * 64)]


def main():
    lib = ctypes.CDLL(os.environ.get("ORION_PROBE_LIBCUDA", "libcuda.so.1"))
    dev = ctypes.c_int(0)
    ctx = ctypes.c_void_p()
    r = lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0) or lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    print(f"READY {r}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        op, args = words[0], words[1:]
        ptr = ctypes.c_uint64(0)
        if op == "alloc":
            r = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(args[0]) * MIB))
            out = f"{r} {ptr.value:#x}"
        elif op == "free":
            out = str(lib.cuMemFree_v2(ctypes.c_uint64(int(args[0], 0))))
        elif op == "export":
            handle = ctypes.create_string_buffer(64)
            r = lib.cuIpcGetMemHandle(handle, ctypes.c_uint64(int(args[0], 0)))
            out = f"{r} {handle.raw.hex()}"
        elif op == "import":
            handle = IpcMemHandle.from_buffer_copy(bytes.fromhex(args[0]))
            r = lib.cuIpcOpenMemHandle(ctypes.byref(ptr), handle, ctypes.c_uint(1))
            out = f"{r} {ptr.value:#x}"
        elif op == "close":
            out = str(lib.cuIpcCloseMemHandle(ctypes.c_uint64(int(args[0], 0))))
        elif op == "meminfo":
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            r = lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
            out = f"{r} {free.value} {total.value}"
        else:
            raise SystemExit(f"unknown command {op}")
        print(out, flush=True)


if __name__ == "__main__":
    main()
