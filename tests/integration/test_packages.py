"""The Debian packages (scripts/package: CPack, packaging/), inspected with dpkg-deb and installed with
apt into clean Debian roots (debootstrap minbase, scripts/debian-root; each test root is an overlay on
it). A "host" root gets orion-server: its oriond, started from the installed files with the packaged
/etc/orion/server.conf, serves a region that a "guest" root with orion-client installed shares
(one /dev/shm for both). A CUDA program from build/tests/cuda runs in the guest root with nothing but
ORION_VGPU and ORION_GMEM set: the loader finds the installed libcuda.so.1 through the package's
ld.so.conf.d entry and the runtime finds the region through the package's client.conf.
Needs root (chroot, mounts) and the Debian mirror (apt installs the packages' Depends; downloads are
kept beside that root, in debian-root/archives)."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, TEST_BIN, assert_computed, read_launch_log, wait_until
from harness.debian import ENV, Roots, alive, field, run

VERSION = re.search(r"project\(orion VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
SERVER_FILES = ["/usr/bin/oriond", "/usr/bin/orion-shm", "/usr/bin/orion-vm", "/usr/bin/orion-check", "/usr/bin/orion-cdi",
                "/usr/bin/orion-controller", "/usr/bin/orion-smi", "/etc/libvirt/hooks/qemu.d/orion",
                "/etc/orion/server.conf", "/etc/orion/controller.yaml", "/lib/systemd/system/oriond.service",
                "/lib/systemd/system/orion-controller.service", "/var/lib/orion/", "/usr/lib/orion/libcuda.so.1",
                "/usr/lib/orion/libnvidia-ml.so.1", "/usr/lib/orion/install-client"]
CLIENT_FILES = ["/usr/lib/orion/libcuda.so.1", "/usr/lib/orion/libnvidia-ml.so.1", "/usr/lib/orion/install-client",
                "/usr/bin/orion-check", "/usr/bin/orion-smi", "/etc/orion/client.conf", "/etc/ld.so.conf.d/orion.conf",
                "/lib/udev/rules.d/99-orion-ivshmem.rules", "/usr/lib/orion/slurm/orion_spank.so",
                "/usr/share/orion/slurm/job_submit.lua"]
SERVER_CONFFILES = ["/etc/orion/server.conf", "/etc/orion/controller.yaml", "/etc/libvirt/hooks/qemu.d/orion"]
CLIENT_CONFFILES = ["/etc/orion/client.conf", "/etc/ld.so.conf.d/orion.conf"]


def control_file(deb, name, tmp):
    d = Path(tempfile.mkdtemp(dir=tmp))
    subprocess.run(["dpkg-deb", "-e", deb, d], check=True)
    return (d / name).read_text() if (d / name).exists() else ""


def owner(path):
    """The installed package that holds a library, and the names it provides (libspdlog1.10 provides
    libspdlog1.10-fmt9, the name its shlibs file gives)."""
    p = Path(path)
    for cand in (p, p.resolve()):
        for q in {cand, Path("/usr" + str(cand)) if not str(cand).startswith("/usr/") else cand}:
            r = run(["dpkg", "-S", q])
            if r.returncode == 0:
                pkg = r.stdout.split(":")[0].strip()
                provides = run(["dpkg-query", "-W", "-f", "${Provides}", pkg]).stdout
                return pkg, {pkg} | {x.strip().split()[0] for x in provides.split(",") if x.strip()}
    raise AssertionError(f"no package on this machine holds {path}")


def needed_packages(deb, tmp):
    """For each library the package's ELF files link directly (NEEDED, found by ldd on this build
    machine): the package that holds it here and the names it provides."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    subprocess.run(["dpkg-deb", "-x", deb, d], check=True)
    libs = set()
    for f in d.rglob("*"):
        if f.is_file() and not f.is_symlink() and f.read_bytes()[:4] == b"\x7fELF":
            out = run(["ldd", f]).stdout
            assert "not found" not in out, (f, out)
            where = dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))
            libs.update(where[n] for n in re.findall(r"NEEDED\s+(\S+)", run(["objdump", "-p", f]).stdout)
                        if not n.startswith("ld-linux"))
    return {lib: owner(lib) for lib in libs}


@pytest.mark.parametrize("name,files,conffiles", [("orion-server", SERVER_FILES, SERVER_CONFFILES),
                                                  ("orion-client", CLIENT_FILES, CLIENT_CONFFILES)])
