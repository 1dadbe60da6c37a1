"""Compute share (issue #21, host/include/orion/host/compute_share.h): ORION_RATIO is each vGPU's
percent of its physical GPU's compute, ORION_RATIO_POLICY `share` (a minimum, work-conserving) or
`cap` (a ceiling). On the sim backend the PTX executor runs one tenant's kernel at a time and picks
the next tenant by weighted fair queuing.

The tenants are tests/cuda/spin: identical compute-bound kernels, launched and waited for again and
again inside one wall-clock window that all tenants of a test share, so their kernel counts compare
their device time. Tolerances are the issue's (±3 points); a window of 5 s holds about 200 kernels
of ~25 ms, so one kernel is half a point, and both tenants see the same machine (noise from other
load hits them alike)."""
import re
import subprocess
import time

import pytest

from conftest import TEST_BIN, Oriond, smi_json, spin_iters, spin_kernels, wait_ready

KERNEL_MS = 25  # each spin kernel's length (spin_iters measures the executor's speed once)
_iters = []


@pytest.fixture(scope="module", autouse=True)
def calibrated(tmp_path_factory):
    """spin's ITERS for kernels of about KERNEL_MS on this machine and build, measured once on an
    oriond of its own (a tenant's session just ended on the oriond under test skewed the next
    window's first shares)."""
    d = Oriond(tmp_path_factory.mktemp("calibrate"))
    try:
        _iters.append(spin_iters(d.env(ORION_GMEM=64), KERNEL_MS))
    finally:
        d.stop()


@pytest.fixture
def one_gpu(tmp_path):
    """oriond on one simulated GPU of four vGPUs."""
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = 16\n",
               extra_args=("--sim-gpus", "1"))
    yield d
    d.stop()


