"""PyTorch and CuPy, unmodified, on Orion's sim backend (issues #9, #20). Needs the frameworks venv
(`scripts/venv --frameworks`, tests/requirements-frameworks.txt: torch 2.15 built for CUDA 13.2,
whose cudart, cuBLAS, cuDNN come from nvidia-* wheels newer than the 13.0 toolkit); skipped
without it (.ci/run installs it, so CI never skips). tests/frameworks/torch_probe.py runs the steps.

PyTorch's kernels are SASS for the device's arch (its PTX is for a newer one), which the sim backend
cannot execute. By default such a launch fails (test_torch_refuses_what_the_sim_cannot_run: an
error, never a wrong number). The tests named `..._api_level` run against an oriond started with
--sim-unexecutable skip, where those kernels are accepted and NOT run: they check status, data
movement, memory accounting and which kernels were launched, never a value a kernel computed.
CuPy's NVRTC kernels, loaded as PTX, are executed and their results compared with numpy's
(tests/frameworks/cupy_probe.py; see the CuPy section below)."""
import re
import sys

import pytest

from conftest import ROOT, Oriond, launch_outcomes, launched

torch_spec = pytest.importorskip("torch", reason="PyTorch not installed: scripts/venv --frameworks")


def test_torch_steps_through_orion_api_level(oriond_api_level):
    """PyTorch's API through Orion (--sim-unexecutable skip: ATen's SASS kernels are accepted and
    NOT run, so no step checks a value a kernel computed)."""
    oriond = oriond_api_level
    r = oriond.run(sys.executable, ROOT / "tests" / "frameworks" / "torch_probe.py", ORION_GMEM=4096,
                   ORION_COVERAGE=1, timeout=600)
    steps = dict(re.findall(r"^STEP (\S+) (ok|FAIL)", r.stdout, re.M))
    failed = [s for s, v in steps.items() if v != "ok"]
    assert r.returncode == 0 and not failed and "DONE failed=0" in r.stdout, (
        f"failed steps: {failed}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}")
    for s in ("is_available", "zeros", "round_trip", "matmul_1", "matmul_256", "matmul_half", "conv2d_cudnn",
              "fft", "linalg_solve", "backward", "mem_get_info", "capability", "memory_allocated", "oom_then_recover",
              "pinned_non_blocking", "streams_events", "train_cnn", "synchronize_end"):
        assert steps.get(s) == "ok", s
    # The quota is what PyTorch sees as the device's memory, and where its allocator runs out.
    assert f"total={4096 << 20} props.total_memory={4096 << 20}" in r.stdout
    assert re.search(r"^STEP oom_then_recover ok OutOfMemoryError at \d+ MiB held", r.stdout, re.M)
    # PyTorch's own (ATen) kernels are SASS for sm_90 with PTX only for a newer arch: accepted and
    # never run here (exec=skipped), so the probe checks no value they compute. No launch failed.
    execs = launch_outcomes(oriond.launches())
    aten = [e for k, e in execs if "2at6native" in k]
    assert len(aten) > 50 and set(aten) == {"skipped"}, set(aten)
    assert not [k for k, e in execs if e.startswith("error")], [k for k, e in execs if e.startswith("error")]
    # The training loop reached cuDNN's forward, data-gradient, weight-gradient and batch-norm
    # kernels, and the optimizer's fused multi-tensor kernels.
    for pat in ("fprop", "dgrad", "wgrad", "bn_fw_tr", "bn_bw", "multi_tensor_apply", "softmax_warp_backward"):
        assert any(pat in k for k, _ in execs), pat
    kernels = [l["kernel"] for l in launched(oriond.launches())]
    assert any("vectorized_elementwise_kernel" in k for k in kernels), kernels[:20]
    assert any(re.search(r"gemm", k, re.I) for k in kernels), kernels
    assert any(re.search(r"fft", k, re.I) for k in kernels), kernels
    # What PyTorch's newer runtime and libraries asked for that Orion refuses, exactly: the logging
    # callback and slot 4 of cuBLASLt 13.2's unidentified table (cuBLASLt checks it and goes on).
    # (Refusals are logged when they happen; the probe ends with os._exit, so no coverage report.)
    refused = set(re.findall(r"\[warning\] (.+?) is not supported by Orion", r.stderr))
    assert refused == {"cuLogsRegisterCallback", "private table 1734dc26 (unidentified) slot 4"}, refused


