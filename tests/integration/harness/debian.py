"""The Debian packages in chroots: two overlays ("server", "client") on a debootstrap'd root that
share one /dev/shm, and dpkg helpers (test_packages, test_systemd_guest)."""
import shutil
import signal
import subprocess
from pathlib import Path

ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
       "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}


def run(cmd, timeout=300, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def field(deb, name):
    r = run(["dpkg-deb", "-f", deb, name])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def alive(pid):
    """Running (not gone, not a zombie waiting for this machine's init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class Roots:
    """Two overlays on the debootstrap'd root ("server", "client") sharing one /dev/shm directory."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.mounts = []
        self.procs = []
        self.path = {}

    def setup(self, base: Path, names=("server", "client")):
        tmp = self.tmp
        self.shm = tmp / "shm"
        self.shm.mkdir()
        self.archives = base.parent / "archives"
        (self.archives / "partial").mkdir(parents=True, exist_ok=True)
        for name in names:
            d = tmp / name
            for sub in ("upper", "work", "root"):
                (d / sub).mkdir(parents=True)
            root = d / "root"
            self.mount(["-t", "overlay", "overlay", "-o", f"lowerdir={base},upperdir={d / 'upper'},workdir={d / 'work'}",
                        root])
            self.mount(["-t", "proc", "proc", root / "proc"])
            self.mount(["--bind", self.shm, root / "dev" / "shm"])
            self.mount(["--bind", self.archives, root / "var" / "cache" / "apt" / "archives"])
            shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
            self.path[name] = root

    def mount(self, args):
        subprocess.run(["mount", *map(str, args)], check=True)
        self.mounts.append(str(args[-1]))

    def chroot(self, name, *cmd, env=None, timeout=300, input=""):
        return run(["chroot", self.path[name], *cmd], timeout=timeout, env={**ENV, **(env or {})}, input=input)

    def ok(self, name, *cmd, **kw):
        r = self.chroot(name, *cmd, **kw)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def apt_install(self, name, deb):
        shutil.copy(deb, self.path[name] / "tmp" / deb.name)
        # apt-get update: the root's lists may be older than the mirror's current point release.
        self.ok(name, "apt-get", "update", "-q")
        return self.ok(name, "apt-get", "install", "-y", "-q", "-o", "Dpkg::Use-Pty=0", f"/tmp/{deb.name}")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m])

