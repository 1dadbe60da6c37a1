"""Remote clients over TCP: the same nvcc programs and the same frames, with oriond reached at
ORION_SERVER=host:port instead of a shared-memory region. Also the transport choice on this host,
which has no RDMA (a client offering RDMA, and oriond with enable_rdma, fall back to TCP and say
why; RDMA itself is tested in a Soft-RoCE guest: test_rdma.py), garbage on the socket, a client killed in the
middle of a transfer, oriond killed and restarted, and a client in another network namespace."""
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import time
import uuid

import pytest

from conftest import PREFIX, TEST_BIN, Oriond, assert_launches_logged, assert_passed, checks, free_port, run_tcp, spin_iters, wait_until


def tcp_oriond_with(tmp_path, orion_conf):
    """A TCP oriond (4 vGPUs, 16 MiB channels) with `orion_conf` lines in server.conf's [orion]."""
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port,
               conf_text="[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = 16\n"
                         f"[orion]\n    {orion_conf}\n")
    d.port = port
    return d


@pytest.fixture
def stall_1s_oriond(tmp_path):
    """oriond with a 1 s stall limit for clients that stop in the middle of a frame."""
    d = tcp_oriond_with(tmp_path, "net_stall_ms = 1000")
    yield d
    d.stop()


def test_programs_run_over_tcp(tcp_oriond):
    d = tcp_oriond
    for prog in ["device_props", "kernel_params", "driver_api", "threads", "streams_events", "vadd_shared", "vmm", "graphs", "hostfunc", "arrays"]:
        r = run_tcp(d, prog, ORION_GMEM=2048)
        assert_passed(r)
        assert "Orion transport: TCP to 127.0.0.1" in r.stderr, r.stderr
        if prog in ("kernel_params", "driver_api"):
            assert_launches_logged(r.stdout, d.launches())
    # JIT linking: the linked PTX crosses as a module image like any other.
    assert_passed(run_tcp(d, "jit_link", TEST_BIN / "link_a.ptx", TEST_BIN / "link_b.fatbin", ORION_GMEM=512),
                  expect_checks=6)
    assert "Client supports TCP mode, then server also falls back to TCP mode." in d.log()
    assert re.search(r"Creating session \d+ for 'device_props' .* over TCP", d.log())


def test_memory_over_tcp_and_mapped_memory_refused(tcp_oriond):
    # Every round trip (1 B .. 64 MiB), memset, 2D copy and pinned buffer; mapped host memory cannot
    # cross a network, so it is refused with cudaErrorNotSupported (on shared memory it works).
    r = run_tcp(tcp_oriond, "memory", ORION_GMEM=2048)
    assert_passed(r, expect_checks=40)
    assert "MAPPED unsupported cudaErrorNotSupported" in r.stdout


def test_cublas_over_tcp_api_level(tmp_path):
    """cuBLAS's calls over TCP at the API level: oriond runs with --sim-unexecutable skip, so its
    SASS-only GEMM is accepted and NOT run (the result is checked only on a GPU)."""
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port, extra_args=("--sim-unexecutable", "skip"))
    d.port = port
    try:
        r = run_tcp(d, "cublas", ORION_GMEM=2048)
        assert_passed(r, expect_checks=4)
    finally:
        d.stop()


def test_unexecutable_kernels_fail_over_tcp(tcp_oriond):
    # The default oriond refuses what the sim cannot run, over TCP as over shared memory.
    r = run_tcp(tcp_oriond, "unexecutable")
    assert_passed(r, expect_checks=13)
    assert checks(r.stdout)["sass_only_launch_refused"] == "ok"


from fake_peers import PROTOCOL  # noqa: E402  (kProtocolVersion, from frame.h)


def hello_frame(transports, vgpus=1, gmem=256, key=b"", allocation=b"", share=b""):
    hello = struct.pack("<HHIQII64s32s40s64s40s", PROTOCOL, transports, vgpus, gmem, os.getpid(), 0, b"raw-client", key,
                        allocation, b"raw-host", share)
    header = struct.pack("<IHHIIiiII", 0x4D52464F, PROTOCOL, 1, 1, len(hello), 0, 0, 1, 0)
    return header + hello


