"""Live migration (issue #24, step 3): `orion-smi migrate SESSION --to HOST:PORT` moves a session of
one oriond to another while its program runs (docs/migration.md). tests/cuda/move_loop computes in
a loop (device memory, a stream, events and a module variable kept across it) and checks every
value; it must finish the same wherever its iterations ran. Each failure before the program is told
to go leaves the session where it was: the program finishes there, unaware."""
import json
import os
import re
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from conftest import PREFIX, TEST_BIN, Oriond, assert_passed, free_port, smi_json, wait_until
from fake_peers import HDR, MAGIC, OP, PROTOCOL, header, recv_exact
from harness.controller import ADMIN, CLIENT, Cluster


@pytest.fixture
def two(tmp_path):
    """Two oriond (sim) listening on TCP: a source and a target."""
    ds = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        port = free_port()
        d = Oriond(tmp_path / name, tcp_port=port)
        d.port = port
        ds.append(d)
    yield ds
    for d in ds:
        d.stop()


def ready(p):
    """`p` once it printed READY, read byte by byte from the pipe itself: a line iterator reads
    ahead, and what it buffered past READY (the first ITER line, when it follows at once) would be
    lost to communicate()."""
    got = b""
    while not got.endswith(b"READY\n"):
        c = os.read(p.stdout.fileno(), 1)
        if not c:
            raise AssertionError(got.decode() + p.stderr.read())
        got += c
    return p


