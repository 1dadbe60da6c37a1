"""libvirt for real: virtlogd + libvirtd (started by hand: no systemd), a type='qemu' domain with
direct kernel boot, `orion-vm enable`, `virsh start`; the qemu hook prepares the region and attaches
the VM to oriond; the guest runs an nvcc program over ivshmem; the domain powers off and the hook
releases the vGPUs. Also a start that the hook refuses for lack of vGPUs. Needs root (CI runs as root)."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import vm
from conftest import PREFIX, ROOT, TEST_BIN, wait_until

V = ["virsh", "-c", "qemu:///system"]
HOOK = Path("/etc/libvirt/hooks/qemu")
ORIOND = {}  # the lab's oriond: "proc" (restarted by a test)


def start_oriond(d):
    log = d / "logs" / "server.log"
    starts = log.read_text().count("Orion Server listens") if log.exists() else 0
    proc = subprocess.Popen([PREFIX / "bin" / "oriond", "--config", d / "server.conf", "--backend", "sim", "--log-dir",
                             d / "logs", "--cache-dir", d / "cache", "-p", "0"], stdout=subprocess.DEVNULL,
                            stderr=open(d / "oriond.err", "a"))
    wait_until(lambda: (log.read_text().count("Orion Server listens") if log.exists() else 0) > starts, 20,
               lambda: f"oriond did not start: {(d / 'oriond.err').read_text()}", alive=lambda: proc.poll() is None)
    ORIOND["proc"] = proc


def stop_oriond():
    ORIOND["proc"].send_signal(signal.SIGTERM)
    ORIOND["proc"].wait(timeout=20)


def virsh(*args, check=True):
    r = subprocess.run(V + list(args), capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def lab():
    assert os.geteuid() == 0, "the libvirt tests need root (libvirtd, /etc/libvirt/hooks)"
    d = Path(tempfile.mkdtemp(prefix="orion-libvirt-"))
    d.chmod(0o755)  # QEMU runs as libvirt-qemu and must reach the kernel and initrd
    kernel = subprocess.run([ROOT / "scripts" / "vm-kernel"], capture_output=True, text=True, check=True).stdout.strip()
    shutil.copy(ROOT / kernel, d / "vmlinuz")
    vm.build_initramfs(d / "initrd.gz", PREFIX, [TEST_BIN / "device_props", TEST_BIN / "sleeper",
                                                ROOT / "build" / "bench" / "orion_bench"])
    for f in ("vmlinuz", "initrd.gz"):
        (d / f).chmod(0o644)
    conf = d / "server.conf"
    conf.write_text(f"""[server]
    enable_shm = "false"
    enable_kvm = "true"
    vgpu_count = 1
[server-shm]
    shm_path_base = "/dev/shm/"
    shm_user_name = "libvirt-qemu"
    shm_group_name = "libvirt-qemu"
    shm_buffer_size = 16
[orion]
    control_socket = {d}/oriond.sock
    state_file = {d}/vms.json
""")
    start_oriond(d)
    old_hook = HOOK.read_bytes() if HOOK.exists() else None
    HOOK.parent.mkdir(parents=True, exist_ok=True)
    HOOK.write_text(f"#!/bin/sh\nexport ORION_VM={PREFIX}/bin/orion-vm ORION_SERVER_CONF={conf}\n"
                    f"exec \"$ORION_VM\" hook \"$@\"\n")
    HOOK.chmod(0o755)
    started = []
    if subprocess.run(["pgrep", "-x", "virtlogd"], capture_output=True).returncode != 0:
        subprocess.run(["virtlogd", "-d"], check=True)
        started.append("virtlogd")
    if subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True).returncode != 0:
        subprocess.run(["libvirtd", "-d"], check=True)
        started.append("libvirtd")
    else:
        subprocess.run(["pkill", "-HUP", "-x", "libvirtd"])  # a hook installed later needs a reload
    wait_until(lambda: virsh("list", check=False).returncode == 0, 60, "libvirtd did not come up", interval=0.5)
    yield d
    for name in ("orion-test-a", "orion-test-b"):
        virsh("destroy", name, check=False)
        virsh("undefine", name, check=False)
    stop_oriond()
    if old_hook is None:
        HOOK.unlink()
    else:
        HOOK.write_bytes(old_hook)
    for p in started:
        subprocess.run(["pkill", "-x", p])


def define(lab, name, run, limits="orion.gmem=256"):
    xml = f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{lab}/vmlinuz</kernel>
    <initrd>{lab}/initrd.gz</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet orion.run={run} {limits}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <devices>
    <serial type='file'><source path='{lab}/{name}.console'/></serial>
  </devices>
</domain>"""
    (lab / f"{name}.xml").write_text(xml)
    virsh("destroy", name, check=False)
    virsh("undefine", name, check=False)
    virsh("define", lab / f"{name}.xml")


def wait_off(name, timeout=120):
    wait_until(lambda: "shut off" in virsh("domstate", name).stdout, timeout, f"{name} did not power off", interval=0.5)