def test_client_offering_rdma_is_told_and_falls_back_to_tcp(tcp_oriond):
    with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
        s.sendall(hello_frame(transports=2 | 4))  # TCP | RDMA
        header = s.recv(32, socket.MSG_WAITALL)
        magic, version, op, seq, plen, status, deferred, flags, _ = struct.unpack("<IHHIIiiII", header)
        assert magic == 0x4D52464F and op == 1 and status == 0
        welcome = s.recv(plen, socket.MSG_WAITALL)
        transport = struct.unpack_from("<H", welcome, 24)[0]
        assert transport == 2  # TCP
    assert "Client supports RDMA mode, but enable_rdma is off; falls back to TCP mode." in tcp_oriond.log()


def test_a_hello_naming_a_malformed_share_is_refused(tcp_oriond):
    """A share token is 32 lowercase hex digits or nothing: anything else (a hostile client's, as
    the real runtime checks ORION_SHARE first) is refused with CUDA_ERROR_INVALID_VALUE and the
    reason, before any vGPU is taken; a well-formed one starts a share and the Welcome names it."""
    for bad in (b"ABCDEF" * 5 + b"00", b"0" * 31, b"0" * 33, b"../" + b"0" * 29):
        with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
            s.sendall(hello_frame(transports=2, share=bad))
            header = s.recv(32, socket.MSG_WAITALL)
            status, plen = struct.unpack_from("<i", header, 16)[0], struct.unpack_from("<I", header, 12)[0]
            reason = s.recv(plen, socket.MSG_WAITALL).decode(errors="replace")
            assert status == 1 and "ORION_SHARE must be 32 lowercase hex digits" in reason, (bad, status, reason)
    token = b"0123456789abcdef" * 2
    with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
        s.sendall(hello_frame(transports=2, share=token))
        header = s.recv(32, socket.MSG_WAITALL)
        status, plen = struct.unpack_from("<i", header, 16)[0], struct.unpack_from("<I", header, 12)[0]
        welcome = s.recv(plen, socket.MSG_WAITALL)
        assert status == 0 and welcome[120:160].rstrip(b"\0") == token
    assert "Starting vGPU share 01234567 on vGPUs" in tcp_oriond.log()


def test_a_frame_sent_with_the_hello_is_refused_loudly(tcp_oriond):
    """Issue #22 item 5: a frame in the same write as the Hello was read by oriond with it and never
    reached the worker, so it was never answered. Now the connection is refused with
    CUDA_ERROR_INVALID_VALUE and the reason (the next frame waits for the Welcome, which names the
    transport), logged, before any vGPU is taken; a Hello alone is still welcomed."""
    extra = struct.pack("<IHHIIiiII", 0x4D52464F, PROTOCOL, 2, 2, 0, 0, 0, 1, 0)  # a second frame, no payload
    with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
        s.sendall(hello_frame(transports=2) + extra)
        header = s.recv(32, socket.MSG_WAITALL)
        status, plen = struct.unpack_from("<i", header, 16)[0], struct.unpack_from("<I", header, 12)[0]
        reason = s.recv(plen, socket.MSG_WAITALL).decode(errors="replace")
        assert status == 1 and reason.startswith("32 bytes arrived after the Hello, before the Welcome"), \
            (status, reason)
        assert s.recv(1) == b""  # closed
    assert "bytes arrived after the Hello, before the Welcome" in tcp_oriond.log()
    assert "Creating session" not in tcp_oriond.log()
    with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
        s.sendall(hello_frame(transports=2))
        header = s.recv(32, socket.MSG_WAITALL)
        assert struct.unpack_from("<i", header, 16)[0] == 0


