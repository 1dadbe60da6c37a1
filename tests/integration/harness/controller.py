"""orion-controller for the tests: a controller on a temporary SQLite file (or HTTPS, keys), a
cluster of oriond (sim) registered with it, and the keys the tests use (test_controller,
test_slurm)."""
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import PREFIX, TEST_BIN, Oriond, free_port

ADMIN, SERVER, CLIENT = "admin-key-0001", "server-key-0001", "client-key-0001"


CLIENT2 = "client-key-0002"  # a second client key (another tenant)


def regionless_home(tmp: Path):
    """A HOME for clients that see no region, so they ask a controller: its client.conf points
    shm_path_base at the empty tmp/noshm, and tmp/nopci (ORION_SYSFS_PCI) lists no PCI device."""
    home = tmp / "home"
    (home / ".orion").mkdir(parents=True)
    (tmp / "noshm").mkdir()
    (tmp / "nopci").mkdir()
    (home / ".orion" / "client.conf").write_text(f"[client-shm]\n    shm_path_base = {tmp / 'noshm'}/\n")
    return home


class ControllerProcess:
    """An orion-controller process started from a controller.yaml: its log, its REST calls (a
    subclass's `call`), and how it ends. test_cluster's controllers on etcd share it."""

    def launch(self, conf: Path):
        """Starts the controller and waits (20 s at most) until /v1/health answers 200."""
        self.err = open(self.log_path, "a")
        self.proc = subprocess.Popen([PREFIX / "bin" / "orion-controller", "start", "--config-file", conf],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.time() + 20
        try:
            while True:
                assert self.proc.poll() is None, self.log()
                try:
                    if self.call("GET", "/v1/health")[0] == 200:
                        return
                except OSError:
                    pass
                assert time.time() < deadline, self.log()
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def log(self):
        return self.log_path.read_text(errors="replace")

    def get(self, path, **kw):
        code, body = self.call("GET", path, **kw)
        assert code == 200, (code, body)
        return body

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.err.close()


class Controller(ControllerProcess):
    def __init__(self, tmp: Path, placement="pack", keys=False, port=None, db=None, extra="", server_timeout_s=1.5,
                 lease_ttl_s=2, tls: Path = None, mtls=False, bound_keys=None):
        self.tmp = tmp
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        # tls: a make_certs directory: the controller serves HTTPS with its server certificate.
        self.tls = tls
        self.mtls = mtls  # clients need a certificate signed by tls/ca.crt
        self.url = f"https://{self.addr}" if tls else self.addr  # as clients write it
        if tls:
            extra += f"tls_cert: {tls / 'server.crt'}\ntls_key: {tls / 'server.key'}\n"
            if mtls:
                extra += f"tls_client_ca: {tls / 'ca.crt'}\n"
        self.db = db or tmp / "controller.db"
        self.placement = placement
        self.keys = keys
        self.bound_keys = bound_keys or {}  # with keys: server keys bound to one server, {key: server id}
        self.extra = extra  # more controller.yaml lines
        self.server_timeout_s = server_timeout_s
        self.lease_ttl_s = lease_ttl_s
        self.log_path = tmp / "controller.log"
        self.start()

    def start(self):
        conf = self.tmp / "controller.yaml"
        text = (f"listen: {self.addr}\ndatabase: {self.db}\nplacement: {self.placement}\n"
                f"lease_ttl_s: {self.lease_ttl_s}\nserver_timeout_s: {self.server_timeout_s}\nserver_release_s: {max(30, self.server_timeout_s)}\n" + self.extra)
        if self.keys:
            bound = "".join(f", {{key: {k}, server: '{v}'}}" for k, v in self.bound_keys.items())
            text += f"authentication:\n  client: [{CLIENT}, {CLIENT2}]\n  server: [{SERVER}{bound}]\n  admin: {ADMIN}\n"
        conf.write_text(text)
        self.launch(conf)

    def call(self, method, path, body=None, key=ADMIN):
        req = urllib.request.Request(f"{'https' if self.tls else 'http'}://{self.addr}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if key and self.keys:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            tls = ssl.create_default_context(cafile=str(self.tls / "ca.crt")) if self.tls else None
            if self.mtls:
                tls.load_cert_chain(self.tls / "client.crt", self.tls / "client.key")
            with urllib.request.urlopen(req, timeout=10, context=tls) as r:
                data = r.read()
                return r.status, (json.loads(data) if r.headers.get_content_type() == "application/json" else data.decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

def worst_status_seconds(ctl, tries=10):
    """The longest of `tries` authenticated GET /v1/status round trips (a controller with no servers)."""
    worst = 0.0
    for _ in range(tries):
        t0 = time.time()
        st = ctl.get("/v1/status", key=CLIENT)
        worst = max(worst, time.time() - t0)
        assert st["servers"] == 0, st
    return worst


def server_conf(ctl, key=None, gpus=2, heartbeat_ms=300):
    return ("[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = 16\n"
            f"[controller]\n    controller_addr = {ctl.url}\n    heartbeat_ms = {heartbeat_ms}\n" +
            (f"    controller_key = {key}\n" if key else "") +
            (f"    controller_tls_ca = {ctl.tls / 'ca.crt'}\n" if ctl.tls else "") +
            (f"    controller_tls_cert = {ctl.tls / 'client.crt'}\n    controller_tls_key = {ctl.tls / 'client.key'}\n"
             if ctl.mtls else ""))


class Cluster:
    """A controller and oriond servers (2 sim GPUs of 16384 MiB, 4 vGPUs each) registered with it."""

    def __init__(self, tmp: Path, servers=2, placement="pack", keys=False, heartbeat_ms=300, tls=None, mtls=False):
        self.tmp = tmp
        self.heartbeat_ms = heartbeat_ms
        # Slow heartbeats: the controller waits for them (server_timeout_s) accordingly.
        self.ctl = Controller(tmp, placement=placement, keys=keys, server_timeout_s=max(1.5, 3 * heartbeat_ms / 1000),
                              tls=tls, mtls=mtls)
        self.servers = []
        for i in range(servers):
            self.add_server(key=SERVER if keys else None)
        self.wait_up(servers)
        self.home = regionless_home(tmp)

    def add_server(self, key=None):
        sub = self.tmp / f"srv{len(self.servers)}"
        sub.mkdir()
        port = free_port()
        d = Oriond(sub, tcp_port=port, conf_text=server_conf(self.ctl, key, heartbeat_ms=self.heartbeat_ms) +
                   f"[orion]\n    control_socket = {sub / 'oriond.sock'}\n",
                   extra_args=("--sim-gpus", "2", "--sim-gpu-mem", "16384", "-k"))
        d.port = port
        d.id = f"127.0.0.1:{port}"
        self.servers.append(d)
        return d

    def wait_up(self, n, timeout=20):
        deadline = time.time() + timeout
        while True:
            st = self.ctl.get("/v1/status")
            if st["servers_up"] == n:
                return st
            assert time.time() < deadline, (st, self.ctl.log())
            time.sleep(0.1)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env.update({"LD_LIBRARY_PATH": str(PREFIX / "lib" / "orion"), "HOME": str(self.home),
                    "ORION_SYSFS_PCI": str(self.tmp / "nopci"), "ORION_CONTROLLER": self.ctl.url,
                    "ORION_VGPU": "1", "ORION_GMEM": "512"})
        if self.ctl.tls:
            env["ORION_TLS_CA"] = str(self.ctl.tls / "ca.crt")
        if self.ctl.mtls:
            env["ORION_TLS_CERT"] = str(self.ctl.tls / "client.crt")
            env["ORION_TLS_KEY"] = str(self.ctl.tls / "client.key")
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, program, *args, timeout=120, **env):
        return subprocess.run([str(TEST_BIN / program), *map(str, args)], env=self.env(**env), capture_output=True,
                              text=True, timeout=timeout)

    def sleeper(self, mib=64, **env):
        p = subprocess.Popen([str(TEST_BIN / "sleeper"), str(mib)], env=self.env(**env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        line = ""
        while "READY" not in line:
            line = p.stdout.readline()
            if not line:
                raise AssertionError(f"sleeper failed: {p.stderr.read()}")
        return p

    def tool(self, name, *args, **env):
        return subprocess.run([str(PREFIX / "bin" / name), *map(str, args)], env=self.env(**env), capture_output=True,
                              text=True, timeout=60)

    def allocations(self):
        return self.ctl.get("/v1/allocations?kind=process")

    def wait_allocations(self, n, timeout=10):
        deadline = time.time() + timeout
        while len(self.allocations()) != n:
            assert time.time() < deadline, (self.allocations(), self.ctl.log()[-3000:])
            time.sleep(0.1)

    def stop(self):
        for d in self.servers:
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
        self.ctl.stop()

