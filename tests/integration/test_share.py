"""A process tree shares its vGPUs (ORION_SHARE): the first process of a program takes the vGPUs,
the processes it starts run on the same ones (the PyTorch recipe `main.py --multiprocessing-distributed`:
the parent asks torch.cuda.device_count(), then each spawned rank uses one of the devices), and
the vGPU's memory quota holds for all of them together.

Each probe is a small Python program driving Orion's libcuda.so.1 through ctypes; children are
started with subprocess and no `env=`, so they inherit the C environment the runtime wrote.
"""
import re
import subprocess
import sys

import pytest

from conftest import Oriond

# Steps on argv: init | ctx D | alloc MIB | free | meminfo | spawn STEPS... (a child runs STEPS and
# is waited for) | die (SIGKILL itself) | sleep S | pause (until a line on stdin) | share (prints
# ORION_SHARE). Prints
# `TAG STEP name result`, TAG being parent, child0, child1, ... in the order they were started.
PROBE = r'''
import ctypes, os, subprocess, sys
lib = ctypes.CDLL("libcuda.so.1")
ptrs = []
ctx = ctypes.c_void_p()
spawned = 0
args = sys.argv[1:]
tag = args.pop(0)[len("--tag="):] if args and args[0].startswith("--tag=") else "parent"
while args:
    step = args.pop(0)
    if step == "init":
        r = lib.cuInit(0)
        n = ctypes.c_int(-1)
        if r == 0:
            r = lib.cuDeviceGetCount(ctypes.byref(n))
        print(f"{tag} STEP init {r} count={n.value}", flush=True)
    elif step == "ctx":
        dev = ctypes.c_int()
        r = lib.cuDeviceGet(ctypes.byref(dev), int(args.pop(0)))
        if r == 0:
            r = lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        print(f"{tag} STEP ctx {r}", flush=True)
    elif step == "alloc":
        p = ctypes.c_uint64()
        r = lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(args.pop(0)) << 20))
        if r == 0:
            ptrs.append(p.value)
        print(f"{tag} STEP alloc {r}", flush=True)
    elif step == "free":
        r = lib.cuMemFree_v2(ctypes.c_uint64(ptrs.pop()))
        print(f"{tag} STEP free {r}", flush=True)
    elif step == "meminfo":
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        r = lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        print(f"{tag} STEP meminfo {r} free={free.value >> 20} total={total.value >> 20}", flush=True)
    elif step == "share":
        print(f"{tag} STEP share {os.environ.get('ORION_SHARE', '')!r} ", flush=True)
    elif step == "spawn":
        child = args[:args.index("end")] if "end" in args else args
        args = args[len(child) + 1:]
        k = spawned
        spawned += 1
        # No env=: the child inherits the C environment (where the runtime put ORION_SHARE), as
        # multiprocessing's spawn and subprocess do.
        out = subprocess.run([sys.executable, __file__, f"--tag=child{k}", *child],
                             capture_output=True, text=True, timeout=120)
        sys.stdout.write(out.stdout)
        sys.stdout.write("".join(f"{tag}-child stderr: {l}\n" for l in out.stderr.splitlines()[-5:]))
        print(f"{tag} STEP spawn rc={out.returncode}", flush=True)
    elif step == "pause":
        print(f"{tag} STEP pause READY", flush=True)
        sys.stdin.readline()
    elif step == "sleep":
        import time
        time.sleep(float(args.pop(0)))
    elif step == "die":
        os.kill(os.getpid(), 9)
    else:
        raise SystemExit(f"unknown step {step}")
'''


def run_probe(oriond, tmp_path, *steps, env=None, timeout=180):
    script = tmp_path / "share_probe.py"
    script.write_text(PROBE.replace("__file__", repr(str(script))))
    e = oriond.env(**(env or {}))
    e.pop("ORION_SHARE", None)
    if env and "ORION_SHARE" in env:
        e["ORION_SHARE"] = str(env["ORION_SHARE"])
    r = subprocess.run([sys.executable, str(script), *map(str, steps)], env=e, capture_output=True, text=True,
                       timeout=timeout)
    return r, {(m.group(1), m.group(2), i): m.group(3) for i, m in
               enumerate(re.finditer(r"^(\S+) STEP (\w+) (.*)$", r.stdout, re.M))}


def results(steps, who, name):
    """The results of step `name` printed by process `who`, in order."""
    return [v for (w, n, _i), v in sorted(steps.items(), key=lambda kv: kv[0][2]) if w == who and n == name]


@pytest.fixture
def two_vgpus(tmp_path):
    """oriond on one simulated GPU split into exactly two vGPUs of 256 MiB."""
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 2\n[server-shm]\n    shm_buffer_size = 16\n",
               extra_args=("--sim-gpus", "1", "--sim-gpu-mem", "512"))
    yield d
    d.stop()


