"""End-to-end tests of the data plane on the sim backend: nvcc-built programs (static cudart,
shared cudart, pure driver API) run unmodified through the installed libcuda.so.1 against a real
oriond. The sim backend runs no kernels, so kernel *results* are checked only on a GPU
(scripts/gpu-e2e.sh); launches are checked byte for byte in the sim launch log."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import (PREFIX, ROOT, TEST_BIN, assert_launches_logged, assert_passed, checks, free_port, launched, run_tcp,
                      wait_until)


def test_device_properties_show_the_quota(oriond):
    r = oriond.run("device_props", ORION_GMEM=1536)
    assert_passed(r)
    props = dict(re.findall(r"^PROP (\w+)=(.*)$", r.stdout, re.M))
    assert props["name"] == "Orion Simulated GPU"
    assert int(props["totalGlobalMem"]) == 1536 << 20
    assert props["major"].startswith("9")
    assert int(props["deviceCount"]) == 1
    assert int(props["driverVersion"]) >= 13000
    # Orion's client lines, on stderr (stdout stays the program's own).
    assert "Using Orion resource" in r.stderr and "Releasing Orion resource" in r.stderr
    assert "Orion" not in r.stdout.replace("Orion Simulated GPU", "")


def test_memory_round_trips_memsets_2d_pinned(oriond):
    r = oriond.run("memory", ORION_GMEM=512)
    assert_passed(r, expect_checks=40)
    c = checks(r.stdout)
    # Sizes from 1 B to 64 MiB were checked byte for byte.
    assert any(k.startswith("roundtrip") for k in c), c.keys()


def test_streams_and_events(oriond):
    r = oriond.run("streams_events")
    assert_passed(r, expect_checks=28)
    c = checks(r.stdout)
    for k in ("attr_window_round_trip", "attr_sync_policy_round_trip", "attr_bad_hit_ratio_refused",
              "attr_window_over_max_refused", "attr_priority_is_the_streams"):
        assert c[k] == "ok", (k, c[k])


def test_kernel_parameters_reach_the_server_byte_for_byte(oriond):
    r = oriond.run("kernel_params")
    c = checks(r.stdout)
    assert_passed(r, expect_checks=8)  # includes invalid configurations -> cudaErrorInvalidConfiguration
    assert_launches_logged(r.stdout, oriond.launches())
    # The sim backend executes the kernels' PTX: their results were checked on the host, not skipped.
    results = {k: v for k, v in c.items() if k.startswith("result_")}
    assert len(results) >= 5 and all(v == "ok" for v in results.values()), results
    # Launches on the default stream ran at once; those on other streams were deferred and ran later.
    log = oriond.launches()
    launches = launched(log)
    deferred = [l for l in launches if l["exec"] == "deferred"]
    ran_later = [l for l in log if l["event"] == "ran"]
    assert deferred and all(l["exec"] in ("ran", "deferred") for l in launches), launches
    assert [l["kernel"] for l in ran_later] == [l["kernel"] for l in deferred], log
    assert all(l["exec"] == "ran" for l in ran_later), log


def test_pure_driver_api_program(oriond):
    r = oriond.run("driver_api", ORION_GMEM=512)
    c = checks(r.stdout)
    failed = {k: v for k, v in c.items() if v.startswith("FAIL")}
    assert not failed, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0
    assert_launches_logged(r.stdout, oriond.launches())


def test_driver_calls_from_exit_handlers_keep_the_heap_intact(oriond):
    # tests/cuda/exit_cleanup.cpp: a static destructor pushes and pops the context 64 times and
    # frees memory after the main thread's thread_local objects are gone (what cuFFT does from
    # PyTorch's plan cache at exit). The context stack used to be a thread_local std::vector:
    # "corrupted double-linked list" / SIGSEGV at exit in most runs.
    for _ in range(3):
        r = oriond.run("exit_cleanup")
        assert r.returncode == 0 and r.stdout.splitlines() == ["MAIN_DONE", "EXIT_HANDLER_OK"], (
            r.returncode, r.stdout, r.stderr[-2000:])


CVD_PROBE = r"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
r = cuda.cuInit(0)
n = ctypes.c_int(-1)
if r == 0:
    cuda.cuDeviceGetCount(ctypes.byref(n))
print("INIT", r, "COUNT", n.value, flush=True)
"""