REFUSAL_PROBE = """
import torch
x = torch.arange(8, dtype=torch.float32)
d = x.cuda()
print("ROUND_TRIP", torch.equal(d.cpu(), x), flush=True)
for name, op in (("add", lambda: d + 1), ("matmul", lambda: torch.ones(64, 64, device="cuda") @ d.new_ones(64, 64)),
                 ("sum", lambda: d.sum())):
    try:
        y = op()
        torch.cuda.synchronize()
        print("COMPUTED", name, y.cpu().flatten()[:4].tolist(), flush=True)
    except RuntimeError as e:
        print("REFUSED", name, str(e).splitlines()[0], flush=True)
print("AFTER", torch.equal(d.cpu(), x), torch.cuda.memory_allocated() > 0, flush=True)
"""


def test_torch_refuses_what_the_sim_cannot_run(oriond):
    # The default oriond: PyTorch's kernels are SASS only, so each op that launches one raises
    # "no kernel image is available" at the op itself (the launch fails synchronously, as on a GPU
    # without an image for it); no op returns a value nobody computed. Copies work, and the process
    # goes on after each refusal.
    pytest.importorskip("torch")
    r = oriond.run(sys.executable, "-c", REFUSAL_PROBE, ORION_GMEM=1024, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "ROUND_TRIP True" in r.stdout, out[-4000:]
    refused = dict(re.findall(r"^REFUSED (\S+) (.*)$", r.stdout, re.M))
    assert set(refused) == {"add", "matmul", "sum"} and "COMPUTED" not in r.stdout, out[-4000:]
    assert all(v == "CUDA error: no kernel image is available for execution on the device" for v in refused.values()), \
        refused
    assert "AFTER True True" in r.stdout, out[-4000:]
    told = re.findall(r"^\[warning\] kernel (\S+) cannot run on this vGPU: .*CUDA_ERROR_NO_BINARY_FOR_GPU", r.stderr, re.M)
    assert told and len(told) == len(set(told)), r.stderr[-3000:]
    assert not [l for l in oriond.launches() if l["exec"] in ("ran", "skipped")], oriond.launches()[-5:]


FFT_EXIT_PROBE = """
import torch
y = torch.fft.fft(torch.ones(1024, device="cuda", dtype=torch.complex64))
torch.cuda.synchronize()
print("FFT", tuple(y.shape), flush=True)
"""


def test_torch_fft_process_exits_cleanly_api_level(oriond_api_level):
    """After torch.fft, PyTorch's plan cache calls cufftDestroy from an exit handler, which pushes
    and pops contexts after the main thread's thread_local objects are gone: that corrupted the
    heap in most runs ("corrupted double-linked list", SIGSEGV) while the context stack was a
    thread_local vector. API level (--sim-unexecutable skip): the FFT's values are not checked."""
    pytest.importorskip("torch")
    for _ in range(3):
        r = oriond_api_level.run(sys.executable, "-c", FFT_EXIT_PROBE, ORION_GMEM=1024, timeout=300)
        assert r.returncode == 0 and "FFT (1024,)" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


# ---- CuPy (tests/frameworks/cupy_probe.py) -------------------------------------------------------
# CuPy compiles its elementwise/reduction/raw kernels with NVRTC at run time. With
# CUPY_COMPILE_WITH_PTX=1 it loads them as compute_90 PTX (cuModuleLoadData of PTX text), which the
# sim backend's PTX executor runs: those results are checked against numpy. CUPY_ACCELERATORS=""
# keeps CuPy's built-in reductions on its own NVRTC kernels instead of its precompiled CUB ones
# (SASS only). The NVRTC the wheels bring (13.2) writes PTX ISA 9.2, which a 13.0 driver refuses
# (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, on a GPU as on sim): these orionds report the NVRTC's driver
# version (--sim-driver-version), as a GPU host running such programs needs.
# By default CuPy asks NVRTC for sm_90 cubins (SASS), which the sim cannot execute: their launches
# fail (test_cupy_default_cubins_are_refused), or, at the API level, are accepted and not run.
COMPUTED_STEPS = ("elementwise_axpb", "elementwise_int", "elementwise_sqrt_exp", "elementwise_f64", "where_compare",
                  "astype_half", "reduce_sum_int", "reduce_max_min", "reduce_sum_f32", "reduce_axis", "argmax",
                  "elementwise_kernel", "reduction_kernel", "raw_kernel", "fuse", "cumsum", "fft_values")
# NVRTC 13.2 asks the driver for this private table while it compiles and goes on when it is refused.
CUPY_REFUSED = {"cuGetExportTable: private table da9151d3-3ae6-cc41-a5c0-4f26d533e328"}


def nvrtc_driver_version():
    """MAJOR.MINOR of the NVRTC CuPy uses (the nvidia-cuda-nvrtc wheel): the driver it needs."""
    from importlib.metadata import version
    return ".".join(version("nvidia-cuda-nvrtc").split(".")[:2])


def cupy_oriond(make_oriond, *extra):
    return make_oriond(extra_args=("--sim-driver-version", nvrtc_driver_version(), *extra))


def run_cupy(d, *args, **env):
    pytest.importorskip("cupy", reason="CuPy not installed: scripts/venv --frameworks")
    r = d.run(sys.executable, ROOT / "tests" / "frameworks" / "cupy_probe.py", *args, ORION_GMEM=2048,
              CUPY_CACHE_DIR=d.tmp / "cupy-cache", timeout=600, **env)
    steps = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^STEP (\S+) (ok|FAIL) ?(.*)$", r.stdout, re.M)}
    launches = launch_outcomes(d.launches())
    refused = set(re.findall(r"\[warning\] (.+?) is not supported by Orion", r.stderr))
    return r, steps, launches, refused


def test_cupy_kernels_compute_through_orion(make_oriond):
    d = cupy_oriond(make_oriond)
    r, steps, launches, refused = run_cupy(d, CUPY_COMPILE_WITH_PTX=1, CUPY_ACCELERATORS="")
    failed = [s for s, (v, _) in steps.items() if v != "ok"]
    assert r.returncode == 0 and not failed and "DONE failed=0" in r.stdout, (
        f"failed steps: {failed}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}")
    for s in COMPUTED_STEPS:
        assert steps.get(s, ("", ""))[1].startswith("COMPUTED"), (s, steps.get(s))
    for s in ("round_trip", "fft", "synchronize"):
        assert steps.get(s, ("",))[0] == "ok", s
    # cuBLAS's GEMM is SASS only: cupy.matmul raises instead of returning what nobody computed.
    assert steps["matmul"][1].startswith("REFUSED"), steps["matmul"]
    ran = {k for k, e in launches if e == "ran"}
    # CuPy's own NVRTC kernels (elementwise, reduction, ElementwiseKernel/ReductionKernel/RawKernel)
    # all ran on the executor, none failed or was skipped.
    cupy_kernels = [(k, e) for k, e in launches if k.startswith(("cupy_", "orion_"))]
    assert cupy_kernels and all(e == "ran" for _, e in cupy_kernels), cupy_kernels
    for k in ("cupy_add__float32_float32_float32", "cupy_floor_divide__int32_int32_int32", "cupy_sin__float64_float64",
              "cupy_argmax", "cupy_sum", "cupy_max", "orion_ew", "orion_sumsq", "orion_block_scan"):
        assert k in ran, (k, sorted(ran))
    # cuFFT's 1024-point kernel carries PTX and ran, which is why fft_values is computed.
    fft = [(k, e) for k, e in launches if "fft" in k.lower()]
    assert fft and all(e == "ran" for _, e in fft), fft
    assert not [k for k, e in launches if e in ("skipped", "off")], launches
    assert refused == CUPY_REFUSED, refused


def test_cupy_ptx_newer_than_the_driver_is_refused(oriond):
    # The default oriond reports this build's driver (13.0): NVRTC 13.2's PTX ISA 9.2 fails to load
    # with CUDA_ERROR_UNSUPPORTED_PTX_VERSION, as on a GPU with a 13.0 driver.
    r, steps, launches, _ = run_cupy(oriond, CUPY_COMPILE_WITH_PTX=1, CUPY_ACCELERATORS="")
    assert r.returncode != 0 and steps["round_trip"][0] == "ok", r.stdout[-3000:]
    assert steps["elementwise_axpb"][0] == "FAIL" and "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in steps["elementwise_axpb"][1]
    assert not [k for k, e in launches if k.startswith("cupy_")], launches


def test_cupy_default_cubins_are_refused(make_oriond):
    # CuPy's defaults: NVRTC cubins (SASS). Every step that launches one of its NVRTC kernels fails
    # with CUDA_ERROR_NO_BINARY_FOR_GPU; data movement works. CuPy's precompiled CUB reductions
    # (SASS) are refused too, and the client's log names them, but CuPy drops CUB's status
    # (cupy_cub.cu ignores DeviceReduce's return value), so their steps are not an error in CuPy:
    # on a GPU without an image for them it would read the same unwritten memory.
    d = cupy_oriond(make_oriond)
    r, steps, launches, refused = run_cupy(d, "--sass")
    assert r.returncode != 0 and steps["round_trip"] == ("ok", "intact"), r.stdout[-3000:]
    for s in ("elementwise_axpb", "elementwise_int", "elementwise_kernel", "raw_kernel"):
        assert steps[s][0] == "FAIL" and "CUDA_ERROR_NO_BINARY_FOR_GPU" in steps[s][1], (s, steps[s])
    told = re.findall(r"^\[warning\] kernel (\S+) cannot run on this vGPU: .*CUDA_ERROR_NO_BINARY_FOR_GPU", r.stderr, re.M)
    assert any(k.startswith("cupy_") for k in told) and any("cub" in k and "Reduce" in k for k in told), told
    assert not [k for k, e in launches if k.startswith(("cupy_", "orion_")) or "cub" in k], launches
    assert refused == CUPY_REFUSED, refused


def test_cupy_default_cubins_through_orion_api_level(make_oriond):
    """CuPy's defaults at the API level (--sim-unexecutable skip): NVRTC cubins and CUB reductions,
    all SASS, are accepted and NOT run; status, shapes and data movement are checked."""
    d = cupy_oriond(make_oriond, "--sim-unexecutable", "skip")
    r, steps, launches, refused = run_cupy(d, "--sass", "--api-level")
    failed = [s for s, (v, _) in steps.items() if v != "ok"]
    assert r.returncode == 0 and not failed and "DONE failed=0" in r.stdout, (
        f"failed steps: {failed}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}")
    assert steps["round_trip"][1] == "intact"
    cupy_kernels = [(k, e) for k, e in launches if k.startswith(("cupy_", "orion_"))]
    assert len(cupy_kernels) >= 15 and all(e == "skipped" for _, e in cupy_kernels), cupy_kernels
    assert any("cub" in k and "Reduce" in k for k, _ in launches), launches
    assert refused == CUPY_REFUSED, refused


def test_cupy_results_come_from_the_executor(make_oriond):
    # The same PTX run with the executor off: the computed steps must fail (nothing is faked).
    d = cupy_oriond(make_oriond, "--sim-execute", "none")
    r, steps, launches, _ = run_cupy(d, "--api-level", CUPY_COMPILE_WITH_PTX=1, CUPY_ACCELERATORS="")
    assert r.returncode != 0, r.stdout[-2000:]
    for s in ("elementwise_axpb", "reduce_sum_int", "raw_kernel", "fft_values"):
        assert steps.get(s, ("",))[0] == "FAIL", (s, steps.get(s))
    assert steps["round_trip"][0] == "ok"
    assert launches and all(e == "off" for _, e in launches), launches[:5]


ALLOCATOR_PROBE = """
import os, torch
def step(name, ok, detail=""):
    print("STEP", name, "ok" if ok else "FAIL", detail, flush=True)
cfg = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
g = torch.Generator().manual_seed(5)
# Tensors of many sizes (small and large pools; the large ones span several 20 MiB chunks of an
# expandable segment), byte-exact both ways.
kept = []
ok = True
for n in (1, 1000, 1 << 18, (5 << 20) + 3, 13 << 20):
    h = torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g)
    d = h.cuda()
    ok &= bool(torch.equal(d.cpu(), h))
    kept.append(d)
step("round_trips", ok)
a = torch.randn(256, 256, device="cuda")
# Its values come from SASS-only kernels, which the sim does not run: status and shape only.
b = a @ a
torch.cuda.synchronize()
step("matmul", b.shape == (256, 256))
reserved = torch.cuda.memory_reserved()
step("reserved_covers_allocated", reserved >= torch.cuda.memory_allocated() > (18 << 20),
     f"{reserved} {torch.cuda.memory_allocated()}")
free0, total = torch.cuda.mem_get_info()
del kept
torch.cuda.empty_cache()
free1, _ = torch.cuda.mem_get_info()
step("empty_cache_returns_memory", free1 > free0, f"{free0} -> {free1}")
# Past the quota: PyTorch's OutOfMemoryError, and the process goes on.
try:
    big = torch.empty(total + (64 << 20), dtype=torch.uint8, device="cuda")
    step("oom", False, "allocated past the quota")
except torch.OutOfMemoryError:
    step("oom", True)
torch.cuda.empty_cache()
h = torch.randint(0, 1 << 30, (1 << 20,), dtype=torch.int32, generator=g)
step("after_oom", bool(torch.equal(h.cuda().cpu(), h)))
print("DONE", cfg, flush=True)
"""


@pytest.mark.parametrize("conf,calls", [
    ("expandable_segments:True", ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                  "cuMemRelease")),
    ("backend:cudaMallocAsync", ("cuMemAllocAsync", "cuMemFreeAsync", "cuDeviceGetDefaultMemPool")),
])
def test_torch_allocator_variants_api_level(oriond_api_level, conf, calls):
    """PyTorch's two other allocators: expandable segments (virtual memory management: address space
    reserved once, 2/20 MiB physical chunks mapped into it as the segment grows) and the
    cudaMallocAsync backend (stream-ordered pools). Both count in the vGPU's quota. API level
    (--sim-unexecutable skip): randn and matmul launch SASS kernels that are accepted and NOT run;
    only copies are checked by value."""
    oriond = oriond_api_level
    pytest.importorskip("torch")
    r = oriond.run(sys.executable, "-c", ALLOCATOR_PROBE, PYTORCH_CUDA_ALLOC_CONF=conf, ORION_GMEM=512,
                   ORION_COVERAGE=1, timeout=300)
    out = r.stdout + r.stderr
    steps = dict(re.findall(r"^STEP (\S+) (ok|FAIL)", r.stdout, re.M))
    assert r.returncode == 0 and f"DONE {conf}" in r.stdout, out[-4000:]
    assert steps and all(v == "ok" for v in steps.values()), (steps, out[-4000:])
    assert len(steps) == 6, steps
    # The allocator really went through those entry points (the coverage report counts calls).
    for c in calls:
        assert re.search(rf"^orion-coverage: real {c} [1-9]\d*$", out, re.M), (c, out[-3000:])
    assert "is not supported by Orion" not in r.stderr.replace("cuLogsRegisterCallback is not supported", ""), \
        r.stderr[-3000:]
    # The quota refusal came from oriond, in Orion's words.
    assert re.search(r"exceeds <vgpu \d+, pgpu \d+> quota \(512 MB\)", oriond.session_logs()), \
        oriond.session_logs()[-2000:]
    assert oriond.alive()


