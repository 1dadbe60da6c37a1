"""JAX (jax[cuda13] 0.10.2, in its own venv: `scripts/venv --jax`) on a vGPU, the way the README's
"JAX" section says to run it: JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (CUPTI's version check needs a
private driver table Orion does not serve) and a /dev/nvidiactl that exists (JAX looks for one of
/dev/nvidia0, /dev/nvidiactl, /dev/dxg before it tries CUDA; an empty file is enough). Here the
file is made in a private mount namespace (an overlay on /dev), so the machine's /dev is untouched.

The probe is tests/frameworks/jax_probe.py. XLA compiles its kernels to sm_90a cubins (SASS only):
on the default sim their launches are refused, and JAX raises an error instead of returning numbers
nobody computed; at the API level (--sim-unexecutable skip) compilation, XLA's autotuning (its
redzone checks memset and read back pinned buffers through their host addresses) and launches go
through, and only shapes are checked."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, Oriond, launch_outcomes

JAX_PYTHON = Path(os.environ.get("ORION_JAX_PYTHON", ROOT / ".venv-jax" / "bin" / "python"))
PROBE = ROOT / "tests" / "frameworks" / "jax_probe.py"

# /dev as an overlay (lower: the real /dev, upper: a tmpfs) holding an empty /dev/nvidiactl, in a
# mount namespace of the probe's own.
WITH_NVIDIACTL = """
set -e
t="$ORION_JAX_DEV_TMP"  # the test's own directory: nothing is left in /tmp
mkdir -p "$t"
mount -t tmpfs none "$t"
mkdir "$t/u" "$t/w"
mount -t overlay overlay -o lowerdir=/dev,upperdir="$t/u",workdir="$t/w" /dev
mount -t tmpfs shm /dev/shm
touch /dev/nvidiactl
exec "$@"
"""


def run_jax(oriond, *, constraints_check=False, nvidiactl=True):
    if not JAX_PYTHON.exists():
        pytest.skip(f"no JAX venv at {JAX_PYTHON} (scripts/venv --jax)")
    env = oriond.env(ORION_GMEM=2048, ORION_JAX_DEV_TMP=oriond.tmp / "jax-dev")
    if not constraints_check:
        env["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    cmd = [str(JAX_PYTHON), str(PROBE)]
    if nvidiactl:
        cmd = ["unshare", "-m", "--propagation", "private", "bash", "-c", WITH_NVIDIACTL, "bash", *cmd]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = dict(re.findall(r"^(DEVICES|ROUNDTRIP|COMPUTE) (.*)$", r.stdout, re.M))
    return r, lines


@pytest.fixture
def jax_oriond(tmp_path):
    d = Oriond(tmp_path, region_mib=512, channel_mib=64,
               conf_text="[server]\n    vgpu_count = 1\n[server-shm]\n    shm_buffer_size = 64\n")
    yield d
    d.stop()


@pytest.fixture
def jax_oriond_api_level(tmp_path):
    d = Oriond(tmp_path, region_mib=512, channel_mib=64,
               conf_text="[server]\n    vgpu_count = 1\n[server-shm]\n    shm_buffer_size = 64\n",
               extra_args=("--sim-unexecutable", "skip"))
    yield d
    d.stop()


def test_jax_sees_the_vgpu_and_its_kernels_are_refused_on_sim(jax_oriond):
    """jax.devices() is the vGPU; a host array round-trips through it byte-exact; XLA's compiled
    work fails with a JAX error (its cubins are refused: each kernel named once in the client's
    log), never with numbers."""
    r, lines = run_jax(jax_oriond)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert lines.get("DEVICES") == "gpu 1 Orion Simulated GPU", out[-4000:]
    assert lines.get("ROUNDTRIP") == "True", out[-4000:]
    assert lines.get("COMPUTE", "").startswith("error JaxRuntimeError"), out[-4000:]
    refused = re.findall(r"kernel (\S+) cannot run on this vGPU: its module has no PTX \(SASS only\)", r.stderr)
    assert refused, r.stderr[-4000:]
    assert "is NOT executed" not in out and "was NOT executed" not in out


def test_jax_compiles_and_launches_at_the_api_level(jax_oriond_api_level):
    """--sim-unexecutable skip: a jitted reduction and a matmul compile, XLA's autotuner runs (its
    redzone checks use cuMemsetD32Async and cuMemcpyDtoHAsync on cuMemHostAlloc buffers given as
    device addresses), and the launches are accepted and NOT run: only the result's shape is
    checked."""
    r, lines = run_jax(jax_oriond_api_level)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert lines.get("DEVICES") == "gpu 1 Orion Simulated GPU" and lines.get("ROUNDTRIP") == "True", out[-4000:]
    assert lines.get("COMPUTE") == "ok shape=(64, 64)", out[-4000:]
    skipped = [k for k, e in launch_outcomes(jax_oriond_api_level.launches()) if e == "skipped"]
    assert any(k.startswith("gemm_fusion_dot") for k in skipped), jax_oriond_api_level.launches()[-5:]


def test_without_the_documented_settings_jax_falls_back_to_the_cpu(jax_oriond):
    """What a user sees without the README's two settings (so the README's reason stays true): with
    CUPTI's version check, JAX cannot load CUPTI (its private driver table is refused) and uses the
    CPU; with the check skipped but no /dev/nvidiactl, it does not try CUDA at all."""
    r, lines = run_jax(jax_oriond, constraints_check=True)
    assert lines.get("DEVICES") == "cpu 1 cpu" and "Unable to load cuPTI" in r.stderr, r.stdout + r.stderr[-3000:]
    if not any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")):
        r, lines = run_jax(jax_oriond, nvidiactl=False)
        assert lines.get("DEVICES") == "cpu 1 cpu", r.stdout + r.stderr[-3000:]
