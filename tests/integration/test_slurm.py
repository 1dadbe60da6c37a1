"""Slurm jobs that ask for vGPUs (issue #14): a real Slurm (Debian's slurm-wlm: munged, slurmctld
and two slurmd, node1 and node2, on loopback ports) with Orion's SPANK plugin (orion_spank.so) and
job_submit.lua, an orion-controller (SQLite, client keys) and two oriond (sim) registered with it.

Covers: `srun --orion-vgpus=2 --orion-gmem=...` runs a real nvcc program through Orion on the
job's vGPUs and its allocation is released when the step ends; a batch job's processes (one after
another, and an srun step inside it) share the batch step's one allocation; a step cancelled with
scancel and a node that dies (its slurmd, slurmstepd and tasks SIGKILLed) release their vGPUs; a job
asking more than the pool has free waits in the queue (reason Licenses) and runs when vGPUs free
up; `scontrol show job` shows the request; a request that can never fit fails srun with the
controller's reason.

Slurm comes from Debian (scripts/deps installs slurmctld, slurmd, slurm-client, munge and
libslurm-dev); the tests skip only when it is absent."""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PREFIX, TEST_BIN, free_port, wait_until
from harness.controller import CLIENT, Cluster

SLURMCTLD = shutil.which("slurmctld")
SLURMD = shutil.which("slurmd")
MUNGED = shutil.which("munged")
PLUGIN = PREFIX / "lib" / "orion" / "slurm" / "orion_spank.so"

pytestmark = pytest.mark.skipif(not (SLURMCTLD and SLURMD and MUNGED and PLUGIN.exists()),
                                reason="Slurm (slurmctld, slurmd, munge, libslurm-dev) is not installed: scripts/deps")