def test_domain_gets_its_vgpu_through_the_hook(lab):
    define(lab, "orion-test-a", "device_props")
    r = subprocess.run([PREFIX / "bin" / "orion-vm", "enable", "orion-test-a", "--vgpus", "1", "--gmem", "256"],
                       capture_output=True, text=True, env=dict(os.environ, ORION_SERVER_CONF=str(lab / "server.conf")))
    assert r.returncode == 0, r.stderr
    xml = virsh("dumpxml", "--inactive", "orion-test-a").stdout
    assert "<shmem name='orionsock-orion-test-a'>" in xml and "ivshmem-plain" in xml
    assert 'count="1"' in xml and 'gmem="256"' in xml and 'processes="4"' in xml
    assert "<size unit='M'>64</size>" in xml  # 4 processes x shm_buffer_size 16
    virsh("start", "orion-test-a")
    wait_off("orion-test-a")
    out = vm.outputs((lab / "orion-test-a.console").read_text(errors="replace"))
    rc, text = out["device_props"]
    assert rc == 0 and "DONE checks=" in text and "failed=0" in text, text
    assert "PROP totalGlobalMem=268435456" in text
    log = (lab / "logs" / "server.log").read_text()
    assert "VM orion-test-a: attached /dev/shm/orionsock-orion-test-a" in log
    wait_until(lambda: "VM orion-test-a: detached" in (lab / "logs" / "server.log").read_text(), 10,
               "the release hook did not detach the VM", interval=0.2)
    assert not Path("/dev/shm/orionsock-orion-test-a").exists()
    st = subprocess.run([PREFIX / "bin" / "orion-vm", "status", "orion-test-a"], capture_output=True, text=True,
                        env=dict(os.environ, ORION_SERVER_CONF=str(lab / "server.conf")))
    assert "1 vGPU(s)" in st.stdout and "vgpus_free=1" in st.stdout, st.stdout + st.stderr


