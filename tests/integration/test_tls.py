"""TLS on oriond's TCP data plane (issue #22 item 7): server.conf [server] tls_cert/tls_key make the
port speak TLS only; clients connect to tls://host:port (or ORION_TLS=1) and verify oriond against
ORION_TLS_CA and its name or address. Programs compute the same over TLS; a plain client, a TLS
client at a plain port, another CA and garbage get clear errors on both ends, and oriond serves on."""
import os
import re
import socket
import subprocess
import time

import pytest

from conftest import PREFIX, TEST_BIN, Oriond, assert_passed, free_port, make_certs, run_tcp, wait_ready


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_oriond(tmp_path, certs, extra=""):
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port,
               conf_text=f"[server]\n    vgpu_count = 4\n    tls_cert = {certs / 'server.crt'}\n"
                         f"    tls_key = {certs / 'server.key'}\n[server-shm]\n    shm_buffer_size = 16\n{extra}")
    d.port = port
    return d


@pytest.fixture
def tls_d(tmp_path, certs):
    d = tls_oriond(tmp_path, certs)
    yield d
    d.stop()


def wait_log(d, pattern, timeout=5):
    """The match of `pattern` in oriond's server.log, waiting up to `timeout` s for it (oriond logs
    a refused connection at its next poll)."""
    deadline = time.time() + timeout
    while True:
        m = re.search(pattern, d.log(), re.M)
        if m or time.time() > deadline:
            assert m, d.log()
            return m
        time.sleep(0.05)


def transport_line(stderr):
    m = re.search(r"^\[info\] Orion transport: (.*)$", stderr, re.M)
    assert m, stderr
    return m.group(1)


def test_programs_compute_the_same_over_tls(tls_d, certs):
    """A program with large copies both ways (memory: 64 checks) and one with kernels (compute) over TLS."""
    for prog in ("memory", "compute"):
        r = run_tcp(tls_d, prog, address=f"tls://127.0.0.1:{tls_d.port}", ORION_TLS_CA=certs / "ca.crt",
                    ORION_GMEM=2048, ORION_LOG_LEVEL="INFO")
        assert_passed(r)
        m = re.fullmatch(r"(TLSv1\.[23]) \((\S+), kernel TLS: (no|send|receive|send and receive)\) over TCP to "
                         rf"127\.0\.0\.1:{tls_d.port} \(no RDMA: TLS, and RDMA's data plane is not encrypted\)",
                         transport_line(r.stderr))
        assert m, r.stderr
        assert m.group(1) == "TLSv1.3"
    # oriond says the same of each client.
    said = re.findall(r"client 127\.0\.0\.1:\d+: (TLSv1\.3) \((\S+), kernel TLS: [a-z ]+\)$", tls_d.log(), re.M)
    assert len(said) == 2, tls_d.log()
    assert "Creating session 2 for 'compute'" in tls_d.log()


def test_orion_tls_1_and_a_name(tls_d, certs):
    """ORION_TLS=1 makes a host:port address TLS; a name is verified against the certificate's
    subjectAltName (localhost is in it)."""
    assert_passed(run_tcp(tls_d, "device_props", ORION_TLS=1, ORION_TLS_CA=certs / "ca.crt"))
    assert_passed(run_tcp(tls_d, "device_props", address=f"tls://localhost:{tls_d.port}",
                          ORION_TLS_CA=certs / "ca.crt"))
    r = run_tcp(tls_d, "device_props", ORION_TLS="yes")
    assert r.returncode != 0
    assert "[error] ORION_TLS='yes' must be 1 (TLS to oriond) or 0" in r.stderr, r.stderr


def test_a_plain_client_is_told_to_use_tls(tls_d):
    r = run_tcp(tls_d, "device_props", ORION_KEY="k3y")
    assert r.returncode != 0
    want = (f"this oriond serves TLS only (tls_cert in its server.conf): connect to tls://127.0.0.1:{tls_d.port} "
            "(or set ORION_TLS=1), with ORION_TLS_CA naming its CA; the ORION_KEY this client sent crossed the "
            "network in clear")
    assert f"[error] Fail to get resource from oriond: {want}\n" in r.stderr, r.stderr
    wait_log(tls_d, r"client 127\.0\.0\.1:\d+: refused 'device_props' \(pid \d+\): " + re.escape(want))
    assert "Creating session" not in tls_d.log()


