"""Orion's packages under a real systemd, inside a QEMU (TCG) guest: a clean Debian root
(scripts/debian-root) with systemd as PID 1, booted from an initramfs, with nothing of Orion but
the two .debs in /root/debs. tests/integration/guest/selftest.sh, run by a oneshot unit once the
guest is up, does what the README tells a user to do and reports each step on the serial console:

  server: apt install ./orion-server_*.deb; systemctl enable --now oriond; a VM with an
          ivshmem-doorbell attached through the libvirt hook; systemctl restart oriond and a
          SIGKILL of oriond (systemd restarts it): the doorbell keeper survives both (the unit's
          KillMode=process) and the new oriond adopts the VM's eventfds; orion-controller.service
          starts; the VM released, oriond stopped, the keeper ends; apt purge stops and removes all.
  client: apt install ./orion-client_*.deb in the same guest, whose ivshmem-plain device is a VM
          region served by this machine's oriond: orion-check and a CUDA program see the VM's
          2 vGPUs of 3000 MiB with no ORION_VGPU / ORION_GMEM set.

Needs root (chroot, overlay mounts) and the Debian mirror (systemd and the packages' Depends go into
the root before boot; the guest itself has no network). About 40 s of boot and test under TCG."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import vm
from conftest import ROOT, TEST_BIN
from harness.debian import Roots, field, run
from harness.vm_host import VmHost

SELFTEST = Path(__file__).parent / "guest" / "selftest.sh"
UNIT = """[Unit]
Description=Orion package and systemd self-test (tests/integration/test_systemd_guest.py)
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/root/selftest.sh
"""
# Left out of the image: documentation and apt's caches (the guest installs only local .debs).
PRUNE = ["./proc/*", "./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./var/cache/apt/archives/*.deb",
         "./var/lib/apt/lists"]


@pytest.fixture(scope="module")
def guest_image(tmp_path_factory, debs):
    """The initramfs: the debootstrap root with systemd, udev, procps and the packages' Depends
    installed, the .debs, a CUDA program and the self-test unit."""
    r = run([ROOT / "scripts" / "debian-root"], timeout=900)
    assert r.returncode == 0, r.stderr
    base = Path(r.stdout.strip())
    tmp = tmp_path_factory.mktemp("systemd-guest")
    roots = Roots(tmp)
    try:
        roots.setup(base, names=("guest",))
        depends = set()
        for deb in debs.values():
            depends |= {d.strip().split()[0] for d in field(deb, "Depends").split(",")}
        roots.ok("guest", "apt-get", "update", "-q", timeout=600)
        roots.ok("guest", "apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "Dpkg::Use-Pty=0",
                 "systemd", "systemd-sysv", "udev", "procps", *sorted(depends), timeout=900)
        root = roots.path["guest"]
        (root / "root" / "debs").mkdir(parents=True)
        for deb in debs.values():
            shutil.copy(deb, root / "root" / "debs" / deb.name)
        shutil.copy(TEST_BIN / "device_props", root / "opt" / "device_props")
        shutil.copy(SELFTEST, root / "root" / "selftest.sh")
        units = root / "etc" / "systemd" / "system"
        (units / "orion-selftest.service").write_text(UNIT)
        (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
        (units / "multi-user.target.wants" / "orion-selftest.service").symlink_to(
            "/etc/systemd/system/orion-selftest.service")
        for getty in ("serial-getty@ttyS0.service", "getty@tty1.service"):  # the console is the test's
            (units / getty).symlink_to("/dev/null")
        out = tmp / "root.cpio"
        prune = []
        for p in PRUNE:
            prune += ["-path", p, "-o"]
        files = subprocess.run(["find", ".", "-xdev", "(", *prune[:-1], ")", "-prune", "-o", "-print"], cwd=root,
                               capture_output=True, check=True).stdout
        with open(out, "wb") as f:
            subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files, stdout=f, check=True)
        return out
    finally:
        roots.close()


def test_packages_and_units_under_systemd_in_a_guest(guest_image, kernel, tmp_path):  # noqa: F811
    h = VmHost(tmp_path)  # this machine's oriond: serves the guest's ivshmem-plain device (the client part)
    try:
        assert h.hook("vm1", "prepare", vgpus=2, gmem=3000, processes=4, shm_mib=64).returncode == 0
        console = vm.boot(kernel, guest_image, [], region=h.region("vm1"), region_mib=64, mem_mib=2048, timeout=600,
                          append="console=ttyS0 panic=-1 quiet systemd.show_status=false "
                          "rdinit=/lib/systemd/systemd",
                          log=tmp_path / "console.log")
        out = vm.outputs(console)

        def step(name, rc=0):
            assert name in out, f"step {name} did not run:\n{console[-4000:]}"
            assert out[name][0] == rc, f"{name}: exit {out[name][0]}\n{out[name][1][-3000:]}"
            return out[name][1]

        assert step("systemd").startswith("systemd\n"), out["systemd"]  # PID 1
        step("install-server")
        assert "active" in step("enable-oriond").split()
        keeper = re.search(r"keeper=(\d+)", step("attach"))
        assert keeper, out["attach"]
        kept = r"VM vm-sd: restored .* its ivshmem-doorbell on /dev/shm/orionsock-vm-sd.sock with the eventfds " \
               r"QEMU rings \(2 vectors, kept by the doorbell keeper\)"
        for name in ("restart", "crash"):
            text = step(name)
            assert "active" in text.split(), text
            assert f"keeper={keeper.group(1)} before={keeper.group(1)}" in text, text  # the same keeper
            assert re.search(kept, text), text
        assert "restarts=1" in out["crash"][1], out["crash"][1]  # systemd's Restart=on-failure
        assert "active" in step("controller").split()
        assert "keeper=[] oriond=inactive" in step("release")
        text = step("purge-server")
        assert "controller=inactive" in text and "No such file" in text, text
        step("install-client")
        assert re.search(r"vGPUs of this VM :\s+2 x 3000 MiB", step("orion-check")), out["orion-check"]
        text = step("device_props")
        assert "PROP deviceCount=2" in text and f"PROP totalGlobalMem={3000 << 20}" in text, text
        assert "Power down" in console
    finally:
        h.stop()
