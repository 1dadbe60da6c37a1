"""A small QEMU (TCG) guest for the KVM path: Debian's cloud kernel, an initramfs with busybox, the
installed Orion client (lib/orion, with install-client), test programs and the libraries they need.
The guest reaches oriond only through an ivshmem-plain device backed by a region file.

/init installs the client with install-client, then runs the programs named on the kernel command
line (orion.run=prog[:arg...],...) and prints, for each, "=== BEGIN <prog>", its output, and
"=== END <prog> rc=<n>" on the serial console, then powers off. A test may add files to the image
and shell lines run before the programs (`setup`, e.g. load modules and start a daemon) and after
them (`teardown`)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

INIT = r"""#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /etc /tmp
/orion-client/install-client -q
export LD_LIBRARY_PATH=/usr/lib/orion ORION_VGPU=1 PATH=/usr/local/bin:/usr/bin:/bin
for arg in $(cat /proc/cmdline); do
  case $arg in
    orion.run=*) run=${arg#orion.run=} ;;
    orion.gmem=*) export ORION_GMEM=${arg#orion.gmem=} ;;
  esac
done
@SETUP@
for item in $(echo "$run" | tr ',' ' '); do
  prog=${item%%:*}
  args=$(echo "$item" | cut -s -d: -f2- | tr ':' ' ')
  echo "=== BEGIN $prog"
  if [ -x /opt/$prog ]; then /opt/$prog $args 2>&1; else $prog $args 2>&1; fi
  echo "=== END $prog rc=$?"
done
@TEARDOWN@
poweroff -f
"""


def libs_of(exe):
    out = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    return [Path(m) for m in re.findall(r"=> (/\S+)", out)] + [Path(m) for m in re.findall(r"^\s+(/\S+ld-linux\S*)", out, re.M)]


def build_initramfs(out: Path, prefix: Path, programs, extra=None, setup="", teardown="", applets=()):
    """`extra`: {path in the image: file on the host}; the shared libraries of executables among
    them are shipped too. `applets`: more busybox applets."""
    root = out.parent / (out.name + ".root")
    shutil.rmtree(root, ignore_errors=True)
    for d in ["bin", "proc", "sys", "dev", "opt", "orion-client", "lib64", "lib/x86_64-linux-gnu", "usr/lib",
              "usr/local/bin"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy("/usr/bin/busybox", root / "bin/busybox")
    for app in ["sh", "mount", "poweroff", "cat", "echo", "mkdir", "cp", "ln", "mv", "tr", "cut", "dirname", "sleep",
                *applets]:
        os.symlink("busybox", root / "bin" / app)
    for f in (prefix / "lib" / "orion").iterdir():
        if f.is_file() and not f.is_symlink():
            shutil.copy(f, root / "orion-client" / f.name)
    needed = set()
    for exe in programs:
        shutil.copy(exe, root / "opt" / Path(exe).name)
        needed.update(libs_of(exe))
    for dest, src in (extra or {}).items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, target)
        if os.access(src, os.X_OK) or ".so" in Path(src).name:
            needed.update(libs_of(src))
    for lib in needed:
        if "libcuda.so" in lib.name:
            continue
        dest = root / "lib64" if lib.name.startswith("ld-linux") else root / "lib/x86_64-linux-gnu"
        shutil.copy(lib.resolve(), dest / lib.name)
    (root / "init").write_text(INIT.replace("@SETUP@", setup).replace("@TEARDOWN@", teardown))
    (root / "init").chmod(0o755)
    files = subprocess.run(["find", "."], cwd=root, capture_output=True, text=True, check=True).stdout
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files.encode(),
                          capture_output=True, check=True).stdout
    subprocess.run(["gzip", "-1"], input=cpio, stdout=open(out, "wb"), check=True)
    return out


def boot(kernel, initrd, run, region=None, region_mib=64, gmem=512, timeout=300, log=None):
    """Boots the guest; returns the serial console text."""
    cmd = ["qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-smp", "1", "-nographic", "-no-reboot",
           "-nodefaults", "-serial", "stdio", "-kernel", str(kernel), "-initrd", str(initrd),
           "-append", f"console=ttyS0 panic=-1 quiet orion.run={','.join(run)} orion.gmem={gmem}"]
    if region is not None:
        cmd += ["-object", f"memory-backend-file,id=m,share=on,mem-path={region},size={region_mib}M",
                "-device", "ivshmem-plain,memdev=m"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    text = r.stdout + r.stderr
    if log is not None:
        Path(log).write_text(text)
    return text


def outputs(console):
    """{program: (rc, output)} from the console markers."""
    res = {}
    for m in re.finditer(r"=== BEGIN (\S+)\r?\n(.*?)=== END \1 rc=(\d+)", console, re.S):
        res[m.group(1)] = (int(m.group(3)), m.group(2).replace("\r", ""))
    return res