def test_enable_rdma_on_a_host_without_rdma_falls_back_to_tcp(tmp_path):
    # This host's kernel has no RDMA: oriond -r says so at start, a client offering RDMA is told why
    # and gets TCP, and a real client (which finds no device itself) offers TCP only and says why.
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port, extra_args=["-r"])
    d.port = port
    try:
        assert re.search(r"enable_rdma is on, but (this host has no RDMA device|libibverbs\.so\.1 cannot be loaded)"
                         r".*: network clients get TCP", d.log()), d.log()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(hello_frame(transports=2 | 4))  # TCP | RDMA
            header = s.recv(32, socket.MSG_WAITALL)
            magic, version, op, seq, plen, status, deferred, flags, _ = struct.unpack("<IHHIIiiII", header)
            assert magic == 0x4D52464F and op == 1 and status == 0
            welcome = s.recv(plen, socket.MSG_WAITALL)
            assert struct.unpack_from("<H", welcome, 24)[0] == 2  # TCP
        assert re.search(r"Client supports RDMA mode, but (this host has no RDMA device|libibverbs\.so\.1 cannot be "
                         r"loaded).*; falls back to TCP mode\.", d.log()), d.log()
        r = run_tcp(d, "device_props")
        assert_passed(r)
        assert re.search(r"Orion transport: TCP to 127\.0\.0\.1:\d+ \(no RDMA: (this host has no RDMA device|"
                         r"libibverbs\.so\.1 cannot be loaded)", r.stderr), r.stderr
        assert "Client supports TCP mode, then server also falls back to TCP mode." in d.log()
        r = run_tcp(d, "device_props", ORION_TRANSPORT="tcp")
        assert_passed(r)
        assert "(no RDMA: ORION_TRANSPORT=tcp)" in r.stderr, r.stderr
        assert "RDMA mode" not in d.log().replace("Client supports RDMA mode, but", "")
    finally:
        d.stop()


def test_garbage_on_the_socket_is_rejected(tcp_oriond):
    rng = random.Random(3)
    not_hello = f"the first frame is not a Hello of protocol {PROTOCOL}; connection closed"
    # Random bytes and HTTP are no frame; a Hello cut short (its header promises more) is waited
    # for until the Hello window (5 s) closes. Each connection gets its own line, naming it.
    for payload, why in [(bytes(rng.randrange(256) for _ in range(4096)), not_hello),
                         (b"GET / HTTP/1.1\r\n\r\n" * 4, not_hello),
                         (hello_frame(2)[:20] + b"\xff" * 100, "no Hello within 5 s; connection closed")]:
        with socket.create_connection(("127.0.0.1", tcp_oriond.port), timeout=10) as s:
            peer = f"127.0.0.1:{s.getsockname()[1]}"
            s.sendall(payload)
            s.settimeout(10)
            try:
                assert s.recv(1) == b""  # oriond closes the connection without a word
            except ConnectionResetError:
                pass
        line = f"client {peer}: {why}"
        wait_until(lambda: line in tcp_oriond.log(), what=line)
    assert tcp_oriond.alive()
    assert_passed(run_tcp(tcp_oriond, "device_props"))