def test_package_metadata_files_and_depends(debs, tmp_path, name, files, conffiles):
    deb = debs[name]
    assert deb.name == f"{name}_{VERSION}_amd64.deb"
    assert field(deb, "Package") == name
    assert field(deb, "Version") == VERSION
    assert field(deb, "Architecture") == "amd64"
    listing = run(["dpkg-deb", "-c", deb]).stdout
    paths = {line.split()[5].lstrip(".") for line in listing.splitlines()}
    missing = [f for f in files if f not in paths]
    assert not missing, listing
    assert sorted(control_file(deb, "conffiles", tmp_path).split()) == sorted(conffiles)
    # Depends, computed by dpkg-shlibdeps, names the package of every library the binaries link.
    depends = {d.strip().split()[0] for d in field(deb, "Depends").split(",")}
    needed = needed_packages(deb, tmp_path)
    unmet = {lib: pkg for lib, (pkg, names) in needed.items() if not names & depends}
    assert not unmet, (unmet, depends)
    assert "libc6" in depends
    if name == "orion-server":
        assert {"libspdlog1.10-fmt9", "libfmt9", "libsqlite3-0", "libxml2", "libyaml-cpp0.7"} <= depends, depends
    assert field(deb, "Conflicts") == ("orion-client" if name == "orion-server" else "orion-server")
    for script in ("postinst", "postrm"):
        text = control_file(deb, script, tmp_path)
        assert text.startswith("#!/bin/sh"), text
        # systemctl only where systemd runs (containers and chroots have none).
        for line in text.splitlines():
            if "systemctl" in line and not line.lstrip().startswith("#"):
                assert "/run/systemd/system" in text
    # The guest runtime needs nothing but libc and OpenSSL (TLS to an https:// controller; it runs in
    # any guest).
    if name == "orion-client":
        assert {pkg for pkg, _ in needed.values()} == {"libc6", "libssl3"}, needed


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    assert os.geteuid() == 0, "the package tests need root (chroot, overlay mounts)"
    r = run([ROOT / "scripts" / "debian-root"], timeout=900)
    assert r.returncode == 0, r.stderr
    base = Path(r.stdout.strip())
    rs = Roots(tmp_path_factory.mktemp("roots"))
    try:
        rs.setup(base)
        yield rs
    finally:
        rs.close()