def test_cuda_visible_devices(oriond):
    # NVIDIA's variable, as its driver reads it: a list that hides every device makes cuInit fail
    # with CUDA_ERROR_NO_DEVICE (100) and takes no vGPU (a CPU-only PyTorch script need not hold
    # one); the first k devices ask for k vGPUs; any other list is not applied, and says so.
    def run(value, vgpus):
        r = subprocess.run([sys.executable, "-c", CVD_PROBE], capture_output=True, text=True, timeout=60,
                           env=oriond.env(ORION_VGPU=vgpus, ORION_GMEM=256, CUDA_VISIBLE_DEVICES=value))
        m = re.search(r"^INIT (\d+) COUNT (-?\d+)$", r.stdout, re.M)
        assert m, r.stdout + r.stderr
        return int(m.group(1)), int(m.group(2)), r.stderr

    sessions = oriond.log().count("Creating session")
    assert run("", 1)[:2] == (100, -1)
    assert run("-1", 2)[:2] == (100, -1)
    assert run("3", 2)[:2] == (100, -1)  # an index past the devices ends the list at once
    assert oriond.log().count("Creating session") == sessions, "a process that sees no device took a vGPU"
    assert run("0", 2)[:2] == (0, 1)
    assert run("0,1", 2)[:2] == (0, 2)
    init, count, err = run("1,0", 2)
    assert (init, count) == (0, 2) and "CUDA_VISIBLE_DEVICES=1,0 is not applied by Orion" in err, err


def test_cudart_shared_program(oriond):
    exe = TEST_BIN / "vadd_shared"
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    assert "libcudart.so" in ldd, "vadd_shared must be built with -cudart shared"
    r = oriond.run("vadd_shared")
    assert_passed(r)
    assert launched(oriond.launches(), "_Z4vadd"), oriond.launches()[-5:]


def test_unsupported_calls_fail_loudly(oriond):
    r = oriond.run("unsupported", ORION_COVERAGE=1)
    assert_passed(r)
    assert "is not supported by Orion; returning CUDA_ERROR_NOT_SUPPORTED" in r.stderr
    # The coverage report names each stub that was called and each real entry point.
    assert re.search(r"orion-coverage: STUB cuGraphicsMapResources \d+", r.stderr)
    assert re.search(r"orion-coverage: real cuInit 1", r.stderr)
    assert re.search(r"orion-coverage: \d+ entry points called, \d+ real, [1-9]\d* not supported", r.stderr)


def test_quota_is_enforced_and_logged(oriond):
    r = oriond.run("quota", ORION_GMEM=256)
    assert_passed(r)
    m = re.search(r"QUOTA gmem_mib=256 allocated_mib=(\d+)", r.stdout)
    assert m and 192 <= int(m.group(1)) <= 256
    assert re.search(r"cuMemAlloc\(\): memory \d+ MB exceeds <vgpu \d+, pgpu \d+> quota", oriond.session_logs())


def test_request_larger_than_any_gpu_is_refused_with_a_reason(oriond):
    r = oriond.run("device_props", ORION_GMEM=10_000_000)
    assert r.returncode != 0
    assert "Fail to get resource" in r.stderr and "ORION_GMEM=10000000" in r.stderr
    assert "refused client" in oriond.log()
    # Nothing was allocated: a normal client still runs.
    assert_passed(oriond.run("device_props"))


