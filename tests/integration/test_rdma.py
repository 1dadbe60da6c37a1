"""RDMA for real, with Soft-RoCE: this host's kernel has no RDMA, so a QEMU (TCG) guest boots Debian's
standard kernel (scripts/vm-kernel --rdma), loads rdma_rxe on a dummy netdev, and runs oriond (sim
backend, enable_rdma) and the nvcc test programs inside it, over the dummy address. Both logs must
say RDMA, the programs must pass, and the launches must be in the sim launch log. Also: hostile RDMA
clients, a client killed mid-run, a client forced to TCP, and one whose RDMA setup fails after
oriond chose RDMA (it connects again over TCP). The fallback to TCP on a host without RDMA is in
test_tcp.py."""
import json
import re
import subprocess
from pathlib import Path

import pytest

import vm
from conftest import PREFIX, ROOT, TEST_BIN, assert_launches_logged, assert_passed

ADDR = vm.SOFT_ROCE_ADDR
PROGRAMS = ["memory", "kernel_params", "driver_api", "device_props"]
# Driver API families (issue #13) over RDMA: arrays, textures and surfaces; graphs.
FAMILIES = ["arrays", "graphs"]

# A program run with TCP forced: oriond has RDMA, the client says why it does not use it.
TCP_WRAPPER = "#!/bin/sh\nORION_TRANSPORT=tcp exec /opt/device_props\n"
# A client killed in the middle of its run (sleeper holds its session until killed, whatever the
# guest's speed): its session ends at once (the TCP connection closes).
KILLED_WRAPPER = r"""#!/bin/sh
/opt/sleeper 16 > /tmp/sleeper.out 2>&1 &
p=$!
i=0
while ! grep -q READY /tmp/sleeper.out && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
kill -9 $p
i=0
while ! grep -qE "exits \((client disconnected|worker ended)\)" /tmp/logs/server.log && [ $i -lt 100 ]; do
  sleep 0.1; i=$((i+1))
done
grep -E "exits \((client disconnected|worker ended)\)" /tmp/logs/server.log
"""
# A client that cannot register its window (a non-root user with a 64 KiB `ulimit -l`): the RDMA
# setup fails after oriond chose RDMA, and the client connects again over TCP, saying why.
LOWMEM_WRAPPER = """#!/bin/sh
grep -q '^u:' /etc/passwd 2>/dev/null || echo 'u:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd
ulimit -l 64
exec su u -c /opt/device_props
"""
HOSTILE_MODES = ["badconnect", "garbage", "window", "tcpbytes"]
HOSTILE_WRAPPER = ("#!/bin/sh\nrc=0\nfor m in " + " ".join(HOSTILE_MODES) +
                   f"; do /opt/hostile_rdma {ADDR} 9960 $m || rc=1; done\nexit $rc\n")


