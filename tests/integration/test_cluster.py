"""The pool at cluster scale (issue #14): a 3-member etcd cluster on loopback ports, 3
orion-controllers on it (database: etcd://...), 2 oriond (sim) whose controller_addr lists all three
controllers, and clients (real nvcc-built programs through the guest runtime, and plain HTTP).

Covers: placements through any controller, seen by every controller; 200 concurrent allocations
spread over the controllers never double-book a vGPU nor overfill a GPU; kill -9 of one etcd member
and of one controller in the middle of a burst of real clients: every client is placed (failover in
the client and in the controllers' etcd client); the etcd majority killed: placements get 503 and
/v1/health says so, and placements resume when the members return; a killed client's allocation is
dropped by its etcd lease with every controller dead (no controller's clock is involved); migration
of a SQLite pool into etcd.

etcd comes from Debian's etcd-server (scripts/deps installs it); the tests skip only when the etcd
binary is absent. The members run with --unsafe-no-fsync: the tests are about behaviour, and fsyncs
on this shared disk would only make them slower (the bench runs etcd with fsync)."""
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import PREFIX, TEST_BIN, Oriond, assert_passed, free_port, make_certs, wait_until
from harness.controller import ControllerProcess, regionless_home

ETCD = shutil.which("etcd")
ETCDCTL = shutil.which("etcdctl")
pytestmark = pytest.mark.skipif(ETCD is None, reason="the etcd binary is absent (Debian: apt-get install etcd-server; "
                                                     "scripts/deps installs it)")


def http(addr, method, path, body=None, timeout=15, tls: Path = None):
    """tls: a make_certs directory: HTTPS verified against its ca.crt, with its client certificate."""
    req = urllib.request.Request(f"{'https' if tls else 'http'}://{addr}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
    context = None
    if tls:
        context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        context.load_cert_chain(tls / "client.crt", tls / "client.key")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        data = e.read()
        try:
            return e.code, json.loads(data or b"{}")
        except ValueError:
            return e.code, {"message": data.decode(errors="replace")}


class Etcd:
    """A 3-member etcd cluster on loopback. tls: a make_certs directory: clients speak HTTPS to the
    members (server.crt, for 127.0.0.1) and need a client certificate signed by ca.crt."""

    def __init__(self, tmp: Path, n=3, tls: Path = None):
        self.tmp = tmp
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.names = [f"m{i}" for i in range(n)]
        # A port free_port() found can be taken by another process before etcd binds it (a CI run
        # once lost a cluster to "bind: address already in use"): such a start is redone on new
        # ports, from empty data directories, at most twice more. Any other failure is the test's.
        for attempt in range(3):
            self.client = [free_port() for _ in range(n)]
            self.peer = [free_port() for _ in range(n)]
            self.procs = [None] * n
            try:
                for i in range(n):
                    self.start(i)
                self.wait_healthy(starting=True)
                return
            except BaseException:
                self.stop()
                logs = [tmp / f"etcd-{i}.log" for i in range(n)]
                if attempt == 2 or not any(p.exists() and "address already in use" in p.read_text() for p in logs):
                    raise
                for i in range(n):
                    shutil.rmtree(tmp / f"etcd-{i}", ignore_errors=True)
                    logs[i].rename(tmp / f"etcd-{i}.bind-failure-{attempt}.log")

    @property
    def url(self):
        return "etcd://" + ",".join(f"127.0.0.1:{p}" for p in self.client)

    def start(self, i):
        cluster = ",".join(f"{self.names[k]}=http://127.0.0.1:{self.peer[k]}" for k in range(len(self.names)))
        log = open(self.tmp / f"etcd-{i}.log", "a")
        self.procs[i] = subprocess.Popen(
            [ETCD, "--name", self.names[i], "--data-dir", str(self.tmp / f"etcd-{i}"),
             "--listen-client-urls", f"{self.scheme}://127.0.0.1:{self.client[i]}",
             "--advertise-client-urls", f"{self.scheme}://127.0.0.1:{self.client[i]}",
             *(("--cert-file", self.tls / "server.crt", "--key-file", self.tls / "server.key",
                "--trusted-ca-file", self.tls / "ca.crt", "--client-cert-auth") if self.tls else ()),
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer[i]}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[i]}",
             "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "orion-test",
             "--unsafe-no-fsync", "--log-level", "warn"],
            stdout=log, stderr=log)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def ctl(self, *args, check=True):
        tls = (("--cacert", self.tls / "ca.crt", "--cert", self.tls / "client.crt", "--key", self.tls / "client.key")
               if self.tls else ())
        endpoints = ",".join(f"{self.scheme}://127.0.0.1:{p}" for p in self.client)
        return subprocess.run([ETCDCTL, "--endpoints", endpoints, *map(str, tls), *args],
                              env={**os.environ, "ETCDCTL_API": "3"}, capture_output=True, text=True, timeout=30,
                              check=check)

    def wait_healthy(self, timeout=30, starting=False):
        deadline = time.time() + timeout
        while True:
            if starting:  # a member that exited while the cluster starts will not come back
                assert all(p.poll() is None for p in self.procs), (self.tmp / "etcd-0.log").read_text()[-3000:]
            try:
                if http(f"127.0.0.1:{self.client[0]}", "POST", "/v3/kv/range",
                        {"key": "L29yaW9uL3Bpbmc=", "count_only": True}, timeout=2, tls=self.tls)[0] == 200:
                    return
            except OSError:
                pass
            assert time.time() < deadline, (self.tmp / "etcd-0.log").read_text()[-3000:]
            time.sleep(0.1)

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