def start_loop(d, iterations, pause_ms, shm=False, extra_mib=0, fill="bytes", program="move_loop"):
    """move_loop against oriond `d` (over TCP, or its region), once its setup is done (READY);
    `extra_mib` more device memory, in chunks of their own byte values (`fill` "bytes") or random
    bytes ("random"), checked at its end. `program` "move_texture": that one instead (its arrays
    and texture objects; no extra memory)."""
    env = d.env(ORION_GMEM=256)
    if not shm:
        env.pop("ORION_SHM")
        env["ORION_SERVER"] = f"127.0.0.1:{d.port}"
    args = [str(iterations), str(pause_ms)] + ([str(extra_mib), fill] if program == "move_loop" else [])
    p = subprocess.Popen([str(TEST_BIN / program), *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return ready(p)


def migrate(d, session, to):
    return subprocess.run([str(PREFIX / "bin" / "orion-smi"), "migrate", str(session), "--to", to, "--oriond",
                           str(d.tmp / "oriond.sock")], capture_output=True, text=True, timeout=300)


def only_session(d):
    sessions = smi_json(d)
    assert len(sessions) == 1, sessions
    return sessions[0]["session"]


def move_answer(r, session, port):
    """orion-smi migrate's answer, parsed: bytes sent, ms, and what the device memory became on the
    wire (bytes of it; chunks sent raw, as all zero, lz4-compressed)."""
    m = re.fullmatch(rf"session {session} moved to 127\.0\.0\.1:{port} \((\d+) bytes in (\d+) ms; (\d+) bytes of "
                     r"device memory: (\d+) raw, (\d+) zero, (\d+) lz4 chunks\)\n", r.stdout)
    assert r.returncode == 0 and m, (r.stdout, r.stderr)
    return dict(zip(("sent", "ms", "memory", "raw", "zero", "lz4"), map(int, m.groups())))


def finish(p, checks=4):
    out, err = p.communicate(timeout=120)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert_passed(r, expect_checks=checks)
    iters = [int(m) for m in re.findall(r"^ITER (\d+) ", out, re.M)]
    assert iters == list(range(1, len(iters) + 1)) and iters, out[-2000:]
    return r


def test_a_running_program_moves_to_another_oriond_and_back(two):
    """Moved mid-loop from A to B, then from B back to A: the program's values are all right (its 96
    MiB more, in 64 MiB chunks of their own byte values, too), each oriond lists the session only
    while it serves it, the program's log says where it went, and its output is that of a run that
    did not move."""
    a, b = two
    p = start_loop(a, 80, 50, extra_mib=96)
    first = only_session(a)
    went = move_answer(migrate(a, first, f"127.0.0.1:{b.port}"), first, b.port)
    assert went["memory"] >= (96 << 20) + (256 << 10), went  # the 96 MiB and the 256 KiB array, at least
    # Each 64 MiB of one byte value goes lz4-compressed (24 chunks of 4 MiB), so the move sends a
    # small part of it.
    assert went["lz4"] >= 24 and went["sent"] < went["memory"] // 10, went
    # The source's worker has answered and exits; oriond lists the session until it reaps it.
    wait_until(lambda: smi_json(a) == [], 10)
    moved = only_session(b)
    assert smi_json(b)[0]["client"]["process"] == "move_loop"
    r = migrate(b, moved, f"127.0.0.1:{a.port}")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: smi_json(b) == [], 10)
    result = finish(p, checks=5)
    assert result.stderr.count("the session moved from") == 2, result.stderr
    assert f"Session {first} exits (moved to another oriond)." in a.log()
    assert f"Session {moved} exits (moved to another oriond)." in b.log()
    unmoved = subprocess.run([str(TEST_BIN / "move_loop"), "80", "0", "96"],
                             env={**{k: v for k, v in a.env(ORION_GMEM=256).items() if k != "ORION_SHM"},
                                  "ORION_SERVER": f"127.0.0.1:{a.port}"},
                             capture_output=True, text=True, timeout=120)
    assert_passed(unmoved, expect_checks=5)
    assert iterations(result.stdout) == iterations(unmoved.stdout)


def test_a_program_with_arrays_and_texture_objects_moves_and_samples_them_there(two):
    """move_texture makes its CUDA arrays, a texture object and a surface object before its loop:
    moved from A to B mid-loop, its kernels go on sampling the one and writing the other there, with
    the same object values. Every value is right, and its output is that of a run that did not move."""
    a, b = two
    p = start_loop(a, 30, 50, program="move_texture")
    first = only_session(a)
    went = move_answer(migrate(a, first, f"127.0.0.1:{b.port}"), first, b.port)
    assert went["memory"] >= 2 * 64 * 32 * 4, went  # both arrays' texels
    result = finish(p, checks=3)
    assert result.stderr.count("the session moved from") == 1, result.stderr[-2000:]
    unmoved = subprocess.run([str(TEST_BIN / "move_texture"), "30", "0"],
                             env={**{k: v for k, v in a.env(ORION_GMEM=256).items() if k != "ORION_SHM"},
                                  "ORION_SERVER": f"127.0.0.1:{a.port}"},
                             capture_output=True, text=True, timeout=120)
    assert_passed(unmoved, expect_checks=3)
    assert len(iterations(result.stdout)[0]) == 30 and iterations(result.stdout) == iterations(unmoved.stdout)


def test_an_unreachable_or_refusing_target_leaves_the_session_where_it_was(two, tmp_path):
    """Nothing listens at the address; the target wants a client key the source does not have: both
    refused with the reason, and the program runs on at A as if nothing happened."""
    a, b = two
    (tmp_path / "c").mkdir()
    port = free_port()
    keyed = Oriond(tmp_path / "c", tcp_port=port,
                   conf_text="[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = 16\n"
                             "[orion]\n    client_key = s3cret\n")
    try:
        p = start_loop(a, 60, 50)
        sess = only_session(a)
        dead = free_port()
        r = migrate(a, sess, f"127.0.0.1:{dead}")
        assert r.returncode == 1
        assert r.stderr.startswith(f"session {sess} not moved: cannot connect to 127.0.0.1:{dead}: "), r.stderr
        r = migrate(a, sess, f"127.0.0.1:{port}")
        assert r.returncode == 1
        assert r.stderr == (f"session {sess} not moved: the target refused it: "
                            "authentication failed: wrong or missing ORION_KEY\n"), r.stderr
        assert only_session(a) == sess
        result = finish(p)
        assert "moved" not in result.stderr
        assert smi_json(keyed) == []
    finally:
        keyed.stop()


def iterations(out):
    """A move_loop (or move_texture) run's (iteration, sum) pairs and CHECK lines: what does not
    depend on timing."""
    return re.findall(r"^ITER (\d+) (\d+)\b", out, re.M), re.findall(r"^CHECK .*$", out, re.M)


def test_a_shared_memory_session_moves_to_another_oriond_over_tcp(two, tmp_path):
    """A program on the region of an oriond with one channel moves mid-loop to B, where it continues
    over TCP: its values are all right (its 32 MiB more too), and its output is that of a run that
    did not move. Its data window became private memory at the same address, so the one channel is
    free for the next program once the source's worker is gone and its lease stale."""
    _, b = two
    (tmp_path / "one").mkdir()
    port = free_port()
    a = Oriond(tmp_path / "one", region_mib=32, tcp_port=port)
    a.port = port
    try:
        p = start_loop(a, 60, 50, shm=True, extra_mib=32)
        first = only_session(a)
        assert smi_json(a)[0]["transport"] == "shm"
        went = move_answer(migrate(a, first, f"127.0.0.1:{b.port}"), first, b.port)
        assert went["memory"] > 32 << 20 and went["lz4"] >= 8, went
        wait_until(lambda: smi_json(a) == [], 10)
        moved = smi_json(b)
        assert len(moved) == 1 and moved[0]["transport"] == "tcp", moved
        result = finish(p, checks=5)
        assert re.search(rf"the session moved from oriond on \S+ to oriond at 127\.0\.0\.1:{b.port} ",
                         result.stderr), result.stderr[-2000:]
        assert f"Session {first} exits (moved to another oriond)." in a.log()
        unmoved = None
        for _ in range(40):  # the channel is freed when the moved program's lease is stale (3 s)
            unmoved = subprocess.run([str(TEST_BIN / "move_loop"), "60", "0", "32"], env=a.env(ORION_GMEM=256),
                                     capture_output=True, text=True, timeout=120)
            if "are in use by other CUDA processes" not in unmoved.stderr:
                break
            time.sleep(0.5)
        assert_passed(unmoved, expect_checks=5)
        assert iterations(result.stdout) == iterations(unmoved.stdout)
    finally:
        a.stop()


def test_a_shared_memory_session_is_refused_where_it_cannot_move(two, tmp_path):
    """The target's TCP window is laid out for other channels than the session's region: refused
    before anything pauses, with both sizes. An unknown session id: refused."""
    a, b = two
    (tmp_path / "w").mkdir()
    port = free_port()
    wide = Oriond(tmp_path / "w", tcp_port=port, channel_mib=32)
    try:
        p = start_loop(a, 40, 20, shm=True)
        sess = only_session(a)
        r = migrate(a, sess, f"127.0.0.1:{port}")
        assert r.returncode == 1
        assert r.stderr == (f"session {sess} not moved: the target's data window is laid out for channels of 32 MiB "
                            "and this session's for 16 MiB (shm_buffer_size must match, and a region's channel "
                            "size)\n"), r.stderr
        result = finish(p)
        assert "moved" not in result.stderr
        assert smi_json(wide) == []
    finally:
        wide.stop()
    r = migrate(a, 999, f"127.0.0.1:{b.port}")
    assert r.returncode == 1 and r.stderr == "no session 999 here ('sessions' lists them)\n", r.stderr


class FailingTarget:
    """A target oriond that fails a move at a chosen step: it listens, answers the source's
    kHelloMigrateIn `ready` and its manifest `prepared`, then either closes after `drop_after` bytes
    of the snapshot, or reads all of it (its records, to the end record), answers `restored` with a
    resume token, and
    vanishes (its listener closed: the program cannot reach it) or, `mute`, takes the program's
    connection and never answers it."""

    def __init__(self, drop_after=None, mute=False):
        self.drop_after = drop_after
        self.mute = mute
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.received = 0
        self.memory = 0  # bytes of device memory the snapshot's records said they hold
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        conn, _ = self.srv.accept()
        with conn:
            h = HDR.unpack(recv_exact(conn, HDR.size))
            recv_exact(conn, h[4])  # the HelloReq
            ready = str(16 << 20).encode()  # the channel size its window has: the fixture's oriond's
            conn.sendall(header(OP["Hello"], h[3], len(ready)) + ready)
            conn.settimeout(60)
            # The manifest (a record of kind 17, sent when the move is asked for), answered
            # "prepared": the source then moves at the program's next call it waits on.
            kind, _, meta, _ = struct.unpack("<IIQQ", recv_exact(conn, 24))
            assert kind == 17, kind
            recv_exact(conn, meta)
            self.received += 24 + meta
            conn.sendall(header(OP["Hello"], h[3], 8) + b"prepared")
            if self.drop_after is not None:
                while self.received < self.drop_after:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        return
                    self.received += len(chunk)
            else:
                # The snapshot's records (session_snapshot.cpp): a RecordHead {kind u32, flags u32,
                # meta u64, contents u64}, then meta bytes, then `contents` bytes of device memory
                # as chunks of up to 4 MiB, each a ChunkHead {form u32, stored u32} and `stored`
                # bytes (snapshot_chunks.h); kind 13 ends it. (A CUDA array's texels go in runs of
                # whole rows instead: the sessions moved to this fake hold none.)
                try:
                    while True:
                        kind, _, meta, contents = struct.unpack("<IIQQ", recv_exact(conn, 24))
                        self.received += 24 + meta
                        recv_exact(conn, meta)
                        self.memory += contents
                        while contents > 0:
                            _, stored = struct.unpack("<II", recv_exact(conn, 8))
                            recv_exact(conn, stored)
                            self.received += 8 + stored
                            contents -= min(contents, 4 << 20)
                        if kind == 13:
                            break
                except ConnectionError:  # the source gave up
                    return
                token = b"5f" * 16
                conn.sendall(header(OP["Hello"], h[3], len(token)) + token)  # restored
            if self.mute:
                client, _ = self.srv.accept()
                with client:
                    client.settimeout(60)
                    try:
                        while client.recv(4096):  # until the program gives up and closes it
                            pass
                    except OSError:
                        pass
            self.srv.close()


def test_a_program_that_cannot_reach_the_target_comes_back_to_the_source(two):
    """The target restores the session and vanishes before the program arrives: the program, told
    to go, cannot connect there and resumes at the source with the back token it was given; the
    source still held the session and serves it on. The move is refused with that reason, and the
    program finishes with every value right (its 16 MiB more kept too)."""
    a, _ = two
    target = FailingTarget()
    p = start_loop(a, 60, 50, extra_mib=16)
    sess = only_session(a)
    r = migrate(a, sess, f"127.0.0.1:{target.port}")
    assert r.returncode == 1
    assert r.stderr == (f"session {sess} not moved: the program could not resume at 127.0.0.1:{target.port} "
                        "and runs here again\n"), r.stderr
    assert target.memory > 16 << 20  # the whole snapshot went there
    assert only_session(a) == sess
    result = finish(p, checks=5)
    assert f"the session could not follow its move to oriond at 127.0.0.1:{target.port}" in result.stderr
    assert f"comes back to session {sess}: its move did not reach the target" in a.log()


def test_a_shared_memory_program_that_cannot_reach_the_target_comes_back_on_its_channel(two):
    """The same for a program on A's region: told to go, it cannot connect to the target, shares its
    data window with A again and resumes on its own channel with the back token. It then moves to
    B for real, and finishes there with every value right."""
    a, b = two
    target = FailingTarget()
    p = start_loop(a, 80, 50, shm=True, extra_mib=16)
    sess = only_session(a)
    r = migrate(a, sess, f"127.0.0.1:{target.port}")
    assert r.returncode == 1
    assert r.stderr == (f"session {sess} not moved: the program could not resume at 127.0.0.1:{target.port} "
                        "and runs here again\n"), r.stderr
    assert target.memory > 16 << 20
    assert only_session(a) == sess and smi_json(a)[0]["transport"] == "shm"
    r = migrate(a, sess, f"127.0.0.1:{b.port}")
    assert r.returncode == 0, r.stderr
    result = finish(p, checks=5)
    assert f"the session could not follow its move to oriond at 127.0.0.1:{target.port} (it cannot be reached" in \
        result.stderr, result.stderr[-2000:]
    assert f"to oriond at 127.0.0.1:{b.port} (session" in result.stderr


def test_a_program_whose_target_never_answers_comes_back_to_the_source(two):
    """The target restores the session, takes the program's connection and never answers it: the
    program gives up on it after 10 s (inside the source's 30 s wait) and resumes at the source."""
    a, _ = two
    target = FailingTarget(mute=True)
    p = start_loop(a, 60, 50)
    sess = only_session(a)
    r = migrate(a, sess, f"127.0.0.1:{target.port}")
    assert r.returncode == 1
    assert r.stderr == (f"session {sess} not moved: the program could not resume at 127.0.0.1:{target.port} "
                        "and runs here again\n"), r.stderr
    result = finish(p)
    assert f"the session could not follow its move to oriond at 127.0.0.1:{target.port} (no reply to Hello" in \
        result.stderr, result.stderr[-2000:]


def test_a_target_that_breaks_mid_snapshot_leaves_the_session_at_the_source(two):
    """The target closes its connection 1 MiB into a 32 MiB snapshot (random bytes: they go as they
    are, so the stream is that long): the move is refused (the stream broke), the program is never
    told to go, and it finishes at the source unaware."""
    a, _ = two
    target = FailingTarget(drop_after=1 << 20)
    p = start_loop(a, 60, 50, extra_mib=32, fill="random")
    sess = only_session(a)
    r = migrate(a, sess, f"127.0.0.1:{target.port}")
    assert r.returncode == 1
    assert r.stderr == f"session {sess} not moved: the stream to the target broke\n", r.stderr
    assert only_session(a) == sess
    result = finish(p, checks=5)
    assert "moved" not in result.stderr


def raw_hello(kind, share=b""):
    """A Hello frame as a hostile peer writes it (frame.h: FrameHeader, HelloReq with `kind`)."""
    hello = struct.pack("<HHIQIBBH64s32s40s64s40s", PROTOCOL, 2, 1, 256, os.getpid(), 0, 0, kind, b"raw-peer", b"", b"",
                        b"raw-host", share)
    return HDR.pack(MAGIC, PROTOCOL, OP["Hello"], 1, len(hello), 0, 0, 1, 0) + hello


def refusal(port, frame, then=b""):
    """Sends `frame` (and `then`) to oriond at `port`; its reply's status and text."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(frame)
        if then:
            ready = s.recv(32, socket.MSG_WAITALL)  # ready, with the channel size its window has
            s.recv(struct.unpack_from("<I", ready, 12)[0], socket.MSG_WAITALL)
            try:
                s.sendall(then)
                s.shutdown(socket.SHUT_WR)
            except OSError:  # the worker may have refused and closed before all of it was sent
                pass
        h = s.recv(32, socket.MSG_WAITALL)
        status, plen = struct.unpack_from("<i", h, 16)[0], struct.unpack_from("<I", h, 12)[0]
        return status, s.recv(plen, socket.MSG_WAITALL).decode(errors="replace")


def test_hostile_resume_and_move_in_hellos_end_only_their_connection(two):
    """A guessed resume token, a Hello of a kind that does not exist, and a move-in whose snapshot
    is garbage: each refused with its reason (the last by the worker that tried to restore it, which
    then ends); the target serves a program normally afterwards and holds no vGPU for them."""
    a, b = two
    assert refusal(b.port, raw_hello(2, b"0123456789abcdef" * 2)) == (
        500, "no moved session waits for this resume token here (used, or expired)")
    assert refusal(b.port, raw_hello(2, b"not-a-token")) == (1, "a resume Hello needs its token (32 hex digits)")
    assert refusal(b.port, raw_hello(7)) == (801, "a Hello of kind 7 is not known here")
    assert refusal(b.port, raw_hello(1), then=b"ORIONSNP" + bytes(range(256)) * 16) == (
        1, "a record's head is malformed")
    wait_until(lambda: smi_json(b) == [], 10)
    assert "the move in failed: a record's head is malformed" in b.session_logs()
    r = subprocess.run([str(TEST_BIN / "move_loop"), "3", "0"],
                       env={**{k: v for k, v in b.env().items() if k != "ORION_SHM"},
                            "ORION_SERVER": f"127.0.0.1:{b.port}"},
                       capture_output=True, text=True, timeout=120)
    assert_passed(r, expect_checks=4)


TORCH_LOOP = """
import sys, time, torch
x = torch.arange(1 << 20, dtype=torch.float32)
d = x.cuda()
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    y = model(torch.ones(8, 64, device="cuda"))
    y.sum().backward()
    opt.step()
    opt.zero_grad()
    torch.cuda.synchronize()
    print("ITER", i, torch.cuda.memory_allocated(), d.data_ptr(), model.weight.data_ptr(), flush=True)
    time.sleep(0.1)
print("AFTER", torch.equal(d.cpu(), x), flush=True)
"""


def test_a_pytorch_training_loop_moves_api_level(tmp_path):
    """PyTorch (API level: --sim-unexecutable skip, so its kernels are accepted and not run, and no
    value they compute is checked) moved mid-loop: its tensors keep their device pointers and bytes,
    and its allocator's count does not change across the move."""
    pytest.importorskip("torch", reason="PyTorch not installed: scripts/venv --frameworks")
    iterations = 40
    ds = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        port = free_port()
        d = Oriond(tmp_path / name, tcp_port=port, extra_args=("--sim-unexecutable", "skip"))
        d.port = port
        ds.append(d)
    a, b = ds
    try:
        env = {k: v for k, v in a.env(ORION_GMEM=4096).items() if k != "ORION_SHM"}
        env["ORION_SERVER"] = f"127.0.0.1:{a.port}"
        p = subprocess.Popen([sys.executable, "-c", TORCH_LOOP, str(iterations)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("ITER 2 "):
                break
        assert lines and lines[-1].startswith("ITER 2 "), "".join(lines) + p.stderr.read()[-3000:]
        r = migrate(a, only_session(a), f"127.0.0.1:{b.port}")
        assert r.returncode == 0, r.stderr
        out, err = p.communicate(timeout=300)
        lines += out.splitlines(keepends=True)
        assert p.returncode == 0, err[-3000:]
        assert "the session moved from" in err, err[-3000:]
        iters = [l.split()[1:] for l in lines if l.startswith("ITER ")]
        assert [int(i[0]) for i in iters] == list(range(iterations)), lines
        # After the first step (which allocates the gradients) nothing changes: not the allocator's
        # count, not a pointer, wherever the step ran.
        assert len({tuple(i[1:]) for i in iters[1:]}) == 1, iters
        assert lines[-1] == "AFTER True\n", lines[-3:]
        assert "Session 1 exits (moved to another oriond)." in a.log()
        assert re.search(r"resumes session \d+ here", b.log()), b.log()[-2000:]
    finally:
        for d in ds:
            d.stop()


def start_controller_loop(c, iterations, pause_ms, extra_mib=0, **env):
    """move_loop as a client of the cluster's controller (ORION_CONTROLLER: its own allocation, over
    TCP to the server it was placed on), once its setup is done."""
    p = subprocess.Popen([str(TEST_BIN / "move_loop"), str(iterations), str(pause_ms), str(extra_mib)],
                         env=c.env(ORION_GMEM=256, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return ready(p)


def controller_loop(c, iterations, pause_ms, extra_mib=0, **env):
    """start_controller_loop, the pool's only allocation; and that allocation."""
    p = start_controller_loop(c, iterations, pause_ms, extra_mib, **env)
    allocations = c.allocations()
    assert len(allocations) == 1 and allocations[0]["state"] == "active", allocations
    return p, allocations[0]


def test_the_controller_moves_an_allocation_with_its_running_session(tmp_path):
    """POST /v1/allocations/{id}/migrate (admin) moves the allocation's session to the other server
    while move_loop runs: the answer (wait_s) is the allocation on the target, in the session serving
    it there; the program finishes with every value right; the source's vGPUs are free and only the
    target lists the session; the source did not release the allocation."""
    c = Cluster(tmp_path, servers=2, keys=True)
    try:
        p, a = controller_loop(c, 80, 50, extra_mib=32, ORION_CONTROLLER_KEY=CLIENT)
        src = a["server"]
        dst = next(s.id for s in c.servers if s.id != src)
        source, target = (next(s for s in c.servers if s.id == x) for x in (src, dst))
        code, body = c.ctl.call("POST", f"/v1/allocations/{a['id']}/migrate", {"to": dst}, key=CLIENT)
        assert code == 403, body  # an administrator's
        # As docs/migration.md says it: curl, with the admin key, waiting for the move's end.
        r = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {ADMIN}", "-X", "POST",
                            "-d", json.dumps({"to": dst, "wait_s": 60}),
                            f"http://{c.ctl.addr}/v1/allocations/{a['id']}/migrate"],
                           capture_output=True, text=True, timeout=90)
        text, _, code = r.stdout.rpartition("\n")
        body = json.loads(text)
        assert r.returncode == 0 and code == "200", (r, c.ctl.log()[-3000:], source.log()[-3000:], target.log()[-3000:])
        assert body["server"] == dst and "move" not in body and "last_move" not in body, body
        assert [(x["server"], x["gmem_mib"]) for x in body["placements"]] == [(dst, 256)], body
        moved = body["session"]
        assert [x["session"] for x in smi_json(target)] == [moved]
        wait_until(lambda: smi_json(source) == [], 10)
        st = c.ctl.get("/v1/status")
        assert st["vgpus_used"] == 1, st  # the reservation is the allocation's now; the source's vGPU is free
        result = finish(p)
        assert result.stderr.count("the session moved from") == 1, result.stderr
        assert "Session" in source.log() and "exits (moved to another oriond)." in source.log()
        assert f"allocation {a['id']}: moved to {dst} (session {moved})" in c.ctl.log()
        # Released once, when the program exited (at the target): the source did not release it.
        wait_until(lambda: c.allocations() == [], 10)
        assert re.findall(rf"allocation {a['id']} released \((\w+)\)", c.ctl.log()) == ["client_exited"], c.ctl.log()
    finally:
        c.stop()


def test_a_controller_move_that_fails_leaves_the_allocation_and_its_program_where_they_were(tmp_path):
    """Refused before anything is reserved: to the server it is on, to one that does not exist, with
    no room at the target. A target that is gone (killed before its heartbeats stopped): the source
    cannot reach it and says so; the answer is 409 with that reason, the allocation stays on the
    source with "last_move", the reservation is gone, and the program runs on unaware."""
    c = Cluster(tmp_path, servers=2)
    try:
        p, a = controller_loop(c, 60, 50)
        src = a["server"]
        dst = next(s.id for s in c.servers if s.id != src)
        url = f"/v1/allocations/{a['id']}/migrate"
        code, body = c.ctl.call("POST", url, {"to": src})
        assert code == 400 and body["message"] == f"allocation {a['id']} is on {src} already", body
        code, body = c.ctl.call("POST", url, {"to": "127.0.0.1:1"})
        assert code == 409 and body["message"] == "server 127.0.0.1:1 is not registered or not up", body
        code, body = c.ctl.call("POST", url, {})
        assert code == 400, body
        target = next(s for s in c.servers if s.id == dst)
        target.proc.kill()
        target.proc.wait()
        code, body = c.ctl.call("POST", url, {"to": dst, "wait_s": 60})
        assert code == 409, body
        assert body["message"].startswith(f"the move of allocation {a['id']} to {dst} failed: the source: session "), body
        assert f"cannot connect to {dst}" in body["message"], body
        now = c.ctl.get(f"/v1/allocations/{a['id']}")
        assert now["server"] == src and "move" not in now, now
        assert now["last_move"]["to"] == dst and f"cannot connect to {dst}" in now["last_move"]["error"], now
        assert [x for x in c.allocations() if x.get("move_of")] == []
        result = finish(p)
        assert "moved" not in result.stderr
    finally:
        c.stop()


def test_a_shared_memory_program_on_a_pool_moves_with_its_vgpu_share(tmp_path):
    """On a pool with a controller, a program on its server's shared memory runs on a vGPU share
    whose allocation oriond asked the controller for. While a second process is on that share
    (ORION_SHARE, as a program's children are) the controller's move is refused, with why, and
    nothing moves; once the program is the share's one process, the allocation moves with it: the
    program finishes at the target, over TCP, with every value right, the source's vGPU is free,
    and the allocation is released once, when the program exits there."""
    c = Cluster(tmp_path, servers=2)
    procs = []
    try:
        source, target = c.servers
        env = dict(source.env(ORION_GMEM=256), ORION_SHARE=secrets.token_hex(16))
        p = ready(subprocess.Popen([str(TEST_BIN / "move_loop"), "90", "50", "32"], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))
        procs.append(p)
        other = ready(subprocess.Popen([str(TEST_BIN / "sleeper"), "16"], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
        procs.append(other)
        assert re.search(r"Joining vGPU share [0-9a-f]{8} \(2 session\(s\) on it\)", source.log()), source.log()
        allocations = c.allocations()
        assert len(allocations) == 1 and allocations[0]["server"] == source.id, allocations
        a = allocations[0]
        url = f"/v1/allocations/{a['id']}/migrate"
        code, body = c.ctl.call("POST", url, {"to": target.id, "wait_s": 60})
        assert code == 409, body
        assert body["message"].startswith(f"the move of allocation {a['id']} to {target.id} failed: the source: "
                                          "session "), body
        assert "is one of the 2 processes on vGPU share" in body["message"], body
        assert [x["server"] for x in c.allocations()] == [source.id]
        assert [x["transport"] for x in smi_json(source)] == ["shm", "shm"]
        other.kill()
        other.wait()
        wait_until(lambda: len(smi_json(source)) == 1, 10)
        # Asked for on the source's control socket instead: refused there, since the target's
        # controller admits a moving allocation only on the vGPUs the controller reserved for it.
        first = only_session(source)
        r = migrate(source, first, target.id)
        assert r.returncode != 0 and r.stderr == (f"session {first}'s vGPUs are Orion Controller allocation {a['id']}, "
                                                  f"which the controller moves: POST /v1/allocations/{a['id']}/migrate "
                                                  "with the admin key (or a drain of this server)\n"), r
        code, body = c.ctl.call("POST", url, {"to": target.id, "wait_s": 60})
        assert code == 200, (body, source.log()[-3000:], target.log()[-3000:])
        assert body["server"] == target.id and [x["server"] for x in body["placements"]] == [target.id], body
        moved = smi_json(target)
        assert [(x["session"], x["transport"]) for x in moved] == [(body["session"], "tcp")], moved
        wait_until(lambda: smi_json(source) == [], 10)
        assert c.ctl.get("/v1/status")["vgpus_used"] == 1
        result = finish(p)
        assert result.stderr.count("the session moved from oriond on") == 1, result.stderr[-2000:]
        assert "(with its vGPU share's allocation " + a["id"] + ")" in source.log()
        wait_until(lambda: c.allocations() == [], 10)
        assert re.findall(rf"allocation {a['id']} released \((\w+)\)", c.ctl.log()) == ["client_exited"], c.ctl.log()
    finally:
        for x in procs:
            if x.poll() is None:
                x.kill()
        c.stop()


def test_a_drain_moves_three_running_sessions_and_the_server_takes_no_new_ones(tmp_path):
    """POST /v1/servers/{id}/drain?wait_s=60 (admin) with three move_loop sessions on the server:
    each moves to the other server while it runs (orion-smi, before and after, shows where each
    allocation is), each finishes with every value right; the drained server takes no new session
    until DELETE .../drain, and GET /v1/servers says it drains."""
    c = Cluster(tmp_path, servers=2)
    procs = []
    try:
        procs = [start_controller_loop(c, 90, 50) for _ in range(3)]
        smi = json.loads(c.tool("orion-smi", "--json").stdout)
        servers = {x["placements"][0]["server"] for x in smi}
        assert len(smi) == 3 and len(servers) == 1, smi  # pack: all three on one server
        src = servers.pop()
        dst = next(s.id for s in c.servers if s.id != src)
        code, body = c.ctl.call("POST", f"/v1/servers/{src}/drain?wait_s=60")
        assert code == 200, (body, c.ctl.log()[-3000:])
        assert body["server"] == src and body["draining"] is True and body["staying"] == [], body
        assert sorted(m["id"] for m in body["moves"]) == sorted(x["id"] for x in smi), body
        assert {(m["to"], m["state"]) for m in body["moves"]} == {(dst, "moved")}, body
        smi = json.loads(c.tool("orion-smi", "--json").stdout)
        assert len(smi) == 3 and {x["placements"][0]["server"] for x in smi} == {dst}, smi
        assert [s["draining"] for s in c.ctl.get("/v1/servers") if s["id"] == src] == [True]
        source = next(s for s in c.servers if s.id == src)
        wait_until(lambda: smi_json(source) == [], 10)
        # A new program goes to the other server; one that comes to the drained server itself (no
        # controller of its own: oriond asks for it) is refused there with the reason.
        assert_passed(c.run("device_props"))
        assert re.findall(r"'device_props': 1 x 512 MiB: (\S+)/\d+/\d+$", c.ctl.log(), re.M) == [dst], c.ctl.log()
        env = {k: v for k, v in c.env().items() if k != "ORION_CONTROLLER"}
        r = subprocess.run([str(TEST_BIN / "device_props")], env=dict(env, ORION_SERVER=src), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and f"server {src} is draining" in r.stderr, r.stderr
        for p in procs:
            result = finish(p)
            assert result.stderr.count("the session moved from") == 1, result.stderr
        code, body = c.ctl.call("DELETE", f"/v1/servers/{src}/drain")
        assert code == 200 and body["draining"] is False, body
        assert [s["draining"] for s in c.ctl.get("/v1/servers") if s["id"] == src] == [False]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        c.stop()