def test_another_ca_is_refused_on_both_ends(tls_d, certs):
    r = run_tcp(tls_d, "device_props", address=f"tls://127.0.0.1:{tls_d.port}", ORION_TLS_CA=certs / "other-ca.crt")
    assert r.returncode != 0
    assert (f"[error] cannot use oriond: TLS to oriond at 127.0.0.1:{tls_d.port}: certificate verify failed: "
            f"unable to get local issuer certificate (CA: {certs / 'other-ca.crt'})\n") in r.stderr, r.stderr
    wait_log(tls_d, r"client 127\.0\.0\.1:\d+: TLS handshake: tlsv1 alert unknown ca; connection closed")
    # Without ORION_TLS_CA the system's CAs do not know the test CA either.
    r = run_tcp(tls_d, "device_props", address=f"tls://127.0.0.1:{tls_d.port}")
    assert ("certificate verify failed: unable to get local issuer certificate (CA: the system's CAs; set "
            "ORION_TLS_CA)") in r.stderr, r.stderr


def test_tls_to_a_plain_oriond(tmp_path, certs):
    port = free_port()
    d = Oriond(tmp_path, tcp_port=port)
    d.port = port
    try:
        r = run_tcp(d, "device_props", address=f"tls://127.0.0.1:{port}", ORION_TLS_CA=certs / "ca.crt")
        assert r.returncode != 0
        assert (f"[error] cannot use oriond: TLS to oriond at 127.0.0.1:{port}: TLS handshake: the peer closed the "
                "connection (an oriond that serves plain TCP closes on a TLS client: connect without tls:// and "
                "ORION_TLS; else its server.log says why it refused)\n") in r.stderr, r.stderr
        wait_log(d, r"client 127\.0\.0\.1:\d+: speaks TLS, but this oriond serves plain TCP \(no tls_cert and "
                    rf"tls_key in \[server\] of server.conf\): connect to 127\.0\.0\.1:{port} without tls:// and "
                    "ORION_TLS; connection closed")
        assert_passed(run_tcp(d, "device_props"))
    finally:
        d.stop()


def test_garbage_after_a_client_hello_ends_only_that_connection(tls_d, certs):
    with socket.create_connection(("127.0.0.1", tls_d.port)) as s:
        s.sendall(b"\x16\x03\x01\x00\x40" + os.urandom(64))
        s.settimeout(5)
        assert s.recv(4096) is not None  # an alert, or the close
    wait_log(tls_d, r"client 127\.0\.0\.1:\d+: TLS handshake: \S.*; connection closed")
    assert tls_d.alive()
    assert_passed(run_tcp(tls_d, "device_props", address=f"tls://127.0.0.1:{tls_d.port}",
                          ORION_TLS_CA=certs / "ca.crt"))


def test_a_killed_tls_client_frees_its_session(tls_d, certs):
    e = tls_d.env()
    e.pop("ORION_SHM")
    e.update(ORION_SERVER=f"tls://127.0.0.1:{tls_d.port}", ORION_TLS_CA=str(certs / "ca.crt"))
    p = subprocess.Popen([str(TEST_BIN / "sleeper"), "30"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        wait_ready(p)
    finally:
        p.kill()
    p.wait()
    wait_log(tls_d, r"Session 1 exits \(client disconnected\)", timeout=3)


@pytest.mark.parametrize("lines,want", [
    ("    tls_cert = {c}/server.crt\n", "[server] tls_cert and tls_key come together (both or neither)"),
    ("    tls_cert = {c}/server.crt\n    tls_key = {c}/client.key\n",
     "[server] tls_key {c}/client.key does not belong to tls_cert {c}/server.crt: key values mismatch"),
    ("    tls_cert = {c}/none.crt\n    tls_key = {c}/server.key\n", "[server] tls_cert {c}/none.crt: "),
])
def test_bad_tls_settings_stop_oriond_with_the_reason(tmp_path, certs, lines, want):
    conf = tmp_path / "server.conf"
    conf.write_text("[server]\n" + lines.format(c=certs))
    subprocess.run([PREFIX / "bin/orion-shm", "-i", "0", "-s", "64", "-d", tmp_path], check=True, capture_output=True)
    r = subprocess.run([str(PREFIX / "bin/oriond"), "--config", conf, "--backend", "sim", "--foreground",
                        "--log-dir", tmp_path / "logs", "--shm", tmp_path / "orionsock0",
                        "--cache-dir", tmp_path / "cache",
                        "--control-socket", tmp_path / "o.sock", "-p", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    log = tmp_path / "logs/server.log"
    said = r.stderr + (log.read_text(errors="replace") if log.exists() else "")
    assert want.format(c=certs) in said, said
