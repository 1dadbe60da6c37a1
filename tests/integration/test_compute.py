"""Kernels compute without a GPU: the sim backend executes each kernel's PTX on the CPU (ptx/), so
results come back through Orion and are checked against the host, over shared memory and TCP.
Faults (out-of-bounds, assert) end only the faulting session, device printf reaches the client's
stdout, and --sim-execute none shows nothing is faked when kernels do not run."""
import re

from conftest import Oriond, assert_passed, checks
from test_tcp import free_port, run_tcp

RESULTS = ["vadd", "matmul_shared_tiles", "shuffle_reduction", "scan", "histogram_atomics", "divergent_warp",
           "struct_by_value_double", "half_precision", "profiler_start_stop"]


def assert_computed(r):
    assert_passed(r, expect_checks=len(RESULTS))
    c = checks(r.stdout)
    assert all(c.get(k) == "ok" for k in RESULTS), c
    # Device printf lines reach this process's stdout, after the host line before the kernel and
    # before the one after the synchronize.
    lines = r.stdout.splitlines()
    dev = [l for l in lines if l.startswith("DEVPRINTF")]
    assert sorted(dev) == sorted(f"DEVPRINTF block {b} thread {t} x=42 pi=3.142" for b in (0, 1) for t in (0, 1)), dev
    assert lines.index("HOST before printf kernel") < lines.index(dev[0])
    assert lines.index(dev[-1]) < lines.index("HOST after printf kernel")


def test_kernels_compute_over_shared_memory(oriond):
    r = oriond.run("compute")
    assert_computed(r)
    launches = oriond.launches()
    assert len(launches) >= 9 and all(l.endswith(" exec=ran") for l in launches), launches


def test_kernels_compute_over_tcp(tmp_path):
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port)
    d.port = port
    try:
        r = run_tcp(d, "compute")
        assert "Orion transport: TCP to 127.0.0.1" in r.stderr, r.stderr
        assert_computed(r)
    finally:
        d.stop()


def test_device_assert_is_sticky_and_printed(oriond):
    r = oriond.run("compute", "assert")
    assert_passed(r, expect_checks=2)
    assert re.search(r"compute\.cu:\d+: void asserting\(int\): block: \[[01],0,0\], thread: \[37,0,0\] "
                     r"Assertion `threadIdx.x != bad` failed\.", r.stdout), r.stdout
    assert "failed (710): device-side assert" in oriond.session_logs()


def test_cooperative_launch_synchronizes_the_grid(oriond):
    r = oriond.run("compute", "coop")
    assert_passed(r, expect_checks=3)
    coop = [l for l in oriond.launches() if "grid_exchange" in l]
    assert coop and "cooperative=1" in coop[0] and coop[0].endswith(" exec=ran"), coop


def test_streams_are_ordered_by_events_only(oriond):
    # The sim runs work of different streams in an order CUDA allows but a racy program does not
    # expect: a kernel after cuStreamWaitEvent sees the producer's data, one without the wait reads
    # stale data, deterministically (so a dropped wait in Orion would fail stream_wait_orders).
    r = oriond.run("compute", "streams")
    assert_passed(r, expect_checks=3)
    assert checks(r.stdout)["missing_wait_reads_stale"] == "ok"
    log = oriond.launches()
    assert any(" launch _Z9copy_plus" in l and l.endswith(" exec=deferred") for l in log), log
    assert any(" ran _Z9copy_plus" in l and l.endswith(" exec=ran") for l in log), log


def test_peer_access_between_the_vgpus_of_a_process(oriond):
    r = oriond.run("compute", "peer", ORION_VGPU=2, ORION_GMEM=256)
    assert_passed(r, expect_checks=8)
    assert checks(r.stdout)["kernel_reads_peer_memory"] == "ok"


def test_out_of_bounds_kernel_ends_only_its_session(oriond):
    r = oriond.run("compute", "oob")
    assert_passed(r, expect_checks=2)
    assert re.search(r"failed \(700\): write of 4 bytes at global address 0x[0-9a-f]+ outside the session's memory",
                     oriond.session_logs()), oriond.session_logs()[-2000:]
    # oriond goes on, and the next client computes.
    assert oriond.alive()
    assert_computed(oriond.run("compute"))


def test_execute_none_validates_and_logs_only(make_oriond):
    d = make_oriond(extra_args=("--sim-execute", "none"))
    r = d.run("compute")
    c = checks(r.stdout)
    # Nothing computed the results, and nothing pretends it did.
    assert c.get("vadd", "").startswith("FAIL"), c
    assert not any(l.startswith("DEVPRINTF") for l in r.stdout.splitlines())
    assert d.launches() and all(l.endswith(" exec=off") for l in d.launches()), d.launches()


def test_sass_only_kernels_are_marked_not_executed(oriond):
    # cuBLAS ships SASS only: its kernels are validated and logged, marked exec=no-ptx, and the
    # session log says once per kernel that it was not executed.
    r = oriond.run("cublas", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "CHECK sgemm_result skipped-sim (SASS-only kernel" in r.stdout, r.stdout
    gemm = [l for l in oriond.launches() if re.search(r"gemm|Gemm", l)]
    assert gemm and all(l.endswith(" exec=no-ptx") for l in gemm), gemm[:3]
    assert re.search(r"kernel \S*(gemm|Gemm)\S* was not executed: .*SASS only", oriond.session_logs())
    # ... and the client is told once per kernel, at warning level.
    told = re.findall(r"^\[warning\] oriond: kernel (\S+) was not executed: ", r.stderr, re.M)
    assert told and len(told) == len(set(told)), r.stderr[-2000:]