def test_children_run_on_the_parents_vgpus(two_vgpus, tmp_path):
    """The parent takes both vGPUs of the pool at cuInit (it only counts devices, as
    torch.cuda.device_count() does); each of its two children then creates a context on its own
    device and allocates. Without the share the pool is empty for them and cuInit fails."""
    oriond = two_vgpus
    r, steps = run_probe(oriond, tmp_path, "init", "spawn", "init", "ctx", "0", "alloc", "16", "end",
                         "spawn", "init", "ctx", "1", "alloc", "16", "end", env={"ORION_VGPU": 2, "ORION_GMEM": 0})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert results(steps, "parent", "init") == ["0 count=2"], out
    for child in ("child0", "child1"):
        assert results(steps, child, "init") == ["0 count=2"], out
        assert results(steps, child, "ctx") == ["0"] and results(steps, child, "alloc") == ["0"], out
    log = oriond.log()
    started = re.findall(r"Starting vGPU share ([0-9a-f]{8}) on vGPUs 0/0:256MiB,0/1:256MiB$", log, re.M)
    joined = re.findall(r"Joining vGPU share ([0-9a-f]{8}) \((\d) session\(s\) on it\)", log)
    # The children run one after the other: each joins the parent and is the share's second session.
    assert len(started) == 1 and joined == [(started[0], "2"), (started[0], "2")], log[-3000:]
    # All three ended: the pool has both vGPUs again for an unrelated program.
    r2, steps2 = run_probe(oriond, tmp_path, "init", "ctx", "1", env={"ORION_VGPU": 2, "ORION_GMEM": 0})
    assert results(steps2, "parent", "ctx") == ["0"], r2.stdout + r2.stderr


def test_share_off_takes_vgpus_of_its_own(two_vgpus, tmp_path):
    """ORION_SHARE=off: the parent takes vGPUs of its own and hands none on, so its child (which
    inherits `off`) asks for vGPUs of its own, and the pool, all the parent's, refuses it
    (CUDA_ERROR_OUT_OF_MEMORY, as any admission the pool cannot fit). A malformed token fails
    cuInit with CUDA_ERROR_INVALID_VALUE before anything is asked of oriond."""
    oriond = two_vgpus
    r, steps = run_probe(oriond, tmp_path, "init", "share", "spawn", "share", "init", "end",
                         env={"ORION_VGPU": 2, "ORION_GMEM": 0, "ORION_SHARE": "off"})
    out = r.stdout + r.stderr
    assert results(steps, "parent", "init") == ["0 count=2"], out
    assert results(steps, "child0", "share") == ["'off' "], out
    assert results(steps, "child0", "init") == ["2 count=-1"], out
    assert "Fail to get resource from oriond" in out
    # Without `off`, the same program hands its share on: the child sees the token and joins.
    r, steps = run_probe(oriond, tmp_path, "init", "spawn", "share", "init", "end", env={"ORION_VGPU": 2, "ORION_GMEM": 0})
    token = re.fullmatch(r"'([0-9a-f]{32})' ", results(steps, "child0", "share")[0])
    assert token and results(steps, "child0", "init") == ["0 count=2"], r.stdout + r.stderr
    r, steps = run_probe(oriond, tmp_path, "init", env={"ORION_VGPU": 1, "ORION_SHARE": "not-a-token"})
    assert results(steps, "parent", "init") == ["1 count=-1"], r.stdout + r.stderr
    assert "ORION_SHARE 'not-a-token' is not a share token" in r.stderr


def test_the_quota_holds_for_the_whole_share(two_vgpus, tmp_path):
    """A vGPU of 256 MiB shared by a parent and its children: what one process allocates, the
    others cannot (each process alone would fit); memory a child frees, or holds when it is
    killed, comes back to the share."""
    oriond = two_vgpus
    r, steps = run_probe(oriond, tmp_path,
                         "init", "ctx", "0", "alloc", "160",
                         "spawn", "init", "ctx", "0", "meminfo", "alloc", "160", "alloc", "32", "end",
                         "spawn", "init", "ctx", "0", "alloc", "64", "die", "end",
                         "free", "alloc", "64", "sleep", "3",
                         "spawn", "init", "ctx", "0", "alloc", "160", "free", "end",
                         env={"ORION_VGPU": 1, "ORION_GMEM": 256})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    # child0: 160 of the 256 MiB are the parent's: 160 more do not fit, 32 do.
    assert results(steps, "child0", "alloc") == ["2", "0"], out  # CUDA_ERROR_OUT_OF_MEMORY, then success
    info = re.fullmatch(r"0 free=(\d+) total=(\d+)", results(steps, "child0", "meminfo")[0])
    assert info and int(info.group(2)) == 256 and int(info.group(1)) <= 256 - 160, out
    # child1 allocates 64 MiB and is killed; its session ends and the 64 MiB go back.
    assert results(steps, "child1", "alloc") == ["0"], out
    assert results(steps, "parent", "spawn")[1] == "rc=-9", out
    assert results(steps, "parent", "free") == ["0"], out
    # The parent's 160 MiB are free, child1's 64 went back when oriond ended its session (the
    # lease: 1 s; the parent waits 3 s); the parent's 64 and child2's 160 fit together.
    assert results(steps, "parent", "alloc") == ["0", "0"], out
    assert results(steps, "child2", "alloc") == ["0"], out
    assert "which the processes sharing it use together" in oriond.session_logs()
