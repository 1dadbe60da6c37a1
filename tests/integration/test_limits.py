"""What one tenant can make oriond hold is bounded (issue #11 item 7): the module cache keeps
under --cache-max-mib (oldest entries go first) and holds only images that parsed, and a session's
handles (contexts, modules, functions, streams, events) stop at kMaxSessionHandles with
CUDA_ERROR_OUT_OF_MEMORY while the session goes on. The driver calls are made through Orion's
libcuda.so.1 with ctypes, in a child process per program."""
import sys

import pytest

from conftest import Oriond, assert_passed, wait_until

DRIVER = r'''
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        print("ERR", what, r, flush=True)
        sys.exit(1)
ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "current")
mode = sys.argv[1]
if mode == "modules":
    n, size = int(sys.argv[2]), int(sys.argv[3])
    for i in range(n):  # distinct PTX images of about `size` bytes each
        ptx = (".version 8.0\n.target sm_75\n.address_size 64\n// %d %s\n.visible .entry k%d()\n{\nret;\n}\n"
               % (i, "x" * size, i)).encode() + b"\0"
        m = ctypes.c_void_p()
        ck(cu.cuModuleLoadData(ctypes.byref(m), ptx), "load %d" % i)
        ck(cu.cuModuleUnload(m), "unload %d" % i)
    print("LOADED", n, flush=True)
elif mode == "broken":
    ptx = b".version 8.0\n.target sm_75\n.address_size 64\n.visible .entry k(\n this is not PTX\n" + b"\0"
    m = ctypes.c_void_p()
    print("BROKEN", cu.cuModuleLoadData(ctypes.byref(m), ptx), flush=True)
elif mode == "resources":
    # Kernels declaring shared and local memory (PTX, JIT on the sim): launched with 256 threads.
    def kernel(decl):
        ptx = (".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n%s\nret;\n}\n" % decl)
        m, f = ctypes.c_void_p(), ctypes.c_void_p()
        ck(cu.cuModuleLoadData(ctypes.byref(m), ptx.encode() + b"\0"), "load")
        ck(cu.cuModuleGetFunction(ctypes.byref(f), m, b"k"), "function")
        return f
    def launch(f, threads=256, smem=0):
        r = cu.cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, smem, None, None, None)
        return r if r != 0 else cu.cuCtxSynchronize()
    def free():
        fr, tot = ctypes.c_size_t(), ctypes.c_size_t()
        ck(cu.cuMemGetInfo_v2(ctypes.byref(fr), ctypes.byref(tot)), "info")
        return fr.value
    before = free()
    print("SHARED64K", launch(kernel(".shared .align 4 .b8 s[65536];")), flush=True)
    print("LOCAL1G", launch(kernel(".local .align 4 .b8 l[1073741824];")), flush=True)
    print("LOCAL4G", launch(kernel(".local .align 4 .b8 l[4294967296];"), threads=1024), flush=True)
    fits = kernel(".local .align 4 .b8 l[65536];\n.shared .align 4 .b8 s[4096];")
    print("FITS", launch(fits), before - free(), flush=True)
    print("TOOBIG", launch(kernel(".local .align 4 .b8 l[524288];"), threads=1024), flush=True)
    print("DYN", launch(kernel(".shared .align 4 .b8 s[40960];"), smem=200000), flush=True)
    print("AFTER", launch(fits), flush=True)
elif mode in ("events", "ipcevents"):
    # Events until the first failure; "ipcevents": interprocess ones (CU_EVENT_INTERPROCESS |
    # CU_EVENT_DISABLE_TIMING), each exported with cuIpcGetEventHandle.
    ipc = mode == "ipcevents"
    n, r = 0, 0
    while n <= (5000 if ipc else 400000):
        e = ctypes.c_void_p()
        r = cu.cuEventCreate(ctypes.byref(e), 0x4 | 0x2 if ipc else 0)
        if r == 0 and ipc:
            r = cu.cuIpcGetEventHandle((ctypes.c_char * 64)(), e)
        if r != 0:
            break
        n += 1
    print("EXPORTED" if ipc else "EVENTS", n, r, flush=True)
    # The session goes on: a synchronize and a small allocation still work.
    p = ctypes.c_uint64()
    print("AFTER", cu.cuCtxSynchronize(), cu.cuMemAlloc_v2(ctypes.byref(p), 4096), flush=True)
'''


def cache_files(d):
    return [p for p in (d.tmp / "cache").iterdir() if p.is_file() and not p.name.startswith(".")]


def test_the_module_cache_is_bounded_and_holds_only_images_that_parsed(make_oriond):
    d = make_oriond(extra_args=("--cache-max-mib", "4"))
    r = d.run(sys.executable, "-c", DRIVER, "broken", timeout=120)
    assert "BROKEN 200" in r.stdout, r.stdout + r.stderr  # CUDA_ERROR_INVALID_IMAGE
    assert cache_files(d) == [], "an image that did not parse was cached"
    r = d.run(sys.executable, "-c", DRIVER, "modules", 12, 1 << 20, timeout=300)
    assert "LOADED 12" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    files = cache_files(d)
    total = sum(p.stat().st_size for p in files)
    # 12 MiB went in; at most the bound plus the entry just written stays.
    assert files and total <= (5 << 20), (len(files), total)
    assert d.alive()


def test_session_handles_are_bounded(oriond):
    r = oriond.run(sys.executable, "-c", DRIVER, "events", timeout=300)
    out = r.stdout + r.stderr[-2000:]
    n, code = map(int, r.stdout.split("EVENTS ")[1].split()[:2])
    assert code == 2 and 200000 < n < (1 << 18), out  # CUDA_ERROR_OUT_OF_MEMORY at kMaxSessionHandles
    assert "AFTER 0 0" in r.stdout, out
    assert oriond.alive()