class Controller(ControllerProcess):
    """A controller of the cluster: its own yaml and log, named `name`, on `database` (etcd://...)."""

    def __init__(self, tmp: Path, database, name, lease_ttl_s=30, server_timeout_s=2, extra=""):
        self.tmp = tmp
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        self.conf = tmp / f"{name}.yaml"
        self.conf.write_text(f"listen: {self.addr}\ndatabase: {database}\nlease_ttl_s: {lease_ttl_s}\n"
                             f"server_timeout_s: {server_timeout_s}\nserver_release_s: 60\n" + extra)
        self.start()

    def start(self):
        self.launch(self.conf)

    def call(self, method, path, body=None):
        return http(self.addr, method, path, body)


class Pool:
    """etcd (3 members), controllers on it, oriond (sim, 2 GPUs of 16384 MiB) listing every controller."""

    def __init__(self, tmp: Path, controllers=3, servers=2, vgpu_count=4, lease_ttl_s=30, heartbeat_ms=300,
                 etcd_members=3, tls: Path = None):
        self.tmp = tmp
        self.heartbeat_ms = heartbeat_ms
        self.etcd = Etcd(tmp, n=etcd_members, tls=tls)
        # tls: the controllers speak HTTPS to etcd, with a client certificate.
        self.ctl_extra = etcd_tls_lines(tls) if tls else ""
        self.ctls, self.servers = [], []
        try:
            self._start(tmp, controllers, servers, vgpu_count, lease_ttl_s)
        except BaseException:
            self.stop()  # no fixture teardown runs for a constructor that failed: leave nothing running
            raise

    def _start(self, tmp, controllers, servers, vgpu_count, lease_ttl_s):
        for i in range(controllers):
            self.ctls.append(Controller(tmp, self.etcd.url, f"ctl{i}", lease_ttl_s=lease_ttl_s,
                                        server_timeout_s=max(2, 3 * self.heartbeat_ms // 1000), extra=self.ctl_extra))
        self.addrs = ",".join(c.addr for c in self.ctls)
        for i in range(servers):
            sub = tmp / f"srv{i}"
            sub.mkdir()
            port = free_port()
            conf = (f"[server]\n    vgpu_count = {vgpu_count}\n[server-shm]\n    shm_buffer_size = 16\n"
                    f"[controller]\n    controller_addr = {self.addrs}\n    heartbeat_ms = {self.heartbeat_ms}\n")
            d = Oriond(sub, tcp_port=port, conf_text=conf, extra_args=("--sim-gpus", "2", "--sim-gpu-mem", "16384"))
            d.id = f"127.0.0.1:{port}"
            self.servers.append(d)
        self.wait_up(servers)
        self.home = regionless_home(tmp)

    def live(self):
        return [c for c in self.ctls if c.proc.poll() is None]

    def wait_up(self, n, timeout=20):
        for c in self.live():
            wait_until(lambda: c.get("/v1/status")["servers_up"] == n, timeout,
                       lambda: (c.get("/v1/status"), c.log()[-2000:]), interval=0.1)

    def env(self, controllers=None, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env.update({"LD_LIBRARY_PATH": str(PREFIX / "lib" / "orion"), "HOME": str(self.home),
                    "ORION_SYSFS_PCI": str(self.tmp / "nopci"), "ORION_CONTROLLER": controllers or self.addrs,
                    "ORION_VGPU": "1", "ORION_GMEM": "512"})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, program, *args, timeout=60, controllers=None, **env):
        return subprocess.run([str(TEST_BIN / program), *map(str, args)], env=self.env(controllers, **env),
                              capture_output=True, text=True, timeout=timeout)

    def sleeper(self, mib=64):
        """A client holding `mib` MiB of device memory, started (READY printed) and waiting to be killed."""
        p = subprocess.Popen([str(TEST_BIN / "sleeper"), str(mib)], env=self.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        line = ""
        while "READY" not in line:
            line = p.stdout.readline()
            assert line, p.stderr.read()
        return p

    def stop(self):
        for d in self.servers:
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
        for c in self.ctls:
            if c.proc.poll() is None:
                c.stop()
        self.etcd.stop()


def etcd_tls_lines(certs: Path, ca="ca.crt", client="client"):
    """controller.yaml lines for HTTPS to etcd: the CA, and a client certificate (client=None: none)."""
    lines = f"etcd_tls_ca: {certs / ca}\n"
    if client:
        lines += f"etcd_tls_cert: {certs / (client + '.crt')}\netcd_tls_key: {certs / (client + '.key')}\n"
    return lines


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path)
    yield p
    p.stop()


def holders(allocs):
    """(server, pgpu, vgpu) -> allocation ids holding it; (server, pgpu) -> MiB placed."""
    slots, mem = {}, {}
    for a in allocs:
        for p in a["placements"]:
            slots.setdefault((a["server"], p["pgpu"], p["vgpu"]), []).append(a["id"])
            mem[(a["server"], p["pgpu"])] = mem.get((a["server"], p["pgpu"]), 0) + p["gmem_mib"]
    return slots, mem


def test_placements_through_any_controller(pool):
    c0, c1, c2 = pool.ctls
    for c in pool.ctls:
        h = c.get("/v1/health")
        assert h["store"] == {"kind": "etcd", "reachable": True}
    made = []
    for i, c in enumerate(pool.ctls):
        code, a = c.call("POST", "/v1/allocations", {"vgpus": 2, "gmem_mib": 1000, "client": {"host": "h", "pid": i}})
        assert code == 201, a
        made.append(a["id"])
    # Every controller sees every allocation, and the pool's numbers agree.
    for c in pool.ctls:
        ids = {a["id"] for a in c.get("/v1/allocations?kind=process")}
        assert ids == set(made)
        st = c.get("/v1/status")
        assert (st["vgpus_total"], st["vgpus_used"], st["servers_up"]) == (16, 6, 2), st
    # Renewed and released through other controllers than the one that placed them.
    assert c2.call("PUT", f"/v1/allocations/{made[0]}/lease")[0] == 200
    assert c1.call("DELETE", f"/v1/allocations/{made[0]}")[0] == 200
    assert c0.call("GET", f"/v1/allocations/{made[0]}")[0] == 404
    for aid in made[1:]:
        assert c0.call("DELETE", f"/v1/allocations/{aid}")[0] == 200
    # A real client whose first controller is not running: it fails over to the next one, is placed,
    # the oriond serving it confirms through its own controller list, and all is released at exit.
    dead = f"127.0.0.1:{free_port()}"
    r = pool.run("device_props", controllers=f"{dead},{c1.addr},{c2.addr}", ORION_VGPU=2, ORION_GMEM=3000)
    assert_passed(r)
    assert f"Orion Controller {c1.addr} placed allocation" in r.stderr, r.stderr
    assert f"PROP totalGlobalMem={3000 << 20}" in r.stdout
    wait_until(lambda: not c2.get("/v1/allocations?kind=process"), 10,
               lambda: c2.get("/v1/allocations?kind=process"), interval=0.1)
    assert c0.get("/v1/status")["vgpus_used"] == 0
    # Per-controller metrics: this controller's store and its lost races.
    with urllib.request.urlopen(f"http://{c0.addr}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'orion_controller_store_up{store="etcd"} 1' in metrics
    assert 'orion_controller_store_conflicts_total{store="etcd"}' in metrics


def test_a_move_asked_through_one_controller_rehomes_the_allocation_for_all(pool):
    """Live migration on etcd (issue #24): move_loop's allocation is moved through a controller its
    oriond does not speak to first (the source hears of it with its heartbeat, reading etcd). Every
    controller then sees it at the target and no reservation; while it runs there, no vGPU key of
    it is left at the source (the source's 8 vGPUs can be placed whole, through another
    controller); and the program finishes right."""
    c0, c1, c2 = pool.ctls
    p = subprocess.Popen([str(TEST_BIN / "move_loop"), "150", "50", "0"], env=pool.env(ORION_GMEM=256),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.strip() == "READY":
            break
    else:
        raise AssertionError(p.stderr.read())
    [a] = c0.get("/v1/allocations?kind=process")
    src = a["server"]
    dst = next(d.id for d in pool.servers if d.id != src)
    code, body = c2.call("POST", f"/v1/allocations/{a['id']}/migrate", {"to": dst, "wait_s": 60})
    assert code == 200 and body["server"] == dst, (code, body, c2.log()[-3000:])
    for c in pool.ctls:
        [view] = c.get("/v1/allocations?kind=process")
        assert view["id"] == a["id"] and view["server"] == dst and "move" not in view, view
        assert [x["server"] for x in view["placements"]] == [dst], view
    code, whole = c1.call("POST", "/v1/allocations", {"vgpus": 8, "gmem_mib": 1000, "server": src,
                                                      "client": {"host": "h", "pid": 1}})
    assert code == 201, whole
    assert p.poll() is None  # the moved allocation still lives
    assert c0.call("DELETE", f"/v1/allocations/{whole['id']}")[0] == 200
    out, err = p.communicate(timeout=120)
    assert_passed(subprocess.CompletedProcess(p.args, p.returncode, out, err), expect_checks=4)
    assert err.count("the session moved from") == 1, err


def test_200_concurrent_allocations_never_double_book(tmp_path):
    # 2 servers x 2 GPUs x 32 vGPUs = 128 slots of up to 512 MiB each (32 x 512 = 16384: memory and
    # slots run out together); 200 requests of 1 or 2 vGPUs ask ~300 slots: the pool fills up, the
    # rest are refused (409), and no slot is ever given twice.
    p = Pool(tmp_path, vgpu_count=32)
    try:
        results = []
        lock = threading.Lock()

        def one(i):
            c = p.ctls[i % 3]
            code, a = c.call("POST", "/v1/allocations", {"vgpus": 1 + i % 2, "gmem_mib": 512,
                                                          "client": {"host": "burst", "pid": i}})
            with lock:
                results.append((code, a))

        with ThreadPoolExecutor(max_workers=48) as ex:
            list(ex.map(one, range(200)))
        codes = [c for c, _ in results]
        assert set(codes) <= {201, 409}, [r for r in results if r[0] not in (201, 409)][:3]
        placed = [a for c, a in results if c == 201]
        # Each controller placed some (the requests were spread over all three).
        for c in p.ctls:
            assert "allocation " in c.log()
        allocs = p.ctls[0].get("/v1/allocations?kind=process")
        assert {a["id"] for a in allocs} == {a["id"] for a in placed}
        slots, mem = holders(allocs)
        double = {k: v for k, v in slots.items() if len(v) > 1}
        assert not double, double
        assert all(v <= 16384 for v in mem.values()), mem
        # The replies agree with the store: what each client was told is what etcd holds.
        told, _ = holders(placed)
        assert told == slots
        assert sum(len(a["placements"]) for a in placed) == 128  # full: nothing lost to a race
        for c in p.ctls:
            assert c.get("/v1/status")["vgpus_free"] == 0
        # etcd itself: one vGPU key per slot, each naming its allocation.
        keys = p.etcd.ctl("get", "--prefix", "/orion/vgpus/").stdout.split("\n")
        pairs = dict(zip(keys[0::2], keys[1::2]))
        assert len(pairs) == 128
        for (server, pgpu, vgpu), ids in slots.items():
            assert pairs[f"/orion/vgpus/{server}/{pgpu}/{vgpu}"] == ids[0]
    finally:
        p.stop()


def test_kill_an_etcd_member_and_a_controller_mid_burst(pool):
    # 36 real clients (nvcc-built, through the guest runtime), 6 at a time, all listing the three
    # controllers in the same order; after the first few, kill -9 the etcd member every controller
    # talks to first and the controller every client asks first.
    results = []
    lock = threading.Lock()
    started = threading.Event()

    def one(i):
        r = pool.run("device_props", ORION_VGPU=1, ORION_GMEM=1000, timeout=90)
        with lock:
            results.append(r)
            if len(results) >= 6:
                started.set()

    with ThreadPoolExecutor(max_workers=6) as ex:
        futs = [ex.submit(one, i) for i in range(36)]
        assert started.wait(60)
        pool.etcd.kill(0)
        pool.ctls[0].kill()
        t_kill = time.time()
        for f in futs:
            f.result()
    failed = [r for r in results if r.returncode != 0]
    if failed:
        # What held the pool when a client was refused: the allocations, their states and clients.
        left = [{k: a.get(k) for k in ("id", "state", "server", "created_ms", "request_id", "client")}
                for a in pool.ctls[1].get("/v1/allocations?kind=process")]
        assert not failed, (f"{len(failed)} of {len(results)} clients failed; first: {failed[0].stderr[-3000:]}\n"
                            f"allocations now: {left}\nctl1 log: {pool.ctls[1].log()[-6000:]}")
    for r in results:
        assert_passed(r)
    # Clients after the kill were placed by the others.
    later = [r for r in results if f"Orion Controller {pool.ctls[0].addr} placed" not in r.stderr]
    assert len(later) >= 6
    # Nothing left behind: every allocation was released by its client or its server. A request
    # whose answer was lost (the controller killed after committing, or too slow while etcd elected a
    # leader, so that the client asked the next one) was answered with the allocation it had made
    # (its request_id), not given a second one that only its lease (30 s here) would end: a CI run
    # once found both servers full of such orphans before idempotent requests.
    wait_until(lambda: not pool.ctls[1].get("/v1/allocations?kind=process"), 10,
               lambda: pool.ctls[1].get("/v1/allocations?kind=process"), interval=0.2)
    assert pool.ctls[2].get("/v1/status")["vgpus_free"] == 16
    assert pool.ctls[1].get("/v1/health")["store"]["reachable"] is True
    assert time.time() - t_kill < 120


def test_a_late_repeat_from_a_stalled_controller_places_nothing(pool):
    # The mechanism behind a CI failure (both servers full mid-burst): a controller stalls (here
    # SIGSTOP; in CI, waiting on etcd while it elected a leader), the client times out (5 s), asks
    # the next controller, runs and releases; then the stalled one wakes and works through the
    # request it had queued. It must recognize the request_id and place nothing.
    os.kill(pool.ctls[0].proc.pid, signal.SIGSTOP)
    try:
        r = pool.run("device_props", ORION_VGPU=1, ORION_GMEM=1000, timeout=60)
        assert_passed(r)
        assert f"Orion Controller {pool.ctls[1].addr} placed" in r.stderr, r.stderr[-2000:]
        wait_until(lambda: not pool.ctls[1].get("/v1/allocations?kind=process"), 10,  # released by oriond when
                   lambda: pool.ctls[1].get("/v1/allocations?kind=process"), interval=0.1)  # the session ended
    finally:
        os.kill(pool.ctls[0].proc.pid, signal.SIGCONT)
    def counted():  # the woken controller's decisions so far: placements made and requests refused
        with urllib.request.urlopen(f"http://{pool.ctls[0].addr}/metrics", timeout=15) as r:
            text = r.read().decode()
        return sum(int(m.group(1)) for m in re.finditer(
            r"^orion_(?:allocations_created|allocation_refusals)_total (\d+)$", text, re.M))
    wait_until(lambda: counted() != 0, 10,
               "the woken controller never answered its queued request", interval=0.1)
    left = pool.ctls[1].get("/v1/allocations?kind=process")
    assert left == [], left
    assert pool.ctls[0].get("/v1/status")["vgpus_free"] == 16


def test_a_request_sent_to_every_controller_at_once_is_placed_once(pool):
    # A client that asks the next controller while the first is still working (slow during an etcd
    # election, or dead after committing) sends the same request_id: however the requests interleave,
    # one allocation is made and every controller answers with it.
    import uuid
    for round_ in range(8):
        rid = str(uuid.uuid4())
        body = {"vgpus": 1, "gmem_mib": 1000, "request_id": rid, "client": {"host": "h", "pid": round_}}
        with ThreadPoolExecutor(max_workers=3) as ex:
            answers = list(ex.map(lambda c: c.call("POST", "/v1/allocations", body), pool.ctls))
        assert [code for code, _ in answers] == [201] * 3, answers
        assert len({a["id"] for _, a in answers}) == 1, answers
        assert all(a["request_id"] == rid for _, a in answers)
        assert pool.etcd.ctl("get", f"/orion/requests/{rid}", "--print-value-only").stdout.strip() == answers[0][1]["id"]
    allocs = pool.ctls[0].get("/v1/allocations?kind=process")
    assert len(allocs) == 8
    assert pool.ctls[2].get("/v1/status")["vgpus_used"] == 8
    # The key outlives its allocation (on its own lease, minutes): a late repeat, one that waited in a
    # stalled controller's queue while its client asked elsewhere, ran and released, places nothing.
    # (Before, it placed afresh: a CI run found both servers full of such allocations, held for nobody.)
    a = allocs[0]
    assert pool.ctls[1].call("DELETE", f"/v1/allocations/{a['id']}")[0] == 200
    assert pool.etcd.ctl("get", f"/orion/requests/{a['request_id']}", "--print-value-only").stdout.strip() == a["id"]
    for c in pool.ctls:
        code, late = c.call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 1000, "request_id": a["request_id"]})
        assert code == 404 and "released" in late["message"], late
    assert pool.ctls[2].get("/v1/status")["vgpus_used"] == 7
    lease = pool.etcd.ctl("get", f"/orion/requests/{a['request_id']}", "-w", "json").stdout
    ttl = pool.etcd.ctl("lease", "timetolive", "%x" % json.loads(lease)["kvs"][0]["lease"]).stdout
    assert int(re.search(r"remaining\((\d+)s\)", ttl).group(1)) > 240, ttl
    # Not a UUID: refused (it would become an etcd key).
    code, body = pool.ctls[0].call("POST", "/v1/allocations", {"vgpus": 1, "request_id": "../vgpus/x"})
    assert code == 400 and "request_id" in body["message"], body


def test_majority_lost_gives_503_and_placements_resume(pool):
    c = pool.ctls[1]
    code, a = c.call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 1000})
    assert code == 201
    pool.etcd.kill(1)
    pool.etcd.kill(2)
    t0 = time.time()
    code, body = c.call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 1000})
    took = time.time() - t0
    assert code == 503, body
    assert "store" in body["message"] and "etcd" in body["message"], body
    assert took < 10, took
    code, h = c.call("GET", "/v1/health")
    assert code == 503 and h["store"] == {"kind": "etcd", "reachable": False}, h
    # A real client is told it has no device, with the controller's reason.
    r = pool.run("device_props", ORION_VGPU=1, ORION_GMEM=1000)
    assert r.returncode != 0
    assert "Fail to get resource from controller" in r.stderr and "store" in r.stderr, r.stderr
    # The members come back (same data): placements resume on every controller.
    pool.etcd.start(1)
    pool.etcd.start(2)
    t1 = time.time()
    wait_until(lambda: c.call("GET", "/v1/health")[0] == 200, 30, interval=0.2)
    for x in pool.ctls:
        code, b = x.call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 1000})
        assert code == 201, b
    # The allocation made before the outage survived it.
    assert c.call("GET", f"/v1/allocations/{a['id']}")[0] == 200
    r = pool.run("device_props", ORION_VGPU=1, ORION_GMEM=1000)
    assert_passed(r)
    print(f"majority loss: 503 after {took:.2f} s; placements back {time.time() - t1:.1f} s after restart")


