"""The README's first command: scripts/demo builds Orion (a no-op when scripts/test built it), starts
oriond on a fresh region, compiles a plain nvcc vector add and runs it through the installed runtime
(docs/one-host.md's commands: orion-shm, oriond, nvcc, the program with ORION_SHM, ORION_VGPU and
ORION_GMEM). Every sum it computed on the sim must be right."""
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_computes_every_sum_through_oriond():
    r = subprocess.run([ROOT / "scripts" / "demo"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sums = re.search(r"^kernel: no error; (\d+) of (\d+) sums correct$", r.stdout, re.M)
    assert sums, r.stdout[-3000:]
    assert int(sums.group(1)) == int(sums.group(2)) == 1 << 20
    trip = re.search(r"^memory round trip: (\d+) of (\d+) floats intact$", r.stdout, re.M)
    assert trip and int(trip.group(1)) == int(trip.group(2)) == 1 << 20, r.stdout[-3000:]
    # It ran through oriond: the sim's launch log says it executed the kernel (a GPU keeps none).
    listen = re.search(r"Orion Server listens on .* \(backend (\w+)\)$", r.stdout, re.M)
    assert listen, r.stdout[-3000:]
    if listen.group(1) == "sim":
        launches = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("  {")]
        assert [(x["kernel"], x["exec"]) for x in launches] == [("_Z4vaddPKfS0_Pfi", "ran")], launches