@pytest.fixture(scope="module")
def server(roots, debs):
    """orion-server installed in the server root by scripts/install-server (given the package built
    above), and its oriond (sim backend) serving orionsock0."""
    src = roots.path["server"] / "opt" / "orion-src"
    (src / "scripts").mkdir(parents=True)
    (src / "build" / "packages").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install-server", src / "scripts")
    shutil.copy(debs["orion-server"], src / "build" / "packages")
    # In its own PID namespace: without systemd it reloads a running libvirtd, and this machine's
    # (another test's) is none of its business.
    r = run(["unshare", "--pid", "--fork", f"--mount-proc={roots.path['server'] / 'proc'}", "chroot",
             roots.path["server"], "/opt/orion-src/scripts/install-server"], env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Orion server installed. No systemd here: start it with  oriond -d" in r.stdout, r.stdout
    r = roots.ok("server", "orion-shm", "-i", "0", "-s", "256")
    assert "/dev/shm/orionsock0 is successfully created." in r.stdout
    log = roots.path["server"] / "var" / "log" / "orion" / "server.log"
    err = open(roots.tmp / "oriond.stderr", "w")
    # The packaged server.conf as is; only the backend (no GPU here: sim) and no TCP port (this
    # machine's network namespace is shared with other tests).
    p = subprocess.Popen(["chroot", roots.path["server"], "/usr/bin/oriond", "--backend", "sim", "-p", "0",
                          "--sim-launch-log", "/tmp/launch.log"], env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    roots.procs.append(p)
    wait_until(lambda: "Orion Server listens" in (log.read_text() if log.exists() else ""), 30,
               lambda: f"oriond did not start: {(roots.tmp / 'oriond.stderr').read_text()}", interval=0.1,
               alive=lambda: p.poll() is None)
    return p


def test_server_package_installs_into_a_clean_root(roots, server):
    st = roots.ok("server", "dpkg-query", "-W", "-f", "${Status} ${Version}", "orion-server").stdout
    assert st == f"install ok installed {VERSION}"
    assert roots.ok("server", "oriond", "--version").stdout.startswith(f"oriond {VERSION} (build ")
    r = roots.ok("server", "orion-check", "install", "server")
    assert "[No]" not in r.stdout and "/usr/bin/oriond" in r.stdout and "/etc/libvirt/hooks/qemu.d/orion" in r.stdout, r.stdout
    assert (roots.path["server"] / "var" / "lib" / "orion").is_dir()
    unit = (roots.path["server"] / "lib" / "systemd" / "system" / "oriond.service").read_text()
    assert "ExecStart=/usr/bin/oriond --config /etc/orion/server.conf" in unit
    assert "ExecStartPost=-/usr/bin/orion-cdi generate --output /run/cdi/orion.yaml" in unit
    hook = roots.path["server"] / "etc" / "libvirt" / "hooks" / "qemu.d" / "orion"
    assert os.access(hook, os.X_OK)
    # The hook finds the packaged orion-vm (no ORION_VM set): a domain without Orion metadata passes.
    r = roots.chroot("server", "/etc/libvirt/hooks/qemu.d/orion", "plain-vm", "prepare", "begin", "-",
                     input="<domain type='qemu'><name>plain-vm</name><devices/></domain>")
    assert r.returncode == 0, r.stdout + r.stderr
    # Its oriond, from the installed files and the packaged config, says what it serves.
    r = roots.ok("server", "orion-check", "runtime", "server")
    assert re.search(r"Enable SHM\s+\[Yes\]", r.stdout) and "vGPU are free now" in r.stdout, r.stdout
    # The packaged orion-cdi: the region it serves as a CDI device, the packaged client mounted.
    import yaml
    spec = yaml.safe_load(roots.ok("server", "orion-cdi", "generate", "--output", "-").stdout)
    assert spec["kind"] == "orion.dev/vgpu" and "0" in {d["name"] for d in spec["devices"]}, spec
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == "/usr/lib/orion/libcuda.so.1", mounts
    # A second oriond -d says on the terminal why it cannot serve (it used to print nothing).
    r = roots.chroot("server", "oriond", "-d", "--backend", "sim", "-p", "0")
    assert r.returncode == 1 and "is already served by another oriond" in r.stderr, r.stdout + r.stderr


def test_client_package_runs_a_cuda_program_against_the_installed_oriond(roots, server, debs):
    roots.apt_install("client", debs["orion-client"])
    root = roots.path["client"]
    # The loader finds Orion's libcuda.so.1 (ld.so.conf.d entry + ldconfig in postinst).
    cache = roots.ok("client", "ldconfig", "-p").stdout
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/orion/libcuda.so.1" in cache, cache
    assert roots.ok("client", "getent", "group", "orion").stdout.startswith("orion:")
    shutil.copy(TEST_BIN / "compute", root / "opt" / "compute")
    # No LD_LIBRARY_PATH, no ORION_SHM: /etc/orion/client.conf's shm_path_base finds the region.
    r = roots.chroot("client", "/opt/compute", env={"ORION_VGPU": "1", "ORION_GMEM": "512"}, timeout=180)
    assert_computed(r)
    assert "Using Orion resource" in r.stderr, r.stderr
    launches = read_launch_log(roots.path["server"] / "tmp" / "launch.log")
    assert len(launches) >= 9 and all(l["exec"] == "ran" for l in launches), launches
    log = (roots.path["server"] / "var" / "log" / "orion" / "server.log").read_text()
    assert "Creating session" in log, log
    r = roots.ok("client", "orion-check", "runtime", "client")
    assert "/dev/shm/orionsock0" in r.stdout, r.stdout


def test_maintainer_scripts_are_idempotent_and_purge_cleans_up(roots, server, debs):
    roots.ok("client", "apt-get", "install", "-y", "-q", "--reinstall", "-o", "Dpkg::Use-Pty=0",
             f"/tmp/{debs['orion-client'].name}")
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/orion/libcuda.so.1" in roots.ok("client", "ldconfig", "-p").stdout
    # install-server again: the same package, reinstalled; an edited conffile is kept.
    conf = roots.path["server"] / "etc" / "orion" / "server.conf"
    conf.write_text(conf.read_text().replace("vgpu_count = 4", "vgpu_count = 2"))
    r = run(["unshare", "--pid", "--fork", f"--mount-proc={roots.path['server'] / 'proc'}", "chroot",
             roots.path["server"], "/opt/orion-src/scripts/install-server"], env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vgpu_count = 2" in conf.read_text()
    roots.ok("client", "dpkg", "--purge", "orion-client")
    assert "libcuda.so.1" not in roots.ok("client", "ldconfig", "-p").stdout
    assert not (roots.path["client"] / "etc" / "ld.so.conf.d" / "orion.conf").exists()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=20)
    # oriond -d returns once it serves, and says so.
    r = roots.ok("server", "oriond", "-d", "--backend", "sim", "-p", "0")
    m = re.fullmatch(r"oriond: running in the background \(pid (\d+)\); log: /var/log/orion/server.log\n", r.stdout)
    assert m, r.stdout + r.stderr
    pid = int(m.group(1))
    try:
        assert "vGPU are free now" in roots.ok("server", "orion-check", "runtime", "server").stdout
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 20
        while alive(pid) and time.time() < deadline:
            time.sleep(0.1)
    roots.ok("server", "dpkg", "--purge", "orion-server")
    for gone in ("usr/bin/oriond", "etc/orion/server.conf", "var/lib/orion", "etc/libvirt/hooks/qemu.d/orion"):
        assert not (roots.path["server"] / gone).exists(), gone