def test_killed_client_frees_its_vgpu(make_oriond):
    # One vGPU in the pool: a second client is refused while the first holds it.
    d = make_oriond(conf_text="[server]\n    vgpu_count = 1\n[server-shm]\n    shm_buffer_size = 16\n")
    sleeper = d.popen("sleeper", ORION_GMEM=256)
    try:
        assert sleeper.stdout.readline().startswith("DEVICE")
        line = ""
        while "READY" not in line:
            line = sleeper.stdout.readline()
            assert line, sleeper.stderr.read()
        refused = d.run("device_props", ORION_GMEM=256)
        assert refused.returncode != 0 and "no free vGPU" in refused.stderr
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    # The lease (1 s here) expires, the worker ends, the vGPU is free again.
    deadline = time.time() + 15
    while True:
        r = d.run("device_props", ORION_GMEM=256)
        if r.returncode == 0:
            break
        assert time.time() < deadline, r.stderr
        time.sleep(0.5)
    assert "client lease expired" in d.log()
    assert d.alive()


def test_two_clients_at_once(oriond):
    a = oriond.popen("two_clients", 1500, 1, ORION_GMEM=256)
    b = oriond.popen("two_clients", 1500, 2, ORION_GMEM=256)
    outs = [p.communicate(timeout=120) for p in (a, b)]
    for p, (out, err) in zip((a, b), outs):
        assert p.returncode == 0, out + err
        assert "phase=verified" in out
    assert len(re.findall(r"Creating session", oriond.log())) >= 2


# What oriond logs for each hostile client (tests/cuda/hostile_client.cpp), exactly once: the
# session that broke the protocol ends with its reason, or a first frame that is no frame closes
# its channel before any session exists.
HOSTILE_ENDINGS = {
    "bogus": r"sess=\d+ protocol violation: MemAlloc: a payload of 3 bytes, expected exactly 8; ending the session",
    "overflow": r"sess=\d+ protocol violation: MemAlloc: a payload of 3 bytes, expected exactly 8; ending the session",
    "garbage": r"channel \d+: a client sent an invalid first frame \(frame has a bad magic\); channel closed",
    "unknown": r"sess=\d+ protocol violation: unknown op 999; ending the session",
    "cursor": r"sess=\d+ protocol violation: the reply ring's consumer cursor is impossible",
    "batch": r"sess=\d+ protocol violation: Batch: bad Batch entry; ending the session",
    "shape": r"sess=\d+ protocol violation: Sync: a payload of 8 bytes, expected none; ending the session",
    "slot": r"sess=\d+ protocol violation: a sync slot call after ring position \d+, which the request ring has not "
            r"published \(it is at \d+\); ending the session",
    "slotlen": r"sess=\d+ protocol violation: a sync slot call longer than the slot; ending the session",
}


