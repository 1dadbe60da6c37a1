"""A process tree shares its vGPUs (ORION_SHARE): the first process of a program takes the vGPUs,
the processes it starts run on the same ones (the PyTorch recipe `main.py --multiprocessing-distributed`:
the parent asks torch.cuda.device_count(), then each spawned rank uses one of the devices), and
the vGPU's memory quota holds for all of them together.

Each probe is a small Python program driving Orion's libcuda.so.1 through ctypes; children are
started with subprocess and no `env=`, so they inherit the C environment the runtime wrote.
"""
import re

import pytest

from conftest import Oriond
from harness.share import results, run_probe


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
