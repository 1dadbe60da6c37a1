"""Hostile peers for the guest runtime, loopback only and bounded in time: a fake oriond that
speaks Orion's TCP framing (docs/spec/frames.md) and misbehaves on purpose, and a fake controller
that records every raw HTTP request and answers what the test says."""
import json
import re
import socket
import struct
import threading
import time
from pathlib import Path

MAGIC = 0x4D52464F
# kProtocolVersion, read from the header the runtime and oriond are built from.
PROTOCOL = int(re.search(r"kProtocolVersion = (\d+);",
                         (Path(__file__).resolve().parents[2] / "common/include/orion/common/frame.h").read_text()).group(1))
HDR = struct.Struct("<IHHIIiiII")  # FrameHeader: magic version op seq payload_len status deferred flags reserved
OP = {"Hello": 1, "CtxCreate": 10, "PrimaryCtxRetain": 14, "CtxSetCurrent": 12, "CtxSynchronize": 13, "MemAlloc": 20, "MemFree": 21,
      "MemcpyHtoD": 23, "MemcpyDtoH": 24, "BlobPut": 41, "WindowData": 90}
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_UNKNOWN = 999
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CHANNEL_BYTES = 16 << 20


def header(op, seq, length, status=0, deferred=0, flags=0, version=PROTOCOL, magic=MAGIC):
    return HDR.pack(magic, version, op, seq, length, status, deferred, flags, 0)


def welcome():
    rep = struct.pack("<IIiIQHHI48s40s40s", 7, 1, 13000, 0, CHANNEL_BYTES, 2, 0, 0, b"fake oriond", b"", b"")
    dev = struct.pack("<256s16sQ160iII16sII", b"Fake GPU", bytes(16), 1 << 30, *([0] * 160), 0, 0, b"0000:00:00.0", 0, 0)
    return rep + dev


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client closed")
        data += chunk
    return data


class FakeOriond:
    """Accepts TCP connections on 127.0.0.1 and runs `script(conn, frames)` for each: `frames` is a
    generator of (header tuple, payload) of the client's frames (window bytes skipped)."""

    def __init__(self, script):
        self.script = script
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.stop_event = threading.Event()
        self.errors = []
        self.conns = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _frames(self, conn):
        while not self.stop_event.is_set():
            h = HDR.unpack(recv_exact(conn, HDR.size))
            payload = recv_exact(conn, h[4]) if h[4] else b""
            op = h[2]
            if op == OP["MemcpyHtoD"]:
                recv_exact(conn, struct.unpack_from("<QQQ", payload)[2])
            elif op == OP["BlobPut"]:
                recv_exact(conn, struct.unpack_from("<QQQQQQ", payload)[5])
            yield h, payload

    def _serve(self):
        while not self.stop_event.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(30)
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        try:
            self.script(self, conn, self._frames(conn))
        except (ConnectionError, OSError, StopIteration):
            pass
        except Exception as e:  # noqa: BLE001 - reported to the test
            self.errors.append(repr(e))

    def hold(self):
        """Keep the connection open and silent until the test ends."""
        self.stop_event.wait(60)

    def stop(self):
        self.stop_event.set()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        self.sock.close()
        self.thread.join(timeout=5)


def answer(conn, h, payload=b"", status=0, **kw):
    """The reply a healthy oriond would send to request header `h`."""
    conn.sendall(header(h[2], h[3], len(payload), status=status, **kw) + payload)


def serve_normally(conn, h, payload):
    """Healthy answers for the probe's requests (CtxCreate, MemAlloc, MemcpyDtoH, sync)."""
    op = h[2]
    if op == OP["Hello"]:
        answer(conn, h, welcome())
    elif op in (OP["CtxCreate"], OP["PrimaryCtxRetain"]):
        answer(conn, h, struct.pack("<Q", 1))
    elif op == OP["MemAlloc"]:
        answer(conn, h, struct.pack("<Q", 0x7F0000000000))
    elif op == OP["MemcpyDtoH"]:
        dst, _src, nbytes = struct.unpack_from("<QQQ", payload)
        conn.sendall(header(OP["WindowData"], h[3], 16) + struct.pack("<QQ", dst, nbytes) + bytes(nbytes))
        answer(conn, h)
    elif h[7] & 1:  # wants a reply
        answer(conn, h)


class FakeController:
    """An HTTP/1.1 server on 127.0.0.1 that records each raw request (bytes) and answers with
    `respond(method, target, body) -> (status, json_body)`."""

    def __init__(self, respond):
        self.respond = respond
        self.requests = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop_event.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self._one(conn)
                except OSError:
                    pass

    def _one(self, conn):
        raw = b""
        deadline = time.time() + 5
        while b"\r\n\r\n" not in raw and time.time() < deadline and len(raw) < 1 << 20:
            chunk = conn.recv(65536)
            if not chunk:
                break
            raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        while len(body) < length and time.time() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        raw = head + b"\r\n\r\n" + body
        self.requests.append(raw)
        request_line = head.split(b"\r\n")[0].decode("latin-1")
        method, _, rest = request_line.partition(" ")
        target = rest.rsplit(" ", 1)[0]
        status, reply = self.respond(method, target, body)
        data = json.dumps(reply).encode()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + data)

    def stop(self):
        self.stop_event.set()
        self.sock.close()
        self.thread.join(timeout=5)
