"""Integration fixtures: a real oriond (sim backend) on a fresh region, and the installed guest
runtime, driving the nvcc-built programs of tests/cuda.

Paths come from the environment (scripts/test sets them):
  ORION_PREFIX    the install prefix (bin/oriond, bin/orion-shm, lib/orion/libcuda.so.1)
  ORION_TEST_BIN  the directory of the built test programs (build/tests/cuda)
"""
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
                 netns=None, backend="sim"):
        self.tmp = tmp
        self.region = tmp / "orionsock0"
        self.logs = tmp / "logs"
        self.launch_log = tmp / "launch.log"
        out = subprocess.run([PREFIX / "bin" / "orion-shm", "-i", "0", "-s", str(region_mib), "-d", tmp],
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
        deadline = time.time() + 20
        while self.log().count("Orion Server listens") == starts:
            assert self.proc.poll() is None, f"oriond exited: {self.read_stderr()}"
            assert time.time() < deadline, "oriond did not start"
            time.sleep(0.05)

    def log(self) -> str:
        p = self.logs / "server.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def session_logs(self) -> str:
        d = self.logs / "session"
        return "".join(p.read_text(errors="replace") for p in sorted(d.glob("*.log"))) if d.exists() else ""

    def read_stderr(self) -> str:
        return (self.tmp / "oriond.stderr").read_text()

    def launches(self):
        if not self.launch_log.exists():
            return []
        return self.launch_log.read_text().splitlines()

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


def assert_launches_logged(program_stdout, launch_log):
    """Every launch the program made is in the sim launch log, in order, with the exact bytes the
    program passed (the log holds the whole parameter buffer; trailing padding must be zero)."""
    want = launch_lines(program_stdout)
    assert want, "program printed no LAUNCH lines"
    logged = []
    for line in launch_log:
        m = re.search(r" launch (\S+) grid=(\S+) block=(\S+) smem=\d+ stream=\d+ params=([0-9a-f]*) exec=\S+$", line)
        if m:
            logged.append(m.groups())
    i = 0
    for name, grid, block, params in want:
        while i < len(logged) and (logged[i][0], logged[i][1], logged[i][2]) != (name, grid, block):
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


def launch_outcomes(log_lines):
    """[(kernel, outcome)] from a sim launch log, in launch order. A launch deferred on a stream
    (exec=deferred) takes the outcome of its later "ran" line: each session's stream runs its
    deferred launches in order."""
    out, pending = [], {}
    for line in log_lines:
        m = re.match(r"sess=(\d+) launch (\S+) .*stream=(\d+) .*exec=(\S+)$", line)
        if m:
            out.append([m.group(2), m.group(4)])
            if m.group(4) == "deferred":
                pending.setdefault((m.group(1), m.group(3)), []).append(len(out) - 1)
            continue
        m = re.match(r"sess=(\d+) ran (\S+) stream=(\d+) exec=(\S+)$", line)
        if m and pending.get((m.group(1), m.group(3))):
            out[pending[(m.group(1), m.group(3))].pop(0)][1] = m.group(4)
    return [tuple(x) for x in out]
