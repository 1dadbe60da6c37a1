"""Containers in a real engine (issue #25): podman (Debian's, scripts/deps installs it) runs images
that hold nothing of Orion, and `orion-cdi generate` makes Orion's vGPUs CDI devices for it.

On these machines podman needs `--runtime runc` (the cgroup layout is hybrid, which crun refuses) and
ulimits within the host's hard limits; the tests set that in a containers.conf of their own
(CONTAINERS_CONF) and on the command line, never on the system. podman 4.3 reads CDI specs only
from /etc/cdi and /var/run/cdi (its containers.conf has no cdi_spec_dirs yet), so a test writes its
spec to /var/run/cdi (the directory for generated specs) under a kind of its own
(orion-test-<pid>.dev/vgpu, `orion-cdi --kind`), never touching a user's orion.dev/vgpu, and
removes it after.

The image: a plain nvcc program (tests/cuda/device_props: cudart linked statically, which dlopens
libcuda.so.1) with the libraries ldd names and nothing else; imported from a tarball (no registry)."""
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import PREFIX, ROOT, TEST_BIN, Oriond, checks, smi_json, wait_until

PODMAN = shutil.which("podman")


def ulimits():
    """--ulimit values within the host's hard limits (podman's defaults exceed them here)."""
    import resource
    out = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(which)[1]
        v = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
        out += ["--ulimit", f"{name}={v}:{v}"]
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """podman with a containers.conf of the tests' own; yields a function running podman."""
    if PODMAN is None:
        pytest.fail("podman is not installed: scripts/deps installs it (Debian's podman and runc)")
    d = tmp_path_factory.mktemp("podman")
    conf = d / "containers.conf"
    conf.write_text('[engine]\nruntime = "runc"\n[containers]\nnetns = "none"\n')

    def podman(*args, timeout=120):
        env = dict(os.environ, CONTAINERS_CONF=str(conf))
        env = {k: v for k, v in env.items() if not k.startswith("ORION_") and k != "LD_LIBRARY_PATH"}
        return subprocess.run([PODMAN, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    return podman


@pytest.fixture(scope="module")
def image(engine, tmp_path_factory):
    """A minimal image: device_props and sleeper and the libraries they link (no libcuda.so.1, no
    Orion)."""
    root = tmp_path_factory.mktemp("rootfs")
    progs = [TEST_BIN / "device_props", TEST_BIN / "sleeper"]
    files = list(progs)
    for prog in progs:
        for line in subprocess.run(["ldd", str(prog)], capture_output=True, text=True, check=True).stdout.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m and Path(m.group(1)) not in files:
                files.append(Path(m.group(1)))
    for f in files:
        dst = root / str(f).lstrip("/") if f not in progs else root / "usr/bin" / f.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f.resolve(), dst)
    for d in ("etc", "tmp", "dev/shm"):
        (root / d).mkdir(parents=True, exist_ok=True)
    tar = tmp_path_factory.mktemp("image") / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root, arcname=".")
    name = f"localhost/orion-test-plain:{os.getpid()}"
    r = engine("import", tar, name)
    assert r.returncode == 0, r.stderr
    assert not any("libcuda" in str(f) for f in files)
    yield name
    engine("rmi", "-f", name)


@pytest.fixture
def cdi_kind():
    """A CDI kind of this test's own, its spec in /var/run/cdi; removed after."""
    kind = f"orion-test-{os.getpid()}.dev/vgpu"
    spec = Path("/var/run/cdi") / f"orion-test-{os.getpid()}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    yield kind, spec
    spec.unlink(missing_ok=True)


