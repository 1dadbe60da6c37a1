"""The KVM path without a KVM: a QEMU (TCG) guest whose only link to the host is an ivshmem-plain
device backed by an Orion region; oriond runs on the host (sim backend). Unmodified nvcc programs in
the guest find the device, map its BAR2 and run; their results are checked from the host (serial
console and the sim launch log).

The first tests need no QEMU: a VM's region is attached the way libvirt does it (`orion-vm hook
DOMAIN prepare` with the domain XML on stdin) and a "guest" process on the host maps that region
file (ORION_SHM), which is what BAR2 is inside the VM. oriond runs as scripts/install-server
configures it (enable_shm and enable_kvm on, regions found in shm_path_base) and is restarted with
its state file."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

import vm
from conftest import PREFIX, ROOT, TEST_BIN, Oriond, assert_launches_logged, assert_passed, wait_ready, wait_until
from harness.vm_host import VmHost, running, session_waits, worker_cpu

PROGRAMS = ["device_props", "kernel_params", "driver_api", "memory", "threads", "two_clients", "vadd_shared",
            "mapped_register"]


class Result:
    def __init__(self, rc, out):
        self.returncode, self.stdout, self.stderr = rc, out, ""


@pytest.fixture
def vm_host(tmp_path):
    h = VmHost(tmp_path)
    yield h
    h.stop()


def assert_has_the_vms_limits(h, vm, vgpus=2, gmem=3000):
    """A process of the VM with no ORION_VGPU/ORION_GMEM gets all the VM has; more is refused."""
    r = h.run(vm, "device_props")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"PROP deviceCount={vgpus}" in r.stdout, r.stdout
    assert f"PROP totalGlobalMem={gmem << 20}" in r.stdout, r.stdout
    r = h.run(vm, "device_props", ORION_VGPU=vgpus + 1)
    assert r.returncode != 0
    assert f"ORION_VGPU={vgpus + 1} is more than this VM has {vgpus} vGPU(s) of {gmem} MiB" in r.stderr, r.stderr
    r = h.run(vm, "device_props", ORION_GMEM=gmem + 1)
    assert r.returncode != 0
    assert f"ORION_GMEM={gmem + 1} MiB is more than this VM has {vgpus} vGPU(s) of {gmem} MiB" in r.stderr, r.stderr
    # Less is fine.
    r = h.run(vm, "device_props", ORION_VGPU=1, ORION_GMEM=1000)
    assert r.returncode == 0 and "PROP deviceCount=1" in r.stdout and f"PROP totalGlobalMem={1000 << 20}" in r.stdout, \
        r.stdout + r.stderr


def test_a_vm_process_needs_no_orion_vgpu_or_gmem(vm_host):
    r = vm_host.hook("vm1", "prepare")
    assert r.returncode == 0, r.stderr
    assert_has_the_vms_limits(vm_host, "vm1")
    # orion-check in the guest says what the VM has and how many processes it may run.
    r = subprocess.run([PREFIX / "bin" / "orion-check", "runtime", "client"], env=vm_host.env("vm1"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"vGPUs of this VM :\s+2 x 3000 MiB", r.stdout), r.stdout
    assert re.search(r"Channels :\s+4 \(\d in use; one per CUDA process\)", r.stdout), r.stdout
    # orion-smi in the guest: no oriond to ask there. It shows the region, and says what a guest can
    # do, not what a host would (issue #25: it said "oriond is not running" under "serves it: yes").
    r = subprocess.run([PREFIX / "bin" / "orion-smi", "--oriond", "/nonexistent/oriond.sock"], env=vm_host.env("vm1"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line.strip("| ") for line in r.stdout.splitlines()]
    assert "oriond serves it: yes" in lines and "vGPUs of this VM: 2 x 3000 MiB" in lines, r.stdout
    assert lines[-1] == ("This is a VM: its oriond runs on the host. For every process's vGPUs and memory, run "
                         "orion-smi on the host, or use a controller; the VM's vGPUs are set there (orion-vm "
                         "enable)."), r.stdout


def test_oriond_restart_changes_nothing_a_vm_sees(vm_host):
    h = vm_host
    assert h.hook("vm1", "prepare").returncode == 0
    assert "vgpus_free=2" in h.control("status")
    sleeper = h.popen("vm1", "sleeper", "16")  # a process of the VM while oriond restarts
    try:
        wait_ready(sleeper)
        h.restart()
        assert "VM vm1: restored" in h.log()
        # The VM still holds its two vGPUs; its region was not taken for a host region.
        status = h.control("status")
        assert "vgpus_free=2" in status and "vm=vm1:2" in status, status
        assert f"Using SHM {h.region('vm1')} for acceleration (4 channels" in h.log().split("Orion Server listens")[-2]
        assert_has_the_vms_limits(h, "vm1")
        # The process that ran across the restart lost its session (oriond's workers end with it).
        assert sleeper.poll() is None or sleeper.returncode != 0
    finally:
        sleeper.kill()
        sleeper.wait()
    # The VM stops and starts again: no "already served".
    assert h.hook("vm1", "release").returncode == 0
    assert not h.region("vm1").exists()
    assert "vgpus_free=4" in h.control("status")
    r = h.hook("vm1", "prepare")
    assert r.returncode == 0, r.stderr
    assert_has_the_vms_limits(h, "vm1")


def test_a_vm_that_stopped_while_oriond_was_down_starts_again(vm_host):
    h = vm_host
    assert h.hook("vm1", "prepare").returncode == 0
    h.stop()
    h.hook("vm1", "release")  # oriond is down: the hook can only remove the file
    assert not h.region("vm1").exists()
    h.start()
    assert "VM vm1: its region" in h.log() and "is gone" in h.log()
    assert "vgpus_free=4" in h.control("status")
    r = h.hook("vm1", "prepare")
    assert r.returncode == 0, r.stderr
    assert_has_the_vms_limits(h, "vm1")
    # The file removed behind oriond's back (no release hook): the next start still attaches.
    os.unlink(h.region("vm1"))
    r = h.hook("vm1", "prepare")
    assert r.returncode == 0, r.stderr
    assert "vgpus_free=2" in h.control("status")


def test_a_corrupt_state_file_is_a_clear_error(vm_host):
    h = vm_host
    h.stop()
    h.state.parent.mkdir(parents=True, exist_ok=True)
    h.state.write_text('{"version": 1, "vms": [{"vm": "x"}]}')
    r = subprocess.run([PREFIX / "bin" / "oriond", "--config", h.conf, "--backend", "sim", "--log-dir", h.logs,
                        "-p", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"{h.state} is corrupt: vms[0].region is missing" in r.stderr, r.stderr
    assert "fix or remove the file" in r.stderr


def test_several_processes_in_one_vm(vm_host):
    h = vm_host
    assert h.hook("vm1", "prepare").returncode == 0  # processes=4, as orion-vm enable writes by default
    procs = [h.popen("vm1", "sleeper", "16") for _ in range(4)]
    try:
        for p in procs:
            wait_ready(p)
        r = h.run("vm1", "device_props")
        assert r.returncode != 0
        assert "all 4 channels of" in r.stderr and "are in use by other CUDA processes" in r.stderr, r.stderr
        assert "orion-vm enable <domain> --processes N" in r.stderr, r.stderr
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_vms_processes_share_its_vgpus_memory(vm_host, tmp_path):
    """The processes of a VM run on the VM's vGPUs, and each vGPU's quota holds for all of them
    together, as a GPU's memory does: with 400 of a 600 MiB vGPU taken by one process, another
    cannot take 400 more (each alone would fit), it can take 150, and the 400 come back when the
    first process ends."""
    from harness.share import PROBE
    h = vm_host
    assert h.hook("vm1", "prepare", vgpus=1, gmem=600).returncode == 0
    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace("__file__", repr(str(script))))
    first = subprocess.Popen([sys.executable, str(script), "init", "ctx", "0", "alloc", "400", "pause"],
                             env=h.env("vm1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().split()[-1] == "count=1"
        assert first.stdout.readline().split()[-1] == "0"  # ctx
        assert first.stdout.readline().split()[-1] == "0"  # 400 MiB
        assert first.stdout.readline().split()[-1] == "READY"
        r = subprocess.run([sys.executable, str(script), "init", "ctx", "0", "alloc", "400", "alloc", "150"],
                           env=h.env("vm1"), capture_output=True, text=True, timeout=120)
        allocs = re.findall(r"^parent STEP alloc (\d+)$", r.stdout, re.M)
        assert allocs == ["2", "0"], r.stdout + r.stderr  # CUDA_ERROR_OUT_OF_MEMORY, then success
    finally:
        first.stdin.close()
        first.wait(timeout=60)
    r = subprocess.run([sys.executable, str(script), "init", "ctx", "0", "alloc", "400"], env=h.env("vm1"),
                       capture_output=True, text=True, timeout=120)
    assert re.findall(r"^parent STEP alloc (\d+)$", r.stdout, re.M) == ["0"], r.stdout + r.stderr


def test_a_vms_compute_share_is_set_by_the_host(vm_host):
    """Issue #21: a VM's compute share comes from its attachment (orion-vm enable --ratio), placed like
    an allocation's (ratios on a GPU add up to at most 100), kept across an oriond restart, freed at
    detach; all the VM's processes are that one tenant, and ORION_RATIO inside the guest promises
    nothing (before, each guest process took the ratio its own environment asked for)."""
    h = vm_host  # one simulated GPU

    def sessions():
        return json.loads(h.control("sessions").split(" ", 1)[1])

    assert h.hook("vm1", "prepare", vgpus=1, gmem=600, ratio=60, ratio_policy="cap").returncode == 0
    left = r"does not fit p-GPU 0: (\d+)% of its compute is left"
    r = h.hook("vm2", "prepare", vgpus=1, gmem=600, ratio=50)
    assert r.returncode == 1 and re.search(left, r.stderr) and re.search(left, r.stderr)[1] == "40", r.stderr
    assert h.hook("vm2", "prepare", vgpus=1, gmem=600, ratio=40).returncode == 0
    guest = h.popen("vm1", "sleeper", "16", ORION_RATIO=90)  # the guest asks for more: not given
    try:
        wait_ready(guest)
        [s] = [x for x in sessions() if x["transport"] == "vm vm1"]
        compute = s["placements"][0]["compute"]
        assert (compute["ratio"], compute["policy"]) == (60, "cap"), s
        assert re.search(r"VM vm1's compute share \(60%\) holds, not the guest's ORION_RATIO=90", h.log())
    finally:
        guest.kill()
        guest.wait()
    h.restart()  # the state file keeps the shares: the GPU's compute is still all promised
    r = h.hook("vm3", "prepare", vgpus=1, gmem=600, ratio=1)
    assert r.returncode == 1 and re.search(left, r.stderr) and re.search(left, r.stderr)[1] == "0", r.stderr
    assert h.hook("vm1", "release").returncode == 0
    assert h.hook("vm3", "prepare", vgpus=1, gmem=600, ratio=60).returncode == 0
    guest = h.popen("vm3", "sleeper", "16")
    try:
        wait_ready(guest)
        [s] = [x for x in sessions() if x["transport"] == "vm vm3"]
        assert s["placements"][0]["compute"]["ratio"] == 60, s
    finally:
        guest.kill()
        guest.wait()


def test_a_region_nobody_serves_is_not_in_use(vm_host):
    h = vm_host
    assert h.hook("vm1", "prepare", processes=2, shm_mib=32).returncode == 0
    h.stop()
    # More processes than channels: each is told no oriond serves the region, none that it is full.
    for _ in range(3):
        r = h.run("vm1", "device_props", ORION_HANDSHAKE_TIMEOUT_MS=1500)
        assert r.returncode != 0
        assert f"no oriond serves {h.region('vm1')}" in r.stderr, r.stderr
        assert "in use" not in r.stderr, r.stderr
    r = subprocess.run([PREFIX / "bin" / "orion-check", "runtime", "client"], env=h.env("vm1"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "No oriond serves this region" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def initrd(tmp_path_factory):
    d = tmp_path_factory.mktemp("vm")
    progs = [TEST_BIN / p for p in PROGRAMS] + [ROOT / "build" / "hostile_client", ROOT / "build" / "bench" / "orion_bench"]
    return vm.build_initramfs(d / "initrd.gz", PREFIX, progs)


@pytest.fixture
def vm_oriond(tmp_path):
    d = Oriond(tmp_path, region_mib=64, channel_mib=16)
    yield d
    d.stop()


def test_programs_run_in_a_guest_over_ivshmem(vm_oriond, kernel, initrd, tmp_path):
    console = vm.boot(kernel, initrd, ["orion-check:runtime:client", "device_props", "kernel_params", "driver_api",
                                       "memory", "threads", "vadd_shared", "mapped_register"], region=vm_oriond.region,
                      log=tmp_path / "console.log")
    out = vm.outputs(console)
    # orion-check, installed by install-client, finds the device and oriond behind it.
    rc, text = out.pop("orion-check")
    assert rc == 0, text
    assert re.search(r"Found through :\s+ivshmem /sys/bus/pci/devices/0000:00:0\d.0", text), text
    assert re.search(r"Orion Server serves this region\s+\[Yes\]", text), text
    assert set(out) == {"device_props", "kernel_params", "driver_api", "memory", "threads", "vadd_shared",
                        "mapped_register"}, console[-3000:]
    for prog, (rc, text) in out.items():
        assert_passed(Result(rc, text))
        assert "Orion Simulated GPU" in text or prog == "mapped_register", prog  # it prints no device name
    assert "Orion vGPU client environment has been installed in /usr/lib/orion" not in console  # -q
    assert_launches_logged(out["kernel_params"][1], vm_oriond.launches())
    assert_launches_logged(out["driver_api"][1], vm_oriond.launches())
    # DEVICEMAP registration in a guest: the pages move into BAR2 (the sysfs resource2 mapping).
    assert "CHECK kernel_writes_seen_by_host ok" in out["mapped_register"][1]
    assert len(re.findall(r"Session \d+ exits \(client exited\)", vm_oriond.log())) >= 7


def test_a_guest_user_without_access_to_the_device_is_told_what_a_guest_can_do(vm_oriond, kernel, tmp_path):
    # Issue #25: a guest process that may not map the ivshmem device was told to set ORION_SHM or
    # ORION_SERVER and run orion-shm, a host's tools. It is told what the guest itself can change.
    setup = "echo 'root:x:0:0::/:/bin/sh' > /etc/passwd; echo 'user:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd\n" \
            "echo 'root:x:0:' > /etc/group; echo 'user:x:1000:' >> /etc/group"
    initrd = vm.build_initramfs(tmp_path / "initrd.gz", PREFIX, [TEST_BIN / "device_props"], setup=setup,
                                applets=("su",))
    console = vm.boot(kernel, initrd, ["su:user:-c:/opt/device_props"], region=vm_oriond.region)
    rc, text = vm.outputs(console)["su"]
    assert rc != 0, text
    errors = [line for line in text.splitlines() if "cannot use Orion region" in line]
    assert len(errors) == 1, text
    device = re.search(r"ivshmem device (/sys/bus/pci/devices/[0-9a-f:.]+) ", errors[0])
    assert device, errors[0]
    assert errors[0] == (f"[error] cannot use Orion region: no /dev/shm/orionsock* region and ivshmem device "
                         f"{device[1]} is not enabled and this user cannot enable it (run 'echo 1 > {device[1]}/enable' "
                         "as root, or install the udev rule from install-client); this is a VM: its region and vGPUs "
                         "are set on the host (orion-vm enable)"), errors[0]
    assert "orion-shm" not in text and "ORION_SERVER" not in text, text


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


def boot_across(event, kernel, initrd, programs, h, **boot):
    """Boots a guest running `programs` (no ORION_VGPU / ORION_GMEM: the VM's own limits) and calls
    `event` (an oriond restart) once its first program has ended, while it sleeps; returns the
    console."""
    result = {}

    def guest():
        result["console"] = vm.boot(kernel, initrd, programs, gmem=None, vgpu=None, **boot)

    t = threading.Thread(target=guest)
    t.start()
    wait_until(lambda: "exits (client exited)" in h.log(), 240, lambda: result.get("console", "")[-3000:], interval=0.2,
               alive=t.is_alive)
    event()
    t.join()
    return result["console"]


def test_a_guest_keeps_its_limits_across_an_oriond_restart(tmp_path, kernel, initrd):
    # A real guest (QEMU TCG, the region as its ivshmem BAR2) with no ORION_VGPU / ORION_GMEM: one
    # program before oriond restarts, one after; both see exactly the VM's 2 vGPUs of 3000 MiB.
    h = VmHost(tmp_path)
    try:
        assert h.hook("vm1", "prepare", vgpus=2, gmem=3000, processes=4, shm_mib=64).returncode == 0
        console = boot_across(h.restart, kernel, initrd,
                              ["device_props", "sleep:12", "device_props", "orion-check:runtime:client"],
                              h, region=h.region("vm1"), region_mib=64, log=tmp_path / "console.log")
        runs = re.findall(r"=== BEGIN device_props\r?\n(.*?)=== END device_props rc=(\d+)", console, re.S)
        assert len(runs) == 2, console[-4000:]
        for text, rc in runs:
            assert rc == "0", text
            assert "PROP deviceCount=2" in text and f"PROP totalGlobalMem={3000 << 20}" in text, text
        rc, text = vm.outputs(console)["orion-check"]
        assert rc == 0 and re.search(r"vGPUs of this VM :\s+2 x 3000 MiB", text), text
        assert "VM vm1: restored" in h.log()
        # The VM powers off and starts again: no "already served".
        assert h.hook("vm1", "release").returncode == 0
        r = h.hook("vm1", "prepare")
        assert r.returncode == 0, r.stderr
    finally:
        h.stop()


def test_a_guest_rings_oriond_through_the_ivshmem_doorbell(tmp_path, kernel, initrd):
    # QEMU's ivshmem-doorbell takes its memory and eventfds from oriond (the ivshmem server the hook
    # asked for); guest processes write the Doorbell register in BAR0 and the worker sleeps on its
    # eventfd: it wakes only when rung (or for its liveness check), and never naps.
    h = VmHost(tmp_path)
    try:
        r = h.hook("vm1", "prepare", vgpus=2, gmem=3000, processes=4, shm_mib=64, doorbell=True)
        assert r.returncode == 0, r.stderr
        assert h.bell("vm1").is_socket()
        result = {}

        def guest():
            result["console"] = vm.boot(kernel, initrd, ["device_props", "kernel_params", "orion_bench:idle:12"],
                                        doorbell=h.bell("vm1"), vectors=4, gmem=None, vgpu=None,
                                        log=tmp_path / "console.log")

        t = threading.Thread(target=guest)
        t.start()
        wait_until(lambda: h.log().count("Creating session") >= 3, 240, lambda: result.get("console", "")[-3000:],
                   interval=0.2, alive=t.is_alive)
        time.sleep(3)  # the idle client is connected: past its first frames and the spin phase
        cpu, wakeups = worker_cpu(h.proc.pid, 5.0)
        t.join()
        console = result["console"]
        out = vm.outputs(console)
        for prog in ("device_props", "kernel_params"):
            rc, text = out[prog]
            assert_passed(Result(rc, text))
        assert "PROP deviceCount=2" in out["device_props"][1]
        assert out["orion_bench"][0] == 0, out["orion_bench"][1]
        log = h.log()
        assert f"doorbell {h.bell('vm1')}: pid" in log and "connected (4 vectors)" in log, log
        waits = session_waits(h.log())
        assert len(waits) == 3, waits
        # Every session slept on the doorbell, never in naps; the idle one was woken by the
        # guest's rings when it went on (the frames of its exit).
        assert all(bell is not None and naps == 0 for bell, naps in waits), waits
        assert waits[-1][0] >= 1, waits
        # Idle, the VM's worker used almost no CPU: a few liveness wake-ups a second, no naps
        # (napping, it woke ~200 times a second).
        assert cpu < 0.1, cpu  # < 2 % of a core over 5 s
        assert wakeups < 100, wakeups
        # The VM stops: the hook's release detaches it and oriond removes the socket.
        assert h.hook("vm1", "release", doorbell=True).returncode == 0
        assert not h.bell("vm1").exists()
    finally:
        h.stop()


def test_a_guest_keeps_its_doorbell_across_an_oriond_crash(tmp_path, kernel, initrd):
    # QEMU never connects to its ivshmem server again, and keeps ringing the eventfds it got when
    # the VM started. oriond leaves them with its doorbell keeper; the oriond started after a crash
    # (SIGKILL) takes them back, so the guest's processes still wake their workers, never naps.
    h = VmHost(tmp_path)
    try:
        r = h.hook("vm1", "prepare", vgpus=2, gmem=3000, processes=4, shm_mib=64, doorbell=True)
        assert r.returncode == 0, r.stderr
        assert len(h.keepers()) == 1, "the attach started no doorbell keeper"

        def crash_and_start():
            h.crash()
            h.start()

        console = boot_across(crash_and_start, kernel, initrd,
                              ["device_props", "sleep:12", "device_props", "orion_bench:idle:4"], h,
                              doorbell=h.bell("vm1"), vectors=4, log=tmp_path / "console.log")
        runs = re.findall(r"=== BEGIN device_props\r?\n(.*?)=== END device_props rc=(\d+)", console, re.S)
        assert len(runs) == 2, console[-4000:]
        for text, rc in runs:
            assert rc == "0" and "PROP deviceCount=2" in text, text
        out = vm.outputs(console)
        assert out["orion_bench"][0] == 0, out["orion_bench"][1]
        assert re.search(r"VM vm1: restored .*, its ivshmem-doorbell on .* with the eventfds QEMU rings "
                         r"\(4 vectors, kept by the doorbell keeper\)", h.log()), h.log()
        after = h.log().rsplit("Orion Server listens", 1)[1]
        waits = session_waits(after)
        # device_props and the idle bench (its probe and the idle client) after the restart: every
        # worker slept on the doorbell and was woken by the guest's rings.
        assert len(waits) >= 2, waits
        assert all(bell is not None and naps == 0 for bell, naps in waits), waits
        assert waits[-1][0] >= 1, waits
        # The VM stops: detached, the keeper lets its eventfds go and ends once oriond does.
        assert h.hook("vm1", "release", doorbell=True).returncode == 0
        keepers = h.keepers()
        h.stop(final=False)
        wait_until(lambda: not any(running(pid) for pid in keepers), 10, "the keeper outlived its last VM", interval=0.1)
    finally:
        h.stop()


def test_a_plain_device_on_a_doorbell_attachment_falls_back_to_naps(tmp_path, kernel, initrd):
    # The attachment asked for a doorbell but the guest's device is ivshmem-plain on the same file
    # (IVPosition 0): the guest runtime does not ring, the worker naps, the program runs.
    h = VmHost(tmp_path)
    try:
        assert h.hook("vm1", "prepare", processes=4, shm_mib=64, doorbell=True).returncode == 0
        out = vm.outputs(vm.boot(kernel, initrd, ["device_props", "orion_bench:idle:2"], region=h.region("vm1"),
                                 region_mib=64, gmem=None, vgpu=None))
        rc, text = out["device_props"]
        assert_passed(Result(rc, text))
        assert out["orion_bench"][0] == 0, out["orion_bench"][1]
        waits = session_waits(h.log())
        assert len(waits) == 2 and all(bell == 0 for bell, _ in waits), waits
        assert waits[1][1] > 0, waits  # the idle process's worker napped
    finally:
        h.stop()