class Slurm:
    """munged, slurmctld and slurmd node1, node2 in `tmp`, with orion_spank.so and job_submit.lua."""

    def __init__(self, tmp: Path, controller_addr: str, licenses: int, wait_s=20):
        self.dir = tmp
        self.dir.mkdir(parents=True, exist_ok=True)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_sock = self.dir / "munge.sock"
        self.munged = subprocess.Popen([MUNGED, "-F", "--force", f"--key-file={key}", f"--socket={self.munge_sock}",
                                        f"--pid-file={self.dir / 'munged.pid'}", f"--log-file={self.dir / 'munged.log'}",
                                        f"--seed-file={self.dir / 'munged.seed'}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        (self.dir / "slurm-client.key").write_text(CLIENT + "\n")
        (self.dir / "plugstack.conf").write_text(
            f"required {PLUGIN} controller={controller_addr} key_file={self.dir / 'slurm-client.key'} wait={wait_s}\n")
        shutil.copy(PREFIX / "share" / "orion" / "slurm" / "job_submit.lua", self.dir / "job_submit.lua")
        self.ports = {"ctld": free_port(), "node1": free_port(), "node2": free_port()}
        d = self.dir
        (d / "state").mkdir()
        (d / "slurm.conf").write_text(f"""ClusterName=oriontest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ports['ctld']}
AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmdDebug=verbose
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobSubmitPlugins=lua
PlugStackConfig={d / 'plugstack.conf'}
Licenses=orion_vgpu:{licenses}
ReturnToService=2
SlurmdTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=600
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.ports['node1']} CPUs={os.cpu_count()} State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.ports['node2']} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=main Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        wait_until(self.munge_sock.exists, 10, lambda: (d / "munged.log").read_text(),
                   alive=lambda: self.munged.poll() is None)
        self.ctld = subprocess.Popen([SLURMCTLD, "-D", "-i"], env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.slurmd = {}
        for n in ("node1", "node2"):
            self.start_node(n)
        self.wait_nodes("idle")

    def start_node(self, name):
        self.slurmd[name] = subprocess.Popen([SLURMD, "-D", "-N", name], env=self.env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)

    def wait_nodes(self, state, nodes=("node1", "node2"), timeout=60):
        deadline = time.time() + timeout
        while True:
            r = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            got = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            if all(got.get(n, "").startswith(state) for n in nodes):
                return
            assert time.time() < deadline, (r.stdout, r.stderr, self.log("slurmctld.log")[-3000:])
            time.sleep(0.3)

    def log(self, name):
        p = self.dir / name
        return p.read_text(errors="replace") if p.exists() else ""

    def cmd(self, *argv, env=None, check=True, timeout=120):
        r = subprocess.run(list(argv), env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout)
        if check:
            assert r.returncode == 0, (argv, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        return r

    def job(self, jobid):
        """scontrol show job's fields (Comment whole: it holds spaces)."""
        r = self.cmd("scontrol", "show", "job", str(jobid), check=False)
        j = dict(re.findall(r"(\w+)=(\S*)", r.stdout))
        m = re.search(r"^\s*Comment=(.*)$", r.stdout, re.M)
        if m:
            j["Comment"] = m.group(1).strip()
        return j

    def wait_job(self, jobid, states, timeout=90):
        deadline = time.time() + timeout
        while True:
            j = self.job(jobid)
            if j.get("JobState") in states:
                return j
            assert time.time() < deadline, (j, self.log("slurmctld.log")[-2000:], self.node_logs()[-3000:])
            time.sleep(0.2)

    def node_logs(self):
        return self.log("slurmd-node1.log") + self.log("slurmd-node2.log")

    def stop(self):
        self.cmd("scancel", "--full", "-u", "root", check=False)
        procs = [self.ctld, *self.slurmd.values()]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        kill_job_processes(None, self.dir)
        self.munged.terminate()
        self.munged.wait(timeout=10)


def kill_job_processes(jobid, slurm_dir):
    """SIGKILLs slurmstepd and task processes: of job `jobid` (None: every job of this Slurm)."""
    killed = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        stepd = cmd.startswith(b"slurmstepd")
        mine = f"SLURM_CONF={slurm_dir}/slurm.conf".encode() in env or stepd
        if not mine:
            continue
        if jobid is not None:
            if not (f"SLURM_JOB_ID={jobid}\0".encode() in env or cmd.startswith(f"slurmstepd: [{jobid}.".encode())):
                continue
        elif not (stepd or b"SLURM_JOB_ID=" in env):
            continue
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed.append(int(pid))
        except OSError:
            pass
    return killed


@pytest.fixture
def pool(tmp_path):
    """Controller with client keys and 2 oriond (sim: 2 GPUs x 4 vGPUs each: 16 vGPUs), and Slurm."""
    c = Cluster(tmp_path, keys=True)
    total = c.ctl.get("/v1/status")["vgpus_total"]
    s = Slurm(tmp_path / "slurm", c.ctl.addr, licenses=total)
    c.slurm = s
    yield c
    s.stop()
    c.stop()


def client_env(c):
    """A GPU-less node's environment for the job: our libcuda, no region, no controller of its own."""
    env = c.env()
    for k in ("ORION_CONTROLLER", "ORION_VGPU", "ORION_GMEM"):
        env.pop(k)
    return env


def job_allocations(c):
    return [a for a in c.ctl.get("/v1/allocations?kind=process") if a.get("job", "").startswith("slurm/")]


def wait_no_job_allocations(c, timeout=15):
    wait_until(lambda: not job_allocations(c), timeout,
               lambda: (job_allocations(c), c.ctl.log()[-2000:], c.slurm.node_logs()[-3000:]), interval=0.1)


def assert_programs_passed(r, programs):
    """`programs` test programs ran in one job step, each to DONE with no failed check."""
    done = re.findall(r"^DONE checks=(\d+) failed=(\d+)$", r.stdout, re.M)
    assert len(done) == programs and all(f == "0" and int(n) > 0 for n, f in done), (r.stdout[-3000:], r.stderr[-3000:])
    assert "FAIL" not in r.stdout, r.stdout[-3000:]


def test_srun_runs_a_cuda_program_on_the_jobs_vgpus_and_releases_them(pool):
    c, s = pool, pool.slurm
    r = s.cmd("srun", "-N1", "-w", "node2", "--orion-vgpus=2", "--orion-gmem=3000", "bash", "-c",
              "echo ENV $ORION_VGPU $ORION_GMEM $ORION_SERVER $ORION_ALLOCATION $ORION_SLURM_JOB "
              f"${{ORION_CONTROLLER:-none}}; {TEST_BIN / 'multi_device'}; {TEST_BIN / 'compute'}; "
              f"ORION_VGPU=3 {TEST_BIN / 'multi_device'} > /dev/null; echo MORE=$?; "
              f"ORION_ALLOCATION=not-a-uuid {TEST_BIN / 'multi_device'} > /dev/null; echo BAD=$?",
              env=client_env(c), timeout=300)
    m = re.search(r"^ENV 2 3000 (\S+) (\S+) (\d+) none$", r.stdout, re.M)
    assert m, r.stdout[-3000:] + r.stderr[-3000:]
    server, alloc, jobid = m.groups()
    assert server in [d.id for d in c.servers]
    # Both programs ran through Orion on the job's allocation (the one srun made for the step):
    # they did not ask the controller themselves, and did not release it.
    assert r.stderr.count(f"Using Orion resource (job) {alloc}") == 2, r.stderr[-3000:]
    assert "Client exits with allocation ID" not in r.stderr
    assert_programs_passed(r, 2)
    # A process may ask for less than its job holds, never more; and the id must be one.
    assert re.search(r"^MORE=[1-9]", r.stdout, re.M) and re.search(r"^BAD=[1-9]", r.stdout, re.M), r.stdout[-500:]
    assert f"ORION_VGPU=3 is more than job allocation {alloc} has 2 vGPU(s) of 3000 MiB" in r.stderr, r.stderr[-3000:]
    assert "ORION_ALLOCATION 'not-a-uuid' is not an allocation id (a UUID)" in r.stderr, r.stderr[-3000:]
    # The step ended: srun released the allocation at once.
    assert not job_allocations(c), job_allocations(c)
    j = s.job(jobid)
    assert j["Comment"] == "orion: 2 vGPU(s) of 3000 MiB", j
    assert j["Licenses"] == "orion_vgpu:2", j


def sbatch(s, env, *args):
    r = s.cmd("sbatch", "--parsable", *args, env=env)
    return r.stdout.strip().split(";")[0]


def test_a_batch_jobs_processes_share_its_one_allocation(pool):
    c, s = pool, pool.slurm
    out = s.dir / "batch.out"
    script = s.dir / "batch.sh"
    # Two programs at once in the script (as DDP ranks would), then an srun step of the same job.
    script.write_text(f"#!/bin/bash\necho ENV $ORION_ALLOCATION $ORION_VGPU\n{TEST_BIN / 'sleeper'} 64 > sl.out 2>&1 &\n"
                      "SL=$!\nuntil grep -q READY sl.out; do sleep 0.1; done\n"
                      f"{TEST_BIN / 'compute'}\nkill $SL\ncat sl.out\nsrun --orion-vgpus=1 {TEST_BIN / 'multi_device'}\n")
    jobid = sbatch(s, client_env(c), "-D", str(s.dir), "-w", "node1", "--orion-vgpus=1", "--orion-gmem=2000", "-o", str(out), str(script))
    j = s.wait_job(jobid, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240)
    text = out.read_text()
    assert j["JobState"] == "COMPLETED", (j, text[-3000:], s.node_logs()[-3000:])
    alloc = re.search(r"^ENV (\S+) 1$", text, re.M).group(1)
    r = subprocess.CompletedProcess([], 0, text, text)
    assert_programs_passed(r, 2)
    # All three processes, the srun step's included, used the batch step's allocation; the
    # sleeper and compute at the same time.
    assert text.count(f"Using Orion resource (job) {alloc}") == 3, text[-3000:]
    assert any(f"Using Orion resource {alloc} (a job's: 2 session(s) on it)" in d.log() for d in c.servers)
    assert "holds allocation" not in text  # the srun step made none of its own
    assert re.search(rf"\[{jobid}\.batch\] orion: slurm/{jobid}\.batch holds allocation {alloc}: 1 vGPU\(s\) of 2000 MiB",
                     s.log("slurmd-node1.log")), s.log("slurmd-node1.log")[-3000:]
    wait_no_job_allocations(c)
    assert s.job(jobid)["Comment"] == "orion: 1 vGPU(s) of 2000 MiB"


def test_scancel_and_a_dead_node_release_the_jobs_vgpus(pool):
    c, s = pool, pool.slurm
    env = client_env(c)
    sleep = f"{TEST_BIN / 'sleeper'} 64"
    a = sbatch(s, env, "-w", "node1", "--orion-vgpus=2", "-o", str(s.dir / "a.out"), "--wrap", sleep)
    b = sbatch(s, env, "-w", "node2", "--orion-vgpus=3", "-o", str(s.dir / "b.out"), "--wrap", sleep)
    for jobid, out in ((a, "a.out"), (b, "b.out")):
        wait_until(lambda: (s.dir / out).exists() and "READY" in (s.dir / out).read_text(), 120,
                   lambda: (s.job(jobid), s.node_logs()[-2000:]), interval=0.1)
    held = {x["job"].split("@")[0]: x for x in job_allocations(c)}
    assert set(held) == {f"slurm/{a}.batch", f"slurm/{b}.batch"}, held
    assert held[f"slurm/{b}.batch"]["vgpus"] == 3 and held[f"slurm/{b}.batch"]["state"] == "held"
    used_before = c.ctl.get("/v1/status")["vgpus_used"]
    assert used_before == 5
    # scancel: the batch step ends, its slurmstepd releases the allocation.
    s.cmd("scancel", a)
    wait_until(lambda: f"slurm/{a}.batch" not in {x["job"].split("@")[0] for x in job_allocations(c)}, 30,
               lambda: job_allocations(c), interval=0.1)
    assert s.wait_job(a, ("CANCELLED",))["JobState"] == "CANCELLED"
    # node2 dies: its slurmd, the job's slurmstepd and its task, all SIGKILLed. Nobody releases the
    # allocation; nobody renews its lease either (lease_ttl_s 2), and the controller drops it.
    s.slurmd["node2"].kill()
    s.slurmd["node2"].wait()
    assert kill_job_processes(b, s.dir), "no process of the job was found"
    t0 = time.time()
    wait_until(lambda: not job_allocations(c), 20, lambda: (job_allocations(c), c.ctl.log()[-2000:]), interval=0.1)
    assert time.time() - t0 < 10
    assert c.ctl.get("/v1/status")["vgpus_used"] == 0
    assert re.search(r"expired: nobody renewed its lease", c.ctl.log()), c.ctl.log()[-2000:]


def test_a_job_asking_more_than_the_pool_has_waits_in_the_queue(pool):
    c, s = pool, pool.slurm
    env = client_env(c)
    sleep = f"{TEST_BIN / 'sleeper'} 64"
    # 16 vGPUs in the pool (= the orion_vgpu licenses): two jobs of 8 take them all.
    first = [sbatch(s, env, "--orion-vgpus=8", "-o", str(s.dir / f"q{i}.out"), "--wrap", sleep) for i in range(2)]
    for i in range(2):
        wait_until(lambda: (s.dir / f"q{i}.out").exists() and "READY" in (s.dir / f"q{i}.out").read_text(), 120,
                   lambda: s.node_logs()[-2000:], interval=0.1)
    third = sbatch(s, env, "--orion-vgpus=4", "-o", str(s.dir / "q2.out"), "--wrap", sleep)
    time.sleep(3)
    j = s.job(third)
    assert j["JobState"] == "PENDING" and j["Reason"] == "Licenses", j
    assert j["Licenses"] == "orion_vgpu:4" and j["Comment"] == "orion: 4 vGPU(s) of the default size", j
    r = s.cmd("squeue", "-h", "-j", third, "-o", "%T %r %W %k")
    assert r.stdout.split()[:3] == ["PENDING", "Licenses", "orion_vgpu:4"], r.stdout
    assert len(job_allocations(c)) == 2  # it asked the controller for nothing while it waited
    s.cmd("scancel", first[0])
    j = s.wait_job(third, ("RUNNING",), timeout=60)
    wait_until(lambda: (s.dir / "q2.out").exists() and "READY" in (s.dir / "q2.out").read_text(), 120,
               lambda: s.node_logs()[-2000:], interval=0.1)
    held = {x["job"].split("@")[0]: x["vgpus"] for x in job_allocations(c)}
    assert held == {f"slurm/{first[1]}.batch": 8, f"slurm/{third}.batch": 4}, held


def test_bad_requests_fail_the_step_with_the_reason(pool):
    c, s = pool, pool.slurm
    env = client_env(c)
    # More than any server holds (8): the controller's reason on srun's terminal, a failed srun.
    r = s.cmd("srun", "--orion-vgpus=9", "true", env=env, check=False)
    assert r.returncode != 0
    assert "is more than any server holds (8 vGPUs)" in r.stderr, r.stderr
    r = s.cmd("srun", "--orion-vgpus=1", "--orion-gmem=99999", "true", env=env, check=False)
    assert r.returncode != 0 and "MiB is more than any GPU has (16384 MiB)" in r.stderr, r.stderr
    for bad in ("0", "17", "two", "-1"):
        r = s.cmd("srun", f"--orion-vgpus={bad}", "true", env=env, check=False)
        assert r.returncode != 0 and "--orion-vgpus must be 1..16" in r.stderr, (bad, r.stderr)
    r = s.cmd("srun", "--orion-gmem=100", "true", env=env, check=False)
    assert r.returncode != 0 and "--orion-gmem needs --orion-vgpus" in r.stderr, r.stderr
    assert not job_allocations(c)
    # A job without the option is not touched.
    r = s.cmd("srun", "bash", "-c", "echo ${ORION_ALLOCATION:-none}", env=env)
    assert r.stdout.strip() == "none"
