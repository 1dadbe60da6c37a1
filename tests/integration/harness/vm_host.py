"""An oriond configured as scripts/install-server does for VMs (enable_shm, enable_kvm, regions in
its own shm_path_base), VMs attached through orion-vm's libvirt hook, and the per-worker CPU and
wake-up figures the doorbell tests read (test_kvm, test_doorbell, test_systemd_guest)."""
import grp
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import PREFIX, TEST_BIN, doorbell_keepers

class VmHost:
    """oriond with enable_shm and enable_kvm on (install-server's server.conf), regions in its own
    shm_path_base, VMs attached through orion-vm's hook; restartable (the state file stays)."""

    def __init__(self, tmp: Path, vgpu_count=4):
        self.tmp = tmp
        self.shm = tmp / "shm"
        self.shm.mkdir()
        self.logs = tmp / "logs"
        self.state = tmp / "lib" / "vms.json"
        self.conf = tmp / "server.conf"
        user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
        self.conf.write_text(f"""[server]
    enable_shm = "true"
    enable_kvm = "true"
    vgpu_count = {vgpu_count}
[server-shm]
    shm_path_base = "{self.shm}/"
    shm_user_name = "{user}"
    shm_group_name = "{group}"
    shm_buffer_size = 16
[orion]
    control_socket = {tmp}/oriond.sock
    state_file = {self.state}
""")
        self.proc = None
        self.start()

    def start(self):
        starts = self.log().count("Orion Server listens")
        self.proc = subprocess.Popen([PREFIX / "bin" / "oriond", "--config", self.conf, "--backend", "sim",
                                      "--log-dir", self.logs, "--cache-dir", self.tmp / "cache", "-p", "0",
                                      "--lease-timeout-ms", "1000"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.tmp / "oriond.err", "a"))
        deadline = time.time() + 20
        while self.log().count("Orion Server listens") == starts:
            assert self.proc.poll() is None, (self.tmp / "oriond.err").read_text()
            assert time.time() < deadline, "oriond did not start"
            time.sleep(0.05)

    def stop(self, final=True):
        """Stops oriond; `final` also ends its doorbell keeper (which outlives oriond on purpose)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        if final:
            for pid in self.keepers():
                os.kill(pid, signal.SIGKILL)

    def restart(self):
        self.stop(final=False)
        self.start()

    def crash(self):
        """oriond dies at once (SIGKILL): no shutdown path runs."""
        self.proc.kill()
        self.proc.wait(timeout=20)

    def keepers(self):
        """pids of the doorbell keepers serving this host's state file."""
        return doorbell_keepers(f"{self.state}.doorbells")

    def log(self):
        p = self.logs / "server.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def control(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.tmp / "oriond.sock"))
            s.sendall(line.encode() + b"\n")
            return s.makefile().readline().strip()

    def region(self, vm):
        return self.shm / f"orionsock-{vm}"

    def bell(self, vm):
        """The ivshmem server socket oriond serves for VM `vm` (beside its region)."""
        return self.shm / f"orionsock-{vm}.sock"

    def hook(self, vm, op, vgpus=2, gmem=3000, processes=4, shm_mib=64, doorbell=False, ratio=None,
             ratio_policy="share"):
        """libvirt's qemu hook for domain `vm` (what `orion-vm enable` put in its XML; `doorbell`:
        an ivshmem-doorbell device whose server is oriond, one vector per process)."""
        procs = f' processes="{processes}"' if processes is not None else ""
        # libvirt allows no <size> on an ivshmem-doorbell: the size is in Orion's metadata.
        procs += f' shm_mib="{shm_mib}"' if doorbell else ""
        procs += f' ratio="{ratio}" ratio_policy="{ratio_policy}"' if ratio is not None else ""
        device = (f"<model type='ivshmem-doorbell'/>"
                  f"<server path='{self.bell(vm)}'/><msi vectors='{processes}' ioeventfd='on'/>" if doorbell else
                  f"<model type='ivshmem-plain'/><size unit='M'>{shm_mib}</size>")
        xml = f"""<domain type='qemu'><name>{vm}</name>
  <metadata><orion:vgpu xmlns:orion="http://orion-vgpu.org/xmlns/libvirt/1.0" count="{vgpus}" gmem="{gmem}"{procs}/></metadata>
  <devices><shmem name='orionsock-{vm}'>{device}</shmem></devices>
</domain>"""
        return subprocess.run([PREFIX / "bin" / "orion-vm", "hook", vm, op, "begin", "-"], input=xml, text=True,
                              capture_output=True, env=dict(os.environ, ORION_SERVER_CONF=str(self.conf)), timeout=60)

    def env(self, vm, **extra):
        """A process of VM `vm`: its region, and no ORION_VGPU / ORION_GMEM unless given."""
        env = {k: v for k, v in os.environ.items() if k not in ("ORION_VGPU", "ORION_GMEM")}
        env.update({"LD_LIBRARY_PATH": str(PREFIX / "lib" / "orion"), "ORION_SHM": str(self.region(vm))})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, vm, program, *args, **extra):
        return subprocess.run([str(TEST_BIN / program), *map(str, args)], env=self.env(vm, **extra),
                              capture_output=True, text=True, timeout=120)

    def popen(self, vm, program, *args, **extra):
        return subprocess.Popen([str(TEST_BIN / program), *map(str, args)], env=self.env(vm, **extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def worker_cpu(parent_pid, seconds=5.0):
    """CPU time (s) and voluntary context switches (wake-ups) of oriond's only worker over `seconds`."""
    kids = Path(f"/proc/{parent_pid}/task/{parent_pid}/children").read_text().split()
    assert len(kids) == 1, kids
    pid = kids[0]

    def sample():
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
        switches = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"), switches

    cpu0, sw0 = sample()
    time.sleep(seconds)
    cpu1, sw1 = sample()
    return cpu1 - cpu0, sw1 - sw0


def running(pid):
    """Whether process `pid` exists and has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def session_waits(server_log):
    """[(doorbell wake-ups or None, naps)] of each session, in session order, from its last line."""
    found = {int(m.group(1)): (int(m.group(2)) if m.group(2) else None, int(m.group(3))) for m in re.finditer(
        r"sess=(\d+) idle waits: futex waits=\d+(?:, ivshmem-doorbell wake-ups=(\d+)[^,]*)?, naps=(\d+)", server_log)}
    return [found[k] for k in sorted(found)]

