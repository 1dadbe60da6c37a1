"""The guest runtime facing a broken or hostile oriond or controller (issue #11): every wait is
bounded, every reply must answer an outstanding request, every id is a UUID, and peer text is
logged escaped and capped. The peers are fakes (fake_peers.py) on loopback; the program is
driver_probe.py, a ctypes driver-API client of the installed libcuda.so.1."""
import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import PREFIX
from fake_peers import (CUDA_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_OUT_OF_MEMORY, OP, FakeController, FakeOriond,
                        answer, header, serve_normally, welcome)

PROBE = Path(__file__).with_name("driver_probe.py")
LIB = PREFIX / "lib" / "orion" / "libcuda.so.1"
HOSTILE = "\x1b[2J\x1b[31m\r\n[info] Using Orion resource forged\n\x9b1m" + "A" * 65536
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def probe(*steps, python=None, timeout=20, preexec_fn=None, **env):
    # The client sees only the peers a test gives it: its own HOME (a client.conf whose region path
    # is an empty directory) and no PCI devices, so a region another oriond on this machine serves
    # under /dev/shm, or an ivshmem device, is never found instead of the fake controller.
    home = Path(tempfile.mkdtemp(prefix="orion-hostile-home."))
    (home / "empty").mkdir()
    (home / ".orion").mkdir()
    (home / ".orion" / "client.conf").write_text(f"[client-shm]\n    shm_path_base = {home / 'empty'}/\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    e.update({"HOME": str(home), "ORION_SYSFS_PCI": str(home / "empty"), "ORION_PROBE_LIBCUDA": str(LIB),
              "ORION_VGPU": "1", "ORION_GMEM": "256", "ORION_LOG_LEVEL": "INFO",
              "ORION_HANDSHAKE_TIMEOUT_MS": "1500", "ORION_REPLY_TIMEOUT_MS": "1500", "ORION_STALL_TIMEOUT_MS": "1000"})
    e.update({k: str(v) for k, v in env.items()})
    start = time.time()
    r = subprocess.run([python or sys.executable, str(PROBE), *steps], env=e, capture_output=True, timeout=timeout,
                       preexec_fn=preexec_fn)
    r.elapsed = time.time() - start
    shutil.rmtree(home, ignore_errors=True)
    r.out = r.stdout.decode(errors="replace")
    r.err = r.stderr.decode(errors="replace")
    return r


def step(r, name):
    m = re.search(rf"^STEP {name} (-?\d+)", r.out, re.M)
    return int(m.group(1)) if m else None


@pytest.fixture
def fake_oriond():
    made = []

    def make(script):
        d = FakeOriond(script)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()
        assert not d.errors, d.errors


# ---- 13: a silent server cannot hang the client ----------------------------------------------

def test_silence_after_hello_ends_at_the_handshake_deadline(fake_oriond):
    def script(srv, conn, frames):
        next(frames)  # Hello, never answered
        srv.hold()
    d = fake_oriond(script)
    r = probe("init", ORION_SERVER=d.addr)
    assert step(r, "init") == CUDA_ERROR_DEVICE_UNAVAILABLE, r.out + r.err
    assert "no reply to Hello (seq 1) from oriond at " + d.addr in r.err, r.err
    assert "ORION_HANDSHAKE_TIMEOUT_MS" in r.err and r.elapsed < 10


def test_silence_after_welcome_ends_at_the_reply_deadline(fake_oriond):
    def script(srv, conn, frames):
        h, p = next(frames)
        answer(conn, h, welcome())
        for h, p in frames:
            pass  # reads every request, answers none
    d = fake_oriond(script)
    r = probe("init", "ctx", "alloc", ORION_SERVER=d.addr)
    # cuInit's first call after the Welcome (the primary context) gets no answer.
    assert step(r, "init") == CUDA_ERROR_DEVICE_UNAVAILABLE, r.out + r.err
    assert re.search(r"Orion session lost: no reply to PrimaryCtxRetain \(seq 2\) from oriond at .* in 1500 ms "
                     r"\(ORION_REPLY_TIMEOUT_MS\)", r.err), r.err
    assert r.elapsed < 10


