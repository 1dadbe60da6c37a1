#!/usr/bin/env python3
"""Writes the seed inputs of frame_fuzz (fuzz/frame_fuzz.cpp describes the record format).

    fuzz/seeds/frame_seeds.py TINY_PTX TINY_FATBIN OUT_DIR     (fuzz/seeds/make runs it)

Each seed is a client session: records (u16 op, u8 flags, u16 len, payload), payloads as in
common/include/orion/common/frame.h. Values the session hands out (handles, device pointers) are
used through patch bytes: flags bits 1-2 = number of patch bytes k leading the payload; the u64 at
payload offset 8 * (k & 15) gets added the (k >> 4)-th value collected from earlier replies (the
first eight u64 words of each successful reply, in order, 16 at most).
"""
import os
import struct
import sys

OPS = dict(Goodbye=2, Nop=3, NopAsync=4, Sync=5, TakeOutput=6, CtxCreate=10, CtxDestroy=11, CtxSetCurrent=12,
           CtxSynchronize=13, PrimaryCtxRetain=14, PrimaryCtxRelease=15, CtxSetLimit=17, CtxGetLimit=18,
           MemAlloc=20, MemFree=21, MemGetInfo=22, MemcpyHtoD=23, MemcpyDtoH=24, MemcpyDtoD=25, Memcpy2D=26,
           Memset=27, HostGetDevicePointer=28, MemcpyDtoHAsync=29, MemAddressReserve=30, MemAddressFree=31,
           MemCreate=32, MemRelease=33, MemMap=34, MemUnmap=35, MemSetAccess=36, IpcGetMemHandle=37,
           IpcOpenMemHandle=38, IpcCloseMemHandle=39, ModuleLoad=40, ModuleUnload=42, ModuleGetFunction=43,
           ModuleGetGlobal=44, FuncGetAttribute=45, FuncSetAttribute=46, LaunchKernel=47, OccupancyMaxBlocks=48,
           LaunchKernelEx=49, ModuleFunctionName=52, ArrayCreate=80, ArrayDestroy=81, MemcpyArray=82,
           TexObjectCreate=83, TexObjectDestroy=84, Batch=85, StreamCreate=60, StreamDestroy=61,
           StreamSynchronize=62, StreamQuery=63, StreamWaitEvent=64, EventCreate=65, EventDestroy=66,
           EventRecord=67, EventSynchronize=68, EventQuery=69, EventElapsedTime=70, DeviceMemoryInfo=110)
WINDOW_WRITE = 0xFF00
MODULE = 0xFF01
REPLY = 1


class Seed:
    def __init__(self):
        self.out = b""
        self.values = 0  # how many values the replies so far carry (the harness's list)

    def rec(self, op, payload=b"", flags=0, patches=()):
        op = OPS[op] if isinstance(op, str) else op
        assert len(patches) <= 3
        flags |= len(patches) << 1
        body = bytes(patches) + payload
        self.out += struct.pack("<HBH", op, flags, len(body)) + body

    def module(self, image):
        """The harness's module upload (BlobPut, then ModuleLoad with a reply: ModuleLoadRep, two words)."""
        self.rec(MODULE, image)
        first = self.values
        self.values = min(16, self.values + 2)
        return first

    def call(self, op, payload=b"", patches=(), words=0):
        """A frame with a reply that carries `words` u64 values (their indices are returned)."""
        self.rec(op, payload, REPLY, patches)
        first = self.values
        self.values = min(16, self.values + words)
        return list(range(first, self.values))


def patch(value_index, slot):
    return (value_index << 4) | slot


def ctx(s):
    s.call("PrimaryCtxRetain", struct.pack("<II", 0, 0), words=1)
    s.rec("CtxSetCurrent", struct.pack("<Q", 0x10000))


def alloc(s, n):
    return s.call("MemAlloc", struct.pack("<Q", n), words=1)[0]


