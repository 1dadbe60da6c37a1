"""Idle workers sleep instead of napping, on every transport, and the VM doorbell is hostile input.

- An idle session's worker (shared memory on this kernel: futex; TCP: the socket) uses almost no
  CPU: measured as CPU time and voluntary context switches (wake-ups) of the worker process, never
  as wall time. The VM doorbell's figure is test_kvm.py's (a QEMU guest).
- oriond serves each VM's ivshmem-doorbell socket (docs/specs/ivshmem-spec.rst). Whoever connects
  there (QEMU, or anyone who can reach the socket) can only hurt that VM: a storm of rings on its
  eventfds costs the rung channel's worker a throttled trickle of CPU, and garbage on the socket
  ends that connection only. Here a fake QEMU (this file) plays the hostile peer; the VM's
  processes run on the host with a fake sysfs PCI tree (ORION_SYSFS_PCI) whose resource2 is the
  region, as BAR2 is in a VM, and whose resource0 reads IVPosition 1, so they say they ring the
  ivshmem doorbell and their workers sleep on its eventfds."""
import os
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import TEST_BIN, Oriond, free_port, wait_ready, wait_until
from harness.vm_host import VmHost, worker_cpu


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_idle_worker_uses_almost_no_cpu(tmp_path, transport):
    port = free_port() if transport == "tcp" else 0
    d = Oriond(tmp_path, tcp_port=port)
    env = d.env()
    if transport == "tcp":
        env.pop("ORION_SHM")
        env["ORION_SERVER"] = f"127.0.0.1:{port}"
    p = subprocess.Popen([str(TEST_BIN / "sleeper"), "16"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        wait_ready(p)
        time.sleep(2)  # past the spin phase and the first, short sleeps
        cpu, wakeups = worker_cpu(d.proc.pid, 5.0)
        # Asleep on the futex or the socket, it wakes a few times a second for the lease check
        # (napping, or waiting 20 ms at a time as before, it woke 50 to 200 times a second).
        assert cpu < 0.1, cpu  # < 2 % of a core over 5 s
        assert wakeups < 100, wakeups
        assert d.alive()
    finally:
        p.kill()
        p.wait()
        d.stop()


class FakeQemu:
    """A peer of oriond's ivshmem server, as QEMU's ivshmem-doorbell is: it reads the setup
    (version, its id, the memory, oriond's eventfds, its own), and can then ring, storm or send
    what QEMU never sends."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.msgs = []
        while True:
            value, fd = self.recv()
            self.msgs.append((value, fd))
            if len(self.msgs) >= 3 and value == 1 and sum(1 for v, _ in self.msgs[3:] if v == 1) == self.vectors():
                break

    def recv(self):
        data, fds, _, _ = socket.recv_fds(self.sock, 8, 1)
        assert len(data) == 8, data
        return struct.unpack("<q", data)[0], (fds[0] if fds else -1)

    def vectors(self):
        return sum(1 for v, _ in self.msgs[3:] if v == 0)

    def host_fds(self):
        return [fd for v, fd in self.msgs[3:] if v == 0]

    def storm(self, seconds):
        one = struct.pack("<Q", 1)
        end = time.time() + seconds
        n = 0
        while time.time() < end:
            for fd in self.host_fds():
                os.write(fd, one)
                n += 1
        return n

    def close(self):
        self.sock.close()
        for _, fd in self.msgs:
            if fd >= 0:
                os.close(fd)


def fake_pci(tmp: Path, region: Path):
    """A sysfs PCI tree with one ivshmem-doorbell device: BAR2 is the region, BAR0 reads
    IVPosition 1 (a plain file: the guest runtime's rings land in it and wake nobody)."""
    dev = tmp / "pci" / "0000:00:05.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1af4\n")
    (dev / "device").write_text("0x1110\n")
    (dev / "enable").write_text("1\n")
    os.symlink(region, dev / "resource2")
    (dev / "resource0").write_bytes(bytes(8) + struct.pack("<I", 1) + bytes(4096 - 12))
    home = tmp / "home"
    (home / ".orion").mkdir(parents=True)
    (home / ".orion" / "client.conf").write_text(f"[client-shm]\n    shm_path_base = {tmp / 'nothing'}/\n")
    return {"ORION_SYSFS_PCI": str(tmp / "pci"), "HOME": str(home)}


def test_a_doorbell_storm_or_garbage_only_affects_its_own_vm(tmp_path):
    h = VmHost(tmp_path)
    qemus = []
    try:
        for vm in ("a", "b"):
            r = h.hook(vm, "prepare", vgpus=1, gmem=1000, processes=2, shm_mib=16, doorbell=True)
            assert r.returncode == 0, r.stderr
            qemus.append(FakeQemu(h.bell(vm)))
        a, b = qemus
        assert a.msgs[:2] == [(0, -1), (1, -1)] and a.msgs[2][0] == -1 and a.vectors() == 2
        assert os.fstat(a.msgs[2][1]).st_ino == os.stat(h.region("a")).st_ino  # the memory is the region
        # A process of VM a that rings the ivshmem doorbell (so its worker sleeps on the eventfd).
        env_a = h.env("a", **fake_pci(tmp_path / "a", h.region("a")))
        env_a.pop("ORION_SHM")
        sleeper = subprocess.Popen([str(TEST_BIN / "sleeper"), "16"], env=env_a, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(sleeper)
            time.sleep(1)
            # A storm on all of VM a's vectors: its worker is woken for nothing, again and again.
            done = {}
            t = threading.Thread(target=lambda: done.setdefault("rings", a.storm(6)))
            t.start()
            time.sleep(0.5)
            cpu, _ = worker_cpu(h.proc.pid, 3.0)
            # VM b is served meanwhile.
            r = h.run("b", "device_props")
            assert r.returncode == 0 and "PROP deviceCount=1" in r.stdout, r.stdout + r.stderr
            t.join()
            assert done["rings"] > 10000, done
            # Throttled: the stormed worker used a small share of a core (unthrottled, a whole one).
            assert cpu < 0.6, cpu  # < 20 % of a core over 3 s
            assert sleeper.poll() is None
        finally:
            sleeper.kill()
            sleeper.wait()
        wait_until(lambda: "sess=1 idle waits" in h.log(), 10, lambda: h.log()[-3000:], interval=0.1)
        m = re.search(r"sess=1 idle waits: .*spurious=(\d+) throttled=(\d+)", h.log())
        assert int(m.group(1)) > 100 and int(m.group(2)) > 100, m.group(0)
        # Garbage on VM a's socket: that connection ends (QEMU never sends), nothing else does.
        a.sock.sendall(b"\xff" * 64)
        wait_until(lambda: "one-way" in h.log(), 5, lambda: h.log()[-3000:])
        assert a.sock.recv(16) == b""  # closed by oriond
        # A second connection while b's QEMU is connected is refused; a's socket takes a new peer.
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(h.bell("b")))
        assert extra.recv(16) == b""
        extra.close()
        wait_until(lambda: "refused a second connection" in h.log(), 5, lambda: h.log()[-3000:])
        again = FakeQemu(h.bell("a"))
        qemus.append(again)
        assert again.vectors() == 2
        for vm in ("a", "b"):
            r = h.run(vm, "device_props")
            assert r.returncode == 0, r.stdout + r.stderr
        assert h.proc.poll() is None
        assert "vm=a:1" in h.control("status") and "vm=b:1" in h.control("status")
    finally:
        for q in qemus:
            q.close()
        h.stop()
