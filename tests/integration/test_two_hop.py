"""The cuda backend, run in CI without a GPU (issue #10): oriond A uses `--backend cuda` with its
driver library pointed at Orion's own libcuda.so.1, whose ORION_SHM leads to oriond B on the sim
backend. Every cuda-backend path a program exercises (contexts, the registered data window, copies,
modules, launches, streams, events, the quota) then meets a complete driver-API implementation,
and the results that B's PTX executor computes come back through both hops."""
import pytest

from conftest import PREFIX, TEST_BIN, Oriond, assert_passed, checks, launched, outcomes_of, smi_json, spin_kernels


@pytest.fixture
def two_hop(tmp_path, monkeypatch):
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    # A's session workers end with _exit (no Goodbye reaches B), so B frees their slots at lease
    # expiry: give B enough slots for programs run back to back.
    b = Oriond(tmp_path / "b", conf_text="[server]\n    vgpu_count = 16\n[server-shm]\n    shm_buffer_size = 16\n")
    # oriond A's probe and its session workers are clients of B (each worker its own session).
    monkeypatch.setenv("ORION_SHM", str(b.region))
    monkeypatch.setenv("ORION_VGPU", "1")
    monkeypatch.setenv("ORION_GMEM", "1024")
    monkeypatch.setenv("ORION_LOG_LEVEL", "WARNING")
    a = Oriond(tmp_path / "a", extra_args=("--cuda-driver", str(PREFIX / "lib" / "orion" / "libcuda.so.1")),
               backend="cuda")
    for k in ("ORION_SHM", "ORION_VGPU", "ORION_GMEM", "ORION_LOG_LEVEL"):
        monkeypatch.delenv(k)
    yield a, b
    a.stop()
    b.stop()


def test_the_cuda_backend_serves_programs_over_a_second_oriond(two_hop):
    a, b = two_hop
    assert "(backend cuda)" in a.log(), a.log()[-2000:]
    assert "Orion Simulated GPU" in a.log()  # the GPU A found is B's vGPU
    for prog in ["compute", "device_props", "memory", "kernel_params", "driver_api", "streams_events", "vadd_shared",
                 "vmm", "graphs", "hostfunc", "arrays"]:
        r = a.run(prog, ORION_GMEM=512)
        assert_passed(r)
        if prog == "compute":
            assert all(v == "ok" for k, v in checks(r.stdout).items()), checks(r.stdout)
            assert sum(l.startswith("DEVPRINTF") for l in r.stdout.splitlines()) == 4, r.stdout
    # JIT linking: A's cuda backend hands the linked PTX to its driver (here B's vGPU) to compile.
    assert_passed(a.run("jit_link", TEST_BIN / "link_a.ptx", TEST_BIN / "link_b.fatbin", ORION_GMEM=512),
                  expect_checks=6)
    # A cooperative launch goes through A's cuda backend (CU_LAUNCH_ATTRIBUTE_COOPERATIVE) to B.
    assert_passed(a.run("compute", "coop", ORION_GMEM=512), expect_checks=3)
    assert any(l["cooperative"] and l["exec"] == "ran" for l in launched(b.launches(), "grid_exchange")), b.launches()
    # Kernels ran at the far end, launched by A's cuda backend.
    assert "ran" in outcomes_of(b.launches(), "_Z6matmul"), b.launches()[-5:]
    assert a.alive() and b.alive()


def test_a_fault_at_the_far_end_stays_in_its_session(two_hop):
    a, b = two_hop
    r = a.run("compute", "oob")
    assert_passed(r, expect_checks=2)
    assert a.alive() and b.alive()
    assert_passed(a.run("compute"), expect_checks=8)


def test_cuda_ipc_through_the_cuda_backend(two_hop):
    # A's cuda backend exports with the driver's own cuIpcGetMemHandle (here B's, through Orion's
    # libcuda) and carries that handle inside its ticket; A's other session opens it.
    from conftest import run_pair
    a, b = two_hop
    consumer, producer = run_pair(a)
    assert_passed(consumer, expect_checks=5)
    assert_passed(producer, expect_checks=2)
    assert checks(producer.stdout)["producer_sees_consumer_kernel"] == "ok"
    assert a.alive() and b.alive()


def test_the_cuda_backend_enforces_and_reports_compute_shares(tmp_path, monkeypatch):
    """ORION_RATIO on the cuda backend (its turns, ComputeTurns): two saturating tenants 30/70 through
    A get their ratios of the device within 3 points, and A's `sessions` (orion-smi) reports the
    shares as enforced and measured (it said "(off)" for the cuda backend before). B runs without a
    scheduler (--compute-share off), so only A's turns order the kernels."""
    import subprocess
    import time
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    b = Oriond(tmp_path / "b", conf_text="[server]\n    vgpu_count = 16\n[server-shm]\n    shm_buffer_size = 16\n",
               extra_args=("--compute-share", "off"))
    for k, v in (("ORION_SHM", str(b.region)), ("ORION_VGPU", "1"), ("ORION_GMEM", "1024"),
                 ("ORION_LOG_LEVEL", "WARNING")):
        monkeypatch.setenv(k, v)
    a = Oriond(tmp_path / "a", extra_args=("--cuda-driver", str(PREFIX / "lib" / "orion" / "libcuda.so.1")),
               backend="cuda")
    for k in ("ORION_SHM", "ORION_VGPU", "ORION_GMEM", "ORION_LOG_LEVEL"):
        monkeypatch.delenv(k)
    try:
        start = int(time.time() * 1000) + 2500
        procs = [subprocess.Popen([str(TEST_BIN / "spin"), str(start), str(start + 5000), "400"],
                                  env=a.env(ORION_GMEM=256, ORION_RATIO=r), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in (30, 70)]
        time.sleep(max(0.0, (start + 3500) / 1000 - time.time()))
        smi = smi_json(a)
        counts = spin_kernels(procs)
        share = counts[0] / sum(counts)
        print(f"cuda backend 30/70: {counts}, {share:.3f}")
        assert 0.27 <= share <= 0.33, counts
        got = {}
        for s in smi:
            k = s["placements"][0]["compute"]
            got[k["ratio"]] = k
        assert set(got) == {30, 70}, smi
        for ratio, k in got.items():
            assert k["enforced"] is True and k["policy"] == "share", k
            assert abs(k["share_1s"] - ratio / 100) <= 0.10 and k["device_s"] > 0 and k["turns"] > 0, got
        assert "gets 30% (share) of its compute" in a.session_logs()
    finally:
        a.stop()
        b.stop()