@pytest.mark.parametrize("mode", sorted(HOSTILE_ENDINGS))
def test_hostile_client_only_loses_its_own_session(oriond, mode):
    victim = oriond.popen("two_clients", 3000, 7, ORION_GMEM=128)
    time.sleep(0.5)
    h = subprocess.run([ROOT / "build" / "hostile_client" if not os.environ.get("ORION_HOSTILE") else
                        os.environ["ORION_HOSTILE"], oriond.region, mode], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0, h.stdout + h.stderr
    # Each probe of the hostile client saw what it expected (a refusal, its session ended, ...).
    results = re.findall(r"^RESULT (\S+) (.*)$", h.stdout, re.M)
    assert results and all(v == "ok" for _, v in results), h.stdout
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 0 and "phase=verified" in out, out + err
    assert oriond.alive()
    endings = re.findall(r"(?:protocol violation: |invalid first frame).*$", oriond.log(), re.M)
    assert oriond.log().count("exits (protocol violation)") == (0 if mode == "garbage" else 1), oriond.log()[-3000:]
    assert len(endings) == 1 and re.search(HOSTILE_ENDINGS[mode] + "$", oriond.log(), re.M), endings
    assert_passed(oriond.run("device_props"))


def test_synchronous_calls_go_through_the_sync_slot_unless_turned_off(oriond):
    """On shared memory a synchronous call whose request fits goes through the channel's sync slot
    (docs/spec/region.md, "The sync slot"), a reply too long for it through the reply ring; the
    worker's log counts both when the session ends. ORION_SYNC_SLOT=0 keeps every call on the
    ring (no count is logged). The program computes the same either way."""
    on = oriond.run("streams_events")
    off = oriond.run("streams_events", ORION_SYNC_SLOT=0)
    assert_passed(on)
    assert_passed(off)
    assert on.stdout == off.stdout
    stats = re.findall(r"sess=\d+ (\d+) calls through the sync slot \((\d+) answered through the reply ring\)$",
                       oriond.session_logs(), re.M)
    assert len(stats) == 1, oriond.session_logs()[-3000:]
    calls, in_ring = map(int, stats[0])
    assert calls >= 20 and in_ring < calls, stats


def test_module_images_are_cached_by_content(oriond):
    assert_passed(oriond.run("vadd_shared"))
    cached = list((oriond.tmp / "cache").iterdir())
    assert cached, "the module image was not cached"
    stamp = {p: p.stat().st_mtime_ns for p in cached}
    assert_passed(oriond.run("vadd_shared"))
    assert {p: p.stat().st_mtime_ns for p in cached} == stamp, "a cached image was uploaded again"


def test_no_oriond_is_a_clear_error(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(PREFIX / "lib" / "orion"), ORION_SHM=str(tmp_path / "nothing"))
    r = subprocess.run([TEST_BIN / "device_props"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot use Orion region" in r.stderr


def test_bad_config_is_one_clear_line(tmp_path):
    conf = tmp_path / "server.conf"
    conf.write_text("[server]\n    vgpu_count = lots\n")
    r = subprocess.run([PREFIX / "bin" / "oriond", "--config", conf, "--log-dir", tmp_path], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "vgpu_count = 'lots'" in r.stderr


def test_orion_shm_messages(tmp_path):
    shm = PREFIX / "bin" / "orion-shm"
    r = subprocess.run([shm, "-i", "3", "-s", "32", "-d", tmp_path], capture_output=True, text=True)
    assert r.stdout.strip() == f"{tmp_path}/orionsock3 is successfully created."
    assert (tmp_path / "orionsock3").stat().st_size == 32 << 20
    r = subprocess.run([shm, "-i", "3", "-s", "32", "-d", tmp_path], capture_output=True, text=True)
    assert r.stdout.strip() == f"{tmp_path}/orionsock3 has already exists."
    r = subprocess.run([shm, "-s", "8", "-d", tmp_path], capture_output=True, text=True)
    assert r.returncode != 0


def test_many_threads_share_one_channel(oriond):
    assert_passed(oriond.run("threads", ORION_GMEM=2048), expect_checks=8)


REQUIRED = """cuInit cuDriverGetVersion cuDeviceGet cuDeviceGetCount cuDeviceGetName cuDeviceGetUuid_v2
cuDeviceGetAttribute cuDeviceTotalMem_v2 cuDeviceGetPCIBusId cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease_v2
cuCtxCreate_v4 cuCtxDestroy_v2 cuCtxSetCurrent cuCtxGetCurrent cuCtxPushCurrent_v2 cuCtxPopCurrent_v2
cuCtxSynchronize cuMemAlloc_v2 cuMemFree_v2 cuMemGetInfo_v2 cuMemGetAddressRange_v2 cuMemAllocHost_v2
cuMemHostAlloc cuMemFreeHost cuMemHostGetDevicePointer_v2 cuMemHostRegister_v2 cuMemcpyHtoD_v2
cuMemcpyDtoH_v2 cuMemcpyDtoD_v2 cuMemcpyHtoDAsync_v2 cuMemcpyDtoHAsync_v2 cuMemcpyDtoDAsync_v2 cuMemcpy2D_v2
cuMemcpy2DAsync_v2 cuMemcpy cuMemcpyAsync cuMemsetD8_v2 cuMemsetD16_v2 cuMemsetD32_v2 cuMemsetD8Async
cuMemsetD16Async cuMemsetD32Async cuStreamCreate cuStreamDestroy_v2 cuStreamSynchronize cuStreamQuery
cuStreamWaitEvent cuEventCreate cuEventRecord cuEventSynchronize cuEventQuery cuEventElapsedTime_v2
cuLibraryLoadData cuModuleLoadData cuModuleLoadFatBinary cuModuleGetFunction cuLibraryGetKernel
cuKernelGetFunction cuModuleGetGlobal_v2 cuLibraryGetGlobal cuFuncGetAttribute cuFuncGetParamInfo
cuLaunchKernel cuLaunchKernelEx cuOccupancyMaxActiveBlocksPerMultiprocessor cuPointerGetAttribute
cuPointerGetAttributes cuGetErrorName cuGetErrorString cuGetProcAddress_v2 cuGetExportTable""".split()


def test_coverage_report_lists_the_required_entry_points_as_real():
    lib = PREFIX / "lib" / "orion" / "libcuda.so.1"
    out = subprocess.run([ROOT / "scripts" / "coverage-report", lib], capture_output=True, text=True, check=True).stdout
    real = set(re.findall(r"^  real (\S+)$", out, re.M))
    assert not [s for s in REQUIRED if s not in real], [s for s in REQUIRED if s not in real]
    # Every driver entry point of cuda.h (guest/src/cuda_api.inc) is exported: real, or the stub that
    # answers NOT_SUPPORTED.
    stubs = int(re.search(r"^stub (\d+)$", out, re.M).group(1))
    declared = len(re.findall(r"^ORION_CUDA_SYMBOL\(", (ROOT / "guest" / "src" / "cuda_api.inc").read_text(), re.M))
    assert declared > 650 and len(real) + stubs == declared, (len(real), stubs, declared)
    # Only driver API symbols are exported, and the private query Orion's libnvidia-ml.so.1 calls
    # (guest/src/nvml_bridge.h).
    syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout.split("\n")
    names = [l.split()[-1] for l in syms if l.strip()]
    assert all(n.startswith("cu") or n == "orion_nvml_query" for n in names), [n for n in names if not n.startswith("cu")]


def test_per_thread_default_stream_program(oriond):
    # Built with --default-stream per-thread: cudart asks for the _ptds/_ptsz entry points.
    r = oriond.run("vadd_ptds", ORION_COVERAGE=1)
    assert_passed(r)
    assert re.search(r"orion-coverage: \d+ entry points called, \d+ real, 0 not supported", r.stderr), r.stderr


def test_nvidia_cublas_runs_on_top_api_level(oriond_api_level):
    """cuBLAS's API over Orion, at the API level (--sim-unexecutable skip: its SASS-only GEMM is
    accepted and NOT run; test_compute.py checks the default, where the GEMM fails honestly)."""
    oriond = oriond_api_level
    r = oriond.run("cublas", ORION_GMEM=2048, ORION_COVERAGE=1)
    assert_passed(r, expect_checks=4)
    # cuBLAS chose and launched one of its own kernels (a CUTLASS/cuBLAS GEMM) through Orion.
    assert any(re.search("gemm", l["kernel"], re.I) and l["exec"] == "skipped" for l in launched(oriond.launches())), (
        oriond.launches()[-5:])


def test_orion_check_runtime_client_and_server(oriond, tmp_path):
    check = PREFIX / "bin" / "orion-check"
    r = subprocess.run([check, "runtime", "client"], env=oriond.env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"Found through :\s+ORION_SHM", r.stdout)
    assert re.search(r"Orion Server serves this region\s+\[Yes\]", r.stdout)
    # The server view, through oriond's control socket.
    conf = tmp_path / "check.conf"
    conf.write_text(f"[server]\n    vgpu_count = 4\n[orion]\n    control_socket = {oriond.tmp}/oriond.sock\n")
    r = subprocess.run([check, "--config", conf, "runtime", "server"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"Enable SHM\s+\[Yes\]", r.stdout)
    assert "There are 4 vGPU under managed by Orion Server. 4 vGPU are free now." in r.stdout
    # No oriond behind a region: a clear "no".
    oriond.stop()
    r = subprocess.run([check, "runtime", "client"], env=oriond.env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and re.search(r"Orion Server serves this region\s+\[No\]", r.stdout), r.stdout


def test_two_vgpus_are_two_devices_with_their_quota(oriond):
    r = oriond.run("multi_device", ORION_VGPU=2, ORION_GMEM=512)
    assert_passed(r, expect_checks=11)
    assert "DEVICES count=2" in r.stdout
    # Both vGPUs of the request were placed (packed onto the one simulated GPU).
    assert re.search(r"vGPUs 0/\d:512MiB,0/\d:512MiB", oriond.log()), oriond.log()[-1500:]


def wait_ready(proc):
    line = ""
    while "READY" not in line:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()


@pytest.mark.parametrize("how", ["truncate", "random"])
def test_a_tenant_truncating_its_region_ends_only_its_sessions(tmp_path, how):
    # Two regions and TCP clients served by one oriond. A tenant with region A open read-write
    # shrinks it (or truncates it and writes random bytes over it): oriond's main process must not
    # die of SIGBUS; it ends A's sessions, says why, and goes on serving region B and TCP.
    from conftest import Oriond
    subprocess.run([PREFIX / "bin" / "orion-shm", "-i", "1", "-s", "64", "-d", tmp_path], check=True,
                   capture_output=True)
    region_b = tmp_path / "orionsock1"
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port, extra_args=("--shm", region_b))
    d.port = port
    a = d.popen("sleeper", 16)
    b = d.popen("sleeper", 16, ORION_SHM=region_b)
    try:
        wait_ready(a)
        wait_ready(b)
        size = d.region.stat().st_size
        if how == "truncate":
            os.truncate(d.region, 4096)
        else:
            with open(d.region, "r+b") as f:
                f.truncate(0)
                for _ in range(size >> 20):
                    f.write(os.urandom(1 << 20))
        # The tenant's own process goes (its program SIGBUSes on the shrunken file, or it exits):
        # oriond then recycles the channel, touching the truncated pages.
        a.kill()
        a.wait()
        wait_until(lambda: "no longer served" in d.log(), 10,
                   lambda: (d.proc.returncode, d.read_stderr()[-2000:], d.log()[-3000:]), interval=0.1, alive=d.alive)
        assert re.search(r"region .*orionsock0.*(truncated|overwritten)", d.log()), d.log()[-2000:]
        time.sleep(0.5)
        assert d.alive()
        # Region B's session is untouched and B still admits new clients; TCP too.
        assert b.poll() is None
        assert_passed(d.run("device_props", ORION_SHM=region_b))
        assert_passed(run_tcp(d, "device_props"))
        ended = re.findall(r"Session (\d+) exits", d.log())
        created = dict((m.group(2), m.group(1)) for m in
                       re.finditer(r"Creating session (\d+) for 'sleeper' \(pid (\d+)\)", d.log()))
        assert created[str(a.pid)] in ended, d.log()[-2000:]
        assert created[str(b.pid)] not in ended, d.log()[-2000:]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        d.stop()


def test_an_overwritten_region_header_is_formatted_afresh(oriond):
    # Issue #11 item 11: one write over a region's header used to break it for every later client
    # until oriond restarted, with nothing logged. oriond ends the region's sessions, says why, and,
    # once none is left, formats the region afresh: a new client is served again.
    a = oriond.popen("sleeper", 16)
    try:
        wait_ready(a)
        with open(oriond.region, "r+b") as f:
            f.write(b"\xff" * 64)  # over the magic, layout version and sizes
        wait_until(lambda: "formatted afresh after a tenant broke it; served again" in oriond.log(), 10,
                   lambda: oriond.log()[-3000:], interval=0.1, alive=oriond.alive)
        log = oriond.log()
        assert re.search(r"region .*orionsock0 was overwritten .* ending its 1 session", log), log[-3000:]
        assert log.index("was overwritten") < log.index("formatted afresh after")
        assert re.search(r"Session \d+ exits", oriond.log()), oriond.log()[-2000:]  # its session was ended
        assert_passed(oriond.run("device_props"))
        assert_passed(oriond.run("device_props"))
    finally:
        a.kill()
        a.wait()


def test_a_region_a_port_and_a_control_socket_have_one_oriond_each(tmp_path):
    # A second oriond must refuse to start, loudly, instead of reformatting a live region (its
    # clients and the first oriond's would then share channels), taking over the control socket
    # or splitting the TCP port.
    from conftest import Oriond
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    port = free_port()
    d = Oriond(first_dir, tcp_port=port)
    d.port = port
    sleeper = d.popen("sleeper", 16)
    try:
        wait_ready(sleeper)
        header = d.region.read_bytes()[:64]

        def second(name, conf_extra="", args=()):
            sub = tmp_path / name
            sub.mkdir()
            conf = sub / "server.conf"
            conf.write_text("[server]\n    vgpu_count = 4\n" + conf_extra)
            return subprocess.run([PREFIX / "bin" / "oriond", "--config", conf, "--backend", "sim", "--foreground",
                                   "--log-dir", sub / "logs", "--lease-timeout-ms", "1000", *map(str, args)],
                                  capture_output=True, text=True, timeout=30)

        # The same region, named.
        r = second("same_region", args=("--shm", d.region, "--control-socket", tmp_path / "s1.sock", "-p", 0))
        assert r.returncode != 0 and "already served by another oriond" in r.stderr, r.stderr[-2000:]
        # Every orionsock* under shm_path_base (no --shm): finds the same region.
        r = second("scan", conf_extra=f"    enable_shm = true\n[server-shm]\n    shm_path_base = {first_dir}\n",
                   args=("--control-socket", tmp_path / "s2.sock", "-p", 0))
        assert r.returncode != 0 and "already served by another oriond" in r.stderr, r.stderr[-2000:]
        assert "oriond cannot start" in (tmp_path / "scan" / "logs" / "server.log").read_text()
        # Its own region, but the first one's control socket.
        subprocess.run([PREFIX / "bin" / "orion-shm", "-i", "5", "-s", "32", "-d", tmp_path], check=True,
                       capture_output=True)
        r = second("same_socket", args=("--shm", tmp_path / "orionsock5", "--control-socket", first_dir / "oriond.sock",
                                         "-p", 0))
        assert r.returncode != 0 and "is in use: another oriond is running" in r.stderr, r.stderr[-2000:]
        # Its own region and socket, but the first one's TCP port.
        r = second("same_port", args=("--shm", tmp_path / "orionsock5", "--control-socket", tmp_path / "s3.sock",
                                      "-b", "127.0.0.1", "-p", port))
        assert r.returncode != 0 and "Address already in use" in r.stderr, r.stderr[-2000:]
        # The first oriond was not disturbed: same header (not reformatted), same session, same socket.
        assert d.region.read_bytes()[:40] == header[:40]  # bytes 40..48 are the heartbeat
        assert d.region.read_bytes()[48:64] == header[48:64]
        assert d.alive() and sleeper.poll() is None
        assert_passed(d.run("device_props"))
        assert_passed(run_tcp(d, "device_props"))
        assert (first_dir / "oriond.sock").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        d.stop()


def test_threads_calling_cuinit_while_the_first_initialises(oriond):
    # The first cuInit is stalled after it connected (a guest-runtime test hook); 8 more threads call
    # cuInit and use the primary context meanwhile. They must wait for initialisation to finish
    # instead of running into empty context tables.
    r = oriond.run("driver_races", "init", ORION_TEST_INIT_DELAY_MS=1500, timeout=60)
    assert_passed(r, expect_checks=17)


def test_threads_allocating_and_freeing_at_once_keep_their_ranges(oriond):
    # The sim backend hands freed addresses out again (as a GPU does): a free must drop its local
    # range before the address can be handed to another thread, never after.
    for _ in range(3):
        assert_passed(oriond.run("driver_races", "free", ORION_GMEM=2048, timeout=120), expect_checks=8)


def test_threads_copying_setting_and_synchronizing_at_once(oriond):
    # Eight threads, each its own stream, pinned and device buffers: sync and async copies, memsets,
    # events and synchronizations interleave through one session; every byte is checked. The
    # ThreadSanitizer build (scripts/sanitize) runs this too.
    assert_passed(oriond.run("driver_races", "mixed", ORION_GMEM=2048, timeout=300), expect_checks=8)


def test_threads_setting_context_flags_at_once(oriond):
    assert_passed(oriond.run("driver_races", "flags", timeout=60))


def test_tiny_allocations_are_charged_at_the_allocation_granularity(oriond):
    # Each allocation costs at least 512 bytes (kAllocGranularity) against the quota: 20000 one-byte
    # allocations do not fit in 8 MiB (16384 x 512 B), as they would not on a GPU.
    r = oriond.run("driver_races", "tiny", ORION_GMEM=8, timeout=120)
    assert_passed(r, expect_checks=3)
    n = int(re.search(r"^TINY allocated=(\d+)$", r.stdout, re.M).group(1))
    assert 0 < n < 20000 and n * 512 <= 8 << 20, n
    assert re.search(r"cuMemAlloc\(\): memory 9 MB exceeds <vgpu \d+, pgpu \d+> quota \(8 MB\)",
                     oriond.session_logs()), oriond.session_logs()[-1000:]


def test_logs_and_module_cache_are_not_world_readable(oriond):
    # Logs name tenants' processes and hosts; the module cache holds their code.
    assert_passed(oriond.run("vadd_shared"))
    logs = [oriond.logs / "server.log", *sorted((oriond.logs / "session").glob("*.log"))]
    assert len(logs) >= 2
    for p in logs:
        assert p.stat().st_mode & 0o007 == 0, f"{p} is {oct(p.stat().st_mode)}"
    cache = oriond.tmp / "cache"
    assert cache.stat().st_mode & 0o077 == 0, oct(cache.stat().st_mode)
    cached = list(cache.iterdir())
    assert cached
    for p in cached:
        assert p.stat().st_mode & 0o077 == 0, f"{p} is {oct(p.stat().st_mode)}"


def test_partial_entry_points_listed_are_implemented():
    # docs/coverage-partial.txt names implemented entry points that refuse part of their input: each
    # must still be a strong definition in libcuda.so.1, or the coverage report would miscount.
    from conftest import ROOT
    names = [l.split("|")[0].strip() for l in (ROOT / "docs" / "coverage-partial.txt").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    nm = subprocess.run(["nm", "-D", "--defined-only", str(PREFIX / "lib" / "orion" / "libcuda.so.1")],
                        capture_output=True, text=True, check=True).stdout
    strong = {f.split()[2] for f in nm.splitlines() if len(f.split()) == 3 and f.split()[1] == "T"}
    assert names and not [n for n in names if n not in strong], [n for n in names if n not in strong]


def test_a_tenants_lock_on_a_region_does_not_stop_oriond(tmp_path):
    """Issue #22 item 6: any process that can open a region file can flock it, and oriond then
    refused to start at all, blaming "another oriond". Now a lock held by a process that is not an
    oriond (not this executable run by this user: here python3) only keeps that region back: oriond
    starts, names the holder, serves TCP and its other region meanwhile, and serves the region once
    the lock is released. (A lock held by another oriond still refuses the start: the test above.)"""
    from conftest import Oriond
    port = free_port()
    subprocess.run([PREFIX / "bin" / "orion-shm", "-i", "0", "-s", "64", "-d", tmp_path], check=True,
                   capture_output=True)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, sys, time\n"
                               f"f = open({str(tmp_path / 'orionsock0')!r}, 'rb')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('LOCKED', flush=True)\ntime.sleep(600)\n"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "LOCKED"
    d = None
    locked = tmp_path / "orionsock0"
    try:
        (tmp_path / "d").mkdir()
        d = Oriond(tmp_path / "d", tcp_port=port, extra_args=("--shm", locked))  # its own region, and the locked one
        d.port = port
        assert re.search(rf"orionsock0 is locked by pid {holder.pid} \(python3?[^)]*\), not by an oriond", d.log()), \
            d.log()[-2000:]
        assert_passed(run_tcp(d, "device_props"))  # served meanwhile: TCP, and its other region
        assert_passed(d.run("device_props"))
        assert "is already served by another oriond" not in d.log()
        holder.kill()
        holder.wait()
        wait_until(lambda: "its lock was released; serving it now" in d.log(), 10,
                   lambda: d.log()[-2000:], interval=0.1)
        assert_passed(d.run("device_props", ORION_SHM=locked))  # the region now
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if d is not None:
            d.stop()
