"""The KVM path without a KVM: a QEMU (TCG) guest whose only link to the host is an ivshmem-plain
device backed by an Orion region; oriond runs on the host (sim backend). Unmodified nvcc programs in
the guest find the device, map its BAR2 and run; their results are checked from the host (serial
console and the sim launch log)."""
import re
import subprocess
import threading
from pathlib import Path

import pytest

import vm
from conftest import PREFIX, ROOT, TEST_BIN, Oriond, assert_passed
from test_sim import assert_launches_logged

PROGRAMS = ["device_props", "kernel_params", "driver_api", "memory", "threads", "two_clients", "vadd_shared"]


class Result:
    def __init__(self, rc, out):
        self.returncode, self.stdout, self.stderr = rc, out, ""


@pytest.fixture(scope="module")
def kernel():
    out = subprocess.run([ROOT / "scripts" / "vm-kernel"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return Path(ROOT / out.stdout.strip())


@pytest.fixture(scope="module")
def initrd(tmp_path_factory):
    d = tmp_path_factory.mktemp("vm")
    progs = [TEST_BIN / p for p in PROGRAMS] + [ROOT / "build" / "hostile_client"]
    return vm.build_initramfs(d / "initrd.gz", PREFIX, progs)


@pytest.fixture
def vm_oriond(tmp_path):
    d = Oriond(tmp_path, region_mib=64, channel_mib=16)
    yield d
    d.stop()


def test_programs_run_in_a_guest_over_ivshmem(vm_oriond, kernel, initrd, tmp_path):
    console = vm.boot(kernel, initrd, ["orion-check:runtime:client", "device_props", "kernel_params", "driver_api",
                                       "memory", "threads", "vadd_shared"], region=vm_oriond.region,
                      log=tmp_path / "console.log")
    out = vm.outputs(console)
    # orion-check, installed by install-client, finds the device and oriond behind it.
    rc, text = out.pop("orion-check")
    assert rc == 0, text
    assert re.search(r"Found through :\s+ivshmem /sys/bus/pci/devices/0000:00:0\d.0", text), text
    assert re.search(r"Orion Server serves this region\s+\[Yes\]", text), text
    assert set(out) == {"device_props", "kernel_params", "driver_api", "memory", "threads", "vadd_shared"}, console[-3000:]
    for prog, (rc, text) in out.items():
        assert_passed(Result(rc, text))
        assert "Orion Simulated GPU" in text, prog
    assert "Orion vGPU client environment has been installed in /usr/lib/orion" not in console  # -q
    assert_launches_logged(out["kernel_params"][1], vm_oriond.launches())
    assert_launches_logged(out["driver_api"][1], vm_oriond.launches())
    assert len(re.findall(r"Session \d+ exits \(client exited\)", vm_oriond.log())) >= 6


def test_guest_without_the_device_gets_a_clear_error(kernel, initrd, tmp_path):
    out = vm.outputs(vm.boot(kernel, initrd, ["device_props"], region=None))
    rc, text = out["device_props"]
    assert rc != 0
    assert "no ivshmem device (PCI 1af4:1110)" in text


def test_hostile_guest_only_loses_its_own_session(tmp_path, kernel, initrd):
    # Two VMs, two regions, one oriond: VM B keeps working while VM A attacks its own region.
    region_b = tmp_path / "orionsock1"
    subprocess.run([PREFIX / "bin" / "orion-shm", "-i", "1", "-s", "64", "-d", tmp_path], check=True,
                   capture_output=True)
    d = Oriond(tmp_path, region_mib=64, channel_mib=16, extra_args=["--shm", region_b])
    try:
        results = {}

        def run_b():
            results["b"] = vm.boot(kernel, initrd, ["two_clients:12000:5"], region=region_b, gmem=128)

        t = threading.Thread(target=run_b)
        t.start()
        console_a = vm.boot(kernel, initrd, ["hostile_client:ivshmem:bogus", "hostile_client:ivshmem:garbage",
                                             "hostile_client:ivshmem:unknown"], region=d.region)
        t.join()
        for check in ["session_still_serves", "malformed_payload_ends_session", "garbage_ends_session",
                      "unknown_op_ends_session"]:
            assert f"RESULT {check} ok" in console_a, console_a[-4000:]
        assert "FAIL" not in console_a, console_a[-4000:]
        rc, text = vm.outputs(results["b"])["two_clients"]
        assert rc == 0 and "phase=verified" in text, text
        assert d.alive()
        assert "protocol violation" in d.log() + d.session_logs() or "invalid first frame" in d.log()
    finally:
        d.stop()