GRAPH_PROBE = """
import json, os, sys, torch
log = sys.argv[1]
def launches():
    torch.cuda.synchronize()
    return sum(1 for l in open(log) if json.loads(l)["event"] == "launch")
def step(name, ok, detail=""):
    print("STEP", name, "ok" if ok else "FAIL", detail, flush=True)
g = torch.Generator().manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
static_in = torch.zeros(8, 64, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
n0 = launches()
with torch.cuda.stream(s):
    model(static_in)
per_forward = launches() - n0
with torch.cuda.stream(s):
    model(static_in)
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
n1 = launches()
with torch.cuda.graph(graph):
    static_out = model(static_in)
step("capture_runs_nothing", launches() == n1, f"{launches() - n1} launches during capture")
n2 = launches()
for i in range(3):
    static_in.copy_(torch.randn(8, 64, generator=g).cuda())
    graph.replay()
step("replay_launches_the_forward", launches() - n2 == 3 * per_forward, f"{launches() - n2} vs 3 x {per_forward}")
step("replay_shape", static_out.shape == (8, 10))
# A graph of a device-to-device copy (no SASS-only kernel): its effect is checked by value.
a = torch.randint(0, 1000, (1 << 16,), dtype=torch.int32, generator=g).cuda()
b = torch.zeros_like(a)
cg = torch.cuda.CUDAGraph()
with torch.cuda.graph(cg):
    b.copy_(a)
a2 = torch.randint(0, 1000, (1 << 16,), dtype=torch.int32, generator=g)
a.copy_(a2.cuda())
cg.replay()
step("copy_graph_value", bool(torch.equal(b.cpu(), a2)))
print("DONE", flush=True)
"""