def basic(ptx):
    """Allocations, copies, a memset, a PTX module, a launch of `add`, streams and events."""
    s = Seed()
    ctx(s)
    d_in, d_out = alloc(s, 4096), alloc(s, 4096)
    s.rec(WINDOW_WRITE, struct.pack("<I", 0) + struct.pack("<16f", *range(16)))
    s.rec("MemcpyHtoD", struct.pack("<QQQQ", 0, 0, 64, 0), patches=[patch(d_in, 0)])
    s.rec("Memset", struct.pack("<QQQQQII", 0, 16, 1, 0, 0, 0x3F800000, 4), patches=[patch(d_out, 0)])
    m = s.module(ptx)
    f = s.call("ModuleGetFunction", struct.pack("<QII", 0, 4, 0) + b"add\0", patches=[patch(m, 0)], words=6)[0]
    params = struct.pack("<QQiiiid", 0, 0, 16, 0, 2, 0, 0.5)  # out, in, n, pad, P{a, pad, b}
    launch = struct.pack("<QQIIIIIIII", 0, 0, 1, 1, 1, 16, 1, 1, 0, len(params)) + params
    s.rec("LaunchKernel", launch, patches=[patch(f, 0), patch(d_out, 6), patch(d_in, 7)])
    s.call("MemcpyDtoH", struct.pack("<QQQQ", 4096, 0, 64, 0), patches=[patch(d_out, 1)])
    s.call("CtxSynchronize")
    st = s.call("StreamCreate", struct.pack("<Ii", 0, 0), words=1)[0]
    ev = s.call("EventCreate", struct.pack("<II", 0, 0), words=1)[0]
    s.rec("EventRecord", struct.pack("<QQ", 0, 0), patches=[patch(ev, 0), patch(st, 1)])
    s.rec("StreamWaitEvent", struct.pack("<QQII", 0, 0, 0, 0), patches=[patch(st, 0), patch(ev, 1)])
    s.call("EventSynchronize", struct.pack("<Q", 0), patches=[patch(ev, 0)])
    s.call("EventQuery", struct.pack("<Q", 0), patches=[patch(ev, 0)])
    s.call("StreamSynchronize", struct.pack("<Q", 0), patches=[patch(st, 0)])
    s.call("StreamDestroy", struct.pack("<Q", 0), patches=[patch(st, 0)])
    s.call("EventDestroy", struct.pack("<Q", 0), patches=[patch(ev, 0)])
    s.call("TakeOutput")
    s.call("MemFree", struct.pack("<Q", 0), patches=[patch(d_in, 0)])
    s.call("MemGetInfo")
    s.call("DeviceMemoryInfo", struct.pack("<II", 0, 0))
    return s.out


def module(fatbin):
    """A fatbin module: function names, a global, attributes, occupancy, unload."""
    s = Seed()
    ctx(s)
    m = s.module(fatbin)
    s.call("ModuleFunctionName", struct.pack("<QII", 0, 0xFFFFFFFF, 0), patches=[patch(m, 0)], words=1)
    s.call("ModuleFunctionName", struct.pack("<QII", 0, 0, 0), patches=[patch(m, 0)], words=1)
    s.call("ModuleGetGlobal", struct.pack("<QII", 0, 5, 0) + b"dval\0", patches=[patch(m, 0)], words=2)
    f = s.call("ModuleGetFunction", struct.pack("<QII", 0, 4, 0) + b"nop\0", patches=[patch(m, 0)], words=2)[0]
    s.call("FuncGetAttribute", struct.pack("<Qii", 0, 0, 0), patches=[patch(f, 0)])
    s.rec("FuncSetAttribute", struct.pack("<Qii", 0, 8, 1024), patches=[patch(f, 0)])
    s.call("OccupancyMaxBlocks", struct.pack("<QIIQ", 0, 128, 0, 0), patches=[patch(f, 0)])
    s.rec("LaunchKernel", struct.pack("<QQIIIIIIII", 0, 0, 2, 1, 1, 32, 1, 1, 0, 0), patches=[patch(f, 0)])
    s.call("Sync")
    s.call("ModuleUnload", struct.pack("<Q", 0), patches=[patch(m, 0)])
    return s.out


def vmm():
    """Virtual memory management: reserve, create, map, access, memset, unmap, release, free."""
    s = Seed()
    ctx(s)
    mb2 = 2 << 20
    a = s.call("MemAddressReserve", struct.pack("<QQQ", 2 * mb2, 0, 0), words=1)[0]
    h = s.call("MemCreate", struct.pack("<QII", mb2, 0, 0), words=1)[0]
    s.call("MemMap", struct.pack("<QQQQ", 0, mb2, 0, 0), patches=[patch(a, 0), patch(h, 3)])
    s.call("MemSetAccess", struct.pack("<QQII", 0, mb2, 0, 3), patches=[patch(a, 0)])
    s.rec("Memset", struct.pack("<QQQQQII", 0, 256, 1, 0, 0, 7, 1), patches=[patch(a, 0)])
    s.call("MemcpyDtoH", struct.pack("<QQQQ", 0, 0, 256, 0), patches=[patch(a, 1)])
    s.call("MemUnmap", struct.pack("<QQ", 0, mb2), patches=[patch(a, 0)])
    s.call("MemRelease", struct.pack("<Q", 0), patches=[patch(h, 0)])
    s.call("MemAddressFree", struct.pack("<QQ", 0, 2 * mb2), patches=[patch(a, 0)])
    return s.out