@pytest.fixture(scope="module")
def rdma_kernel():
    out = subprocess.run([ROOT / "scripts" / "vm-kernel", "--rdma"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return Path(ROOT / out.stdout.strip())


@pytest.fixture(scope="module")
def rdma_initrd(tmp_path_factory, rdma_kernel):
    d = tmp_path_factory.mktemp("vm-rdma")
    extra = vm.soft_roce_extra(rdma_kernel, PREFIX, d, channel_mib=16)
    wrapper = d / "tcp_device_props"
    wrapper.write_text(TCP_WRAPPER)
    wrapper.chmod(0o755)
    hostile = d / "hostile_all"
    hostile.write_text(HOSTILE_WRAPPER)
    hostile.chmod(0o755)
    extra["/opt/hostile_all"] = hostile
    killed = d / "killed_memory"
    killed.write_text(KILLED_WRAPPER)
    killed.chmod(0o755)
    extra["/opt/killed_memory"] = killed
    lowmem = d / "lowmem_device_props"
    lowmem.write_text(LOWMEM_WRAPPER)
    lowmem.chmod(0o755)
    extra["/opt/lowmem_device_props"] = lowmem
    extra["/opt/tcp_device_props"] = wrapper
    progs = [TEST_BIN / p for p in PROGRAMS + FAMILIES] + [TEST_BIN / "sleeper", ROOT / "build" / "hostile_rdma"]
    return vm.build_initramfs(d / "initrd.gz", PREFIX, progs, extra=extra, setup=vm.SOFT_ROCE_SETUP,
                              teardown=vm.SOFT_ROCE_TEARDOWN, applets=vm.SOFT_ROCE_APPLETS + ["su"])


def test_programs_run_over_soft_roce(rdma_kernel, rdma_initrd, tmp_path):
    # Hostile RDMA clients first: each loses only its own session, and oriond serves the rest.
    run = ["hostile_all", "killed_memory", *PROGRAMS[:3], *FAMILIES, "tcp_device_props", "lowmem_device_props"]
    console = vm.boot(rdma_kernel, rdma_initrd, run, gmem=256, timeout=600, log=tmp_path / "console.log",
                      mem_mib=1024)  # oriond, its worker and the 64 MiB round trips of memory, in RAM
    out = vm.outputs(console)
    setup = console.split("=== BEGIN")[0]
    assert "failed" not in setup and "link rxe0/1 state ACTIVE" in setup, setup[-3000:]
    server_log = out.get("server.log", (0, ""))[1]
    for prog in PROGRAMS[:3]:
        assert prog in out, console[-4000:]
        rc, text = out[prog]
        assert_passed(vm_result(rc, text), expect_checks=40 if prog == "memory" else 1)
        assert f"Orion transport: RDMA to {ADDR}:9960 (rxe0 port 1" in text, text[-3000:]
        assert "Orion Simulated GPU" in text or prog == "memory", prog
    for prog in FAMILIES:
        assert prog in out, console[-4000:]
        rc, text = out[prog]
        assert_passed(vm_result(rc, text), expect_checks=20 if prog == "arrays" else 30)
        assert f"Orion transport: RDMA to {ADDR}:9960 (rxe0 port 1" in text, text[-3000:]
    assert len(re.findall(r"Client supports RDMA mode, then server runs in RDMA mode\.", server_log)) == 11, server_log
    assert len(re.findall(r"Creating session \d+ for '(memory|kernel_params|driver_api)' .* over RDMA", server_log)) == 3
    assert re.search(r"Creating session \d+ for 'sleeper' .* over RDMA", server_log), server_log
    assert "RDMA enabled: device(s) rxe0" in server_log, server_log
    session_log = out["session.log"][1]
    assert len(re.findall(r"RDMA queue pair \d+ on rxe0 port 1 .* connected to client queue pair \d+", session_log)) == 9
    # The killed client's session ended by itself, before oriond stopped.
    rc, text = out["killed_memory"]
    assert re.search(r"Session 5 exits \((client disconnected|worker ended)\)", text), text
    # The hostile sessions: each ended on its own violation; nothing else was one.
    rc, text = out["hostile_all"]
    for check in ["bad_rdma_connect_ends_session", "rdma_garbage_ends_session", "rdma_window_overrun_ends_session",
                  "tcp_bytes_under_rdma_end_session"]:
        assert f"RESULT {check} ok" in text, text
    assert text.count("RESULT nop_over_rdma ok") == 3 and "FAIL" not in text and rc == 0, text
    assert len(re.findall(r"protocol violation", session_log)) == 4, session_log[-3000:]
    for why in ["the peer's window is", "frame has a bad magic", "frame reads outside the window",
                "bytes on the TCP socket of an RDMA session"]:
        assert why in session_log, why
    # Forced TCP against the same oriond: the client says why, oriond serves TCP.
    rc, text = out["tcp_device_props"]
    assert_passed(vm_result(rc, text))
    assert f"Orion transport: TCP to {ADDR}:9960 (no RDMA: ORION_TRANSPORT=tcp)" in text, text
    assert "Client supports TCP mode, then server also falls back to TCP mode." in server_log
    # RDMA setup failing on the client after oriond chose RDMA: it connects again, over TCP.
    rc, text = out["lowmem_device_props"]
    assert_passed(vm_result(rc, text))
    assert re.search(r"\[warning\] Orion transport: RDMA setup with oriond failed: ibv_reg_mr \(\w+\) failed on rxe0: "
                     r".*`ulimit -l` is 64 KiB.*; connecting again over TCP", text), text
    assert f"Orion transport: TCP to {ADDR}:9960 (no RDMA: RDMA setup with oriond failed" in text, text
    assert "client sent no RdmaConnect" in session_log
    launches = [json.loads(line) for line in out["launch.log"][1].splitlines()]  # JSON Lines
    assert_launches_logged(out["kernel_params"][1], launches)
    assert_launches_logged(out["driver_api"][1], launches)
    assert len(re.findall(r"Session \d+ exits \(client exited\)", server_log)) >= 4, server_log


class vm_result:
    def __init__(self, rc, out):
        self.returncode, self.stdout, self.stderr = rc, out, ""
