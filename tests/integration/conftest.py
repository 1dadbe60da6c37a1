"""Integration fixtures: a real oriond (sim backend) on a fresh region, and the installed guest
runtime, driving the nvcc-built programs of tests/cuda.

Paths come from the environment (scripts/test sets them):
  ORION_PREFIX    the install prefix (bin/oriond, bin/orion-shm, lib/orion/libcuda.so.1)
  ORION_TEST_BIN  the directory of the built test programs (build/tests/cuda)
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = Path(os.environ.get("ORION_PREFIX", ROOT / "build" / "install"))
TEST_BIN = Path(os.environ.get("ORION_TEST_BIN", ROOT / "build" / "tests" / "cuda"))


def doorbell_keepers(under):
    """pids of oriond's doorbell keepers (`oriond --doorbell-keeper FD SOCKET`) whose socket path
    starts with `under`. A keeper outlives its oriond on purpose (it holds VM doorbells across
    restarts), so tests end the ones they caused."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 4 and argv[1] == b"--doorbell-keeper" and argv[3].startswith(str(under).encode()):
            found.append(int(d.name))
    return found


@pytest.fixture(scope="session", autouse=True)
def end_doorbell_keepers(tmp_path_factory):
    yield
    for pid in doorbell_keepers(tmp_path_factory.getbasetemp()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Oriond:
    """One oriond process serving one region in its own temporary directory."""

    def __init__(self, tmp: Path, region_mib=256, channel_mib=16, conf_text=None, extra_args=(), tcp_port=0,
                 netns=None, backend="sim", region_dir=None, region_index=0):
        self.tmp = tmp
        # The region: <region_dir or tmp>/orionsock<region_index> (two oriond may keep theirs side by side).
        region_dir = region_dir or tmp
        self.region = region_dir / f"orionsock{region_index}"
        self.logs = tmp / "logs"
        self.launch_log = tmp / "launch.log"
        out = subprocess.run([PREFIX / "bin" / "orion-shm", "-i", str(region_index), "-s", str(region_mib), "-d",
                              region_dir],
                             capture_output=True, text=True, check=True)
        assert "is successfully created." in out.stdout
        conf = tmp / "server.conf"
        conf.write_text(conf_text if conf_text is not None else
                        f"[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = {channel_mib}\n")
        self.stderr = open(tmp / "oriond.stderr", "w")
        self.argv = (
            (["ip", "netns", "exec", netns] if netns else []) + [PREFIX / "bin" / "oriond", "--config", conf, "--backend", backend, "--foreground",
             "--log-dir", self.logs, "--shm", self.region, "--cache-dir", tmp / "cache",
             "--sim-launch-log", self.launch_log, "--lease-timeout-ms", "1000",
             "--control-socket", tmp / "oriond.sock", "--state-file", tmp / "vms.json", "-p", str(tcp_port),
             *extra_args])
        self.start()

    def start(self):
        """Starts oriond (again, after stop(): same arguments, same region and state file)."""
        if self.stderr.closed:
            self.stderr = open(self.tmp / "oriond.stderr", "a")
        starts = self.log().count("Orion Server listens")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=self.stderr)
        wait_until(lambda: self.log().count("Orion Server listens") > starts, 20,
                   lambda: f"oriond did not start: {self.read_stderr()}", alive=lambda: self.proc.poll() is None)

    def log(self) -> str:
        p = self.logs / "server.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def session_logs(self) -> str:
        d = self.logs / "session"
        return "".join(p.read_text(errors="replace") for p in sorted(d.glob("*.log"))) if d.exists() else ""

    def read_stderr(self) -> str:
        return (self.tmp / "oriond.stderr").read_text()

    def launches(self):
        """The sim launch log's records (read_launch_log)."""
        return read_launch_log(self.launch_log)

    def env(self, **extra):
        env = dict(os.environ)
        env.update({"LD_LIBRARY_PATH": str(PREFIX / "lib" / "orion"), "ORION_SHM": str(self.region),
                    "ORION_VGPU": "1", "ORION_GMEM": "512"})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, program, *args, timeout=120, **env):
        exe = TEST_BIN / program if not os.path.isabs(str(program)) else program
        return subprocess.run([str(exe), *map(str, args)], env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, program, *args, **env):
        return subprocess.Popen([str(TEST_BIN / program), *map(str, args)], env=self.env(**env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


@pytest.fixture
def oriond(tmp_path):
    d = Oriond(tmp_path)
    yield d
    d.stop()


@pytest.fixture
def oriond_api_level(tmp_path):
    """An oriond started with --sim-unexecutable skip: kernels the sim cannot execute (SASS only:
    PyTorch's ATen kernels, cuBLAS/cuDNN GEMMs and convolutions, CuPy's cubins) are accepted and
    NOT run, so the values they should write are not computed. Only for tests of the API level
    (status codes, data movement, which kernels are launched); every test using it says so in its
    name (`..._api_level`) and docstring. The default oriond (`oriond`) refuses such launches."""
    d = Oriond(tmp_path, extra_args=("--sim-unexecutable", "skip"))
    yield d
    d.stop()


@pytest.fixture
def make_oriond(tmp_path):
    made = []

    def make(**kw):
        sub = Path(tempfile.mkdtemp(dir=tmp_path))
        d = Oriond(sub, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def make_certs(d: Path):
    """In `d`: ca.crt (a test CA), server.crt/server.key for 127.0.0.1 and localhost signed by it, and
    other-ca.crt/other-ca.key (a CA that signed nothing here)."""
    d.mkdir(parents=True, exist_ok=True)

    def openssl(*args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *key, "-keyout", d / f"{ca}.key", "-out", d / f"{ca}.crt", "-days", "2",
                "-subj", f"/CN=Orion test {ca}")
    openssl("req", *key, "-keyout", d / "server.key", "-out", d / "server.csr", "-subj", "/CN=localhost")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", d / "server.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key", "-CAcreateserial",
            "-out", d / "server.crt", "-days", "2", "-extfile", d / "san.ext")
    # Client certificates (mutual TLS): client.crt signed by ca, rogue.crt by other-ca.
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ca in (("client", "ca"), ("rogue", "other-ca")):
        openssl("req", *key, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr", "-subj", f"/CN=orion {name}")
        openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / f"{ca}.crt", "-CAkey", d / f"{ca}.key",
                "-CAcreateserial", "-out", d / f"{name}.crt", "-days", "2", "-extfile", d / "client.ext")
    return d


def free_port():
    """A TCP port on 127.0.0.1 free when asked (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_lines(stdout):
    """LAUNCH <name> grid=x,y,z block=x,y,z params=<hex> lines printed by the programs."""
    return re.findall(r"^LAUNCH (\S+) grid=(\S+) block=(\S+) params=([0-9a-f]*)$", stdout, re.M)


def read_launch_log(path):
    """The sim launch log (oriond --sim-launch-log), one JSON object per line: "launch" records
    (kernel, grid, block, smem, stream, cooperative, cluster, params as hex, exec) and "ran" records
    (a deferred launch's outcome: kernel, stream, exec). host/src/sim_backend.cpp (LogLaunch) has the
    format. [] when no launch was logged yet."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def launched(records, kernel=None):
    """The "launch" records, of kernels whose (mangled) name contains `kernel` when given."""
    return [r for r in records if r["event"] == "launch" and (kernel is None or kernel in r["kernel"])]


def assert_launches_logged(program_stdout, records):
    """Every launch the program made is in the sim launch log, in order, with the exact bytes the
    program passed (the log holds the whole parameter buffer; trailing padding must be zero)."""
    want = launch_lines(program_stdout)
    assert want, "program printed no LAUNCH lines"
    logged = [(r["kernel"], r["grid"], r["block"], r["params"]) for r in launched(records)]
    i = 0
    for name, grid, block, params in want:
        key = (name, [int(v) for v in grid.split(",")], [int(v) for v in block.split(",")])
        while i < len(logged) and logged[i][:3] != key:
            i += 1
        assert i < len(logged), f"launch {name} grid={grid} block={block} not in the sim launch log:\n{logged}"
        got = logged[i][3]
        assert got.startswith(params), f"{name}: logged params {got} != program's {params}"
        assert set(got[len(params):]) <= {"0"}, f"{name}: nonzero padding after the last parameter: {got}"
        i += 1


def run_tcp(d, program, *args, address=None, timeout=120, **env):
    e = d.env(**env)
    e.pop("ORION_SHM")
    e["ORION_SERVER"] = address or f"127.0.0.1:{d.port}"
    return subprocess.run([str(TEST_BIN / program), *map(str, args)], env=e, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def tcp_oriond(tmp_path):
    """An oriond (sim) that also listens on TCP (its port: .port); clients reach it with run_tcp."""
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port)
    d.port = port
    yield d
    d.stop()


def spin_kernels(procs, timeout=120):
    """The kernel counts of tests/cuda/spin processes (Popen, text pipes), in order, once each ends
    with its check passed ("KERNELS n MS w CHECK ok")."""
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        m = re.search(r"^KERNELS (\d+) MS \d+ CHECK (\w+)$", out, re.M)
        assert p.returncode == 0 and m and m.group(2) == "ok", out + err
        counts.append(int(m.group(1)))
    return counts


def spin_iters(env, kernel_ms, probe=4000):
    """The ITERS argument of tests/cuda/spin for kernels of about `kernel_ms` ms through the oriond
    `env` leads to, measured now: the executor's speed is the machine's and the build's (on the sim,
    the PTX translator runs spin's loop ~8x faster than the interpreter, and an AddressSanitizer
    oriond far slower). One probe run: warm kernels of `probe` iterations until a window opens 1 s
    later (the translator has compiled the kernel by then), then as many as fit in 0.5 s."""
    start = int(time.time() * 1000) + 1000
    t0 = time.time()
    r = subprocess.run([str(TEST_BIN / "spin"), str(start), str(start + 500), str(probe)], env={**env, "SPIN_WARM": "1"},
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"^KERNELS (\d+) MS (\d+) CHECK ok$", r.stdout, re.M)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    kernels, window_ms = int(m.group(1)), int(m.group(2))
    # No kernel finished inside the window: one took at least the time since the window opened.
    per_kernel_ms = window_ms / kernels if kernels else max(500.0, (time.time() - t0 - 1.0) * 1000)
    return max(1, int(probe * kernel_ms / per_kernel_ms))


def smi_json(d):
    """`orion-smi --json` against oriond `d`'s control socket (its `sessions`), parsed."""
    import json
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env["HOME"] = str(d.tmp)
    r = subprocess.run([str(PREFIX / "bin" / "orion-smi"), "--oriond", str(d.tmp / "oriond.sock"), "--json"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_until(condition, timeout=10.0, what=None, interval=0.05, alive=None):
    """Polls `condition()` until it returns a true value (returned) or `timeout` seconds pass: the
    test then fails with `what` (a string, or a callable called then: a log's tail). `alive`: a
    callable asked after each poll that found the condition false; when it returns false (the process that would make the
    condition true has died) the test fails at once, with `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and not alive():
            detail = what() if callable(what) else what
            raise AssertionError(f"died while waiting: {detail if detail is not None else condition}")
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"not within {timeout} s: {detail if detail is not None else condition}")
        time.sleep(interval)


def wait_ready(proc):
    """Reads a sleeper's output up to its READY line (its session exists then)."""
    line = ""
    while "READY" not in line:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()


def checks(stdout: str):
    """The CHECK lines of a test program: {name: 'ok' | 'FAIL ...' | 'skipped-sim ...'}."""
    out = {}
    for m in re.finditer(r"^CHECK (\S+) (.*)$", stdout, re.M):
        out[m.group(1)] = m.group(2)
    return out


def assert_passed(result, expect_checks=1):
    failed = {k: v for k, v in checks(result.stdout).items() if v.startswith("FAIL")}
    assert result.returncode == 0 and not failed, (
        f"exit {result.returncode}\nfailed: {failed}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}")
    # Only checks that ran count: "skipped-sim" lines are not passes.
    assert sum(1 for v in checks(result.stdout).values() if v == "ok") >= expect_checks, result.stdout[-2000:]
    assert re.search(r"^DONE checks=\d+ failed=0$", result.stdout, re.M), result.stdout[-2000:]


def launch_outcomes(records):
    """[(kernel, outcome)] from the sim launch log's records, in launch order. A launch deferred on
    a stream (exec "deferred") takes the outcome of its later "ran" record: each session's stream
    runs its deferred launches in order."""
    out, pending = [], {}
    for r in records:
        key = (r["sess"], r["stream"])
        if r["event"] == "launch":
            out.append([r["kernel"], r["exec"]])
            if r["exec"] == "deferred":
                pending.setdefault(key, []).append(len(out) - 1)
        elif r["event"] == "ran" and pending.get(key):
            out[pending[key].pop(0)][1] = r["exec"]
    return [tuple(x) for x in out]


def outcomes_of(records, kernel):
    """The final outcomes (launch_outcomes) of the launches of kernels whose name contains `kernel`."""
    return [e for k, e in launch_outcomes(records) if kernel in k]


@pytest.fixture(scope="module")
def kernel():
    """The guest kernel QEMU boots (scripts/vm-kernel finds or fetches it)."""
    out = subprocess.run([ROOT / "scripts" / "vm-kernel"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return Path(ROOT / out.stdout.strip())


@pytest.fixture(scope="module")
def debs():
    """{"orion-server": path, "orion-client": path}: the .debs scripts/package builds."""
    r = subprocess.run([str(ROOT / "scripts" / "package")], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    paths = {Path(p).name.split("_")[0]: Path(p) for p in r.stdout.split()}
    assert set(paths) == {"orion-server", "orion-client"}, r.stdout
    return paths


# The checks tests/cuda/compute.cu prints, each a value a kernel computed.
RESULTS = ["vadd", "matmul_shared_tiles", "shuffle_reduction", "scan", "histogram_atomics", "divergent_warp",
           "struct_by_value_double", "half_precision", "profiler_start_stop"]


def assert_computed(r):
    """`compute` passed: every kernel result checked on the host, device printf in order."""
    assert_passed(r, expect_checks=len(RESULTS))
    c = checks(r.stdout)
    assert all(c.get(k) == "ok" for k in RESULTS), c
    # Device printf lines reach this process's stdout, after the host line before the kernel and
    # before the one after the synchronize.
    lines = r.stdout.splitlines()
    dev = [l for l in lines if l.startswith("DEVPRINTF")]
    assert sorted(dev) == sorted(f"DEVPRINTF block {b} thread {t} x=42 pi=3.142" for b in (0, 1) for t in (0, 1)), dev
    assert lines.index("HOST before printf kernel") < lines.index(dev[0])
    assert lines.index(dev[-1]) < lines.index("HOST after printf kernel")


def run_pair(oriond, **env):
    """tests/cuda/ipc: a producer session exports memory and an event, a consumer session opens
    them; (consumer, producer) CompletedProcesses."""
    producer = subprocess.Popen([str(TEST_BIN / "ipc"), "producer"], env=oriond.env(ORION_GMEM=256, **env),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, line = "", ""
    while not line.startswith("HANDLES"):
        line = producer.stdout.readline()
        assert line, producer.stderr.read()
        seen += line
    _, mem, ev = line.split()
    consumer = oriond.run("ipc", "consumer", mem, ev, ORION_GMEM=256, **env)
    out, err = producer.communicate("CONSUMED\n", timeout=120)
    return consumer, subprocess.CompletedProcess(producer.args, producer.returncode, seen + out, err)