def test_enabling_again_keeps_the_options_not_given(lab):
    # Issue #25: `orion-vm enable D --doorbell on` on a domain enabled with 2 vGPUs of 3000 MiB made
    # it 1 vGPU of the default size, and the runtime's own hint (`--processes N`) did the same and
    # turned the doorbell off. Options not given keep the domain's values, and the tool says so.
    define(lab, "orion-test-a", "device_props")
    env = dict(os.environ, ORION_SERVER_CONF=str(lab / "server.conf"))

    def enable(*args):
        r = subprocess.run([PREFIX / "bin" / "orion-vm", "enable", "orion-test-a", *args], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    def request():
        root = ET.fromstring(virsh("dumpxml", "--inactive", "orion-test-a").stdout)
        vgpu = root.find("metadata/{http://orion-vgpu.org/xmlns/libvirt/1.0}vgpu")
        shmem = [d for d in root.find("devices").findall("shmem") if d.get("name").startswith("orionsock")]
        assert len(shmem) == 1, [d.get("name") for d in shmem]
        return dict(vgpu.attrib), shmem[0].find("model").get("type")

    out = enable("--vgpus", "2", "--gmem", "3000", "--processes", "6", "--ratio", "40")
    assert len(out) == 1, out  # nothing kept: the domain had no Orion vGPUs
    assert request() == ({"count": "2", "gmem": "3000", "processes": "6", "shm_mib": "128", "ratio": "40",
                          "ratio_policy": "share"}, "ivshmem-plain")
    out = enable("--doorbell", "on")
    assert out[1] == ("Options not given keep the domain's current values: --vgpus 2 --gmem 3000 --processes 6 "
                      "--ratio 40 --ratio-policy share --shm-mib 128"), out
    assert request() == ({"count": "2", "gmem": "3000", "processes": "6", "shm_mib": "128", "ratio": "40",
                          "ratio_policy": "share"}, "ivshmem-doorbell")
    out = enable("--processes", "2")  # the region is sized afresh for 2 (2 x 16 MiB); the doorbell stays on
    assert out[1] == ("Options not given keep the domain's current values: --vgpus 2 --gmem 3000 --doorbell on "
                      "--ratio 40 --ratio-policy share"), out
    assert request() == ({"count": "2", "gmem": "3000", "processes": "2", "shm_mib": "32", "ratio": "40",
                          "ratio_policy": "share"}, "ivshmem-doorbell")


def test_start_is_refused_without_free_vgpus(lab):
    # vgpu_count = 1 on one simulated GPU: while A holds the only vGPU, B cannot start.
    define(lab, "orion-test-a", "sleeper")
    define(lab, "orion-test-b", "device_props")
    for name in ("orion-test-a", "orion-test-b"):
        subprocess.run([PREFIX / "bin" / "orion-vm", "enable", name, "--gmem", "256"], check=True,
                       capture_output=True)
    virsh("start", "orion-test-a")
    r = virsh("start", "orion-test-b", check=False)
    assert r.returncode != 0
    assert "not enough vGPUs for VM orion-test-b" in r.stderr, r.stderr
    assert "shut off" in virsh("domstate", "orion-test-b").stdout
    detached = (lab / "logs" / "server.log").read_text().count("VM orion-test-a: detached")
    virsh("destroy", "orion-test-a")  # release frees A's vGPU ...
    wait_until(lambda: (lab / "logs" / "server.log").read_text().count("VM orion-test-a: detached") != detached, 10,
               "the release hook did not detach A", interval=0.2)
    virsh("start", "orion-test-b")  # ... and B starts
    wait_off("orion-test-b")
    rc, text = vm.outputs((lab / "orion-test-b.console").read_text(errors="replace"))["device_props"]
    assert rc == 0, text


def test_oriond_restart_while_a_domain_runs(lab):
    # The guest sets no ORION_VGPU / ORION_GMEM: the VM's own limits, before and after oriond restarts.
    define(lab, "orion-test-a", "device_props,sleep:15,device_props", limits="orion.vgpu=vm")
    subprocess.run([PREFIX / "bin" / "orion-vm", "enable", "orion-test-a", "--gmem", "256"], check=True,
                   capture_output=True)
    console = lab / "orion-test-a.console"
    virsh("start", "orion-test-a")
    wait_until(lambda: "=== END device_props" in (console.read_text(errors="replace") if console.exists() else ""), 120,
               "the first program did not finish", interval=0.2)
    stop_oriond()
    start_oriond(lab)  # while the guest sleeps
    log = (lab / "logs" / "server.log").read_text()
    assert "VM orion-test-a: restored /dev/shm/orionsock-orion-test-a" in log
    wait_off("orion-test-a")
    text = console.read_text(errors="replace")
    runs = re.findall(r"=== BEGIN device_props\r?\n(.*?)=== END device_props rc=(\d+)", text, re.S)
    assert len(runs) == 2, text[-3000:]
    for out, rc in runs:
        assert rc == "0" and "PROP deviceCount=1" in out and "PROP totalGlobalMem=268435456" in out, out
    # It starts again after the restart: no "already served".
    wait_until(lambda: "VM orion-test-a: detached" in (lab / "logs" / "server.log").read_text(), 10,
               "the release hook did not detach the VM", interval=0.2)
    virsh("start", "orion-test-a")
    wait_off("orion-test-a")


def test_domain_with_the_doorbell(lab):
    # `orion-vm enable --doorbell on`: an ivshmem-doorbell whose server is oriond (the hook asks for
    # it at prepare); QEMU, run by libvirt as libvirt-qemu, gets the region and oriond's eventfds
    # from it, and the guest's processes wake their workers through BAR0 instead of being polled.
    define(lab, "orion-test-a", "device_props,orion_bench:idle:3")
    r = subprocess.run([PREFIX / "bin" / "orion-vm", "enable", "orion-test-a", "--vgpus", "1", "--gmem", "256",
                        "--doorbell", "on"], capture_output=True, text=True,
                       env=dict(os.environ, ORION_SERVER_CONF=str(lab / "server.conf")))
    assert r.returncode == 0, r.stderr
    assert "ivshmem-doorbell served by oriond" in r.stdout
    xml = virsh("dumpxml", "--inactive", "orion-test-a").stdout
    assert "<model type='ivshmem-doorbell'/>" in xml, xml
    assert "<server path='/dev/shm/orionsock-orion-test-a.sock'/>" in xml, xml
    assert "vectors='4'" in xml, xml
    assert 'shm_mib="64"' in xml and "<size" not in xml.split("<shmem")[1].split("</shmem>")[0], xml
    virsh("start", "orion-test-a")
    wait_off("orion-test-a")
    out = vm.outputs((lab / "orion-test-a.console").read_text(errors="replace"))
    rc, text = out["device_props"]
    assert rc == 0 and "failed=0" in text, text
    assert out["orion_bench"][0] == 0, out["orion_bench"][1]
    log = (lab / "logs" / "server.log").read_text()
    assert "orionsock-orion-test-a.sock: pid" in log and "connected (4 vectors)" in log, log[-3000:]
    waits = re.findall(r"ivshmem-doorbell wake-ups=(\d+).*naps=(\d+)", log)
    assert len(waits) >= 2 and all(n == "0" for _, n in waits) and int(waits[-1][0]) >= 1, waits
    wait_until(lambda: "VM orion-test-a: detached" in (lab / "logs" / "server.log").read_text(), 10,
               "the release hook did not detach the VM", interval=0.2)
    assert not Path("/dev/shm/orionsock-orion-test-a.sock").exists()
    # Back to ivshmem-plain (the fallback): the same domain runs again, polled.
    subprocess.run([PREFIX / "bin" / "orion-vm", "enable", "orion-test-a", "--vgpus", "1", "--gmem", "256",
                    "--doorbell", "off"], check=True, capture_output=True,
                   env=dict(os.environ, ORION_SERVER_CONF=str(lab / "server.conf")))
    assert "ivshmem-plain" in virsh("dumpxml", "--inactive", "orion-test-a").stdout
    virsh("start", "orion-test-a")
    wait_off("orion-test-a")
    rc, text = vm.outputs((lab / "orion-test-a.console").read_text(errors="replace"))["device_props"]
    assert rc == 0, text