def start_spins(oriond, tenants, window_ms, *extra):
    """Starts one spin per tenant (a dict of extra environment), all in one window that opens in
    1.5 s (every tenant connected and warmed up before it); returns (window start ms, processes)."""
    start = int(time.time() * 1000) + 1500
    return start, [subprocess.Popen([str(TEST_BIN / "spin"), str(start), str(start + window_ms), str(_iters[0]), *extra],
                                    env=oriond.env(ORION_GMEM=64, **t), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for t in tenants]


def spin(oriond, tenants, window_ms=5000):
    """Runs the tenants' spins in one shared window; returns their kernel counts, in order."""
    _, procs = start_spins(oriond, tenants, window_ms)
    return spin_kernels(procs)


def test_two_tenants_get_30_and_70_percent(one_gpu):
    """Both saturating, `share` 30 and 70: each gets its ratio of the device within 3 points
    (HAMi-core's published figures for the same setup: 46/54, and 27/73 with a proposed patch)."""
    a, b = spin(one_gpu, [{"ORION_RATIO": 30}, {"ORION_RATIO": 70}])
    share = a / (a + b)
    print(f"30/70: {a} and {b} kernels, {share:.3f} / {1 - share:.3f}")
    assert 0.27 <= share <= 0.33, (a, b)
    log = one_gpu.session_logs()
    assert "gets 30% (share) of its compute" in log and "gets 70% (share) of its compute" in log


def test_four_tenants_get_10_20_30_40_percent(one_gpu):
    counts = spin(one_gpu, [{"ORION_RATIO": r} for r in (10, 20, 30, 40)], window_ms=8000)
    shares = [c / sum(counts) for c in counts]
    print("10/20/30/40:", counts, [f"{s:.3f}" for s in shares])
    for want, got in zip((0.10, 0.20, 0.30, 0.40), shares):
        assert abs(got - want) <= 0.03, (counts, shares)


def charged_device_s(oriond, pid):
    """(when, device seconds): the device time oriond has charged the tenant of client process
    `pid` so far (orion-smi --json, `compute.device_s`), and the wall time it was read at (time.time(),
    the middle of the call)."""
    t0 = time.time()
    sessions = smi_json(oriond)
    t1 = time.time()
    mine = [s for s in sessions if s["client"]["pid"] == pid]
    assert len(mine) == 1, sessions
    return (t0 + t1) / 2, mine[0]["placements"][0]["compute"]["device_s"]


def pooled_slope(rounds):
    """The least-squares slope of y over x through several rounds of (x, y) points, each round with
    its own intercept."""
    num = den = 0.0
    for pts in rounds:
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        num += sum((x - mx) * (y - my) for x, y in pts)
        den += sum((x - mx) ** 2 for x, _ in pts)
    return num / den


def test_share_is_work_conserving_and_cap_is_a_ceiling(one_gpu):
    """Alone, a 30% `share` tenant holds the device as much of the time as a tenant with no ratio
    (the unused 70% is lent to it); a 30% `cap` tenant holds it 30% of the time, even on an idle GPU,
    and never runs more than 30% of the no-ratio tenant's work.

    Each tenant saturates from its start (SPIN_WARM=1), so the window measures a cap's steady state,
    not the burst (kComputeCapBurstNs) its bucket holds after an idle wait. The runs alternate in
    four rounds of 2.5 s windows, so that a slow phase of the machine (CI's 2 cores are shared) lands
    on each kind alike rather than on one kind's window.

    What is measured is the scheduler's: each tenant's device time over wall time, read from oriond
    (orion-smi's `device_s`, ~10 ms a read) twelve times in each window and fitted (a least-squares
    slope, one intercept per round). The counter moves a kernel (~30-50 ms) at a time, so one round's
    slope is ±0.02 and the four rounds' ±0.005. Kernel counts are not the measure on the sim: each
    tenant is a new worker process, and the executor's speed differs between processes by up to a
    third (here, alone and holding the device 0.979-0.988 of the time, share 30 counted 0.79-1.10 of
    the no-ratio tenant's kernels; CI once counted 0.867 and failed the count's old 0.95 bound), and
    a kernel that follows an idle device often runs slower (a cap tenant rests ~100-150 ms before
    most kernels: CI twice counted 0.21 for a cap whose device time was 0.30). Both are findings for
    issue #26. So the count is held to the cap's ceiling only (<= 0.33)."""
    counts = {"free": 0, "share": 0, "cap": 0}
    rounds = {"free": [], "share": [], "cap": []}
    warm = {"SPIN_WARM": 1}
    kinds = {"free": warm, "cap": {"ORION_RATIO": 30, "ORION_RATIO_POLICY": "cap", **warm},
             "share": {"ORION_RATIO": 30, **warm}}
    for _ in range(4):
        for kind, env in kinds.items():
            start, procs = start_spins(one_gpu, [env], 2500)
            pts = []
            for k in range(12):  # from 0.1 s into the window to 0.1 s before its end
                time.sleep(max(0.0, (start + 100 + 210 * k) / 1000 - time.time()))
                pts.append(charged_device_s(one_gpu, procs[0].pid))
            rounds[kind].append(pts)
            counts[kind] += spin_kernels(procs)[0]
    held = {kind: pooled_slope(r) for kind, r in rounds.items()}
    free, shared, capped = counts["free"], counts["share"], counts["cap"]
    print(f"alone: no ratio {free} kernels holding the device {held['free']:.3f} of the time; share 30 {shared} "
          f"({shared / free:.3f}) holding it {held['share']:.3f}; cap 30 {capped} ({capped / free:.3f}) "
          f"holding it {held['cap']:.3f}")
    # Work-conserving: alone, a 30% share tenant holds the device as much of the time as a tenant with
    # no ratio (the gaps between kernels, a launch and a synchronize, are the rest).
    assert held["share"] >= 0.95 * held["free"], (held, rounds["share"], rounds["free"])
    assert 0.27 <= held["cap"] <= 0.33, (held["cap"], rounds["cap"])
    assert capped / free <= 0.33, (free, capped)


def test_ratios_on_a_gpu_add_up_to_at_most_100(one_gpu):
    """A tenant whose ratio does not fit what the GPU's tenants left is refused before it gets a
    vGPU, with the reason; one that fits is admitted; best effort always is."""
    first = one_gpu.popen("sleeper", "5", ORION_RATIO=70)
    try:
        wait_ready(first)
        r = one_gpu.run("device_props", ORION_RATIO=40)
        assert r.returncode != 0
        assert "ORION_RATIO=40 does not fit p-GPU 0: 30% of its compute is left (its tenants' ratios add up to 70)" \
            in r.stderr, r.stderr
        assert one_gpu.run("device_props", ORION_RATIO=30).returncode == 0
        assert one_gpu.run("device_props").returncode == 0
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("env", [{"ORION_RATIO": 101}, {"ORION_RATIO": "x"},
                                 {"ORION_RATIO": 30, "ORION_RATIO_POLICY": "fast"},
                                 {"ORION_RATIO_POLICY": "cap"}])
def test_bad_ratio_or_policy_is_a_clear_error(one_gpu, env):
    r = one_gpu.run("device_props", **env)
    assert r.returncode != 0
    assert "ORION_RATIO must be a percentage 1..100 and ORION_RATIO_POLICY share or cap" in r.stderr, r.stderr
    assert "Creating session" not in one_gpu.log()


def test_a_tenant_killed_mid_kernel_frees_the_device(one_gpu):
    """A worker whose kernel is running when its client is killed holds the GPU's device; oriond
    frees it when the worker exits, and the other tenant goes on alone (about 1 s shared, then 3 s
    alone: far more kernels than the killed one got)."""
    start, procs = start_spins(one_gpu, [{"ORION_RATIO": 50}] * 2, 4000)
    time.sleep(max(0.0, (start + 1000) / 1000 - time.time()))
    procs[0].kill()
    procs[0].wait()
    out, err = procs[1].communicate(timeout=120)
    m = re.search(r"^KERNELS (\d+) MS", out, re.M)
    # Had the device stayed held, the survivor would wait in its next launch until the timeout.
    assert procs[1].returncode == 0 and m, out + err
    # It ran on alone: 3 s at ~15-25 ms a kernel is 120-200 kernels; 1 s at half the device ~20-35.
    assert int(m.group(1)) >= 60, out


def test_a_vgpu_share_is_one_tenant(one_gpu, tmp_path):
    """The processes of one vGPU share (ORION_SHARE: a program and the processes it starts) are one
    tenant: a parent with ORION_RATIO=60 and its child hold 60% of the GPU between them (as two
    tenants, 120%, the child would be refused). Then a tenant holding 60% leaves 40 for another."""
    from harness.share import results, run_probe
    (tmp_path / "p").mkdir()
    r, steps = run_probe(one_gpu, tmp_path / "p", "init", "spawn", "init", "end",
                         env={"ORION_VGPU": 1, "ORION_RATIO": 60})
    assert results(steps, "parent", "init") == ["0 count=1"] and results(steps, "child0", "init") == ["0 count=1"], \
        r.stdout + r.stderr
    log = one_gpu.session_logs()
    assert log.count("gets 60% (share) of its compute") == 2, log[-2000:]
    holder = one_gpu.popen("sleeper", "5", ORION_RATIO=60)
    try:
        wait_ready(holder)
        r = one_gpu.run("device_props", ORION_RATIO=50, ORION_SHARE="off")
        assert r.returncode != 0 and "ORION_RATIO=50 does not fit p-GPU 0: 40% of its compute is left" in r.stderr, \
            r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_orion_smi_shows_each_tenants_ratio_and_measured_share(one_gpu):
    """`orion-smi` (oriond's `sessions`): each process's ratio and policy, and the share of the GPU
    its tenant got over the last 1 s and 10 s, measured (30/70 tenants saturating: within 10 points
    over 1 s)."""
    import json
    import os
    from conftest import PREFIX
    start, procs = start_spins(one_gpu, [{"ORION_RATIO": 30}, {"ORION_RATIO": 70}], 5000)
    try:
        time.sleep(max(0.0, (start + 3500) / 1000 - time.time()))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env["HOME"] = str(one_gpu.tmp)
        smi = [str(PREFIX / "bin" / "orion-smi"), "--oriond", str(one_gpu.tmp / "oriond.sock")]
        r = subprocess.run(smi + ["--json"], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        got = {}
        for s in json.loads(r.stdout):
            k = s["placements"][0]["compute"]
            got[k["ratio"]] = k
        assert set(got) == {30, 70} and all(k["policy"] == "share" and k["enforced"] for k in got.values()), r.stdout
        for ratio, k in got.items():
            assert abs(k["share_1s"] - ratio / 100) <= 0.10, got
            assert k["device_s"] > 0 and k["share_10s"] is None  # fewer than 10 s of samples yet
        table = subprocess.run(smi, env=env, capture_output=True, text=True, timeout=30).stdout
        rows = re.findall(r"^\| .+?\s+0\s+\d+\s+\d+\s+(\d+)% share\s+(\d+)%\s+-\s+[\d.]+s \|$", table, re.M)
        assert sorted(int(r[0]) for r in rows) == [30, 70], table
    finally:
        for p in procs:
            p.communicate(timeout=120)


def test_server_conf_default_ratio(tmp_path):
    """[server] default_ratio is the share of a client that sets no ORION_RATIO: with 60, one such
    client gets 60% (share) and a second does not fit; a client asking 40 does."""
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 4\n    default_ratio = 60\n"
                                   "[server-shm]\n    shm_buffer_size = 16\n", extra_args=("--sim-gpus", "1"))
    try:
        first = d.popen("sleeper", "5")
        try:
            wait_ready(first)
            assert "gets 60% (share) of its compute" in d.session_logs()
            r = d.run("device_props", ORION_SHARE="off")
            assert r.returncode != 0 and "ORION_RATIO=60 does not fit p-GPU 0" in r.stderr, r.stderr
            assert d.run("device_props", ORION_RATIO=40, ORION_SHARE="off").returncode == 0
        finally:
            first.kill()
            first.wait()
    finally:
        d.stop()


def test_nvml_reports_each_vgpus_own_utilization(one_gpu):
    """nvmlDeviceGetUtilizationRates in a tenant's process is its vGPU's own use of the physical
    GPU, as the scheduler measures it: 30% and 70% tenants saturating together read about 30 and
    70 (within 12 points: the sample period is 0.1-1 s, a few dozen kernels); one alone about 100."""
    _, procs = start_spins(one_gpu, [{"ORION_RATIO": 30}, {"ORION_RATIO": 70}], 4000, "nvml")
    utils = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        m = re.search(r"^UTIL (\d+) (\d+)$", out, re.M)
        assert p.returncode == 0 and m, out + err
        utils.append((int(m.group(1)), int(m.group(2))))
    assert abs(utils[0][0] - 30) <= 12 and abs(utils[1][0] - 70) <= 12, utils
    assert all(g == mem for g, mem in utils), utils
    _, procs = start_spins(one_gpu, [{}], 2000, "nvml")
    out, err = procs[0].communicate(timeout=120)
    m = re.search(r"^UTIL (\d+) (\d+)$", out, re.M)
    assert m and int(m.group(1)) >= 85, out + err


def parse_prometheus(text):
    """Prometheus text format 0.0.4 -> {name: [(labels dict, value)]}, with each family's TYPE."""
    families, types = {}, {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        assert m, f"not a Prometheus sample: {line!r}"
        labels = dict(label.findall(m.group(2) or ""))
        families.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    assert set(families) <= set(types), (set(families) - set(types))
    return families, types


def test_oriond_serves_prometheus_metrics_per_session(tmp_path):
    """[orion] metrics_addr: oriond's GET /metrics has, per session and vGPU, its tenant's ratio,
    device and throttled seconds and utilization, its memory and quota; per GPU, the ratios promised.
    30/70 tenants saturating: their device seconds split about 30/70 (within 10 points, a 4 s window
    half over when scraped) and the ratios on the GPU add up to 100."""
    import socket
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = 16\n"
                                   f"[orion]\n    metrics_addr = 127.0.0.1:{port}\n",
               extra_args=("--sim-gpus", "1"))
    try:
        start, procs = start_spins(d, [{"ORION_RATIO": 30}, {"ORION_RATIO": 70}], 4000)
        try:
            time.sleep(max(0.0, (start + 3000) / 1000 - time.time()))
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            for p in procs:
                p.communicate(timeout=120)
        fam, types = parse_prometheus(text)
        assert types["orion_session_compute_busy_seconds_total"] == "counter", types
        by_ratio = {int(v): l for l, v in fam["orion_session_compute_ratio"]}
        assert set(by_ratio) == {30, 70} and all(l["policy"] == "share" for l in by_ratio.values()), text
        busy = {l["session"]: v for l, v in fam["orion_session_compute_busy_seconds_total"]}
        b30, b70 = busy[by_ratio[30]["session"]], busy[by_ratio[70]["session"]]
        assert b30 > 0 and b70 > 0 and abs(b30 / (b30 + b70) - 0.30) <= 0.10, (b30, b70)
        assert len(fam["orion_session_compute_throttled_seconds_total"]) == 2
        util = {l["session"]: v for l, v in fam["orion_session_compute_utilization_ratio"]}
        assert all(0 <= v <= 1 for v in util.values()) and sum(util.values()) > 0.5, util
        assert [v for _, v in fam["orion_gpu_compute_ratio_sum"]] == [100.0], text
        assert sorted(v for _, v in fam["orion_session_memory_quota_bytes"]) == [64 << 20] * 2, text
        assert all(v > 0 for _, v in fam["orion_session_memory_used_bytes"]), text
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).status == 200
    finally:
        d.stop()
