"""Orion's libnvidia-ml.so.1: NVML's vGPU view in a client process (issue #9, item 5).

tests/integration/nvml_probe.py drives NVML's C ABI with ctypes (and CUDA's, with --cuda) in one
process against oriond's sim backend; the PyTorch checks use torch's own NVML paths (pynvml, and
PYTORCH_NVML_BASED_CUDA_CHECK=1)."""
import json
import re
import sys

import pytest

from conftest import PREFIX, ROOT

PROBE = ROOT / "tests" / "integration" / "nvml_probe.py"
NOT_SUPPORTED = 3
MIB = 1 << 20


def probe(oriond, *args, **env):
    r = oriond.run(sys.executable, PROBE, *args, timeout=120, **env)
    m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
    assert r.returncode == 0 and m, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(m.group(1)), r


def test_nvml_library_is_installed_beside_libcuda():
    assert (PREFIX / "lib" / "orion" / "libnvidia-ml.so.1").is_file()


def test_nvml_shows_the_vgpus_and_their_memory_as_cuda_does(oriond):
    out, r = probe(oriond, "--cuda", ORION_VGPU=2, ORION_GMEM=256, ORION_COVERAGE=1)
    assert out["init"] == 0 and out["count_rc"] == 0
    assert out["count"] == 2 == out["cuda_count"]  # ORION_VGPU
    assert out["bad_index_rc"] == 2  # NVML_ERROR_INVALID_ARGUMENT
    assert out["cuda_version_rc"] == 0 and out["cuda_version"] >= 12000
    for i, d in enumerate(out["devices"]):
        # UUIDs as CUDA reports them (cuDeviceGetUuid), NVML's "GPU-8-4-4-4-12" form.
        assert d["uuid_rc"] == 0 and d["uuid"] == out["cuda_uuids"][i], (d["uuid"], out["cuda_uuids"])
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", d["uuid"])
        assert d["uuid_short_rc"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
        assert d["pci_rc"] == 0 and d["pci_bus_id_legacy"].lower() == out["cuda_pci"][i].lower()
        assert d["pci_bus_id"].lower().endswith(out["cuda_pci"][i].lower()[4:])
        # By UUID / bus id: the first vGPU that has it (vGPUs packed on one GPU share the GPU's UUID
        # and bus id in CUDA's view, and so in NVML's).
        assert d["by_uuid_rc"] == 0 and d["by_uuid_index"] == out["cuda_uuids"].index(d["uuid"])
        assert d["by_pci_rc"] == 0 and d["by_pci_index"] == out["cuda_pci"].index(out["cuda_pci"][i])
        assert d["index"] == i and d["cc"][0] >= 7 and d["name"]
        # total = the vGPU quota (ORION_GMEM); nothing allocated yet on the sim backend.
        assert d["mem_rc"] == 0 and d["mem"][0] == 256 * MIB and d["mem"][1] + d["mem"][2] == 256 * MIB
    # used grows by a cuMemAlloc in the same process and shrinks after cuMemFree (oriond's account).
    rc, total, reserved, free0, used0 = out["mem_v2_before"]
    assert rc == 0 and total == 256 * MIB and free0 == total - reserved - used0
    assert out["alloc_rc"] == 0 and out["free_rc"] == 0
    _, _, _, free1, used1 = out["mem_v2_alloc"]
    assert used1 - used0 == 64 * MIB and free0 - free1 == 64 * MIB
    assert out["mem_alloc"][2] == used1 + reserved and out["mem_alloc"][1] == out["cuda_mem"][0]
    assert out["mem_v2_freed"][4] == used0
    # The process list: this process, with what it uses.
    first, rc, procs = out["procs_alloc"]
    assert first == 7 and rc == 0 and procs == [[out["pid"], used1 + reserved]]
    # One process, one channel: NVML asked through the process's libcuda.so.1 (one session).
    assert oriond.log().count("Creating session") == 1, oriond.log()
    # Sensors Orion has no data for: NVML_ERROR_NOT_SUPPORTED, logged once by name.
    assert out["refused"] == {k: NOT_SUPPORTED for k in out["refused"]}
    # The vGPU's own utilization (compute share's measure): this process ran no kernel.
    assert out["utilization"] == [0, 0, 0], out["utilization"]
    assert out["error_string"] == "Not Supported"
    for name in out["refused"]:
        assert r.stderr.count(f"{name} is not supported by Orion; returning NVML_ERROR_NOT_SUPPORTED") == 1, name
    assert out["shutdown"] == 0 and out["after_shutdown_rc"] == 1  # NVML_ERROR_UNINITIALIZED
    # ORION_COVERAGE lists NVML's real and refused entry points apart from CUDA's.
    assert re.search(r"orion-coverage: real nvmlDeviceGetMemoryInfo_v2 \d+", r.stderr)
    assert re.search(r"orion-coverage: STUB nvmlDeviceGetTemperature 2", r.stderr)
    assert re.search(r"orion-coverage: real nvmlDeviceGetUtilizationRates 1", r.stderr)
    assert re.search(r"orion-coverage: nvml: \d+ entry points called, \d+ real, 3 not supported", r.stderr)


def test_nvml_works_in_a_process_that_never_touches_cuda(oriond):
    out, r = probe(oriond, ORION_VGPU=1, ORION_GMEM=128)
    assert "cuda_count" not in out
    assert out["count"] == 1 and out["devices"][0]["mem"][0] == 128 * MIB
    assert out["mem_v2_before"][0] == 0 and out["mem_v2_before"][1] == 128 * MIB
    first, rc, procs = out["procs_before"]
    assert first == 7 and rc == 0 and [p[0] for p in procs] == [out["pid"]]
    assert oriond.log().count("Creating session") == 1


def test_nvml_count_opens_no_session(oriond):
    # nvmlInit + nvmlDeviceGetCount answer locally (what PyTorch's NVML-based check calls before a
    # fork): no channel is claimed until a call needs oriond's answer.
    code = ("import ctypes as C; n = C.CDLL('libnvidia-ml.so.1'); c = C.c_uint(0); "
            "assert n.nvmlInit() == 0 and n.nvmlDeviceGetCount_v2(C.byref(c)) == 0; print('COUNT', c.value)")
    r = oriond.run(sys.executable, "-c", code, ORION_VGPU=3)
    assert r.returncode == 0 and "COUNT 3" in r.stdout, r.stderr
    assert "Creating session" not in oriond.log()


# ---- PyTorch's NVML paths (same framework requirement as test_frameworks.py) -----------------------
TORCH_NVML = r"""
import os, torch
assert torch.cuda.is_available(), "is_available"
print("COUNT", torch.cuda.device_count())
print("INITIALIZED_BEFORE", torch.cuda.is_initialized())
# NVML's count opened no session: CUDA (and the vGPUs) are still untouched, so a fork is safe.
print("SESSIONS_BEFORE_CUDA", open(os.environ["SERVER_LOG"]).read().count("Creating session"))
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("USED", torch.cuda.device_memory_used())
print("PROCS", torch.cuda.list_gpu_processes().replace("\n", "|"))
print("PID", os.getpid())
"""


def test_torch_nvml_checks(oriond):
    pytest.importorskip("torch", reason="PyTorch not installed: scripts/venv --frameworks")
    pytest.importorskip("pynvml", reason="nvidia-ml-py not installed: scripts/venv --frameworks")
    r = oriond.run(sys.executable, "-c", TORCH_NVML, PYTORCH_NVML_BASED_CUDA_CHECK=1, ORION_VGPU=2, ORION_GMEM=512,
                   SERVER_LOG=oriond.logs / "server.log", timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    vals = dict(re.findall(r"^(\w+) (.*)$", r.stdout, re.M))
    assert vals["COUNT"] == "2" and vals["INITIALIZED_BEFORE"] == "False" and vals["SESSIONS_BEFORE_CUDA"] == "0"
    assert int(vals["USED"]) >= 64 * MIB
    assert f"process {int(vals['PID']):>10d} uses" in vals["PROCS"], vals["PROCS"]
    assert "is not supported by Orion; returning NVML" not in r.stderr, r.stderr[-3000:]
    assert oriond.log().count("Creating session") == 1