def test_torch_cuda_graph_capture_and_replay_api_level(oriond_api_level):
    """torch.cuda.graph: PyTorch's capture (cudaStreamBeginCapture on a side stream, its private
    memory pool, cudaGraphInstantiate) and replay (cudaGraphLaunch). API level (--sim-unexecutable
    skip): the model's kernels are SASS only, accepted and NOT run; the probe counts the launches
    oriond took — none during capture, one forward's worth per replay; a captured copy's effect is
    checked by value."""
    oriond = oriond_api_level
    pytest.importorskip("torch")
    r = oriond.run(sys.executable, "-c", GRAPH_PROBE, oriond.launch_log, ORION_GMEM=1024, ORION_COVERAGE=1,
                   timeout=300)
    out = r.stdout + r.stderr
    steps = dict(re.findall(r"^STEP (\S+) (ok|FAIL)", r.stdout, re.M))
    assert r.returncode == 0 and "DONE" in r.stdout, out[-4000:]
    assert len(steps) == 4 and all(v == "ok" for v in steps.values()), (steps, out[-3000:])
    for c in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch"):
        assert re.search(rf"^orion-coverage: real {c} [1-9]\d*$", out, re.M), (c, out[-3000:])
    refused = set(re.findall(r"\[warning\] (.+?) is not supported by Orion", r.stderr))
    assert refused == {"cuLogsRegisterCallback"}, refused


