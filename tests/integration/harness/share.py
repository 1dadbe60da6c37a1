"""The share probe: a process tree (fork, spawn, exec) whose members each open the GPU and report
what they got (test_share, test_compute_share, test_kvm)."""
import re
import subprocess
import sys

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