def test_generate_writes_one_device_per_region_and_the_client(tmp_path, oriond):
    """The spec: CDI 0.5.0, kind orion.dev/vgpu, a device per region (its mount at its own path,
    ORION_SHM) and `all`; the client libraries and tools mounted read-only for every device."""
    import yaml
    r = subprocess.run([PREFIX / "bin/orion-cdi", "generate", "--shm-dir", tmp_path, "--output", "-"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    spec = yaml.safe_load(r.stdout)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "orion.dev/vgpu"
    region = str(oriond.region)
    devs = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert set(devs) == {"0", "all"}
    assert devs["0"]["env"] == [f"ORION_SHM={region}"]
    assert [(m["hostPath"], m["containerPath"]) for m in devs["0"]["mounts"]] == [(region, region)]
    assert "rw" in devs["0"]["mounts"][0]["options"]
    assert [m["hostPath"] for m in devs["all"]["mounts"]] == [region]
    common = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    lib = PREFIX / "lib/orion"
    assert common["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]["hostPath"] == str(lib / "libcuda.so.1")
    assert common["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]["hostPath"] == str(lib / "libnvidia-ml.so.1")
    assert common["/usr/bin/orion-smi"]["hostPath"] == str(lib / "orion-smi")
    assert all("ro" in m["options"] for m in common.values())
    # Not a region: named and left out; no region at all: an error that says so.
    (tmp_path / "orionsock7").write_bytes(b"not a region" + bytes(4084))
    r = subprocess.run([PREFIX / "bin/orion-cdi", "generate", "--shm-dir", tmp_path, "--output", "-"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "orionsock7 left out" in r.stderr
    assert {d["name"] for d in yaml.safe_load(r.stdout)["devices"]} == {"0", "all"}
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([PREFIX / "bin/orion-cdi", "generate", "--shm-dir", empty, "--output", "-"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no Orion region in" in r.stderr


def test_a_plain_image_runs_on_a_vgpu_through_cdi(tmp_path, engine, image, oriond, cdi_kind):
    """`podman run --device orion-test-<pid>.dev/vgpu=0` of an image holding only a plain nvcc
    program and its libc: the program sees Orion's vGPU (no LD_LIBRARY_PATH, no mounts typed)."""
    kind, spec = cdi_kind
    r = subprocess.run([PREFIX / "bin/orion-cdi", "generate", "--shm-dir", tmp_path, "--output", spec,
                        "--kind", kind], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    r = engine("run", "--rm", *ulimits(), "--device", f"{kind}=0", "-e", "ORION_VGPU=1", "-e", "ORION_GMEM=256",
               image, "/usr/bin/device_props")
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert got and all(v == "ok" for v in got.values()), r.stdout
    m = re.search(r"Using Orion resource \(standalone\) session-(\d+) : (\S+)/0/0$", r.stderr, re.M)
    assert m and m.group(2) == str(oriond.region), r.stderr
    assert list((oriond.logs / "session").glob(f"*-{m.group(1)}.log")), oriond.log()  # its session log is here
    # Without the device the same image has no CUDA driver at all.
    r = engine("run", "--rm", *ulimits(), image, "/usr/bin/device_props")
    assert r.returncode != 0


def test_the_guides_way_with_manual_mounts(tmp_path, engine, image, oriond):
    """Orion's guide: the region bound at its path and ORION_* set by hand (`-v REGION:REGION:rw -e
    ORION_SHM=...`), the client from the host's lib/orion (-v ...:/usr/lib/orion:ro with
    LD_LIBRARY_PATH, since this image holds no Orion client)."""
    region = str(oriond.region)
    lib = PREFIX / "lib/orion"
    r = engine("run", "--rm", *ulimits(), "-v", f"{region}:{region}:rw", "-v", f"{lib}:/usr/lib/orion:ro",
               "-e", "LD_LIBRARY_PATH=/usr/lib/orion", "-e", f"ORION_SHM={region}", "-e", "ORION_VGPU=1",
               "-e", "ORION_GMEM=256", image, "/usr/bin/device_props")
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert got and all(v == "ok" for v in got.values()), r.stdout


def test_two_containers_on_two_regions_are_isolated(tmp_path, engine, image, cdi_kind):
    """Two regions (two oriond) and a container on each (`--device KIND=0`, `=1`): each container
    has only its own region (the other's path does not exist in it), and killing one frees its vGPU
    at its oriond while the other's session runs on."""
    kind, spec = cdi_kind
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Oriond(tmp_path / "a", region_dir=shm, region_index=0)
    b = Oriond(tmp_path / "b", region_dir=shm, region_index=1)
    names = [f"orion-test-{os.getpid()}-{i}" for i in (0, 1)]
    try:
        r = subprocess.run([PREFIX / "bin/orion-cdi", "generate", "--shm-dir", shm, "--output", spec, "--kind", kind],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        for name, index in zip(names, (0, 1)):
            r = engine("run", "-d", "--name", name, *ulimits(), "--device", f"{kind}={index}", "-e", "ORION_VGPU=1",
                       "-e", "ORION_GMEM=128", image, "/usr/bin/sleeper", "16")
            assert r.returncode == 0, r.stderr
        for name in names:
            wait_until(lambda: "READY" in engine("logs", name).stdout, 30, f"{name} never got its vGPU")
        assert len(smi_json(a)) == 1 and len(smi_json(b)) == 1
        # Container 1 has region 1 and not region 0: a client there pointed at region 0 finds no file.
        r = engine("exec", "-e", f"ORION_SHM={a.region}", "-e", "ORION_VGPU=1", "-e", "ORION_GMEM=64", names[1],
                   "/usr/bin/device_props")
        assert r.returncode != 0 and str(a.region) in r.stderr, r.stdout + r.stderr
        # (podman exec does not carry the CDI device's environment: ORION_SHM again. At /dev/shm, a
        # region's usual place, the client finds it without.)
        r = engine("exec", "-e", f"ORION_SHM={b.region}", "-e", "ORION_VGPU=1", "-e", "ORION_GMEM=64", names[1],
                   "/usr/bin/device_props")
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"Using Orion resource \(standalone\) session-\d+ : " + re.escape(str(b.region)), r.stderr)
        # Killing container 0 frees its vGPU at oriond A (the lease lapses: 1 s here); B's runs on.
        assert engine("kill", names[0]).returncode == 0
        wait_until(lambda: smi_json(a) == [], 20, "oriond A kept the killed container's session")
        assert len(smi_json(b)) == 1
    finally:
        for name in names:
            engine("rm", "-f", name)
        a.stop()
        b.stop()


def test_a_container_reaches_a_remote_oriond_over_tcp(engine, image, tcp_oriond):
    """The guide's remote way: no region in the container, `--net host` and ORION_SERVER naming
    oriond's TCP address; the client from the host's lib/orion. The session is oriond over TCP."""
    lib = PREFIX / "lib/orion"
    r = engine("run", "--rm", *ulimits(), "--network", "host", "-v", f"{lib}:/usr/lib/orion:ro",
               "-e", "LD_LIBRARY_PATH=/usr/lib/orion", "-e", f"ORION_SERVER=127.0.0.1:{tcp_oriond.port}",
               "-e", "ORION_VGPU=1", "-e", "ORION_GMEM=256", image, "/usr/bin/device_props")
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert got and all(v == "ok" for v in got.values()), r.stdout
    assert re.search(r"Using Orion resource .*127\.0\.0\.1:" + str(tcp_oriond.port), r.stderr), r.stderr


@pytest.fixture(scope="module")
def client_image(engine):
    """scripts/image: Debian minbase + the orion-client package + python3, imported into podman."""
    name = f"localhost/orion-client:test-{os.getpid()}"
    r = subprocess.run([str(ROOT / "scripts/image"), "--tag", name], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == name, r.stdout
    yield name
    engine("rmi", "-f", name)


def test_the_client_image_runs_a_program_and_python_on_a_vgpu(engine, client_image, oriond):
    """The orion-client image, as Orion's guide uses its own (`-v` of the region, `-e ORION_*`): a
    plain nvcc program passes on a vGPU, and Python finds libcuda.so.1 (the package's ld.so.conf.d
    entry) and counts ORION_VGPU devices."""
    region = str(oriond.region)
    common = [*ulimits(), "-v", f"{region}:{region}:rw", "-e", f"ORION_SHM={region}", "-e", "ORION_VGPU=2",
              "-e", "ORION_GMEM=256"]
    r = engine("run", "--rm", *common, "-v", f"{TEST_BIN / 'device_props'}:/usr/local/bin/device_props:ro",
               client_image, "device_props")
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert got and all(v == "ok" for v in got.values()), r.stdout
    py = ("import ctypes; c = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(); "
          "assert c.cuInit(0) == 0; assert c.cuDeviceGetCount(ctypes.byref(n)) == 0; print('DEVICES', n.value)")
    r = engine("run", "--rm", *common, client_image, "python3", "-c", py)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^DEVICES (\d+)$", r.stdout, re.M).group(1) == "2", r.stdout


@pytest.fixture(scope="module")
def pytorch_image(engine, client_image):
    """scripts/image --pytorch: the client image plus a layer with the pinned PyTorch (copied from
    this test run's venv: torch and what it requires). Skipped where that venv has no PyTorch, like
    test_frameworks (CI installs it)."""
    import sys
    pytest.importorskip("torch", reason="PyTorch not installed: scripts/venv --frameworks")
    name = f"localhost/orion-client:pytorch-test-{os.getpid()}"
    r = subprocess.run([str(ROOT / "scripts/image"), "--pytorch", "--from", client_image, "--tag", name],
                       capture_output=True, text=True, timeout=1800, env=dict(os.environ, ORION_VENV=sys.prefix))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == name, r.stdout
    yield name
    engine("rmi", "-f", name)


def test_pytorch_in_the_client_image_spawns_ranks_on_its_vgpus(engine, pytorch_image, tmp_path):
    """The Orion PyTorch guide in a container of the orion-client:pytorch image (its own python3 and
    PyTorch, nothing mounted but the region and the probe), once with `--shm-size` and once with
    `--ipc=host` as the guide says, ORION_VGPU=2: the parent counts the devices and spawns two gloo
    ranks, each on its own vGPU of the parent's share (tests/frameworks/spawn_ranks_probe.py, as
    test_frameworks runs it on the host). A DDP model is not built: its constructor flattens parameters with a kernel of the
    torch wheel, SASS the sim cannot run (it fails with CUDA's no-kernel-image error, never a silent
    success); the gradients' all_reduce DDP would do is what the ranks run."""
    d = Oriond(tmp_path, conf_text="[server]\n    vgpu_count = 2\n[server-shm]\n    shm_buffer_size = 16\n",
               extra_args=("--sim-gpus", "1", "--sim-gpu-mem", "2048"))
    try:
        region, probes = str(d.region), ROOT / "tests/frameworks"
        # The guide's two ways to give the ranks' shared memory room (podman takes one or the other).
        for i, ipc in enumerate((["--shm-size", "1g"], ["--ipc", "host"])):
            r = engine("run", "--rm", *ulimits(), *ipc, "-v", f"{region}:{region}:rw", "-v", f"{probes}:/probes:ro",
                       "-e", f"ORION_SHM={region}", "-e", "ORION_VGPU=2", "-e", "ORION_GMEM=0", pytorch_image,
                       "python3", "/probes/spawn_ranks_probe.py", 29517 + i, timeout=600)
            out = r.stdout + r.stderr
            assert r.returncode == 0, (ipc, out[-4000:])
            assert re.findall(r"^PARENT count=(\d+)$", r.stdout, re.M) == ["2"], (ipc, out[-4000:])
            seen = {int(m.group(1)): (int(m.group(2)), m.group(3)) for m in
                    re.finditer(r"^RANK (\d+) device=(\d+) sum=(\w+)$", r.stdout, re.M)}
            assert seen == {0: (0, "True"), 1: (1, "True")}, (ipc, out[-4000:])
        # Each run took its two vGPUs once: the parent's share, which its second rank joined.
        started = re.findall(r"Starting vGPU share ([0-9a-f]{8}) ", d.log())
        joined = re.findall(r"Joining vGPU share ([0-9a-f]{8}) ", d.log())
        assert len(set(started)) == 2 and joined == started, d.log()[-3000:]
        # The PyTorch that ran is the image's own, the version the venv pins.
        r = engine("run", "--rm", *ulimits(), pytorch_image, "python3", "-c",
                   "import torch, sys; print('TORCH', torch.__version__, torch.__file__, sys.executable)")
        assert r.returncode == 0, r.stdout + r.stderr
        version, path, exe = re.search(r"^TORCH (\S+) (\S+) (\S+)$", r.stdout, re.M).groups()
        import importlib.metadata
        assert version.split("+")[0] == importlib.metadata.version("torch").split("+")[0], r.stdout
        assert path.startswith("/usr/local/lib/python3") and exe == "/usr/bin/python3", r.stdout
    finally:
        d.stop()
