"""CUDA IPC between processes served by one oriond (issue #9: torch.multiprocessing sharing CUDA
tensors, MNIST Hogwild, which Orion vGPU did not support; issue #13): the memory and events one
session exports another opens, through tickets checked by oriond (host/include/orion/host/ipc_ticket.h)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TEST_BIN, assert_passed, checks, run_pair, wait_until

MIB = 1 << 20


def test_memory_and_events_shared_between_sessions(oriond):
    consumer, producer = run_pair(oriond)
    assert_passed(consumer, expect_checks=5)
    assert_passed(producer, expect_checks=2)
    # Values a kernel computed in one session are read, changed by a kernel and seen in the other.
    assert checks(consumer.stdout)["consumer_sees_producer_kernel"] == "ok"
    assert checks(producer.stdout)["producer_sees_consumer_kernel"] == "ok"
    # The forged handles were refused with a reason in the consumer's session log, nothing more.
    assert re.search(r"op=IpcOpenMemHandle refused: not an IPC handle of this oriond", oriond.session_logs())
    assert "protocol violation" not in oriond.session_logs()
    assert oriond.alive()


def test_imported_event_completes_with_the_exporters_work(oriond):
    # cuda-samples simpleIPC's order: handles exchanged first, then the producer launches a slow
    # kernel, records the interprocess event and tells the consumer at once; the consumer's
    # cudaEventSynchronize on the imported event must wait for that kernel (it read 0s before).
    env = oriond.env(ORION_GMEM=256)
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    producer = subprocess.Popen([str(TEST_BIN / "ipc"), "producer-late"], **pipes)
    consumer = None
    try:
        line = producer.stdout.readline()
        assert line.startswith("HANDLES"), line + producer.stderr.read()
        _, mem, ev = line.split()
        consumer = subprocess.Popen([str(TEST_BIN / "ipc"), "consumer-late", mem, ev], **pipes)
        assert consumer.stdout.readline() == "READY\n", consumer.stderr.read()
        producer.stdin.write("READY\n")
        producer.stdin.flush()
        assert producer.stdout.readline() == "RECORDED\n", producer.stderr.read()
        out, err = consumer.communicate("RECORDED\n", timeout=120)
        c = subprocess.CompletedProcess(consumer.args, consumer.returncode, out, err)
        assert_passed(c, expect_checks=1)
        assert checks(out)["imported_event_waits_for_the_producers_kernel"] == "ok"
        pout, perr = producer.communicate("CONSUMED\n", timeout=60)
        assert producer.returncode == 0, pout + perr
    finally:
        for p in (producer, consumer):
            if p is not None and p.poll() is None:
                p.kill()


def test_torch_multiprocessing_shares_cuda_tensors(oriond):
    # torch.multiprocessing: a CUDA tensor put on a queue reaches the child through
    # cudaIpcGetMemHandle/cudaIpcOpenMemHandle (and an interprocess event); the child writes it in
    # place and the parent sees the bytes. The values come from host-to-device copies (checked
    # byte for byte), not from PyTorch's SASS kernels.
    pytest.importorskip("torch")
    r = oriond.run(sys.executable, ROOT / "tests" / "frameworks" / "ipc_share_probe.py", ORION_GMEM=1024,
                   timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "SHARED_EQUAL True" in r.stdout and "CHILD_EXIT 0" in r.stdout, out[-4000:]
    assert "is not supported by Orion" not in r.stderr.replace("cuLogsRegisterCallback is not supported", ""), \
        r.stderr[-3000:]


class Shell:
    """A driver_shell.py process: one command, one answer (tests/integration/driver_shell.py)."""

    def __init__(self, oriond, **env):
        self.p = subprocess.Popen([sys.executable, str(Path(__file__).with_name("driver_shell.py"))],
                                  env=oriond.env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert self.ask("") == ["READY", "0"]

    def ask(self, command):
        if command:
            self.p.stdin.write(command + "\n")
            self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, f"{command}: no answer; stderr: {self.p.stderr.read()}"
        return line.split()

    def free_bytes(self):
        r, free, _ = self.ask("meminfo")
        assert r == "0"
        return int(free)

    def end(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def share(exporter, importer, p):
    """Exports allocation `p` of one shell and opens it in another: (handle, the importer's pointer)."""
    r, handle = exporter.ask("export " + p)
    assert r == "0"
    r, q = importer.ask("import " + handle)
    assert r == "0"
    return handle, q


def test_ipc_memory_stays_charged_while_an_importer_maps_it(oriond):
    # Issue #22 item 2a: a 256 MiB tenant exported 192 MiB, a second tenant opened it, and the
    # exporter freed it and allocated again: both tenants' quotas were free while the pages lived,
    # so two 256 MiB tenants held 1.56 GB. Now the exporter pays until the last importer closes,
    # and an importer pays for what outlives its exporter's session.
    exporter, importer = Shell(oriond, ORION_GMEM=256), Shell(oriond, ORION_GMEM=256)
    try:
        r, p = exporter.ask("alloc 192")
        assert r == "0"
        handle, q = share(exporter, importer, p)
        assert importer.free_bytes() == 256 * MIB  # the exporter pays while it holds the allocation
        assert exporter.ask("free " + p) == ["0"]
        # The importer still maps the 192 MiB: the exporter's quota has no room for them again.
        assert exporter.free_bytes() == 64 * MIB
        assert exporter.ask("alloc 192")[0] == "2"  # CUDA_ERROR_OUT_OF_MEMORY
        # A freed allocation's handle opens no more (its ticket is revoked).
        assert importer.ask("import " + handle)[0] == "1"  # CUDA_ERROR_INVALID_VALUE
        # The last importer closes it: the charge goes back.
        assert importer.ask("close " + q) == ["0"]
        assert exporter.free_bytes() == 256 * MIB
        r, p = exporter.ask("alloc 192")
        assert r == "0"

        # The exporter's session ends (killed) while the importer maps its memory: the importer
        # pays from then on, and opens nothing more past its quota.
        handle, q = share(exporter, importer, p)
        exporter.end()
        wait_until(lambda: importer.free_bytes() == 64 * MIB, 10, importer.free_bytes, interval=0.1)
        assert importer.ask("alloc 128")[0] == "2"
        assert re.search(r"IPC import 0x[0-9a-f]+ \(192 MB\) outlived its exporter's session: charged to this "
                         r"session's quota", oriond.session_logs())
        assert importer.ask("close " + q) == ["0"]
        assert importer.free_bytes() == 256 * MIB
        r, _ = importer.ask("alloc 128")
        assert r == "0"
    finally:
        exporter.end()
        importer.end()
    assert oriond.alive()