def test_client_killed_mid_transfer_frees_its_vgpu(tmp_path):
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port,
               conf_text="[server]\n    vgpu_count = 1\n[server-shm]\n    shm_buffer_size = 16\n")
    d.port = port
    try:
        e = d.env(ORION_GMEM=2048)
        e.pop("ORION_SHM")
        e["ORION_SERVER"] = f"127.0.0.1:{port}"
        # two_clients writes ORION_GMEM/2 = 1 GiB, then sleeps: killed during the write or the sleep,
        # it never says Goodbye.
        p = subprocess.Popen([str(TEST_BIN / "two_clients"), "10000", "9"], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.time() + 10
        while True:  # the worker sees the connection close at once; the single vGPU is free again
            r = run_tcp(d, "device_props", ORION_GMEM=256)
            if r.returncode == 0:
                break
            assert time.time() < deadline, r.stderr
            time.sleep(0.2)
        wait_until(lambda: re.search(r"Session \d+ exits \(client disconnected\)", d.log()), 10,
                   lambda: d.log()[-2000:], interval=0.1)
    finally:
        d.stop()


def test_oriond_killed_then_restarted(tmp_path):
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port)
    d.port = port
    e = d.env(ORION_GMEM=256)
    e.pop("ORION_SHM")
    e["ORION_SERVER"] = f"127.0.0.1:{port}"
    client = subprocess.Popen([str(TEST_BIN / "two_clients"), "3000", "1"], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    d.proc.send_signal(signal.SIGKILL)  # oriond dies while the client sleeps
    d.proc.wait()
    out, err = client.communicate(timeout=60)  # the client fails cleanly, it does not hang
    assert client.returncode != 0
    assert "Orion session lost" in err or "CUDA_ERROR" in out, out + err
    d.stop()
    (tmp_path / "again").mkdir()
    d2 = Oriond(tmp_path / "again", tcp_port=port)
    d2.port = port
    try:
        assert_passed(run_tcp(d2, "device_props"))
    finally:
        d2.stop()


def test_client_in_another_network_namespace(tmp_path):
    """oriond in one network namespace, the client in another, joined by a veth pair (addresses of
    namespaces this test makes itself)."""
    assert os.geteuid() == 0, "network namespaces need root"
    tag = uuid.uuid4().hex[:6]
    srv, cli = f"orion-s-{tag}", f"orion-c-{tag}"
    sh = lambda *a: subprocess.run(list(a), check=True, capture_output=True)
    try:
        sh("ip", "netns", "add", srv)
        sh("ip", "netns", "add", cli)
        sh("ip", "link", "add", f"os{tag}", "type", "veth", "peer", "name", f"oc{tag}")
        sh("ip", "link", "set", f"os{tag}", "netns", srv)
        sh("ip", "link", "set", f"oc{tag}", "netns", cli)
        sh("ip", "-n", srv, "addr", "add", "10.253.7.1/24", "dev", f"os{tag}")
        sh("ip", "-n", cli, "addr", "add", "10.253.7.2/24", "dev", f"oc{tag}")
        for ns, dev in ((srv, f"os{tag}"), (cli, f"oc{tag}")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        d = Oriond(tmp_path, tcp_port=9960, extra_args=["-b", "10.253.7.1"], netns=srv)
        try:
            e = d.env(ORION_GMEM=1024)
            e.pop("ORION_SHM")
            e["ORION_SERVER"] = "10.253.7.1:9960"
            for prog in ["device_props", "memory", "kernel_params"]:
                r = subprocess.run(["ip", "netns", "exec", cli, str(TEST_BIN / prog)], env=e, capture_output=True,
                                   text=True, timeout=300)
                assert_passed(r)
            assert "from 10.253.7.2:" in d.log()
        finally:
            d.stop()
    finally:
        subprocess.run(["ip", "netns", "del", srv], capture_output=True)
        subprocess.run(["ip", "netns", "del", cli], capture_output=True)


def test_client_key_is_enforced(tmp_path):
    d = tcp_oriond_with(tmp_path, "client_key = s3cret-key")
    try:
        r = run_tcp(d, "device_props")
        assert r.returncode != 0 and "authentication failed" in r.stderr, r.stderr
        r = run_tcp(d, "device_props", ORION_KEY="wrong")
        assert r.returncode != 0 and "authentication failed" in r.stderr
        assert_passed(run_tcp(d, "device_props", ORION_KEY="s3cret-key"))
        assert "are not authenticated" not in d.log()
    finally:
        d.stop()


def test_open_tcp_port_warns(tcp_oriond):
    assert "are not authenticated: anyone who reaches the port gets vGPUs" in tcp_oriond.log()


def test_unreachable_server_is_a_quick_clear_error(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(PREFIX / "lib" / "orion"), ORION_SERVER=f"127.0.0.1:{free_port()}")
    env.pop("ORION_SHM", None)
    t = time.time()
    r = subprocess.run([TEST_BIN / "device_props"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "cannot connect to oriond at 127.0.0.1:" in r.stderr, r.stderr
    assert time.time() - t < 10


def test_client_that_stops_mid_frame_is_dropped(stall_1s_oriond):
    d = stall_1s_oriond
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(hello_frame(2))
        header = s.recv(32, socket.MSG_WAITALL)
        plen = struct.unpack("<IHHIIiiII", header)[4]
        s.recv(plen, socket.MSG_WAITALL)  # Welcome: the session is served
        # Half a frame header, then silence.
        s.sendall(struct.pack("<IHH", 0x4D52464F, PROTOCOL, 3))
        wait_until(lambda: "client stopped in the middle of a frame" in d.session_logs() + d.log(), 15,
                   lambda: d.log()[-2000:], interval=0.2)
    assert d.alive()
    assert_passed(run_tcp(d, "device_props"))  # others are served


def test_silent_connections_do_not_lock_out_clients(tcp_oriond):
    # Issue #11: connections that never send Hello (a flood from one source, kept up while clients
    # connect) must not lock new TCP clients out: oriond makes room by closing the oldest silent one.
    import threading
    d = tcp_oriond
    held, silent, stop = [], [], threading.Event()  # held: open for the whole test

    def connect(into):
        try:
            into.append(socket.create_connection(("127.0.0.1", d.port), timeout=2))
        except OSError:
            pass

    def flood():
        while not stop.is_set():
            connect(silent)
            while len(silent) > 300:
                silent.pop(0).close()
            time.sleep(0.002)

    for _ in range(100):
        connect(held)
    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        for _ in range(3):
            r = run_tcp(d, "device_props", timeout=60)
            assert_passed(r)
    finally:
        stop.set()
        t.join(timeout=10)
        for s in held + silent:
            s.close()
    assert d.alive()
    assert "closed before its Hello to make room for new connections" in d.log()


def test_orion_smi_standalone_lists_every_session_of_the_local_oriond(tcp_oriond):
    # Issue #12: with no controller, orion-smi used to say "no Orion Controller configured" and show
    # nothing. It asks the local oriond's control socket (`sessions`): a shared-memory client with
    # two vGPUs and a TCP client with one, their pids, names and memory in use now. Where the socket
    # cannot be read (a container or VM guest), it shows the client's region instead.
    d = tcp_oriond
    smi = PREFIX / "bin" / "orion-smi"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env["HOME"] = str(d.tmp)  # no client.conf: no controller
    shm = d.popen("sleeper", 8, ORION_VGPU=2, ORION_GMEM=300)
    e = d.env(ORION_VGPU=1, ORION_GMEM=200)
    e.pop("ORION_SHM")
    e["ORION_SERVER"] = f"127.0.0.1:{d.port}"
    tcp = subprocess.Popen([str(TEST_BIN / "sleeper"), "16"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        pids = {}
        for name, p in (("shm", shm), ("tcp", tcp)):
            for line in p.stdout:
                if m := re.match(r"SLEEPER pid=(\d+)", line):
                    pids[name] = int(m.group(1))
                if line.startswith("READY"):
                    break
        assert set(pids) == {"shm", "tcp"}
        time.sleep(0.5)  # the workers publish the memory they use
        r = subprocess.run([smi, "--oriond", d.tmp / "oriond.sock", "--json"], env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        sessions = {s["transport"]: s for s in json.loads(r.stdout)}
        assert set(sessions) == {"shm", "tcp"}, r.stdout
        assert sessions["shm"]["client"]["pid"] == pids["shm"] and sessions["tcp"]["client"]["pid"] == pids["tcp"]
        assert all(s["client"]["process"] == "sleeper" for s in sessions.values())
        assert [(p["gmem_mib"]) for p in sessions["shm"]["placements"]] == [300, 300]
        assert [(p["gmem_mib"]) for p in sessions["tcp"]["placements"]] == [200]
        # What each touched (8 and 16 MiB) is in use on its first vGPU, as oriond accounts it.
        assert sessions["shm"]["placements"][0]["used_mib"] >= 8, sessions["shm"]
        assert sessions["tcp"]["placements"][0]["used_mib"] >= 16, sessions["tcp"]
        assert all(p["gpu_name"] for s in sessions.values() for p in s["placements"])
        text = subprocess.run([smi, "--oriond", d.tmp / "oriond.sock"], env=env, capture_output=True, text=True, timeout=30)
        assert text.returncode == 0, text.stderr
        assert "standalone: every session of this oriond" in text.stdout, text.stdout
        assert len(re.findall(rf"^\|.* {pids['shm']}  sleeper ", text.stdout, re.M)) == 2, text.stdout
        assert len(re.findall(rf"^\|.* {pids['tcp']}  sleeper ", text.stdout, re.M)) == 1, text.stdout
        # No access to oriond: the client's region, what a container sees.
        region_env = dict(env, ORION_SHM=str(d.region))
        r = subprocess.run([smi, "--oriond", d.tmp / "absent.sock", "--json"], env=region_env, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        view = json.loads(r.stdout)
        assert view["region"] == str(d.region) and view["served"] is True
        assert [c["state"] for c in view["in_use"]] == ["active"], view
        r = subprocess.run([smi, "--oriond", d.tmp / "absent.sock"], env=region_env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        lines = [line.strip("| ") for line in r.stdout.splitlines()]
        assert "oriond serves it: yes" in lines and f"channels (one per CUDA process): {view['channels']}, 1 in use" in lines, r.stdout
        assert lines[-1] == (f"oriond's control socket was not asked (no oriond answers on {d.tmp / 'absent.sock'}: No "
                             "such file or directory), though an oriond serves this region: for every process's vGPUs "
                             "and memory, run orion-smi where it can be read (--oriond), or use a controller."), r.stdout
        # Neither oriond nor a region: a clear error.
        r = subprocess.run([smi, "--oriond", d.tmp / "absent.sock"], env=dict(env, ORION_SHM=str(d.tmp / "none")),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "no Orion region" in r.stderr, r.stderr
    finally:
        for p in (shm, tcp):
            p.kill()
            p.wait()
    # Gone: nothing listed.
    deadline = time.time() + 10
    while True:
        r = subprocess.run([smi, "--oriond", d.tmp / "oriond.sock", "--json"], env=env, capture_output=True, text=True,
                           timeout=30)
        if json.loads(r.stdout) == []:
            break
        assert time.time() < deadline, r.stdout
        time.sleep(0.2)


def test_a_long_kernel_is_kept_alive_and_a_hung_oriond_is_told(stall_1s_oriond):
    """Issue #22 item 7: over TCP a session's oriond sends a Keepalive every 250 ms while requests
    execute and it has sent nothing else, so the client tells a hung oriond (its connection alive)
    from a long kernel: a kernel of seconds completes with ORION_ALIVE_TIMEOUT_MS=1000, and a worker
    stopped mid-kernel (SIGSTOP) ends the client's wait within that timeout, with the reason. Before,
    a wait for the device had no deadline: the client waited for the stopped worker forever.
    oriond's stall limit is 1 s here: the frames queued behind the long kernel's are complete, and
    the time the worker spent executing is not the client's stall (before, the session ended with
    "client stopped in the middle of a frame" once a kernel ran past the limit: 30 s by default)."""
    d = stall_1s_oriond
    e = d.env(ORION_GMEM=64, ORION_ALIVE_TIMEOUT_MS=1000)
    e.pop("ORION_SHM")
    e["ORION_SERVER"] = f"127.0.0.1:{d.port}"
    # One kernel of about 8 s. Its iterations are measured on this machine first (spin_iters: the
    # executor's speed differs 8x between the sim's translator and its interpreter, and more under
    # an AddressSanitizer oriond): a fixed 1.2M ran ~6 s on one machine and past the 120 s bound on
    # a slower one against the ASan oriond.
    iters = spin_iters(e, 8000)
    now = int(time.time() * 1000)
    t0 = time.time()
    r = subprocess.run([str(TEST_BIN / "spin"), str(now), str(now + 1), str(iters)], env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    kernel_s = time.time() - t0
    assert kernel_s > 2.0, kernel_s  # twice the alive timeout at least: keepalives carried the wait
    assert "Orion session lost" not in r.stderr, r.stderr

    p = subprocess.Popen([str(TEST_BIN / "spin"), str(now), str(now + 3600_000), "1000000000"], env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        deadline = time.time() + 30
        while not any("burn" in l["kernel"] for l in d.launches()) and time.time() < deadline:
            time.sleep(0.1)  # the warm-up kernel ran (logged when done)
        time.sleep(1.5)  # the long kernel runs now; the client has heard keepalives
        assert p.poll() is None, p.communicate()
        children = subprocess.run(["pgrep", "-P", str(d.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 1, children
        worker = int(children[0])
        os.kill(worker, signal.SIGSTOP)  # a hung oriond: the connection lives, nothing comes
        stopped = time.time()
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0, out + err
        assert time.time() - stopped < 6, time.time() - stopped
        assert re.search(r"sent nothing \(no reply to \w+ \(seq \d+\), no keepalive\) for \d+ ms "
                         r"\(ORION_ALIVE_TIMEOUT_MS=1000\): it hangs", err), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
            os.kill(worker, signal.SIGCONT)