def test_killed_client_allocation_expires_by_its_etcd_lease(tmp_path):
    p = Pool(tmp_path, lease_ttl_s=2)
    try:
        sleeper = p.sleeper()
        allocs = p.ctls[0].get("/v1/allocations?kind=process")
        assert len(allocs) == 1 and allocs[0]["state"] == "active"
        aid, server = allocs[0]["id"], allocs[0]["server"]
        key = f"/orion/allocations/{aid}"
        out = p.etcd.ctl("get", key, "-w", "json").stdout
        assert json.loads(out)["kvs"][0].get("lease"), out  # attached to an etcd lease
        # The client dies, its server freezes (no release, no heartbeat renewals), and every
        # controller is killed: nothing but etcd's lease can drop the allocation now.
        srv = next(d for d in p.servers if d.id == server)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        sleeper.kill()
        sleeper.wait()
        for c in p.ctls:
            c.kill()
        t0 = time.time()
        wait_until(lambda: not p.etcd.ctl("get", key, "--keys-only").stdout.strip(), 15, key, interval=0.2)
        gone = time.time() - t0
        assert gone <= 2 + 2.5, gone  # the 2 s lease (renewed at most ~0.3 s before the freeze)
        assert p.etcd.ctl("get", "--prefix", f"/orion/vgpus/{server}/", "--keys-only").stdout.strip() == ""
        os.kill(srv.proc.pid, signal.SIGCONT)
        print(f"allocation dropped by etcd {gone:.1f} s after its client and controllers died")
    finally:
        p.stop()


