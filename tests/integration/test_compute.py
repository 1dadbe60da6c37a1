"""Kernels compute without a GPU: the sim backend executes each kernel's PTX on the CPU (ptx/), so
results come back through Orion and are checked against the host, over shared memory and TCP.
Faults (out-of-bounds, assert) end only the faulting session, device printf reaches the client's
stdout. A kernel the sim cannot execute fails its launch (issue #20), and --sim-execute none and
--sim-unexecutable skip show nothing is faked when kernels do not run."""
import re

import pytest

from conftest import Oriond, assert_computed, assert_passed, checks, free_port, launched, run_tcp


def test_kernels_compute_over_shared_memory(oriond):
    r = oriond.run("compute")
    assert_computed(r)
    launches = oriond.launches()
    assert len(launches) >= 9 and all(l["exec"] == "ran" for l in launches), launches


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


@pytest.mark.parametrize("translator", ["background", "sync", "0"])
def test_samples_compute_the_hosts_results_translated_or_not(tmp_path, monkeypatch, translator):
    """tests/cuda/samples (matrixMul's size, a reduction with warp shuffles, a scan, a transpose,
    Black-Scholes, a histogram with shared atomics: nvcc's PTX) gives the host's results with the
    PTX translator (issue #26) compiling each kernel on its own thread while the first launch runs on
    the interpreter (the default), compiling before the first launch (ORION_PTX_JIT=sync), and off
    (ORION_PTX_JIT=0: the interpreter alone). Each kernel runs twice; its result is checked after the
    second launch."""
    if translator != "background":
        monkeypatch.setenv("ORION_PTX_JIT", translator)  # oriond inherits it: its workers read it
    d = Oriond(tmp_path)
    try:
        r = d.run("samples", "all", "2", timeout=300)
        assert_passed(r, expect_checks=6)
        ran = {l["kernel"] for l in d.launches() if l["exec"] == "ran"}
        for kernel in ("matmul", "reduce", "scan", "transpose", "blackscholes", "histogram"):
            assert any(kernel in k for k in ran), (kernel, ran)
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
    coop = launched(oriond.launches(), "grid_exchange")
    assert coop and coop[0]["cooperative"] is True and coop[0]["exec"] == "ran", coop
    assert all(not l["cooperative"] for l in launched(oriond.launches()) if "grid_exchange" not in l["kernel"])


def test_streams_are_ordered_by_events_only(oriond):
    # The sim runs work of different streams in an order CUDA allows but a racy program does not
    # expect: a kernel after cuStreamWaitEvent sees the producer's data, one without the wait reads
    # stale data, deterministically (so a dropped wait in Orion would fail stream_wait_orders).
    r = oriond.run("compute", "streams")
    assert_passed(r, expect_checks=3)
    assert checks(r.stdout)["missing_wait_reads_stale"] == "ok"
    log = oriond.launches()
    assert any(l["exec"] == "deferred" for l in launched(log, "_Z9copy_plus")), log
    assert any(l["event"] == "ran" and "_Z9copy_plus" in l["kernel"] and l["exec"] == "ran" for l in log), log


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
    assert d.launches() and all(l["exec"] == "off" for l in d.launches()), d.launches()
    # oriond says so at start-up, and the client is told once, at its first launch.
    assert "*** --sim-execute none: kernels are validated and logged, NEVER executed." in d.log()
    told = re.findall(r"^\[warning\] oriond: this oriond runs with --sim-execute none: .*NEVER executed", r.stderr,
                      re.M)
    assert len(told) == 1, r.stderr[-2000:]


def test_unexecutable_kernels_fail_their_launch(oriond):
    # tests/cuda/unexecutable.cu: its own kernel is sm_90 SASS only, so the launch fails at once
    # with cudaErrorNoKernelImageForDevice (the client knows from ModuleGetFunction's reply: nothing
    # reaches oriond); a newer PTX ISA fails the load; an mma kernel's launch fails with NOT_SUPPORTED
    # (found when oriond lowers it). Nothing is written, the context stays usable.
    r = oriond.run("unexecutable")
    assert_passed(r, expect_checks=13)
    assert checks(r.stdout)["sass_only_launch_refused"] == "ok"
    assert checks(r.stdout)["refused_launch_invalidates_capture"] == "ok"
    # The client's log names each refused kernel once, with the reason and the error.
    told = re.findall(r"^\[warning\] kernel (\S+) cannot run on this vGPU: its module has no PTX \(SASS only\).*"
                      r"CUDA_ERROR_NO_BINARY_FOR_GPU \(209\)", r.stderr, re.M)
    assert told == ["_Z4fillPii"], r.stderr[-2000:]
    told = re.findall(r"^\[warning\] oriond: kernel (\S+) cannot run on the sim backend: .*'mma\.sync\S*' is not "
                      r"supported by the sim executor; its launches fail with CUDA_ERROR_NOT_SUPPORTED \(801\)$",
                      r.stderr, re.M)
    assert told == ["mma_k"], r.stderr[-2000:]
    # oriond never saw the SASS-only launches; it logged the mma one as refused, and ran nothing.
    launches = oriond.launches()
    assert not launched(launches, "_Z4fillPii"), launches
    assert [l["exec"] for l in launches if l["kernel"] == "mma_k"] == ["refused:801"], launches
    assert "refused (222): PTX .version 9.9 is newer than this driver (13.0) supports (PTX ISA 9.0)" in (
        oriond.session_logs())


def test_cublas_sass_only_gemm_fails_honestly(oriond):
    # cuBLAS 13.0's GEMM kernels are SASS only: cublasSgemm reports CUBLAS_STATUS_EXECUTION_FAILED
    # (13) instead of success with nothing computed; the context goes on (sync, destroy).
    r = oriond.run("cublas", timeout=300)
    c = checks(r.stdout)
    assert r.returncode == 1 and c["cublas_sgemm"] == "FAIL status 13", r.stdout
    assert c["cublas_create"] == c["sync"] == c["cublas_destroy"] == "ok", c
    told = re.findall(r"^\[warning\] kernel (\S+) cannot run on this vGPU: .*CUDA_ERROR_NO_BINARY_FOR_GPU \(209\)",
                      r.stderr, re.M)
    assert told and all(re.search("gemm", k, re.I) for k in told), r.stderr[-2000:]
    assert not [l for l in oriond.launches() if re.search(r"gemm", l["kernel"], re.I) and l["exec"] == "ran"]


def test_skip_mode_accepts_and_runs_nothing_api_level(oriond_api_level):
    """--sim-unexecutable skip (API-level testing only): the SASS-only launch is accepted and NOT
    run (the buffer stays as it was), oriond says so loudly at start-up and the client is told at
    the kernel's first launch."""
    d = oriond_api_level
    r = d.run("unexecutable", "api-level")
    assert_passed(r, expect_checks=2)
    assert checks(r.stdout)["api_level_nothing_computed"] == "ok"
    assert "*** --sim-unexecutable skip: kernels the sim cannot run (SASS only, ...) are accepted and NOT executed." in (
        d.log())
    told = re.findall(r"^\[warning\] oriond: kernel (\S+) was NOT executed \(--sim-unexecutable skip\): .*SASS only.*"
                      r"not computed$", r.stderr, re.M)
    assert told == ["_Z4fillPii"], r.stderr[-2000:]
    assert [l["exec"] for l in launched(d.launches()) if l["kernel"] == "_Z4fillPii"] == ["skipped"], d.launches()