def test_torch_ddp_gloo_two_processes_api_level(oriond_api_level):
    """The Orion guide's multi-vGPU way: DDP with --dist-backend gloo under torchrun, two processes,
    each its own vGPU session (tests/frameworks/ddp_probe.py). API level (--sim-unexecutable skip):
    the model's SASS kernels are accepted and NOT run; gloo's collectives and DDP's parameter
    broadcast move bytes, checked by value."""
    oriond = oriond_api_level
    pytest.importorskip("torch")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = oriond.run(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                   f"--master_port={port}", ROOT / "tests" / "frameworks" / "ddp_probe.py", ORION_GMEM=1024,
                   timeout=600)
    out = r.stdout + r.stderr
    ranks = {m.group(1): m.groupdict() for m in re.finditer(
        r"^RANK (\d) allreduce=(?P<allreduce>\w+) broadcast=(?P<broadcast>\w+) before=(?P<before>\w+) "
        r"after=(?P<after>\w+) steps=3$", r.stdout, re.M)}
    assert r.returncode == 0 and set(ranks) == {"0", "1"}, out[-4000:]
    # gloo's all_reduce and broadcast of CUDA tensors, checked by value on both ranks.
    assert all(v["allreduce"] == "True" and v["broadcast"] == "True" for v in ranks.values()), ranks
    # The ranks started from different weights and DDP left them with the same bytes.
    assert ranks["0"]["before"] != ranks["1"]["before"] and ranks["0"]["after"] == ranks["1"]["after"], ranks
    # Two sessions, one per process.
    assert len(set(re.findall(r"Creating session (\d+)", oriond.log()))) >= 2, oriond.log()[-2000:]