def test_a_vm_assigned_through_every_controller_at_once_is_placed_once(pool):
    # A vms/<name> key guards a VM's name: before it, two controllers assigning the same VM at the
    # same moment could both place it (two standing assignments, twice the vGPUs).
    for round_ in range(5):
        vm = f"vm-race-{round_}"
        barrier = threading.Barrier(len(pool.ctls) * 2)
        answers = []

        def assign(c):
            barrier.wait()
            answers.append(http(c.addr, "PUT", f"/v1/assignments/{vm}", {"vgpus": 2, "gmem_mib": 1000}))

        threads = [threading.Thread(target=assign, args=(c,)) for c in pool.ctls for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(code in (200, 201) for code, _ in answers), answers
        assert len({body["id"] for _, body in answers}) == 1, answers
        vms = [a for a in pool.ctls[0].get("/v1/assignments") if a.get("vm") == vm]
        assert len(vms) == 1, vms
        assert pool.etcd.ctl("get", f"/orion/vms/{vm}", "--print-value-only").stdout.strip() == vms[0]["id"]
    assert pool.ctls[0].get("/v1/status")["vgpus_used"] == 10
    # Unassigned, the name is free again.
    assert http(pool.ctls[1].addr, "DELETE", "/v1/assignments/vm-race-0")[0] == 200
    assert pool.etcd.ctl("get", "/orion/vms/vm-race-0", "--keys-only").stdout.strip() == ""
    code, again = http(pool.ctls[2].addr, "PUT", "/v1/assignments/vm-race-0", {"vgpus": 1})
    assert code in (200, 201), again


def test_a_release_through_another_controller_reaches_oriond_through_the_watch(tmp_path):
    # Issue #14: oriond's watch goes to its first controller, which follows etcd's deletions with an
    # etcd watch: a release made through another controller (or etcd dropping a lapsed lease) ends
    # the session at once, not at oriond's next heartbeat (20 s here).
    p = Pool(tmp_path, servers=1, heartbeat_ms=20000, lease_ttl_s=60)
    try:
        sleeper = p.sleeper()
        (a,) = p.ctls[0].get("/v1/allocations?kind=process")
        d = p.servers[0]
        time.sleep(0.5)
        assert "Orion Controller watch:" not in d.log()  # the watch is open, not refused
        t0 = time.time()
        assert http(p.ctls[2].addr, "DELETE", f"/v1/allocations/{a['id']}?reason=admin")[0] == 200
        wait_until(lambda: f"no longer holds allocation {a['id']}; ending it" in d.log(), 5,
                   lambda: (d.log()[-2000:], p.ctls[0].log()[-2000:]), interval=0.02)
        took = time.time() - t0
        assert took < 2, took
        sleeper.kill()
        sleeper.wait()
        print(f"a release through another controller ended the session {took * 1000:.0f} ms later")
    finally:
        p.stop()


def old_pool(old, db):
    """A SQLite pool: one server, two allocations, one VM assignment. Returns them."""
    srv = {"hostname": "h", "vgpu_count": 4, "boot_id": "b",
           "gpus": [{"index": 0, "uuid": "GPU-0", "name": "sim", "memory_mib": 16384},
                    {"index": 1, "uuid": "GPU-1", "name": "sim", "memory_mib": 16384}]}
    assert old.call("PUT", "/v1/servers/10.1.0.1:9960", srv)[0] == 200
    a1 = old.call("POST", "/v1/allocations", {"vgpus": 2, "gmem_mib": 4000})[1]
    a2 = old.call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 9000})[1]
    vm = old.call("PUT", "/v1/assignments/vm-1", {"vgpus": 1, "gmem_mib": 2000})[1]
    assert old.get("/v1/health")["store"] == {"kind": "sqlite", "reachable": True}
    # A running controller holds the database: migrate refuses it.
    r = subprocess.run([PREFIX / "bin" / "orion-controller", "migrate", "--from", f"sqlite:{db}", "--to", "etcd://127.0.0.1:1"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    return a1, a2, vm


def test_migrate_sqlite_pool_into_etcd(tmp_path):
    db = tmp_path / "old.db"
    old = Controller(tmp_path, db, "old", server_timeout_s=60)
    try:
        a1, a2, vm = old_pool(old, db)
    finally:
        old.stop()
    etcd = Etcd(tmp_path)
    try:
        r = subprocess.run([PREFIX / "bin" / "orion-controller", "migrate", "--from", f"sqlite:{db}", "--to", etcd.url,
                            "--config-file", old.conf], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "copied 1 servers, 2 allocations and 1 VM assignments" in r.stdout
        again = subprocess.run([PREFIX / "bin" / "orion-controller", "migrate", "--from", f"sqlite:{db}", "--to", etcd.url],
                               capture_output=True, text=True)
        assert again.returncode != 0 and "already holds a pool" in again.stderr
        new = [Controller(tmp_path, etcd.url, f"new{i}", server_timeout_s=60) for i in range(2)]
        try:
            for c in new:
                allocs = {a["id"]: a for a in c.get("/v1/allocations?kind=process")}
                assert set(allocs) == {a1["id"], a2["id"]}
                assert allocs[a1["id"]]["placements"] == a1["placements"]
                vms = c.get("/v1/assignments")
                assert [v["id"] for v in vms] == [vm["id"]]
            # The migrated server is up (its liveness leases were granted at migration) and its slots
            # are taken: 8 - 4 = 4 vGPUs free; a new placement avoids the migrated ones.
            st = new[1].get("/v1/status")
            assert (st["vgpus_total"], st["vgpus_free"]) == (8, 4), st
            code, b = new[1].call("POST", "/v1/allocations", {"vgpus": 1, "gmem_mib": 1000})
            assert code == 201
            taken = {(p["pgpu"], p["vgpu"]) for a in (a1, a2, vm) for p in a["placements"]}
            assert (b["placements"][0]["pgpu"], b["placements"][0]["vgpu"]) not in taken
        finally:
            for c in new:
                c.stop()
    finally:
        etcd.stop()


def test_controllers_speak_to_etcd_over_mutual_tls(tmp_path):
    """#22: controller -> etcd over HTTPS. etcd runs with its certificate and --client-cert-auth; a
    controller with etcd_tls_ca and a client certificate serves on it (placements, leases, the watch),
    and each wrong setting stops the controller at start with the reason."""
    certs = make_certs(tmp_path / "certs")
    p = Pool(tmp_path, controllers=2, servers=1, etcd_members=1, tls=certs, lease_ttl_s=2)
    try:
        for c in p.ctls:
            assert c.get("/v1/health")["store"] == {"kind": "etcd", "reachable": True}
        sleeper = p.sleeper()
        allocs = p.ctls[1].get("/v1/allocations?kind=process")
        assert len(allocs) == 1 and allocs[0]["state"] == "active", allocs
        key = f"/orion/allocations/{allocs[0]['id']}"
        out = json.loads(p.etcd.ctl("get", key, "-w", "json").stdout)
        assert out["kvs"][0].get("lease"), out  # written through TLS, attached to its etcd lease
        # A release through one controller reaches the other through its watch (a TLS stream too).
        sleeper.kill()
        sleeper.wait()
        wait_until(lambda: not p.ctls[1].get("/v1/allocations?kind=process"), 10,
                   lambda: p.ctls[1].log()[-2000:], interval=0.1)
        assert p.etcd.ctl("get", key, "--keys-only").stdout.strip() == ""
        # migrate reads the etcd side's TLS settings from --config-file.
        r = subprocess.run([PREFIX / "bin" / "orion-controller", "migrate", "--from", p.etcd.url,
                            "--to", f"sqlite:{tmp_path / 'copy.db'}", "--config-file", p.ctls[0].conf],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"copied 1 servers, 0 allocations and 0 VM assignments from {p.etcd.url} (TLS) to "), \
            r.stdout

        # Wrong settings: the controller exits 1 at start, naming why.
        def start_fails(lines):
            conf = tmp_path / "bad.yaml"
            conf.write_text(f"listen: 127.0.0.1:{free_port()}\ndatabase: {p.etcd.url}\n" + lines)
            r = subprocess.run([PREFIX / "bin" / "orion-controller", "start", "--config-file", conf],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 1, r.stderr
            return r.stderr

        err = start_fails("")
        assert re.search(r": (Read|Write) \(the member closed the connection unanswered, as an HTTPS member does to "
                         r"plain HTTP: etcd_tls_ca\)", err), err
        err = start_fails(etcd_tls_lines(certs, ca="other-ca.crt"))
        assert "SSLServerVerification (unable to get local issuer certificate, CA " in err, err
        err = start_fails(etcd_tls_lines(certs, client=None))
        # TLS 1.3: etcd's refusal closes the connection during the request's write or its read.
        assert re.search(r": (Read|Write) \(no answer: an etcd that wants a client certificate closes the connection", err), err
        err = start_fails(etcd_tls_lines(certs, client="rogue"))
        assert re.search(r": (Read|Write) \(no answer: etcd closes the connection when it refuses the client certificate "
                         "etcd_tls_cert " + re.escape(str(certs / "rogue.crt")) + r"\)", err), err
    finally:
        p.stop()