def window_script(mode):
    def script(srv, conn, frames):
        for h, p in frames:
            if h[2] != OP["MemcpyDtoH"]:
                serve_normally(conn, h, p)
                continue
            dst, _src, nbytes = struct.unpack_from("<QQQ", p)
            conn.sendall(header(OP["WindowData"], h[3], 16) + struct.pack("<QQ", dst, nbytes))
            if mode == "half":
                conn.sendall(bytes(nbytes // 2))
                srv.hold()
            else:  # drip: one byte every 10 ms, forever
                while not srv.stop_event.wait(0.01):
                    conn.sendall(b"\0")
            return
    return script


@pytest.mark.parametrize("mode", ["half", "drip"])
def test_window_data_that_stalls_half_way_is_bounded(fake_oriond, mode):
    # DtoH legitimately waits for kernels (no reply deadline), so this is the mid-frame stall limit:
    # 1 s + 1 s per announced MiB here.
    d = fake_oriond(window_script(mode))
    r = probe("init", "ctx", "alloc", "dtoh", ORION_SERVER=d.addr)
    assert step(r, "alloc") == 0, r.out + r.err
    assert step(r, "dtoh") == CUDA_ERROR_DEVICE_UNAVAILABLE, r.out + r.err
    assert re.search(r"Orion session lost: oriond at .* stalled in the middle of WindowData: \d+ of 1048624 bytes "
                     r"in \d+ ms \(ORION_STALL_TIMEOUT_MS=1000\)", r.err), r.err
    assert r.elapsed < 12


def test_a_long_synchronize_is_not_a_stall(fake_oriond):
    # A server that answers cuCtxSynchronize after 3 s (a long kernel) is healthy: no deadline applies.
    def script(srv, conn, frames):
        for h, p in frames:
            if h[2] == OP["CtxSynchronize"]:
                time.sleep(3)
            serve_normally(conn, h, p)
    d = fake_oriond(script)
    r = probe("init", "ctx", "sync", ORION_SERVER=d.addr)
    assert step(r, "sync") == 0, r.out + r.err
    assert "session lost" not in r.err


# ---- 17: replies are taken only when they answer an outstanding request ----------------------

def alloc_reply(kind):
    def script(srv, conn, frames):
        for h, p in frames:
            if h[2] != OP["MemAlloc"]:
                serve_normally(conn, h, p)
                continue
            ptr = struct.pack("<Q", 0x7F0000000000)
            if kind == "private_1002":
                answer(conn, h, ptr, status=1002)
            elif kind == "private_1001":
                answer(conn, h, ptr, status=1001)
            elif kind == "negative":
                answer(conn, h, ptr, status=-5)
            elif kind == "deferred_negative":
                answer(conn, h, ptr, deferred=-1)
            elif kind == "empty":
                answer(conn, h, b"")
            elif kind == "null":
                answer(conn, h, struct.pack("<Q", 0))
            elif kind == "version":
                answer(conn, h, ptr, version=7)
            elif kind == "wrong_op":
                conn.sendall(header(OP["CtxCreate"], h[3], 8) + ptr)
            elif kind == "flags":
                answer(conn, h, ptr, flags=0x80)
            elif kind == "unsolicited_window":
                conn.sendall(header(OP["WindowData"], h[3], 16) + struct.pack("<QQ", 0, 16) + bytes(16))
                answer(conn, h, ptr)
            srv.hold()
            return
    return script


@pytest.mark.parametrize("kind", ["private_1002", "private_1001", "negative", "deferred_negative", "empty", "null",
                                  "version", "wrong_op", "flags", "unsolicited_window"])
def test_replies_that_answer_nothing_break_the_session(fake_oriond, kind):
    d = fake_oriond(alloc_reply(kind))
    r = probe("init", "ctx", "alloc", "sync", ORION_SERVER=d.addr)
    assert step(r, "ctx") == 0, r.out + r.err
    rc = step(r, "alloc")
    if kind == "null":
        # A full-length reply with a NULL pointer: refused, not handed to the program.
        assert rc not in (None, 0), r.out + r.err
        assert "NULL pointer" in r.err, r.err
        return
    assert rc == CUDA_ERROR_DEVICE_UNAVAILABLE, r.out + r.err
    assert "Orion session lost: " in r.err, r.err


def test_overlapping_window_data_breaks_the_session(fake_oriond):
    def script(srv, conn, frames):
        for h, p in frames:
            if h[2] != OP["MemcpyDtoH"]:
                serve_normally(conn, h, p)
                continue
            dst, _src, nbytes = struct.unpack_from("<QQQ", p)
            for _ in range(2):  # the same range twice
                conn.sendall(header(OP["WindowData"], h[3], 16) + struct.pack("<QQ", dst, nbytes) + bytes(nbytes))
            answer(conn, h)
            srv.hold()
            return
    d = fake_oriond(script)
    r = probe("init", "ctx", "alloc", "dtoh", ORION_SERVER=d.addr)
    assert step(r, "dtoh") == CUDA_ERROR_DEVICE_UNAVAILABLE, r.out + r.err
    assert "that no outstanding request asked for, or that overlaps" in r.err, r.err


def test_a_healthy_fake_server_still_works(fake_oriond):
    def script(srv, conn, frames):
        for h, p in frames:
            serve_normally(conn, h, p)
    d = fake_oriond(script)
    r = probe("init", "ctx", "alloc", "dtoh", "sync", ORION_SERVER=d.addr)
    assert [step(r, s) for s in ("init", "ctx", "alloc", "dtoh", "sync")] == [0] * 5, r.out + r.err


# ---- 14, 15, 16: the controller ----------------------------------------------------------------

def test_non_utf8_program_and_host_names_do_not_abort(tmp_path):
    bodies = []

    def respond(method, target, body):
        bodies.append(body)
        return 409, {"message": "no vGPU free"}
    ctl = FakeController(respond)
    try:
        exe = Path(os.fsdecode(bytes(tmp_path) + b"/\xff\xfe-probe\xc3"))
        shutil.copy(os.path.realpath(sys.executable), exe)
        preexec = None
        if os.geteuid() == 0:
            def preexec():  # a host name that is not UTF-8 either, in a UTS namespace of its own
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(0x04000000) == 0:
                    name = b"\xff\xfehost"
                    libc.sethostname(name, len(name))
        r = probe("init", python=str(exe), preexec_fn=preexec, ORION_CONTROLLER=ctl.addr, PYTHONHOME="/usr")
    finally:
        ctl.stop()
    assert r.returncode == 0, (r.returncode, r.out, r.err)  # before the fix: SIGABRT in cuInit
    assert step(r, "init") == CUDA_ERROR_OUT_OF_MEMORY, r.out + r.err
    assert len(bodies) == 1
    client = json.loads(bodies[0])["client"]  # valid JSON, so valid UTF-8
    assert client["process"].startswith("\ufffd\ufffd-probe"), client
    if os.geteuid() == 0:
        assert client["host"] == "\ufffd\ufffdhost", client


def test_a_hostile_allocation_id_never_reaches_a_request(tmp_path):
    hostile = "../../v1/servers/victim?x=1 HTTP/1.1\r\nX-Smuggled: 1\r\n\r\nDELETE /v1/servers/victim"

    def respond(method, target, body):
        return 201, {"id": hostile, "server": "127.0.0.1:1", "placements": [{"text": "127.0.0.1:1/0/0"}]}
    ctl = FakeController(respond)
    try:
        r = probe("init", ORION_CONTROLLER=ctl.addr)
        time.sleep(0.2)
    finally:
        ctl.stop()
    assert step(r, "init") not in (None, 0), r.out + r.err
    assert "malformed allocation id" in r.err, r.err
    assert len(ctl.requests) == 1 and ctl.requests[0].startswith(b"POST /v1/allocations "), ctl.requests
    assert b"X-Smuggled" not in b"".join(ctl.requests)
    assert "\r\n" not in r.err.replace("\n", "")  # logged escaped


def assert_log_safe(err):
    assert "\x1b" not in err and "\x9b" not in err and "\r" not in err, repr(err[:2000])
    assert not re.search(r"^\[info\] Using Orion resource forged", err, re.M), err[:2000]
    assert max(map(len, err.splitlines())) < 4096, max(map(len, err.splitlines()))


def test_peer_text_is_logged_escaped_and_capped(tmp_path, fake_oriond):
    # The controller's refusal message.
    ctl = FakeController(lambda m, t, b: (409, {"message": HOSTILE}))
    try:
        r = probe("init", ORION_CONTROLLER=ctl.addr)
    finally:
        ctl.stop()
    assert step(r, "init") == CUDA_ERROR_OUT_OF_MEMORY, r.out + r.err
    assert "Fail to get resource from controller" in r.err and "\\x1b[2J" in r.err, r.err[:2000]
    assert_log_safe(r.err)

    # Placement text from the controller, then oriond's refusal reason.
    def refuse(srv, conn, frames):
        h, _ = next(frames)
        answer(conn, h, HOSTILE.encode()[:60000], status=CUDA_ERROR_OUT_OF_MEMORY)
        srv.hold()
    d = fake_oriond(refuse)
    ctl = FakeController(lambda m, t, b: (201, {"id": UUID, "server": d.addr, "placements": [{"text": HOSTILE}]})
                         if m == "POST" else (200, {}))
    try:
        r = probe("init", ORION_CONTROLLER=ctl.addr)
    finally:
        ctl.stop()
    assert step(r, "init") == CUDA_ERROR_OUT_OF_MEMORY, r.out + r.err
    assert "placed allocation " + UUID in r.err and "Fail to get resource from oriond: \\x1b[2J" in r.err, r.err[:3000]
    assert_log_safe(r.err)