def test_session_logs_are_bounded(tmp_path):
    # Issue #11 item 12: one log file per session, never cleaned up. Now oriond keeps at most
    # [orion] session_logs_max of them (checked every 16 sessions), the oldest going first, and
    # each is capped in size.
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 4\n[orion]\n    session_logs_max = 4\n")
    try:
        for _ in range(33):
            assert_passed(d.run("device_props"))
        logs = sorted((d.logs / "session").glob("*.log"))
        assert 1 <= len(logs) <= 4 + 15, [p.name for p in logs]
        # The newest session's log is among those kept.
        assert any(p.name.endswith("-33.log") for p in logs), [p.name for p in logs]
    finally:
        d.stop()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_killed_clients_running_kernel_ends_with_it(tmp_path, transport):
    """Issue #22 item 1: a client killed while its kernel runs on (a kernel of ~10^9 iterations,
    hours on the sim) loses its session within a couple of seconds, not at the kernel timeout
    (10 min): the worker's watchdog sees the lease go stale (shm, lease timeout 1 s here) or the
    connection close (TCP) while the frame executes, and ends the worker; oriond frees its vGPU,
    which a 4-vGPU client then gets. Before, the vGPU stayed held until the kernel timed out."""
    import json
    import socket
    import subprocess
    import time
    from conftest import TEST_BIN
    from conftest import free_port
    port = free_port() if transport == "tcp" else 0
    d = Oriond(tmp_path, tcp_port=port)
    try:
        env = d.env(ORION_GMEM=64)
        if transport == "tcp":
            env.pop("ORION_SHM")
            env["ORION_SERVER"] = f"127.0.0.1:{port}"
        now = int(time.time() * 1000)
        p = subprocess.Popen([str(TEST_BIN / "spin"), str(now), str(now + 3600_000), "1000000000"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The warm-up kernel ran (it is logged when done).
        wait_until(lambda: any("burn" in l["kernel"] for l in d.launches()), 30, p.communicate, interval=0.1,
                   alive=lambda: p.poll() is None)
        time.sleep(1.5)  # the long kernel is running now
        p.kill()
        p.wait()
        killed = time.time()

        def sessions():
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(tmp_path / "oriond.sock"))
                s.sendall(b"sessions\n")
                line = s.makefile().readline().strip()
            assert line.startswith("ok "), line
            return json.loads(line[3:])

        wait_until(lambda: not sessions(), 6 - (time.time() - killed), lambda: (sessions(), d.session_logs()[-2000:]),
                   interval=0.1)
        assert "while the worker was busy" in d.session_logs(), d.session_logs()[-2000:]
        r = d.run("device_props", ORION_VGPU=4, ORION_GMEM=64)
        assert_passed(r)
    finally:
        d.stop()


def test_kernels_local_and_shared_memory_is_bounded_and_charged(tmp_path):
    """Issue #22 item 2(b): PTX .shared and .local sizes were taken at will (a 1 GiB .local reached
    2.4 GB of oriond's host RAM on a 256 MiB quota; 4 GiB x 1024 threads aborted the worker). Now a
    kernel past sm_90's limits (48 KiB of static shared memory per block, 512 KiB of local memory
    per thread) fails its launch with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701); static + dynamic
    shared memory past 227 KiB with CUDA_ERROR_INVALID_VALUE (1); and what a launch holds (local
    memory of the blocks the executor runs at once, 2 workers here, and their shared memory) is
    charged to the quota as a GPU reserves local memory: 2 x (256 x 64 KiB + 4 KiB) = 32 MiB + 8 KiB
    is seen in cuMemGetInfo, and 2 x 1024 x 512 KiB = 1 GiB does not fit a 256 MiB quota
    (CUDA_ERROR_OUT_OF_MEMORY, 2). The session goes on."""
    d = Oriond(tmp_path, extra_args=("--sim-workers", "2"))
    try:
        r = d.run(sys.executable, "-c", DRIVER, "resources", ORION_GMEM=256, timeout=120)
        out = dict(l.split(" ", 1) for l in r.stdout.splitlines() if " " in l)
        assert out.get("SHARED64K") == "701" and out.get("LOCAL1G") == "701" and out.get("LOCAL4G") == "701", \
            r.stdout + r.stderr[-2000:]
        status, charged = map(int, out["FITS"].split())
        assert status == 0 and charged == 2 * (256 * 65536 + 4096), (status, charged)
        assert out["TOOBIG"] == "2" and out["DYN"] == "1" and out["AFTER"] == "0", r.stdout
        assert "static shared memory; an sm_90 block has at most 49152" in d.session_logs()
        assert d.alive()
    finally:
        d.stop()


def test_ipc_event_exports_are_bounded(oriond):
    """Issue #22 item 2(c): each exported IPC event holds a ticket (an fd) in the worker, and there
    was no bound: 5000 exports took 5000 fds. Now a session exports at most kMaxIpcExports (4096)
    events; the next export fails with CUDA_ERROR_OUT_OF_MEMORY and the session goes on."""
    r = oriond.run(sys.executable, "-c", DRIVER, "ipcevents", timeout=300)
    n, code = map(int, r.stdout.split("EXPORTED ")[1].split()[:2])
    assert (n, code) == (4096, 2), r.stdout + r.stderr[-2000:]
    assert "AFTER 0 0" in r.stdout, r.stdout
    assert oriond.alive()