def arrays():
    """A 2D float array, copies in and out through the window, a texture and a surface object."""
    s = Seed()
    ctx(s)
    CU_AD_FORMAT_FLOAT = 0x20
    arr = s.call("ArrayCreate", struct.pack("<QQQIIII", 16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 2, 0), words=1)[0]
    s.rec(WINDOW_WRITE, struct.pack("<I", 0) + bytes(range(64)))
    # window -> array, then array -> window
    s.rec("MemcpyArray", struct.pack("<QQQQQQQQQQQQQII", 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 1, 2),
          patches=[patch(arr, 2)])
    s.call("MemcpyArray", struct.pack("<QQQQQQQQQQQQQII", 0, 0, 8192, 64, 0, 0, 0, 0, 0, 0, 64, 1, 0, 2, 1),
           patches=[patch(arr, 0)])
    CU_RESOURCE_TYPE_ARRAY = 0
    tex = struct.pack("<QQQQIIII3IIII4I", 0, 0, 0, 0, CU_RESOURCE_TYPE_ARRAY, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0)
    t = s.call("TexObjectCreate", tex, patches=[patch(arr, 0)], words=1)[0]
    surf = struct.pack("<QQQQIIII3IIII4I", 0, 0, 0, 0, CU_RESOURCE_TYPE_ARRAY, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    sf = s.call("TexObjectCreate", surf, patches=[patch(arr, 0)], words=1)[0]
    s.call("TexObjectDestroy", struct.pack("<QII", 0, 0, 0), patches=[patch(t, 0)])
    s.call("TexObjectDestroy", struct.pack("<QII", 0, 1, 0), patches=[patch(sf, 0)])
    s.call("ArrayDestroy", struct.pack("<Q", 0), patches=[patch(arr, 0)])
    # a linear texture on an allocation
    d = alloc(s, 4096)
    CU_RESOURCE_TYPE_LINEAR = 1
    lin = struct.pack("<QQQQIIII3IIII4I", 0, 1024, 0, 0, CU_RESOURCE_TYPE_LINEAR, CU_AD_FORMAT_FLOAT, 1, 0, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0)
    s.call("TexObjectCreate", lin, patches=[patch(d, 0)], words=1)
    return s.out


def batch():
    """A Batch frame (a graph launch): memset, device-to-device copy, 2D copy."""
    s = Seed()
    ctx(s)
    a, b = alloc(s, 4096), alloc(s, 4096)
    # Patches address the Batch payload: entry 1 (memset) at 8, its dst at 8; entry 2 (DtoD) payload at 64.
    e1 = struct.pack("<QQQQQII", 0, 64, 1, 0, 0, 5, 4)                   # 48 bytes, at payload offset 8
    e2 = struct.pack("<QQQQ", 0, 0, 256, 0)                              # 32 bytes, at offset 8+48+8 = 64
    e3 = struct.pack("<QQQQQQQII", 0, 64, 0, 64, 64, 2, 0, 0, 0)         # Memcpy2D device to device
    body = struct.pack("<HHI", OPS["Memset"], 0, len(e1)) + e1
    body += struct.pack("<HHI", OPS["MemcpyDtoD"], 0, len(e2)) + e2
    body += struct.pack("<HHI", OPS["Memcpy2D"], 0, len(e3)) + e3
    s.rec("Batch", body, patches=[patch(a, 1), patch(b, 8), patch(a, 9)])
    s.call("Sync")
    s.rec("Memcpy2D", e3, patches=[patch(a, 0), patch(b, 2)])
    s.rec("MemcpyDtoD", e2, patches=[patch(b, 0), patch(a, 1)])
    s.call("IpcGetMemHandle", struct.pack("<Q", 0), patches=[patch(a, 0)])
    s.call("CtxGetLimit", struct.pack("<IIQ", 0, 0, 0))
    s.call("CtxSetLimit", struct.pack("<IIQ", 1, 0, 4096))
    return s.out


def hostile():
    """Things the session must refuse: unknown op, a Hello again, a bad magic after some frames."""
    out = []
    s = Seed()
    ctx(s)
    s.rec(999, b"\0" * 16, REPLY)
    out.append(s.out)
    s = Seed()
    s.call("Nop")
    s.rec("MemAlloc", struct.pack("<Q", 1 << 40), 0xFF)
    out.append(s.out)
    s = Seed()
    s.call("Nop")
    s.rec(1, b"\0" * 264, REPLY)
    out.append(s.out)
    return out


def main():
    ptx = open(sys.argv[1], "rb").read() + b"\0"
    fatbin = open(sys.argv[2], "rb").read()
    out = sys.argv[3]
    os.makedirs(out, exist_ok=True)
    seeds = dict(basic=basic(ptx), module=module(fatbin), vmm=vmm(), arrays=arrays(), batch=batch())
    for i, h in enumerate(hostile()):
        seeds["hostile%d" % i] = h
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