@pytest.mark.parametrize("ranks", [2, 4])
def test_torch_spawned_ranks_share_the_parents_vgpus(tmp_path, ranks):
    """The Orion guide's DDP recipe (imagenet/main.py --multiprocessing-distributed --dist-backend
    gloo, ORION_VGPU=N): the parent counts the devices, which takes its N vGPUs, then spawns N ranks,
    each on its own device. The pool has exactly N vGPUs: the ranks run on the parent's (its
    ORION_SHARE), so none is refused and no rank waits in set-up forever
    (tests/frameworks/spawn_ranks_probe.py). Default mode: only copies and gloo's host sums run."""
    pytest.importorskip("torch")
    import socket
    oriond = Oriond(tmp_path, conf_text=f"[server]\n    vgpu_count = {ranks}\n[server-shm]\n    shm_buffer_size = 16\n",
                    extra_args=("--sim-gpus", "1", "--sim-gpu-mem", str(1024 * ranks)))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        r = oriond.run(sys.executable, ROOT / "tests" / "frameworks" / "spawn_ranks_probe.py", port, ORION_VGPU=ranks,
                       ORION_GMEM=0, timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert re.findall(r"^PARENT count=(\d+)$", r.stdout, re.M) == [str(ranks)], out[-4000:]
        seen = {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in
                re.finditer(r"^RANK (\d+) device=(\d+) sum=(\w+)$", r.stdout, re.M)}
        assert seen == {k: (k, "True") for k in range(ranks)}, out[-4000:]
        # One admission into the pool: the parent counted with NVML and opened no session, so the
        # first rank started the share the parent named and every other rank joined it.
        started = re.findall(r"Starting vGPU share ([0-9a-f]{8}) ", oriond.log())
        joined = re.findall(r"Joining vGPU share ([0-9a-f]{8}) ", oriond.log())
        assert len(started) == 1 and joined == started * (ranks - 1), oriond.log()[-3000:]
        assert "no free vGPU" not in out
    finally:
        oriond.stop()


COMPILE_PROBE = """
import os, torch
def f(x, y):
    return (x * 2 + y).relu()
cf = torch.compile(f)
x = torch.randn(4096, generator=torch.Generator().manual_seed(1)).cuda()
y = torch.ones(4096).cuda()
out = cf(x, y)
torch.cuda.synchronize()
print("COMPILED", tuple(out.shape), out.dtype, out.device.type, flush=True)
"""


def test_torch_compile_runs_triton_kernels_api_level(oriond_api_level):
    """torch.compile: Inductor generates a Triton kernel, Triton JIT-compiles it to an sm_90 cubin
    (its own ptxas) and loads it with cuModuleLoadData through Orion, then launches it. A cubin is
    SASS only (no PTX travels with it): at the API level (--sim-unexecutable skip) it is accepted
    and NOT run, so the probe checks the whole path (compile, load, launch, synchronize) and the
    output's shape, never its values. On a GPU the kernel runs (scripts/gpu-e2e.sh)."""
    oriond = oriond_api_level
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    r = oriond.run(sys.executable, "-c", COMPILE_PROBE, ORION_GMEM=2048, TRITON_CACHE_DIR=oriond.tmp / "triton",
                   TORCHINDUCTOR_CACHE_DIR=oriond.tmp / "inductor", TRITON_DEFAULT_FP_FUSION="1", timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "COMPILED (4096,) torch.float32 cuda" in r.stdout, out[-4000:]
    triton = [l for l in launched(oriond.launches()) if l["kernel"].startswith("triton_")]
    assert triton and all(l["exec"] == "skipped" for l in triton), oriond.launches()[-5:]
    refused = set(re.findall(r"\[warning\] (.+?) is not supported by Orion", r.stderr))
    assert refused == {"cuLogsRegisterCallback"}, refused


def test_torch_guide_workloads_api_level(oriond_api_level):
    """The Orion PyTorch guide's workloads, small (tests/frameworks/workloads_probe.py): torchvision
    resnet18 on FakeData (DataLoader with pinned memory), an LSTM word language model (cuDNN's
    RNN, which asks the driver whether the stream belongs to a green context), a VAE and a DCGAN
    step. API level (--sim-unexecutable skip): the kernels are SASS, accepted and NOT run; each
    step checks training ran through and shapes, never a loss value."""
    oriond = oriond_api_level
    pytest.importorskip("torchvision")
    r = oriond.run(sys.executable, ROOT / "tests" / "frameworks" / "workloads_probe.py", ORION_GMEM=4096,
                   timeout=900)
    out = r.stdout + r.stderr
    steps = dict(re.findall(r"^STEP (\S+) (ok|FAIL)", r.stdout, re.M))
    assert r.returncode == 0 and "DONE failed=0" in r.stdout, out[-4000:]
    assert set(steps) == {"resnet18_fakedata", "lstm_language_model", "vae", "dcgan"}, steps
    kernels = " ".join(l["kernel"] for l in launched(oriond.launches()))
    for pat in ("RNN", "fprop", "dgrad", "wgrad"):  # cuDNN's RNN and convolution kernels were launched
        assert re.search(pat, kernels, re.I), pat
    refused = set(re.findall(r"\[warning\] (.+?) is not supported by Orion", r.stderr))
    assert refused <= {"cuLogsRegisterCallback", "private table 1734dc26 (unidentified) slot 4"}, refused


CUPY_REFUSALS = r'''
import cupy as cp
src = 'extern "C" __global__ void k(int* a) { a[threadIdx.x] = threadIdx.x * 3; }'
for name, kw in (("rdc", dict(options=("-rdc=true",))), ("cooperative", dict(enable_cooperative_groups=True))):
    try:
        m = cp.RawModule(code=src, **kw)
        a = cp.zeros(32, dtype=cp.int32)
        m.get_function("k")((1,), (32,), (a,))
        cp.cuda.Device().synchronize()
        print(name, "ran", cp.asnumpy(a)[:4].tolist())
    except Exception as e:
        print(name, "REFUSED", type(e).__name__, str(e).splitlines()[0])
a = cp.arange(10, dtype=cp.int32) * 2
print("after", cp.asnumpy(a).tolist())
'''


def test_cupy_separate_compilation_links_and_cooperative_launch_runs(make_oriond):
    # Separate compilation (-rdc=true) makes CuPy link its PTX with libcudadevrt through the
    # driver's linker (cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete): Orion links the
    # PTX in the client (the library is accepted, not read) and the kernel runs on the executor.
    # enable_cooperative_groups launches with cuLaunchCooperativeKernel, which Orion serves.
    pytest.importorskip("cupy")
    oriond = cupy_oriond(make_oriond)
    r = oriond.run(sys.executable, "-c", CUPY_REFUSALS, CUPY_COMPILE_WITH_PTX=1, CUPY_CACHE_DIR=oriond.tmp / "cc",
                   ORION_GMEM=512, ORION_COVERAGE=1, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "rdc ran [0, 3, 6, 9]" in r.stdout, out[-3000:]
    assert "cooperative ran [0, 3, 6, 9]" in r.stdout, out[-3000:]
    assert "after [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]" in r.stdout, out[-3000:]
    for f in ("cuLinkCreate_v2", "cuLinkAddData_v2", "cuLinkComplete"):
        assert re.search(rf"orion-coverage: real {f}\b", r.stderr), (f, r.stderr[-3000:])
    refused = set(re.findall(r"\[warning\] (\S+) is not supported by Orion", r.stderr))
    assert not refused, refused
    coop = [k for k, e in launch_outcomes(oriond.launches()) if k in {l["kernel"] for l in launched(oriond.launches()) if l["cooperative"]}]
    assert coop and all(e == "ran" for k, e in launch_outcomes(oriond.launches()) if k in coop), oriond.launches()[-5:]
