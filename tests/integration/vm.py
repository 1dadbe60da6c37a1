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
export LD_LIBRARY_PATH=/usr/lib/orion PATH=/usr/local/bin:/usr/bin:/bin
vgpu=1
for arg in $(cat /proc/cmdline); do
  case $arg in
    orion.run=*) run=${arg#orion.run=} ;;
    orion.gmem=*) export ORION_GMEM=${arg#orion.gmem=} ;;
    orion.vgpu=*) vgpu=${arg#orion.vgpu=} ;;
  esac
done
# orion.vgpu=vm: no ORION_VGPU, the VM's own count (published in its region) applies.
if [ "$vgpu" != vm ]; then export ORION_VGPU=$vgpu; fi
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
    needed = set()
    for f in (prefix / "lib" / "orion").iterdir():
        if f.is_file() and not f.is_symlink():
            shutil.copy(f, root / "orion-client" / f.name)
            needed.update(libs_of(f))  # what the orion-client package depends on (libssl3 for https://)
            if f.read_bytes()[:4] == b"\x7fELF":  # as a package ships it: no debug info (RAM is the disk)
                subprocess.run(["strip", "--strip-debug", root / "orion-client" / f.name], check=True)
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


def boot(kernel, initrd, run, region=None, region_mib=64, gmem=512, timeout=300, log=None, smp=1, mem_mib=512,
         vgpu=1, doorbell=None, vectors=4, append=None):
    """Boots the guest; returns the serial console text. `gmem` None: no ORION_GMEM in the guest;
    `vgpu` None: no ORION_VGPU (the VM's own limits apply). `doorbell`: the server socket of an
    ivshmem-doorbell device (oriond's; the memory comes from it) instead of an ivshmem-plain device
    on `region`. `append`: the whole kernel command line instead (another image than ours; `run`
    and the limits are then unused)."""
    limits = (f" orion.gmem={gmem}" if gmem is not None else "") + (f" orion.vgpu={vgpu}" if vgpu is not None
                                                                     else " orion.vgpu=vm")
    cmd = ["qemu-system-x86_64", "-accel", "tcg", "-m", str(mem_mib), "-smp", str(smp), "-nographic", "-no-reboot",
           "-nodefaults", "-serial", "stdio", "-kernel", str(kernel), "-initrd", str(initrd),
           "-append", append or f"console=ttyS0 panic=-1 quiet orion.run={','.join(run)}{limits}"]
    if doorbell is not None:
        cmd += ["-chardev", f"socket,path={doorbell},id=bell",
                "-device", f"ivshmem-doorbell,chardev=bell,vectors={vectors}"]
    elif region is not None:
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


# ---- Soft-RoCE guest (test_rdma.py, scripts/bench-rdma): the standard kernel of
# `scripts/vm-kernel --rdma`, rdma_rxe on dummy0, oriond (sim, enable_rdma) started by `setup` on
# SOFT_ROCE_ADDR:9960, clients pointed at it by ORION_SERVER; `teardown` prints oriond's logs as
# the outputs "server.log", "launch.log", "oriond.out" and "session.log".
SOFT_ROCE_ADDR = "10.9.0.1"
SOFT_ROCE_APPLETS = ["insmod", "grep", "kill", "basename"]
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")


SOFT_ROCE_SETUP = r"""
for m in $(cat /rdma/modules/order); do insmod /rdma/modules/$m || echo "insmod $m failed"; done
ip link set lo up
[ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy   # dummy.ko makes one at load
ip addr add @ADDR@/24 dev dummy0; ip link set dummy0 mtu 9000 up   # RoCE MTU 4096
rdma link add rxe0 type rxe netdev dummy0 || echo "rdma link add failed"
rdma link show
mkdir -p /tmp/logs /tmp/cache
oriond --config /rdma/server.conf --backend sim --foreground --log-dir /tmp/logs --sim-launch-log /tmp/launch.log \
  --cache-dir /tmp/cache --control-socket /tmp/oriond.sock -b @ADDR@ -p 9960 -r >/tmp/oriond.out 2>&1 &
oriond_pid=$!
i=0
while ! grep -q "Orion Server listens" /tmp/logs/server.log 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done
export ORION_SERVER=@ADDR@:9960
""".replace("@ADDR@", SOFT_ROCE_ADDR)

SOFT_ROCE_TEARDOWN = r"""
kill $oriond_pid; sleep 1
for f in /tmp/logs/server.log /tmp/launch.log /tmp/oriond.out; do
  echo "=== BEGIN $(basename $f)"; cat $f; echo "=== END $(basename $f) rc=0"
done
echo "=== BEGIN session.log"; cat /tmp/logs/session/*.log; echo "=== END session.log rc=0"
"""


def soft_roce_extra(kernel: Path, prefix: Path, workdir: Path, channel_mib=16):
    """The files the Soft-RoCE guest needs besides the programs: modules, oriond and its config, ip
    and rdma (iproute2), libibverbs with the rxe provider and its driver file."""
    provider = LIBDIR / "libibverbs" / "librxe-rdmav34.so"
    for need in [LIBDIR / "libibverbs.so.1", provider, Path("/etc/libibverbs.d/rxe.driver")]:
        if not need.exists():
            raise FileNotFoundError(f"{need} is missing: scripts/deps installs libibverbs1 and ibverbs-providers")
    conf = workdir / "server.conf"
    conf.write_text(f"[server]\n    vgpu_count = 4\n[server-shm]\n    shm_buffer_size = {channel_mib}\n")
    extra = {f"/rdma/modules/{m.name}": m for m in (kernel.parent / "modules").iterdir()}
    extra.update({
        "/usr/local/bin/oriond": prefix / "bin" / "oriond",
        "/usr/local/bin/ip": shutil.which("ip"),
        "/usr/local/bin/rdma": shutil.which("rdma"),
        # libcuda.so.1 and oriond dlopen libibverbs; the rxe provider is found through rxe.driver.
        "/lib/x86_64-linux-gnu/libibverbs.so.1": LIBDIR / "libibverbs.so.1",
        str(provider): provider,
        "/etc/libibverbs.d/rxe.driver": "/etc/libibverbs.d/rxe.driver",
        "/rdma/server.conf": conf,
    })
    return extra
